/**
 * The side-job lanes: a burst of audit verifications costs one chain walk, a verdict on
 * an unchanged chain is answered again for a while, distinct walks are bounded (then
 * SideJobsBusyError, a 503 at the routes), and snapshots have a lane of their own.
 * Runs the real pool threads over a real control store.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../storage/audit-log.js';
import { ControlStore } from '../storage/control-store.js';
import {
  SideJobs,
  SideJobsBusyError,
  VERIFY_CACHE_MS,
  VERIFY_QUEUE_MAX,
} from '../src/side-jobs.js';

/** The compiled task modules the pool threads load. */
const TASKS = new URL('../dist/storage/', import.meta.url);
import {
  call,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';

let dataDir: string;
let control: ControlStore;
let audit: AuditLog;

beforeAll(async () => {
  dataDir = tempDataDir('side-jobs');
  control = ControlStore.open(dataDir);
  audit = new AuditLog(control.auditDb, control.auditRefsDb);
  for (let i = 0; i < 50; i++) {
    await audit.append(
      'test',
      {
        action: 'customer.upsert',
        resourceType: 'customer',
        resourceId: `c${i}`,
        actor: 'key_x',
        data: {},
      },
      1_000 + i,
    );
  }
});
afterAll(async () => {
  await control.close();
});

describe('audit verification lane', () => {
  it(
    'requests for an unchanged chain share one walk, and its verdict is answered again ' +
      'until the cache expires',
    async () => {
      let walks = 0;
      const jobs = new SideJobs(
        dataDir,
        (stream) => {
          walks++;
          return audit.lastSeq(stream);
        },
        TASKS,
      );
      try {
        const now = 5_000_000;
        const burst = Array.from({ length: 60 }, () => jobs.verifyAudit('test', now));
        expect(new Set(burst).size).toBe(1); // one walk, one promise
        const [first] = await Promise.all(burst);
        expect(first).toMatchObject({ ok: true, entries: 50 });
        expect(await jobs.verifyAudit('test', now + VERIFY_CACHE_MS)).toBe(first);
        expect(walks).toBe(61); // the last entry was read each time, the chain walked once
        const later = jobs.verifyAudit('test', now + VERIFY_CACHE_MS + 1);
        expect(later).not.toBe(burst[0]);
        expect(await later).toEqual(first);
      } finally {
        await jobs.destroy();
      }
    },
  );

  it(
    'a new entry means a new walk; past VERIFY_QUEUE_MAX distinct walks in flight, calls ' +
      'fail busy',
    async () => {
      let seq = 0;
      const jobs = new SideJobs(dataDir, () => ++seq, TASKS); // every call sees a changed chain
      try {
        const accepted = Array.from({ length: VERIFY_QUEUE_MAX }, () => jobs.verifyAudit('test'));
        await expect(jobs.verifyAudit('test')).rejects.toBeInstanceOf(SideJobsBusyError);
        await Promise.all(accepted);
        // Room again once they finished.
        await expect(jobs.verifyAudit('test')).resolves.toMatchObject({ ok: true });
      } finally {
        await jobs.destroy();
      }
    },
  );
});

describe('over HTTP', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess();
  });
  afterAll(async () => {
    await server?.stop();
  });

  it(
    'sixty test-environment verifications, a live one and an operator snapshot all complete ' +
      'together',
    async () => {
      const testVerifies = Array.from({ length: 60 }, () =>
        call(server.base, 'GET', '/v1/audit/verify', { key: server.keys.test.server }),
      );
      const live = call(server.base, 'GET', '/v1/audit/verify', { key: server.keys.live.server });
      const snapshot = await call(server.base, 'POST', '/v1/admin/snapshots', {
        key: server.keys.admin,
      });
      expect(snapshot.status).toBe(202);
      for (const res of await Promise.all(testVerifies))
        expect(res).toMatchObject({ status: 200, body: { ok: true } });
      expect(await live).toMatchObject({ status: 200, body: { ok: true } });
      for (let i = 0; i < 100; i++) {
        const info = await call(
          server.base,
          'GET',
          `/v1/admin/snapshots/${snapshot.body.id as string}`,
          { key: server.keys.admin },
        );
        if (info.body.status === 'complete') return;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      throw new Error('snapshot did not complete');
    },
  );
});
