/**
 * bench/memory-load — the memory bench's load, run by bench/memory.ts on the compiled operator
 * (dist/), as the container image runs it: 1,000 Ready proxies (objects, credentials Secrets,
 * lease entries fed from the store), 5,000 active leases and 100,000 per-target cooldown
 * entries (each from a `blocked` report, so the 100,000 ended-but-reportable leases those
 * reports leave behind are in too). Prints one JSON line with the figures.
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { startLeaseFeed } from '../src/lease/feed.ts';
import { LeaseStore } from '../src/lease/store.ts';
import { createMemoryStore } from '../src/runtime/memory.ts';

export interface MemoryBenchResult {
  proxies: number;
  leases: number;
  cooldowns: number;
  /** Ended leases still reportable (kept by time within the `--ended-lease-memory` budget). */
  endedLeases: number;
  rssMB: number;
  heapUsedMB: number;
}

function collectGarbage(): void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  gc();
  gc();
}

export async function runMemoryBench(
  opts: { proxies?: number; leases?: number; cooldowns?: number } = {},
): Promise<MemoryBenchResult> {
  const n = opts.proxies ?? 1000;
  const leaseCount = opts.leases ?? 5000;
  const cooldownCount = opts.cooldowns ?? 100_000;
  const store = createMemoryStore();
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  for (let i = 0; i < n; i++) {
    const name = `px-${i}`;
    store.seedSecret({
      metadata: {
        name: `${name}-auth`,
        namespace: 'crawl',
        labels: { 'crawl.example.com/credentials-for': name },
      },
      data: { username: b64(`user-${i}`), password: b64(`password-${i}-${'x'.repeat(24)}`) },
    });
    store.seedProxy({
      metadata: { name, namespace: 'crawl', labels: { pool: i % 2 ? 'eu' : 'us' } },
      spec: { provider: 'gcp-main' },
      status: {
        phase: 'Ready',
        address: `10.0.${i >> 8}.${i & 255}`,
        port: 3128,
        conditions: [
          {
            type: 'Healthy',
            status: 'True',
            reason: 'ProbeSucceeded',
            lastTransitionTime: new Date().toISOString(),
          },
        ],
      },
    });
  }
  const leases = new LeaseStore({ sweepIntervalMs: 60_000 });
  const ctrl = new AbortController();
  const feed = startLeaseFeed({ store, leases, signal: ctrl.signal });
  await feed.idle();
  // Blocked reports first: one target cooldown each, spread over the fleet.
  for (let i = 0; i < cooldownCount; i++) {
    const out = leases.lease({ target: `blocked-${i}.example`, ttlSeconds: 3600 });
    if (out.granted) leases.report(out.grant.id, { result: 'blocked', cooldownSeconds: 86_400 });
  }
  const cooldowns = leases.targetCooldownCount();
  let granted = 0;
  for (let i = 0; granted < leaseCount && i < leaseCount * 2; i++) {
    const out = leases.lease({ target: `site-${i % 50}.example`, ttlSeconds: 3600 });
    if (out.granted) granted++;
  }
  collectGarbage();
  const mem = process.memoryUsage();
  const endedLeases = leases.endedLeaseStats().client.leases;
  feed.stop();
  ctrl.abort();
  leases.close();
  return {
    proxies: n,
    leases: granted,
    cooldowns,
    endedLeases,
    rssMB: mem.rss / 2 ** 20,
    heapUsedMB: mem.heapUsed / 2 ** 20,
  };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const opts = JSON.parse(process.argv[2] ?? '{}') as Parameters<typeof runMemoryBench>[0];
  process.stdout.write(`${JSON.stringify(await runMemoryBench(opts))}\n`);
}
