/**
 * The TypeScript client as an installed package: `npm run build`'s output (tsconfig.build.json)
 * with the repository's package.json, installed in a consumer's node_modules. The imports
 * docs/lease-api.md shows — `DiscoveryClient`, `NoneLeasableError` and the crawler helpers
 * (`withLease`, `classifyError`, …) from 'egress-proxies-operator' — resolve through
 * package.json's `exports` in Node and type-check with its declarations under a strict nodenext
 * tsconfig.
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NODE, REPO_ROOT } from '../../support/cli.ts';

const TSC = join(REPO_ROOT, 'node_modules/.bin/tsc');
let dir: string;
let consumer: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'package-exports-'));
  const pkg = join(dir, 'egress-proxies-operator');
  mkdirSync(pkg);
  execFileSync(TSC, ['-p', join(REPO_ROOT, 'tsconfig.build.json'), '--outDir', join(pkg, 'dist')], {
    cwd: REPO_ROOT,
    stdio: 'pipe',
  });
  copyFileSync(join(REPO_ROOT, 'package.json'), join(pkg, 'package.json'));
  consumer = join(dir, 'consumer');
  mkdirSync(join(consumer, 'node_modules'), { recursive: true });
  symlinkSync(pkg, join(consumer, 'node_modules', 'egress-proxies-operator'));
  // The consumer's own @types/node (fetch, AbortSignal in the declarations).
  symlinkSync(join(REPO_ROOT, 'node_modules', '@types'), join(consumer, 'node_modules', '@types'));
  writeFileSync(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', type: 'module' }));
}, 120_000);

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("the package's exports", () => {
  it('resolves the documented import in Node', () => {
    writeFileSync(
      join(consumer, 'use.js'),
      `import { DiscoveryClient, NoneLeasableError, classifyError, withLease } from 'egress-proxies-operator';
const c = new DiscoveryClient({ baseUrl: 'http://127.0.0.1:1' });
console.log(JSON.stringify([typeof DiscoveryClient, typeof NoneLeasableError, typeof c.lease, typeof c.reportProxy, typeof withLease, classifyError(new Error('x'))]));
`,
    );
    const out = execFileSync(NODE, ['use.js'], { cwd: consumer, encoding: 'utf8' });
    expect(JSON.parse(out)).toEqual(['function', 'function', 'function', 'function', 'function', 'unknown']);
  });

  it('type-checks the documented import with the declarations the build ships', () => {
    writeFileSync(
      join(consumer, 'check.ts'),
      `import { DiscoveryClient, type LeaseGrant, NoneLeasableError, PROXY_FAULT, classifyError, withLease } from 'egress-proxies-operator';
const discovery = new DiscoveryClient({ baseUrl: 'http://127.0.0.1:1', token: process.env.DISCOVERY_TOKEN });
export async function once(): Promise<LeaseGrant | string | null> {
  try {
    return await discovery.lease({ target: 'shop.example', selector: 'pool=eu', ttlSeconds: 120 });
  } catch (err) {
    if (err instanceof NoneLeasableError) return err.retryAt;
    throw err;
  }
}
export const held = (url: string) =>
  withLease(discovery, { target: url }, async (lease) => {
    await lease.report('blocked', { cooldownSeconds: 30 });
    return classifyError(new Error(url)) === PROXY_FAULT ? lease.grant.proxy.url : null;
  }, { waitMs: 1000 });
`,
    );
    writeFileSync(
      join(consumer, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2023',
          lib: ['es2023'],
          types: ['node'],
          strict: true,
          noEmit: true,
        },
        files: ['check.ts'],
      }),
    );
    let output = '';
    try {
      execFileSync(TSC, ['-p', consumer], { cwd: consumer, encoding: 'utf8', stdio: 'pipe' });
    } catch (err) {
      output = String((err as { stdout?: string }).stdout ?? err);
    }
    expect(output).toBe('');
  });
});
