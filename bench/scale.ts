/**
 * bench/scale — the same work at 1,000 and 10,000 proxies in one run (docs/benchmarks.md,
 * "Scale"), each part in processes of its own so no size inherits the other's heap or JIT state:
 * reconcile to Ready (standalone store, fake provider), probing at one fixed rate through local
 * CONNECT proxies to a local TLS origin, `GET /v1/proxies` pages and lease grant + release
 * through the API (both sizes served by one process, interleaved rounds, the load generator in
 * its own process), a gateway replica's syncs idle and under a fixed churn, and resident memory
 * with the same per-proxy lease and cooldown load on the compiled operator. Prints every figure
 * at both sizes and their ratio, and exits non-zero on any missed target.
 * `node bench/scale.ts part <name> <json>` runs one part (what the orchestrator spawns).
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { spawnSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { startDiscoveryServer } from '../src/discovery/server.ts';
import { GatewayHub } from '../src/gateway/hub.ts';
import { GatewayLink, type SyncTransport } from '../src/gateway/link.ts';
import { ReplicaChooser } from '../src/gateway/replica.ts';
import { LeaseStore } from '../src/lease/store.ts';
import { silentLogger } from '../src/log/index.ts';
import { FakeClock } from '../test/support/clock.ts';
import { runHealthBench } from './health.ts';
import { benchProxy, loadRound, median } from './lease.ts';
import type { LoadgenArgs } from './loadgen.ts';
import { compiledLoad, measureMemory } from './memory.ts';
import { runReconcileBench } from './reconcile.ts';

const SIZES = [1000, 10_000] as const;
/** Probes per second at both sizes: each proxy is probed every SIZE / PROBE_RATE seconds. */
const PROBE_RATE = 500;
/** Per proxy, in the memory part: active leases and per-target cooldowns (10,000 × 20 = the store's 200,000 cap). */
const LEASES_PER_PROXY = 5;
const COOLDOWNS_PER_PROXY = 20;
/** Churn in the sync part, per second at both sizes: upstreams changing health, new cooldowns. */
const CHURN_UPSTREAMS = 20;
const CHURN_COOLDOWNS = 20;
const TOKEN = 'bench-token';
const SELF = fileURLToPath(import.meta.url);

export const TARGETS = {
  reconcileSeconds: 120,
  coresPer1000ProbesPerSecond: 0.6,
  cpuPerRequestGrowth: 1.3,
  idleSyncBytesGrowth: 1.05,
  churnSyncBytesGrowth: 1.3,
  rssGrowth: 4,
} as const;

/** The scale bench's fleets: every proxy takes 4 leases, so gateway replicas hold real shares. */
const proxy = (i: number) => benchProxy(i, 4);

// ---- parts (each runs in a process of its own) ----

async function reconcilePart(n: number) {
  const r = await runReconcileBench({ proxies: n, timeoutMs: TARGETS.reconcileSeconds * 1000 + 30_000 });
  return { seconds: r.msUntilAllReady / 1000, statusWritesPerProxy: r.statusWritesPerProxy };
}

async function probePart(n: number) {
  const intervalMs = (n / PROBE_RATE) * 1000;
  const r = await runHealthBench({
    proxies: n,
    intervalMs,
    warmupMs: Math.max(5000, intervalMs),
    durationMs: Math.max(14_000, 1.5 * intervalMs),
    print: false,
  });
  return {
    probesPerSecond: r.probesPerSecond,
    coresPer1000: r.cpuCores / (r.probesPerSecond / 1000),
    cpuMsPerProbe: r.cpuMsPerProbe,
    systemMsPerProbe: r.systemMsPerProbe,
    maxLagMs: r.maxLagMs,
    intervalMs,
    unhealthy: r.unhealthy,
    statusWrites: r.statusWrites,
  };
}

/** One load-generator round; the server's CPU per request. */
async function apiRound(args: LoadgenArgs): Promise<{ cpuMicrosPerRequest: number; errors: number }> {
  const { gen, cpuMicros } = await loadRound(args);
  const requests = gen.pairs * (args.get === undefined ? 2 : 1);
  return { cpuMicrosPerRequest: cpuMicros / Math.max(1, requests), errors: gen.errors };
}

