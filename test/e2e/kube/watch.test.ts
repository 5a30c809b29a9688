/**
 * The Kubernetes store's watches against the real API server, on private control planes (the
 * tests compact etcd and restart kube-apiserver):
 *
 * - Compaction. A watch resumed from a resourceVersion etcd has compacted away is answered with
 *   HTTP 200 and one ERROR event, Status 410 Expired ("The resourceVersion for the provided
 *   watch is too old") — when the API server watches etcd directly (`--watch-cache=false`). With
 *   its watch cache (the default) the same resume is served from the cache's memory: compaction
 *   alone causes no 410. Either way the store ends with every create, update, delete and
 *   delete-and-recreate made while its connection was cut, and its consumers see the same events.
 * - Late events. The store applies its own writes before their watch events arrive; events that
 *   arrive late (a lagging watch) never bring back an object it deleted nor drop the object that
 *   replaced one.
 * - Label selectors. A Secret that loses its label is reported DELETED on the selector's watch
 *   and leaves the cache; with the label back it returns as the same object.
 * - Bookmarks. The server sends a BOOKMARK about 2 s before a watch's timeoutSeconds ends (and
 *   about once a minute on longer watches), and only when that resource's revision has moved
 *   past what the watch already covers: it advances the reflector's resourceVersion, the next
 *   watch resumes there without a relist, and no consumer sees an event.
 * - Restart. A restarted API server starts its watch cache at the current revision and answers a
 *   resume from before the restart with 410 ("too old resource version"); the store relists,
 *   writes made while the server is down fail at once (connection refused), and unchanged objects
 *   are not ADDED a second time.
 */
import { readFileSync } from 'node:fs';
import { createServer, connect as netConnect, type Server, type Socket } from 'node:net';
import { resolve } from 'node:path';
import { KubeConfig, Watch } from '@kubernetes/client-node';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET } from '../../../src/api/constants.ts';
import type { Secret } from '../../../src/api/meta.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { createKubeClients } from '../../../src/runtime/kube/client.ts';
import { createKubeStore, type KubeStore, type KubeStoreOptions } from '../../../src/runtime/kube/store.ts';
import { StoreError, type WatchEvent } from '../../../src/runtime/store.ts';
import { proxyFixture } from '../../support/store-contract.ts';
import { until } from '../../support/wait.ts';
import { type ControlPlane, kubectl, startControlPlane } from './support/control-plane.ts';
import { type Rest, rest } from './support/rest.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const GROUP_PATH = '/apis/crawl.example.com/v1alpha1';
/** Generous bound for the store to catch up on a shared, loaded machine. */
const CONVERGE = { timeoutMs: 30_000, intervalMs: 20 };

/**
 * A TCP relay in front of the API server: `cut` drops every connection and refuses new ones;
 * `stall` holds back what the server sends until `resume` (a watch that lags behind writes).
 */
class Relay {
  readonly port: number;
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  private refusing = false;
  private stalled = false;
  private readonly held: Array<[Socket, Buffer]> = [];

  private constructor(server: Server, port: number) {
    this.server = server;
    this.port = port;
  }

  static async start(upstreamPort: number): Promise<Relay> {
    let relay: Relay | undefined;
    const server = createServer((client) => relay?.accept(client, upstreamPort));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    relay = new Relay(server, (server.address() as { port: number }).port);
    return relay;
  }

  private accept(client: Socket, upstreamPort: number): void {
    if (this.refusing) {
      client.destroy();
      return;
    }
    const upstream = netConnect(upstreamPort, '127.0.0.1');
    this.sockets.add(client).add(upstream);
    client.pipe(upstream);
    upstream.on('data', (d: Buffer) => {
      if (this.stalled) this.held.push([client, d]);
      else client.write(d);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
  }

  cut(): void {
    this.refusing = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  open(): void {
    this.refusing = false;
  }

  stall(): void {
    this.stalled = true;
  }

  resume(): void {
    this.stalled = false;
    for (const [socket, data] of this.held.splice(0)) if (!socket.destroyed) socket.write(data);
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

function kubeConfigFor(cp: ControlPlane, server = cp.server): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'e2e', server, caFile: cp.caFile, skipTLSVerify: false }],
    users: [{ name: 'e2e', token: cp.adminToken }],
    contexts: [{ name: 'e2e', cluster: 'e2e', user: 'e2e' }],
    currentContext: 'e2e',
  });
  return kc;
}

