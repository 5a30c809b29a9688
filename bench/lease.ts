/**
 * bench/lease — the lease targets of docs/benchmarks.md. The discovery API (1,000 proxies) and a
 * bare node:http server that does the same visible work — parse the same JSON body, answer a
 * JSON body of the same size, 204 to the DELETE — take turns in interleaved rounds under one
 * load generator that runs in its own process (bench/loadgen.ts), so each server's CPU is its
 * own. The medians of the rounds give the throughput and p99 ratios; the server CPU per request
 * is a second view. Then the store alone: selection cost at 100 vs 10,000 proxies, plain, with
 * a selector, with 90 % of the fleet cooling down for the requested target, and a refused grant
 * (409 and its counts) when the rest of the fleet is at capacity. Exits non-zero
 * when a target is missed.
 */
// The server runs with the product's V8 settings (src/runtime/v8-flags.ts), applied first as there.
import '../src/runtime/v8-flags.ts';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadavg } from 'node:os';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Registry } from 'prom-client';
import { startDiscoveryServer } from '../src/discovery/server.ts';
import { LeaseStore } from '../src/lease/store.ts';
import type { ProxyInfo } from '../src/lease/types.ts';
import type { LoadgenArgs, LoadgenResult } from './loadgen.ts';

export interface LeaseBenchOptions {
  durationMs?: number;
  warmupMs?: number;
  rounds?: number;
  clients?: number;
  proxies?: number;
  /** Print the table (default true). */
  print?: boolean;
}

interface ServerFigures {
  requestsPerSecond: number;
  p99Millis: number;
  cpuMicrosPerRequest: number;
  errors: number;
}

interface Growth {
  smallNs: number;
  largeNs: number;
  growth: number;
}

export interface LeaseBenchResult {
  bare: ServerFigures;
  api: ServerFigures;
  /** Median API requests/s ÷ median bare requests/s (target ≥ 0.70). */
  ratio: number;
  /** Median API p99 ÷ median bare p99 (target ≤ 1.5). */
  p99Ratio: number;
  /** Bare server CPU per request ÷ API server CPU per request (a second view). */
  cpuRatio: number;
  store: Growth;
  storeSelector: Growth;
  storeCooling: Growth;
  /** A 409 with its counts: 90 % cooling for the target, the rest at capacity. */
  storeRefusal: Growth;
  misses: string[];
}

export const TARGETS = { ratio: 0.7, p99Ratio: 1.5, storeGrowth: 2 } as const;

const TOKEN = 'bench-token';
const LEASE_BODY = JSON.stringify({ target: 'shop.example', ttlSeconds: 60 });
const LOADGEN = fileURLToPath(new URL('loadgen.ts', import.meta.url));

