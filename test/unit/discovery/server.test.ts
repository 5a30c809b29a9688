import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { sameSecret } from '../../../src/discovery/auth.ts';
import {
  DiscoveryClient,
  DiscoveryError,
  LeaseNotFoundError,
  LIST_PAGE_SIZE,
  NoneLeasableError,
} from '../../../src/discovery/client.ts';
import {
  type DiscoveryServer,
  discoveryBindAddress,
  startDiscoveryServer,
} from '../../../src/discovery/server.ts';
import { GatewaySessions } from '../../../src/gateway/service.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { createLogger } from '../../../src/log/index.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'test-token-0123456789';

const info = (name: string, over: Partial<ProxyInfo> = {}): ProxyInfo =>
  proxyInfo(name, {
    labels: { pool: 'eu' },
    host: '127.0.0.1',
    credentials: { username: 'user', password: 'hunter2' },
    ...over,
  });

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

interface Setup {
  server: DiscoveryServer;
  leases: LeaseStore;
  clock: FakeClock;
  registry: Registry;
  probes: string[];
  exporter: InMemorySpanExporter;
  logLines: string[];
  call(
    method: string,
    path: string,
    init?: { body?: unknown; raw?: string; headers?: Record<string, string> },
  ): Promise<{
    status: number;
    body: Record<string, unknown>;
    headers: Headers;
  }>;
}

async function setup(
  opts: { token?: string | null; proxies?: ProxyInfo[]; sessions?: GatewaySessions } = {},
): Promise<Setup> {
  const clock = new FakeClock(Date.now());
  const probes: string[] = [];
  const leases = new LeaseStore({ clock, requestProbe: (k) => probes.push(k) });
  for (const p of opts.proxies ?? [info('a'), info('b')]) leases.upsertProxy(p);
  const registry = new Registry();
  const exporter = new InMemorySpanExporter();
  const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
  const logLines: string[] = [];
  const log = createLogger({
    level: 'debug',
    destination: {
      write: (s: string) => {
        logLines.push(s);
        return true;
      },
    } as unknown as NodeJS.WritableStream,
  });
  const token = opts.token === null ? undefined : (opts.token ?? TOKEN);
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry,
    log,
    tracer: provider.getTracer('test'),
    ...(token ? { token } : {}),
    ...(opts.sessions ? { sessions: opts.sessions } : {}),
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  const call: Setup['call'] = async (method, path, init = {}) => {
    const headers: Record<string, string> = { ...(token ? { authorization: `Bearer ${token}` } : {}) };
    let body: string | undefined;
    if (init.raw !== undefined) body = init.raw;
    else if (init.body !== undefined) body = JSON.stringify(init.body);
    if (body !== undefined) headers['content-type'] = 'application/json';
    Object.assign(headers, init.headers);
    const res = await fetch(`${server.url}${path}`, { method, headers, body });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : {}, headers: res.headers };
  };
  return { server, leases, clock, registry, probes, exporter, logLines, call };
}

