/**
 * `npm start`, the README's first command, run as a user runs it: npm itself, the script as
 * package.json has it, on the example in examples/standalone (its three Proxies and its
 * ProxyPool). The example is a private copy on free loopback ports, seen by npm as
 * `examples/standalone` of a scratch package directory whose `src` and `node_modules` are the
 * repository's. It serves leases, and a SIGTERM or SIGINT sent to the npm process — not to its
 * group, as a supervisor or a terminal's Ctrl-C through `kill` would — stops the operator cleanly:
 * npm exits 0, no process of the group is left, and every port it held is free again.
 */
import { execFileSync } from 'node:child_process';
import {
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  accepts,
  CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  NODE,
  REPO_ROOT,
  type Workspace,
  waitFor,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 120_000 });
afterEach(cleanupCli);

/** The example: three named Proxies and a ProxyPool of two. */
const EXAMPLE_PROXIES = 5;

/** npm's own CLI script, run with the repository's node (fails naming the fix when npm is missing). */
function npmCli(): string {
  let npm: string;
  try {
    npm = execFileSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' }).trim();
  } catch {
    throw new Error('npm is not on PATH: the test runs `npm start` as the README does; install npm');
  }
  const real = realpathSync(npm);
  const cli = real.endsWith('.js') ? real : join(real, '..', '..', 'lib/node_modules/npm/bin/npm-cli.js');
  if (!existsSync(cli)) throw new Error(`cannot find npm-cli.js behind ${npm} (${real})`);
  return cli;
}

/**
 * A package directory for npm: copies of the repository's package.json and src (the entry point
 * runs only when started by its own path), its node_modules, the workspace as the example.
 */
function scratchPackage(ws: Workspace): string {
  const dir = mkdtempSync(join(tmpdir(), 'npm-start-'));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  // package.json copied (npm writes nothing to it), so the start script is exactly the repository's.
  copyFileSync(join(REPO_ROOT, 'package.json'), join(dir, 'package.json'));
  cpSync(join(REPO_ROOT, 'src'), join(dir, 'src'), { recursive: true });
  symlinkSync(join(REPO_ROOT, 'node_modules'), join(dir, 'node_modules'));
  mkdirSync(join(dir, 'examples'));
  symlinkSync(ws.dir, join(dir, 'examples', 'standalone'));
  return dir;
}

/** Whether any process of the process group `pgid` is still alive. */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('npm start', () => {
  it('runs the script package.json has: exec node on the standalone example', () => {
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
      scripts: Record<string, string>;
    };
    expect(pkg.scripts.start).toBe('exec node src/cmd/main.ts standalone --config examples/standalone');
  });

  it.each(['SIGTERM', 'SIGINT'] as const)(
    'serves leases from the example, and stops cleanly on %s sent to npm',
    async (sig) => {
      const ws = await createWorkspace({ pool: true });
      const dir = scratchPackage(ws);
      const proc = new CliProcess(
        [
          // The example's own addresses, moved to free ports: many tests run at once.
          '--discovery-bind-address',
          `127.0.0.1:${ws.discoveryPort}`,
          '--health-probe-bind-address',
          `127.0.0.1:${ws.healthPort}`,
          '--gateway-bind-address',
          '127.0.0.1:0',
          '--log-format',
          'json',
        ],
        dir,
        // --silent: no script banner from npm, only the operator's JSON lines on stdout.
        {
          command: [NODE, npmCli(), 'start', '--silent', '--'],
          env: { npm_config_update_notifier: 'false' },
        },
      );
      const client = clientFor(ws);
      const proxies = await waitFor(
        async () => {
          const list = await client.listProxies().catch(() => []);
          return (
            list.length === EXAMPLE_PROXIES && list.every((p) => p.phase === 'Ready' && p.healthy) && list
          );
        },
        `the example's ${EXAMPLE_PROXIES} proxies Ready and healthy`,
        90_000,
        proc,
      );
      expect(proxies.filter((p) => p.name.startsWith('demo-'))).toHaveLength(2);
      // The state is where the README says: .state/ beside package.json.
      expect(existsSync(join(dir, '.state', 'standalone-state.json'))).toBe(true);

      const grant = await client.lease({ target: 'shop.example', ttlSeconds: 60 });
      expect(grant.proxy.url).toMatch(/^http:\/\/lease-/);
      expect(await accepts(grant.proxy.port)).toBe(true);
      await client.release(grant.id);
      const ports = proxies.map((p) => p.port as number);

      proc.signal(sig);
      const exit = await waitFor(() => proc.hasExited && proc.exited, `npm exits after ${sig}`, 40_000);
      expect(exit, proc.tail()).toEqual({ code: 0, signal: null });
      // Nothing of the group outlives npm: the operator got the signal and is gone.
      await waitFor(() => !groupAlive(proc.pid), 'no process left in the group', 10_000);
      expect(await accepts(ws.discoveryPort)).toBe(false);
      expect(await accepts(ws.healthPort)).toBe(false);
      for (const port of ports) expect(await accepts(port)).toBe(false);
      expect(proc.logs.some((l) => l.msg === 'standalone store ready')).toBe(true);
      expect(proc.logs.filter((l) => l.level >= 50)).toEqual([]);
    },
  );
});
