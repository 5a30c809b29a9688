/**
 * The kvm per-host connection pool over a real sshd + libvirtd: one shared connection per host,
 * redialled after it closes; a caller's signal ends its wait for a hanging host; a check that
 * times out abandons its RPCs without closing the connection, and at most one such check per
 * host is outstanding; a dial that hangs in the SSH handshake is reported as such. Needs
 * scripts/ci/libvirt-up.sh.
 */
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { type AddressInfo, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import { classify } from '../../../src/provider/errors.ts';
import { createKvmProvider } from '../../../src/provider/kvm/index.ts';
import { HostPool } from '../../../src/provider/kvm/pool.ts';
import { SshError } from '../../../src/provider/kvm/ssh.ts';
import { type LibvirtEnv, requireLibvirt } from '../../support/libvirt.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

let env: LibvirtEnv;
let setupError: unknown;
/** Accepts TCP and never says a word: an SSH handshake against it hangs. */
let silent: Server;
let silentPort = 0;
const sockets: Socket[] = [];
const pools: HostPool[] = [];

beforeAll(async () => {
  try {
    env = await requireLibvirt();
    silent = createServer((s) => {
      sockets.push(s);
      s.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    silentPort = (silent.address() as AddressInfo).port;
  } catch (err) {
    setupError = err;
  }
});

beforeEach(() => {
  if (setupError) throw setupError;
});

afterAll(async () => {
  await Promise.allSettled(pools.map((p) => p.close()));
  for (const s of sockets) s.destroy();
  silent?.close();
});

function newPool(dialTimeoutMs = 10_000): HostPool {
  const p = new HostPool({
    hosts: [
      { name: 'ci', address: `${env.sshHost}:${env.sshPort}`, user: env.sshUser, socket: env.socketPath },
      { name: 'hang', address: `127.0.0.1:${silentPort}`, user: env.sshUser, socket: env.socketPath },
    ],
    sshKeyFile: env.sshKeyFile,
    knownHostsFile: env.knownHostsFile,
    insecureIgnoreHostKey: false,
    dialTimeoutMs,
  });
  pools.push(p);
  return p;
}

const never = () => new AbortController().signal;

describe('kvm host pool', () => {
  it('shares one connection per host and dials again after it closed', async () => {
    const pool = newPool();
    const [a, b] = await Promise.all([pool.get('ci', never()), pool.get('ci', never())]);
    expect(a).toBe(b);
    expect(await pool.get('ci', never())).toBe(a);
    a.rpc.close();
    await until('the shared connection to close', () => !a.isOpen);
    const c = await pool.get('ci', never());
    expect(c).not.toBe(a);
    expect(c.isOpen).toBe(true);
    expect(await c.getHostname()).toBeTruthy();
  }, 30_000);

  it('ends a wait for a hanging host with the caller signal', async () => {
    const pool = newPool(20_000);
    const start = Date.now();
    await expect(pool.get('hang', AbortSignal.timeout(300))).rejects.toThrow();
    expect(Date.now() - start).toBeLessThan(5_000);
    await expect(pool.get('nope', never())).rejects.toSatisfy((e) => classify(e) === 'Permanent');
  }, 30_000);

  it('abandons a timed-out probe without closing the connection; one abandoned probe per host', async () => {
    const pool = newPool();
    const conn = await pool.get('ci', never());
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let calls = 0;
    const slow = pool.probe('ci', AbortSignal.timeout(100), async (c) => {
      calls++;
      await held; // a libvirt that does not answer
      return c.getHostname();
    });
    await expect(slow).rejects.toThrow();
    expect(conn.isOpen).toBe(true);

    const second = await pool
      .probe('ci', AbortSignal.timeout(5_000), async () => {
        calls++;
      })
      .catch((e: unknown) => e);
    expect(second).toBeInstanceOf(SshError);
    expect((second as SshError).reason).toBe('Timeout');
    expect(calls).toBe(1);

    release();
    // Until the abandoned probe settles, a probe fails at once; then it runs again.
    const hostname = await until('a probe after the abandoned one settled', () =>
      pool.probe('ci', AbortSignal.timeout(5_000), (c) => c.getHostname()),
    );
    expect(hostname).toBeTruthy();
    expect(await pool.get('ci', never())).toBe(conn);
  }, 30_000);

  it('check reports SSHHandshakeFailed, not Timeout, for a host whose sshd accepts TCP and stalls', async () => {
    // Once with the check's deadline first, once with the dial's own bound first.
    for (const [dialTimeoutMs, checkMs] of [
      [20_000, 500],
      [300, 10_000],
    ] as const) {
      const p = createKvmProvider({
        name: 'kvm-ci',
        config: {
          sshKeyFile: env.sshKeyFile,
          knownHostsFile: env.knownHostsFile,
          machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
          hosts: [{ name: 'hang', address: `127.0.0.1:${silentPort}`, user: env.sshUser, bridge: 'br0' }],
        },
        dialTimeoutMs,
      });
      try {
        const start = Date.now();
        const [t] = await p.check({ signal: AbortSignal.timeout(checkMs), log: silentLogger() });
        expect(t).toMatchObject({ name: 'hang', ready: false, reason: 'SSHHandshakeFailed' });
        expect(t?.message).toContain('sshd did not finish the handshake');
        expect(Date.now() - start).toBeLessThan(5_000);
      } finally {
        await p.close();
      }
    }
  }, 30_000);

  it('keeps the SSH key and known_hosts after a successful dial: a redial works once the files are gone', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvm-material-'));
    try {
      const key = join(dir, 'id');
      const known = join(dir, 'known_hosts');
      copyFileSync(env.sshKeyFile, key);
      copyFileSync(env.knownHostsFile, known);
      const pool = new HostPool({
        hosts: [
          { name: 'ci', address: `${env.sshHost}:${env.sshPort}`, user: env.sshUser, socket: env.socketPath },
        ],
        sshKeyFile: key,
        knownHostsFile: known,
        insecureIgnoreHostKey: false,
      });
      pools.push(pool);
      const first = await pool.get('ci', never());
      rmSync(dir, { recursive: true, force: true });
      first.rpc.close();
      await until('the first connection to close', () => !first.isOpen);
      const second = await pool.get('ci', never());
      expect(second).not.toBe(first);
      expect(await second.getHostname()).toBeTruthy();

      // The control: a pool that never loaded them fails for the missing files.
      const fresh = new HostPool({
        hosts: [
          { name: 'ci', address: `${env.sshHost}:${env.sshPort}`, user: env.sshUser, socket: env.socketPath },
        ],
        sshKeyFile: key,
        knownHostsFile: known,
        insecureIgnoreHostKey: false,
      });
      pools.push(fresh);
      await expect(fresh.get('ci', never())).rejects.toThrow(/cannot read SSH private key/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 30_000);

  it('a libvirt verdict keeps the connection: three checks of a missing pool, one dial', async () => {
    const captured = captureLog('info');
    const p = createKvmProvider({
      name: 'kvm-ci',
      log: captured.log,
      config: {
        sshKeyFile: env.sshKeyFile,
        knownHostsFile: env.knownHostsFile,
        machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
        hosts: [
          {
            name: 'ci',
            address: `${env.sshHost}:${env.sshPort}`,
            user: env.sshUser,
            socket: env.socketPath,
            pool: 'ci-no-such-pool',
            bridge: 'br0',
          },
        ],
      },
    });
    try {
      for (let i = 0; i < 3; i++) {
        const [t] = await p.check({ signal: AbortSignal.timeout(10_000), log: silentLogger() });
        expect(t).toMatchObject({ name: 'ci', ready: false, reason: 'PoolNotFound' });
      }
      expect(captured.lines.filter((l) => l.msg === 'kvm host connected')).toHaveLength(1);
      expect(captured.lines.filter((l) => l.msg === 'kvm host connection closed')).toHaveLength(0);
    } finally {
      await p.close();
    }
  }, 30_000);

  it('checks the hosts concurrently: both hanging hosts are dialled before the deadline', async () => {
    const p = createKvmProvider({
      name: 'kvm-ci',
      config: {
        sshKeyFile: env.sshKeyFile,
        knownHostsFile: env.knownHostsFile,
        machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
        hosts: ['hang-a', 'hang-b'].map((name) => ({
          name,
          address: `127.0.0.1:${silentPort}`,
          user: env.sshUser,
          bridge: 'br0',
        })),
      },
      dialTimeoutMs: 20_000,
    });
    try {
      const before = sockets.length;
      const check = p.check({ signal: AbortSignal.timeout(3_000), log: silentLogger() });
      let done = false;
      void check.then(() => {
        done = true;
      });
      // One at a time, the second host would be dialled only after the first gave up.
      await until('both hosts dialled', () => sockets.length - before >= 2);
      expect(done).toBe(false);
      const targets = await check;
      expect(targets.map((t) => [t.name, t.reason])).toEqual([
        ['hang-a', 'SSHHandshakeFailed'],
        ['hang-b', 'SSHHandshakeFailed'],
      ]);
    } finally {
      await p.close();
    }
  }, 30_000);
});
