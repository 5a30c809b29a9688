import { afterEach, describe, expect, it } from 'vitest';
import { API_VERSION, FINALIZER, PROXY_KIND } from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { LeaseGrant } from '../../../src/lease/types.ts';
import type { Logger } from '../../../src/log/index.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';

const NOW = '2026-01-01T00:00:00Z';
const healthy = [
  { type: 'Healthy', status: 'True' as const, reason: 'ProbeSucceeded', lastTransitionTime: NOW },
];

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

function setup(opts: { log?: Logger; wrap?: (s: ObjectStore) => ObjectStore } = {}) {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const leases = new LeaseStore({ clock });
  const ac = new AbortController();
  const feedStore = opts.wrap ? opts.wrap(store) : store;
  const feed = startLeaseFeed({
    store: feedStore,
    leases,
    signal: ac.signal,
    clock,
    ...(opts.log ? { log: opts.log } : {}),
  });
  cleanups.push(() => {
    ac.abort();
    leases.close();
  });
  return { store, leases, feed, clock };
}

function managed(name: string, over: Partial<ProxyObject['spec']> = {}, labels: Record<string, string> = {}) {
  return {
    metadata: { name, namespace: 'crawl', labels },
    spec: { type: 'Managed' as const, provider: 'local', ...over },
    status: { phase: 'Ready' as const, address: '127.0.0.1', port: 4000, conditions: healthy },
  };
}

function grantOf(leases: LeaseStore, req: Parameters<LeaseStore['lease']>[0] = {}): LeaseGrant | undefined {
  const out = leases.lease(req);
  return out.granted ? out.grant : undefined;
}

