/**
 * A real Better Auth application for the plugin's tests: a SQLite file database
 * (better-sqlite3), Better Auth's own migrations, and its handler served over HTTP on
 * port 0, with the Tally plugin imported through the package's `exports`
 * (`tally/better-auth`, the compiled output) exactly as an application imports it.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { type BetterAuthOptions, betterAuth } from 'better-auth';
import { getMigrations } from 'better-auth/db/migration';
import { toNodeHandler } from 'better-auth/node';
import Database from 'better-sqlite3';
import { tempDataDir } from './server-process.js';

/** A secret of the length Better Auth asks for; tests only. */
const SECRET = 'tally-plugin-tests-secret-0123456789abcdef';

export interface AuthApp<A> {
  readonly auth: A;
  /** The application's origin, e.g. `http://127.0.0.1:40123`. */
  readonly origin: string;
  readonly dbFile: string;
  close(): Promise<void>;
}

export function tempDbFile(): string {
  return path.join(tempDataDir('better-auth'), 'auth.sqlite');
}

/**
 * Starts one application instance on `dbFile` (a fresh file unless given, so two
 * instances can share one) and runs the migrations its plugins need. `baseURL` is the
 * instance's own address unless given (instances behind one public address share one).
 */
export async function startAuthApp<O extends Omit<BetterAuthOptions, 'database' | 'baseURL'>>(
  options: O,
  dbFile: string = tempDbFile(),
  baseURL?: string,
) {
  let handler: http.RequestListener = (_req, res) => res.writeHead(503).end();
  const server = http.createServer((req, res) => handler(req, res));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const database = new Database(dbFile);
  const auth = betterAuth({
    logger: { disabled: true },
    telemetry: { enabled: false },
    ...options,
    // Typed as the option, not the driver: the driver's type is not needed by the tests.
    database: database as BetterAuthOptions['database'],
    baseURL: baseURL ?? origin,
    secret: SECRET,
  });
  const { runMigrations } = await getMigrations(auth.options);
  await runMigrations();
  handler = toNodeHandler(auth) as http.RequestListener;
  return {
    auth,
    origin,
    dbFile,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      database.close();
    },
  } satisfies AuthApp<typeof auth>;
}

/** The `cookie` request header that carries the session of a `Set-Cookie` answer. */
export function cookieOf(headers: Headers): string {
  return headers
    .getSetCookie()
    .map((line) => line.split(';')[0])
    .join('; ');
}

let users = 0;

/** A fresh e-mail address for a sign-up. */
export function freshEmail(label = 'user'): string {
  users += 1;
  return `${label}-${process.pid}-${users}@example.com`;
}
