/**
 * The discovery API's edges, on the real server over loopback: every refusal — Fastify's and
 * Node's own included — comes in the documented shape `{error:{code,message,field?}}` and never
 * echoes a long input; a JSON `null` body is refused; `namespace` is a DNS-1123 label; targets
 * written any way normalise to one key; a proxy waiting for a person shows why.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';
import { exchange, send } from '../../support/listeners.ts';

const TOKEN = 'edge-token-0123456789';
const AUTH = { authorization: `Bearer ${TOKEN}` };
const LONG = 'x'.repeat(10_000);

const info = (name: string, over: Partial<ProxyInfo> = {}): ProxyInfo =>
  proxyInfo(name, { host: '127.0.0.1', credentials: { username: 'user', password: 'hunter2' }, ...over });

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function setup(
  proxies: ProxyInfo[] = [info('a')],
): Promise<{ server: DiscoveryServer; leases: LeaseStore }> {
  const leases = new LeaseStore({ clock: new FakeClock(Date.now()) });
  for (const p of proxies) leases.upsertProxy(p);
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry: new Registry(),
    token: TOKEN,
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return { server, leases };
}

/** The documented error shape, nothing else, and no long echo of the input. */
function expectErrorShape(text: string, code?: string): { code: string; message: string; field?: string } {
  expect(text.length).toBeLessThan(1_000);
  expect(text).not.toContain('x'.repeat(200));
  const body = JSON.parse(text) as { error: { code: string; message: string; field?: string } };
  expect(Object.keys(body)).toEqual(['error']);
  for (const k of Object.keys(body.error)) expect(['code', 'message', 'field']).toContain(k);
  expect(typeof body.error.code).toBe('string');
  expect(typeof body.error.message).toBe('string');
  if (code) expect(body.error.code).toBe(code);
  return body.error;
}

function port(server: DiscoveryServer): number {
  return Number(new URL(server.url).port);
}

describe('Fastify and Node refusals use the documented shape', () => {
  it('a 10 KB lease id is refused without being echoed, on every route that takes one', async () => {
    const { server } = await setup();
    for (const [method, path] of [
      ['POST', `/v1/leases/${LONG}/renew`],
      ['POST', `/v1/leases/${LONG}/report`],
      ['DELETE', `/v1/leases/${LONG}`],
    ] as const) {
      const res = await send(`${server.url}${path}`, {
        method,
        headers: { ...AUTH, 'content-type': 'application/json' },
        body: '{"result":"success"}',
      });
      expect(res.status, `${method} ${path.slice(0, 20)}`).toBe(400);
      expect(expectErrorShape(res.text, 'bad_request').field).toBe('id');
    }
  });

  it('an id of 101–128 characters is routed (the schema allows 128)', async () => {
    const { server } = await setup();
    const res = await send(`${server.url}/v1/leases/${'a'.repeat(120)}/renew`, {
      method: 'POST',
      headers: AUTH,
    });
    expect(res.status).toBe(404);
    expectErrorShape(res.text, 'not_found');
  });

  it('an unknown 10 KB path is a short 404', async () => {
    const { server } = await setup();
    const res = await send(`${server.url}/v1/${LONG}`, { headers: AUTH });
    expect(res.status).toBe(404);
    expectErrorShape(res.text, 'not_found');
  });

  it('a malformed percent-encoding in the path is a 400', async () => {
    const { server } = await setup();
    const res = await exchange(
      port(server),
      `POST /v1/leases/%zz${'x'.repeat(50)}/renew HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`,
    );
    expect(res.received).toMatch(/^HTTP\/1\.1 400 /);
    expectErrorShape(res.received.slice(res.received.indexOf('\r\n\r\n') + 4), 'bad_request');
  });

  it('request headers over the limit are a 431 in the shape', async () => {
    const { server } = await setup();
    const res = await exchange(
      port(server),
      `GET /v1/proxies HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'x'.repeat(20_000)}\r\n\r\n`,
    );
    expect(res.received).toMatch(/^HTTP\/1\.1 431 /);
    expectErrorShape(res.received.slice(res.received.indexOf('\r\n\r\n') + 4), 'header_too_large');
  });

  it('an unknown query field of 2 KB is named, but not echoed whole', async () => {
    const { server } = await setup();
    const res = await send(`${server.url}/v1/proxies?${'y'.repeat(2_000)}=1`, { headers: AUTH });
    expect(res.status).toBe(400);
    expect(res.text).not.toContain('y'.repeat(200));
    expectErrorShape(res.text, 'bad_request');
  });
});