describe('routes', () => {
  it('GET /healthz answers without a token', async () => {
    const s = await setup();
    const res = await fetch(`${s.server.url}/healthz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'ok' });
  });

  it('GET /v1/gateway/ca.pem serves the inspection CA certificate without a token, 404 when inspection is off', async () => {
    const sessions = new GatewaySessions();
    const s = await setup({ sessions });
    const off = await fetch(`${s.server.url}/v1/gateway/ca.pem`);
    expect(off.status).toBe(404);
    expect(await off.text()).toContain('--gateway-inspect');
    sessions.caCertificate = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';
    const on = await fetch(`${s.server.url}/v1/gateway/ca.pem`);
    expect(on.status).toBe(200);
    expect(on.headers.get('content-type')).toBe('application/x-pem-file');
    expect(await on.text()).toBe(sessions.caCertificate);
  });

  it('GET /generate_204 is an unauthenticated probe target', async () => {
    const s = await setup();
    const res = await fetch(`${s.server.url}/generate_204`);
    expect(res.status).toBe(204);
    expect(await res.text()).toBe('');
  });

  it('POST /v1/leases grants with credentials; GET /v1/proxies never shows them', async () => {
    const s = await setup();
    const g = await s.call('POST', '/v1/leases', {
      body: { target: 'https://Shop.Example/x', ttlSeconds: 60 },
    });
    expect(g.status).toBe(201);
    expect(g.body).toMatchObject({
      proxy: {
        namespace: 'crawl',
        name: 'a',
        url: 'http://user:hunter2@127.0.0.1:3128',
        host: '127.0.0.1',
        port: 3128,
      },
      target: 'shop.example',
    });
    expect(Date.parse(g.body.expiresAt as string) - s.clock.now()).toBe(60_000);
    expect(g.headers.get('cache-control')).toBe('no-store');

    const list = await s.call('GET', '/v1/proxies?selector=pool%3Deu&namespace=crawl&target=shop.example');
    expect(list.status).toBe(200);
    const proxies = list.body.proxies as Record<string, unknown>[];
    expect(proxies.map((p) => [p.name, p.activeLeases, p.leasable])).toEqual([
      ['a', 1, true],
      ['b', 0, true],
    ]);
    expect(JSON.stringify(list.body)).not.toContain('hunter2');
    expect((await s.call('GET', '/v1/proxies?selector=pool%3Dus')).body).toEqual({ proxies: [] });
    expect(s.logLines.join('')).not.toContain('hunter2');
  });

  it('GET /v1/proxies selects on and shows where a proxy runs', async () => {
    const s = await setup({
      proxies: [info('a', { location: { region: 'eu', zone: 'eu-b' } }), info('b')],
    });
    const list = await s.call('GET', '/v1/proxies?selector=topology.kubernetes.io%2Fzone%3Deu-b');
    expect(list.status).toBe(200);
    const proxies = list.body.proxies as Record<string, unknown>[];
    expect(proxies.map((p) => [p.name, p.location])).toEqual([['a', { region: 'eu', zone: 'eu-b' }]]);
  });

  it('GET /v1/proxies pages with limit and continue, in namespace and name order', async () => {
    const names = ['e', 'a', 'd', 'c', 'b', 'f', 'g'];
    const s = await setup({
      proxies: [
        ...names.map((n, i) => info(n, { labels: { pool: i % 2 ? 'odd' : 'even' } })),
        info('a', { namespace: 'aaa', key: 'aaa/a' }),
        info('z', { namespace: 'zzz', key: 'zzz/z' }),
      ],
    });
    const walk = async (query: string) => {
      const seen: string[] = [];
      let next: string | undefined;
      let pages = 0;
      do {
        const res = await s.call(
          'GET',
          `/v1/proxies?limit=3${query}${next ? `&continue=${encodeURIComponent(next)}` : ''}`,
        );
        expect(res.status).toBe(200);
        const page = res.body.proxies as { namespace: string; name: string }[];
        expect(page.length).toBeLessThanOrEqual(3);
        seen.push(...page.map((p) => `${p.namespace}/${p.name}`));
        next = res.body.continue as string | undefined;
        pages++;
      } while (next !== undefined);
      return { seen, pages };
    };
    const all = (await s.call('GET', '/v1/proxies')).body.proxies as { namespace: string; name: string }[];
    const everything = all.map((p) => `${p.namespace}/${p.name}`);
    expect(everything).toEqual(['aaa/a', ...[...names].sort().map((n) => `crawl/${n}`), 'zzz/z']);
    expect(await walk('')).toEqual({ seen: everything, pages: 3 });
    expect((await walk('&namespace=crawl')).seen).toEqual(everything.filter((k) => k.startsWith('crawl/')));
    expect((await walk('&selector=pool%3Dodd')).seen).toEqual(['crawl/a', 'crawl/c', 'crawl/f']);
    // The last page says nothing more; a page that ends exactly on the last proxy too.
    const exact = await s.call('GET', '/v1/proxies?limit=9');
    expect(exact.body.continue).toBeUndefined();
    // A proxy removed between pages does not stop the walk: the next page starts after its name.
    const first = await s.call('GET', '/v1/proxies?limit=2');
    expect(first.body.continue).toBe('crawl/a');
    s.leases.removeProxy('crawl/a');
    const second = await s.call('GET', `/v1/proxies?limit=2&continue=${encodeURIComponent('crawl/a')}`);
    expect((second.body.proxies as { name: string }[]).map((p) => p.name)).toEqual(['b', 'c']);
    for (const [query, field] of [
      ['limit=0', 'limit'],
      ['limit=10001', 'limit'],
      ['limit=ten', 'limit'],
      ['continue=nokey', 'continue'],
    ] as const) {
      const bad = await s.call('GET', `/v1/proxies?${query}`);
      expect(bad, query).toMatchObject({ status: 400, body: { error: { field } } });
    }
  });

  it('POST /v1/leases without a body uses defaults (TTL 300 s)', async () => {
    const s = await setup();
    const res = await fetch(`${s.server.url}/v1/leases`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(res.status).toBe(201);
    const body = (await res.json()) as { expiresAt: string; target: null };
    expect(Date.parse(body.expiresAt) - s.clock.now()).toBe(300_000);
    expect(body.target).toBeNull();
  });

  it('409 carries the arithmetic and a message', async () => {
    const s = await setup({
      proxies: [
        info('ok', { maxLeases: 1 }),
        info('sick', { healthy: false }),
        info('new', { phase: 'Provisioning' }),
        info('drain', { draining: true }),
        info('other', { labels: { pool: 'us' } }),
      ],
    });
    expect((await s.call('POST', '/v1/leases', { body: { selector: 'pool=eu' } })).status).toBe(201);
    const res = await s.call('POST', '/v1/leases', { body: { selector: 'pool=eu' } });
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({
      error: { code: 'none_leasable' },
      matching: 4,
      ready: 3,
      healthy: 2,
      draining: 1,
      coolingDown: 0,
      coolingDownForTarget: 0,
      atCapacity: 1,
    });
    expect((res.body.error as { message: string }).message).toContain('4 matching');
  });

  it('renew extends, 404 once expired; DELETE is idempotent', async () => {
    const s = await setup({ proxies: [info('a', { maxLeases: 1 })] });
    const g = await s.call('POST', '/v1/leases', { body: { ttlSeconds: 10 } });
    const id = g.body.id as string;
    s.clock.advance(5_000);
    const r = await s.call('POST', `/v1/leases/${id}/renew`, { body: { ttlSeconds: 20 } });
    expect(r.status).toBe(200);
    expect(Date.parse(r.body.expiresAt as string) - s.clock.now()).toBe(20_000);
    const noBody = await fetch(`${s.server.url}/v1/leases/${id}/renew`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(noBody.status).toBe(200);
    s.clock.advance(300_000);
    expect((await s.call('POST', `/v1/leases/${id}/renew`, { body: {} })).status).toBe(404);
    expect((await s.call('DELETE', `/v1/leases/${id}`)).status).toBe(204);
    expect((await s.call('DELETE', '/v1/leases/never-existed')).status).toBe(204);
    const g2 = await s.call('POST', '/v1/leases', {});
    expect((await s.call('DELETE', `/v1/leases/${g2.body.id}`)).status).toBe(204);
    expect((await s.call('DELETE', `/v1/leases/${g2.body.id}`)).status).toBe(204);
    expect((await s.call('POST', '/v1/leases', {})).status).toBe(201);
  });

  it('report blocked → 409 for that target only; failed → global cooldown and a probe', async () => {
    const s = await setup({ proxies: [info('a')] });
    const g = await s.call('POST', '/v1/leases', { body: { target: 'shop.example' } });
    const rep = await s.call('POST', `/v1/leases/${g.body.id}/report`, { body: { result: 'blocked' } });
    expect(rep).toMatchObject({ status: 200, body: { id: g.body.id, released: true } });
    const again = await s.call('POST', '/v1/leases', { body: { target: 'shop.example:443' } });
    expect(again.status).toBe(409);
    expect(again.body).toMatchObject({ healthy: 1, coolingDownForTarget: 1 });
    const other = await s.call('POST', '/v1/leases', { body: { target: 'other.example' } });
    expect(other.status).toBe(201);

    const kept = await s.call('POST', `/v1/leases/${other.body.id}/report`, {
      body: { result: 'failed', release: false, cooldownSeconds: 30 },
    });
    expect(kept.body).toEqual({ id: other.body.id, released: false });
    expect(s.probes).toEqual(['crawl/a']);
    expect((await s.call('POST', '/v1/leases', {})).body).toMatchObject({ coolingDown: 1 });
    expect(s.leases.activeLeases()).toBe(1);
    s.clock.advance(30_000);
    expect((await s.call('POST', '/v1/leases', {})).status).toBe(201);
    expect((await s.call('POST', '/v1/leases/nope/report', { body: { result: 'success' } })).status).toBe(
      404,
    );
  });

  it('the 409 message names the target as normalised, not as sent', async () => {
    const s = await setup({ proxies: [info('a')] });
    const g = await s.call('POST', '/v1/leases', { body: { target: 'shop.example' } });
    await s.call('POST', `/v1/leases/${g.body.id}/report`, { body: { result: 'blocked' } });
    const res = await s.call('POST', '/v1/leases', {
      body: { target: 'https://Shop.Example:8443/cart?x=1' },
    });
    expect(res.status).toBe(409);
    const message = (res.body.error as { message: string }).message;
    expect(message).toContain('1 cooling down for "shop.example"');
    expect(message).not.toContain('cart');
    // When to come back: the end of that cooldown (600 s by default), in the body and the header.
    expect(res.body.retryAt).toBe(new Date(s.clock.now() + 600_000).toISOString());
    expect(res.headers.get('retry-after')).toBe('600');
    // Nothing would ever match: no retryAt, a polling hint in Retry-After.
    const none = await s.call('POST', '/v1/leases', { body: { selector: 'pool=asia' } });
    expect(none.body.retryAt).toBeNull();
    expect(none.headers.get('retry-after')).toBe('30');
  });

  it('a lease shared by several requests takes every sibling report, also after its release', async () => {
    const s = await setup({ proxies: [info('a')] });
    const g = await s.call('POST', '/v1/leases', { body: { target: 'shop.example' } });
    const first = await s.call('POST', `/v1/leases/${g.body.id}/report`, { body: { result: 'blocked' } });
    expect(first.body).toEqual({ id: g.body.id, released: true });
    // The siblings that used the same lease report after it was released: accepted, not 404.
    for (const result of ['blocked', 'success', 'blocked']) {
      const late = await s.call('POST', `/v1/leases/${g.body.id}/report`, { body: { result } });
      expect(late.status).toBe(200);
    }
    expect(s.leases.activeLeases()).toBe(0);
  });

  it('POST /v1/reports reports by proxy and target: idempotent, releases nothing', async () => {
    const s = await setup({ proxies: [info('a'), info('b')] });
    const g = await s.call('POST', '/v1/leases', { body: { target: 'shop.example' } });
    const proxy = { namespace: 'crawl', name: (g.body.proxy as { name: string }).name };
    const body = { proxy, target: 'https://Shop.Example/x', result: 'blocked', cooldownSeconds: 120 };
    const first = await s.call('POST', '/v1/reports', { body });
    expect(first).toMatchObject({ status: 200, body: { proxy, target: 'shop.example', result: 'blocked' } });
    const snap = () => s.leases.snapshot({ target: 'shop.example' }).find((p) => p.name === proxy.name);
    const until = snap()?.targetCooldowns[0]?.until;
    expect(Date.parse(until ?? '') - s.clock.now()).toBe(120_000);
    // The same report again (a retry after a lost answer) changes nothing.
    expect((await s.call('POST', '/v1/reports', { body })).status).toBe(200);
    expect(snap()?.targetCooldowns).toEqual([{ target: 'shop.example', until }]);
    expect(s.leases.activeLeases()).toBe(1);
    // failed cools the proxy for everyone and asks for a probe; no target needed.
    const failed = await s.call('POST', '/v1/reports', { body: { proxy, result: 'failed' } });
    expect(failed.body).toEqual({ proxy, target: null, result: 'failed' });
    expect(s.probes).toEqual([`crawl/${proxy.name}`]);
    // Refusals name the field and change nothing.
    const noTarget = await s.call('POST', '/v1/reports', { body: { proxy, result: 'blocked' } });
    expect(noTarget).toMatchObject({ status: 400, body: { error: { field: 'target' } } });
    const unknown = await s.call('POST', '/v1/reports', {
      body: { proxy: { namespace: 'crawl', name: 'nope' }, target: 'x.example', result: 'blocked' },
    });
    expect(unknown).toMatchObject({ status: 404, body: { error: { code: 'not_found' } } });
    const extra = await s.call('POST', '/v1/reports', {
      body: { proxy: { ...proxy, url: 'http://u:p@h:1' }, target: 'x.example', result: 'blocked' },
    });
    expect(extra).toMatchObject({ status: 400, body: { error: { field: 'proxy.url' } } });
    const cooled = s.leases.snapshot().flatMap((p) => p.targetCooldowns.map((c) => c.target));
    expect(cooled).toEqual(['shop.example']);
  });

  it('unknown routes are 404 in the error envelope', async () => {
    const s = await setup();
    const res = await s.call('GET', '/v2/nothing');
    expect(res).toMatchObject({ status: 404, body: { error: { code: 'not_found' } } });
  });
});

describe('bad requests name the field and change nothing', () => {
  const cases: [string, string, string, { body?: unknown; raw?: string }, string][] = [
    ['unknown body field', 'POST', '/v1/leases', { body: { ttl: 5 } }, 'ttl'],
    ['TTL zero', 'POST', '/v1/leases', { body: { ttlSeconds: 0 } }, 'ttlSeconds'],
    ['TTL too long', 'POST', '/v1/leases', { body: { ttlSeconds: 3601 } }, 'ttlSeconds'],
    ['TTL as string', 'POST', '/v1/leases', { body: { ttlSeconds: '60' } }, 'ttlSeconds'],
    ['TTL fractional', 'POST', '/v1/leases', { body: { ttlSeconds: 1.5 } }, 'ttlSeconds'],
    ['bad selector', 'POST', '/v1/leases', { body: { selector: 'pool in (eu' } }, 'selector'],
    ['bad selector key', 'POST', '/v1/leases', { body: { selector: '-x=1' } }, 'selector'],
    ['bad target', 'POST', '/v1/leases', { body: { target: 'not a host' } }, 'target'],
    ['namespace wrong type', 'POST', '/v1/leases', { body: { namespace: 7 } }, 'namespace'],
    ['invalid JSON', 'POST', '/v1/leases', { raw: '{"target":' }, 'body'],
    ['JSON array', 'POST', '/v1/leases', { raw: '[]' }, 'body'],
    ['renew bad TTL', 'POST', '/v1/leases/LEASE/renew', { body: { ttlSeconds: -1 } }, 'ttlSeconds'],
    ['renew unknown field', 'POST', '/v1/leases/LEASE/renew', { body: { ttl: 1 } }, 'ttl'],
    ['report unknown result', 'POST', '/v1/leases/LEASE/report', { body: { result: 'meh' } }, 'result'],
    ['report missing result', 'POST', '/v1/leases/LEASE/report', { body: {} }, 'result'],
    [
      'report bad cooldown',
      'POST',
      '/v1/leases/LEASE/report',
      { body: { result: 'failed', cooldownSeconds: 0 } },
      'cooldownSeconds',
    ],
    [
      'report release not bool',
      'POST',
      '/v1/leases/LEASE/report',
      { body: { result: 'success', release: 'no' } },
      'release',
    ],
    [
      'report unknown field',
      'POST',
      '/v1/leases/LEASE/report',
      { body: { result: 'success', why: 1 } },
      'why',
    ],
    ['blocked without target', 'POST', '/v1/leases/LEASE/report', { body: { result: 'blocked' } }, 'result'],
    ['list bad selector', 'GET', '/v1/proxies?selector=a%20notin', {}, 'selector'],
    ['list unknown query', 'GET', '/v1/proxies?pool=eu', {}, 'pool'],
    ['list bad target', 'GET', '/v1/proxies?target=a%2Fb', {}, 'target'],
  ];
  it.each(cases)('%s', async (_, method, path, init, field) => {
    const s = await setup({ proxies: [info('a', { maxLeases: 2 })] });
    const lease = await s.call('POST', '/v1/leases', {});
    const before = JSON.stringify(s.leases.snapshot());
    const res = await s.call(method, path.replace('LEASE', lease.body.id as string), init);
    expect(res.status).toBe(400);
    const err = res.body.error as { code: string; field: string; message: string };
    expect(err.code).toBe('bad_request');
    expect(err.field).toBe(field);
    expect(err.message).toContain(field === 'body' ? 'body' : field);
    expect(JSON.stringify(s.leases.snapshot())).toBe(before);
    expect(s.leases.activeLeases()).toBe(1);
  });

  it('an unknown field names the nearest known one, by its path, and only when one is near', async () => {
    const s = await setup({ proxies: [info('a', { maxLeases: 2 })] });
    const lease = await s.call('POST', '/v1/leases', {});
    const id = lease.body.id as string;
    const cases: [string, string, unknown, string][] = [
      ['POST', '/v1/leases', { ttl: 600 }, 'unknown field "ttl" in body; did you mean "ttlSeconds"?'],
      [
        'POST',
        '/v1/leases',
        { selecter: 'pool=eu' },
        'unknown field "selecter" in body; did you mean "selector"?',
      ],
      [
        'POST',
        `/v1/leases/${id}/renew`,
        { TTL_seconds: 60 },
        'unknown field "TTL_seconds" in body; did you mean "ttlSeconds"?',
      ],
      [
        'POST',
        `/v1/leases/${id}/report`,
        { result: 'failed', cooldown: 5 },
        'unknown field "cooldown" in body; did you mean "cooldownSeconds"?',
      ],
      [
        'POST',
        '/v1/reports',
        { proxy: { namespace: 'crawl', nme: 'a' }, result: 'failed' },
        'unknown field "proxy.nme" in body; did you mean "proxy.name"?',
      ],
      [
        'GET',
        '/v1/proxies?selectr=pool%3Deu',
        undefined,
        'unknown field "selectr" in query; did you mean "selector"?',
      ],
      ['POST', '/v1/leases', { why: 1 }, 'unknown field "why" in body'],
    ];
    for (const [method, path, body, message] of cases) {
      const res = await s.call(method, path, body === undefined ? {} : { body });
      expect(res.status, path).toBe(400);
      expect((res.body.error as { message: string }).message, JSON.stringify(body)).toBe(message);
    }
    expect(s.leases.activeLeases()).toBe(1);
  });

  it('415 for a non-JSON content type, 413 for a body over 16 KiB', async () => {
    const s = await setup();
    const text = await fetch(`${s.server.url}/v1/leases`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'text/plain' },
      body: '{}',
    });
    expect(text.status).toBe(415);
    expect(((await text.json()) as { error: { code: string } }).error.code).toBe('unsupported_media_type');
    const big = await s.call('POST', '/v1/leases', { body: { target: 'a'.repeat(17_000) } });
    expect(big.status).toBe(413);
    expect(big.body).toMatchObject({ error: { code: 'payload_too_large' } });
    expect(s.leases.activeLeases()).toBe(0);
  });
});

describe('auth', () => {
  it('requires the bearer token on every route but /healthz', async () => {
    const s = await setup();
    const paths: [string, string][] = [
      ['GET', '/v1/proxies'],
      ['POST', '/v1/leases'],
      ['POST', '/v1/leases/x/renew'],
      ['DELETE', '/v1/leases/x'],
      ['POST', '/v1/leases/x/report'],
      ['GET', '/openapi.json'],
    ];
    for (const [method, path] of paths) {
      const none = await fetch(`${s.server.url}${path}`, { method });
      expect(none.status, `${method} ${path}`).toBe(401);
      expect(none.headers.get('www-authenticate')).toBe('Bearer');
      const wrong = await fetch(`${s.server.url}${path}`, {
        method,
        headers: { authorization: 'Bearer nope' },
      });
      expect(wrong.status).toBe(401);
      // A prefix, one character more, and the same length with the last character changed.
      for (const near of [TOKEN.slice(0, -1), `${TOKEN}x`, `${TOKEN.slice(0, -1)}#`]) {
        const r = await fetch(`${s.server.url}${path}`, {
          method,
          headers: { authorization: `Bearer ${near}` },
        });
        expect(r.status, `${method} ${path} with a near-miss token`).toBe(401);
      }
      const basic = await fetch(`${s.server.url}${path}`, {
        method,
        headers: { authorization: `Basic ${TOKEN}` },
      });
      expect(basic.status).toBe(401);
    }
    expect(s.leases.activeLeases()).toBe(0);
    const ok = await fetch(`${s.server.url}/v1/proxies`, { headers: { authorization: `bearer ${TOKEN}` } });
    expect(ok.status).toBe(200);
    expect((await fetch(`${s.server.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${s.server.url}/generate_204`)).status).toBe(204);
    expect(s.logLines.join('')).not.toContain(TOKEN);
  });

  it('without a token serves openly and warns loudly at startup', async () => {
    const s = await setup({ token: null });
    expect((await fetch(`${s.server.url}/v1/proxies`)).status).toBe(200);
    const warning = s.logLines
      .map((l) => JSON.parse(l) as { level: number; msg: string })
      .find((l) => l.level === 40);
    expect(warning?.msg).toMatch(/UNAUTHENTICATED/);
  });
});

