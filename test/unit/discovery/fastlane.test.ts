/**
 * The discovery API's fast lane (grant and release without the framework) answers exactly what
 * the Fastify routes answer: two servers over identical stores and clocks, one with the lane and
 * one without, get the same requests — grants, refusals, every kind of bad request, releases —
 * and must return the same status, the same headers in the same order (Date aside) and the same
 * body (lease ids aside), and count the same metrics. A hook on the framework shows which
 * requests the lane took (it sees every answer the framework gives), so the comparison is not
 * between two framework answers.
 */
import { request } from 'node:http';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import { LeaseStore, type ProxyInfo } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'lane-token-0123456789';
const START = Date.parse('2026-12-03T10:00:00.000Z');
const LEASE_ID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g;

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

interface Side {
  server: DiscoveryServer;
  registry: Registry;
  /** Requests the framework answered, as `METHOD url`. */
  framework: string[];
}

interface Answer {
  status: number;
  headers: string[];
  body: string;
}

async function side(fastLane: boolean, opts: { token?: string; maxActiveLeases?: number }): Promise<Side> {
  const clock = new FakeClock(START);
  const leases = new LeaseStore({ clock, maxActiveLeases: opts.maxActiveLeases });
  const proxies: ProxyInfo[] = ['a', 'b', 'c'].map((n) =>
    proxyInfo(n, {
      labels: { pool: 'eu' },
      host: '127.0.0.1',
      credentials: { username: 'u', password: 'p' },
    }),
  );
  for (const p of proxies) leases.upsertProxy(p);
  const registry = new Registry();
  const framework: string[] = [];
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry,
    fastLane,
    ...(opts.token ? { token: opts.token } : {}),
    extraRoutes: (app) => {
      app.addHook('onResponse', (req, _reply, done) => {
        framework.push(`${req.method} ${req.url}`);
        done();
      });
    },
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return { server, registry, framework };
}

