/**
 * End-to-end: rotation `strategy: Restart` on the gcp provider, with real parts on both real
 * backends (the embedded store, client-node against the Kubernetes REST test server): the pool
 * and Proxy controllers on work queues, the gcp provider through the official
 * @google-cloud/compute client against the fake GCE on loopback (stop/start in
 * test/support/fake-gce-power), the health engine probing through the proxies to a TLS origin,
 * and the lease store with its feed. Each fake VM is played by a real forward proxy listening on
 * the VM's loopback natIP while GCE says it runs.
 *
 * A pool of 2 with `maxAge: 10s` and `maxUnavailable: 1` recycles by stop/start: the same
 * Proxies and VMs (no insert after the first two), each with a new IP; never more than one
 * out of rotation; status.restart Done; and a client leasing and tunnelling all the while
 * never gets a grant that does not serve — the restarted proxy is leased again only after the
 * health engine passed it at its new address.
 */
import { googleAuthLibrary } from 'google-gax';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  API_VERSION,
  LABEL_CREDENTIALS_FOR,
  LABEL_POOL,
  PROXY_POOL_KIND,
} from '../../../src/api/constants.ts';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { createProxyReconciler } from '../../../src/controller/reconciler.ts';
import { HealthEngine } from '../../../src/health/engine.ts';
import { probe } from '../../../src/health/probe.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { createPoolReconciler } from '../../../src/pool/reconciler.ts';
import { createGcpProvider } from '../../../src/provider/gcp/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { providerRegistryFrom } from '../../../src/provider/registry.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { createCredentialsResolver } from '../../../src/runtime/credentials.ts';
import { WorkQueue } from '../../../src/runtime/workqueue.ts';
import { type FakeGce, startFakeGce } from '../../support/fake-gce.ts';
import { natIPOf } from '../../support/fake-gce-power.ts';
import { startTlsOrigin, testPki } from '../../support/origins.ts';
import { BACKENDS, NAMESPACE, openStore } from '../../support/pool/world.ts';
import { freePortRange } from '../../support/ports.ts';

vi.setConfig({ testTimeout: 90_000 });

const PROJECT = 'proj-pool-restart';
const ZONE = 'europe-west1-b';
const CREDS = { username: 'crawler', password: 'Restart-pass-word-123' };

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The fake's VMs, served: a forward proxy on each running VM's natIP, gone when it stops. */
function playVms(fake: FakeGce, port: number, egress: EgressGuard): { stop(): Promise<void> } {
  const vms = new Map<string, { ip: string; proxy: ForwardProxy }>();
  let busy = false;
  const sync = async () => {
    if (busy) return;
    busy = true;
    try {
      for (const [key, inst] of fake.instances) {
        const ip = inst.status === 'RUNNING' ? natIPOf(inst) : undefined;
        const vm = vms.get(key);
        if (vm && vm.ip !== ip) {
          vms.delete(key);
          await vm.proxy.close();
        }
        if (ip && !vms.has(key)) {
          const proxy = new ForwardProxy({ credentials: CREDS, log: silentLogger(), egress });
          await proxy.listen(port, ip);
          vms.set(key, { ip, proxy });
        }
      }
      for (const [key, vm] of vms) {
        if (!fake.instances.has(key)) {
          vms.delete(key);
          await vm.proxy.close();
        }
      }
    } finally {
      busy = false;
    }
  };
  const timer = setInterval(() => void sync(), 20);
  return {
    async stop() {
      clearInterval(timer);
      await vi.waitFor(() => expect(busy).toBe(false));
      await Promise.all([...vms.values()].map((vm) => vm.proxy.close()));
    },
  };
}