describe('request bodies and fields', () => {
  it('a JSON null body is a 400 naming the body; no body still means defaults', async () => {
    const { server, leases } = await setup();
    const res = await send(`${server.url}/v1/leases`, {
      method: 'POST',
      headers: { ...AUTH, 'content-type': 'application/json' },
      body: 'null',
    });
    expect(res.status).toBe(400);
    expect(expectErrorShape(res.text, 'bad_request').field).toBe('body');
    expect(leases.activeLeases()).toBe(0);
    const none = await send(`${server.url}/v1/leases`, { method: 'POST', headers: AUTH });
    expect(none.status).toBe(201);
  });

  it('namespace must be a DNS-1123 label, in a lease and in a listing', async () => {
    const { server, leases } = await setup();
    for (const ns of ['Crawl', 'crawl_1', '-crawl', 'a'.repeat(64), 'crawl.eu']) {
      const lease = await send(`${server.url}/v1/leases`, {
        method: 'POST',
        headers: { ...AUTH, 'content-type': 'application/json' },
        body: JSON.stringify({ namespace: ns }),
      });
      expect(lease.status, ns).toBe(400);
      const err = expectErrorShape(lease.text, 'bad_request');
      expect(err.field).toBe('namespace');
      expect(err.message).toMatch(/DNS-1123 label/);
      const list = await send(`${server.url}/v1/proxies?namespace=${encodeURIComponent(ns)}`, {
        headers: AUTH,
      });
      expect(list.status, ns).toBe(400);
      expect(expectErrorShape(list.text).field).toBe('namespace');
    }
    expect(leases.activeLeases()).toBe(0);
    expect(() => leases.lease({ namespace: 'Crawl' })).toThrow(/namespace must be a DNS-1123 label/);
    const ok = await send(`${server.url}/v1/proxies?namespace=crawl`, { headers: AUTH });
    expect(JSON.parse(ok.text).proxies).toHaveLength(1);
  });
});

describe('targets normalise one way', () => {
  it('2130706433, http://2130706433/ and 127.0.0.1 are one target', async () => {
    const { server } = await setup([info('a')]);
    const post = (path: string, body: unknown) =>
      send(`${server.url}${path}`, {
        method: 'POST',
        headers: { ...AUTH, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    const g = await post('/v1/leases', { target: '2130706433' });
    expect(g.status).toBe(201);
    expect(JSON.parse(g.text).target).toBe('127.0.0.1');
    expect((await post(`/v1/leases/${JSON.parse(g.text).id}/report`, { result: 'blocked' })).status).toBe(
      200,
    );
    for (const t of ['http://2130706433/', '127.0.0.1', 'https://127.0.0.1:8443/x', '0x7f.1']) {
      const again = await post('/v1/leases', { target: t });
      expect(again.status, t).toBe(409);
      expect(JSON.parse(again.text)).toMatchObject({ coolingDownForTarget: 1 });
    }
    expect((await post('/v1/leases', { target: 'shop.example' })).status).toBe(201);
  });

  it('an out-of-range port is a 400 whether written as host:port or as a URL', async () => {
    const { server } = await setup();
    for (const t of ['shop.example:99999', 'http://shop.example:99999/']) {
      const res = await send(`${server.url}/v1/leases`, {
        method: 'POST',
        headers: { ...AUTH, 'content-type': 'application/json' },
        body: JSON.stringify({ target: t }),
      });
      expect(res.status, t).toBe(400);
      expect(expectErrorShape(res.text, 'bad_request').field).toBe('target');
    }
  });
});

describe('a proxy waiting for a person', () => {
  it('shows the problem in /v1/proxies; null when there is none', async () => {
    const { server } = await setup([
      info('ok'),
      info('stuck', {
        phase: 'Pending',
        host: '',
        port: 0,
        healthy: false,
        problem: {
          reason: 'CredentialsError',
          message: 'credentials Secret "s" (spec.credentialsSecretRef) not found',
        },
      }),
    ]);
    const res = await send(`${server.url}/v1/proxies`, { headers: AUTH });
    const proxies = JSON.parse(res.text).proxies as Array<{ name: string; problem: unknown; reason: string }>;
    expect(proxies.find((p) => p.name === 'stuck')).toMatchObject({
      reason: 'NotReady',
      problem: { reason: 'CredentialsError', message: expect.stringContaining('not found') },
    });
    expect(proxies.find((p) => p.name === 'ok')?.problem).toBeNull();
  });
});
