/**
 * test/support/store-contract — the ObjectStore contract every backend must pass (memory,
 * embedded standalone, Kubernetes via client-node against the REST test server and against a
 * real kube-apiserver). It checks exactly the semantics the reconciler, health engine and GC rely
 * on; backends whose cache lags writes are fine, the cache assertions wait for it.
 */
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { FINALIZER, LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../src/api/constants.ts';
import type { Condition, Secret } from '../../src/api/meta.ts';
import type { ProviderHealth } from '../../src/api/providerhealth.ts';
import type { ProxyObject } from '../../src/api/proxy.ts';
import {
  isConflict,
  isNotFound,
  type ObjectStore,
  StoreError,
  type WatchEvent,
} from '../../src/runtime/store.ts';
import { seededRandom } from './random.ts';

export interface ContractStore {
  store: ObjectStore;
  cleanup: () => Promise<void>;
}

export interface ContractOptions {
  /** Max wait for a cache to catch up with a write (default 5 s). */
  cacheTimeoutMs?: number;
}

async function expectStoreError(p: Promise<unknown>, reason: string): Promise<StoreError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(StoreError);
    expect((e as StoreError).reason).toBe(reason);
    return e as StoreError;
  }
  throw new Error(`expected a ${reason} StoreError`);
}

const rnd = () => randomBytes(3).toString('hex');

export function proxyFixture(
  namespace: string,
  name: string,
  labels: Record<string, string> = {},
): ProxyObject {
  return {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: { name, namespace, labels },
    spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 } },
  };
}

function condition(type: string, status: 'True' | 'False', reason: string): Condition {
  return { type, status, reason, lastTransitionTime: '2026-01-01T00:00:00Z' };
}

/**
 * What a test will write to: `namespaces` lists every namespace it uses, so a backend that
 * requires namespaces to exist (a real API server answers NotFound otherwise) creates them.
 */
export interface ContractContext {
  namespaces: string[];
}

