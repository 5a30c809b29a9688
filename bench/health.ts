/**
 * bench/health — the health target of docs/benchmarks.md: 1,000 proxies probed once a second each through local
 * CONNECT proxies to a local TLS origin (both in a child process), TLS resumption on. Reports
 * the engine process's CPU per probe and in cores, and the worst start delay behind schedule.
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { HealthEngine, type HealthVerdict } from '../src/health/engine.ts';
import { createMemoryStore } from '../src/runtime/memory.ts';

export interface HealthBenchOptions {
  proxies?: number;
  warmupMs?: number;
  durationMs?: number;
  /** Each proxy's probe interval (default 1 s: 1,000 proxies make 1,000 probes/s). */
  intervalMs?: number;
  print?: boolean;
}

export interface HealthBenchResult {
  proxies: number;
  probes: number;
  probesPerSecond: number;
  cpuMsPerProbe: number;
  /** The kernel's share of it (socket calls; loopback delivery is billed to the sender). */
  systemMsPerProbe: number;
  /** Engine process CPU time ÷ wall time (target ≤ 1). */
  cpuCores: number;
  maxLagMs: number;
  skipped: number;
  healthy: number;
  unhealthy: number;
  /** CPU of the proxies + origin child process, in cores (it shares the machine). */
  farSideCores: number;
  /** Status writes in the measured window (verdicts and latency updates). */
  statusWrites: number;
}

/** utime+stime of a process from /proc (Linux), ms; 0 elsewhere. */
function childCpuMs(pid: number | undefined): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
  } catch {
    return 0;
  }
}

interface Servers {
  origin: number;
  proxies: number[];
  ca: string;
  username: string;
  password: string;
}

export async function runHealthBench(opts: HealthBenchOptions = {}): Promise<HealthBenchResult> {
  const n = opts.proxies ?? 1000;
  const warmupMs = opts.warmupMs ?? 5000;
  const durationMs = opts.durationMs ?? 14_000;
  // Origin and proxies in two processes: on a 2-core box one process cannot serve both sides.
  const children = ['origin', 'proxies'].map((role) =>
    spawn(process.execPath, [fileURLToPath(new URL('./health-servers.ts', import.meta.url)), role, '20'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    }),
  );
  const farCpuMs = () => children.reduce((sum, c) => sum + childCpuMs(c.pid), 0);
  try {
    const lines = await Promise.all(
      children.map(
        (child) =>
          new Promise<string>((resolve, reject) => {
            createInterface({ input: child.stdout! }).once('line', resolve);
            child.once('exit', (code) => reject(new Error(`bench servers exited with ${code}`)));
          }),
      ),
    );
    const servers = Object.assign({}, ...lines.map((l) => JSON.parse(l))) as Servers;
    const store = createMemoryStore();
    for (let i = 0; i < n; i++) {
      const name = `px-${i}`;
      store.seedSecret({
        metadata: { name: `${name}-auth`, namespace: 'bench' },
        stringData: { username: servers.username, password: servers.password },
      });
      store.seedProxy({
        metadata: { name, namespace: 'bench' },
        spec: {
          type: 'External',
          endpoint: { host: '127.0.0.1', port: servers.proxies[i % servers.proxies.length]! },
          credentialsSecretRef: { name: `${name}-auth` },
        },
      });
    }
    const verdicts = new Map<string, boolean>();
    const engine = new HealthEngine({
      store,
      ca: servers.ca,
      defaults: {
        url: `https://127.0.0.1:${servers.origin}/generate_204`,
        intervalMs: opts.intervalMs ?? 1000,
      },
      listener: (v: HealthVerdict) => verdicts.set(v.key, v.healthy),
    });
    engine.start();
    await new Promise((r) => setTimeout(r, warmupMs));
    engine.resetStats();
    const far0 = farCpuMs();
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, durationMs));
    const cpu = process.cpuUsage(cpu0);
    const wall = performance.now() - t0;
    const farCores = (farCpuMs() - far0) / wall;
    const stats = engine.stats();
    await engine.stop();
    const cpuMs = (cpu.user + cpu.system) / 1000;
    let healthy = 0;
    for (const h of verdicts.values()) if (h) healthy++;
    const result: HealthBenchResult = {
      proxies: n,
      probes: stats.probes,
      probesPerSecond: (stats.probes / wall) * 1000,
      cpuMsPerProbe: cpuMs / Math.max(1, stats.probes),
      systemMsPerProbe: cpu.system / 1000 / Math.max(1, stats.probes),
      cpuCores: cpuMs / wall,
      maxLagMs: stats.maxLagMs,
      skipped: stats.skipped,
      healthy,
      unhealthy: verdicts.size - healthy,
      farSideCores: farCores,
      statusWrites: stats.statusWrites,
    };
    if (opts.print ?? true) {
      const rows: Array<[string, string, string]> = [
        ['proxies', String(n), ''],
        ['probes/s', result.probesPerSecond.toFixed(0), `≈ ${n}`],
        ['CPU ms per probe', result.cpuMsPerProbe.toFixed(3), ''],
        ['  of it in the kernel', result.systemMsPerProbe.toFixed(3), ''],
        ['engine CPU (cores)', result.cpuCores.toFixed(2), '≤ 1'],
        ['max lag behind schedule (ms)', String(Math.round(result.maxLagMs)), '< 1000'],
        ['slots skipped (probe still running)', String(result.skipped), ''],
        ['proxies + origin CPU (cores, children)', result.farSideCores.toFixed(2), ''],
        ['machine load average (1 min, 2 cores)', loadavg()[0]!.toFixed(1), 'other work skews lag'],
        ['healthy / unhealthy verdicts', `${healthy} / ${result.unhealthy}`, ''],
      ];
      console.log(
        'health engine benchmark (TLS resumption on; CONNECT proxies and TLS origin in child processes)',
      );
      for (const [k, v, t] of rows) console.log(`  ${k.padEnd(38)} ${v.padStart(10)}  ${t}`);
    }
    return result;
  } finally {
    for (const child of children) {
      child.stdin?.end();
      child.kill('SIGTERM');
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  await runHealthBench();
}