/** Both sizes served by this process; rounds interleaved so both see the same machine. */
async function apiPart(o: { rounds: number; durationMs: number; warmupMs: number; clients: number }) {
  const servers = [];
  for (const n of SIZES) {
    const leases = new LeaseStore();
    for (let i = 0; i < n; i++) leases.upsertProxy(proxy(i));
    const api = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases,
      token: TOKEN,
      registry: new Registry(),
    });
    // A page from the middle of the fleet: the cut is found, not walked to.
    const middle = `bench/${proxy(n / 2).name}`;
    servers.push({ n, leases, api, page: `/v1/proxies?limit=100&continue=${encodeURIComponent(middle)}` });
  }
  const kinds = ['page', 'lease', 'whole'] as const;
  const samples = new Map<string, number[]>();
  let errors = 0;
  for (let round = 0; round < o.rounds; round++) {
    for (const kind of kinds) {
      for (const s of servers) {
        const whole = kind === 'whole';
        const args: LoadgenArgs = {
          url: s.api.url,
          body: JSON.stringify({ target: 'shop.example', ttlSeconds: 60 }),
          token: TOKEN,
          // The whole list is megabytes at 10,000: fewer clients, so the round is not all socket writes.
          clients: whole ? 2 : o.clients,
          durationMs: o.durationMs,
          warmupMs: o.warmupMs,
          ...(kind === 'lease' ? {} : { get: whole ? '/v1/proxies' : s.page }),
        };
        const r = await apiRound(args);
        errors += r.errors;
        const perUnit = whole ? r.cpuMicrosPerRequest / s.n : r.cpuMicrosPerRequest;
        const key = `${kind}:${s.n}`;
        samples.set(key, [...(samples.get(key) ?? []), perUnit]);
      }
    }
  }
  for (const s of servers) {
    await s.api.close();
    s.leases.close();
  }
  const at = (kind: string) => SIZES.map((n) => median(samples.get(`${kind}:${n}`) ?? []));
  return { page: at('page'), lease: at('lease'), whole: at('whole'), errors };
}

/**
 * A replica linked to a hub over `n` upstreams, on a fake clock, its answers round-tripped
 * through JSON as the wire would: bytes per share round and per watch answer, idle and with a
 * fixed churn per second.
 */
async function syncPart(n: number) {
  const clock = new FakeClock();
  const leases = new LeaseStore({ clock });
  for (let i = 0; i < n; i++) leases.upsertProxy(proxy(i));
  const hub = new GatewayHub({ leases, clock, log: silentLogger(), isServing: () => true });
  const replica = new ReplicaChooser(clock);
  const tally = { rounds: 0, roundBytes: 0, requestBytes: 0, watches: 0, watchBytes: 0 };
  const transport: SyncTransport = async (req) => {
    const text = JSON.stringify(await hub.sync(req));
    if (req.waitMs > 0) {
      tally.watches++;
      tally.watchBytes += text.length;
    } else {
      tally.rounds++;
      tally.roundBytes += text.length;
      tally.requestBytes += JSON.stringify(req).length;
    }
    return JSON.parse(text) as unknown;
  };
  const link = new GatewayLink({ replica, transport, clock, log: silentLogger() });
  const stop = new AbortController();
  const running = link.run(stop.signal);
  const settle = async () => {
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  };
  const advance = async (ms: number, eachSecond?: (second: number) => void) => {
    for (let t = 0; t < ms; t += 100) {
      if (eachSecond && t % 1000 === 0) eachSecond(t / 1000);
      clock.advance(100);
      await settle();
    }
  };
  const window = async (ms: number, eachSecond?: (second: number) => void) => {
    Object.assign(tally, { rounds: 0, roundBytes: 0, requestBytes: 0, watches: 0, watchBytes: 0 });
    await advance(ms, eachSecond);
    const syncs = tally.rounds + tally.watches;
    return {
      bytesPerSync: (tally.roundBytes + tally.watchBytes) / Math.max(1, syncs),
      roundAnswerBytes: tally.roundBytes / Math.max(1, tally.rounds),
      roundRequestBytes: tally.requestBytes / Math.max(1, tally.rounds),
      watchAnswerBytes: tally.watchBytes / Math.max(1, tally.watches),
      syncs,
    };
  };
  await settle();
  await advance(10_000); // the first whole answers, the share settled
  // Idle: 60 s, three long polls time out, thirty share rounds.
  const idle = await window(60_000);
  let c = 0;
  const churn = await window(60_000, (second) => {
    for (let i = 0; i < CHURN_UPSTREAMS; i++) {
      const k = (second * CHURN_UPSTREAMS + i) % n;
      leases.setHealth(`bench/${proxy(k).name}`, undefined, { healthy: second % 2 === 1 });
    }
    for (let i = 0; i < CHURN_COOLDOWNS; i++, c++) {
      const p = proxy((c * 7919) % n);
      leases.reportProxy({
        namespace: 'bench',
        name: p.name,
        target: `site-${c}.example`,
        result: 'blocked',
      });
    }
  });
  stop.abort();
  clock.advance(60_000);
  await settle();
  await running;
  replica.close();
  hub.close();
  leases.close();
  return { idle, churn };
}

