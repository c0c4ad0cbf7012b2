/**
 * A piscina task: verifies an environment's audit chain on a pool thread, so a long
 * chain never stalls the front end's event loop. It opens the control store's audit
 * database read-side in its own thread (lmdb-js shares the environment across threads;
 * LMDB readers never block the writer) and runs the same `AuditLog.verify` as inline.
 */
import { join } from 'node:path';
import { AuditLog, type AuditVerification } from './audit-log.js';
import { openDurableEnv } from './lmdb-env.js';

export interface AuditVerifyTask {
  readonly dataDir: string;
  readonly environment: string;
}

const logs = new Map<string, AuditLog>();

export default function verifyAuditChain(task: AuditVerifyTask): AuditVerification {
  let log = logs.get(task.dataDir);
  if (log === undefined) {
    log = new AuditLog(openDurableEnv(join(task.dataDir, 'control'), ['audit']).dbs.audit);
    logs.set(task.dataDir, log);
  }
  return log.verify(task.environment);
}