describe('lease feed', () => {
  it('publishes a Ready, healthy Managed proxy with its generated credentials', async () => {
    const { store, leases, feed } = setup();
    store.seedSecret({
      metadata: { name: 'eu-1-auth', namespace: 'crawl' },
      stringData: { username: 'crawler', password: 's3cret' },
    });
    store.seedProxy(managed('eu-1', { maxLeases: 1 }, { pool: 'eu' }));
    await feed.idle();
    const g = grantOf(leases, { selector: 'pool=eu' });
    expect(g?.proxy).toEqual({
      namespace: 'crawl',
      name: 'eu-1',
      url: 'http://crawler:s3cret@127.0.0.1:4000',
      host: '127.0.0.1',
      port: 4000,
    });
    expect(grantOf(leases)).toBeUndefined(); // maxLeases from the spec
  });

  it('uses spec.endpoint for External proxies and their credentialsSecretRef', async () => {
    const { store, leases, feed } = setup();
    store.seedSecret({
      metadata: { name: 'ext-creds', namespace: 'crawl' },
      stringData: { username: 'x', password: 'y' },
    });
    store.seedProxy({
      metadata: { name: 'ext', namespace: 'crawl' },
      spec: {
        type: 'External',
        endpoint: { host: '203.0.113.7', port: 8080 },
        credentialsSecretRef: { name: 'ext-creds' },
      },
      status: { phase: 'Ready', conditions: healthy },
    });
    await feed.idle();
    expect(grantOf(leases)?.proxy.url).toBe('http://x:y@203.0.113.7:8080');
  });

  it('follows phase, health, drain, deletion and removal', async () => {
    const { store, leases, feed } = setup();
    const created = store.seedProxy({ ...managed('p'), status: { phase: 'Provisioning' } });
    await feed.idle();
    expect(leases.snapshot()[0]).toMatchObject({ name: 'p', reason: 'NotReady' });

    await store.proxies.patchStatus({ namespace: 'crawl', name: 'p' }, managed('p').status);
    await feed.idle();
    expect(leases.snapshot()[0]).toMatchObject({ leasable: true, host: '127.0.0.1', port: 4000 });

    await store.proxies.patchStatus(
      { namespace: 'crawl', name: 'p' },
      { conditions: [{ ...healthy[0]!, status: 'False', reason: 'ProbeFailed' }] },
    );
    await feed.idle();
    expect(leases.snapshot()[0]).toMatchObject({ reason: 'Unhealthy' });

    await store.proxies.patchStatus({ namespace: 'crawl', name: 'p' }, { conditions: healthy });
    const current = store.proxies.get({ namespace: 'crawl', name: 'p' })!;
    await store.proxies.update({ ...current, spec: { ...current.spec, drain: true } });
    await feed.idle();
    expect(leases.snapshot()[0]).toMatchObject({ reason: 'Draining' });

    const withFinalizer = await store.proxies.addFinalizer(
      store.proxies.get({ namespace: 'crawl', name: 'p' })!,
      FINALIZER,
    );
    await store.proxies.delete({ namespace: 'crawl', name: 'p' });
    await feed.idle();
    expect(leases.snapshot()[0]).toMatchObject({ deleting: true, reason: 'Deleting' });

    await store.proxies.removeFinalizer(store.proxies.get({ namespace: 'crawl', name: 'p' })!, FINALIZER);
    await feed.idle();
    expect(leases.snapshot()).toEqual([]);
    expect(created.metadata.uid).toBe(withFinalizer.metadata.uid);
  });

  it('keeps a proxy leasable through a replacement and follows it to the new address', async () => {
    const { store, leases, feed } = setup();
    store.seedProxy(managed('p'));
    await feed.idle();
    const key = { namespace: 'crawl', name: 'p' };
    await store.proxies.patchStatus(key, { phase: 'Replacing' });
    await feed.idle();
    expect(grantOf(leases)?.proxy).toMatchObject({ host: '127.0.0.1', port: 4000 });
    await store.proxies.patchStatus(key, { phase: 'Ready', address: '127.0.0.2', port: 4001 });
    await feed.idle();
    expect(grantOf(leases)?.proxy).toMatchObject({ host: '127.0.0.2', port: 4001 });
  });

  it('warns about missing credentials only once a Managed proxy serves without them', async () => {
    const { log, lines } = captureLog('debug');
    const { store, feed } = setup({ log });
    const warnings = () => lines.filter((l) => l.level === 40).map((l) => l.proxy);
    // Brand new: the reconciler has not generated the Secret yet. Expected, so only debug.
    store.seedProxy({ ...managed('p'), status: { phase: 'Pending' } });
    await feed.idle();
    expect(warnings()).toEqual([]);
    expect(lines.some((l) => l.level === 20 && l.proxy === 'crawl/p')).toBe(true);

    // Serving without credentials is worth a warning, once.
    await store.proxies.patchStatus({ namespace: 'crawl', name: 'p' }, managed('p').status);
    await feed.idle();
    await store.proxies.patchStatus({ namespace: 'crawl', name: 'p' }, { port: 4001 });
    await feed.idle();
    expect(warnings()).toEqual(['crawl/p']);
  });

  it('re-resolves credentials when the Secret changes', async () => {
    const { store, leases, feed } = setup();
    store.seedProxy(managed('p'));
    await feed.idle();
    expect(grantOf(leases)?.proxy.url).toBe('http://127.0.0.1:4000');
    await store.secrets.create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'p-auth', namespace: 'crawl', labels: { 'crawl.example.com/credentials-for': 'p' } },
      data: {
        username: Buffer.from('u1').toString('base64'),
        password: Buffer.from('pw1').toString('base64'),
      },
    });
    await feed.idle();
    expect(grantOf(leases)?.proxy.url).toBe('http://u1:pw1@127.0.0.1:4000');
  });

  it('retries a failed credentials read after retryMs on the injected clock', async () => {
    let broken = true;
    const { store, leases, feed, clock } = setup({
      wrap: (s) => {
        const secrets = Object.create(s.secrets) as ObjectStore['secrets'];
        secrets.read = async (key, o) => {
          if (broken) throw new Error('read ECONNRESET');
          return s.secrets.read(key, o);
        };
        return { ...s, secrets };
      },
    });
    // Unlabelled, so not cached: the feed has to read it.
    store.seedSecret({
      metadata: { name: 'p-auth', namespace: 'crawl' },
      stringData: { username: 'u', password: 'pw' },
    });
    store.seedProxy(managed('p'));
    await feed.idle();
    expect(leases.snapshot()).toEqual([]);
    broken = false;
    clock.advance(1999);
    await feed.idle();
    expect(leases.snapshot()).toEqual([]);
    clock.advance(1);
    await feed.idle();
    expect(grantOf(leases)?.proxy.url).toBe('http://u:pw@127.0.0.1:4000');
  });

  it('stops following the store when the signal aborts', async () => {
    const { store, leases, feed } = setup();
    cleanups.splice(0).forEach((c) => {
      c();
    });
    store.seedProxy({ ...managed('late'), apiVersion: API_VERSION, kind: PROXY_KIND });
    await feed.idle();
    expect(leases.snapshot()).toEqual([]);
  });
});
