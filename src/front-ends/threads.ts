/**
 * The first front end's side of the front-end threads after it (TALLY_FRONTENDS): starts them
 * on the same port, answers the requests they relay through the first front end's own
 * pipeline, and keeps their keys and storage state in step with its own.
 */
import { MessageChannel, Worker, type MessagePort } from 'node:worker_threads';
import type uWS from 'uWebSockets.js';
import type { KeyRecord } from '../../storage/control-store.js';
import type { GcPauseStats } from '../../actors/gc-pauses.js';
import type { HttpMetricsData } from '../observability/http-metrics.js';
import type { SharedBudgets } from '../auth/shared-budgets.js';
import type { FrontEndChannels } from '../shard-pool.js';
import type { FromFrontEnd, FrontEndThreadData, ToFrontEnd } from './protocol.js';
import { RelayedRequest, RelayedResponse, RelayedSocket } from './relayed.js';

/** What a later front end reports to the metrics route: its HTTP counts and GC pauses. */
export interface FrontEndCounts {
  readonly http: HttpMetricsData;
  readonly gc: GcPauseStats;
}

export interface FrontEndThreadsOptions {
  readonly host: string;
  readonly port: number;
  readonly budgets: SharedBudgets;
  readonly rateLimits: { readonly server: number; readonly client: number };
  readonly logLevel: string;
  /** The first front end's pipeline: a relayed request is handled as one of its own. */
  readonly handle: (res: uWS.HttpResponse, req: uWS.HttpRequest) => void;
  /** The dev relay's WebSocket behaviour: relayed upgrades, opens and closes go to it. */
  readonly relay: {
    upgrade(res: uWS.HttpResponse, req: uWS.HttpRequest, context: uWS.us_socket_context_t): void;
    open(socket: uWS.WebSocket<never>): void;
    close(socket: uWS.WebSocket<never>, code: number, message: ArrayBuffer): void;
  };
}

interface Thread {
  readonly worker: Worker;
  readonly control: MessagePort;
  readonly relayed: Map<number, RelayedResponse>;
  /** Relay WebSockets it holds, by the id of their upgrade request. */
  readonly sockets: Map<number, RelayedSocket>;
}

export class FrontEndThreads {
  private readonly threads: Thread[] = [];
  private keySeq = 0;
  /** Per key change: the threads that have not acknowledged it yet, and who waits. */
  private readonly waiting = new Map<number, { left: number; done: () => void }>();
  /** Metrics requests: one result slot per thread. */
  private readonly collecting = new Map<
    number,
    { results: FrontEndCounts[]; left: number; done: (all: FrontEndCounts[]) => void }
  >();
  private nextCollect = 1;

  constructor(private readonly options: FrontEndThreadsOptions) {}

  get count(): number {
    return this.threads.length;
  }

  /** Starts front end `frontEnd` with its channels to the workers; resolves once it listens. */
  start(channels: FrontEndChannels, keys: KeyRecord[]): Promise<void> {
    const { port1, port2 } = new MessageChannel();
    const data: FrontEndThreadData = {
      frontEnd: channels.frontEnd,
      host: this.options.host,
      port: this.options.port,
      ports: channels.ports,
      queueMax: channels.queueMax,
      control: port2,
      budgets: this.options.budgets.buffer,
      rateLimits: this.options.rateLimits,
      logLevel: this.options.logLevel,
    };
    const worker = new Worker(new URL('./front-end-thread.js', import.meta.url), {
      workerData: data,
      transferList: [...channels.ports, port2],
    });
    const thread: Thread = { worker, control: port1, relayed: new Map(), sockets: new Map() };
    this.threads.push(thread);
    this.sendKeys(thread, keys, 0);
    return new Promise((resolve, reject) => {
      worker.once('error', reject);
      port1.on('message', (message: FromFrontEnd) => {
        if (message.t === 'listening') {
          if (message.error === null) resolve();
          else reject(new Error(message.error));
        } else this.received(thread, message);
      });
    });
  }