function install(cp: ControlPlane): void {
  kubectl(cp, ['apply', '--server-side', '--field-manager=e2e', '-k', resolve(ROOT, 'config/crd')]);
  for (const crd of ['proxies', 'proxypools', 'providerhealths'])
    kubectl(cp, ['wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`]);
}

async function createNamespace(api: Rest, name: string): Promise<void> {
  const r = await api.call('POST', '/api/v1/namespaces', {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: { name },
  });
  if (r.status !== 201) throw new Error(`create namespace ${name}: ${r.status} ${JSON.stringify(r.body)}`);
}

/** Another client's writes, straight to the API server: never through the store or its relay. */
function otherClient(api: Rest, ns: string) {
  const path = (name?: string) => `${GROUP_PATH}/namespaces/${ns}/proxies${name ? `/${name}` : ''}`;
  const ok = (what: string, r: { status: number; body: unknown }) => {
    if (r.status >= 300) throw new Error(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body as ProxyObject;
  };
  return {
    create: async (name: string, labels: Record<string, string> = {}) =>
      ok(`create ${name}`, await api.call('POST', path(), proxyFixture(ns, name, labels))),
    label: async (name: string, labels: Record<string, string>) =>
      ok(
        `label ${name}`,
        await api.call(
          'PATCH',
          path(name),
          { metadata: { labels } },
          { contentType: 'application/merge-patch+json' },
        ),
      ),
    delete: async (name: string) => ok(`delete ${name}`, await api.call('DELETE', path(name))),
  };
}

/**
 * Moves etcd's revision on with a write outside the API server's keys: a watch cache started
 * afterwards lists at a revision newer than anything a client saw before.
 */
async function bumpRevision(cp: ControlPlane): Promise<void> {
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  const r = await fetch(`${cp.etcd}/v3/kv/put`, {
    method: 'POST',
    body: JSON.stringify({ key: b64('/e2e/revision-bump'), value: b64(String(Date.now())) }),
  });
  if (!r.ok) throw new Error(`etcd put: ${r.status} ${await r.text()}`);
}

/** etcd compaction through its v3 JSON gateway; resourceVersions are etcd revisions. */
async function compact(cp: ControlPlane, revision: string): Promise<void> {
  const r = await fetch(`${cp.etcd}/v3/kv/compaction`, {
    method: 'POST',
    body: JSON.stringify({ revision, physical: true }),
  });
  if (!r.ok) throw new Error(`etcd compaction at ${revision}: ${r.status} ${await r.text()}`);
}

const fast: KubeStoreOptions['reflector'] = { initialBackoffMs: 50, maxBackoffMs: 500 };

interface Running {
  store: KubeStore;
  events: WatchEvent<ProxyObject>[];
  stop(): Promise<void>;
}

const running: Running[] = [];
afterEach(async () => {
  for (const r of running.splice(0)) await r.stop();
});

async function startStore(
  ns: string,
  opts: KubeStoreOptions & { closeClients?: () => Promise<void> },
): Promise<Running> {
  const { closeClients, ...storeOpts } = opts;
  const store = await createKubeStore({ reflector: fast, ...storeOpts });
  const events: WatchEvent<ProxyObject>[] = [];
  store.proxies.watch((e) => {
    if (e.object.metadata.namespace === ns) events.push(e);
  });
  const ac = new AbortController();
  await store.start(ac.signal);
  await store.proxies.synced();
  const r = {
    store,
    events,
    stop: async () => {
      ac.abort();
      await store.stop();
      await closeClients?.();
    },
  };
  running.push(r);
  return r;
}

const cached = (store: KubeStore, ns: string) =>
  Object.fromEntries(
    store.proxies
      .list({ namespace: ns })
      .map((p) => [p.metadata.name, { uid: p.metadata.uid, labels: p.metadata.labels ?? {} }]),
  );

const summary = (events: WatchEvent<ProxyObject>[]) =>
  events.map((e) => `${e.type}:${e.object.metadata.name}`);

const proxiesReflector = (store: KubeStore) => {
  const r = store.reflectors.find((x) => x.name === 'proxies');
  if (!r) throw new Error('no proxies reflector');
  return r;
};

/** Whether the store's proxies reflector has followed the stream up to `rv`. */
const reached = (store: KubeStore, rv: string | undefined) =>
  BigInt(proxiesReflector(store).lastSyncResourceVersion() ?? '0') >= BigInt(rv ?? '0');

interface AuditEvent {
  stage: string;
  verb: string;
  requestURI: string;
  objectRef?: { resource?: string; namespace?: string };
  requestReceivedTimestamp: string;
}

function auditEvents(cp: ControlPlane): AuditEvent[] {
  return readFileSync(cp.auditLog, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as AuditEvent);
}

/**
 * While the store's connection is cut: an update, a delete, a create and a delete-and-recreate
 * under the same name, then etcd compacted at the last of them. Returns what the store saw.
 */
async function changesWhileCut(cp: ControlPlane, ns: string) {
  const api = rest(cp.server, cp.adminToken, cp.caFile);
  try {
    await createNamespace(api, ns);
    const other = otherClient(api, ns);
    await other.create('keep');
    await other.create('change', { v: '1' });
    const gone = await other.create('gone');
    const phoenixOld = await other.create('phoenix');
    const relay = await Relay.start(Number(new URL(cp.server).port));
    try {
      const { store, events } = await startStore(ns, {
        kubeConfig: kubeConfigFor(cp, `https://127.0.0.1:${relay.port}`),
      });
      await until('the seeded objects cached', () => Object.keys(cached(store, ns)).length === 4, CONVERGE);
      await until('one ADDED each', () => events.length === 4, CONVERGE);
      const reflector = proxiesReflector(store);
      const before = { ...reflector.stats };
      const rvBeforeCut = reflector.lastSyncResourceVersion();

      relay.cut();
      await other.label('change', { v: '2' });
      await other.delete('gone');
      const created = await other.create('new');
      await other.delete('phoenix');
      const phoenixNew = await other.create('phoenix');
      await compact(cp, phoenixNew.metadata.resourceVersion as string);
      // The resume point is below the compaction: etcd no longer has the changes after it.
      expect(BigInt(rvBeforeCut ?? '0')).toBeLessThan(BigInt(phoenixNew.metadata.resourceVersion as string));
      relay.open();

      await until(
        'the cache has every change made while cut',
        () => {
          const c = cached(store, ns);
          return (
            Object.keys(c).sort().join() === 'change,keep,new,phoenix' &&
            c.change?.labels.v === '2' &&
            c.phoenix?.uid === phoenixNew.metadata.uid &&
            c.new?.uid === created.metadata.uid
          );
        },
        CONVERGE,
      );
      // Everything delivered: the last change (the recreate) is in the event log.
      await until(
        'the events of every change',
        () => events.some((e) => e.type === 'ADDED' && e.object.metadata.uid === phoenixNew.metadata.uid),
        CONVERGE,
      );
      const after = summary(events.slice(4));
      const deletedGone = events.find((e) => e.type === 'DELETED' && e.object.metadata.name === 'gone');
      const modified = events.find((e) => e.type === 'MODIFIED' && e.object.metadata.name === 'change');
      const phoenixDeleted = events.find((e) => e.type === 'DELETED' && e.object.metadata.name === 'phoenix');
      return {
        after,
        stats: { before, after: { ...reflector.stats } },
        checks: {
          goneDeletedUid: deletedGone?.object.metadata.uid === gone.metadata.uid,
          modifiedOld: modified?.old?.metadata.labels?.v,
          modifiedNew: modified?.object.metadata.labels?.v,
          phoenixDeletedUid: phoenixDeleted?.object.metadata.uid === phoenixOld.metadata.uid,
        },
      };
    } finally {
      await relay.stop();
    }
  } finally {
    await api.close();
  }
}

describe('etcd compaction with the watch cache off: 410 Gone and a relist', () => {
  let cp: ControlPlane;
  beforeAll(async () => {
    cp = await startControlPlane({ apiServerArgs: ['--watch-cache=false'] });
    install(cp);
  });
  afterAll(async () => {
    await cp?.stop();
  });

  it('a watch resumed from a compacted resourceVersion relists and misses no create, update or delete', async () => {
    const seen = await changesWhileCut(cp, 'compaction');
    expect(seen.stats.after.relistsOnGone).toBeGreaterThan(seen.stats.before.relistsOnGone);
    expect(seen.stats.after.lists).toBeGreaterThan(seen.stats.before.lists);
    expect(seen.checks).toEqual({
      goneDeletedUid: true,
      modifiedOld: '1',
      modifiedNew: '2',
      phoenixDeletedUid: true,
    });
    // Exactly the changes: nothing for the untouched object; the recreate as the delete it was.
    expect(seen.after.sort()).toEqual(
      ['MODIFIED:change', 'DELETED:gone', 'ADDED:new', 'DELETED:phoenix', 'ADDED:phoenix'].sort(),
    );
  });
});

describe('the default API server (watch cache on)', () => {
  let cp: ControlPlane;
  beforeAll(async () => {
    cp = await startControlPlane();
    install(cp);
  });
  afterAll(async () => {
    await cp?.stop();
  });

  it('after compaction the watch cache answers the resume from memory: no relist, the same events', async () => {
    const seen = await changesWhileCut(cp, 'compaction-cached');
    expect(seen.stats.after.relistsOnGone).toBe(seen.stats.before.relistsOnGone);
    expect(seen.stats.after.lists).toBe(seen.stats.before.lists);
    expect(seen.checks).toEqual({
      goneDeletedUid: true,
      modifiedOld: '1',
      modifiedNew: '2',
      phoenixDeletedUid: true,
    });
    expect(seen.after).toEqual([
      'MODIFIED:change',
      'DELETED:gone',
      'ADDED:new',
      'DELETED:phoenix',
      'ADDED:phoenix',
    ]);
  });
  it('late watch events of objects our own writes deleted or replaced do not bring them back', async () => {
    const ns = 'late-events';
    const api = rest(cp.server, cp.adminToken, cp.caFile);
    const relay = await Relay.start(Number(new URL(cp.server).port));
    try {
      await createNamespace(api, ns);
      // Writes go straight to the server; only the watches pass the relay, so they can lag.
      const clients = await createKubeClients(kubeConfigFor(cp));
      const { store, events } = await startStore(ns, {
        clients: { ...clients, watch: new Watch(kubeConfigFor(cp, `https://127.0.0.1:${relay.port}`)) },
        closeClients: () => clients.close(),
      });
      const x = await store.proxies.create(proxyFixture(ns, 'x'));
      const yOld = await store.proxies.create(proxyFixture(ns, 'y'));
      await until('the watch caught up', () => reached(store, yOld.metadata.resourceVersion), CONVERGE);

      relay.stall();
      await store.proxies.patchStatus({ namespace: ns, name: 'x' }, { phase: 'Ready' });
      await store.proxies.delete({ namespace: ns, name: 'x' });
      await store.proxies.delete({ namespace: ns, name: 'y' });
      const yNew = await store.proxies.create(proxyFixture(ns, 'y'));
      expect(summary(events)).toEqual([
        'ADDED:x',
        'ADDED:y',
        'MODIFIED:x',
        'DELETED:x',
        'DELETED:y',
        'ADDED:y',
      ]);
      relay.resume();

      // The watch now replays x's status write, both deletes and y's create, all after the fact.
      await until(
        'the watch delivered every write',
        () => reached(store, yNew.metadata.resourceVersion),
        CONVERGE,
      );
      expect(summary(events)).toEqual([
        'ADDED:x',
        'ADDED:y',
        'MODIFIED:x',
        'DELETED:x',
        'DELETED:y',
        'ADDED:y',
      ]);
      expect(store.proxies.get({ namespace: ns, name: 'x' })).toBeUndefined();
      expect(store.proxies.get({ namespace: ns, name: 'y' })?.metadata.uid).toBe(yNew.metadata.uid);
      expect(x.metadata.uid).not.toBe(yNew.metadata.uid);
    } finally {
      await relay.stop();
      await api.close();
    }
  });

  it('a Secret leaves and re-enters the label-selected cache as its label goes and comes back', async () => {
    const ns = 'secret-labels';
    const api = rest(cp.server, cp.adminToken, cp.caFile);
    try {
      await createNamespace(api, ns);
      const { store } = await startStore(ns, { kubeConfig: kubeConfigFor(cp) });
      const events: string[] = [];
      store.secrets.watch((e) => {
        if (e.object.metadata.namespace === ns) events.push(`${e.type}:${e.object.metadata.uid}`);
      });
      const path = `/api/v1/namespaces/${ns}/secrets`;
      const label = async (value: string | null) => {
        const r = await api.call(
          'PATCH',
          `${path}/s`,
          { metadata: { labels: { [LABEL_CLOUD_INIT_SECRET]: value } } },
          { contentType: 'application/merge-patch+json' },
        );
        expect(r.status).toBe(200);
      };
      const created = await api.call('POST', path, {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 's', labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
        data: { 'user-data': Buffer.from('#cloud-config').toString('base64') },
      });
      const uid = (created.body as Secret).metadata.uid;
      const key = { namespace: ns, name: 's' };
      await until('the labelled Secret cached', () => store.secrets.get(key), CONVERGE);
      // The server reports a Secret that stops matching the selector as DELETED on that watch.
      await label(null);
      await until('the unlabelled Secret gone from the cache', () => !store.secrets.get(key), CONVERGE);
      // Still the same object: it comes back when the label does.
      await label('true');
      await until('the relabelled Secret cached again', () => store.secrets.get(key), CONVERGE);
      await store.secrets.delete(key);
      expect(store.secrets.get(key)).toBeUndefined();
      await until('its DELETED', () => events.length === 4, CONVERGE);
      expect(events).toEqual([`ADDED:${uid}`, `DELETED:${uid}`, `ADDED:${uid}`, `DELETED:${uid}`]);
    } finally {
      await api.close();
    }
  });

  it('BOOKMARK events advance the resourceVersion the next watch resumes from, and reach no consumer', async () => {
    const ns = 'bookmarks';
    const api = rest(cp.server, cp.adminToken, cp.caFile);
    try {
      await createNamespace(api, ns);
      await createNamespace(api, 'bookmarks-elsewhere');
      await otherClient(api, ns).create('x');
      // The product's own watch timeout (25 s), restricted to one namespace like --proxy-namespace.
      const { store, events } = await startStore(ns, {
        kubeConfig: kubeConfigFor(cp),
        namespace: ns,
        reflector: {},
      });
      await until('x cached', () => events.length === 1, CONVERGE);
      const listed = proxiesReflector(store).lastSyncResourceVersion();
      const watches = (rv: string | undefined) =>
        auditEvents(cp).filter(
          (e) =>
            e.verb === 'watch' &&
            e.stage === 'ResponseStarted' &&
            e.objectRef?.resource === 'proxies' &&
            e.objectRef.namespace === ns &&
            new URL(e.requestURI, cp.server).searchParams.get('resourceVersion') === rv,
        );
      // A bookmark only reports a revision the watch has not covered yet: the change below must
      // come after the server registered the watch, or the watch starts past it.
      const started = await until('the watch from the list', () => watches(listed)[0], CONVERGE);
      // Proxies change outside the watched namespace: the watch has nothing to deliver, but the
      // server's revision for proxies moves on, which is what a bookmark reports.
      const elsewhere = await otherClient(api, 'bookmarks-elsewhere').create('y');
      expect(BigInt(elsewhere.metadata.resourceVersion as string)).toBeGreaterThan(BigInt(listed ?? '0'));
      await until('a bookmark', () => reached(store, elsewhere.metadata.resourceVersion), {
        timeoutMs: 60_000,
        intervalMs: 100,
      });
      const bookmarked = proxiesReflector(store).lastSyncResourceVersion();
      // It came before the 25 s watch ended (and before client-node's 30 s idle abort).
      expect(Date.now() - Date.parse(started.requestReceivedTimestamp)).toBeLessThan(30_000);
      expect(summary(events)).toEqual(['ADDED:x']);
      // The next watch resumes from the bookmark's resourceVersion, without a relist.
      await until('a watch from the bookmarked resourceVersion', () => watches(bookmarked)[0], {
        timeoutMs: 30_000,
        intervalMs: 200,
      });
      expect(summary(events)).toEqual(['ADDED:x']);
      expect(proxiesReflector(store).stats.lists).toBe(1);
    } finally {
      await api.close();
    }
  });

  it('survives an API server restart: writes fail promptly while it is down, no object is ADDED twice', async () => {
    const ns = 'restart';
    const api = rest(cp.server, cp.adminToken, cp.caFile);
    try {
      await createNamespace(api, ns);
      const other = otherClient(api, ns);
      const stable = await other.create('stable');
      await other.create('changing', { v: '1' });
      await other.create('doomed');
      // The product's default reflector tuning: its backoff is what brings the watch back.
      const { store, events } = await startStore(ns, { kubeConfig: kubeConfigFor(cp), reflector: {} });
      await until('seeded objects cached', () => events.length === 3, CONVERGE);
      const reflector = proxiesReflector(store);
      const before = { ...reflector.stats };

      const attempts: Array<{ name: string; ok: boolean; ms: number; err?: unknown }> = [];
      let restarted = false;
      // Without a write while it is down, the new watch cache may list at exactly the revision the
      // reflector last saw, and the resume is (rightly) served without a relist: the bump makes
      // the relist path below certain.
      const restart = cp
        .restartApiServer(() => bumpRevision(cp))
        .then(() => {
          restarted = true;
        });
      for (let i = 0; !restarted; i++) {
        const [name, t] = [`during-${i}`, Date.now()];
        try {
          await store.proxies.create(proxyFixture(ns, name));
          attempts.push({ name, ok: true, ms: Date.now() - t });
        } catch (err) {
          attempts.push({ name, ok: false, ms: Date.now() - t, err });
        }
        // Paced, not a tight loop of refused connections.
        await until('the next write is due', () => restarted || Date.now() - t >= 200, { timeoutMs: 5000 });
      }
      await restart;
      const failed = attempts.filter((a) => !a.ok);
      expect(failed.length).toBeGreaterThan(0);
      for (const f of failed) {
        // A transport error (connection refused or reset) or the API's own Unavailable, never a hang.
        expect(f.err).toBeInstanceOf(Error);
        if (f.err instanceof StoreError) expect(f.err.reason).toBe('Unavailable');
        expect(f.ms).toBeLessThan(31_000);
      }

      // Right after the restart: another client's changes, and our own writes, work again.
      await other.label('changing', { v: '2' });
      await other.delete('doomed');
      const fresh = await other.create('fresh');
      const mine = await store.proxies.create(proxyFixture(ns, 'mine'));
      await until(
        'the cache has the changes made after the restart',
        () => {
          const c = cached(store, ns);
          return c.changing?.labels.v === '2' && !c.doomed && c.fresh?.uid === fresh.metadata.uid && c.mine;
        },
        { timeoutMs: 60_000, intervalMs: 50 },
      );
      // Every write that was answered is cached (one whose answer was lost may exist too).
      const names = Object.keys(cached(store, ns));
      for (const a of attempts.filter((x) => x.ok)) expect(names).toContain(a.name);
      // The resume from before the restart is too old for the new watch cache: a relist.
      expect(reflector.stats.relistsOnGone).toBeGreaterThan(before.relistsOnGone);
      // Unchanged objects are not announced again by the relist.
      expect(events.filter((e) => e.object.metadata.name === 'stable').map((e) => e.type)).toEqual(['ADDED']);
      expect(store.proxies.get({ namespace: ns, name: 'stable' })?.metadata.resourceVersion).toBe(
        stable.metadata.resourceVersion,
      );
      expect(mine.metadata.uid).toBeTruthy();
    } finally {
      await api.close();
    }
  });
});
