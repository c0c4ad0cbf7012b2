/**
 * Messages between the first front end (the main thread) and the front-end threads after it
 * (TALLY_FRONTENDS). A later front end serves the hot routes itself (front-end-thread.ts) and
 * relays every other request to the first, which runs it through its own pipeline and sends
 * the answer back (relayed.ts).
 */
import type { MessagePort } from 'node:worker_threads';
import type { KeyRecord } from '../../storage/control-store.js';
import type { GcPauseStats } from '../../actors/gc-pauses.js';
import type { HttpMetricsData } from '../observability/http-metrics.js';

/** A front end's settings, as it is started. */
export interface FrontEndThreadData {
  /** 1 for the second front end. */
  readonly frontEnd: number;
  readonly host: string;
  readonly port: number;
  /** Its channel to each shard worker, in worker order. */
  readonly ports: readonly MessagePort[];
  readonly queueMax: number;
  /** The channel to the first front end. */
  readonly control: MessagePort;
  /** Per-key rate-limit windows shared by all front ends (shared-budgets.ts). */
  readonly budgets: SharedArrayBuffer;
  readonly rateLimits: { readonly server: number; readonly client: number };
  readonly logLevel: string;
}

/** From the first front end to a later one. */
export type ToFrontEnd =
  /** Every key, and each key's shared budget cell; `seq` is acknowledged once applied. */
  | {
      readonly t: 'keys';
      readonly seq: number;
      readonly records: KeyRecord[];
      readonly budgets: Array<[string, number]>;
    }
  /** The data directory's free space crossed the reserve (storage-watch.ts). */
  | { readonly t: 'storage'; readonly full: boolean; readonly freeBytes: number | null }
  /** The shards are ready: serve (acknowledged with `seq`). */
  | { readonly t: 'ready'; readonly seq: number }
  /** The head (once) and part or all of a relayed request's answer. */
  | {
      readonly t: 'answer';
      readonly id: number;
      readonly status: string | null;
      readonly headers: string[] | null;
      readonly body: ArrayBuffer | string;
      /** Bytes the whole body has, when streamed (0: this part ends it). */
      readonly total: number;
      readonly end: boolean;
      readonly close: boolean;
    }
  /** Cut the relayed request's connection (a stream that failed part-way). */
  | { readonly t: 'cut'; readonly id: number }
  /** The relayed upgrade of the dev relay's WebSocket was accepted: open it with `userData`. */
  | { readonly t: 'upgrade'; readonly id: number; readonly userData: unknown }
  /** A message for, or the end of, a relayed WebSocket. */
  | { readonly t: 'wsSend'; readonly id: number; readonly text: string }
  | { readonly t: 'wsEnd'; readonly id: number; readonly code: number; readonly reason: string }
  /** Send your HTTP counts and GC pauses (the metrics route). */
  | { readonly t: 'metrics'; readonly requestId: number }
  | { readonly t: 'stop' };

/** From a later front end to the first. */
export type FromFrontEnd =
  | { readonly t: 'listening'; readonly error: string | null }
  | { readonly t: 'ack'; readonly seq: number }
  /** A request to answer: its head, peer address and whole body. */
  | {
      readonly t: 'request';
      readonly id: number;
      readonly method: string;
      readonly url: string;
      readonly query: string;
      /** Header names (lower case) and values, alternating, as received. */
      readonly headers: string[];
      readonly address: ArrayBuffer;
      readonly body: ArrayBuffer | null;
      /** A WebSocket upgrade of the dev relay (its own checks, not the HTTP pipeline's). */
      readonly upgrade: boolean;
    }
  /** A relayed WebSocket opened (after `upgrade`) or closed. */
  | { readonly t: 'wsOpen'; readonly id: number }
  | { readonly t: 'wsClose'; readonly id: number }
  | { readonly t: 'aborted'; readonly id: number }
  /** Bytes of a streamed answer now written to the client's socket. */
  | { readonly t: 'drained'; readonly id: number; readonly bytes: number }
  | {
      readonly t: 'metrics';
      readonly requestId: number;
      readonly data: HttpMetricsData;
      readonly gc: GcPauseStats;
    }
  | { readonly t: 'stopped' };
