/**
 * test/support/squid — a real Squid (Debian's /usr/sbin/squid) for tests: its own config in a
 * temp dir, a free 127.0.0.1 port, a unique service name, Basic auth through basic_ncsa_auth
 * with an `openssl passwd -1` file, CONNECT allowed only to `sslPorts`. Started in the
 * foreground (-N) so the test owns the process; stop() kills it and removes every trace.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import {
  chownSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { request } from 'node:http';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { closedPort } from './origins.ts';
import { until } from './wait.ts';

export const SQUID_BIN = process.env.SQUID_BIN ?? '/usr/sbin/squid';
const NCSA_AUTH = '/usr/lib/squid/basic_ncsa_auth';

export interface SquidOptions {
  /** username → password; default one random user. */
  users?: Record<string, string>;
  /** Value of the SSL_ports acl: ports CONNECT may reach. Default `443 1025-65535`. */
  sslPorts?: string;
  /** Source address of its outgoing connections (`tcp_outgoing_address`), so an origin can tell Squids apart. */
  outgoingAddress?: string;
}

export interface Squid {
  host: '127.0.0.1';
  port: number;
  /** The first configured user. */
  username: string;
  password: string;
  dir: string;
  accessLog(): string;
  stop(): Promise<void>;
}

function proxyUid(): { uid: number; gid: number } | undefined {
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('proxy:'));
  if (!line) return undefined;
  const f = line.split(':');
  return { uid: Number(f[2]), gid: Number(f[3]) };
}

async function answers(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    let data = '';
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(1000, () => done(false));
    s.on('error', () => done(false));
    s.on('connect', () => s.write('GET http://127.0.0.1:1/ HTTP/1.0\r\n\r\n'));
    s.on('data', (d) => {
      data += d.toString('latin1');
      if (data.includes('\r\n')) done(data.startsWith('HTTP/'));
    });
  });
}

function exited(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
}

export async function startSquid(opts: SquidOptions = {}): Promise<Squid> {
  const users = opts.users ?? {
    [`u${randomBytes(4).toString('hex')}`]: randomBytes(9).toString('base64url'),
  };
  const [username, password] = Object.entries(users)[0] ?? ['', ''];
  const name = `hsq${process.pid}${randomBytes(4).toString('hex')}`;
  const dir = mkdtempSync(join(tmpdir(), 'squid-'));
  const port = await closedPort();
  const passwd = Object.entries(users)
    .map(
      ([u, p]) =>
        `${u}:${execFileSync('openssl', ['passwd', '-1', '-stdin'], { input: p }).toString().trim()}`,
    )
    .join('\n');
  writeFileSync(join(dir, 'passwd'), `${passwd}\n`, { mode: 0o644 });
  writeFileSync(
    join(dir, 'squid.conf'),
    [
      `http_port 127.0.0.1:${port}`,
      `pid_filename ${dir}/squid.pid`,
      `cache_log ${dir}/cache.log`,
      `access_log stdio:${dir}/access.log`,
      'cache_store_log none',
      `coredump_dir ${dir}`,
      'cache deny all',
      'cache_mem 8 MB',
      'pinger_enable off',
      'netdb_filename none',
      'shutdown_lifetime 0 seconds',
      `auth_param basic program ${NCSA_AUTH} ${dir}/passwd`,
      'auth_param basic children 2 startup=1 idle=1',
      'auth_param basic realm health-test',
      'acl localnet src 127.0.0.0/8',
      `acl SSL_ports port ${opts.sslPorts ?? '443 1025-65535'}`,
      'acl CONNECT method CONNECT',
      'acl authed proxy_auth REQUIRED',
      'http_access deny !localnet',
      'http_access deny CONNECT !SSL_ports',
      'http_access allow authed',
      'http_access deny all',
      ...(opts.outgoingAddress ? [`tcp_outgoing_address ${opts.outgoingAddress}`] : []),
      '',
    ].join('\n'),
  );
  // As root squid drops to `proxy`, which must be able to write its logs here.
  if (process.getuid?.() === 0) {
    const ids = proxyUid();
    if (ids) {
      chownSync(dir, ids.uid, ids.gid);
      for (const f of ['passwd', 'squid.conf']) chownSync(join(dir, f), ids.uid, ids.gid);
    }
  }
  const child = spawn(SQUID_BIN, ['-N', '-n', name, '-f', join(dir, 'squid.conf')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  const cleanup = () => {
    rmSync(dir, { recursive: true, force: true });
    for (const f of existsSync('/dev/shm') ? readdirSync('/dev/shm') : []) {
      if (f.startsWith(`${name}-`)) rmSync(join('/dev/shm', f), { force: true });
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited(child);
      clearTimeout(t);
    }
    cleanup();
  };
  try {
    await untilSquidAnswers(child, port, () => stderr.slice(-2000), dir);
  } catch (e) {
    await stop();
    throw e;
  }
  return {
    host: '127.0.0.1',
    port,
    username,
    password,
    dir,
    accessLog: () => {
      try {
        return readFileSync(join(dir, 'access.log'), 'utf8');
      } catch {
        return '';
      }
    },
    stop,
  };
}

/**
 * Waits until the Squid `child` answers HTTP on 127.0.0.1:`port`; gives up at once when it exits,
 * and puts `logs()` plus the tail of its cache.log (in `dir`) into the error.
 */
export async function untilSquidAnswers(
  child: ChildProcess,
  port: number,
  logs: () => string,
  dir?: string,
): Promise<void> {
  try {
    await until(`squid to answer on port ${port}`, () => answers(port), {
      timeoutMs: 15_000,
      intervalMs: 50,
      failFast: () =>
        child.exitCode !== null || child.signalCode !== null
          ? `squid exited (${child.exitCode ?? child.signalCode})`
          : undefined,
    });
  } catch (e) {
    const cacheLog =
      dir && existsSync(join(dir, 'cache.log')) ? readFileSync(join(dir, 'cache.log'), 'utf8') : '';
    throw new Error(`squid did not start: ${(e as Error).message} ${logs()} ${cacheLog.slice(-2000)}`);
  }
}

/** Kills a squid a test started with its own config, and removes its dir and shm segments. */
export async function stopSquidProcess(
  child: ChildProcess | undefined,
  dir: string,
  service: string,
): Promise<void> {
  if (child && child.exitCode === null) {
    child.kill('SIGKILL');
    await once(child, 'exit');
  }
  rmSync(dir, { recursive: true, force: true });
  for (const f of existsSync('/dev/shm') ? readdirSync('/dev/shm') : []) {
    if (f.startsWith(`${service}-`)) rmSync(join('/dev/shm', f), { force: true });
  }
}

/** `Basic …` value for a Proxy-Authorization header. */
export const basicAuthHeader = (user: string, pass: string): string =>
  `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;

/** Status of an absolute-form GET of `url` through the forward proxy on 127.0.0.1:`port`. */
export function statusViaProxy(port: number, url: string, auth?: string): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const r = request(
      {
        host: '127.0.0.1',
        port,
        path: url,
        headers: auth ? { 'Proxy-Authorization': auth } : {},
        agent: false,
      },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    r.on('error', reject);
    r.end();
  });
}
