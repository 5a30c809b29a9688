/**
 * test/support/dashboard-fleet — a large fleet behind the real dashboard without running
 * thousands of proxies: the Proxy objects in a memory store and their lease-store entries fed
 * as the lease feed and the health engine feed them (upserts, health verdicts with latencies),
 * the real Dashboard sampling both, served by the real discovery server with the page's own
 * files. `churn` changes proxies the way a live fleet does between two polls (new latencies
 * from probing, some health flips, leases and a blocked report), from a seeded generator.
 * Shared by test/e2e/dashboard/scale.test.ts and bench/dashboard.ts.
 */
import { Registry } from 'prom-client';
import { loadDashboardAssets } from '../../src/dashboard/assets.ts';
import { Dashboard } from '../../src/dashboard/dashboard.ts';
import { dashboardHandlers } from '../../src/dashboard/routes.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../../src/discovery/server.ts';
import { LeaseStore } from '../../src/lease/store.ts';
import { systemClock } from '../../src/runtime/clock.ts';
import { createMemoryStore } from '../../src/runtime/memory.ts';
import { proxyInfo } from './lease.ts';
import { seededRandom, TEST_SEED } from './random.ts';

export const FLEET_TOKEN = 'dashboard-fleet-token-5b1e';
export const FLEET_NAMESPACE = 'crawl';
/** Pools the proxies are spread over (by their `pool` label). */
export const FLEET_POOLS = 20;

/** "px-00042": names that sort as their numbers do. */
export function fleetName(i: number): string {
  return `px-${String(i).padStart(5, '0')}`;
}

export function fleetKey(i: number): string {
  return `${FLEET_NAMESPACE}/${fleetName(i)}`;
}

export interface ChurnCounts {
  /** New latencies (a probe answered). */
  probed: number;
  /** Health flips among them. */
  flipped: number;
  leased: number;
}

export interface DashboardFleet {
  url: string;
  leases: LeaseStore;
  dashboard: Dashboard;
  size(): number;
  /** `n` proxies get a new latency (a few of them flip health), `leases` leases, one blocked report. */
  churn(n: number, leases?: number): ChurnCounts;
  /** Marks proxy `i` healthy or not, as a probe verdict would. */
  setHealthy(i: number, healthy: boolean, latencyMillis?: number): void;
  add(i: number): void;
  remove(i: number): void;
  close(): Promise<void>;
}

export async function startDashboardFleet(proxies: number, seed = TEST_SEED): Promise<DashboardFleet> {
  const random = seededRandom(seed);
  const store = createMemoryStore();
  const leases = new LeaseStore();
  const healthy: boolean[] = [];
  let size = 0;
  const add = (i: number) => {
    const name = fleetName(i);
    const pool = `pool-${i % FLEET_POOLS}`;
    const host = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
    store.seedProxy({
      metadata: { namespace: FLEET_NAMESPACE, name, labels: { pool } },
      spec: { provider: 'fake' },
      status: { phase: 'Ready', address: host, port: 3128, egressIP: host },
    });
    leases.upsertProxy(
      proxyInfo(name, {
        namespace: FLEET_NAMESPACE,
        labels: { pool },
        host,
        egressIP: host,
        maxLeases: 4,
        latencyMillis: 20 + random() * 80,
        credentials: { username: 'u', password: `pw-${i}-never-shown` },
      }),
    );
    healthy[i] = true;
    size++;
  };
  for (let i = 0; i < proxies; i++) add(i);
  const dashboard = new Dashboard({ leases, store, clock: systemClock });
  const stop = new AbortController();
  const running = dashboard.run(stop.signal);
  let server: DiscoveryServer;
  try {
    server = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases,
      registry: new Registry(),
      token: FLEET_TOKEN,
      handlers: dashboardHandlers(dashboard, loadDashboardAssets()),
    });
  } catch (err) {
    stop.abort();
    await running;
    throw err;
  }

  const setHealthy = (i: number, up: boolean, latencyMillis = 20 + random() * 80) => {
    healthy[i] = up;
    leases.setHealth(fleetKey(i), `uid-${fleetName(i)}`, { healthy: up, latencyMillis });
  };
  const pick = () => Math.floor(random() * proxies);
  return {
    url: server.url,
    leases,
    dashboard,
    size: () => size,
    churn(n, leaseCount = 10) {
      let flipped = 0;
      for (let k = 0; k < n; k++) {
        const i = pick();
        // About one probe verdict in a hundred changes the proxy's health.
        const flip = random() < 0.01;
        if (flip) flipped++;
        setHealthy(i, flip ? !healthy[i] : (healthy[i] ?? true));
      }
      let leased = 0;
      for (let k = 0; k < leaseCount; k++) {
        const g = leases.lease({ target: `site-${k % 5}.example`, ttlSeconds: 120 });
        if (!g.granted) continue;
        leased++;
        if (k === 0) leases.report(g.grant.id, { result: 'blocked', cooldownSeconds: 300 });
      }
      return { probed: n, flipped, leased };
    },
    setHealthy,
    add,
    remove(i) {
      leases.removeProxy(fleetKey(i));
      void store.proxies.delete({ namespace: FLEET_NAMESPACE, name: fleetName(i) });
      size--;
    },
    async close() {
      await server.close();
      stop.abort();
      await running;
      leases.close();
    },
  };
}
