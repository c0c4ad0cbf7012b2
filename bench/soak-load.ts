/**
 * The soak's load: wrk (one thread) sending durable consumes over LOAD_CUSTOMERS customers
 * (or `customers`) in turn from a generated Lua script, each with a new idempotency key or
 * none, flat out or paced at a rate, at a lower priority than the server (see
 * DEFAULT_LOAD_NICE). Shared by `bench:soak` and `bench:keyed`.
 *
 * Every request carries an id of its own, `<run>-<n>`: a keyed one as its idempotency key,
 * an unkeyed one in a header Tally does not read (LOAD_REQUEST_HEADER). wrk shares the
 * server's cores, and building a request unlike any before costs it more CPU than reusing
 * one of the 10,000 it has built (LuaJIT interns every string: ~0.4 µs a request measured
 * here); with an id in both, wrk does the same work for either load, so what tells keyed
 * and unkeyed runs apart is the server's work. The summary says what wrk's CPU was
 * (`loadCpuUsPerRequest`).
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TallyServer } from './tally-server.js';
import { wrkOutput, wrkSummaryOf } from './wrk.js';

/** The customers the load's consumes go to in turn, unless its options say otherwise. */
export const LOAD_CUSTOMERS = 10_000;
/** The header that carries an unkeyed request's id (Tally reads no such header). */
export const LOAD_REQUEST_HEADER = 'x-load-request';
/**
 * wrk's niceness unless `--load-nice` says otherwise. The clients of a real deployment run
 * on machines of their own; a load generator sharing the server's cores at the same
 * priority takes a core from the thread a request is waiting for.
 */
export const DEFAULT_LOAD_NICE = 10;

/** The Tally this load runs against has no rate limits: the load is one client. */
export const LOAD_TALLY_ENV: Readonly<Record<string, string>> = {
  TALLY_RATE_LIMIT_SERVER: '0',
  TALLY_RATE_LIMIT_CLIENT: '0',
  TALLY_RATE_LIMIT_CLIENT_ADDRESS: '0',
  TALLY_RATE_LIMIT_CLIENT_CUSTOMER: '0',
};

export interface LoadOptions {
  readonly connections: number;
  /** Consumes per second to aim at (null: flat out). */
  readonly rate: number | null;
  /** `unique`: every consume carries a new idempotency key; `none`: no key. */
  readonly keys: 'unique' | 'none';
  /** The niceness wrk runs at (0: the caller's own). */
  readonly loadNice: number;
  /** The customers the consumes go to in turn (LOAD_CUSTOMERS when absent). */
  readonly customers?: number;
}

/** What wrk reports of one run of the load. */
export interface LoadSummary {
  readonly requests: number;
  readonly errors: number;
  readonly non2xx: number;
  readonly msP99: number;
  readonly perSec: number;
  /** wrk's own CPU (user and system, all its threads) per request, in µs. */
  readonly loadCpuUsPerRequest: number;
}

/** The admin key a fresh data dir's bootstrap wrote (it reads the metrics). */
export async function adminKeyOf(server: TallyServer): Promise<string> {
  const raw = await readFile(join(server.dataDir, 'bootstrap-keys.json'), 'utf8');
  return (JSON.parse(raw) as { admin: string }).admin;
}

/** The server's metrics, as text. */
export async function scrape(server: TallyServer, adminKey: string): Promise<string> {
  const response = await fetch(`${server.baseUrl}/v1/admin/metrics`, {
    headers: { 'x-tally-key': adminKey },
  });
  return response.text();
}

export function keysOption(raw: string | undefined): LoadOptions['keys'] {
  if (raw === undefined || raw === 'unique' || raw === 'none') return raw ?? 'unique';
  throw new Error(`--keys must be unique or none, got ${JSON.stringify(raw)}`);
}

export function niceOption(raw: string | undefined): number {
  if (raw === undefined) return DEFAULT_LOAD_NICE;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0 || value > 19)
    throw new Error(`--load-nice must be an integer from 0 to 19, got ${JSON.stringify(raw)}`);
  return value;
}

/** How far behind its schedule the paced load catches up, in ms of slots. */
const CATCH_UP_MS = 100;

/**
 * wrk's pacing at `rate` requests a second: one schedule for all of the thread's
 * connections, a slot every 1/rate s. Each request takes the next free slot and waits for
 * it (wrk's `delay`, in whole ms, called before a connection sends its next request).
 * Slots that passed while every connection waited for an answer are sent at once, up to
 * CATCH_UP_MS of them: a moment's slower answers do not lower the rate, and a server that
 * falls further behind is not sent a long burst (it is sent what it keeps up with). The
 * clock is the monotonic one, read through LuaJIT's FFI (wrk's Lua has no clock finer
 * than 1 s).
 * A fixed wait per connection instead (connections / rate) adds each answer's latency to
 * the spacing: asked for 20,000/s over 128 connections, it sent ~13,000.
 */
