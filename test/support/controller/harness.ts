/**
 * test/support/controller/harness — a reconciler on the memory store and a FakeProvider, with a
 * counter of status writes and a helper that reconciles until nothing is left to do.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { onTestFinished } from 'vitest';
import { API_VERSION, PROXY_KIND } from '../../../src/api/constants.ts';
import type { Secret } from '../../../src/api/meta.ts';
import type { ProxyObject, ProxySpec } from '../../../src/api/proxy.ts';
import {
  createProxyReconciler,
  type ProxyReconciler,
  type ReconcileResult,
  type ReconcilerOptions,
} from '../../../src/controller/reconciler.ts';
import type { Provider } from '../../../src/provider/contract.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { FakeProvider, type FakeProviderOptions } from '../fake-provider.ts';

export const NS = 'crawl';
/** The installation id every harness reconciler runs as, unless a test gives its own. */
export const TEST_INSTALLATION = 'test-installation';

export type Backend = 'memory' | 'embedded';

export interface Harness {
  backend: Backend;
  store: ObjectStore;
  fake: FakeProvider;
  providers: Map<string, Provider>;
  rec: ProxyReconciler;
  registry: Registry;
  statusWrites: () => number;
  reconcile: (name: string) => Promise<ReconcileResult>;
  /** Reconcile, returning the error instead of throwing. */
  attempt: (name: string) => Promise<{ result?: ReconcileResult; error?: unknown }>;
  proxy: (name: string) => ProxyObject | undefined;
  seed: (
    name: string,
    spec?: Partial<ProxySpec>,
    meta?: Partial<ProxyObject['metadata']>,
  ) => Promise<ProxyObject>;
  seedSecret: (s: Secret) => Promise<Secret>;
}

/** A fresh store of the given backend, closed (and its state dir removed) when the test ends. */
export async function createTestStore(backend: Backend): Promise<ObjectStore> {
  if (backend === 'memory') return createMemoryStore();
  const dir = await mkdtemp(join(tmpdir(), 'reconcile-'));
  const store = await createEmbeddedStore({ statePath: join(dir, 'state.json'), rescanIntervalMs: 0 });
  onTestFinished(async () => {
    await store.stop();
    await rm(dir, { recursive: true, force: true });
  });
  return store;
}

/**
 * Options of the tests of the reconciler alone: no health engine runs, so a replacement
 * switches as soon as it is Running (test/unit/controller/lifecycle.test.ts keeps the gate on).
 */
export const testOptions: ReconcilerOptions = {
  healthGate: false,
  provisionPollMs: 10_000,
  deletionPollMs: 5_000,
  quotaBackoffMs: 300_000,
  readyResyncMs: 0,
};

/** Counts patchStatus calls and lets a test run code around store calls. */
export function countingStore(inner: ObjectStore, counter: { writes: number }): ObjectStore {
  const proxies = Object.create(inner.proxies) as ObjectStore['proxies'];
  proxies.patchStatus = (key, status, opts) => {
    counter.writes++;
    return inner.proxies.patchStatus(key, status, opts);
  };
  for (const m of [
    'get',
    'list',
    'read',
    'create',
    'update',
    'delete',
    'addFinalizer',
    'removeFinalizer',
    'watch',
    'synced',
  ] as const) {
    (proxies as unknown as Record<string, unknown>)[m] = (
      inner.proxies[m] as (...a: unknown[]) => unknown
    ).bind(inner.proxies);
  }
  return { ...inner, proxies, start: inner.start.bind(inner), stop: inner.stop.bind(inner) };
}

export async function createHarness(
  opts: {
    backend?: Backend;
    fake?: FakeProviderOptions;
    options?: ReconcilerOptions;
    wrap?: (s: ObjectStore) => ObjectStore;
    deps?: Partial<Parameters<typeof createProxyReconciler>[0]>;
  } = {},
): Promise<Harness> {
  const backend = opts.backend ?? 'memory';
  const store = await createTestStore(backend);
  const fake = new FakeProvider({ name: 'fake', ...opts.fake });
  const providers = new Map<string, Provider>([['fake', fake]]);
  const registry = new Registry();
  const counter = { writes: 0 };
  const counted = countingStore(store, counter);
  const rec = createProxyReconciler({
    store: opts.wrap ? opts.wrap(counted) : counted,
    providers,
    registry,
    options: { ...testOptions, ...opts.options },
    installation: TEST_INSTALLATION,
    ...opts.deps,
  } as Parameters<typeof createProxyReconciler>[0]);
  const reconcile = (name: string) => rec.reconcile(`${NS}/${name}`, new AbortController().signal);
  return {
    backend,
    store,
    fake,
    providers,
    rec,
    registry,
    statusWrites: () => counter.writes,
    reconcile,
    attempt: async (name) => {
      try {
        return { result: await reconcile(name) };
      } catch (error) {
        return { error };
      }
    },
    proxy: (name) => store.proxies.get({ namespace: NS, name }),
    seed: (name, spec = {}, meta = {}) =>
      store.proxies.create({
        apiVersion: API_VERSION,
        kind: PROXY_KIND,
        metadata: { name, namespace: NS, ...meta },
        spec: { provider: 'fake', placement: { zone: 'z1', machineType: 'small' }, ...spec },
      }),
    seedSecret: (s) => store.secrets.create({ apiVersion: 'v1', kind: 'Secret', ...s }),
  };
}

/** Reconcile until it neither errors nor asks to be polled, or `max` rounds; returns rounds used. */
export async function untilQuiet(h: Harness, name: string, max = 20): Promise<number> {
  for (let i = 1; i <= max; i++) {
    const { result, error } = await h.attempt(name);
    if (!error && !result?.requeueAfter) return i;
  }
  throw new Error(`${name} did not settle in ${max} rounds`);
}

export function condition(p: ProxyObject | undefined, type: string) {
  return p?.status?.conditions?.find((c) => c.type === type);
}
