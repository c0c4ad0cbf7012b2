/**
 * The front end's `has` view: answers the shards publish and the front end serves without a
 * round trip. Three levels: the core's horizon (until when an answer holds by time alone),
 * a seeded simulation of one shard and one front end with messages held in flight both ways
 * (every answer the view serves is checked against a reference of the shard's state), and
 * the real server (read-your-writes over HTTP, configuration pushes, the metric of hits).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { compileConfig, type BillingConfig } from '../actors/billing-config.js';
import type { Command, Outcome } from '../actors/customer.js';
import { PublishedViews, viewStamps, type ViewChanges } from '../actors/has-view.js';
import type { Envelope, ReplyOutcome } from '../actors/protocol.js';
import { Shard } from '../actors/shard.js';
import { HasView } from '../src/has-view.js';
import { CONFIG, Driver, T0 } from './support/core-fixtures.js';
import { rng } from './support/durability-sim.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const DAY_MS = 86_400_000;

const has = (customerId: string, key: string): Command => ({
  op: 'has',
  environment: 'test',
  customerId,
  key,
});

const consume = (customerId: string, key: string, units: number): Command => ({
  op: 'consume',
  environment: 'test',
  customerId,
  key,
  amountMicros: BigInt(units) * 1_000_000n,
});

function hasOutcome(outcome: Outcome): { value: boolean; untilMs: number } {
  if (outcome.kind !== 'has') throw new Error(`expected a has outcome, got ${outcome.kind}`);
  return { value: outcome.value, untilMs: outcome.untilMs };
}

describe('has horizon (core)', () => {
  it('a used-up daily meter answers false until the next UTC midnight, then true', () => {
    const driver = new Driver();
    // The free plan includes 1,000 tokens a day and allows no overage.
    expect(driver.run(consume('c', 'tokens', 1000), T0).kind).toBe('balance');
    const before = hasOutcome(driver.run(has('c', 'tokens'), T0));
    const midnight = Date.UTC(2026, 2, 16);
    expect(before).toEqual({ value: false, untilMs: midnight });
    expect(hasOutcome(driver.run(has('c', 'tokens'), midnight - 1)).value).toBe(false);
    expect(hasOutcome(driver.run(has('c', 'tokens'), midnight))).toEqual({
      value: true,
      untilMs: midnight + DAY_MS,
    });
  });

  it('features, limits and meters that never reset hold until something is written', () => {
    const driver = new Driver();
    for (const key of ['sso', 'audit', 'seats', 'projects', 'storage'])
      expect(hasOutcome(driver.run(has('c', key), T0)).untilMs).toBe(Infinity);
    expect(hasOutcome(driver.run(has('c', 'api_calls'), T0)).untilMs).toBe(Date.UTC(2026, 3, 1));
  });

  it('over random usage and times, an answer holds at every instant before its horizon', () => {
    const random = rng(7);
    const keys = ['tokens', 'api_calls', 'storage', 'sso'];
    for (let run = 0; run < 200; run++) {
      const driver = new Driver();
      let now = T0 + Math.floor(random() * 40 * DAY_MS);
      for (let step = 0; step < 6; step++) {
        const key = pick(random, keys);
        if (key !== 'sso') driver.run(consume('c', key, 1 + Math.floor(random() * 600)), now);
        const answer = hasOutcome(driver.run(has('c', key), now));
        const span = Math.min(answer.untilMs, now + 60 * DAY_MS) - now;
        for (const offset of [0, 1, Math.floor(random() * span), span - 1]) {
          expect(hasOutcome(driver.run(has('c', key), now + offset)).value).toBe(answer.value);
        }
        now += Math.floor(random() * 3 * DAY_MS);
      }
    }
  });
});

function pick<T>(random: () => number, items: readonly T[]): T {
  return items[Math.floor(random() * items.length)] as T;
}

/** A message from the shard to the front end, with what the shard's state answered then. */
interface ToFront {
  /** The shard's flush it belongs to, counted from 1. */
  readonly flush: number;
  readonly view: ViewChanges;
  readonly replies: Array<[number, ReplyOutcome, string]>;
  /** The reference's answers when the message left: what a view applying it must serve. */
  readonly expected: Map<string, boolean>;
  /** Sent when a configuration reached the shard. */
  readonly confirmsConfig: boolean;
}