function pacingScript(rate: number): string {
  return `ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } tally_soak_timespec;
int clock_gettime(int clock_id, tally_soak_timespec *tp);
]]
local now = ffi.new("tally_soak_timespec")
local function nowMs()
  ffi.C.clock_gettime(1, now)
  return tonumber(now.tv_sec) * 1000 + tonumber(now.tv_nsec) / 1e6
end
local slotMs = 0
local intervalMs = ${1000 / rate}
delay = function()
  local at = nowMs()
  if slotMs < at - ${CATCH_UP_MS} then slotMs = at - ${CATCH_UP_MS} end
  local wait = slotMs - at
  slotMs = slotMs + intervalMs
  if wait <= 0 then return 0 end
  return math.floor(wait + 0.5)
end
`;
}

/**
 * wrk's Lua: customers in turn, an id for each request (a keyed one's idempotency key, else
 * LOAD_REQUEST_HEADER), optional pacing; prints a JSON summary at the end, with wrk's CPU
 * (`getrusage` through LuaJIT's FFI: the whole process, every thread).
 */
function loadScript(key: string, rate: number | null, keyed: boolean, customers: number): string {
  const request = keyed
    ? `local body = '{"customerId":"soak-' .. (i % ${customers}) .. ` +
      `'","amount":1,"idempotencyKey":"' .. id .. '"}'`
    : `headers["${LOAD_REQUEST_HEADER}"] = id
  local body = '{"customerId":"soak-' .. (i % ${customers}) .. '","amount":1}'`;
  return `local ffi = require("ffi")
ffi.cdef[[
typedef struct { long sec; long usec; } tally_soak_timeval;
typedef struct {
  tally_soak_timeval user;
  tally_soak_timeval system;
  long rest[14];
} tally_soak_rusage;
int getrusage(int who, tally_soak_rusage *usage);
]]
local run = "${Date.now().toString(36)}"
local i = 0
local headers = { ["x-tally-key"] = "${key}", ["content-type"] = "application/json" }
request = function()
  i = i + 1
  local id = run .. '-' .. i
  ${request}
  return wrk.format("POST", "/v1/usage/api_calls/consume", headers, body)
end
${rate === null ? '' : pacingScript(rate)}done = function(summary, latency, requests)
  local usage = ffi.new("tally_soak_rusage")
  ffi.C.getrusage(0, usage)
  local cpuUs = tonumber(usage.user.sec + usage.system.sec) * 1e6 +
    tonumber(usage.user.usec + usage.system.usec)
  io.write("WRK_JSON{\\"requests\\":" .. summary.requests ..
    ",\\"durationUs\\":" .. summary.duration ..
    ",\\"status\\":" .. summary.errors.status ..
    ",\\"errors\\":" .. (summary.errors.connect + summary.errors.read +
      summary.errors.write + summary.errors.timeout) ..
    ",\\"p99Us\\":" .. latency:percentile(99) ..
    ",\\"cpuUs\\":" .. cpuUs .. "}\\n")
end
`;
}

/** What the load needs of the server it runs against: its address and a server key. */
export type LoadTarget = Pick<TallyServer, 'baseUrl'> & {
  readonly keys: { readonly server: string };
};

/** Runs the load against `server` for `seconds`: wrk's own summary. */
export async function runLoad(
  server: LoadTarget,
  options: LoadOptions,
  seconds: number,
): Promise<LoadSummary> {
  const dir = await mkdtemp(join(tmpdir(), 'tally-soak-'));
  try {
    const file = join(dir, 'soak.lua');
    const customers = options.customers ?? LOAD_CUSTOMERS;
    const keyed = options.keys === 'unique';
    await writeFile(file, loadScript(server.keys.server, options.rate, keyed, customers));
    const args = [
      '-t1',
      `-c${options.connections}`,
      `-d${Math.round(seconds)}s`,
      '--timeout',
      '10s',
      '-s',
      file,
      server.baseUrl,
    ];
    const [command, commandArgs] =
      options.loadNice === 0
        ? ['wrk', args]
        : ['nice', ['-n', String(options.loadNice), 'wrk', ...args]];
    const s = wrkSummaryOf(await wrkOutput(command, commandArgs)) as {
      requests: number;
      durationUs: number;
      status: number;
      errors: number;
      p99Us: number;
      cpuUs: number;
    };
    return {
      requests: s.requests,
      errors: s.errors,
      non2xx: s.status,
      msP99: s.p99Us / 1000,
      perSec: s.requests / (s.durationUs / 1e6),
      loadCpuUsPerRequest: s.requests === 0 ? 0 : s.cpuUs / s.requests,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
