/**
 * bench/run — `npm run bench`: runs every benchmark (targets: docs/benchmarks.md), each in its own process so
 * they do not share heap, JIT state or CPU, and prints their figures one after another. The gateway
 * bench's mitmproxy comes from its private venv, made (or found cached) first (scripts/ci/venv.sh).
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const BENCHES = [
  ['reconcile', 'reconcile.ts'],
  ['pool', 'pool.ts'],
  ['lease', 'lease.ts'],
  ['health', 'health.ts'],
  ['memory', 'memory.ts'],
  ['gateway', 'gateway.ts'],
  ['dashboard', 'dashboard.ts'],
  ['scale', 'scale.ts'],
] as const;

const only = process.argv.slice(2);
let failed = 0;
if (only.length === 0 || only.includes('gateway')) {
  const venv = fileURLToPath(new URL('../scripts/ci/venv.sh', import.meta.url));
  const res = spawnSync('bash', [venv, 'mitmproxy'], { stdio: ['ignore', 'ignore', 'inherit'] });
  if (res.status !== 0) {
    console.log(`bash ${venv} mitmproxy failed (exit ${res.status}): the gateway bench needs mitmproxy`);
    process.exit(res.status ?? 1);
  }
}
for (const [name, file] of BENCHES) {
  if (only.length > 0 && !only.includes(name)) continue;
  console.log(`\n=== ${name} ===`);
  const started = Date.now();
  const res = spawnSync(process.execPath, [fileURLToPath(new URL(file, import.meta.url))], {
    stdio: 'inherit',
  });
  console.log(`(${name}: ${((Date.now() - started) / 1000).toFixed(1)} s, exit ${res.status})`);
  if (res.status !== 0) failed++;
}
if (failed > 0) {
  console.log(`\n${failed} benchmark(s) missed a target or failed`);
  process.exitCode = 1;
}
