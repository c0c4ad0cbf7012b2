/**
 * A piscina task: writes the operator snapshot file from the pieces of a cut, off the
 * front end's event loop. The shards have already written their customers as framed
 * part files; this task writes the header, the keys, every configuration version and
 * the audit chains up to the cut (read here from the control store, which is append-only
 * for both, so "up to the cut" is just a position), splices the parts in, hashes it all,
 * fsyncs, and renames the file into place so a listed snapshot is always complete.
 */
import fs from 'node:fs';
import path from 'node:path';
import { AuditLog } from './audit-log.js';
import { openPrivateFile } from './private-files.js';
import { ControlStore, type Environment, type KeyRecord } from './control-store.js';
import { SnapshotWriter, type SnapshotHeader } from './snapshot-file.js';

export interface SnapshotPart {
  readonly path: string;
  readonly frames: number;
  readonly customers: number;
  readonly bytes: number;
}

export interface SnapshotAssembleTask {
  readonly dataDir: string;
  /** The finished file's path; written as `<file>.tmp` first. */
  readonly file: string;
  readonly header: SnapshotHeader;
  readonly keys: readonly KeyRecord[];
  readonly parts: readonly SnapshotPart[];
}

export interface SnapshotAssembled {
  readonly bytes: number;
  readonly customers: number;
  readonly frames: number;
  /** Of the whole file (as `sha256sum` prints it). */
  readonly sha256: string;
}

/** Audit entries per frame: a few hundred bytes each. */
const AUDIT_FRAME_ENTRIES = 1000;

const stores = new Map<string, ControlStore>();

function controlStore(dataDir: string): ControlStore {
  let store = stores.get(dataDir);
  if (store === undefined) {
    store = ControlStore.open(dataDir);
    stores.set(dataDir, store);
  }
  return store;
}

export default function assembleSnapshot(task: SnapshotAssembleTask): SnapshotAssembled {
  const control = controlStore(task.dataDir);
  const audit = new AuditLog(control.auditDb);
  const temporary = `${task.file}.tmp`;
  const fd = openPrivateFile(temporary);
  try {
    const secret = control.snapshotSecret();
    if (secret === null) throw new Error('the data dir has no snapshot secret yet');
    const writer = new SnapshotWriter(fd, secret);
    writer.frame(task.header);
    writer.frame({ k: 'keys', items: task.keys });
    for (const [environment, version] of Object.entries(task.header.configVersions)) {
      writer.frame({
        k: 'configs',
        environment,
        entries: control.listConfigs(environment as Environment, version),
      });
    }
    for (const [stream, seq] of Object.entries(task.header.auditSeqs)) {
      let entries: Array<[number, Buffer]> = [];
      for (const entry of audit.rawEntries(stream, seq)) {
        entries.push(entry);
        if (entries.length === AUDIT_FRAME_ENTRIES) {
          writer.frame({ k: 'audit', stream, entries });
          entries = [];
        }
      }
      if (entries.length > 0) writer.frame({ k: 'audit', stream, entries });
    }
    for (const part of task.parts) writer.copyFrames(part.path, part);
    const { trailer, fileSha256 } = writer.finish();
    fs.closeSync(fd);
    fs.renameSync(temporary, task.file);
    const dir = fs.openSync(path.dirname(task.file), 'r');
    fs.fsyncSync(dir);
    fs.closeSync(dir);
    return {
      bytes: writer.bytes,
      customers: trailer.customers,
      frames: trailer.frames,
      sha256: fileSha256,
    };
  } catch (error) {
    try {
      fs.closeSync(fd);
    } catch {
      /* already closed */
    }
    fs.rmSync(temporary, { force: true });
    throw error;
  }
}