  private received(thread: Thread, message: FromFrontEnd): void {
    switch (message.t) {
      case 'request': {
        const response = new RelayedResponse(
          message,
          (answer) => this.send(thread, answer),
          () => thread.relayed.delete(message.id),
        );
        thread.relayed.set(message.id, response);
        const req = new RelayedRequest(message).asRequest();
        if (!message.upgrade) return this.options.handle(response.asResponse(), req);
        response.onUpgrade = (userData) =>
          thread.sockets.set(
            message.id,
            new RelayedSocket(message.id, userData, (out) => this.send(thread, out)),
          );
        // The context is the other front end's: it upgrades the connection it holds.
        this.options.relay.upgrade(response.asResponse(), req, null as never);
        return;
      }
      case 'wsOpen': {
        const socket = thread.sockets.get(message.id);
        if (socket !== undefined) this.options.relay.open(socket as never);
        return;
      }
      case 'wsClose': {
        const socket = thread.sockets.get(message.id);
        thread.sockets.delete(message.id);
        if (socket !== undefined)
          this.options.relay.close(socket as never, 1000, new ArrayBuffer(0));
        return;
      }
      case 'aborted':
        thread.relayed.get(message.id)?.aborted();
        return;
      case 'drained':
        thread.relayed.get(message.id)?.drained(message.bytes);
        return;
      case 'ack': {
        const waiting = this.waiting.get(message.seq);
        if (waiting !== undefined && --waiting.left === 0) {
          this.waiting.delete(message.seq);
          waiting.done();
        }
        return;
      }
      case 'metrics': {
        const request = this.collecting.get(message.requestId);
        if (request === undefined) return;
        request.results[this.threads.indexOf(thread)] = { http: message.data, gc: message.gc };
        if (--request.left > 0) return;
        this.collecting.delete(message.requestId);
        request.done(request.results);
        return;
      }
      case 'listening':
      case 'stopped':
        return;
    }
  }

  private send(thread: Thread, message: ToFrontEnd): void {
    const transfer =
      message.t === 'answer' && typeof message.body !== 'string' ? [message.body] : [];
    thread.control.postMessage(message, transfer);
  }

  private sendKeys(thread: Thread, records: KeyRecord[], seq: number): void {
    for (const record of records) this.options.budgets.assign(record.id);
    const budgets = this.options.budgets.assignments();
    this.send(thread, { t: 'keys', seq, records, budgets });
  }

  /** Hands every key to every thread; resolves once all have applied them. */
  syncKeys(records: KeyRecord[]): Promise<void> {
    if (this.threads.length === 0) return Promise.resolve();
    const seq = ++this.keySeq;
    return new Promise((resolve) => {
      this.waiting.set(seq, { left: this.threads.length, done: resolve });
      for (const thread of this.threads) this.sendKeys(thread, records, seq);
    });
  }

  /** Every thread's HTTP counts and GC pauses, second front end first. */
  collect(): Promise<FrontEndCounts[]> {
    if (this.threads.length === 0) return Promise.resolve([]);
    const requestId = this.nextCollect++;
    return new Promise((resolve) => {
      this.collecting.set(requestId, { results: [], left: this.threads.length, done: resolve });
      for (const thread of this.threads) this.send(thread, { t: 'metrics', requestId });
    });
  }

  storage(full: boolean, freeBytes: number | null): void {
    for (const thread of this.threads) this.send(thread, { t: 'storage', full, freeBytes });
  }

  /** Tells every thread to serve; resolves once all have their routes. */
  ready(): Promise<void> {
    const seq = ++this.keySeq;
    return new Promise((resolve) => {
      this.waiting.set(seq, { left: this.threads.length, done: resolve });
      for (const thread of this.threads) this.send(thread, { t: 'ready', seq });
    });
  }

  /** Closes every thread's listening socket and connections; resolves once all have exited. */
  async stop(): Promise<void> {
    await Promise.all(
      this.threads.map(
        (thread) =>
          new Promise<void>((resolve) => {
            thread.worker.once('exit', () => resolve());
            this.send(thread, { t: 'stop' });
          }),
      ),
    );
  }
}