describe('configuration', () => {
  it('parses bind addresses and refuses a blank token', async () => {
    expect(discoveryBindAddress(':8090')).toEqual({ host: '0.0.0.0', port: 8090 });
    expect(discoveryBindAddress('127.0.0.1:0')).toEqual({ host: '127.0.0.1', port: 0 });
    expect(discoveryBindAddress('[::1]:9000')).toEqual({ host: '::1', port: 9000 });
    expect(() => discoveryBindAddress('8090')).toThrow(/host:port/);
    expect(() => discoveryBindAddress('a:70000')).toThrow(/host:port/);
    expect(() => discoveryBindAddress('0')).toThrow(/cannot be disabled/);
    const leases = new LeaseStore();
    closers.push(() => leases.close());
    await expect(
      startDiscoveryServer({ bindAddress: '127.0.0.1:0', leases, registry: new Registry(), token: ' \n' }),
    ).rejects.toThrow(/empty/);
  });

  it('ignores whitespace around the configured token', async () => {
    const s = await setup({ token: `${TOKEN}\n` });
    const res = await fetch(`${s.server.url}/v1/proxies`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(res.status).toBe(200);
  });
});

describe('observability', () => {
  it('one server span per request, continuing an incoming traceparent', async () => {
    const s = await setup();
    const traceId = '0af7651916cd43dd8448eb211c80319c';
    const parentId = 'b7ad6b7169203331';
    await s.call('POST', '/v1/leases', { headers: { traceparent: `00-${traceId}-${parentId}-01` } });
    await s.call('GET', '/healthz');
    // Spans end in onResponse, which may run just after the client has the response.
    await vi.waitFor(() => expect(s.exporter.getFinishedSpans()).toHaveLength(2), { interval: 10 });
    const spans = s.exporter.getFinishedSpans();
    expect(spans.map((sp) => sp.name)).toEqual(['HTTP POST /v1/leases', 'HTTP GET /healthz']);
    const [lease, health] = spans;
    expect(lease!.spanContext().traceId).toBe(traceId);
    expect(lease!.parentSpanContext?.spanId).toBe(parentId);
    expect(lease!.attributes['http.response.status_code']).toBe(201);
    expect(health!.spanContext().traceId).not.toBe(traceId);
    expect(JSON.stringify(lease!.attributes)).not.toContain('hunter2');
  });

  it('counts lease requests by result', async () => {
    const s = await setup({ proxies: [info('a', { maxLeases: 1 })] });
    await s.call('POST', '/v1/leases', {});
    await s.call('POST', '/v1/leases', {});
    await s.call('POST', '/v1/leases', { body: { ttlSeconds: 0 } });
    await fetch(`${s.server.url}/v1/leases`, { method: 'POST' });
    const text = await s.registry.metrics();
    expect(text).toContain('proxy_operator_lease_requests_total{result="granted"} 1');
    expect(text).toContain('proxy_operator_lease_requests_total{result="none_leasable"} 1');
    expect(text).toContain('proxy_operator_lease_requests_total{result="bad_request"} 1');
    expect(text).toContain('proxy_operator_lease_requests_total{result="unauthorized"} 1');
  });

  it('a second server on the same registry starts and adds to the same counters', async () => {
    const s = await setup();
    const second = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases: s.leases,
      registry: s.registry,
      token: TOKEN,
    });
    closers.push(() => second.close());
    await s.call('GET', '/healthz');
    await fetch(`${second.url}/healthz`);
    const text = await s.registry.metrics();
    expect(text).toContain(
      'proxy_operator_discovery_requests_total{method="GET",route="/healthz",code="200"} 2',
    );
  });

  it('serves an OpenAPI document covering every route and schema', async () => {
    const s = await setup();
    const res = await s.call('GET', '/openapi.json');
    expect(res.status).toBe(200);
    const doc = res.body as {
      openapi: string;
      paths: Record<string, Record<string, { responses: Record<string, unknown>; requestBody?: unknown }>>;
      components: { schemas: Record<string, { properties?: Record<string, unknown> }> };
    };
    expect(doc.openapi).toMatch(/^3\./);
    expect(Object.keys(doc.paths).sort()).toEqual([
      '/',
      '/dashboard/{file}',
      '/generate_204',
      '/healthz',
      '/openapi.json',
      '/v1/dashboard/history',
      '/v1/dashboard/state',
      '/v1/gateway/ca.pem',
      '/v1/internal/gateway/sync',
      '/v1/leases',
      '/v1/leases/{id}',
      '/v1/leases/{id}/renew',
      '/v1/leases/{id}/report',
      '/v1/proxies',
      '/v1/reports',
      '/v1/sessions/{id}/report',
    ]);
    expect(Object.keys(doc.paths['/v1/leases']!.post!.responses).sort()).toEqual(
      ['201', '400', '401', '409', '413', '415', '503'].sort(),
    );
    expect(doc.paths['/v1/leases/{id}']!.delete!.responses['204']).toBeDefined();
    expect(Object.keys(doc.components.schemas.NoneLeasable!.properties!)).toEqual(
      expect.arrayContaining([
        'matching',
        'ready',
        'healthy',
        'draining',
        'coolingDown',
        'coolingDownForTarget',
        'atCapacity',
      ]),
    );
    const refs = JSON.stringify(doc).match(/#\/components\/schemas\/\w+/g) ?? [];
    for (const r of refs) expect(doc.components.schemas[r.split('/').pop()!], r).toBeDefined();
  });
});