// ---- the orchestrator ----

function runPart<T>(name: string, arg: unknown): T {
  const res = spawnSync(process.execPath, [SELF, 'part', name, JSON.stringify(arg)], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    maxBuffer: 16 * 2 ** 20,
  });
  if (res.status !== 0) throw new Error(`scale part ${name} exited ${res.status}`);
  const last = res.stdout.trim().split('\n').pop() ?? '';
  return JSON.parse(last) as T;
}

interface Row {
  what: string;
  small: number;
  large: number;
  unit: string;
  digits: number;
  /** The ratio large ÷ small is checked against this (≤), if set. */
  maxRatio?: number;
  /** Both values are checked against this (≤), if set. */
  max?: number;
  /** Only the large value is checked against this (≤). */
  maxLarge?: number;
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  /** A row from the two sizes' results: `f` picks the figure. */
  const row = <T>(
    what: string,
    at: readonly T[],
    f: (x: T) => number,
    unit: string,
    digits: number,
    check: Partial<Row> = {},
  ) => rows.push({ what, small: f(at[0] as T), large: f(at[1] as T), unit, digits, ...check });
  const started = Date.now();
  const load0 = loadavg()[0]!;
  const rec = SIZES.map((n) => runPart<Awaited<ReturnType<typeof reconcilePart>>>('reconcile', n));
  row('reconcile to Ready (standalone, fake provider)', rec, (r) => r.seconds, 's', 1, {
    maxLarge: TARGETS.reconcileSeconds,
  });
  row('  status writes per proxy', rec, (r) => r.statusWritesPerProxy, '', 2, { max: 4 });
  const probe = SIZES.map((n) => runPart<Awaited<ReturnType<typeof probePart>>>('probe', n));
  row(
    `probing at ${PROBE_RATE} probes/s: cores per 1,000 probes/s`,
    probe,
    (p) => p.coresPer1000,
    'cores',
    2,
    {
      max: TARGETS.coresPer1000ProbesPerSecond,
    },
  );
  row('  probes/s achieved', probe, (p) => p.probesPerSecond, '/s', 0);
  row('  CPU per probe', probe, (p) => p.cpuMsPerProbe * 1000, 'µs', 0);
  row('    of it in the kernel', probe, (p) => p.systemMsPerProbe * 1000, 'µs', 0);
  row('  worst lag behind schedule (< one interval)', probe, (p) => p.maxLagMs, 'ms', 0);
  const api = runPart<Awaited<ReturnType<typeof apiPart>>>('api', {
    rounds: 3,
    durationMs: 3000,
    warmupMs: 1000,
    clients: 16,
  });
  const flat = { maxRatio: TARGETS.cpuPerRequestGrowth };
  row('GET /v1/proxies?limit=100 page: server CPU/request', api.page, (x) => x, 'µs', 1, flat);
  row('lease grant + release: server CPU/request', api.lease, (x) => x, 'µs', 1, flat);
  row('GET /v1/proxies whole fleet: CPU per proxy listed', api.whole, (x) => x, 'µs', 2, flat);
  const sync = SIZES.map((n) => runPart<Awaited<ReturnType<typeof syncPart>>>('sync', n));
  row('gateway sync, idle: bytes per answer', sync, (s) => s.idle.bytesPerSync, 'B', 0, {
    maxRatio: TARGETS.idleSyncBytesGrowth,
  });
  row(
    `gateway sync, churn (${CHURN_UPSTREAMS} upstreams + ${CHURN_COOLDOWNS} cooldowns/s): bytes per answer`,
    sync,
    (s) => s.churn.bytesPerSync,
    'B',
    0,
    { maxRatio: TARGETS.churnSyncBytesGrowth },
  );
  row(
    '  idle share round: request bytes (held + wanted slots)',
    sync,
    (s) => s.idle.roundRequestBytes,
    'B',
    0,
  );
  const load = compiledLoad();
  const mem = SIZES.map((n) =>
    measureMemory(load, { proxies: n, leases: LEASES_PER_PROXY * n, cooldowns: COOLDOWNS_PER_PROXY * n }),
  );
  row(
    `RSS, ${LEASES_PER_PROXY} leases + ${COOLDOWNS_PER_PROXY} cooldowns per proxy (compiled)`,
    mem,
    (m) => m.rssMB,
    'MB',
    1,
    { maxRatio: TARGETS.rssGrowth },
  );
  row('  JS heap used', mem, (m) => m.heapUsedMB, 'MB', 1);

