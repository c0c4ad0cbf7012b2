/**
 * The front end's side of webhooks: the endpoint registry, the read side of the delivery
 * log, the `config.pushed` event of a configuration push, and the delivery thread, started
 * once the shards have recovered and told whenever the endpoints change. The thread's
 * reports come back here: a status change (failing, disabled) is recorded and audited with
 * actor `system:webhooks`; a test event goes to the dev relay's listeners.
 */
import { randomBytes } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import type { GcPauseStats } from '../../actors/gc-pauses.js';
import type { Environment } from '../../shared/environment.js';
import type { AuditLog } from '../../storage/audit-log.js';
import type { ControlStore } from '../../storage/control-store.js';
import { DeliveryLog } from '../../storage/delivery-store.js';
import { lastOutboxSeq, putOutboxEvent, type OutboxEvent } from '../../storage/outbox.js';
import type { Logger } from '../observability/log.js';
import { AddressPolicy, type AddressPolicyOptions, OPEN_POLICY_OPTIONS } from './address-policy.js';
import type {
  DeliveryThreadData,
  FromDeliveryThread,
  ToDeliveryThread,
} from './delivery-thread.js';
import type { DispatcherReport } from './dispatcher.js';
import { WebhookEndpoints } from './endpoints.js';
import { RETRY_SCHEDULE_MS } from './schedule.js';

/** The audit actor of status changes delivery causes (no key made them). */
export const DELIVERY_ACTOR = 'system:webhooks';
/** How long a stopping delivery thread may take to finish its LMDB work and exit. */
const DELIVERY_THREAD_STOP_GRACE_MS = 5_000;

export interface WebhookSettings {
  readonly policy?: AddressPolicyOptions;
  /** Delays before each attempt (default RETRY_SCHEDULE_MS). */
  readonly retryScheduleMs?: readonly number[];
}

export class WebhookService {
  readonly endpoints: WebhookEndpoints;
  readonly deliveries: DeliveryLog;
  #outboxSeq: number;
  #thread: Worker | null = null;
  #gcPauses: GcPauseStats | null = null;
  #relayAcks = 0;
  readonly #relayWaiters = new Map<number, () => void>();
  /** Receives test events while a relay listener is connected (see setRelayListening). */
  onRelayEvent: (event: OutboxEvent) => void = () => undefined;

  constructor(
    private readonly dataDir: string,
    private readonly control: ControlStore,
    audit: AuditLog,
    private readonly settings: WebhookSettings,
    private readonly log: Logger | undefined,
  ) {
    const policy = new AddressPolicy(settings.policy ?? OPEN_POLICY_OPTIONS);
    this.endpoints = new WebhookEndpoints(control.webhooksDb, audit, policy);
    this.endpoints.onChange = () => this.#tell({ t: 'endpoints' });
    this.deliveries = DeliveryLog.open(dataDir);
    this.#outboxSeq = lastOutboxSeq(control.outboxDb);
  }

  /**
   * Queues the `config.pushed` event in the caller's event-loop turn, so it commits in the
   * same control-store transaction as the pushed version; the promise settles with it.
   */
  configPushed(environment: Environment, version: number, pushedAtMs: number): Promise<boolean> {
    const event: OutboxEvent = {
      id: `evt_${randomBytes(16).toString('base64url')}`,
      type: 'config.pushed',
      environment,
      customerId: null,
      createdAtMs: pushedAtMs,
      data: { version, pushedAt: new Date(pushedAtMs).toISOString() },
    };
    return putOutboxEvent(this.control.outboxDb, ++this.#outboxSeq, event);
  }

  /**
   * Starts the delivery thread (after the shards recovered: it opens their environments),
   * reading each shard's outbox up to its durable mark in `outboxMarks`.
   */
  start(workers: number, outboxMarks: SharedArrayBuffer): void {
    const data: DeliveryThreadData = {
      dataDir: this.dataDir,
      workers,
      outboxMarks,
      schedule: this.settings.retryScheduleMs ?? RETRY_SCHEDULE_MS,
      policy: {
        allowedHosts: [...(this.settings.policy?.allowedHosts ?? [])],
        pinned: [...(this.settings.policy?.pinned ?? [])],
      },
    };
    const thread = new Worker(new URL('./delivery-thread.js', import.meta.url), {
      workerData: data,
    });
    thread.on('message', (message: FromDeliveryThread) => {
      if (message.t === 'gc') this.#gcPauses = message.gc;
      else this.#received(message);
    });
    thread.on('error', (error) => {
      // The thread cannot keep its promises (its store failed): stop, as a shard would.
      this.log?.fatal({ err: error }, 'webhook delivery thread failed');
      process.exit(70);
    });
    this.#thread = thread;
  }

  /**
   * Tells the delivery thread whether a dev relay listener is connected (test events reach
   * `onRelayEvent` only while one is); settles once the thread has the flag.
   */
  setRelayListening(listening: boolean): Promise<void> {
    if (this.#thread === null) return Promise.resolve();
    const ack = ++this.#relayAcks;
    return new Promise((resolve) => {
      this.#relayWaiters.set(ack, resolve);
      this.#tell({ t: 'relay', listening, ack });
    });
  }

  /** An operator enabled an endpoint: the thread retries what it held. */
  resume(id: string): void {
    this.#tell({ t: 'resume', id });
  }

  /** The delivery thread's GC pauses as it last sent them (null: none yet). */
  get gcPauses(): GcPauseStats | null {
    return this.#gcPauses;
  }

  #tell(message: ToDeliveryThread): void {
    this.#thread?.postMessage(message);
  }

  #received(report: DispatcherReport): void {
    if (report.t === 'relayAck') {
      this.#relayWaiters.get(report.ack)?.();
      this.#relayWaiters.delete(report.ack);
      return;
    }
    if (report.t === 'relay') {
      for (const event of report.events) this.onRelayEvent(event);
      return;
    }
    const change = report.to === 'failing' ? 'webhook.failing' : 'webhook.disable';
    const from = report.to === 'failing' ? (['active'] as const) : (['active', 'failing'] as const);
    this.endpoints
      .setStatus(report.id, change, report.to, from, DELIVERY_ACTOR, report.reason)
      .then(
        () =>
          this.log?.warn(
            { endpoint: report.id, status: report.to, reason: report.reason },
            'webhook endpoint status',
          ),
        // Deleted or changed meanwhile: nothing to record.
        () => undefined,
      );
  }

  async close(): Promise<void> {
    const thread = this.#thread;
    this.#thread = null;
    if (thread !== null) {
      thread.removeAllListeners('error');
      // Asked to stop, the thread finishes its LMDB work and exits on its own: terminating
      // it inside a native LMDB call is a fatal error of the whole process. Terminated only
      // if it has not exited within the grace period.
      const exited = new Promise<void>((resolve) => thread.once('exit', () => resolve()));
      thread.postMessage({ t: 'stop' } satisfies ToDeliveryThread);
      const timer = setTimeout(() => void thread.terminate(), DELIVERY_THREAD_STOP_GRACE_MS);
      await exited;
      clearTimeout(timer);
    }
    await this.deliveries.close();
  }
}
