/**
 * test/support/cli — runs the real `egress-proxies-operator standalone` executable as a child
 * process for end-to-end tests: a private copy of examples/standalone on free loopback ports,
 * JSON log lines collected as they arrive, polling waits with generous deadlines, and every
 * process killed (whole process group) when the test ends.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { DiscoveryClient, type ProxySnapshot } from '../../src/discovery/client.ts';
import { freePortRange } from './ports.ts';
import { until } from './wait.ts';

export const REPO_ROOT = resolve(import.meta.dirname, '../..');
export const NODE = join(REPO_ROOT, 'node_modules/.bin/node');
export const MAIN = join(REPO_ROOT, 'src/cmd/main.ts');
const EXAMPLE = join(REPO_ROOT, 'examples/standalone');
const EXAMPLE_RANGE = /portRange: \{from: \d+, to: \d+\}/;
const RANGE_SIZE = 40;

/** A private copy of the example config, rewritten to ports nobody else uses. */
export interface Workspace {
  dir: string;
  providersFile: string;
  proxiesDir: string;
  statePath: string;
  discoveryPort: number;
  healthPort: number;
  portRange: { from: number; to: number };
  discoveryUrl: string;
  healthUrl: string;
}

export interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

const workspaces: string[] = [];
const running = new Set<CliProcess>();

// Detached children outlive a test worker that dies: kill their groups when this process exits.
process.once('exit', () => {
  for (const p of running) {
    try {
      process.kill(-p.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
});

import { freePort } from './ports.ts';

export { freePort };

/** The example's ProxyPool manifest, left out of a workspace unless asked for. */
export const EXAMPLE_POOL_FILE = 'pool.yaml';

/**
 * Copies examples/standalone to a temp dir and points every port at a free one (the local
 * provider's range here; the listeners' through standaloneArgs). `openPorts`:
 * loopback origin ports the tests send traffic to through the proxies, which the default egress
 * policy refuses; the workspace's local provider allows exactly 127.0.0.1 on those ports.
 * `pool`: keep the example ProxyPool (off by default, so the fleet is the three named Proxies).
 */
export async function createWorkspace(
  opts: { openPorts?: number[]; pool?: boolean } = {},
): Promise<Workspace> {
  const dir = mkdtempSync(join(tmpdir(), 'standalone-e2e-'));
  workspaces.push(dir);
  cpSync(EXAMPLE, dir, { recursive: true });
  if (!opts.pool) rmSync(join(dir, 'proxies', EXAMPLE_POOL_FILE), { force: true });
  const [discoveryPort, healthPort, portRange] = [
    await freePort(),
    await freePort(),
    await freePortRange(RANGE_SIZE),
  ];
  const providersFile = join(dir, 'providers.yaml');
  const providers = readFileSync(providersFile, 'utf8');
  if (!EXAMPLE_RANGE.test(providers)) throw new Error('examples/standalone/providers.yaml: no portRange');
  writeFileSync(
    providersFile,
    providers.replace(
      EXAMPLE_RANGE,
      `portRange: {from: ${portRange.from}, to: ${portRange.to}}${
        opts.openPorts
          ? `\n      egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${opts.openPorts.join(', ')}]}`
          : ''
      }`,
    ),
  );
  // The manifests' health checks name no port (`operator.invalid`): they follow the workspace's
  // --discovery-bind-address as they are.
  const proxiesDir = join(dir, 'proxies');
  return {
    dir,
    providersFile,
    proxiesDir,
    statePath: join(dir, 'state.json'),
    discoveryPort,
    healthPort,
    portRange,
    discoveryUrl: `http://127.0.0.1:${discoveryPort}`,
    healthUrl: `http://127.0.0.1:${healthPort}`,
  };
}

/** A health-check URL on this workspace's discovery port, for manifests a test writes itself. */
export function healthCheckUrl(ws: Workspace): string {
  return `http://127.0.0.1:${ws.discoveryPort}/generate_204`;
}

/** The test runner's environment minus anything that would change the CLI's behaviour. */
function cliEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, LOG_LEVEL: 'info', NO_COLOR: '1' };
  for (const k of Object.keys(env)) {
    if (k === 'DISCOVERY_TOKEN' || k === 'GATEWAY_TOKEN' || k.startsWith('OTEL_') || k === 'NODE_OPTIONS')
      delete env[k];
  }
  return env;
}

