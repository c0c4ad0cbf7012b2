/**
 * The front end's read side of the customer index: every shard writes its customers'
 * rows ([environment, id] → the customer's JSON) into its own LMDB environment, in the
 * same transaction as the journal record that changed them; this class opens those
 * environments in the front end's thread (lmdb-js shares an environment across threads
 * of one process; readers never block the shard's writer) and answers lookups and pages
 * without waking any shard.
 *
 * Order is by id in UTF-8 byte order, the order LMDB keeps keys in, so a page merged
 * from every shard continues exactly where the previous one stopped, whatever was
 * inserted meanwhile.
 */
import path from 'node:path';
import {
  freshSnapshot,
  openDurableEnv,
  SHARD_ENV_OPTIONS,
  type BinaryDb,
  type DurableEnv,
} from './lmdb-env.js';

export interface CustomerPage {
  /** Each customer's JSON, as stored. */
  readonly items: readonly string[];
  /** The id to continue after, or null on the last page. */
  readonly nextAfter: string | null;
}

export class CustomerIndex {
  private constructor(
    private readonly envs: ReadonlyArray<DurableEnv<'customers'>>,
    private readonly shardOf: (environment: string, id: string) => number,
  ) {}

  /** Opens the index of every shard worker's environment under `dataDir`. */
  static open(
    dataDir: string,
    workers: number,
    shardOf: (environment: string, id: string) => number,
  ): CustomerIndex {
    const envs = Array.from({ length: workers }, (_, i) =>
      openDurableEnv<'customers'>(
        path.join(dataDir, `shard-${i}`),
        ['customers'],
        SHARD_ENV_OPTIONS,
      ),
    );
    return new CustomerIndex(envs, shardOf);
  }

  private db(index: number): BinaryDb {
    const env = this.envs[index];
    if (env === undefined) throw new Error(`no customer index for shard ${index}`);
    return env.dbs.customers;
  }

  /** The shard's table on a fresh snapshot: a customer just created is seen (lmdb-env.ts). */
  private fresh(index: number): BinaryDb {
    return freshSnapshot(this.db(index));
  }

  /** The customer's JSON, or null when the environment has no such customer. */
  get(environment: string, id: string): string | null {
    const bytes = this.fresh(this.shardOf(environment, id)).get([environment, id]);
    return bytes === undefined ? null : bytes.toString('utf8');
  }

  /** Up to `limit` customers with ids after `after` (null: from the start), in id order. */
  page(environment: string, after: string | null, limit: number): CustomerPage {
    const candidates: Array<{ id: string; key: Buffer; json: string }> = [];
    for (let i = 0; i < this.envs.length; i++) {
      let taken = 0;
      const rows = this.fresh(i).getRange({ start: [environment, after ?? ''] });
      for (const { key, value } of rows) {
        const [env, id] = key as [string, string];
        if (env !== environment) break;
        if (id === after) continue;
        candidates.push({ id, key: Buffer.from(id, 'utf8'), json: value.toString('utf8') });
        if (++taken > limit) break;
      }
    }
    candidates.sort((a, b) => Buffer.compare(a.key, b.key));
    const items = candidates.slice(0, limit);
    const more = candidates.length > limit;
    return { items: items.map((c) => c.json), nextAfter: more ? (items.at(-1)?.id ?? null) : null };
  }

  async close(): Promise<void> {
    await Promise.all(this.envs.map((env) => env.root.close()));
  }
}