type ToShard =
  | { readonly t: 'batch'; readonly envelopes: Envelope[] }
  | { readonly t: 'config'; readonly version: number; readonly config: BillingConfig };

/**
 * One shard and two front ends, messages in flight every way and journal syncs delivered at
 * random: the shape of a worker and the pools, without threads. The first front end keeps the
 * view; the second only writes, on its own channel, so a write's reply can reach its client
 * before the first front end has the view changes of the same write (its client then asks the
 * first: the stamps must keep the older answer from being served).
 */
class ViewSimulation {
  readonly reference = new Driver();
  /** The stamps the shard bumps and the first front end reads (shared memory in the service). */
  private readonly stamps = viewStamps(false);
  readonly front = new HasView(1, () => this.now, [this.stamps]);
  now = T0;
  private readonly toShard: ToShard[] = [];
  private readonly toFront: ToFront[] = [];
  /** Replies to the second front end's writes. */
  private readonly toSecond: ToFront[] = [];
  /** Request ids the second front end sent. */
  private readonly fromSecond = new Set<number>();
  private flushes = 0;
  /** The newest flush the first front end applied, and whose reply the second delivered. */
  private firstApplied = 0;
  private secondSeen = 0;
  private secondExpected = new Map<string, boolean>();
  private readonly syncs: Array<() => void> = [];
  private outbox: Array<[number, ReplyOutcome, string]> = [];
  private nextId = 1;
  private readonly shard: Shard;
  /** What the front end's view must serve now: the state of the last message applied. */
  private expected = new Map<string, boolean>();
  served = 0;
  asked = 0;

  private readonly views: PublishedViews;

  constructor(
    private readonly customers: readonly string[],
    private readonly keys: readonly string[],
    customersMax: number,
  ) {
    this.views = new PublishedViews(customersMax, this.stamps);
    this.shard = new Shard({
      journal: {
        append: () => {
          let resolve!: () => void;
          const durable = new Promise<void>((r) => (resolve = r));
          this.syncs.push(resolve);
          return { seq: this.nextId++, durable };
        },
      },
      clock: () => this.now,
      reply: (id, outcome, body) => this.outbox.push([id, outcome, body]),
      flush: () => this.flush(),
      fatal: (error) => {
        throw error;
      },
      views: this.views,
    });
    this.configure(1, USAGE_CONFIG(300));
  }

  /**
   * The front end sends a configuration, as the pool broadcasts one. Once it is sent (the
   * push's answer may already have reached its caller) no answer of the configuration before
   * it may be served: until the shard's message saying it arrived, nothing may be.
   */
  configure(version: number, config: BillingConfig): void {
    this.front.configSent('test');
    this.configsInFlight++;
    this.expected = new Map();
    this.toShard.push({ t: 'config', version, config });
  }

  private configsInFlight = 0;

  /** The reference's answers now, for every customer and key. */
  private answersNow(): Map<string, boolean> {
    const answers = new Map<string, boolean>();
    for (const customer of this.customers)
      for (const key of this.keys)
        answers.set(
          `${customer} ${key}`,
          hasOutcome(this.reference.run(has(customer, key), this.now)).value,
        );
    return answers;
  }

  private flush(confirmsConfig = false): void {
    const view = this.views.take();
    if (view.length === 0 && this.outbox.length === 0) return;
    const expected = this.answersNow();
    const flush = ++this.flushes;
    const second = this.outbox.filter(([id]) => this.fromSecond.has(id));
    const first = this.outbox.filter(([id]) => !this.fromSecond.has(id));
    if (view.length > 0 || first.length > 0 || confirmsConfig)
      this.toFront.push({ flush, view: [...view], replies: first, expected, confirmsConfig });
    if (second.length > 0)
      this.toSecond.push({ flush, view: [], replies: second, expected, confirmsConfig: false });
    this.outbox = [];
  }

  /** Moves the clock; only when nothing is in flight, so the state is the shard's now. */
  async advance(ms: number): Promise<void> {
    await this.drain();
    this.now += ms;
    this.expected = this.answersNow();
  }

