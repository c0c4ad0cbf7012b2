/**
 * The soak's latency probe: one GET every 20 ms over one kept-alive connection per
 * target, timed from the write of the request to the last byte of its reply.
 *
 * Why it is not `fetch`: the probe's figure is meant to be the server's, yet `fetch`
 * (undici) in the soak's own event loop added 3–4 ms at p99 here (its own work, the
 * soak's scrapes and GC pauses between the timestamps). This client writes a request as
 * one string and reads a reply with `content-length` (uWebSockets.js always sends one),
 * and it runs in a worker thread of its own (`startProbes`), so nothing else the soak
 * does sits between its timestamps.
 *
 * Why two targets: on a machine shared with the load generator, part of any tail is the
 * machine's (a thread waiting for a core). The soak probes Tally and a bare uWebSockets.js
 * server (bench/bare-server.ts, idle) side by side, 10 ms apart, so a report shows how
 * much of Tally's tail the machine alone gives a server that does nothing.
 *
 * What it does not do: pipelining, chunked replies, redirects. A reply it cannot read, a
 * status other than 2xx or a closed connection counts as a failure, and the next probe
 * opens a new connection.
 */
import net from 'node:net';
import { Worker } from 'node:worker_threads';

export const PROBE_INTERVAL_MS = 20;
/** A reply slower than this counts as a failure (and the connection is opened anew). */
const PROBE_TIMEOUT_MS = 10_000;
/** Probes cycle over this many customers, so the server sees the same few again. */
const PROBE_CYCLE = 100;

export interface ProbeTarget {
  readonly port: number;
  /** Path and query of the GET; `{n}` becomes the probe's number modulo PROBE_CYCLE. */
  readonly path: string;
  readonly headers: Readonly<Record<string, string>>;
}

/** One target's probes since the last `window()`. */
export interface ProbeWindow {
  readonly count: number;
  readonly failures: number;
  readonly msP99: number;
  readonly msP999: number;
  readonly msMax: number;
  /** Every answered probe's latency (ms), for a quantile over many windows. */
  readonly latenciesMs: readonly number[];
}

/**
 * Reads one HTTP/1.1 reply at a time from a byte stream: `push` returns the status of the
 * reply once its headers and `content-length` bytes of body are in, else null (more
 * bytes needed). Throws on a reply it cannot read (no status line, no content length).
 */
export class ReplyReader {
  #pending = '';

  push(chunk: string): number | null {
    this.#pending += chunk;
    const headEnd = this.#pending.indexOf('\r\n\r\n');
    if (headEnd === -1) return null;
    const head = this.#pending.slice(0, headEnd);
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(head);
    const length = /\r\ncontent-length: *(\d+)/i.exec(head);
    if (status === null || length === null)
      throw new Error(`unreadable reply: ${JSON.stringify(head.slice(0, 80))}`);
    const end = headEnd + 4 + Number(length[1]);
    if (this.#pending.length < end) return null;
    this.#pending = this.#pending.slice(end);
    return Number(status[1]);
  }
}

/**
 * The value at quantile `q` (in [0, 1]) of `values`: the smallest with at least that share
 * of them at or below it; NaN for none.
 */
export function quantileOf(values: readonly number[], q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)] as number;
}

/** Probes one target in this thread, a request at a time; `window()` reads and resets. */
export class Probe {
  #latencies: number[] = [];
  #failures = 0;
  #socket: net.Socket | null = null;
  #reader = new ReplyReader();
  #waiting: ((status: number | null) => void) | null = null;
  #n = 0;

  constructor(private readonly target: ProbeTarget) {}

