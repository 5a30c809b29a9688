/**
 * test/support/gateway/mitmproxy — mitmproxy's `mitmdump` from its private virtual environment
 * (scripts/ci/venv.sh mitmproxy) as a second, independent inspecting proxy: the client recipes
 * that trust the gateway's CA are proven against it too, and bench/gateway.ts measures the
 * gateway against it. It listens on a free loopback port with a private configuration directory
 * (its CA is made there, never in ~/.mitmproxy), asks for Basic proxy credentials like the
 * gateway, and verifies origins against the CA file it is given. A missing environment fails,
 * naming the command that makes it.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from '../ports.ts';
import { until } from '../wait.ts';

const VENV_SCRIPT = resolve(import.meta.dirname, '../../../scripts/ci/venv.sh');

export interface Mitmproxy {
  port: number;
  /** PEM file of mitmproxy's CA (what a client trusts). */
  caFile: string;
  /** `http://user:password@127.0.0.1:<port>` */
  url: string;
  user: string;
  password: string;
  close(): Promise<void>;
}

/** The venv's directory; throws naming the fix when it is not made yet. */
export function mitmproxyVenv(): string {
  try {
    return execFileSync('bash', [VENV_SCRIPT, 'mitmproxy', '--check'], { stdio: ['ignore', 'pipe', 'pipe'] })
      .toString()
      .trim()
      .split('\n')
      .pop() as string;
  } catch (err) {
    const why = (err as { stderr?: Buffer }).stderr?.toString().trim() ?? String(err);
    throw new Error(`mitmproxy is not installed: ${why}`);
  }
}

/**
 * Starts mitmdump trusting `originCaFile` for origins; resolves once it accepts connections.
 * `upstream`: chain every connection to this HTTP proxy (`http://127.0.0.1:<port>`) with these
 * Basic credentials (`user:password`), as the gateway chains to its upstreams.
 */
export async function startMitmproxy(opts: {
  originCaFile: string;
  port?: number;
  upstream?: { url: string; auth: string };
}): Promise<Mitmproxy> {
  const venv = mitmproxyVenv();
  const confdir = mkdtempSync(join(tmpdir(), 'mitmproxy-conf-'));
  const port = opts.port ?? (await freePort());
  const user = 'crawler';
  const password = 'mitm-test-token';
  const child: ChildProcess = spawn(
    join(venv, 'bin', 'mitmdump'),
    [
      '--listen-host',
      '127.0.0.1',
      '--listen-port',
      String(port),
      '--set',
      `confdir=${confdir}`,
      '--set',
      `ssl_verify_upstream_trusted_ca=${opts.originCaFile}`,
      '--set',
      `proxyauth=${user}:${password}`,
      '--set',
      'flow_detail=0',
      ...(opts.upstream
        ? ['--mode', `upstream:${opts.upstream.url}`, '--set', `upstream_auth=${opts.upstream.auth}`]
        : []),
      '--quiet',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: '/usr/bin:/bin', LANG: 'C.UTF-8', HOME: confdir } },
  );
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  const caFile = join(confdir, 'mitmproxy-ca-cert.pem');
  await until(
    'mitmdump to listen',
    () =>
      existsSync(caFile) &&
      new Promise<boolean>((ok) => {
        const s = connect({ host: '127.0.0.1', port }, () => {
          s.destroy();
          ok(true);
        });
        s.on('error', () => ok(false));
      }),
    {
      timeoutMs: 30_000,
      intervalMs: 100,
      failFast: () => (child.exitCode !== null ? `mitmdump exited ${child.exitCode}: ${stderr}` : undefined),
    },
  );
  return {
    port,
    caFile,
    url: `http://${user}:${password}@127.0.0.1:${port}`,
    user,
    password,
    close: async () => {
      if (child.exitCode === null) {
        const exited = new Promise<void>((ok) => child.once('exit', () => ok()));
        child.kill('SIGTERM');
        await exited;
      }
      rmSync(confdir, { recursive: true, force: true });
    },
  };
}
