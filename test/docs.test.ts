/**
 * The documentation keeps up with the code: docs/api.md names every route the server
 * serves (as `METHOD /path`, path parameters written `{name}`) and every error code of
 * the catalog in its error table; README.md stays short; and no document narrates the
 * project's development history.
 *
 * Routes come from the routers themselves (`Router.list()`; building a router calls no
 * handler, so empty deps do) plus the routes src/server.ts wires by hand: the fixed ones
 * its dispatcher answers before any router (`url === '/healthz'`) and the entries it
 * hands to the operator router (`['GET', '/v1/admin/metrics', …]`).
 */
import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { buildAdminRouter, type AdminDeps } from '../src/api/admin-routes.js';
import { buildApiRouter, type ApiDeps } from '../src/api/routes.js';
import { STRIPE_WEBHOOK_PATH } from '../src/commerce/processor.js';
import { snapshotRoutes } from '../src/api/snapshot-routes.js';
import { webhookAdminRoutes, type WebhookDeps } from '../src/api/webhook-routes.js';
import { RELAY_PATH } from '../src/webhooks/relay.js';
import { ERRORS } from '../src/errors.js';
import type { Snapshots } from '../src/snapshots.js';

const read = (relative: string): string =>
  fs.readFileSync(new URL(`../${relative}`, import.meta.url), 'utf8');

const apiDoc = read('docs/api.md');
const serverSource = read('src/server.ts');

/** `:name` segments as the docs write them: `{name}`. */
const docPath = (pattern: string): string => pattern.replace(/:(\w+)/g, '{$1}');

/** Routes src/server.ts serves without a router of its own. */
function serverWiredRoutes(): string[] {
  const routes: string[] = [];
  // Fixed routes of the dispatcher: `url === '/healthz'` and `url === '/v1/schema/billing'`
  // (GET only; another method answers 405).
  for (const match of serverSource.matchAll(/url === '(\/[^']*)'(?: && method === '([A-Z]+)')?/g)) {
    routes.push(`${match[2] ?? 'GET'} ${match[1]}`);
  }
  // Entries passed to a router as `['METHOD', '/path', route]` tuples.
  for (const match of serverSource.matchAll(/\[\s*'(GET|POST|PUT|PATCH|DELETE)',\s*'(\/[^']*)'/g)) {
    routes.push(`${match[1]} ${docPath(match[2] as string)}`);
  }
  return routes;
}

/**
 * The processor's webhook receiver, which src/server.ts answers before any key (the commerce routes
 * are records of the API table), and the dev relay's WebSocket, which uWS routes itself.
 */
function commerceWiredRoutes(): string[] {
  return [`POST ${STRIPE_WEBHOOK_PATH}`, `GET ${RELAY_PATH}`];
}

function servedRoutes(): string[] {
  const api = buildApiRouter({} as ApiDeps).list();
  const admin = buildAdminRouter({} as AdminDeps, [
    ...snapshotRoutes({} as AdminDeps, {} as Snapshots),
    ...webhookAdminRoutes({} as WebhookDeps),
  ]).list();
  return [
    ...new Set([
      ...serverWiredRoutes(),
      ...commerceWiredRoutes(),
      ...[...api, ...admin].map(({ method, pattern }) => `${method} ${docPath(pattern)}`),
    ]),
  ];
}

/**
 * Whether `text` names `route` as a whole: `GET /v1/audit` inside `GET /v1/audit/verify`
 * does not count.
 */
function mentions(text: string, route: string): boolean {
  const escaped = route.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`(?<![A-Za-z])${escaped}(?![\\w/{}.-])`).test(text);
}

/** Every Markdown file a user reads: README.md and docs/*.md. */
function documents(): Array<{ readonly name: string; readonly text: string }> {
  const docs = fs
    .readdirSync(new URL('../docs/', import.meta.url))
    .filter((name) => name.endsWith('.md'));
  return [
    { name: 'README.md', text: read('README.md') },
    ...docs.map((name) => ({ name: `docs/${name}`, text: read(`docs/${name}`) })),
  ];
}

/**
 * The anchors of a Markdown document's headings as GitHub makes them: lower case, every
 * character but letters, digits, spaces, hyphens and underscores dropped, spaces made
 * hyphens, and `-1`, `-2`, … after a repeated one. Headings inside code fences are not.
 */
function headingAnchors(text: string): Set<string> {
  const anchors = new Set<string>();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const heading = fenced ? null : /^#{1,6} (.*)$/.exec(line);
    if (heading === null) continue;
    const base = (heading[1] as string)
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N} _-]/gu, '')
      .replace(/ /g, '-');
    let anchor = base;
    for (let n = 1; anchors.has(anchor); n++) anchor = `${base}-${n}`;
    anchors.add(anchor);
  }
  return anchors;
}

describe('links between the documents', () => {
  it('every relative link names a file that exists, and a heading of it that exists', () => {
    const broken: string[] = [];
    for (const { name, text } of documents()) {
      const dir = name.includes('/') ? name.slice(0, name.lastIndexOf('/') + 1) : '';
      for (const match of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = match[1] as string;
        if (/^[a-z]+:/i.test(target)) continue; // https:, mailto:
        const [file = '', anchor] = target.split('#');
        const path = file === '' ? name : new URL(file, `file:///${dir}`).pathname.slice(1);
        if (!fs.existsSync(new URL(`../${path}`, import.meta.url))) {
          broken.push(`${name}: ${target} (no file ${path})`);
          continue;
        }
        if (anchor === undefined || !path.endsWith('.md')) continue;
        if (!headingAnchors(read(path)).has(anchor))
          broken.push(`${name}: ${target} (no heading #${anchor} in ${path})`);
      }
    }
    expect(broken).toEqual([]);
  });
});

describe('docs/api.md', () => {
  it('finds the routes src/server.ts wires by hand', () => {
    // If these are no longer found, the patterns above need updating, not the docs.
    expect(serverWiredRoutes().sort()).toEqual([
      'GET /healthz',
      'GET /v1/admin/metrics',
      'GET /v1/schema/billing',
    ]);
  });

  it('names every route the server serves', () => {
    const routes = servedRoutes();
    expect(routes.length).toBeGreaterThan(30);
    const missing = routes.filter((route) => !mentions(apiDoc, route));
    expect(missing, 'routes missing from docs/api.md').toEqual([]);
  });

  it('lists every error code of the catalog in its error table', () => {
    const table = new Set<string>();
    for (const line of apiDoc.split('\n')) {
      const match = /^\| `([a-z_]+)` \| (\d{3}) \|/.exec(line);
      if (match) table.add(match[1] as string);
    }
    const missing = Object.keys(ERRORS).filter((code) => !table.has(code));
    expect(missing, 'error codes missing from the docs/api.md error table').toEqual([]);
  });
});

describe('README.md and docs/', () => {
  it('README.md is under 300 lines', () => {
    expect(read('README.md').split('\n').length).toBeLessThan(300);
  });

  it('no document narrates development sessions', () => {
    const offending = documents().flatMap(({ name, text }) =>
      text
        .split('\n')
        .flatMap((line, index) =>
          /\bsessions? [0-9]+/i.test(line) ? [`${name}:${index + 1}: ${line}`] : [],
        ),
    );
    expect(offending).toEqual([]);
  });
});