  const missed: string[] = [];
  console.log(
    `scale bench: ${SIZES[0]} vs ${SIZES[1]} proxies (load average ${load0.toFixed(1)} at start, ${loadavg()[0]!.toFixed(1)} at end, 2 cores)`,
  );
  console.log(`  ${'figure'.padEnd(72)} ${'1,000'.padStart(10)} ${'10,000'.padStart(10)}  ratio`);
  for (const r of rows) {
    const ratio = r.large / r.small;
    const problems: string[] = [];
    if (r.maxRatio !== undefined && !(ratio <= r.maxRatio))
      problems.push(`ratio ${ratio.toFixed(2)} > ${r.maxRatio}`);
    if (r.max !== undefined && !(r.small <= r.max && r.large <= r.max)) problems.push(`over ${r.max}`);
    if (r.maxLarge !== undefined && !(r.large <= r.maxLarge)) problems.push(`10,000 over ${r.maxLarge}`);
    const target =
      r.maxRatio !== undefined
        ? `≤ ×${r.maxRatio}`
        : r.max !== undefined
          ? `≤ ${r.max}`
          : r.maxLarge !== undefined
            ? `≤ ${r.maxLarge} at 10,000`
            : '';
    const v = (x: number) => `${x.toFixed(r.digits)} ${r.unit}`.trim().padStart(10);
    const verdict = target === '' ? '' : problems.length === 0 ? `${target} ok` : `${target} MISSED`;
    console.log(`  ${r.what.padEnd(72)} ${v(r.small)} ${v(r.large)}  ×${ratio.toFixed(2)}  ${verdict}`);
    if (problems.length > 0) missed.push(`${r.what.trim()}: ${problems.join(', ')}`);
  }
  for (const [i, p] of probe.entries()) {
    if (p.maxLagMs >= p.intervalMs)
      missed.push(`probing at ${SIZES[i]}: a probe ${p.maxLagMs} ms late (interval ${p.intervalMs} ms)`);
    if (p.unhealthy > 0) missed.push(`probing at ${SIZES[i]}: ${p.unhealthy} proxies judged unhealthy`);
  }
  if (api.errors > 0) missed.push(`API rounds: ${api.errors} failed requests`);
  console.log(`  (${((Date.now() - started) / 1000).toFixed(0)} s)`);
  if (missed.length > 0) {
    console.log(`targets missed:\n  ${missed.join('\n  ')}`);
    process.exitCode = 1;
  }
}

const [role, name, arg] = process.argv.slice(2);
if (role === 'part') {
  const a = JSON.parse(arg ?? 'null') as never;
  const parts: Record<string, (a: never) => Promise<unknown>> = {
    reconcile: reconcilePart,
    probe: probePart,
    api: apiPart,
    sync: syncPart,
  };
  const part = parts[name ?? ''];
  if (!part) throw new Error(`no scale part ${name}`);
  process.stdout.write(`${JSON.stringify(await part(a))}\n`);
  process.exit(0);
} else {
  await main();
}