  /** Sends one request and records its latency, or a failure; never throws. */
  async once(): Promise<void> {
    const request = this.#request();
    const socket = this.#connected();
    const started = performance.now();
    const status = await new Promise<number | null>((resolve) => {
      const timer = setTimeout(() => resolve(null), PROBE_TIMEOUT_MS);
      this.#waiting = (answer) => {
        clearTimeout(timer);
        resolve(answer);
      };
      socket.write(request);
    });
    this.#waiting = null;
    if (status !== null && status >= 200 && status < 300)
      this.#latencies.push(performance.now() - started);
    else {
      this.#failures++;
      this.#drop();
    }
  }

  window(): ProbeWindow {
    const latencies = this.#latencies;
    const taken = {
      count: latencies.length,
      failures: this.#failures,
      msP99: quantileOf(latencies, 0.99),
      msP999: quantileOf(latencies, 0.999),
      msMax: latencies.reduce((max, ms) => Math.max(max, ms), 0),
      latenciesMs: latencies,
    };
    this.#latencies = [];
    this.#failures = 0;
    return taken;
  }

  close(): void {
    this.#drop();
  }

  #request(): string {
    const path = this.target.path.replaceAll('{n}', String(this.#n++ % PROBE_CYCLE));
    const headers = Object.entries(this.target.headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    return `GET ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\n${headers}\r\n`;
  }

  #connected(): net.Socket {
    if (this.#socket !== null) return this.#socket;
    const socket = net.connect({ port: this.target.port, host: '127.0.0.1', noDelay: true });
    socket.setEncoding('latin1');
    const settle = (status: number | null): void => {
      const waiting = this.#waiting;
      this.#waiting = null;
      waiting?.(status);
    };
    socket.on('data', (chunk: string) => {
      try {
        const status = this.#reader.push(chunk);
        if (status !== null) settle(status);
      } catch {
        settle(null);
      }
    });
    socket.on('error', () => settle(null));
    socket.on('close', () => {
      if (this.#socket === socket) this.#socket = null;
      settle(null);
    });
    this.#reader = new ReplyReader();
    this.#socket = socket;
    return socket;
  }

  #drop(): void {
    this.#socket?.destroy();
    this.#socket = null;
  }
}

/** Messages between `startProbes` and its thread. */
type ToProbeThread = { readonly kind: 'window' } | { readonly kind: 'stop' };
type FromProbeThread = { readonly kind: 'window'; readonly windows: ProbeWindow[] };

export interface RunningProbes {
  /** Each target's probes since the last call, in the order of the targets. */
  window(): Promise<ProbeWindow[]>;
  stop(): Promise<void>;
}

/**
 * Probes every target every PROBE_INTERVAL_MS from a worker thread of its own, the
 * targets spread evenly over the interval. Rejects `window` if the thread has died.
 */
export function startProbes(targets: readonly ProbeTarget[]): RunningProbes {
  const worker = new Worker(new URL('./probe-thread.js', import.meta.url), {
    workerData: { targets },
  });
  let failed: Error | null = null;
  worker.on('error', (error) => {
    failed = error;
  });
  return {
    window: () =>
      new Promise<ProbeWindow[]>((resolve, reject) => {
        if (failed !== null) return reject(failed);
        worker.once('message', (message: FromProbeThread) => resolve(message.windows));
        worker.postMessage({ kind: 'window' } satisfies ToProbeThread);
      }),
    stop: async () => {
      worker.postMessage({ kind: 'stop' } satisfies ToProbeThread);
      await new Promise((resolve) => worker.once('exit', resolve));
    },
  };
}

/** The thread's side (probe-thread.ts): probes until told to stop. */
export function runProbeThread(
  targets: readonly ProbeTarget[],
  port: { on(event: 'message', f: (m: ToProbeThread) => void): void },
  post: (message: FromProbeThread) => void,
): Promise<void> {
  const probes = targets.map((target) => new Probe(target));
  let running = true;
  port.on('message', (message) => {
    if (message.kind === 'stop') running = false;
    else post({ kind: 'window', windows: probes.map((probe) => probe.window()) });
  });
  const spacingMs = PROBE_INTERVAL_MS / Math.max(1, probes.length);
  const loops = probes.map(async (probe, i) => {
    await sleep(i * spacingMs);
    while (running) {
      const started = performance.now();
      await probe.once();
      await sleep(Math.max(0, PROBE_INTERVAL_MS - (performance.now() - started)));
    }
    probe.close();
  });
  return Promise.all(loops).then(() => undefined);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