describe('typed client', () => {
  it('lists, leases, renews, reports and releases; errors are typed', async () => {
    const s = await setup({ proxies: [info('a', { maxLeases: 1 })] });
    const client = new DiscoveryClient({ baseUrl: `${s.server.url}/`, token: TOKEN });
    const g = await client.lease({ target: 'shop.example', ttlSeconds: 30 });
    expect(g.proxy.url).toBe('http://user:hunter2@127.0.0.1:3128');
    const err = await client.lease().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NoneLeasableError);
    expect((err as NoneLeasableError).counts).toMatchObject({ matching: 1, atCapacity: 1 });
    expect((await client.renew(g.id, 60)).id).toBe(g.id);
    expect((await client.listProxies({ target: 'shop.example' }))[0]).toMatchObject({
      name: 'a',
      activeLeases: 1,
    });
    expect(await client.report(g.id, { result: 'blocked' })).toEqual({ id: g.id, released: true });
    await expect(client.renew(g.id)).rejects.toBeInstanceOf(LeaseNotFoundError);
    await client.release(g.id);
    const bad = await client.lease({ ttlSeconds: 0 }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(DiscoveryError);
    expect((bad as DiscoveryError).field).toBe('ttlSeconds');
    const unauth = await new DiscoveryClient({ baseUrl: s.server.url })
      .listProxies()
      .catch((e: unknown) => e);
    expect((unauth as DiscoveryError).status).toBe(401);
  });

  it('lists the fleet a page at a time and returns all of it, in order', async () => {
    const names = ['e', 'a', 'd', 'c', 'b', 'f', 'g'];
    const s = await setup({
      proxies: names.map((n, i) => info(n, { labels: { pool: i % 2 ? 'odd' : 'even' } })),
    });
    const asked: string[] = [];
    const client = new DiscoveryClient({
      baseUrl: s.server.url,
      token: TOKEN,
      fetch: (url, init) => {
        asked.push(new URL(String(url)).search);
        return fetch(url, init);
      },
    });
    const all = await client.listProxies({}, { pageSize: 3 });
    expect(all.map((p) => p.name)).toEqual([...names].sort());
    expect(asked).toEqual(['?limit=3', '?limit=3&continue=crawl%2Fc', '?limit=3&continue=crawl%2Ff']);
    asked.length = 0;
    const odd = await client.listProxies({ selector: 'pool=odd' }, { pageSize: 2 });
    expect(odd.map((p) => p.name)).toEqual(['a', 'c', 'f']);
    expect(asked).toHaveLength(2);
    // By default a page is LIST_PAGE_SIZE proxies: this fleet is one page.
    asked.length = 0;
    expect(await client.listProxies()).toHaveLength(names.length);
    expect(asked).toEqual([`?limit=${LIST_PAGE_SIZE}`]);
  });
});

