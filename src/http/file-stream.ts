/**
 * Streams a file as a response body with uWS backpressure: read a chunk, `tryEnd` it, and
 * when the socket buffer is full pause the file until uWS says the socket is writable
 * again, resending only the part it did not take. Used for snapshot downloads, which can
 * be hundreds of megabytes and must neither sit in memory nor stall the event loop.
 */
import fs from 'node:fs';
import type { Exchange, Headers } from './exchange.js';

const CHUNK_BYTES = 256 * 1024;

/** Sends `file` (of `size` bytes) with status 200; a read error closes the connection. */
export function streamFile(ex: Exchange, file: string, size: number, headers: Headers): void {
  if (ex.aborted || ex.done) return;
  ex.armAbort();
  ex.done = true;
  const res = ex.res;
  const stream = fs.createReadStream(file, { highWaterMark: CHUNK_BYTES });
  const finish = (): void => {
    stream.destroy();
  };
  ex.onAbort = finish;
  res.cork(() => {
    res.writeStatus('200 OK');
    for (const [name, value] of headers) res.writeHeader(name, value);
    if (size === 0) res.end();
  });
  ex.streamStarted(200);
  if (size === 0) return finish();
  stream.on('data', (data) => {
    const chunk = data as Buffer;
    if (ex.aborted) return finish();
    const offset = res.getWriteOffset();
    let ok = false;
    let done = false;
    res.cork(() => {
      [ok, done] = res.tryEnd(chunk, size);
    });
    if (done) return finish();
    if (ok) return;
    stream.pause();
    res.onWritable((writable) => {
      if (ex.aborted) return true;
      const [sent, ended] = res.tryEnd(chunk.subarray(writable - offset), size);
      if (ended) finish();
      else if (sent) stream.resume();
      return sent;
    });
  });
  stream.on('error', () => {
    // Headers are gone already: the only honest signal left is a cut connection.
    if (!ex.aborted) res.close();
  });
}
