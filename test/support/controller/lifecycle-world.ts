/**
 * test/support/controller/lifecycle-world — the real parts of an operator in one process, for the
 * instance-lifecycle tests: memory store, the `local` provider (behind SlowStart, so new
 * instances can be slow to serve), the reconciler on a work queue, the health engine probing
 * through the proxies to a TLS origin on loopback, the lease store and its feed. Clients
 * lease from the store and tunnel through each grant's URL.
 */
import { onTestFinished } from 'vitest';
import { API_VERSION, PROXY_KIND } from '../../../src/api/constants.ts';
import { keyOf } from '../../../src/api/meta.ts';
import type { ProxyObject, ProxySpec } from '../../../src/api/proxy.ts';
import { createProxyReconciler, type SurgeLimit } from '../../../src/controller/reconciler.ts';
import { HealthEngine } from '../../../src/health/engine.ts';
import { type ProbeResult, probe } from '../../../src/health/probe.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { LeaseGrant } from '../../../src/lease/types.ts';
import { createLocalProvider } from '../../../src/provider/local/index.ts';
import { createCredentialsResolver } from '../../../src/runtime/credentials.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { WorkQueue } from '../../../src/runtime/workqueue.ts';
import { type Origin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { freePortRange } from '../../support/ports.ts';
import { SlowStart } from '../../support/slow-start.ts';

export const NS = 'crawl';
export const PROVIDER = 'dev';

export interface LifecycleWorld {
  store: ObjectStore;
  leases: LeaseStore;
  health: HealthEngine;
  gates: SlowStart;
  origin: Origin;
  seed(name: string, spec?: Partial<ProxySpec>): Promise<ProxyObject>;
  proxy(name: string): ProxyObject | undefined;
  /** Tunnels through a grant's URL (credentials included) to the origin; 204 is success. */
  tunnel(grant: LeaseGrant): Promise<ProbeResult>;
}

export async function startLifecycleWorld(
  opts: { instances?: number; surge?: SurgeLimit; drainTimeoutMs?: number; intervalMs?: number } = {},
): Promise<LifecycleWorld> {
  const origin = await startTlsOrigin({ defaultStatus: 204 });
  const store = createMemoryStore();
  const local = createLocalProvider({
    name: PROVIDER,
    config: {
      portRange: await freePortRange(opts.instances ?? 8),
      egressPolicy: { allowCIDRs: ['127.0.0.1/32'], connectPorts: [origin.port] },
    },
    connectTimeoutMs: 2000,
  });
  const gates = new SlowStart(local);
  const credentials = createCredentialsResolver(store);
  const leases = new LeaseStore({ sweepIntervalMs: 50 });
  const health = new HealthEngine({
    store,
    credentials,
    defaults: { url: `${origin.baseUrl}/`, intervalMs: opts.intervalMs ?? 200, timeoutMs: 1000 },
    controlProbe: false,
    ca: testPki().caCert,
    listener: (v) => leases.setHealth(v.key, v.uid, { healthy: v.healthy, latencyMillis: v.latencyMillis }),
  });
  const ac = new AbortController();
  startLeaseFeed({ store, leases, signal: ac.signal, credentials });
  const rec = createProxyReconciler({
    store,
    providers: new Map([[PROVIDER, gates.provider()]]),
    credentials,
    installation: 'lifecycle-test',
    options: {
      provisionPollMs: 200,
      deletionPollMs: 100,
      drainPollMs: 100,
      readyResyncMs: 0,
      ...(opts.drainTimeoutMs !== undefined ? { drainTimeoutMs: opts.drainTimeoutMs } : {}),
    },
    leasesOn: (key, id) => leases.leasesOn(key, id),
    ...(opts.surge ? { maxConcurrentReplacements: opts.surge } : {}),
  });
  const queue = new WorkQueue({ name: 'proxy', baseDelayMs: 50, maxDelayMs: 500 });
  const off = rec.watchSources((k) => queue.add(k));
  const workers = queue.runWorkers({
    concurrency: 4,
    signal: ac.signal,
    process: (key) => rec.reconcile(key, ac.signal),
  });
  health.start();
  onTestFinished(async () => {
    ac.abort();
    off();
    await workers;
    await health.stop();
    leases.close();
    await gates.close();
    await local.close();
    await origin.close();
  });
  const ca = testPki().caCert;
  return {
    store,
    leases,
    health,
    gates,
    origin,
    seed: (name, spec = {}) =>
      store.proxies.create({
        apiVersion: API_VERSION,
        kind: PROXY_KIND,
        metadata: { name, namespace: NS },
        spec: { provider: PROVIDER, ...spec },
      }),
    proxy: (name) => store.proxies.get({ namespace: NS, name }),
    tunnel: (grant) => {
      const u = new URL(grant.proxy.url);
      const credentials = u.username
        ? { username: decodeURIComponent(u.username), password: decodeURIComponent(u.password) }
        : undefined;
      return probe(
        { host: u.hostname, port: Number(u.port), ...(credentials ? { credentials } : {}) },
        { url: `${origin.baseUrl}/`, expectStatus: 204, timeoutMs: 2000 },
        { ca },
      );
    },
  };
}

/** Leases, tunnels and releases in a loop until stopped; every failure is recorded. */
export function leaseLoop(
  w: LifecycleWorld,
  opts: { selector?: string } = {},
): {
  /** Grants so far. */
  grants(): number;
  stop(): Promise<{ grants: number; failures: string[]; endpoints: string[] }>;
} {
  let running = true;
  const failures: string[] = [];
  const endpoints: string[] = [];
  let grants = 0;
  const run = (async () => {
    while (running) {
      const out = w.leases.lease({ ttlSeconds: 60, ...(opts.selector ? { selector: opts.selector } : {}) });
      if (!out.granted) {
        await new Promise<void>((r) => setImmediate(r));
        continue;
      }
      grants++;
      const where = `${out.grant.proxy.host}:${out.grant.proxy.port}`;
      if (endpoints.at(-1) !== where) endpoints.push(where);
      const r = await w.tunnel(out.grant);
      if (!r.ok) failures.push(`${out.grant.proxy.name} ${where}: ${r.reason} ${r.message}`);
      w.leases.release(out.grant.id);
    }
  })();
  return {
    grants: () => grants,
    async stop() {
      running = false;
      await run;
      return { grants, failures, endpoints };
    },
  };
}

export const keyOfName = (name: string) => keyOf({ metadata: { namespace: NS, name } });
