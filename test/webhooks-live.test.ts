/**
 * The live-endpoint rules against a real server: https only, public addresses only (names
 * resolving to loopback or the cloud metadata address are refused, IPv4 or IPv6), pending
 * approval until an operator approves with the real `tally webhooks approve`; and test
 * endpoints, which may reach loopback but no other internal address. Names are pinned with
 * TALLY_WEBHOOK_RESOLVE, as an operator would, so the test needs no DNS.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runProcess } from './support/run-process.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'bin', 'tally.js');

let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({
    env: {
      TALLY_WEBHOOK_RESOLVE:
        'loop.example=127.0.0.1,metadata.example=169.254.169.254,' +
        'private.example=10.1.2.3,mapped.example=::ffff:127.0.0.1,public.example=93.184.216.34',
    },
  });
});
afterAll(async () => {
  await server?.stop();
});

const register = (environment: 'test' | 'live', url: string, key = 'app') =>
  call(server.base, 'POST', '/v1/webhooks', {
    key: server.keys[environment].server,
    body: { url, key, events: '*' },
  });

const tally = (args: readonly string[]) =>
  runProcess(process.execPath, [BIN, ...args], {
    cwd: ROOT,
    env: { ...process.env, TALLY_URL: server.base, TALLY_API_KEY: server.keys.admin },
  });

describe('live endpoints', () => {
  it.each([
    ['http://public.example/hooks', 'https'],
    ['https://loop.example/hooks', '127.0.0.1'],
    ['https://metadata.example/latest/meta-data', '169.254.169.254'],
    ['https://169.254.169.254/latest/meta-data', '169.254.169.254'],
    ['https://private.example/hooks', '10.1.2.3'],
    ['https://mapped.example/hooks', '::ffff:127.0.0.1'],
    ['https://[::1]/hooks', '::1'],
    ['https://[fd00:ec2::254]/hooks', 'fd00:ec2::254'],
    ['https://user:pass@public.example/hooks', 'credentials'],
  ])('refuses %s', async (url, reason) => {
    const answer = await register('live', url);
    expect(answer.status).toBe(400);
    expect(answer.body.code).toBe('webhook_url_not_allowed');
    expect(answer.body.error).toContain(reason);
  });

  it('accepts a public https endpoint as pending_approval; the operator approves it', async () => {
    const answer = await register('live', 'https://public.example/hooks');
    expect(answer.status).toBe(201);
    expect(answer.body).toMatchObject({ environment: 'live', status: 'pending_approval' });
    const listed = await tally(['webhooks', 'list']);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(answer.body.id);
    expect(listed.stdout).toContain('pending_approval');
    expect(listed.stdout).not.toContain(answer.body.secret);
    const approved = await tally(['webhooks', 'approve', answer.body.id]);
    expect(approved.code).toBe(0);
    expect(approved.stdout).toContain(`Approved ${answer.body.id}`);
    const now = await call(server.base, 'GET', `/v1/webhooks/${answer.body.id}`, {
      key: server.keys.live.server,
    });
    expect(now.body.status).toBe('active');
    const twice = await tally(['webhooks', 'approve', answer.body.id]);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain('is active');
    // Another environment's key does not see it.
    const fromTest = await call(server.base, 'GET', `/v1/webhooks/${answer.body.id}`, {
      key: server.keys.test.server,
    });
    expect(fromTest.status).toBe(404);
    const operatorAudit = await call(server.base, 'GET', '/v1/admin/audit', {
      key: server.keys.admin,
    });
    expect(operatorAudit.body.data[0]).toMatchObject({
      action: 'webhook.approve',
      resourceId: answer.body.id,
    });
  });

  it('approval and enabling need the operator key', async () => {
    const answer = await call(server.base, 'POST', '/v1/admin/webhooks/we_x/approve', {
      key: server.keys.live.server,
    });
    expect(answer.status).toBe(403);
    const missing = await call(server.base, 'POST', '/v1/admin/webhooks/we_missing/approve', {
      key: server.keys.admin,
    });
    expect(missing.status).toBe(404);
    expect(missing.body.code).toBe('webhook_not_found');
  });
});

describe('test endpoints', () => {
  it('may use http and reach loopback, and start active', async () => {
    const answer = await register('test', 'http://loop.example:9/hooks');
    expect(answer.status).toBe(201);
    expect(answer.body.status).toBe('active');
    const local = await register('test', 'http://127.0.0.1:9/hooks');
    expect(local.status).toBe(201);
  });

  it.each([
    ['http://metadata.example/latest', '169.254.169.254'],
    ['http://private.example/hooks', '10.1.2.3'],
    ['ftp://public.example/hooks', 'https'],
  ])('still refuses %s', async (url, reason) => {
    const answer = await register('test', url);
    expect(answer.status).toBe(400);
    expect(answer.body.code).toBe('webhook_url_not_allowed');
    expect(answer.body.error).toContain(reason);
  });
});
