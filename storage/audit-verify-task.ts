/**
 * A piscina task: verifies an environment's audit chain on a pool thread, so a long
 * chain never stalls the front end's event loop. It opens the control store's audit
 * database read-side in its own thread (lmdb-js shares the environment across threads;
 * LMDB readers never block the writer) and runs the same `AuditLog.verify` as inline.
 */
import { join } from 'node:path';
import { AuditLog, type AuditVerification } from './audit-log.js';
import type { RootDatabase } from 'lmdb';
import { freshSnapshot, openDurableEnv } from './lmdb-env.js';

export interface AuditVerifyTask {
  readonly dataDir: string;
  readonly environment: string;
}

interface OpenLog {
  readonly root: RootDatabase;
  readonly log: AuditLog;
}

const logs = new Map<string, OpenLog>();

export default function verifyAuditChain(task: AuditVerifyTask): AuditVerification {
  let open = logs.get(task.dataDir);
  if (open === undefined) {
    const env = openDurableEnv(join(task.dataDir, 'control'), ['audit']);
    open = { root: env.root, log: new AuditLog(env.dbs.audit) };
    logs.set(task.dataDir, open);
  }
  // Piscina waits for the next task with Atomics.wait, so timers never run here: without a
  // fresh snapshot every later verify would read the chain as it was at the first one.
  freshSnapshot(open.root);
  return open.log.verify(task.environment);
}
