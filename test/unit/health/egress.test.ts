/**
 * The egress-IP check over real loopback: authenticated local forward proxies whose tunnels
 * leave from distinct loopback source addresses (127.0.0.2, .3, …, standing in for distinct
 * egress IPs), and a real "what is my IP" origin (TLS with a test CA, or plain HTTP) that
 * answers the remote address it sees, as plain text or JSON. Memory store, FakeClock.
 */
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import net, { type AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { CONDITION_HEALTHY, CONDITION_PROVISIONED } from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import {
  countDuplicates,
  EgressIpChecker,
  type EgressIpCheckerOptions,
  parseEgressAnswer,
} from '../../../src/health/egress.ts';
import { scheduleOffset } from '../../../src/health/policy.ts';
import { createLogger, type Logger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { createMemoryStore, type MemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { closedPort, testPki } from '../../support/origins.ts';

const NS = 'crawl';
const USER = 'crawler';
const PASS = 's3cret-Pa55word';
const PASS_B64 = Buffer.from(`${USER}:${PASS}`).toString('base64');

let ca: string;
beforeAll(() => {
  ca = testPki().caCert;
});

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

type Mode = 'plain' | 'json-ip' | 'json-origin' | 'json-address' | 'garbage' | 'error' | 'hang';

/** A "what is my IP" service: answers the TCP peer address it sees, in the current `mode`. */
interface IpOrigin {
  url: string;
  mode: Mode;
  /** Remote addresses of the requests seen, in order, with the fake time they arrived at. */
  seen: Array<{ from: string; at: number }>;
}

async function startIpOrigin(tls: boolean, clock?: FakeClock): Promise<IpOrigin> {
  const origin: IpOrigin = { url: '', mode: 'plain', seen: [] };
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    const from = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
    origin.seen.push({ from, at: clock?.now() ?? 0 });
    res.setHeader('Connection', 'close');
    switch (origin.mode) {
      case 'plain':
        res.setHeader('Content-Type', 'text/plain');
        return res.end(`${from}\n`);
      case 'json-ip':
        res.setHeader('Content-Type', 'application/json');
        return res.end(JSON.stringify({ ip: from }));
      case 'json-origin':
        // httpbin /ip behind its own load balancer: the last entry is what its edge saw.
        return res.end(JSON.stringify({ origin: `198.51.100.9, ${from}` }));
      case 'json-address':
        // Chunked on purpose (no Content-Length): the client must decode it.
        res.write('{"addr');
        return res.end(`ess": "${from}"}`);
      case 'garbage':
        return res.end('<html>rate limited</html>');
      case 'hang':
        return; // never answers: the check must give up on its own
      case 'error':
        res.statusCode = 503;
        return res.end('busy');
    }
  };
  const server = tls
    ? createHttpsServer({ cert: testPki().cert, key: testPki().key }, handler)
    : createHttpServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  origin.url = `${tls ? 'https' : 'http'}://127.0.0.1:${port}/ip`;
  cleanups.push(
    () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  );
  return origin;
}

const ALL_PORTS = Array.from({ length: 65535 }, (_, i) => i + 1);

/** A real authenticated forward proxy whose tunnels leave from `egress.address`. */
async function startProxy(address: string): Promise<{ proxy: ForwardProxy; egress: { address: string } }> {
  const egress = { address };
  const proxy = new ForwardProxy({
    credentials: { username: USER, password: PASS },
    log: createLogger({ level: 'silent', pretty: false }),
    dial: (host, port) => net.connect({ host, port, localAddress: egress.address, allowHalfOpen: true }),
    // The "what is my IP" origins are on loopback: an egress policy that opens everything.
    egress: new EgressGuard({ deniedCIDRs: [], connectPorts: ALL_PORTS, httpPorts: ALL_PORTS }),
  });
  await proxy.listen(0, '127.0.0.1');
  cleanups.push(() => proxy.close());
  return { proxy, egress };
}

function seedManaged(
  store: MemoryStore,
  name: string,
  port: number,
  opts: { password?: string; secret?: boolean; egressIP?: string } = {},
): ProxyObject {
  if (opts.secret !== false) {
    store.seedSecret({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: `${name}-auth`, namespace: NS },
      stringData: { username: USER, password: opts.password ?? PASS },
    });
  }
  return store.seedProxy({
    metadata: { name, namespace: NS },
    spec: { provider: 'local' },
    status: {
      phase: 'Ready',
      address: '127.0.0.1',
      port,
      url: `http://127.0.0.1:${port}`,
      health: { latencyMillis: 12 },
      ...(opts.egressIP ? { egressIP: opts.egressIP } : {}),
      conditions: [
        {
          type: CONDITION_PROVISIONED,
          status: 'True',
          reason: 'InstanceRunning',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
        {
          type: CONDITION_HEALTHY,
          status: 'True',
          reason: 'ProbeSucceeded',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
      ],
    },
  });
}

function captureLogs(): { log: Logger; text: () => string; lines: () => Array<Record<string, unknown>> } {
  const chunks: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      chunks.push(String(chunk));
      cb();
    },
  });
  const log = createLogger({ pretty: false, destination, level: 'debug' });
  const text = () => chunks.join('');
  return {
    log,
    text,
    lines: () =>
      text()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

interface Rig {
  store: MemoryStore;
  checker: EgressIpChecker;
  registry: Registry;
  logs: ReturnType<typeof captureLogs>;
  clock: FakeClock;
  writes: () => number;
}

function rig(url: string, extra: Partial<EgressIpCheckerOptions> = {}, store = createMemoryStore()): Rig {
  const clock = (extra.clock as FakeClock | undefined) ?? new FakeClock();
  const registry = new Registry();
  const logs = captureLogs();
  const spy = vi.spyOn(store.proxies, 'patchStatus');
  const checker = new EgressIpChecker({
    store,
    url,
    clock,
    registry,
    log: logs.log,
    ca,
    timeoutMs: 3000,
    ...extra,
  });
  return { store, checker, registry, logs, clock, writes: () => spy.mock.calls.length };
}

const status = (store: MemoryStore, name: string) => store.proxies.get({ namespace: NS, name })?.status;
const signal = () => new AbortController().signal;

async function metric(registry: Registry, name: string, labels = ''): Promise<number | undefined> {
  const text = await registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

function noSecretsIn(text: string): void {
  expect(text).not.toContain(PASS);
  expect(text).not.toContain(PASS_B64);
}

describe('parseEgressAnswer', () => {
  it('accepts plain text and the JSON shapes of common IP services, nothing else', () => {
    expect(parseEgressAnswer('203.0.113.7\n')).toBe('203.0.113.7');
    expect(parseEgressAnswer('2001:DB8::1')).toBe('2001:db8::1');
    expect(parseEgressAnswer('::ffff:203.0.113.7')).toBe('203.0.113.7');
    expect(parseEgressAnswer('{"ip":"203.0.113.7"}')).toBe('203.0.113.7');
    expect(parseEgressAnswer('{"origin":"10.0.0.1, 203.0.113.7"}')).toBe('203.0.113.7');
    expect(parseEgressAnswer('{"address":"203.0.113.7"}')).toBe('203.0.113.7');
    expect(parseEgressAnswer('')).toBeUndefined();
    expect(parseEgressAnswer('203.0.113.7 extra')).toBeUndefined();
    expect(parseEgressAnswer('<html>203.0.113.7</html>')).toBeUndefined();
    expect(parseEgressAnswer('{"ip": 7}')).toBeUndefined();
    expect(parseEgressAnswer('{"ip": "999.1.1.1"}')).toBeUndefined();
    expect(parseEgressAnswer('{broken')).toBeUndefined();
  });

  it('counts every proxy that shares its IP with another', () => {
    expect(countDuplicates(['a', 'b', 'c'])).toBe(0);
    expect(countDuplicates(['a', 'a', 'b', 'c', 'c', 'c'])).toBe(5);
  });
});

describe('EgressIpChecker options', () => {
  it('rejects bad options with an error naming the field', () => {
    const store = createMemoryStore();
    expect(() => new EgressIpChecker({ store, url: 'ftp://x/ip' })).toThrow(/--egress-ip-url: scheme/);
    expect(() => new EgressIpChecker({ store, url: 'not a url' })).toThrow(/--egress-ip-url/);
    expect(() => new EgressIpChecker({ store, url: 'https://x/ip', intervalMs: 0 })).toThrow(/intervalMs/);
    expect(() => new EgressIpChecker({ store, url: 'https://x/ip', concurrency: 0 })).toThrow(/concurrency/);
    expect(() => new EgressIpChecker({ store, url: 'https://x/ip', timeoutMs: -1 })).toThrow(/timeoutMs/);
  });
});

describe('EgressIpChecker through real forward proxies', () => {
  it('publishes each proxy egress IP (https: CONNECT + verified TLS) and touches nothing else', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.2');
    const b = await startProxy('127.0.0.3');
    const r = rig(origin.url);
    const before = seedManaged(r.store, 'a', a.proxy.port);
    seedManaged(r.store, 'b', b.proxy.port);

    const summary = await r.checker.checkOnce(signal());
    expect(summary).toMatchObject({ ok: 2, failed: 0, badAnswer: 0, written: 2 });
    expect(status(r.store, 'a')?.egressIP).toBe('127.0.0.2');
    expect(status(r.store, 'b')?.egressIP).toBe('127.0.0.3');
    const { egressIP: _ignored, ...rest } = status(r.store, 'a') ?? {};
    expect(rest).toEqual(before.status);
    expect(await metric(r.registry, 'proxy_operator_egress_ip_checks_total', '{result="ok"}')).toBe(2);
    expect(await metric(r.registry, 'proxy_operator_egress_ip_duplicates')).toBe(0);
    expect(r.logs.lines().filter((l) => l.msg === 'proxy egress IP changed')).toHaveLength(2);
    noSecretsIn(r.logs.text());
  });

  it('writes only on change, logs the change, and warns once when two proxies share an IP', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.2');
    const b = await startProxy('127.0.0.3');
    const r = rig(origin.url);
    seedManaged(r.store, 'a', a.proxy.port);
    seedManaged(r.store, 'b', b.proxy.port);
    await r.checker.checkOnce(signal());
    expect(r.writes()).toBe(2);

    // Same answers: no status writes at all.
    await r.checker.checkOnce(signal());
    expect(r.writes()).toBe(2);

    // a's exit moves: exactly one write, logged with old and new.
    a.egress.address = '127.0.0.4';
    await r.checker.checkOnce(signal());
    expect(r.writes()).toBe(3);
    expect(status(r.store, 'a')?.egressIP).toBe('127.0.0.4');
    expect(r.logs.lines()).toContainEqual(
      expect.objectContaining({
        msg: 'proxy egress IP changed',
        proxy: `${NS}/a`,
        egressIP: '127.0.0.4',
        previous: '127.0.0.2',
      }),
    );

    // b ends up behind the same exit (a NAT surprise): one warning naming the other proxy.
    b.egress.address = '127.0.0.4';
    await r.checker.checkOnce(signal());
    expect(status(r.store, 'b')?.egressIP).toBe('127.0.0.4');
    const dupWarnings = () => r.logs.lines().filter((l) => String(l.msg).startsWith('egress IP shared'));
    expect(dupWarnings()).toHaveLength(1);
    expect(dupWarnings()[0]).toMatchObject({ level: 40, proxy: `${NS}/b`, sharedWith: [`${NS}/a`] });
    expect(await metric(r.registry, 'proxy_operator_egress_ip_duplicates')).toBe(2);

    // Still shared on the next rounds: no repeated warning, no writes.
    const writes = r.writes();
    await r.checker.checkOnce(signal());
    await r.checker.checkOnce(signal());
    expect(dupWarnings()).toHaveLength(1);
    expect(r.writes()).toBe(writes);
    noSecretsIn(r.logs.text());
  });

  it('reads plain http answers in JSON (ip / origin / chunked address) via absolute-form GET', async () => {
    const origin = await startIpOrigin(false);
    const a = await startProxy('127.0.0.2');
    const r = rig(origin.url);
    seedManaged(r.store, 'a', a.proxy.port);
    for (const mode of ['json-ip', 'json-origin', 'json-address'] as const) {
      origin.mode = mode;
      const s = await r.checker.checkOnce(signal());
      expect(s, mode).toMatchObject({ ok: 1, badAnswer: 0, failed: 0 });
      // Absolute-form requests leave through the proxy's dial too (to the address its egress
      // policy checked), so they leave from the same address as tunnels.
      expect(status(r.store, 'a')?.egressIP, mode).toBe('127.0.0.2');
    }
    expect(r.writes()).toBe(1);
  });

  it('checks External proxies with their credentialsSecretRef', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.5');
    const r = rig(origin.url);
    r.store.seedSecret({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'ext-creds', namespace: NS },
      stringData: { username: USER, password: PASS },
    });
    r.store.seedProxy({
      metadata: { name: 'ext', namespace: NS },
      spec: {
        type: 'External',
        endpoint: { host: '127.0.0.1', port: a.proxy.port },
        credentialsSecretRef: { name: 'ext-creds' },
      },
    });
    await r.checker.checkOnce(signal());
    expect(status(r.store, 'ext')?.egressIP).toBe('127.0.0.5');
  });

  it('a bad answer or an origin error never clobbers a good IP and is counted', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.2');
    const r = rig(origin.url);
    seedManaged(r.store, 'a', a.proxy.port);
    await r.checker.checkOnce(signal());
    expect(status(r.store, 'a')?.egressIP).toBe('127.0.0.2');

    origin.mode = 'garbage';
    expect(await r.checker.checkOnce(signal())).toMatchObject({ ok: 0, badAnswer: 1 });
    origin.mode = 'error';
    expect(await r.checker.checkOnce(signal())).toMatchObject({ ok: 0, failed: 1 });
    expect(status(r.store, 'a')?.egressIP).toBe('127.0.0.2');
    expect(r.writes()).toBe(1);
    expect(await metric(r.registry, 'proxy_operator_egress_ip_checks_total', '{result="bad_answer"}')).toBe(
      1,
    );
    expect(await metric(r.registry, 'proxy_operator_egress_ip_checks_total', '{result="failed"}')).toBe(1);
  });

  it('counts a dead proxy and wrong credentials (407) as failed, skips Managed without a Secret', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.2');
    const r = rig(origin.url);
    seedManaged(r.store, 'dead', await closedPort());
    seedManaged(r.store, 'wrong', a.proxy.port, { password: 'not-the-password' });
    seedManaged(r.store, 'nosecret', a.proxy.port, { secret: false });

    const s = await r.checker.checkOnce(signal());
    expect(s).toMatchObject({ ok: 0, failed: 2, skipped: 1, written: 0 });
    expect(origin.seen).toHaveLength(0);
    for (const n of ['dead', 'wrong', 'nosecret']) expect(status(r.store, n)?.egressIP).toBeUndefined();
    expect(await metric(r.registry, 'proxy_operator_egress_ip_checks_total', '{result="failed"}')).toBe(2);
    const messages = r.logs
      .lines()
      .filter((l) => l.result === 'failed')
      .map((l) => JSON.stringify(l.err));
    expect(messages.some((m) => m.includes('407'))).toBe(true);
    expect(messages.some((m) => m.includes('ECONNREFUSED'))).toBe(true);
    noSecretsIn(r.logs.text());
    noSecretsIn('not-the-password');
    expect(r.logs.text()).not.toContain('not-the-password');
  });

  it('gives up on a silent origin within the timeout and on abort, leaving no sockets open', async () => {
    const origin = await startIpOrigin(true);
    origin.mode = 'hang';
    const a = await startProxy('127.0.0.2');
    const r = rig(origin.url, { timeoutMs: 300 });
    seedManaged(r.store, 'a', a.proxy.port);
    const t0 = performance.now();
    expect(await r.checker.checkOnce(signal())).toMatchObject({ failed: 1 });
    expect(performance.now() - t0).toBeLessThan(2500);
    await vi.waitFor(() => expect(a.proxy.openSockets).toBe(0));

    const slow = rig(origin.url, { timeoutMs: 60_000 }, r.store);
    const ac = new AbortController();
    const pending = slow.checker.checkOnce(ac.signal);
    await vi.waitFor(() => expect(origin.seen.length).toBe(2));
    const t1 = performance.now();
    ac.abort();
    await pending;
    expect(performance.now() - t1).toBeLessThan(2000);
    await vi.waitFor(() => expect(a.proxy.openSockets).toBe(0));
    expect(status(r.store, 'a')?.egressIP).toBeUndefined();
  });

  it('a Conflict re-reads and retries without clobbering the other writer', async () => {
    const origin = await startIpOrigin(true);
    const a = await startProxy('127.0.0.2');
    const store = createMemoryStore();
    seedManaged(store, 'a', a.proxy.port);
    // Another status writer (the health engine) lands between our read and our write.
    const real = store.proxies.patchStatus.bind(store.proxies);
    let interfered = false;
    vi.spyOn(store.proxies, 'patchStatus').mockImplementation(async (key, patch, opts) => {
      if (!interfered) {
        interfered = true;
        await real(key, { health: { latencyMillis: 99 } });
      }
      return real(key, patch, opts);
    });
    const r = rig(origin.url, {}, store);
    await r.checker.checkOnce(signal());
    expect(status(store, 'a')?.egressIP).toBe('127.0.0.2');
    expect(status(store, 'a')?.health?.latencyMillis).toBe(99);
    expect(r.writes()).toBe(2); // the conflicting attempt and the retry
  });

  it('run() spreads checks over the interval, once per proxy per interval, reacts to new and moved proxies, stops on abort', async () => {
    const clock = new FakeClock(); // starts on an interval boundary
    const origin = await startIpOrigin(true, clock);
    const intervalMs = 60_000;
    const names = ['a', 'b', 'c'];
    const offsets = new Map<string, number>();
    const byAddress = new Map<string, string>();
    const r = rig(origin.url, { clock, intervalMs });
    for (const [i, name] of names.entries()) {
      const p = await startProxy(`127.0.0.${i + 2}`);
      // Already published (by an earlier leader): re-checked at the proxy's own slot.
      const obj = seedManaged(r.store, name, p.proxy.port, { egressIP: '192.0.2.1' });
      offsets.set(name, scheduleOffset(obj.metadata.uid ?? '', intervalMs));
      byAddress.set(`127.0.0.${i + 2}`, name);
    }
    const ac = new AbortController();
    const start = clock.now();
    const done = r.checker.run(ac.signal);
    const step = async (ms: number) => {
      const settle = async () => {
        for (let i = 0; i < 5; i++) await new Promise<void>((res) => setImmediate(res));
      };
      for (let t = 0; t < ms; t += 1000) {
        await settle(); // watch events are delivered asynchronously
        clock.advance(1000);
        await settle();
        // Real I/O: let launched checks finish before fake time moves on.
        await vi.waitFor(() => expect(r.checker.inFlight).toBe(0));
      }
    };
    await step(2 * intervalMs);
    await vi.waitFor(() => expect(origin.seen).toHaveLength(6));
    for (const name of names) {
      const times = origin.seen.filter((s) => byAddress.get(s.from) === name).map((s) => s.at - start);
      expect(times, name).toHaveLength(2);
      const offset = offsets.get(name) ?? 0;
      // Not before its slot; next one an interval later (1 s scheduler granularity).
      expect(times[0], name).toBeGreaterThanOrEqual(offset);
      expect(times[0], name).toBeLessThan(offset + 2000);
      expect(times[1], name).toBeGreaterThanOrEqual(offset + intervalMs);
      expect(times[1], name).toBeLessThan(offset + intervalMs + 2000);
    }
    await vi.waitFor(() => expect(status(r.store, 'c')?.egressIP).toBe('127.0.0.4'));

    // The instance behind 'a' is replaced (new address): checked at the next tick, not a
    // whole interval later, because its published IP is now stale.
    const replacement = await startProxy('127.0.0.9');
    await r.store.proxies.patchStatus({ namespace: NS, name: 'a' }, { phase: 'Provisioning' });
    await step(2000);
    await r.store.proxies.patchStatus(
      { namespace: NS, name: 'a' },
      { phase: 'Ready', port: replacement.proxy.port },
    );
    await step(2000);
    expect(status(r.store, 'a')?.egressIP).toBe('127.0.0.9');

    // A new proxy with nothing published yet is checked within a tick, not at its slot.
    const fresh = await startProxy('127.0.0.10');
    seedManaged(r.store, 'fresh', fresh.proxy.port);
    await step(1000);
    expect(status(r.store, 'fresh')?.egressIP).toBe('127.0.0.10');

    const t0 = performance.now();
    ac.abort();
    await done;
    expect(performance.now() - t0).toBeLessThan(1000);
  });
});