/** How a CliProcess starts: another command line before the args, more environment. */
export interface CliCommand {
  /** The program and its leading arguments; default: node running src/cmd/main.ts. */
  command?: string[];
  /** Variables set on top of the cleaned test environment. */
  env?: NodeJS.ProcessEnv;
}

/** A running CLI process. */
export class CliProcess {
  readonly child: ChildProcess;
  readonly logs: LogLine[] = [];
  stdout = '';
  stderr = '';
  readonly exited: Promise<Exit>;
  private exit: Exit | undefined;
  private partial = '';

  constructor(args: string[], cwd: string, opts: CliCommand = {}) {
    const [program = NODE, ...leading] = opts.command ?? [NODE, MAIN];
    this.child = spawn(program, [...leading, ...args], {
      cwd,
      // Own process group: cleanup kills everything the CLI might have started.
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...cliEnv(), ...opts.env },
    });
    running.add(this);
    this.child.stdout?.setEncoding('utf8').on('data', (chunk: string) => this.onStdout(chunk));
    this.child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    this.exited = new Promise((ok) => {
      this.child.once('exit', (code, signal) => {
        this.exit = { code, signal };
        running.delete(this);
        ok(this.exit);
      });
    });
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get hasExited(): boolean {
    return this.exit !== undefined;
  }

  private onStdout(chunk: string): void {
    this.stdout += chunk;
    const lines = (this.partial + chunk).split('\n');
    this.partial = lines.pop() ?? '';
    for (const line of lines) {
      if (!line.trim()) continue;
      try {
        this.logs.push(JSON.parse(line) as LogLine);
      } catch {
        this.logs.push({ level: 0, msg: line, unparsed: true });
      }
    }
  }

  /** Sends a signal to the process (not its group): what a supervisor does. */
  signal(sig: NodeJS.Signals): void {
    if (!this.hasExited) this.child.kill(sig);
  }

  /** SIGKILL to the whole process group; resolves when the process is gone. */
  async killHard(): Promise<Exit> {
    if (!this.hasExited) {
      try {
        process.kill(-this.pid, 'SIGKILL');
      } catch {
        this.child.kill('SIGKILL');
      }
    }
    return this.exited;
  }

  /** Waits for a log line matching `pred` (already seen or future). */
  waitForLog(pred: (l: LogLine) => boolean, what: string, timeoutMs = 30_000): Promise<LogLine> {
    return waitFor(() => this.logs.find(pred), `${what} (log)`, timeoutMs, this);
  }

  /** Last lines of output, for failure messages. */
  tail(n = 15): string {
    const out = this.stdout.split('\n').slice(-n).join('\n');
    return `--- stdout (tail) ---\n${out}\n--- stderr ---\n${this.stderr}`;
  }
}

/**
 * Polls `probe` until it returns something other than undefined/false, or throws after
 * `timeoutMs` (also early, with its output, if `proc` exits meanwhile).
 */
export async function waitFor<T>(
  probe: () => T | undefined | false | Promise<T | undefined | false>,
  what: string,
  timeoutMs = 30_000,
  proc?: CliProcess,
): Promise<T> {
  const tail = () => (proc ? `\n${proc.tail()}` : '');
  return until(what, probe, {
    timeoutMs,
    intervalMs: 100,
    ...(proc ? { failFast: () => (proc.hasExited ? `process exited${tail()}` : undefined) } : {}),
  }).catch((err: unknown) => {
    throw proc && !proc.hasExited && err instanceof Error ? new Error(`${err.message}${tail()}`) : err;
  });
}

/** The standard command line for a workspace, plus `extra`. */
export function standaloneArgs(
  ws: Workspace,
  extra: string[] = [],
  ports: { discovery?: number; health?: number } = {},
): string[] {
  return [
    'standalone',
    '--config',
    ws.dir,
    '--state',
    ws.statePath,
    '--discovery-bind-address',
    `127.0.0.1:${ports.discovery ?? ws.discoveryPort}`,
    '--health-probe-bind-address',
    `127.0.0.1:${ports.health ?? ws.healthPort}`,
    // Many standalone processes run at once: the gateway takes an ephemeral port unless asked.
    '--gateway-bind-address',
    '127.0.0.1:0',
    '--log-format',
    'json',
    ...extra,
  ];
}