describe('concurrency', () => {
  it('200 concurrent lease requests never exceed any proxy capacity', async () => {
    const proxies = Array.from({ length: 20 }, (_, i) =>
      info(`p${String(i).padStart(2, '0')}`, { maxLeases: 1 + (i % 3) }),
    );
    const capacity = proxies.reduce((n, p) => n + p.maxLeases, 0);
    const s = await setup({ proxies });
    const client = new DiscoveryClient({ baseUrl: s.server.url, token: TOKEN });
    for (let round = 0; round < 4; round++) {
      const results = await Promise.allSettled(
        Array.from({ length: 200 }, () => client.lease({ ttlSeconds: 60 })),
      );
      const granted = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
      const refused = results.filter((r) => r.status === 'rejected' && r.reason instanceof NoneLeasableError);
      expect(granted.length).toBe(capacity);
      expect(refused.length).toBe(200 - capacity);
      const perProxy = new Map<string, number>();
      for (const g of granted) perProxy.set(g.proxy.name, (perProxy.get(g.proxy.name) ?? 0) + 1);
      for (const p of proxies) expect(perProxy.get(p.name) ?? 0).toBe(p.maxLeases);
      expect(new Set(granted.map((g) => g.id)).size).toBe(granted.length);
      await Promise.all(granted.map((g) => client.release(g.id)));
      expect(s.leases.activeLeases()).toBe(0);
    }
  });
});

describe('sameSecret', () => {
  it('accepts only the exact token', () => {
    expect(sameSecret('s3cret-token', 's3cret-token')).toBe(true);
    for (const given of [
      '',
      's3cret-toke',
      's3cret-tokenn',
      'S3cret-token',
      's3cret-tokeN',
      '\u0000'.repeat(12),
    ])
      expect(sameSecret(given, 's3cret-token'), JSON.stringify(given)).toBe(false);
  });
});
