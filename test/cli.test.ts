/**
 * The `tally` CLI as a user runs it: the real binary (`node bin/tally.js`, and once
 * `npx tally`) as a child process against a real server process. Push (diff, --yes,
 * refusal without a terminal, local validation that sends nothing), pull round trips,
 * the key lifecycle, operator key rotation, environment keys refused on operator
 * commands, status, --help on every command and the usage exit code.
 *
 * Tests run in file order against one server; each says which environment it changes.
 * The push flow owns the test environment's configuration, the round trip the live one.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildProgram } from '../src/cli/main.js';
import { runProcess, type Ran } from './support/run-process.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'bin', 'tally.js');

let server: ServerProcess;
/** The operator key; the rotation test replaces it. */
let adminKey: string;
let tmp: string;

beforeAll(async () => {
  server = await startServerProcess();
  adminKey = server.keys.admin;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tally-cli-'));
});

afterAll(async () => {
  await server?.stop();
  if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
});

/**
 * Runs `tally args…` with TALLY_URL pointing at the test server and no TALLY_API_KEY
 * unless given; stdin is /dev/null (not a terminal), so nothing can wait on a prompt.
 */
function tally(
  args: readonly string[],
  options: {
    key?: string;
    env?: Record<string, string>;
    command?: readonly string[];
    bin?: string;
  } = {},
): Promise<Ran> {
  const env: Record<string, string | undefined> = {
    ...process.env,
    TALLY_URL: server.base,
    ...options.env,
  };
  delete env.TALLY_API_KEY;
  if (options.key !== undefined) env.TALLY_API_KEY = options.key;
  const [command, ...prefix] = options.command ?? [process.execPath, options.bin ?? BIN];
  return runProcess(command ?? process.execPath, [...prefix, ...args], { cwd: ROOT, env });
}

function writeJson(name: string, value: unknown): string {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, JSON.stringify(value, null, 2));
  return file;
}

const CONFIG_V1 = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit', name: 'Seats' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: { sso: true, seats: { included: 5 }, api_calls: { included: 1000 } },
    },
  },
};

const CONFIG_V2 = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit', name: 'Seat count' },
    storage: { type: 'meter', reset: 'never' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: { sso: false, seats: { included: 3 }, storage: { included: 10 } },
    },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { sso: true, seats: { included: 10 } },
    },
  },
};

function findCommand(program: Command, names: readonly string[]): Command {
  let command = program;
  for (const name of names) {
    const sub = command.commands.find((c) => c.name() === name);
    if (sub === undefined) throw new Error(`no command ${names.join(' ')}`);
    command = sub;
  }
  return command;
}

/** Every command path of the program: [], ['push'], ['keys', 'create'], … */
function commandPaths(command: Command, prefix: readonly string[] = []): string[][] {
  return [
    [...prefix],
    ...command.commands.flatMap((sub) => commandPaths(sub, [...prefix, sub.name()])),
  ];
}