/** Starts `standalone` on the workspace. */
export function startStandalone(
  ws: Workspace,
  extra: string[] = [],
  ports: { discovery?: number; health?: number } = {},
): CliProcess {
  return new CliProcess(standaloneArgs(ws, extra, ports), ws.dir);
}

/** Runs the CLI with `args` to completion (for fail-fast cases); kills it after `timeoutMs`. */
export async function runCli(
  args: string[],
  cwd: string,
  timeoutMs = 60_000,
): Promise<Exit & { stdout: string; stderr: string }> {
  const proc = new CliProcess(args, cwd);
  const timer = setTimeout(() => void proc.killHard(), timeoutMs);
  const exit = await proc.exited;
  clearTimeout(timer);
  return { ...exit, stdout: proc.stdout, stderr: proc.stderr };
}

export function clientFor(ws: Workspace): DiscoveryClient {
  return new DiscoveryClient({ baseUrl: ws.discoveryUrl, timeoutMs: 5_000 });
}

/** Waits until exactly `names` are listed, all Ready and healthy; returns the snapshots. */
export function waitForReady(
  ws: Workspace,
  proc: CliProcess,
  names: string[],
  timeoutMs = 30_000,
): Promise<ProxySnapshot[]> {
  const client = clientFor(ws);
  const want = [...names].sort().join(',');
  return waitFor(
    async () => {
      const proxies = await client.listProxies();
      const got = proxies
        .map((p) => p.name)
        .sort()
        .join(',');
      return got === want && proxies.every((p) => p.phase === 'Ready' && p.healthy && p.port) && proxies;
    },
    `proxies ${want} Ready and healthy`,
    timeoutMs,
    proc,
  );
}

/** Whether something accepts TCP connections on 127.0.0.1:port right now. */
export function accepts(port: number, timeoutMs = 2_000): Promise<boolean> {
  return new Promise((ok) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    const done = (v: boolean) => {
      sock.destroy();
      ok(v);
    };
    sock.setTimeout(timeoutMs, () => done(false));
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

export function basicAuth(proxyUrl: string): string {
  const u = new URL(proxyUrl);
  const creds = `${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`;
  return `Basic ${Buffer.from(creds).toString('base64')}`;
}

/** A plain-HTTP request in absolute form through the proxy, with or without its credentials. */
export function httpViaProxy(
  proxyUrl: string,
  target: string,
  auth: boolean,
): Promise<{ status: number; headers: http.IncomingHttpHeaders }> {
  const u = new URL(proxyUrl);
  return new Promise((ok, fail) => {
    const req = http.request(
      {
        host: u.hostname,
        port: Number(u.port),
        method: 'GET',
        path: target,
        headers: {
          host: new URL(target).host,
          ...(auth ? { 'proxy-authorization': basicAuth(proxyUrl) } : {}),
        },
        agent: false,
        timeout: 10_000,
      },
      (res) => {
        res.resume();
        res.once('end', () => ok({ status: res.statusCode ?? 0, headers: res.headers }));
      },
    );
    req.once('timeout', () => req.destroy(new Error('timeout')));
    req.once('error', fail);
    req.end();
  });
}

/** Ports of the workspace's local-provider range that accept connections right now. */
export async function listeningInRange(ws: Workspace): Promise<number[]> {
  const ports: number[] = [];
  for (let p = ws.portRange.from; p <= ws.portRange.to; p++) ports.push(p);
  const open = await Promise.all(ports.map((p) => accepts(p)));
  return ports.filter((_, i) => open[i]);
}

/** Kills every process still running and removes the workspaces; call from afterEach/afterAll. */
export async function cleanupCli(): Promise<void> {
  await Promise.all([...running].map((p) => p.killHard()));
  // Other members of a killed process group may still be finishing a write into the workspace:
  // Node's rm retries ENOTEMPTY/EBUSY with a backoff.
  for (const dir of workspaces.splice(0))
    rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 50 });
}