  /** The front end's `has`: from the view when it holds an answer, else sent to the shard. */
  ask(customer: string, key: string): void {
    const held = this.front.answer('test', customer, key);
    if (held === undefined) {
      this.asked++;
      this.toShard.push({
        t: 'batch',
        envelopes: [{ id: this.nextId++, command: has(customer, key) }],
      });
      return;
    }
    this.served++;
    // A client that has the reply of a newer write (through the second front end) must not
    // read an answer from before it.
    const expected =
      this.configsInFlight === 0 && this.secondSeen > this.firstApplied
        ? this.secondExpected
        : this.expected;
    expect(held, `${customer} ${key} served from the view`).toBe(
      expected.get(`${customer} ${key}`),
    );
  }

  /** A write, through the first front end or (`second`) the second. */
  write(command: Command, second = false): void {
    const id = this.nextId++;
    if (second) this.fromSecond.add(id);
    this.toShard.push({ t: 'batch', envelopes: [{ id, command }] });
  }

  /** Delivers one reply message to the second front end: its client knows the write now. */
  secondStep(): boolean {
    const message = this.toSecond.shift();
    if (message === undefined) return false;
    if (message.flush > this.secondSeen) {
      this.secondSeen = message.flush;
      this.secondExpected = message.expected;
    }
    return true;
  }

  /** Delivers one message to the shard: it decides at once, as a worker does. */
  shardStep(): boolean {
    const message = this.toShard.shift();
    if (message === undefined) return false;
    if (message.t === 'config') {
      this.shard.setConfig('test', message.version, message.config);
      this.reference.config = compileConfig(message.config, message.version);
      this.flush(true);
      return true;
    }
    for (const { command } of message.envelopes)
      if (command.op !== 'has') this.reference.run(command, this.now);
    this.shard.handleBatch(message.envelopes);
    return true;
  }

  /** Delivers one message to the front end: view changes first, then its replies. */
  frontStep(): boolean {
    const message = this.toFront.shift();
    if (message === undefined) return false;
    this.front.apply(0, message.view);
    this.firstApplied = message.flush;
    if (message.confirmsConfig) this.configsInFlight--;
    // While a configuration is on its way, answers of the one before must not be served.
    this.expected = this.configsInFlight > 0 ? new Map() : message.expected;
    return true;
  }

  async syncStep(): Promise<boolean> {
    const sync = this.syncs.shift();
    if (sync === undefined) return false;
    sync();
    await new Promise((resolve) => setImmediate(resolve));
    return true;
  }

  async drain(): Promise<void> {
    for (;;) {
      const moved =
        this.shardStep() || this.frontStep() || this.secondStep() || (await this.syncStep());
      if (!moved) return;
    }
  }
}

const USAGE_CONFIG = (included: number): BillingConfig => ({
  ...CONFIG,
  products: {
    ...CONFIG.products,
    free: {
      ...CONFIG.products['free'],
      entitlements: { ...CONFIG.products['free']?.entitlements, tokens: { included } },
    },
  },
});

