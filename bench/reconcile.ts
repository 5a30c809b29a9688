/**
 * bench/reconcile — docs/benchmarks.md: 1,000 Proxies on a fake provider (instances Running at once)
 * reach Ready through the real reconciler, work queue and the standalone (embedded, journaled)
 * store — `--memory` for the in-memory one. Reports the time until all are Ready (seeding
 * included) and status writes per Proxy (targets: ≤ 60 s, ≤ 4).
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { API_VERSION, PROXY_KIND } from '../src/api/constants.ts';
import { createProxyReconciler } from '../src/controller/reconciler.ts';
import { createEmbeddedStore } from '../src/runtime/embedded/store.ts';
import { createMemoryStore } from '../src/runtime/memory.ts';
import type { ObjectStore } from '../src/runtime/store.ts';
import { WorkQueue } from '../src/runtime/workqueue.ts';
import { FakeProvider } from '../test/support/fake-provider.ts';

export interface ReconcileBenchResult {
  store: 'memory' | 'embedded';
  proxies: number;
  msUntilAllReady: number;
  statusWrites: number;
  statusWritesPerProxy: number;
  metadataWrites: number;
  providerCalls: Record<string, number>;
}

export async function runReconcileBench(
  opts: { proxies?: number; concurrency?: number; timeoutMs?: number; store?: 'memory' | 'embedded' } = {},
): Promise<ReconcileBenchResult> {
  const n = opts.proxies ?? 1000;
  const kind = opts.store ?? 'embedded';
  const dir = kind === 'embedded' ? await mkdtemp(join(tmpdir(), 'reconcile-bench-')) : undefined;
  const memory = dir
    ? await createEmbeddedStore({ statePath: join(dir, 'state.json'), rescanIntervalMs: 0 })
    : createMemoryStore();
  let statusWrites = 0;
  let metadataWrites = 0;
  const proxies = Object.create(memory.proxies) as ObjectStore['proxies'];
  proxies.patchStatus = (key, status, o) => {
    statusWrites++;
    return memory.proxies.patchStatus(key, status, o);
  };
  proxies.update = (obj, o) => {
    metadataWrites++;
    return memory.proxies.update(obj, o);
  };
  const store: ObjectStore = { ...memory, proxies };
  const fake = new FakeProvider({ name: 'fake', pendingGets: 0 });
  const reconciler = createProxyReconciler({
    store,
    providers: new Map([['fake', fake]]),
    options: { readyResyncMs: 0 },
    installation: 'bench',
  });
  const queue = new WorkQueue({ name: 'proxy-bench' });
  const stop = new AbortController();
  const unwatch = reconciler.watchSources((k) => queue.add(k));

  let ready = 0;
  const seen = new Set<string>();
  let resolveAll: () => void = () => {};
  const allReady = new Promise<void>((r) => {
    resolveAll = r;
  });
  const offReady = memory.proxies.watch((ev) => {
    const key = `${ev.object.metadata.namespace}/${ev.object.metadata.name}`;
    if (ev.object.status?.phase === 'Ready' && !seen.has(key)) {
      seen.add(key);
      if (++ready === n) resolveAll();
    }
  });

  const started = performance.now();
  const workers = queue.runWorkers({
    concurrency: opts.concurrency ?? 16,
    signal: stop.signal,
    process: (key) => reconciler.reconcile(key, stop.signal),
  });
  for (let i = 0; i < n; i++) {
    await memory.proxies.create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name: `bench-${i}`, namespace: 'bench' },
      spec: { provider: 'fake', placement: { zone: 'a' } },
    });
  }
  const timeoutMs = opts.timeoutMs ?? 120_000;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    allReady,
    new Promise<void>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`only ${ready}/${n} Ready after ${timeoutMs} ms`)),
        timeoutMs,
      );
    }),
  ]).finally(() => clearTimeout(timer));
  const msUntilAllReady = performance.now() - started;
  // Let follow-up reconciles (triggered by our own metadata writes) finish before counting.
  await new Promise((r) => setTimeout(r, 200));
  stop.abort();
  await workers;
  unwatch();
  offReady();
  await memory.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
  return {
    store: kind,
    proxies: n,
    msUntilAllReady: Math.round(msUntilAllReady),
    statusWrites,
    statusWritesPerProxy: statusWrites / n,
    metadataWrites,
    providerCalls: { ...fake.calls },
  };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const r = await runReconcileBench({ store: process.argv.includes('--memory') ? 'memory' : 'embedded' });
  const ok = r.msUntilAllReady <= 60_000 && r.statusWritesPerProxy <= 4;
  console.log(
    [
      `reconcile (${r.store} store): ${r.proxies} proxies Ready in ${(r.msUntilAllReady / 1000).toFixed(2)} s (target ≤ 60 s)`,
      `  status writes/proxy ${r.statusWritesPerProxy.toFixed(2)} (target ≤ 4), metadata writes ${r.metadataWrites}`,
      `  provider calls ${JSON.stringify(r.providerCalls)}`,
      `  ${ok ? 'PASS' : 'FAIL'}`,
    ].join('\n'),
  );
  if (!ok) process.exitCode = 1;
}
