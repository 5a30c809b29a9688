/**
 * bench/pool — docs/benchmarks.md: one ProxyPool of 1,000 replicas on a fake provider (instances
 * Running at once) in the standalone (embedded, journaled) store, through the real pool
 * controller, Proxy reconciler and work queues. Reports the time from creating the pool until
 * its status counts 1,000 Ready Proxies (target ≤ 60 s); exits non-zero on a miss.
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { API_VERSION, PROXY_POOL_KIND } from '../src/api/constants.ts';
import { createProxyReconciler } from '../src/controller/reconciler.ts';
import { createPoolReconciler } from '../src/pool/reconciler.ts';
import { createEmbeddedStore } from '../src/runtime/embedded/store.ts';
import { WorkQueue } from '../src/runtime/workqueue.ts';
import { FakeProvider } from '../test/support/fake-provider.ts';

export interface PoolBenchResult {
  replicas: number;
  msUntilReady: number;
  proxies: number;
}

export async function runPoolBench(
  opts: { replicas?: number; timeoutMs?: number } = {},
): Promise<PoolBenchResult> {
  const n = opts.replicas ?? 1000;
  const dir = await mkdtemp(join(tmpdir(), 'pool-bench-'));
  const store = await createEmbeddedStore({ statePath: join(dir, 'state.json'), rescanIntervalMs: 0 });
  const fake = new FakeProvider({ name: 'fake', pendingGets: 0 });
  const proxies = createProxyReconciler({
    store,
    providers: new Map([['fake', fake]]),
    options: { readyResyncMs: 0 },
    installation: 'bench',
  });
  const pools = createPoolReconciler({ store, providerType: () => 'fake' });
  const proxyQueue = new WorkQueue({ name: 'proxy-bench' });
  const poolQueue = new WorkQueue({ name: 'pool-bench' });
  const stop = new AbortController();
  const unwatch = [
    proxies.watchSources((k) => proxyQueue.add(k)),
    pools.watchSources((k) => poolQueue.add(k)),
  ];
  let resolveReady: () => void = () => {};
  const ready = new Promise<void>((r) => {
    resolveReady = r;
  });
  const offPool = store.proxyPools.watch((ev) => {
    if ((ev.object.status?.readyReplicas ?? 0) >= n) resolveReady();
  });
  const workers = [
    proxyQueue.runWorkers({
      concurrency: 16,
      signal: stop.signal,
      process: (k) => proxies.reconcile(k, stop.signal),
    }),
    poolQueue.runWorkers({
      concurrency: 2,
      signal: stop.signal,
      process: (k) => pools.reconcile(k, stop.signal),
    }),
  ];

  const started = performance.now();
  await store.proxyPools.create({
    apiVersion: API_VERSION,
    kind: PROXY_POOL_KIND,
    metadata: { name: 'bench', namespace: 'bench' },
    spec: { replicas: n, template: { spec: { provider: 'fake', placement: { zone: 'a' } } } },
  });
  const timeoutMs = opts.timeoutMs ?? 120_000;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    ready,
    new Promise<void>((_, reject) => {
      timer = setTimeout(() => {
        const got = store.proxyPools.get({ namespace: 'bench', name: 'bench' })?.status?.readyReplicas ?? 0;
        reject(new Error(`only ${got}/${n} Ready after ${timeoutMs} ms`));
      }, timeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));
  const msUntilReady = performance.now() - started;
  const count = store.proxies.list({ namespace: 'bench' }).length;
  stop.abort();
  await Promise.all(workers);
  for (const off of unwatch) off();
  offPool();
  await store.stop();
  await rm(dir, { recursive: true, force: true });
  return { replicas: n, msUntilReady: Math.round(msUntilReady), proxies: count };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const r = await runPoolBench();
  const ok = r.msUntilReady <= 60_000 && r.proxies === r.replicas;
  console.log(
    [
      `pool (embedded store): ${r.replicas} replicas Ready in ${(r.msUntilReady / 1000).toFixed(2)} s (target ≤ 60 s)`,
      `  proxies created ${r.proxies} (exactly ${r.replicas} expected)`,
      `  ${ok ? 'PASS' : 'FAIL'}`,
    ].join('\n'),
  );
  if (!ok) process.exitCode = 1;
}