describe('has view (shard and front end, messages in flight)', () => {
  it(
    'every answer served from the view is the shard state of the last message applied, through ' +
      'writes, configuration pushes, clears and day boundaries',
    async () => {
      let served = 0;
      let asked = 0;
      for (let seed = 1; seed <= 60; seed++) {
        const random = rng(seed);
        const customers = ['a', 'b', 'c', 'd', 'e'];
        const keys = ['tokens', 'sso', 'storage', 'api_calls'];
        const sim = new ViewSimulation(customers, keys, seed % 4 === 0 ? 3 : 100);
        let version = 1;
        for (let step = 0; step < 400; step++) {
          const roll = random();
          if (roll < 0.35) sim.ask(pick(random, customers), pick(random, keys));
          else if (roll < 0.42)
            sim.write(
              consume(
                pick(random, customers),
                pick(random, ['tokens', 'storage']),
                // Amounts that use a balance up exactly, so answers flip often.
                pick(random, [25, 50, 100, 300]),
              ),
              random() < 0.5,
            );
          else if (roll < 0.43)
            sim.configure(++version, USAGE_CONFIG(100 + 25 * Math.floor(random() * 24)));
          else if (roll < 0.65) sim.shardStep();
          // Every third seed the first front end is slow to read its channel: the second
          // front end's clients then hold replies of writes whose changes it lacks.
          else if (roll < (seed % 3 === 0 ? 0.67 : 0.77)) sim.frontStep();
          else if (roll < 0.85) sim.secondStep();
          else if (roll < 0.95) await sim.syncStep();
          else {
            // Time moves only when nothing is in flight; often across a day boundary.
            await sim.advance(Math.floor(random() * DAY_MS));
          }
        }
        served += sim.served;
        asked += sim.asked;
      }
      // The view must actually serve, or the checks above prove nothing.
      expect(served).toBeGreaterThan(2_000);
      expect(asked).toBeGreaterThan(1_000);
    },
  );

  it('a consume leaves answers served unless the view holds one to its meter', async () => {
    const sim = new ViewSimulation(['a'], ['tokens', 'sso'], 100);
    sim.write(consume('a', 'tokens', 25));
    await sim.drain();
    for (const key of ['tokens', 'sso']) sim.ask('a', key);
    await sim.drain();
    for (const key of ['tokens', 'sso']) sim.ask('a', key);
    expect(sim.served).toBe(2);
    sim.write(consume('a', 'api_calls', 50));
    expect(sim.shardStep()).toBe(true);
    // Decided, its changes not yet at the front end: the answers to other keys still serve.
    for (const key of ['tokens', 'sso']) sim.ask('a', key);
    expect(sim.served).toBe(4);
    await sim.drain();
    // Uses the tokens up: the view serves the new answer (each served one is checked).
    sim.write(consume('a', 'tokens', 275));
    await sim.drain();
    for (const key of ['tokens', 'sso']) sim.ask('a', key);
    expect(sim.served).toBe(6);
    expect(sim.front.answer('test', 'a', 'tokens')).toBe(false);
  });

  it(
    'a write answered through the second front end is seen by the next has on the first, ' +
      'before the first has its view changes',
    async () => {
      const sim = new ViewSimulation(['a'], ['tokens'], 100);
      await sim.drain();
      sim.ask('a', 'tokens');
      await sim.drain();
      sim.ask('a', 'tokens');
      expect(sim.served).toBe(1);
      // Uses the balance up, through the second front end; its reply reaches the client
      // while the first front end's channel still holds the change.
      sim.write(consume('a', 'tokens', 300), true);
      expect(sim.shardStep()).toBe(true);
      expect(await sim.syncStep()).toBe(true);
      expect(sim.secondStep()).toBe(true);
      sim.ask('a', 'tokens');
      expect(sim.served).toBe(1);
      await sim.drain();
      sim.ask('a', 'tokens');
      expect(sim.served).toBe(2);
    },
  );

  it('a fill sent before a configuration reached the shard is not taken after it was sent', () => {
    const stamps = viewStamps(false);
    const front = new HasView(2, () => T0, [stamps, stamps]);
    const views = new PublishedViews(undefined, stamps);
    views.answered('test', 'a', 'sso', true, Infinity);
    const stale = [...views.take()];
    front.configSent('test');
    front.apply(1, stale);
    expect(front.answer('test', 'a', 'sso')).toBeUndefined();
    // Worker 1 confirms the configuration; its later fills are taken, worker 0's not yet.
    views.configured('test');
    views.answered('test', 'a', 'sso', false, Infinity);
    front.apply(1, [...views.take()]);
    expect(front.answer('test', 'a', 'sso')).toBe(false);
    front.apply(0, stale);
    views.answered('test', 'b', 'sso', true, Infinity);
    front.apply(0, [...views.take()]);
    expect(front.answer('test', 'b', 'sso')).toBeUndefined();
  });

  it("one worker's confirmation of a configuration keeps the answers another worker sent", () => {
    const stampsOf = [viewStamps(false), viewStamps(false)] as const;
    const front = new HasView(2, () => T0, [...stampsOf]);
    const views = stampsOf.map((stamps) => new PublishedViews(undefined, stamps));
    const [first, second] = views as [PublishedViews, PublishedViews];
    front.configSent('test');
    first.configured('test');
    first.answered('test', 'a', 'sso', true, Infinity);
    front.apply(0, [...first.take()]);
    expect(front.answer('test', 'a', 'sso')).toBe(true);
    // The second worker's confirmation arrives after the first worker's fill.
    second.configured('test');
    front.apply(1, [...second.take()]);
    expect(front.answer('test', 'a', 'sso')).toBe(true);
    // A confirmation no configSent announced drops only its own worker's answers.
    second.answered('test', 'b', 'sso', false, Infinity);
    front.apply(1, [...second.take()]);
    expect(front.answer('test', 'b', 'sso')).toBe(false);
    second.configured('test');
    front.apply(1, [...second.take()]);
    expect(front.answer('test', 'b', 'sso')).toBeUndefined();
    expect(front.answer('test', 'a', 'sso')).toBe(true);
  });

  it("a write stops serving its own customer's answers, and hardly any other's", () => {
    // A write bumps the stamp its customer hashes to; every answer held under that stamp
    // then goes unserved until asked again. Writes to 5% of 100,000 answered customers.
    const stamps = viewStamps(false);
    const front = new HasView(1, () => T0, [stamps]);
    const views = new PublishedViews(undefined, stamps);
    const customers = Array.from({ length: 100_000 }, (_, i) => `c-${i}`);
    for (const id of customers) views.answered('test', id, 'sso', true, Infinity);
    front.apply(0, [...views.take()]);
    const random = rng(11);
    const written = new Set<string>();
    while (written.size < 5_000) written.add(pick(random, customers));
    for (const id of written) {
      views.changed('test', id, () => ({ value: true, untilMs: Infinity }));
      // Until the front end has the new answers, the old one is not served; then it is.
      expect(front.answer('test', id, 'sso')).toBeUndefined();
      front.apply(0, [...views.take()]);
      expect(front.answer('test', id, 'sso')).toBe(true);
    }
    const others = customers.filter((id) => !written.has(id));
    const served = others.filter((id) => front.answer('test', id, 'sso') === true).length;
    // With 4,096 stamps about 30% would still be served; with 262,144 about 98%.
    expect(served / others.length).toBeGreaterThan(0.95);
  });

  it("a consume of one meter leaves the customer's answers to other keys served", () => {
    const stamps = viewStamps(false);
    const front = new HasView(1, () => T0, [stamps]);
    const views = new PublishedViews(undefined, stamps);
    views.answered('test', 'a', 'sso', true, Infinity);
    views.answered('test', 'a', 'tokens', true, Infinity);
    front.apply(0, [...views.take()]);
    const reanswered: string[] = [];
    const reanswer = (key: string) => {
      reanswered.push(key);
      return { value: key === 'sso', untilMs: Infinity };
    };
    // A meter the front end holds no answer to: nothing is sent, nothing stops being served.
    views.changed('test', 'a', reanswer, 'api_calls');
    expect(views.take()).toEqual([]);
    expect(reanswered).toEqual([]);
    expect(front.answer('test', 'a', 'sso')).toBe(true);
    expect(front.answer('test', 'a', 'tokens')).toBe(true);
    // A meter it holds one to: every answer of the customer is sent again, none served meanwhile.
    views.changed('test', 'a', reanswer, 'tokens');
    expect(reanswered.sort()).toEqual(['sso', 'tokens']);
    expect(front.answer('test', 'a', 'sso')).toBeUndefined();
    front.apply(0, [...views.take()]);
    expect(front.answer('test', 'a', 'sso')).toBe(true);
    expect(front.answer('test', 'a', 'tokens')).toBe(false);
  });

  it('an answer is served until its horizon and not at it', () => {
    let now = T0;
    const stamps = viewStamps(false);
    const front = new HasView(1, () => now, [stamps]);
    const views = new PublishedViews(undefined, stamps);
    views.answered('live', 'a', 'tokens', false, T0 + 1000);
    front.apply(0, [...views.take()]);
    expect(front.answer('live', 'a', 'tokens')).toBe(false);
    expect(front.answer('test', 'a', 'tokens')).toBeUndefined();
    now = T0 + 999;
    expect(front.answer('live', 'a', 'tokens')).toBe(false);
    now = T0 + 1000;
    expect(front.answer('live', 'a', 'tokens')).toBeUndefined();
  });

  it(
    'past its bound the shard forgets every customer, and the front end too; a write sends ' +
      'its held answers again',
    () => {
      const stamps = viewStamps(false);
      const front = new HasView(1, () => T0, [stamps]);
      const views = new PublishedViews(2, stamps);
      views.answered('test', 'a', 'sso', true, Infinity);
      views.answered('test', 'b', 'sso', true, Infinity);
      views.answered('test', 'c', 'sso', true, Infinity);
      front.apply(0, [...views.take()]);
      expect(front.answer('test', 'a', 'sso')).toBeUndefined();
      expect(front.answer('test', 'c', 'sso')).toBe(true);
      expect(views.size).toBe(1);
      // A write to a forgotten customer sends nothing; to a held one, its answers again.
      const reanswered: string[] = [];
      views.changed('test', 'a', (key) => {
        reanswered.push(key);
        return { value: false, untilMs: Infinity };
      });
      expect(views.take()).toEqual([]);
      expect(reanswered).toEqual([]);
      views.changed('test', 'c', () => ({ value: false, untilMs: Infinity }));
      front.apply(0, [...views.take()]);
      expect(front.answer('test', 'c', 'sso')).toBe(false);
      // A key it cannot answer any more: the customer is dropped, on both sides.
      views.changed('test', 'c', () => null);
      front.apply(0, [...views.take()]);
      expect(front.answer('test', 'c', 'sso')).toBeUndefined();
      expect(views.size).toBe(0);
    },
  );
});