/** Registers the contract tests for one backend. `makeStore` is called once per test. */
export function runStoreContract(
  name: string,
  makeStore: (ctx: ContractContext) => Promise<ContractStore>,
  opts: ContractOptions = {},
): void {
  const cache = { timeout: opts.cacheTimeoutMs ?? 5000, interval: 10 };
  describe(`ObjectStore contract: ${name}`, () => {
    let current: ContractStore | undefined;
    const open = async (): Promise<{ store: ObjectStore; ns: string }> => {
      const ns = `ns-${rnd()}`;
      current = await makeStore({ namespaces: [ns, `${ns}-other`] });
      return { store: current.store, ns };
    };
    afterEach(async () => {
      await current?.cleanup();
      current = undefined;
    });

    it('creates, reads, gets from cache and lists with selector and namespace', async () => {
      const { store, ns } = await open();
      const a = await store.proxies.create(proxyFixture(ns, 'a', { pool: 'eu' }));
      await store.proxies.create(proxyFixture(ns, 'b', { pool: 'us' }));
      await store.proxies.create(proxyFixture(`${ns}-other`, 'c', { pool: 'eu' }));
      expect(a.metadata.uid).toBeTruthy();
      expect(a.metadata.resourceVersion).toMatch(/^\d+$/);
      expect(a.metadata.generation).toBe(1);
      expect((await store.proxies.read({ namespace: ns, name: 'a' })).metadata.uid).toBe(a.metadata.uid);
      await vi.waitFor(
        () => expect(store.proxies.get({ namespace: ns, name: 'a' })?.metadata.uid).toBe(a.metadata.uid),
        cache,
      );
      await vi.waitFor(() => {
        const names = (sel?: string, namespace?: string) =>
          store.proxies
            .list({ ...(sel ? { labelSelector: sel } : {}), ...(namespace ? { namespace } : {}) })
            .filter((p) => p.metadata.namespace?.startsWith(ns))
            .map((p) => `${p.metadata.namespace}/${p.metadata.name}`)
            .sort();
        expect(names(undefined, ns)).toEqual([`${ns}/a`, `${ns}/b`]);
        expect(names('pool=eu')).toEqual([`${ns}-other/c`, `${ns}/a`]);
        expect(names('pool in (eu,us)', ns)).toEqual([`${ns}/a`, `${ns}/b`]);
        expect(names('pool!=eu', ns)).toEqual([`${ns}/b`]);
      }, cache);
      await expectStoreError(store.proxies.create(proxyFixture(ns, 'a')), 'AlreadyExists');
    });

    it('returns NotFound for reads and writes of missing objects', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'missing' };
      expect(store.proxies.get(key)).toBeUndefined();
      expect(isNotFound(await store.proxies.read(key).catch((e) => e))).toBe(true);
      await expectStoreError(store.proxies.delete(key), 'NotFound');
      await expectStoreError(store.proxies.patchStatus(key, { phase: 'Ready' }), 'NotFound');
      await expectStoreError(
        store.proxies.update({ ...proxyFixture(ns, 'missing'), metadata: { ...key, resourceVersion: '1' } }),
        'NotFound',
      );
      await expectStoreError(store.providerHealths.read({ name: `missing-${rnd()}` }), 'NotFound');
      await expectStoreError(store.secrets.read(key), 'NotFound');
    });

    it('update conflicts on a stale resourceVersion and ignores status', async () => {
      const { store, ns } = await open();
      const a = await store.proxies.create(proxyFixture(ns, 'a'));
      const b = await store.proxies.update({ ...a, metadata: { ...a.metadata, labels: { x: 'y' } } });
      expect(b.metadata.labels).toEqual({ x: 'y' });
      const stale = await store.proxies
        .update({ ...a, metadata: { ...a.metadata, labels: { x: 'z' } } })
        .catch((e) => e);
      expect(isConflict(stale)).toBe(true);
      const c = await store.proxies.update({ ...b, status: { phase: 'Ready' } });
      expect(c.status?.phase).toBeUndefined();
      expect((await store.proxies.read({ namespace: ns, name: 'a' })).metadata.labels).toEqual({ x: 'y' });
    });

    it('patchStatus merges status, with and without a resourceVersion precondition', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'a' };
      const a = await store.proxies.create(proxyFixture(ns, 'a'));
      const s1 = await store.proxies.patchStatus(key, { phase: 'Provisioning', providerID: 'local/1' });
      expect(s1.status).toMatchObject({ phase: 'Provisioning', providerID: 'local/1' });
      expect(s1.spec).toEqual(a.spec);
      expect(s1.metadata.generation).toBe(1);
      const s2 = await store.proxies.patchStatus(
        key,
        { phase: 'Ready' },
        { resourceVersion: s1.metadata.resourceVersion as string },
      );
      expect(s2.status).toMatchObject({ phase: 'Ready', providerID: 'local/1' });
      const stale = await store.proxies
        .patchStatus(key, { phase: 'Failed' }, { resourceVersion: s1.metadata.resourceVersion as string })
        .catch((e) => e);
      expect(isConflict(stale)).toBe(true);
      expect((await store.proxies.read(key)).status?.phase).toBe('Ready');
      const cleared = await store.proxies.patchStatus(key, { providerID: null });
      expect(cleared.status?.providerID).toBeUndefined();
      const mark = `m${rnd()}`;
      const ph = await store.providerHealths.create({
        apiVersion: 'crawl.example.com/v1alpha1',
        kind: 'ProviderHealth',
        metadata: { name: `prov-${rnd()}`, labels: { 'contract-mark': mark } },
      } as ProviderHealth);
      // The uncached list the provider health monitor cleans up with (no cache behind it).
      const listed = await store.providerHealths.readList({ labelSelector: `contract-mark=${mark}` });
      expect(listed.map((o) => o.metadata.name)).toEqual([ph.metadata.name]);
      expect(await store.providerHealths.readList({ labelSelector: `contract-mark=not-${mark}` })).toEqual(
        [],
      );
      const ph2 = await store.providerHealths.patchStatus(
        { name: ph.metadata.name },
        { targetsReady: '1/1' },
      );
      expect(ph2.status?.targetsReady).toBe('1/1');
      expect(ph2.metadata.namespace).toBeUndefined();
    });

    it('two interleaved status writers that re-read and retry on Conflict lose nothing', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'a' };
      await store.proxies.create(proxyFixture(ns, 'a'));
      let conflicts = 0;
      const random = seededRandom();
      const writer = async (type: string, rounds: number) => {
        for (let i = 0; i < rounds; i++) {
          for (;;) {
            const cur = await store.proxies.read(key);
            await new Promise((r) => setTimeout(r, random() * 3)); // interleaves the writers
            const others = (cur.status?.conditions ?? []).filter((c) => c.type !== type);
            const mine = condition(type, i % 2 ? 'True' : 'False', `Round${i}`);
            try {
              await store.proxies.patchStatus(
                key,
                {
                  conditions: [...others, mine],
                  ...(type === 'Healthy' ? { health: { consecutiveFailures: i } } : { phase: 'Ready' }),
                },
                { resourceVersion: cur.metadata.resourceVersion as string },
              );
              break;
            } catch (e) {
              if (!isConflict(e)) throw e;
              conflicts++;
            }
          }
        }
      };
      await Promise.all([writer('Provisioned', 8), writer('Healthy', 8)]);
      const final = await store.proxies.read(key);
      const byType = Object.fromEntries((final.status?.conditions ?? []).map((c) => [c.type, c.reason]));
      expect(byType).toEqual({ Provisioned: 'Round7', Healthy: 'Round7' });
      expect(final.status?.phase).toBe('Ready');
      expect(final.status?.health?.consecutiveFailures).toBe(7);
      expect(conflicts).toBeGreaterThanOrEqual(0);
    });

    it('bumps generation only on spec changes and when deletion starts', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'a' };
      const a = await store.proxies.create(proxyFixture(ns, 'a'));
      expect(a.metadata.generation).toBe(1);
      const b = await store.proxies.update({ ...a, metadata: { ...a.metadata, annotations: { note: 'x' } } });
      expect(b.metadata.generation).toBe(1);
      const c = await store.proxies.patchStatus(key, { phase: 'Ready' });
      expect(c.metadata.generation).toBe(1);
      const d = await store.proxies.update({ ...c, spec: { ...c.spec, drain: true } });
      expect(d.metadata.generation).toBe(2);
      const same = await store.proxies.update(d);
      expect(same.metadata.resourceVersion).toBe(d.metadata.resourceVersion);
      const e = await store.proxies.addFinalizer(same, FINALIZER);
      expect(e.metadata.generation).toBe(2);
      await store.proxies.delete(key);
      const f = await store.proxies.read(key);
      expect(f.metadata.deletionTimestamp).toBeTruthy();
      expect(f.metadata.generation).toBe(3);
    });

    it('finalizers hold deletion; removing the last one deletes; none can be added while deleting', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'a' };
      const a = await store.proxies.create(proxyFixture(ns, 'a'));
      const withF = await store.proxies.addFinalizer(a, FINALIZER);
      expect(withF.metadata.finalizers).toEqual([FINALIZER]);
      expect(isConflict(await store.proxies.addFinalizer(a, 'other/f').catch((e) => e))).toBe(true);
      expect((await store.proxies.addFinalizer(withF, FINALIZER)).metadata.finalizers).toEqual([FINALIZER]);
      expect(isConflict(await store.proxies.delete(key, { uid: 'not-the-uid' }).catch((e) => e))).toBe(true);
      await store.proxies.delete(key, { uid: a.metadata.uid as string });
      const deleting = await store.proxies.read(key);
      expect(deleting.metadata.deletionTimestamp).toBeTruthy();
      await store.proxies.delete(key);
      expect((await store.proxies.read(key)).metadata.resourceVersion).toBe(
        deleting.metadata.resourceVersion,
      );
      await expectStoreError(store.proxies.addFinalizer(deleting, 'other/f'), 'Invalid');
      const status = await store.proxies.patchStatus(key, { phase: 'Deleting' });
      expect(status.metadata.deletionTimestamp).toBe(deleting.metadata.deletionTimestamp);
      expect(isConflict(await store.proxies.removeFinalizer(deleting, FINALIZER).catch((e) => e))).toBe(true);
      expect(await store.proxies.removeFinalizer(status, FINALIZER)).toBeUndefined();
      await expectStoreError(store.proxies.read(key), 'NotFound');
      await vi.waitFor(() => expect(store.proxies.get(key)).toBeUndefined(), cache);

      const b = await store.proxies.create(proxyFixture(ns, 'b'));
      const kept = await store.proxies.addFinalizer(b, FINALIZER);
      const removed = await store.proxies.removeFinalizer(kept, FINALIZER);
      expect(removed?.metadata.finalizers ?? []).toEqual([]);
      await store.proxies.delete({ namespace: ns, name: 'b' });
      await expectStoreError(store.proxies.read({ namespace: ns, name: 'b' }), 'NotFound');
    });

    it('watch delivers ADDED for existing objects, then MODIFIED and DELETED with old objects', async () => {
      const { store, ns } = await open();
      const key = { namespace: ns, name: 'a' };
      const a = await store.proxies.create(proxyFixture(ns, 'a'));
      await vi.waitFor(() => expect(store.proxies.get(key)).toBeDefined(), cache);
      const events: WatchEvent<ProxyObject>[] = [];
      const unsubscribe = store.proxies.watch((e) => {
        if (e.object.metadata.namespace === ns) events.push(e);
      });
      await vi.waitFor(() => expect(events.map((e) => e.type)).toEqual(['ADDED']), cache);
      const b = await store.proxies.patchStatus(key, { phase: 'Ready' });
      await vi.waitFor(() => expect(events.map((e) => e.type)).toEqual(['ADDED', 'MODIFIED']), cache);
      expect(events[1]?.old?.status?.phase).toBeUndefined();
      expect(events[1]?.object.status?.phase).toBe('Ready');
      await store.proxies.delete(key);
      await vi.waitFor(
        () => expect(events.map((e) => e.type)).toEqual(['ADDED', 'MODIFIED', 'DELETED']),
        cache,
      );
      expect(events[2]?.object.metadata.uid).toBe(a.metadata.uid);
      expect(events[2]?.old?.metadata.resourceVersion).toBe(b.metadata.resourceVersion);
      unsubscribe();
      // A second watcher seeing the later create proves it was delivered; the first must not have.
      const after: string[] = [];
      const stillWatching = store.proxies.watch((e) => {
        if (e.object.metadata.namespace === ns) after.push(e.object.metadata.name as string);
      });
      await store.proxies.create(proxyFixture(ns, 'later'));
      await vi.waitFor(() => expect(after).toContain('later'), cache);
      stillWatching();
      expect(events).toHaveLength(3);
    });

    it('addIndex answers byIndex from the cache, in step with creates, updates and deletes', async () => {
      const { store, ns } = await open();
      const byPool = (p: ProxyObject) => {
        const pool = p.metadata.labels?.pool;
        return pool ? [`${p.metadata.namespace}|${pool}`] : [];
      };
      const names = (pool: string) =>
        store.proxies.byIndex('pool', `${ns}|${pool}`).map((p) => p.metadata.name);
      await store.proxies.create(proxyFixture(ns, 'a', { pool: 'eu' }));
      await vi.waitFor(() => expect(store.proxies.get({ namespace: ns, name: 'a' })).toBeDefined(), cache);
      // Objects cached before the index exists are indexed too.
      store.proxies.addIndex('pool', byPool);
      expect(names('eu')).toEqual(['a']);
      await store.proxies.create(proxyFixture(ns, 'b', { pool: 'eu' }));
      await store.proxies.create(proxyFixture(ns, 'c', { pool: 'us' }));
      await store.proxies.create(proxyFixture(ns, 'd'));
      await vi.waitFor(() => {
        expect(names('eu')).toEqual(['a', 'b']);
        expect(names('us')).toEqual(['c']);
      }, cache);
      const a = await store.proxies.read({ namespace: ns, name: 'a' });
      await store.proxies.update({ ...a, metadata: { ...a.metadata, labels: { pool: 'us' } } });
      await store.proxies.delete({ namespace: ns, name: 'b' });
      await vi.waitFor(() => {
        expect(names('eu')).toEqual([]);
        expect(names('us')).toEqual(['a', 'c']);
        expect(store.proxies.byIndex('pool', `${ns}|us`)[0]?.metadata.labels).toEqual({ pool: 'us' });
      }, cache);
      // One shared index: asking again with the same function is fine, another function is not.
      store.proxies.addIndex('pool', byPool);
      expect(names('us')).toEqual(['a', 'c']);
      expect(() => store.proxies.addIndex('pool', (p) => [p.metadata.name])).toThrow(/pool/);
      expect(() => store.proxies.byIndex('no-such-index', 'x')).toThrow(/no-such-index/);
    });

    it('a throwing watch handler does not stop other handlers or later events', async () => {
      const { store, ns } = await open();
      const seen: string[] = [];
      const u1 = store.proxies.watch(() => {
        throw new Error('handler bug');
      });
      const u2 = store.proxies.watch((e) => {
        if (e.object.metadata.namespace === ns) seen.push(`${e.type}:${e.object.metadata.name}`);
      });
      await store.proxies.create(proxyFixture(ns, 'x'));
      await store.proxies.create(proxyFixture(ns, 'y'));
      await vi.waitFor(() => expect(seen).toEqual(['ADDED:x', 'ADDED:y']), cache);
      u1();
      u2();
    });

    it('caches only labelled Secrets, while read sees any', async () => {
      const { store, ns } = await open();
      const secret = (name: string, labels: Record<string, string>): Secret => ({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name, namespace: ns, labels },
        data: { 'user-data': Buffer.from(`#cloud-config ${name}`).toString('base64') },
      });
      const events: string[] = [];
      const unsubscribe = store.secrets.watch((e) => {
        if (e.object.metadata.namespace === ns) events.push(`${e.type}:${e.object.metadata.name}`);
      });
      await store.secrets.create(secret('init', { [LABEL_CLOUD_INIT_SECRET]: 'true' }));
      await store.secrets.create(secret('creds', { [LABEL_CREDENTIALS_FOR]: 'a' }));
      await store.secrets.create(secret('plain', {}));
      await store.secrets.create(secret('wrong', { [LABEL_CLOUD_INIT_SECRET]: 'false' }));
      await vi.waitFor(() => {
        expect(store.secrets.get({ namespace: ns, name: 'init' })?.data?.['user-data']).toBe(
          Buffer.from('#cloud-config init').toString('base64'),
        );
        expect(store.secrets.get({ namespace: ns, name: 'creds' })).toBeDefined();
      }, cache);
      expect(store.secrets.get({ namespace: ns, name: 'plain' })).toBeUndefined();
      expect(store.secrets.get({ namespace: ns, name: 'wrong' })).toBeUndefined();
      expect((await store.secrets.read({ namespace: ns, name: 'plain' })).data?.['user-data']).toBeTruthy();
      await vi.waitFor(() => expect(events.sort()).toEqual(['ADDED:creds', 'ADDED:init']), cache);
      await store.secrets.delete({ namespace: ns, name: 'init' });
      await store.secrets.delete({ namespace: ns, name: 'plain' });
      await vi.waitFor(() => expect(events).toContain('DELETED:init'), cache);
      expect(events).not.toContain('DELETED:plain');
      await vi.waitFor(
        () => expect(store.secrets.get({ namespace: ns, name: 'init' })).toBeUndefined(),
        cache,
      );
      await expectStoreError(store.secrets.read({ namespace: ns, name: 'init' }), 'NotFound');
      unsubscribe();
    });

    it('synced resolves and start is idempotent', async () => {
      const { store } = await open();
      const ac = new AbortController();
      await store.start(ac.signal);
      await store.start(ac.signal);
      await store.proxies.synced();
      await store.providerHealths.synced();
      await store.secrets.synced();
      ac.abort();
    });
  });
}
