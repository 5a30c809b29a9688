/**
 * bench/memory — resident memory of the lease path under load (bench/memory-load.ts). Target
 * (docs/benchmarks.md): ≤ 200 MB RSS. The load runs on the compiled operator (dist/, built here
 * with `tsc -p tsconfig.build.json`) in a process of its own, as the container image runs it:
 * running the TypeScript sources directly would add Node's type-stripping compiler and its
 * memory (~30 MB here) to a figure that production never pays.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { stripTypeScriptTypes } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { NODE_LAUNCH_FLAGS } from '../src/runtime/v8-flags.ts';
import type { MemoryBenchResult } from './memory-load.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TARGET_MB = 180;

/** The load script as plain JavaScript importing the compiled modules (bench/scale runs it too). */
export function compiledLoad(): string {
  const build = spawnSync(join(ROOT, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.build.json'], {
    cwd: ROOT,
    stdio: 'inherit',
  });
  if (build.status !== 0) throw new Error('building dist/ failed');
  const source = stripTypeScriptTypes(readFileSync(join(ROOT, 'bench', 'memory-load.ts'), 'utf8'));
  const js = source.replace(
    /(from |import )'\.\.\/src\/([^']+)\.ts'/g,
    (_m, keyword: string, path: string) => {
      return `${keyword}'${pathToFileURL(join(ROOT, 'dist', `${path}.js`)).href}'`;
    },
  );
  const out = join(ROOT, 'dist', 'bench', 'memory-load.mjs');
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, js);
  return out;
}

/**
 * Runs the compiled load in a process of its own with the product's launch flags and returns its
 * figures (RSS read by the load itself after a full collection, as `ps` would show it).
 */
export function measureMemory(
  load: string,
  opts: { proxies?: number; leases?: number; cooldowns?: number } = {},
): MemoryBenchResult {
  const run = spawnSync(process.execPath, [...NODE_LAUNCH_FLAGS, load, JSON.stringify(opts)], {
    cwd: ROOT,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (run.status !== 0) throw new Error(`memory load exited ${run.status}`);
  return JSON.parse(run.stdout) as MemoryBenchResult;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const r = measureMemory(compiledLoad());
  const ok = r.rssMB <= TARGET_MB;
  console.log(
    `memory (compiled, as in the image): ${r.proxies} proxies, ${r.leases} active leases, ${r.cooldowns} target cooldowns, ${r.endedLeases} ended leases kept for late reports: RSS ${r.rssMB.toFixed(1)} MB, heap ${r.heapUsedMB.toFixed(1)} MB (target RSS ≤ ${TARGET_MB} MB) ${ok ? 'PASS' : 'FAIL'}`,
  );
  if (!ok) process.exitCode = 1;
}