describe('the binary', () => {
  it("answers --help on every command with exit 0 and that command's usage", async () => {
    const paths = commandPaths(buildProgram());
    expect(paths.map((p) => p.join(' '))).toEqual(
      expect.arrayContaining([
        'push',
        'pull',
        'keys create',
        'keys list',
        'keys revoke',
        'keys rotate-admin',
        'keys rotate-token-secret',
        'snapshot create',
        'snapshot list',
        'snapshot download',
        'snapshot delete',
        'snapshot restore',
        'status',
      ]),
    );
    const runs = await Promise.all(paths.map((p) => tally([...p, '--help'])));
    runs.forEach((ran, index) => {
      const name = ['tally', ...(paths[index] ?? [])].join(' ');
      expect(ran.code, name).toBe(0);
      expect(ran.stdout, name).toContain(`Usage: ${name} `);
      expect(ran.stderr, name).toBe('');
    });
    // Every command that calls the service documents where its URL and key come from
    // (`snapshot restore` works on files offline and calls no service).
    const program = buildProgram();
    const offline = ['snapshot restore'];
    const leaves = paths.filter(
      (p) =>
        p.length > 0 &&
        findCommand(program, p).commands.length === 0 &&
        !offline.includes(p.join(' ')),
    );
    expect(leaves.length).toBe(
      paths.filter((p) => p.length > 0 && findCommand(program, p).commands.length === 0).length -
        offline.length,
    );
    for (const p of leaves) {
      const help = runs[paths.indexOf(p)]?.stdout ?? '';
      expect(help, p.join(' ')).toMatch(/--url <url>[\s\S]*env: TALLY_URL/);
      expect(help, p.join(' ')).toMatch(/--key <key>[\s\S]*env:\s+TALLY_API_KEY/);
    }
  });

  it('runs as `npx tally` from the project (package.json bin)', async () => {
    const ran = await tally(['--help'], { command: ['npx', 'tally'] });
    expect(ran.code, ran.stderr).toBe(0);
    expect(ran.stdout).toContain('Usage: tally [options] [command]');
    expect(ran.stdout).toContain('status [options]');
  });

  it('says to build first, without a stack trace, when dist is missing', async () => {
    const bin = path.join(tmp, 'unbuilt', 'bin', 'tally.js');
    fs.mkdirSync(path.dirname(bin), { recursive: true });
    fs.copyFileSync(BIN, bin);
    const ran = await tally(['--help'], { bin });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toContain('run `npm run build` first');
    expect(ran.stderr).not.toContain('    at ');
  });

  it.each([
    [['frobnicate'], /unknown command 'frobnicate'/],
    [['push'], /missing required argument 'config.json'/],
    [
      ['keys', 'create', '--env', 'prod', '--class', 'server'],
      /argument 'prod' is invalid\. Allowed choices are test, live/,
    ],
    [
      ['keys', 'create', '--class', 'server'],
      /required option '--env <environment>' not specified/,
    ],
    [['status', '--bogus'], /unknown option '--bogus'/],
    [['keys'], /Usage: tally keys/],
    [['pull', '--url', 'ftp://example.com'], /must be http:\/\/ or https:\/\//],
    [['pull'], /no API key: set TALLY_API_KEY or pass --key/],
  ])('exits 2 on the usage error %j', async (args, message) => {
    const ran = await tally(args);
    expect(ran.code).toBe(2);
    expect(ran.stderr).toMatch(message);
  });

  it.each([
    [['snapshto'], 'snapshto', 'snapshot'],
    [['snapshto', '--help'], 'snapshto', 'snapshot'],
    [['keys', 'revok', '--help'], 'revok', 'revoke'],
    [['-h', 'statsu'], 'statsu', 'status'],
  ])(
    'exits 2 on an unknown command %j, even with --help, suggesting the close one',
    async (args, unknown, close) => {
      const ran = await tally(args);
      expect(ran.code).toBe(2);
      expect(ran.stdout).toBe('');
      expect(ran.stderr).toBe(
        `error: unknown command '${unknown}'\n(Did you mean ${close}?)\n(run with --help ` +
          `for usage)\n`,
      );
    },
  );

  it('suggests nothing when no command is close', async () => {
    const ran = await tally(['frobnicate', '--help']);
    expect(ran.code).toBe(2);
    expect(ran.stderr).toBe(`error: unknown command 'frobnicate'\n(run with --help for usage)\n`);
  });
});

describe('push and pull', () => {
  it(
    'shows the diff, refuses without --yes off a terminal, pushes with --yes, then shows ' +
      'changed and removed items',
    async () => {
      const key = server.keys.test.server;
      const v1 = writeJson('v1.json', CONFIG_V1);

      // Nothing deployed: even an empty document is a change (it would create version 1).
      const empty = await tally(
        ['push', writeJson('empty.json', { entitlements: {}, products: {} }), '--dry-run'],
        { key },
      );
      expect(empty.code, empty.stderr).toBe(0);
      expect(empty.stdout).toContain(
        'An empty configuration: no entitlements, no products.\nDry run: nothing pushed.',
      );

      const refused = await tally(['push', v1], { key });
      expect(refused.code).toBe(2);
      expect(refused.stdout).toContain('Nothing is deployed to the test environment');
      expect(refused.stderr).toContain('pass --yes');
      expect((await call(server.base, 'GET', '/v1/sync/pull', { key })).status).toBe(404);

      const first = await tally(['push', v1, '--yes'], { key });
      expect(first.code, first.stderr).toBe(0);
      // Piped, no progress line: stderr stays empty.
      expect(first.stderr).toBe('');
      expect(first.stdout).toContain('Entitlements: 3 added, 0 removed, 0 changed');
      expect(first.stdout).toMatch(/^ {2}\+ sso \(feature\)$/m);
      expect(first.stdout).toMatch(/^ {2}\+ api_calls \(meter\)$/m);
      expect(first.stdout).toMatch(/^ {2}\+ free \(Free\)$/m);
      expect(first.stdout).toContain('Pushed version 1 ');
      const deployed = await call(server.base, 'GET', '/v1/sync/pull', { key });
      expect(deployed.body).toMatchObject({ version: 1, config: CONFIG_V1 });

      const second = await tally(['push', writeJson('v2.json', CONFIG_V2), '-y'], { key });
      expect(second.code, second.stderr).toBe(0);
      const lines = second.stdout.split('\n');
      expect(lines[0]).toMatch(/^Deployed to the test environment at .*: version 1 /);
      expect(lines).toEqual(
        expect.arrayContaining([
          'Entitlements: 1 added, 1 removed, 1 changed',
          '  + storage (meter)',
          '  - api_calls (meter)',
          '  ~ seats',
          '      name: "Seats" → "Seat count"',
          'Products: 1 added, 0 removed, 1 changed',
          '  + pro (Pro)',
          '  ~ free',
          '      entitlements.sso: true → false',
          '      entitlements.seats.included: 5 → 3',
          '      entitlements.storage: (absent) → {"included":10}',
          '      entitlements.api_calls: {"included":1000} → (absent)',
        ]),
      );
      expect(second.stdout).toContain('Pushed version 2 ');
      expect((await call(server.base, 'GET', '/v1/sync/pull', { key })).body).toMatchObject({
        version: 2,
        config: CONFIG_V2,
      });

      const dry = await tally(['push', v1, '--dry-run'], { key });
      expect(dry.code).toBe(0);
      expect(dry.stdout).toContain('  - pro (Pro)');
      expect(dry.stdout).toContain('Dry run: nothing pushed.');
      expect((await call(server.base, 'GET', '/v1/sync/pull', { key })).body.version).toBe(2);
    },
  );

  it('refuses an invalid file locally, listing every violation, and sends nothing', async () => {
    const key = server.keys.live.server;
    const before = await call(server.base, 'GET', '/v1/sync/pull', { key });
    const bad = writeJson('bad.json', {
      entitlements: { sso: { type: 'feture' }, seats: { type: 'limit', reset: 'day' } },
      products: {
        free: { name: 'Free', default: true, prise: 3, entitlements: { nope: true, seats: true } },
      },
    });
    const ran = await tally(['push', bad, '--yes'], { key });
    expect(ran.code).toBe(1);
    expect(ran.stdout).toBe('');
    expect(ran.stderr).toContain(
      'is not a valid billing configuration (5 violations); nothing was pushed',
    );
    for (const violation of [
      'entitlements.sso.type must be one of feature, limit, meter',
      'products.free has unknown property "prise"',
      'entitlements.seats.reset is only allowed on a meter; "seats" is a limit',
      'products.free.entitlements.nope is not a defined entitlement',
      'products.free.entitlements.seats must be an object such as {"included": 1}, not a ' +
        'boolean; "seats" is a limit',
    ]) {
      expect(ran.stderr).toContain(`  - ${violation}\n`);
    }
    const after = await call(server.base, 'GET', '/v1/sync/pull', { key });
    expect([after.status, after.body]).toEqual([before.status, before.body]);

    // Validation comes before any request: even an unreachable service is never asked.
    const offline = await tally(['push', bad, '--yes', '--url', 'http://127.0.0.1:1'], { key });
    expect(offline.code).toBe(1);
    expect(offline.stderr).not.toContain('cannot reach');

    const notJson = path.join(tmp, 'not.json');
    fs.writeFileSync(notJson, '{"entitlements": ');
    const broken = await tally(['push', notJson, '--yes'], { key });
    expect(broken.code).toBe(1);
    expect(broken.stderr).toContain('is not valid JSON');
  });

  it('pull --out then push of the same file: no changes, nothing pushed', async () => {
    const key = server.keys.live.server;
    expect(
      (await call(server.base, 'POST', '/v1/sync/push', { key, body: CONFIG_V2 })).status,
    ).toBe(200);
    const version = (await call(server.base, 'GET', '/v1/sync/pull', { key })).body
      .version as number;

    const out = path.join(tmp, 'pulled.json');
    const pulled = await tally(['pull', '--out', out], { key });
    expect(pulled.code, pulled.stderr).toBe(0);
    expect(pulled.stdout).toBe('');
    expect(pulled.stderr).toContain(`Wrote version ${version} `);
    expect(JSON.parse(fs.readFileSync(out, 'utf8'))).toEqual(CONFIG_V2);

    const toStdout = await tally(['pull'], { key });
    expect(toStdout.code).toBe(0);
    expect(JSON.parse(toStdout.stdout)).toEqual(CONFIG_V2);

    const again = await tally(['push', out], { key });
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toContain(`version ${version} `);
    expect(again.stdout).toContain(
      'No changes: the deployed configuration already matches; nothing pushed.',
    );
    expect((await call(server.base, 'GET', '/v1/sync/pull', { key })).body.version).toBe(version);
  });

  it("prints the service's error when it refuses: a client key cannot pull", async () => {
    const ran = await tally(['pull'], { key: server.keys.test.client });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toBe('error: this endpoint requires a server key (HTTP 403)\n');
  });
});

describe('operator commands', () => {
  it(
    'keys: create (secret printed once, and it works), list without secrets, revoke (then ' +
      '401)',
    async () => {
      const created = await tally(['keys', 'create', '--env', 'test', '--class', 'server'], {
        key: adminKey,
      });
      expect(created.code, created.stderr).toBe(0);
      const secret = /^(sk_test_\S+)$/m.exec(created.stdout)?.[1];
      const id = /Created test server key (key_[0-9a-f]+) /.exec(created.stdout)?.[1];
      expect(secret).toBeDefined();
      expect(id).toBeDefined();
      expect((await call(server.base, 'GET', '/v1/customers', { key: secret ?? '' })).status).toBe(
        200,
      );

      const listed = await tally(['keys', 'list'], { key: adminKey });
      expect(listed.code).toBe(0);
      expect(listed.stdout.split('\n')[0]).toMatch(
        /^ID\s+PREFIX\s+ENVIRONMENT\s+CLASS\s+CREATED\s+REVOKED$/,
      );
      const row = listed.stdout.split('\n').find((line) => line.startsWith(id ?? '?'));
      expect(row).toMatch(
        new RegExp(
          `^${id}\\s+${(secret ?? '').slice(0, 12)}…\\s+test\\s+server\\s+\\d{4}` +
            `-\\d\\d-\\d\\dT\\S+\\s+-$`,
        ),
      );
      expect(listed.stdout).not.toContain(secret);
      const json = JSON.parse(
        (await tally(['keys', 'list', '--json'], { key: adminKey })).stdout,
      ) as { data: Array<Record<string, unknown>> };
      const view = json.data.find((key) => key.id === id);
      expect(view).toMatchObject({ environment: 'test', class: 'server', revokedAt: null });
      expect(JSON.stringify(json)).not.toContain(secret);

      const revoked = await tally(['keys', 'revoke', id ?? ''], { key: adminKey });
      expect(revoked.code, revoked.stderr).toBe(0);
      expect(revoked.stdout).toMatch(new RegExp(`^Revoked ${id} `));
      expect((await call(server.base, 'GET', '/v1/customers', { key: secret ?? '' })).status).toBe(
        401,
      );
      const after = JSON.parse(
        (await tally(['keys', 'list', '--json'], { key: adminKey })).stdout,
      ) as { data: Array<Record<string, unknown>> };
      expect(after.data.find((key) => key.id === id)?.revokedAt).toEqual(expect.any(String));

      const again = await tally(['keys', 'revoke', id ?? ''], { key: adminKey });
      expect(again.code).toBe(1);
      expect(again.stderr).toMatch(
        new RegExp(`^error: key ${id} was already revoked at \\d{4}-\\S+ \\(HTTP 409\\)\n$`),
      );

      const unknown = await tally(['keys', 'revoke', 'key_0000'], { key: adminKey });
      expect(unknown.code).toBe(1);
      expect(unknown.stderr).toBe('error: key key_0000 not found (HTTP 404)\n');
    },
  );

  it(
    "refuses an environment key on every operator command with the service's 403 " + 'message',
    async () => {
      const keysBefore = (await call(server.base, 'GET', '/v1/admin/keys', { key: adminKey })).body
        .data.length as number;
      const commands = [
        ['status'],
        ['keys', 'list'],
        ['keys', 'create', '--env', 'live', '--class', 'server'],
        ['keys', 'revoke', 'key_0000'],
        ['keys', 'rotate-admin'],
      ];
      for (const [index, args] of commands.entries()) {
        const key = index % 2 === 0 ? server.keys.test.server : server.keys.live.server;
        const ran = await tally(args, { key });
        expect(ran.code, args.join(' ')).toBe(1);
        expect(ran.stderr, args.join(' ')).toBe(
          'error: this endpoint requires the operator key (HTTP 403)\n',
        );
        expect(ran.stdout).toBe('');
      }
      expect(
        (await call(server.base, 'GET', '/v1/admin/keys', { key: adminKey })).body.data.length,
      ).toBe(keysBefore);
    },
  );

  it(
    'status: health, shards, customers per shard, journal, last snapshot, uptime; --json is ' +
      "the service's answer",
    async () => {
      expect(
        (
          await call(server.base, 'POST', '/v1/customers', {
            key: server.keys.test.server,
            body: { id: 'cli-status' },
          })
        ).status,
      ).toBe(201);
      const api = (await call(server.base, 'GET', '/v1/admin/status', { key: adminKey })).body;
      const ran = await tally(['status'], { key: adminKey });
      expect(ran.code, ran.stderr).toBe(0);
      expect(ran.stdout).toMatch(/^Health:\s+ok$/m);
      expect(ran.stdout).toMatch(/^Uptime:\s+(\d+[dhm] )*\d+s \(since \d{4}-/m);
      expect(ran.stdout).toMatch(new RegExp(`^Shards:\\s+${api.shards.length}$`, 'm'));
      expect(ran.stdout).toMatch(new RegExp(`^Customers:\\s+${api.customers}$`, 'm'));
      expect(api.customers).toBeGreaterThanOrEqual(1);
      expect(ran.stdout).toMatch(/^Configurations:\s+test v2, live v\d+$/m);
      expect(ran.stdout).toMatch(/^Journal:\s+\d+(\.\d)? (B|KiB|MiB|GiB)$/m);
      expect(ran.stdout).toMatch(/^Last shard snapshot:\s+(never|\d{4}-\S+)$/m);
      // The header row: these column names, separated by whitespace.
      const columns = [
        'SHARD',
        'CUSTOMERS',
        'QUEUE',
        'JOURNAL RECORDS',
        'JOURNAL SIZE',
        'LAST SEQ',
        'SNAPSHOT SEQ',
        'LAST SNAPSHOT',
      ];
      expect(ran.stdout).toMatch(new RegExp(`^${columns.join('\\s+')}$`, 'm'));
      for (const shard of api.shards as Array<{ index: number; customers: number }>) {
        expect(ran.stdout).toMatch(
          new RegExp(`^${shard.index}\\s+${shard.customers}\\s+\\d+\\s+\\d+\\s+`, 'm'),
        );
      }

      const json = await tally(['status', '--json'], { key: adminKey });
      expect(json.code).toBe(0);
      const parsed = JSON.parse(json.stdout);
      expect(parsed).toMatchObject({
        ok: true,
        workers: api.workers,
        customers: api.customers,
        environments: api.environments,
      });
      expect(parsed.shards).toHaveLength(api.shards.length);
    },
  );

  it('keys rotate-admin prints the new operator key once and revokes the old one', async () => {
    const oldKey = adminKey;
    const oldId = (
      (await call(server.base, 'GET', '/v1/admin/keys', { key: oldKey })).body.data as Array<{
        id: string;
        class: string;
        revokedAt: string | null;
      }>
    ).find((key) => key.class === 'operator' && key.revokedAt === null)?.id;
    const ran = await tally(['keys', 'rotate-admin'], { key: oldKey });
    expect(ran.code, ran.stderr).toBe(0);
    const newKey = /^(ak_\S+)$/m.exec(ran.stdout)?.[1];
    expect(newKey).toBeDefined();
    expect(newKey).not.toBe(oldKey);
    expect(ran.stdout).toContain(`The old operator key ${oldId} is revoked`);
    adminKey = newKey ?? '';
    // The data dir's bootstrap file now holds the new key, as a private file; the rest is
    // unchanged.
    const file = path.join(server.dataDir, 'bootstrap-keys.json');
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual({ ...server.keys, admin: newKey });
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(ran.stdout).toContain('bootstrap-keys.json');

    const withOld = await tally(['status'], { key: oldKey });
    expect(withOld.code).toBe(1);
    expect(withOld.stderr).toBe('error: API key is invalid or revoked (HTTP 401)\n');
    expect((await tally(['status', '--key', adminKey], { key: oldKey })).code).toBe(0);

    // Without the file (moved away by the operator), a rotation does not recreate it.
    fs.rmSync(file);
    const again = await tally(['keys', 'rotate-admin'], { key: adminKey });
    expect(again.code, again.stderr).toBe(0);
    adminKey = /^(ak_\S+)$/m.exec(again.stdout)?.[1] ?? '';
    expect(fs.existsSync(file)).toBe(false);
    expect((await tally(['status'], { key: adminKey })).code).toBe(0);
  });

  it("keys rotate-token-secret rotates one environment's customer-token secret", async () => {
    const mint = async (key: string) =>
      (await call(server.base, 'POST', '/v1/client-tokens', { key, body: { customerId: 'a' } }))
        .body.token as string;
    const before = /^ct_live_(\d+)\./.exec(await mint(server.keys.live.server))?.[1];
    const ran = await tally(['keys', 'rotate-token-secret', '--env', 'live'], { key: adminKey });
    expect(ran.code, ran.stderr).toBe(0);
    const generation = Number(before) + 1;
    expect(ran.stdout).toContain(
      `live customer tokens are now signed with secret generation ${generation}.`,
    );
    expect(await mint(server.keys.live.server)).toMatch(new RegExp(`^ct_live_${generation}\\.`));
    expect(await mint(server.keys.test.server)).toMatch(/^ct_test_1\./);
    const refused = await tally(['keys', 'rotate-token-secret', '--env', 'live'], {
      key: server.keys.live.server,
    });
    expect(refused.code).toBe(1);
  });
});
