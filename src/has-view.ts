/**
 * The front end's `has` view: answers the shards published (actors/has-view.ts says how they
 * stay right). One map per environment for every worker's customers, so that a lookup needs
 * no hash of the customer to find its worker; a worker's rare clear drops the environment's
 * answers of every worker.
 *
 * An answer is served while the clock is before its `until` and while its customer's stamp
 * (shared memory the workers bump as they decide a change) is still the one it came with; a
 * configuration sent to the workers drops the environment's answers at once, and answers of
 * it are not taken again from a worker until that worker says the configuration reached it
 * (fills it sent before were computed with the old one). A worker's confirmation leaves the
 * answers other workers sent after theirs.
 */
import {
  VIEW_CLEAR,
  VIEW_CONFIGURED,
  VIEW_DROP,
  VIEW_FILL,
  VIEW_SLOTS,
  viewStamps,
  type ViewChanges,
} from '../actors/has-view.js';
import type { Environment } from '../actors/protocol.js';

/** A customer's held answers: key → signed until (see VIEW_FILL), and the stamp they hold under. */
interface Held {
  readonly keys: Map<string, number>;
  readonly stamps: Int32Array;
  bucket: number;
  stamp: number;
}

/** One environment's answers, of every worker: customer → its held answers. */
type Answers = Map<string, Held>;

export class HasView {
  private readonly answers: Record<Environment, Answers> = { test: new Map(), live: new Map() };
  /** Per worker: configurations sent to it that it has not confirmed yet, per environment. */
  private readonly configsUnconfirmed: Array<Record<Environment, number>> = [];
  /** `has` answered from the view since start. */
  hits = 0;

  /**
   * `stamps`: each worker's stamp counters (actors/has-view.ts `viewStamps`, shared with it);
   * default: private ones, for a view fed by hand.
   */
  constructor(
    workers: number,
    private readonly clock: () => number = Date.now,
    private readonly stamps: readonly Int32Array[] = Array.from({ length: workers }, () =>
      viewStamps(false),
    ),
  ) {
    for (let i = 0; i < workers; i++) this.configsUnconfirmed.push({ test: 0, live: 0 });
  }

  /** The held answer, or undefined when the customer's worker must be asked. */
  answer(environment: Environment, customerId: string, key: string): boolean | undefined {
    const held = this.answers[environment].get(customerId);
    if (held === undefined) return undefined;
    const until = held.keys.get(key);
    if (until === undefined || this.clock() >= Math.abs(until)) return undefined;
    // A change decided for the customer whose new answers have not arrived yet.
    if (Atomics.load(held.stamps, held.bucket) !== held.stamp) return undefined;
    this.hits++;
    return until > 0;
  }

  /** Applies a worker's view changes, in order (before the replies of the same message). */
  apply(worker: number, changes: ViewChanges): void {
    const unconfirmed = this.configsUnconfirmed[worker];
    const stamps = this.stamps[worker];
    if (unconfirmed === undefined || stamps === undefined) return;
    for (let i = 0; i < changes.length; i += VIEW_SLOTS) {
      const environment: Environment = changes[i + 1] === 1 ? 'live' : 'test';
      const answers = this.answers[environment];
      switch (changes[i]) {
        case VIEW_FILL: {
          if (unconfirmed[environment] > 0) break;
          const customerId = changes[i + 2] as string;
          const bucket = changes[i + 5] as number;
          const stamp = changes[i + 6] as number;
          let held = answers.get(customerId);
          if (held === undefined) {
            held = { keys: new Map(), stamps, bucket, stamp };
            answers.set(customerId, held);
          } else {
            held.bucket = bucket;
            held.stamp = stamp;
          }
          held.keys.set(changes[i + 3] as string, changes[i + 4] as number);
          break;
        }
        case VIEW_DROP:
          answers.delete(changes[i + 2] as string);
          break;
        case VIEW_CONFIGURED:
          // Sent through configSent: every answer of this worker was dropped then and none
          // taken since, while other workers' answers, of the new configuration, stay.
          if (unconfirmed[environment] > 0) unconfirmed[environment]--;
          else this.dropWorker(answers, stamps);
          break;
        case VIEW_CLEAR:
          answers.clear();
          break;
        default:
          throw new Error(`unknown view change ${String(changes[i])}`);
      }
    }
  }

  /** Drops the answers of one worker (known by its stamp counters). */
  private dropWorker(answers: Answers, stamps: Int32Array): void {
    for (const [customerId, held] of answers)
      if (held.stamps === stamps) answers.delete(customerId);
  }

  /** A configuration of `environment` is on its way to every worker. */
  configSent(environment: Environment): void {
    this.answers[environment].clear();
    for (const unconfirmed of this.configsUnconfirmed) unconfirmed[environment]++;
  }

  /** Customers with answers held, in both environments. */
  get customers(): number {
    return this.answers.test.size + this.answers.live.size;
  }
}