function send(
  base: string,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: string,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { method, headers }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
      });
      res.on('end', () => {
        const raw = res.rawHeaders;
        const pairs: string[] = [];
        for (let i = 0; i < raw.length; i += 2) if (raw[i] !== 'Date') pairs.push(`${raw[i]}: ${raw[i + 1]}`);
        resolve({ status: res.statusCode ?? 0, headers: pairs, body: text });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Sends the same request to both sides; ids in the path are each side's own. */
async function both(
  lane: Side,
  framework: Side,
  method: string,
  path: (side: 'lane' | 'framework') => string,
  headers: Record<string, string>,
  body?: string,
): Promise<[Answer, Answer]> {
  const a = await send(lane.server.url, method, path('lane'), headers, body);
  const b = await send(framework.server.url, method, path('framework'), headers, body);
  return [a, b];
}

const masked = (a: Answer) => ({ ...a, body: a.body.replace(LEASE_ID, '<id>') });

async function counters(registry: Registry): Promise<string[]> {
  const text = await registry.metrics();
  return text
    .split('\n')
    .filter((l) => /^proxy_operator_(discovery|lease)_requests_total\{/.test(l))
    .sort();
}

const json = { 'content-type': 'application/json' };
const auth = { authorization: `Bearer ${TOKEN}` };

describe('discovery fast lane', () => {
  it('answers grants, refusals, bad requests and releases exactly like the routes', async () => {
    const lane = await side(true, { token: TOKEN });
    const framework = await side(false, { token: TOKEN });
    const ids = { lane: [] as string[], framework: [] as string[] };
    const post = (body: string | undefined, headers: Record<string, string> = { ...auth, ...json }) =>
      both(lane, framework, 'POST', () => '/v1/leases', headers, body);

    const cases: Array<[string, Promise<[Answer, Answer]>]> = [];
    const run = async (name: string, p: Promise<[Answer, Answer]>): Promise<[Answer, Answer]> => {
      const pair = await p;
      cases.push([name, Promise.resolve(pair)]);
      expect(masked(pair[0]), name).toEqual(masked(pair[1]));
      return pair;
    };

    const [granted, grantedToo] = await run(
      'grant',
      post(JSON.stringify({ target: 'shop.example', ttlSeconds: 60 })),
    );
    expect(granted.status).toBe(201);
    ids.lane.push(JSON.parse(granted.body).id);
    ids.framework.push(JSON.parse(grantedToo.body).id);
    const [defaults, defaultsToo] = await run('empty body: all defaults', post(''));
    expect(defaults.status).toBe(201);
    ids.lane.push(JSON.parse(defaults.body).id);
    ids.framework.push(JSON.parse(defaultsToo.body).id);
    await run(
      'charset in the content type',
      post('{}', { ...auth, 'content-type': 'application/json; charset=utf-8' }),
    );
    expect((await run('no proxy matches', post(JSON.stringify({ selector: 'pool=us' }))))[0].status).toBe(
      409,
    );
    expect((await run('not JSON', post('{"target":')))[0].status).toBe(400);
    expect((await run('JSON null', post('null')))[0].status).toBe(400);
    expect((await run('an array', post('[]')))[0].status).toBe(400);
    expect((await run('unknown field', post(JSON.stringify({ targte: 'x' }))))[0].status).toBe(400);
    expect((await run('ttl out of range', post(JSON.stringify({ ttlSeconds: -5 }))))[0].status).toBe(400);
    expect((await run('target not a host', post(JSON.stringify({ target: 'a b/c' }))))[0].status).toBe(400);
    expect((await run('bad selector', post(JSON.stringify({ selector: 'pool in (' }))))[0].status).toBe(400);
    // Requests the lane leaves to the framework get the framework's answer on both sides.
    expect((await run('wrong token', post('{}', { authorization: 'Bearer nope', ...json })))[0].status).toBe(
      401,
    );
    expect(
      (await run('lowercase scheme', post('{}', { authorization: `bearer ${TOKEN}`, ...json })))[0].status,
    ).toBe(201);
    expect(
      (await run('not JSON content', post('{}', { ...auth, 'content-type': 'text/plain' })))[0].status,
    ).toBe(415);
    expect((await run('too large', post(JSON.stringify({ target: 'x'.repeat(20_000) }))))[0].status).toBe(
      413,
    );

    for (let i = 0; i < ids.lane.length; i++) {
      const [released] = await run(
        'release',
        both(lane, framework, 'DELETE', (s) => `/v1/leases/${ids[s][i]}`, auth),
      );
      expect(released.status).toBe(204);
    }
    await run(
      'release again (idempotent)',
      both(lane, framework, 'DELETE', (s) => `/v1/leases/${ids[s][0]}`, auth),
    );
    await run(
      'release of an unknown id',
      both(lane, framework, 'DELETE', () => '/v1/leases/no-such-lease', auth),
    );
    await run(
      'release without a token',
      both(lane, framework, 'DELETE', () => '/v1/leases/x', {}),
    );
    await run(
      'percent-encoded id',
      both(lane, framework, 'DELETE', () => '/v1/leases/a%2Fb', auth),
    );

    expect(await counters(lane.registry)).toEqual(await counters(framework.registry));
    // The lane really answered the ordinary ones: the framework on its side saw only the rest.
    expect(lane.framework.filter((r) => r.startsWith('POST'))).toEqual([
      'POST /v1/leases', // wrong token
      'POST /v1/leases', // lowercase scheme
      'POST /v1/leases', // text/plain
      'POST /v1/leases', // too large
    ]);
    expect(lane.framework.filter((r) => r.startsWith('DELETE'))).toEqual([
      'DELETE /v1/leases/x',
      'DELETE /v1/leases/a%2Fb',
    ]);
    expect(framework.framework.length).toBe(cases.length);
  });

  it('answers a full store (503) and serves without a token by the Host rule like the routes', async () => {
    const lane = await side(true, { maxActiveLeases: 1 });
    const framework = await side(false, { maxActiveLeases: 1 });
    const post = (headers: Record<string, string>) =>
      both(lane, framework, 'POST', () => '/v1/leases', { ...json, ...headers }, '{}');
    const [first, firstToo] = await post({});
    expect(masked(first)).toEqual(masked(firstToo));
    expect(first.status).toBe(201);
    const [full, fullToo] = await post({});
    expect(full).toEqual(fullToo);
    expect(full.status).toBe(503);
    const [foreign, foreignToo] = await post({ host: 'attacker.example' });
    expect(foreign).toEqual(foreignToo);
    expect(foreign.status).toBe(403);
    expect(lane.framework).toEqual(['POST /v1/leases']);
    expect(await counters(lane.registry)).toEqual(await counters(framework.registry));
  });
});