describe.each(BACKENDS)('pool rotation strategy Restart on gcp, %s backend', (backend) => {
  it('recycles by stop/start: same VMs, new IPs, one at a time, no grant to a proxy that does not serve', async () => {
    const origin = await startTlsOrigin({ defaultStatus: 204 });
    cleanups.push(() => origin.close());
    const fake = await startFakeGce({ zones: [ZONE] });
    fake.boot = true;
    cleanups.push(() => fake.close());
    const { store, close } = await openStore(backend, systemClock);
    cleanups.push(close);
    const port = (await freePortRange(1)).from;
    const egress = new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [origin.port] }),
    );
    const vms = playVms(fake, port, egress);
    cleanups.push(() => vms.stop());

    const gcp = createGcpProvider({
      name: 'gce',
      config: { project: PROJECT },
      clientOptions: {
        apiEndpoint: '127.0.0.1',
        port: fake.port,
        protocol: 'http',
        authClient: new googleAuthLibrary.PassThroughClient(),
      },
      callTimeoutMs: 5000,
      operationWaitMs: 2000,
    });
    const providers = providerRegistryFrom([gcp], { registry: new Registry() });
    cleanups.push(() => providers.close());

    const ca = testPki().caCert;
    const credentials = createCredentialsResolver(store);
    const leases = new LeaseStore({ sweepIntervalMs: 50 });
    cleanups.push(() => leases.close());
    const health = new HealthEngine({
      store,
      credentials,
      defaults: { url: `${origin.baseUrl}/`, intervalMs: 200, timeoutMs: 1000 },
      controlProbe: false,
      ca,
      listener: (v) => leases.setHealth(v.key, v.uid, { healthy: v.healthy, latencyMillis: v.latencyMillis }),
    });
    const ac = new AbortController();
    startLeaseFeed({ store, leases, signal: ac.signal, credentials });
    const proxies = createProxyReconciler({
      store,
      providers,
      credentials,
      installation: 'restart-test',
      options: { provisionPollMs: 100, deletionPollMs: 100, drainPollMs: 100, readyResyncMs: 0 },
      leasesOn: (key, id) => leases.leasesOn(key, id),
    });
    const pools = createPoolReconciler({
      store,
      leasesOn: (key, id) => leases.leasesOn(key, id),
      providerType: (name) => providers.type(name),
      canRestart: (name) => providers.canRestart(name),
      drainPollMs: 100,
    });
    const proxyQueue = new WorkQueue({ name: 'proxy', baseDelayMs: 50, maxDelayMs: 500 });
    const poolQueue = new WorkQueue({ name: 'pool', baseDelayMs: 50, maxDelayMs: 500 });
    const offs = [
      proxies.watchSources((k) => proxyQueue.add(k)),
      pools.watchSources((k) => poolQueue.add(k)),
    ];
    const workers = [
      proxyQueue.runWorkers({
        concurrency: 4,
        signal: ac.signal,
        process: (k) => proxies.reconcile(k, ac.signal),
      }),
      poolQueue.runWorkers({
        concurrency: 1,
        signal: ac.signal,
        process: (k) => pools.reconcile(k, ac.signal),
      }),
    ];
    health.start();
    cleanups.push(async () => {
      ac.abort();
      for (const off of offs) off();
      await Promise.all(workers);
      await health.stop();
    });

    await store.secrets.create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'eu-creds', namespace: NAMESPACE, labels: { [LABEL_CREDENTIALS_FOR]: 'referenced' } },
      data: {
        username: Buffer.from(CREDS.username).toString('base64'),
        password: Buffer.from(CREDS.password).toString('base64'),
      },
    });
    await store.proxyPools.create({
      apiVersion: API_VERSION,
      kind: PROXY_POOL_KIND,
      metadata: { name: 'eu', namespace: NAMESPACE },
      spec: {
        replicas: 2,
        rollingUpdate: { maxSurge: 1, maxUnavailable: 1 },
        rotation: { maxAge: '10s', jitter: 0.5, strategy: 'Restart' },
        template: {
          spec: {
            provider: 'gce',
            placement: { zone: ZONE },
            port,
            credentialsSecretRef: { name: 'eu-creds' },
          },
        },
      },
    });
    const selector = `${LABEL_POOL}=eu`;
    const members = () => store.proxies.list({ namespace: NAMESPACE, labelSelector: selector });
    const leasableNow = () => leases.lease({ selector, ttlSeconds: 1 });

    // Both up, healthy and leasable.
    await vi.waitFor(
      () => {
        const ms = members();
        expect(ms).toHaveLength(2);
        for (const p of ms)
          expect(p.status?.conditions).toContainEqual(
            expect.objectContaining({ type: 'Healthy', status: 'True' }),
          );
      },
      { timeout: 20_000, interval: 50 },
    );
    const names = members()
      .map((p) => p.metadata.name)
      .sort();
    const first = new Map(members().map((p) => [p.metadata.name, p.status?.address]));
    const inserts = () =>
      fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/instances')).length;
    expect(inserts()).toBe(2);

    // What each Proxy's status said, in order: phase, restart phase and Healthy verdict.
    const seen = new Map<string, string[]>();
    const offWatch = store.proxies.watch((ev) => {
      const p = ev.object;
      const healthy = p.status?.conditions?.find((c) => c.type === 'Healthy')?.status ?? '-';
      const line = `${p.status?.phase}/${p.status?.restart?.phase ?? '-'}/${healthy}`;
      const lines = seen.get(p.metadata.name) ?? [];
      if (lines.at(-1) !== line) lines.push(line);
      seen.set(p.metadata.name, lines);
    });
    cleanups.push(() => offWatch());

    // A client leasing and tunnelling all along; every failure is recorded.
    const failures: string[] = [];
    let grants = 0;
    let running = true;
    let mostOut = 0;
    const loop = (async () => {
      while (running) {
        const ms = members();
        const out = ms.filter((p) => p.metadata.annotations?.['crawl.example.com/restart-requested']).length;
        mostOut = Math.max(mostOut, out);
        const got = leases.lease({ selector, ttlSeconds: 30 });
        if (!got.granted) {
          await new Promise<void>((r) => setImmediate(r));
          continue;
        }
        grants++;
        const u = new URL(got.grant.proxy.url);
        const r = await probe(
          {
            host: u.hostname,
            port: Number(u.port),
            credentials: {
              username: decodeURIComponent(u.username),
              password: decodeURIComponent(u.password),
            },
          },
          { url: `${origin.baseUrl}/`, expectStatus: 204, timeoutMs: 2000 },
          { ca },
        );
        if (!r.ok) failures.push(`${got.grant.proxy.name} ${u.host}: ${r.reason} ${r.message}`);
        leases.release(got.grant.id);
      }
    })();
    cleanups.push(async () => {
      running = false;
      await loop;
    });

    // Both restarted in place: status.restart Done, a new address, healthy again.
    await vi.waitFor(
      () => {
        for (const p of members()) {
          expect(p.status?.restart?.phase).toBe('Done');
          expect(p.status?.address).not.toBe(first.get(p.metadata.name));
          expect(p.metadata.annotations?.['crawl.example.com/restart-requested']).toBeUndefined();
          expect(p.spec.drain).toBeUndefined();
        }
      },
      { timeout: 45_000, interval: 50 },
    );
    running = false;
    await loop;
    expect(failures).toEqual([]);
    expect(grants).toBeGreaterThan(10);
    expect(mostOut).toBe(1);
    expect(
      members()
        .map((p) => p.metadata.name)
        .sort(),
    ).toEqual(names);
    // The same two VMs: stopped and started, never inserted again. Each at least once: with a
    // 10 s maxAge the first one may come round again while the other is still restarting (a
    // loaded machine), which is rotation working, not a fault.
    expect(inserts()).toBe(2);
    const posts = (a: string) =>
      fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith(`/${a}`)).length;
    expect(posts('stop')).toBeGreaterThanOrEqual(2);
    expect(posts('start')).toBeGreaterThanOrEqual(2);
    for (const p of members()) {
      const inst = fake.instances.get(`${PROJECT}/${ZONE}/${p.status?.instanceName}`);
      expect(inst && natIPOf(inst)).toBe(p.status?.address);
    }
    await vi.waitFor(() => expect(leasableNow().granted).toBe(true), { timeout: 5000, interval: 50 });
    // The verdict was never inherited: Unknown while restarting, True again only at the new address.
    for (const name of names) {
      const lines = seen.get(name) ?? [];
      const restarting = lines.findIndex((l) => l.startsWith('Restarting/Restarting/'));
      expect(restarting, lines.join(' → ')).toBeGreaterThanOrEqual(0);
      const after = lines.slice(restarting);
      const unknown = after.findIndex((l) => l.endsWith('/Unknown'));
      const healthyAgain = after.indexOf('Ready/Done/True');
      expect(unknown, lines.join(' → ')).toBeGreaterThanOrEqual(0);
      expect(healthyAgain, lines.join(' → ')).toBeGreaterThan(unknown);
      // Serving again (Ready at the new address) only after the old verdict was taken back.
      const servingAgain = after.findIndex((l) => l.startsWith('Ready/Done/'));
      expect(unknown, lines.join(' → ')).toBeLessThan(servingAgain);
      expect(
        after.slice(unknown, healthyAgain).some((l) => l.endsWith('/True')),
        lines.join(' → '),
      ).toBe(false);
    }
    const pool = store.proxyPools.get({ namespace: NAMESPACE, name: 'eu' });
    expect(pool?.status?.conditions?.find((c) => c.type === 'SpecValid')?.status).toBe('True');
  });
});