describe('has view (server)', () => {
  const started: ServerProcess[] = [];
  afterAll(async () => {
    for (const server of started) await server.stop();
  });
  const METER_CONFIG = (included: number) => ({
    entitlements: { api_calls: { type: 'meter', reset: 'month' }, sso: { type: 'feature' } },
    products: { free: { default: true, entitlements: { api_calls: { included }, sso: true } } },
  });

  it(
    'two workers: a write answered is seen by the next has, a pushed configuration by the ' +
      'next has, and repeated reads are served from the view',
    async () => {
      const server = await startServerProcess({
        config: METER_CONFIG(3),
        env: { TALLY_WORKERS: '2' },
      });
      started.push(server);
      const key = server.keys.test.server;
      const hasNow = async (customerId: string, entitlement = 'api_calls') => {
        const reply = await call(
          server.base,
          'GET',
          `/v1/entitlements/${entitlement}/has?customerId=${customerId}`,
          { key },
        );
        expect(reply.status).toBe(200);
        return reply.body as boolean;
      };
      const hits = async () => {
        const metrics = await fetch(`${server.base}/v1/admin/metrics`, {
          headers: { 'x-tally-key': server.keys.admin },
        });
        const match = /^tally_has_view_hits_total (\d+)$/m.exec(await metrics.text());
        return Number(match?.[1]);
      };
      const customers = Array.from({ length: 8 }, (_, i) => `view-${i}`);
      for (const customerId of customers) {
        for (let used = 0; used < 3; used++) {
          expect(await hasNow(customerId)).toBe(true);
          expect(await hasNow(customerId)).toBe(true);
          const consumed = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key,
            body: { customerId, amount: 1 },
          });
          expect(consumed.status).toBe(200);
        }
        expect(await hasNow(customerId)).toBe(false);
        expect(await hasNow(customerId)).toBe(false);
      }
      // Only each customer's first has went to its worker: a consume sends the customer's
      // held answers again, so the has after it is served by the front end too.
      const servedBefore = await hits();
      expect(servedBefore).toBe(customers.length * 7);
      const pushed = await call(server.base, 'POST', '/v1/sync/push', {
        key,
        body: METER_CONFIG(5),
      });
      expect(pushed.status).toBe(200);
      for (const customerId of customers) expect(await hasNow(customerId)).toBe(true);
      for (const customerId of customers) expect(await hasNow(customerId)).toBe(true);
      expect(await hits()).toBe(servedBefore + customers.length);
      // Unknown entitlements still answer 404 from the shard, never from the view.
      const unknown = await call(server.base, 'GET', '/v1/entitlements/nope/has?customerId=x', {
        key,
      });
      expect(unknown.status).toBe(404);
    },
  );
});