/** Proxy `i` of the benches' fleets (bench/scale too), unlimited unless `maxLeases` says otherwise. */
export function benchProxy(i: number, maxLeases = 0): ProxyInfo {
  const name = `px-${String(i).padStart(5, '0')}`;
  return {
    key: `bench/${name}`,
    namespace: 'bench',
    name,
    uid: `uid-${i}`,
    labels: { pool: i % 2 === 0 ? 'even' : 'odd' },
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    maxLeases,
    host: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`,
    port: 3128,
    credentials: { username: 'bench', password: 'secret' },
    latencyMillis: 20 + (i % 50),
  };
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

async function listen(server: Server): Promise<string> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** The bare baseline: the API's visible work and nothing else. */
function bareServer(grantBytes: number): Server {
  const idLength = 36;
  // {"id":"<36>","pad":"<n>"} is 20 bytes of framing around the id and the padding.
  const pad = 'x'.repeat(Math.max(0, grantBytes - idLength - 20));
  return createServer((req, res) => {
    if (req.method === 'DELETE') {
      req.resume();
      res.writeHead(204).end();
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const parsed = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { target?: string };
      const body = JSON.stringify({ id: crypto.randomUUID(), pad: parsed.target ? pad : '' });
      res.writeHead(201, {
        'content-type': 'application/json; charset=utf-8',
        'content-length': Buffer.byteLength(body),
      });
      res.end(body);
    });
  });
}

/** One round: the load generator in its own process; this process's CPU is the server's. */
function runRound(
  url: string,
  o: Required<LeaseBenchOptions>,
): Promise<{ gen: LoadgenResult; cpuMicros: number }> {
  return loadRound({
    url,
    body: LEASE_BODY,
    token: TOKEN,
    clients: o.clients,
    durationMs: o.durationMs,
    warmupMs: o.warmupMs,
  });
}

/** The load generator run once in its own process (bench/scale too), with this process's CPU over its measured window. */
export async function loadRound(args: LoadgenArgs): Promise<{ gen: LoadgenResult; cpuMicros: number }> {
  const child = spawn(process.execPath, [LOADGEN, JSON.stringify(args)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  // CPU is counted over the measured window only: from the end of the warm-up to the end.
  let cpu0: NodeJS.CpuUsage | undefined;
  const warm = setTimeout(() => {
    cpu0 = process.cpuUsage();
  }, args.warmupMs);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(warm);
  const cpu = process.cpuUsage(cpu0);
  if (code !== 0) throw new Error(`load generator exited ${code}`);
  return { gen: JSON.parse(out) as LoadgenResult, cpuMicros: cpu.user + cpu.system };
}

function figures(rounds: Array<{ gen: LoadgenResult; cpuMicros: number }>): ServerFigures {
  const requests = (r: LoadgenResult) => r.pairs * 2;
  return {
    requestsPerSecond: median(rounds.map((r) => requests(r.gen) / r.gen.seconds)),
    p99Millis: median(rounds.map((r) => r.gen.p99Millis)),
    cpuMicrosPerRequest: median(rounds.map((r) => r.cpuMicros / Math.max(1, requests(r.gen)))),
    errors: rounds.reduce((n, r) => n + r.gen.errors, 0),
  };
}

async function benchServers(
  o: Required<LeaseBenchOptions>,
): Promise<{ bare: ServerFigures; api: ServerFigures }> {
  const leases = new LeaseStore();
  for (let i = 0; i < o.proxies; i++) leases.upsertProxy(benchProxy(i));
  const api = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    token: TOKEN,
    registry: new Registry(),
  });
  // One real grant tells how large the API's answer is, so the bare server answers as much.
  const probe = await fetch(`${api.url}/v1/leases`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: LEASE_BODY,
  });
  const grant = (await probe.text()) as string;
  await fetch(`${api.url}/v1/leases/${(JSON.parse(grant) as { id: string }).id}`, {
    method: 'DELETE',
    headers: { authorization: `Bearer ${TOKEN}` },
  });
  const bare = bareServer(Buffer.byteLength(grant));
  const bareUrl = await listen(bare);
  const bareRounds: Array<{ gen: LoadgenResult; cpuMicros: number }> = [];
  const apiRounds: Array<{ gen: LoadgenResult; cpuMicros: number }> = [];
  for (let i = 0; i < o.rounds; i++) {
    bareRounds.push(await runRound(bareUrl, o));
    apiRounds.push(await runRound(api.url, o));
  }
  bare.close();
  await api.close();
  leases.close();
  return { bare: figures(bareRounds), api: figures(apiRounds) };
}

function filledStore(proxies: number, coolingFraction: number, refusing = false): LeaseStore {
  const leases = new LeaseStore();
  for (let i = 0; i < proxies; i++) leases.upsertProxy(benchProxy(i, refusing ? 1 : 0));
  // Cool the requested target down on a share of the fleet (blocked there for an hour).
  const cooling = Math.floor(proxies * coolingFraction);
  for (let i = 0; i < cooling; i++) {
    const out = leases.lease({ target: 'shop.example' });
    if (out.granted) leases.report(out.grant.id, { result: 'blocked', cooldownSeconds: 3600 });
  }
  // Hold a quarter of the fleet so buckets above zero are populated too; when refusing, hold
  // every proxy not cooling (one lease each fills it): every grant for the target is a 409.
  const held = refusing ? proxies - cooling : proxies / 4;
  for (let i = 0; i < held; i++) leases.lease({});
  if (refusing && leases.lease({ target: 'shop.example' }).granted) throw new Error('bench store not full');
  return leases;
}

function storeRound(leases: LeaseStore, selector: string | undefined, ops: number): number {
  const req = { target: 'shop.example', ...(selector ? { selector } : {}) };
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < ops; i++) {
    const out = leases.lease(req);
    if (out.granted) leases.release(out.grant.id);
  }
  return Number(process.hrtime.bigint() - t0) / ops;
}

/** ns per grant+release in the store alone at two fleet sizes: rounds interleaved, best of each. */
function storeCost(
  selector: string | undefined,
  coolingFraction = 0,
  refusing = false,
  ops = 50_000,
  rounds = 7,
): Growth {
  const small = filledStore(100, coolingFraction, refusing);
  const large = filledStore(10_000, coolingFraction, refusing);
  let smallNs = Number.POSITIVE_INFINITY;
  let largeNs = Number.POSITIVE_INFINITY;
  for (let r = 0; r < rounds; r++) {
    smallNs = Math.min(smallNs, storeRound(small, selector, ops));
    largeNs = Math.min(largeNs, storeRound(large, selector, ops));
  }
  small.close();
  large.close();
  return { smallNs, largeNs, growth: largeNs / smallNs };
}

export async function runLeaseBench(options: LeaseBenchOptions = {}): Promise<LeaseBenchResult> {
  const o: Required<LeaseBenchOptions> = {
    durationMs: options.durationMs ?? 3000,
    warmupMs: options.warmupMs ?? 1000,
    rounds: options.rounds ?? 5,
    clients: options.clients ?? 64,
    proxies: options.proxies ?? 1000,
    print: options.print ?? true,
  };
  const store = storeCost(undefined);
  const storeSelector = storeCost('pool=even');
  const storeCooling = storeCost(undefined, 0.9);
  const storeRefusal = storeCost(undefined, 0.9, true);
  const { bare, api } = await benchServers(o);
  const r: LeaseBenchResult = {
    bare,
    api,
    ratio: api.requestsPerSecond / bare.requestsPerSecond,
    p99Ratio: api.p99Millis / bare.p99Millis,
    cpuRatio: bare.cpuMicrosPerRequest / api.cpuMicrosPerRequest,
    store,
    storeSelector,
    storeCooling,
    storeRefusal,
    misses: [],
  };
  if (r.ratio < TARGETS.ratio) r.misses.push(`API ÷ bare req/s ${r.ratio.toFixed(2)} < ${TARGETS.ratio}`);
  if (r.p99Ratio > TARGETS.p99Ratio)
    r.misses.push(`API ÷ bare p99 ${r.p99Ratio.toFixed(2)} > ${TARGETS.p99Ratio}`);
  if (api.errors > 0) r.misses.push(`${api.errors} API errors`);
  for (const [what, g] of [
    ['store', store],
    ['store with selector', storeSelector],
    ['store, 90 % cooling for the target', storeCooling],
    ['store refusal (409 counts)', storeRefusal],
  ] as const) {
    if (g.growth > TARGETS.storeGrowth)
      r.misses.push(`${what}: ×${g.growth.toFixed(2)} > ×${TARGETS.storeGrowth}`);
  }
  if (o.print) printTable(r, o);
  return r;
}

function printTable(r: LeaseBenchResult, o: Required<LeaseBenchOptions>): void {
  const f = (n: number, d = 0) => n.toFixed(d);
  const ok = (pass: boolean) => (pass ? 'ok' : 'MISSED');
  const server = (s: ServerFigures) =>
    `p99 ${f(s.p99Millis, 2)} ms, server ${f(s.cpuMicrosPerRequest)} µs CPU/req${s.errors ? `, ${s.errors} errors` : ''}`;
  const growth = (g: Growth) => `${f(g.smallNs)} → ${f(g.largeNs)} ns/op`;
  const rows: [string, string, string][] = [
    ['bare node:http, same JSON in and out', `${f(r.bare.requestsPerSecond)} req/s`, server(r.bare)],
    [
      `discovery API grant+release (${o.proxies} proxies)`,
      `${f(r.api.requestsPerSecond)} req/s`,
      server(r.api),
    ],
    [`API ÷ bare req/s (target ≥ ${TARGETS.ratio})`, f(r.ratio, 2), ok(r.ratio >= TARGETS.ratio)],
    [`API ÷ bare p99 (target ≤ ${TARGETS.p99Ratio})`, f(r.p99Ratio, 2), ok(r.p99Ratio <= TARGETS.p99Ratio)],
    ['bare ÷ API server CPU per request', f(r.cpuRatio, 2), `load average ${f(loadavg()[0] ?? 0, 1)}`],
    [
      'store grant+release, 100 → 10,000 proxies',
      growth(r.store),
      `×${f(r.store.growth, 2)} ${ok(r.store.growth <= 2)}`,
    ],
    [
      'same with selector pool=even',
      growth(r.storeSelector),
      `×${f(r.storeSelector.growth, 2)} ${ok(r.storeSelector.growth <= 2)}`,
    ],
    [
      'same, 90 % cooling down for the target',
      growth(r.storeCooling),
      `×${f(r.storeCooling.growth, 2)} ${ok(r.storeCooling.growth <= 2)}`,
    ],
    [
      '409 with counts: 90 % cooling, the rest full',
      growth(r.storeRefusal),
      `×${f(r.storeRefusal.growth, 2)} ${ok(r.storeRefusal.growth <= 2)}`,
    ],
  ];
  const w0 = Math.max(...rows.map((x) => x[0].length));
  const w1 = Math.max(...rows.map((x) => x[1].length));
  console.log(
    `lease bench: ${o.clients} clients, ${o.rounds} interleaved rounds of ${o.durationMs / 1000} s, medians; load generator in its own process`,
  );
  for (const [a, b, c] of rows) console.log(`  ${a.padEnd(w0)}  ${b.padEnd(w1)}  ${c}`);
  if (r.misses.length > 0) console.log(`  targets missed: ${r.misses.join('; ')}`);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const r = await runLeaseBench();
  if (r.misses.length > 0) process.exitCode = 1;
}
