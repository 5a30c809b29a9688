/**
 * A Secret named by `credentialsSecretRef` is the user's, not labelled by them: the reconciler
 * labels it so the store caches and watches it, and rotating its password reconciles the Proxy
 * at once (new spec-hash → a replacement instance) — in cluster mode (client-node against the
 * Kubernetes REST test server) and in standalone mode (the embedded store fed by manifests).
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  API_VERSION,
  CREDENTIALS_FOR_REFERENCED,
  LABEL_CREDENTIALS_FOR,
  PROXY_KIND,
} from '../../../src/api/constants.ts';
import { createProxyReconciler, type ProxyReconciler } from '../../../src/controller/reconciler.ts';
import { instanceName } from '../../../src/provider/naming.ts';
import { specHash } from '../../../src/provider/spechash.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createKubeStore } from '../../../src/runtime/kube/store.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { testOptions } from '../../support/controller/harness.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { startKubeServer } from '../../support/kube-server/index.ts';

const NS = 'crawl';
const INSTALLATION = 'rotation-test';
const WAIT = { timeout: 5000, interval: 10 };
const b64 = (s: string) => Buffer.from(s).toString('base64');

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface World {
  store: ObjectStore;
  fake: FakeProvider;
  rec: ProxyReconciler;
  /** Keys the watch sources enqueued since the last `clear`. */
  queued: Set<string>;
}

function world(store: ObjectStore): World {
  const fake = new FakeProvider({ name: 'fake' });
  const rec = createProxyReconciler({
    store,
    providers: new Map([['fake', fake]]),
    options: testOptions,
    installation: INSTALLATION,
  });
  const queued = new Set<string>();
  const off = rec.watchSources((k) => queued.add(k));
  cleanups.push(async () => off());
  return { store, fake, rec, queued };
}

/** Reconciles until the pass neither fails nor asks to be polled. */
async function settle(w: World, key: string): Promise<void> {
  for (let i = 0; i < 20; i++) {
    try {
      const res = await w.rec.reconcile(key, new AbortController().signal);
      if (!res.requeueAfter) return;
    } catch {
      // retried like the work queue would
    }
  }
  throw new Error(`${key} did not settle`);
}

const expectedName = (uid: string, password: string) =>
  instanceName(
    uid,
    specHash(
      {
        provider: 'fake',
        port: 3128,
        credentials: { username: 'crawler', password },
      },
      INSTALLATION,
    ),
  );

/** The shared scenario: Ready on the first password, label added, rotation → reconcile → replacement. */
async function rotationScenario(w: World, rotate: (password: string) => Promise<void>): Promise<void> {
  const key = `${NS}/eu-1`;
  await vi.waitFor(() => expect(w.store.proxies.get({ namespace: NS, name: 'eu-1' })).toBeDefined(), WAIT);
  await settle(w, key);
  const p = w.store.proxies.get({ namespace: NS, name: 'eu-1' });
  const uid = p?.metadata.uid as string;
  expect(p?.status?.phase).toBe('Ready');
  expect(p?.status?.instanceName).toBe(expectedName(uid, 'first-password'));
  // Labelled, hence cached and watched from now on.
  await vi.waitFor(() => {
    const s = w.store.secrets.get({ namespace: NS, name: 'creds' });
    expect(s?.metadata.labels?.[LABEL_CREDENTIALS_FOR]).toBe(CREDENTIALS_FOR_REFERENCED);
  }, WAIT);

  w.queued.clear();
  await rotate('second-password');
  await vi.waitFor(() => expect(w.queued.has(key)).toBe(true), WAIT);
  await settle(w, key);
  const after = w.store.proxies.get({ namespace: NS, name: 'eu-1' });
  expect(after?.status?.instanceName).toBe(expectedName(uid, 'second-password'));
  expect(w.fake.byName(expectedName(uid, 'second-password'))?.request.credentials.password).toBe(
    'second-password',
  );
  expect(w.fake.byName(expectedName(uid, 'first-password'))).toBeUndefined();
}

describe('rotating an unlabelled credentialsSecretRef Secret', () => {
  it('cluster mode: the Secret is labelled, and a rotation reconciles at once', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    cleanups.push(() => server.stop());
    const secrets = server.resource('secrets');
    secrets.create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'creds', namespace: NS },
      data: { username: b64('crawler'), password: b64('first-password') },
    });
    server.resource('proxies').create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name: 'eu-1', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'creds' } },
    });
    const store = await createKubeStore({
      kubeConfig: server.kubeConfig(),
      reflector: { initialBackoffMs: 20, maxBackoffMs: 200, watchTimeoutSeconds: 20 },
    });
    const ac = new AbortController();
    cleanups.push(async () => {
      ac.abort();
      await store.stop();
    });
    await store.start(ac.signal);
    await store.proxies.synced();
    await store.secrets.synced();

    await rotationScenario(world(store), async (password) => {
      const cur = secrets.get(NS, 'creds');
      if (!cur) throw new Error('secret gone');
      secrets.update({ ...cur, data: { username: b64('crawler'), password: b64(password) } });
    });
  });

  it('standalone: the Secret is labelled, and a rotation in its manifest reconciles at once', async () => {
    const root = await mkdtemp(join(tmpdir(), 'rotation-'));
    cleanups.push(() => rm(root, { recursive: true, force: true }));
    const dir = join(root, 'proxies');
    await mkdir(dir);
    const secretYaml = (password: string) =>
      `apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: ${NS}}\nstringData: {username: crawler, password: ${password}}\n`;
    await writeFile(
      join(dir, 'proxy.yaml'),
      `apiVersion: ${API_VERSION}\nkind: Proxy\nmetadata: {name: eu-1, namespace: ${NS}}\nspec:\n  provider: fake\n  credentialsSecretRef: {name: creds}\n`,
    );
    await writeFile(join(dir, 'secret.yaml'), secretYaml('first-password'));
    const store = await createEmbeddedStore({
      manifests: dir,
      statePath: join(root, 'state.json'),
      rescanIntervalMs: 0,
    });
    cleanups.push(() => store.stop());
    expect(store.manifestErrors()).toEqual([]);

    await rotationScenario(world(store), async (password) => {
      await writeFile(join(dir, 'secret.yaml'), secretYaml(password));
      expect(await store.rescan()).toEqual([]);
    });
  });
});
