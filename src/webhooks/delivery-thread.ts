/**
 * Entry point of the webhook delivery thread (a worker_thread the front end starts once the
 * shards are ready): the Dispatcher over the real stores. It reads the control store's
 * endpoints and outbox and each shard's outbox through its own LMDB handles (readers never
 * block their writers), writes only its own store and prunes the outboxes it has copied.
 * Delivery therefore never runs on the thread that answers requests, nor on a shard's.
 *
 * Messages from the front end: `endpoints` (the table changed: reread it), `resume` (an
 * operator enabled an endpoint), `stop`. To it: the Dispatcher's reports (status changes
 * to record, test events for the dev relay) and this thread's GC pauses, at start and then
 * within a second of each collection (the metrics route exports them as thread `webhooks`).
 */
import { readlinkSync } from 'node:fs';
import { setPriority } from 'node:os';
import path from 'node:path';
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import { GcPauses, type GcPauseStats } from '../../actors/gc-pauses.js';
import { nameThisThread } from '../../actors/thread-name.js';
import { assert } from '../../shared/assert.js';
import { DeliveryStore } from '../../storage/delivery-store.js';
import { openDurableEnv, SHARD_ENV_OPTIONS } from '../../storage/lmdb-env.js';
import { OutboxMarks, pruneOutbox, readOutbox } from '../../storage/outbox.js';
import { readEndpoints } from '../../storage/webhook-registry.js';
import { AddressPolicy, type AddressPolicyOptions } from './address-policy.js';
import { Dispatcher, type DispatcherReport, type OutboxSource } from './dispatcher.js';
import { OUTBOX_POLL_MS } from './schedule.js';

/** The delivery thread's nice value: below the request-serving threads (0). */
const DELIVERY_THREAD_NICE = 10;

/** How often the thread sends its GC pauses to the front end, when it collected since. */
const GC_REPORT_MS = 1000;

/** What the thread sends the front end: the Dispatcher's reports and its GC pauses. */
export type FromDeliveryThread = DispatcherReport | { readonly t: 'gc'; readonly gc: GcPauseStats };

export interface DeliveryThreadData {
  readonly dataDir: string;
  readonly workers: number;
  /** The shards' durable outbox marks: a shard's rows past its mark are not read yet. */
  readonly outboxMarks: SharedArrayBuffer;
  readonly schedule: readonly number[];
  readonly policy: {
    readonly allowedHosts: readonly string[];
    readonly pinned: ReadonlyArray<readonly [string, string]>;
  };
}

export type ToDeliveryThread =
  | { readonly t: 'endpoints' }
  | { readonly t: 'resume'; readonly id: string }
  | { readonly t: 'relay'; readonly listening: boolean; readonly ack: number }
  | { readonly t: 'stop' };

assert(!isMainThread && parentPort !== null, 'delivery-thread runs in a worker thread');
const port = parentPort;
const data = workerData as DeliveryThreadData;
nameThisThread('tally-webhooks');
lowerThisThreadPriority();

/**
 * Delivery is background work: on a machine whose cores the front end and the shards keep
 * busy, the kernel should give them the CPU first. Linux schedules threads, and
 * setpriority() on a thread id changes that thread alone (nice 10). Elsewhere, or if the
 * kernel refuses, the thread keeps the process's priority.
 */
function lowerThisThreadPriority(): void {
  try {
    const tid = Number(readlinkSync('/proc/thread-self').split('/').at(-1));
    if (Number.isInteger(tid) && tid > 0) setPriority(tid, DELIVERY_THREAD_NICE);
  } catch {
    // Not Linux, or not allowed: a priority is a refinement, never a requirement.
  }
}

const control = openDurableEnv<'webhooks' | 'outbox'>(path.join(data.dataDir, 'control'), [
  'webhooks',
  'outbox',
]);
const sources: OutboxSource[] = [
  {
    name: 'control',
    read: (after, limit) => readOutbox(control.dbs.outbox, after, limit),
    prune: (upto) => pruneOutbox(control.dbs.outbox, upto),
  },
];
const durable = new OutboxMarks(data.outboxMarks);
for (let index = 0; index < data.workers; index++) {
  const shard = openDurableEnv<'outbox'>(
    path.join(data.dataDir, `shard-${index}`),
    ['outbox'],
    SHARD_ENV_OPTIONS,
  );
  sources.push({
    name: `shard-${index}`,
    read: (after, limit) => readOutbox(shard.dbs.outbox, after, limit, durable.get(index)),
    prune: (upto) => pruneOutbox(shard.dbs.outbox, upto),
  });
}

const policyOptions: AddressPolicyOptions = {
  allowedHosts: new Set(data.policy.allowedHosts),
  pinned: new Map(data.policy.pinned),
};
const dispatcher = new Dispatcher({
  store: DeliveryStore.open(data.dataDir),
  sources,
  endpoints: () => readEndpoints(control.dbs.webhooks),
  policy: new AddressPolicy(policyOptions),
  schedule: data.schedule,
  report: (report) => port.postMessage(report),
});
dispatcher.start();

let stopped = false;
/** Takes the outboxes again at once while they had something, else after a short pause. */
async function poll(): Promise<void> {
  while (!stopped) {
    const taken = await dispatcher.takeOutboxes();
    if (taken === 0) await new Promise((resolve) => setTimeout(resolve, OUTBOX_POLL_MS));
  }
}
void poll();

const gcPauses = new GcPauses();
let gcReported = -1;
/** Sends this thread's GC pauses if it collected since it last sent them (at start: always). */
function reportGc(): void {
  const gc = gcPauses.stats();
  if (gc.pausesMs.count === gcReported) return;
  gcReported = gc.pausesMs.count;
  port.postMessage({ t: 'gc', gc } satisfies FromDeliveryThread);
}
reportGc();
const gcReports = setInterval(reportGc, GC_REPORT_MS);
gcReports.unref();

port.on('message', (message: ToDeliveryThread) => {
  switch (message.t) {
    case 'endpoints':
      return dispatcher.refreshEndpoints();
    case 'resume':
      return void dispatcher.resume(message.id);
    case 'relay':
      dispatcher.relayListening = message.listening;
      return port.postMessage({ t: 'relayAck', ack: message.ack } satisfies DispatcherReport);
    case 'stop':
      stopped = true;
      clearInterval(gcReports);
      dispatcher.stop();
      port.close();
      return;
  }
});
