/**
 * `npm start`, the README's first command, run as a user runs it: npm itself, the script as
 * package.json has it, on the example in examples/standalone (its three Proxies and its
 * ProxyPool). The example is a private copy on free loopback ports, seen by npm as
 * `examples/standalone` of a scratch package directory whose `src` and `node_modules` are the
 * repository's. It serves leases, and a SIGTERM or SIGINT sent to the npm process — not to its
 * group, as a supervisor or a terminal's Ctrl-C through `kill` would — stops the operator cleanly:
 * npm exits 0, no process of the group is left, and every port it held is free again.
 *
 * A terminal's Ctrl-C is SIGINT to the whole foreground group: the operator gets it from the
 * terminal and once more from npm, milliseconds apart. Pressed twice quickly, that is one
 * graceful stop: the lease and the cooldown decided just before are there after the next
 * `npm start`, and `.state/` holds neither the lock nor a temporary file. A second Ctrl-C after
 * the window, while the stop is held up (a client still sending its request), exits at once —
 * still leaving no temporary file, and nothing the next start cannot take over.
 */
import { execFileSync } from 'node:child_process';
import {
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { ProxySnapshot } from '../../../src/discovery/client.ts';
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
import { until } from '../../support/wait.ts';

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

/** `npm start` in `dir` on the workspace's ports; resolves once the example's proxies are Ready. */
async function npmStart(
  ws: Workspace,
  dir: string,
  extraArgs: string[] = [],
): Promise<{ proc: CliProcess; proxies: ProxySnapshot[] }> {
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
      ...extraArgs,
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
      return list.length === EXAMPLE_PROXIES && list.every((p) => p.phase === 'Ready' && p.healthy) && list;
    },
    `the example's ${EXAMPLE_PROXIES} proxies Ready and healthy`,
    90_000,
    proc,
  );
  return { proc, proxies };
}

/** What a terminal does on Ctrl-C: SIGINT to every process of the foreground group. */
function ctrlC(proc: CliProcess): void {
  process.kill(-proc.pid, 'SIGINT');
}

/** The lock and temporary files in the example's `.state/`: none after any stop. */
function leftovers(dir: string): string[] {
  return readdirSync(join(dir, '.state')).filter((n) => n.endsWith('.lock') || n.includes('.tmp-'));
}

/** How long signals after the first count as that one (the manager's default). */
const SIGNAL_WINDOW_MS = 1000;

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
      const { proc, proxies } = await npmStart(ws, dir);
      const client = clientFor(ws);
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
      expect(leftovers(dir)).toEqual([]);
    },
  );

  it("Ctrl-C pressed twice quickly (SIGINT to npm's group, twice, and npm's copies) is one graceful stop that keeps leases and cooldowns", async () => {
    const ws = await createWorkspace({ pool: true });
    const dir = scratchPackage(ws);
    // debug: the signals counted as the first one are logged.
    const first = await npmStart(ws, dir, ['--log-level', 'debug']);
    const client = clientFor(ws);
    const held = await client.lease({ target: 'shop.example', ttlSeconds: 300 });
    const refused = await client.lease({ target: 'shop.example', ttlSeconds: 300 });
    await client.report(refused.id, { result: 'blocked', cooldownSeconds: 3600 });

    ctrlC(first.proc);
    // Two kill(2)s in a row reach a process as one (a pending signal is not queued twice): the
    // second press comes once the operator has taken the first, well within the window.
    await until(
      'the graceful stop to begin',
      () => first.proc.logs.some((l) => l.msg.startsWith('shutting down gracefully')),
      { timeoutMs: 10_000, intervalMs: 5 },
    );
    ctrlC(first.proc);
    const exit = await waitFor(
      () => first.proc.hasExited && first.proc.exited,
      'npm exits after Ctrl-C',
      40_000,
    );
    expect(exit, first.proc.tail()).toEqual({ code: 0, signal: null });
    await waitFor(() => !groupAlive(first.proc.pid), 'no process left in the group', 10_000);
    const msgs = first.proc.logs.map((l) => l.msg);
    expect(msgs.filter((m) => m.startsWith('shutting down gracefully'))).toHaveLength(1);
    expect(msgs).not.toContain('second signal: exiting immediately');
    expect(msgs).toContain('signal within the window of the first: already shutting down');
    expect(msgs).toContain('lease state saved for the next leader');
    expect(first.proc.logs.filter((l) => l.level >= 50)).toEqual([]);
    expect(leftovers(dir)).toEqual([]);

    const second = await npmStart(ws, dir);
    expect((await client.renew(held.id, 300)).id).toBe(held.id);
    const cooling = (await client.listProxies({ target: 'shop.example' })).find(
      (p) => p.name === refused.proxy.name,
    );
    expect(cooling?.targetCooldowns.map((t) => t.target)).toEqual(['shop.example']);
    second.proc.signal('SIGTERM');
    await waitFor(() => second.proc.hasExited && second.proc.exited, 'npm exits after SIGTERM', 40_000);
    expect(leftovers(dir)).toEqual([]);
  });

  it('a second Ctrl-C after the window exits at once, leaving nothing the next start cannot take over', async () => {
    const ws = await createWorkspace({ pool: true });
    const dir = scratchPackage(ws);
    const first = await npmStart(ws, dir);
    // A client still sending its request body holds the discovery API's drain open.
    const slow = connect(ws.discoveryPort, '127.0.0.1');
    onTestFinished(() => {
      slow.destroy();
    });
    await new Promise<void>((r) => slow.once('connect', () => r()));
    let answer = '';
    slow.on('data', (d: Buffer) => {
      answer += d.toString('latin1');
    });
    slow.write(
      'POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n{',
    );
    // Only a request the server has read holds the drain: an unread one is an idle connection.
    await waitFor(() => answer.startsWith('HTTP/1.1 100 Continue'), 'the server to read the request', 10_000);

    ctrlC(first.proc);
    const stopping = await waitFor(
      () => first.proc.logs.find((l) => l.msg.startsWith('shutting down gracefully')),
      'the graceful stop to begin',
      10_000,
      first.proc,
    );
    // The window is time itself: the next Ctrl-C must come after it to count as a second one.
    await waitFor(
      () => Date.now() > Date.parse(String(stopping.time)) + SIGNAL_WINDOW_MS + 100,
      'the signal window to pass',
      10_000,
      first.proc,
    );
    ctrlC(first.proc);
    const exit = await waitFor(
      () => first.proc.hasExited && first.proc.exited,
      'npm exits after Ctrl-C',
      40_000,
    );
    expect(exit.code, first.proc.tail()).not.toBe(0);
    await waitFor(() => !groupAlive(first.proc.pid), 'no process left in the group', 10_000);
    expect(first.proc.logs.map((l) => l.msg)).toContain('second signal: exiting immediately');
    // Nothing was being written at that moment, so the lock went too.
    expect(leftovers(dir)).toEqual([]);

    const second = await npmStart(ws, dir);
    second.proc.signal('SIGTERM');
    const after = await waitFor(
      () => second.proc.hasExited && second.proc.exited,
      'npm exits after SIGTERM',
      40_000,
    );
    expect(after, second.proc.tail()).toEqual({ code: 0, signal: null });
    expect(leftovers(dir)).toEqual([]);
  });
});
