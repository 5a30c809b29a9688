/**
 * The libvirt RPC client against a real libvirtd + QEMU (TCG), both straight over the unix
 * socket and through ssh.ts over a real sshd on loopback. Needs scripts/ci/libvirt-up.sh.
 */
import { execFileSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  AddressSource,
  DomainState,
  ErrorCode,
  formatVersion,
  type LibvirtConnection,
  PoolState,
  UndefineFlags,
} from '../../../src/provider/kvm/libvirt.ts';
import { LibvirtError, RpcConnectionError } from '../../../src/provider/kvm/rpc.ts';
import {
  connectSsh,
  hashKnownHostName,
  loadKnownHosts,
  loadPrivateKey,
  openLibvirtOverSsh,
  parseKnownHosts,
  SshError,
} from '../../../src/provider/kvm/ssh.ts';
import {
  ciName,
  connectLocal,
  connectOverSsh,
  type LibvirtEnv,
  rawVolumeXml,
  requireLibvirt,
  tinyDomainXml,
} from '../../support/libvirt.ts';
import { until } from '../../support/wait.ts';

let env: LibvirtEnv;
let conn: LibvirtConnection;
const domainsToClean: string[] = [];
const volsToClean: string[] = [];

let setupError: unknown;

beforeAll(async () => {
  try {
    env = await requireLibvirt();
    conn = await connectLocal(env);
  } catch (err) {
    setupError = err;
  }
});

// Every test fails (none is skipped) when libvirtd/sshd are not up, with the fix in the message.
beforeEach(() => {
  if (setupError) throw setupError;
});

afterAll(async () => {
  if (!conn?.isOpen) return;
  for (const name of domainsToClean) {
    const dom = await conn.domainLookupByName(name).catch(() => undefined);
    if (!dom) continue;
    await conn.domainDestroy(dom).catch(() => {});
    await conn.domainUndefine(dom, UndefineFlags.NVRAM).catch(() => {});
  }
  const pool = await conn.storagePoolLookupByName(env.pool);
  for (const name of volsToClean) {
    const vol = await conn.storageVolLookupByName(pool, name).catch(() => undefined);
    if (vol) await conn.storageVolDelete(vol).catch(() => {});
  }
  await conn.close();
});

const waitFor = (cond: () => boolean, timeoutMs: number) =>
  until('condition', cond, { timeoutMs, intervalMs: 50 });

function errorOf(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e,
  );
}

/** The SSH wire blob of a fresh ed25519 key: a host key sshd does not have. */
function foreignHostKeyLine(host: string): string {
  const { publicKey } = generateKeyPairSync('ed25519');
  const raw = publicKey.export({ format: 'der', type: 'spki' }).subarray(-32);
  const type = Buffer.from('ssh-ed25519');
  const blob = Buffer.alloc(4 + type.length + 4 + 32);
  blob.writeUInt32BE(type.length, 0);
  type.copy(blob, 4);
  blob.writeUInt32BE(32, 4 + type.length);
  raw.copy(blob, 8 + type.length);
  return `${host} ssh-ed25519 ${blob.toString('base64')}`;
}

describe('libvirt RPC over the local socket', () => {
  it('reports hostname and versions', async () => {
    expect((await conn.getHostname()).length).toBeGreaterThan(0);
    const lib = await conn.getLibVersion();
    expect(lib).toBeGreaterThanOrEqual(6_000_000);
    expect(formatVersion(lib)).toMatch(/^\d+\.\d+\.\d+$/);
    expect(await conn.getVersion()).toBeGreaterThan(0); // QEMU's version
  });

  it('reads the pool state and sizes, and reports an unknown pool as NO_STORAGE_POOL', async () => {
    const pool = await conn.storagePoolLookupByName(env.pool);
    expect(pool.name).toBe(env.pool);
    expect(pool.uuid.length).toBe(16);
    const info = await conn.storagePoolGetInfo(pool);
    expect(info.state).toBe(PoolState.RUNNING);
    expect(info.capacity).toBeGreaterThan(0);
    expect(info.available).toBeLessThanOrEqual(info.capacity);
    expect(await conn.storagePoolIsActive(pool)).toBe(true);

    const err = await errorOf(conn.storagePoolLookupByName('no-such-pool-xyz'));
    expect(err).toBeInstanceOf(LibvirtError);
    expect((err as LibvirtError).code).toBe(ErrorCode.NO_STORAGE_POOL);
    expect((err as LibvirtError).message).toContain('no-such-pool-xyz');
  });

  it('creates, uploads, downloads and deletes a volume byte for byte', async () => {
    const pool = await conn.storagePoolLookupByName(env.pool);
    const name = ciName(env, 'vol');
    volsToClean.push(name);
    const data = randomBytes(700_000); // spans several 256 KiB stream packets
    const vol = await conn.storageVolCreateXml(pool, rawVolumeXml(name, data.length));
    expect(vol).toMatchObject({ pool: env.pool, name });
    expect(await conn.storageVolGetPath(vol)).toBe(join(env.poolPath, name));

    await conn.storageVolUpload(vol, data);
    expect(readFileSync(join(env.poolPath, name)).equals(data)).toBe(true);
    expect((await conn.storageVolGetInfo(vol)).capacity).toBe(data.length);

    const parts: Buffer[] = [];
    for await (const part of conn.storageVolDownload(vol)) parts.push(part);
    expect(Buffer.concat(parts).equals(data)).toBe(true);

    const listed = await conn.storagePoolListAllVolumes(pool);
    expect(listed.map((v) => v.name)).toContain(name);

    await conn.storageVolDelete(vol);
    const err = await errorOf(conn.storageVolLookupByName(pool, name));
    expect((err as LibvirtError).code).toBe(ErrorCode.NO_STORAGE_VOL);
  });

  it('uploads from an async iterable of chunks', async () => {
    const pool = await conn.storagePoolLookupByName(env.pool);
    const name = ciName(env, 'vol');
    volsToClean.push(name);
    const chunks = [randomBytes(1000), randomBytes(300_000), randomBytes(5)];
    const total = Buffer.concat(chunks);
    const vol = await conn.storageVolCreateXml(pool, rawVolumeXml(name, total.length));
    async function* gen() {
      for (const c of chunks) yield c;
    }
    await conn.storageVolUpload(vol, gen());
    expect(readFileSync(join(env.poolPath, name)).equals(total)).toBe(true);
    await conn.storageVolDelete(vol);
  });

  it('aborts an upload midway; libvirtd drops the stream and the connection carries on', async () => {
    const pool = await conn.storagePoolLookupByName(env.pool);
    const name = ciName(env, 'vol');
    volsToClean.push(name);
    const vol = await conn.storageVolCreateXml(pool, rawVolumeXml(name, 1 << 20));
    const ac = new AbortController();
    let sent = 0;
    async function* endless() {
      for (;;) {
        sent++;
        if (sent === 5) ac.abort(new Error('caller gave up'));
        yield randomBytes(4096);
        await new Promise((r) => setTimeout(r, 5));
      }
    }
    await expect(conn.storageVolUpload(vol, endless(), { signal: ac.signal })).rejects.toThrow(
      'caller gave up',
    );
    expect(conn.isOpen).toBe(true);
    expect(await conn.getHostname()).toBeTruthy();
    // a fresh upload to the same volume works, so the aborted stream released it
    const data = randomBytes(10_000);
    await conn.storageVolUpload(vol, data);
    expect(readFileSync(join(env.poolPath, name)).subarray(0, data.length).equals(data)).toBe(true);
    await conn.storageVolDelete(vol);
  });

  it('defines, starts, inspects, destroys and undefines a TCG domain', async () => {
    const name = ciName(env, 'dom');
    domainsToClean.push(name);
    const defined = await conn.domainDefineXml(tinyDomainXml(name));
    expect(defined.name).toBe(name);
    expect(defined.id).toBe(-1);
    expect((await conn.domainGetState(defined)).state).toBe(DomainState.SHUTOFF);

    const started = await conn.domainCreate(defined);
    expect(started.id).toBeGreaterThan(0);
    expect((await conn.domainGetState(started)).state).toBe(DomainState.RUNNING);
    expect(await conn.domainIsActive(started)).toBe(true);
    expect(await conn.domainGetXmlDesc(started)).toContain(`<name>${name}</name>`);
    const all = await conn.listAllDomains();
    expect(all.map((d) => d.name)).toContain(name);
    expect(all.find((d) => d.name === name)!.uuid.equals(defined.uuid)).toBe(true);

    // An agent channel but no agent in the guest: libvirt says so with a typed error.
    const agentErr = await errorOf(conn.domainInterfaceAddresses(started, AddressSource.AGENT));
    expect(agentErr).toBeInstanceOf(LibvirtError);
    expect((agentErr as LibvirtError).code).toBe(ErrorCode.AGENT_UNRESPONSIVE);

    await conn.domainDestroy(started);
    expect((await conn.domainGetState(started)).state).toBe(DomainState.SHUTOFF);
    await conn.domainUndefine(started, UndefineFlags.NVRAM);
    const gone = await errorOf(conn.domainLookupByName(name));
    expect((gone as LibvirtError).code).toBe(ErrorCode.NO_DOMAIN);
  });

  it('turns an unknown domain into a LibvirtError with code, domain, level and message', async () => {
    const err = await errorOf(conn.domainLookupByName('ci-does-not-exist'));
    expect(err).toBeInstanceOf(LibvirtError);
    const e = err as LibvirtError;
    expect(e.code).toBe(ErrorCode.NO_DOMAIN);
    expect(e.domain).toBeGreaterThan(0);
    expect(e.level).toBe(2); // VIR_ERR_ERROR
    expect(e.message).toContain("'ci-does-not-exist'");
    // the connection is still fine after an error reply
    expect(await conn.getHostname()).toBeTruthy();
  });

  it('abandons an aborted call without harming the connection; its late reply is discarded', async () => {
    const c = await connectLocal(env);
    try {
      const name = ciName(env, 'dom');
      domainsToClean.push(name);
      const dom = await c.domainDefineXml(tinyDomainXml(name));
      const ac = new AbortController();
      const slow = c.domainCreate(dom, 0, { signal: ac.signal }); // takes about a second on TCG
      setTimeout(() => ac.abort(new Error('caller gave up')), 20);
      await expect(slow).rejects.toThrow('caller gave up');
      // other calls proceed while libvirtd is still starting the domain
      expect(await c.getHostname()).toBeTruthy();
      await waitFor(() => c.rpc.stats.lateRepliesDiscarded === 1, 20_000);
      expect(c.isOpen).toBe(true);
      expect((await c.domainGetState(dom)).state).toBe(DomainState.RUNNING);
      await c.domainDestroy(dom);
      await c.domainUndefine(dom, UndefineFlags.NVRAM);
    } finally {
      await c.close();
    }
  });

  it('answers libvirtd keepalive PINGs and gets PONGs for its own', async () => {
    // libvirtd only pings a client it has not heard from for keepalive_interval (2 s in
    // libvirt-up.sh), so one connection stays silent and the other pings every 300 ms.
    const silent = await connectLocal(env, { keepalive: false });
    const pinging = await connectLocal(env, { keepalive: { intervalMs: 300, count: 3 } });
    try {
      await waitFor(
        () => silent.rpc.stats.pingsReceived >= 1 && pinging.rpc.stats.pongsReceived >= 2,
        10_000,
      );
      expect(silent.rpc.stats.pongsSent).toBe(silent.rpc.stats.pingsReceived);
      expect(pinging.rpc.stats.pingsReceived).toBe(0); // our pings kept it from looking idle
      expect(silent.isOpen && pinging.isOpen).toBe(true);
      expect(await silent.getHostname()).toBeTruthy();
      expect(await pinging.getHostname()).toBeTruthy();
    } finally {
      await silent.close();
      await pinging.close();
    }
  });

  it('fails pending and later calls once the connection is closed', async () => {
    const c = await connectLocal(env);
    await c.close();
    expect(c.isOpen).toBe(false);
    await expect(c.getHostname()).rejects.toBeInstanceOf(RpcConnectionError);
  });
});

describe('libvirt RPC through ssh.ts over a real sshd', () => {
  it('connects with a verified host key and speaks to libvirt as the unprivileged user', async () => {
    const { ssh, conn: c } = await connectOverSsh(env);
    try {
      expect(await c.getHostname()).toBe(await conn.getHostname());
      const pool = await c.storagePoolLookupByName(env.pool);
      expect((await c.storagePoolGetInfo(pool)).state).toBe(PoolState.RUNNING);

      const name = ciName(env, 'vol');
      volsToClean.push(name);
      const data = randomBytes(400_000);
      const vol = await c.storageVolCreateXml(pool, rawVolumeXml(name, data.length));
      await c.storageVolUpload(vol, data);
      expect(readFileSync(join(env.poolPath, name)).equals(data)).toBe(true);
      await c.storageVolDelete(vol);
    } finally {
      await c.close();
      ssh.close();
    }
  });

  it('closing the libvirt connection ends the SSH session too', async () => {
    const { ssh, conn: c } = await connectOverSsh(env);
    const sshClosed = new Promise<void>((r) => ssh.onClose(() => r()));
    await c.close();
    await sshClosed;
    expect(ssh.isOpen).toBe(false);
  });

  it('accepts a hashed known_hosts entry', async () => {
    const plain = readFileSync(env.knownHostsFile, 'utf8').trim();
    const [hostField, ...rest] = plain.split(' ');
    const hashed = `${hashKnownHostName(hostField!, randomBytes(20))} ${rest.join(' ')}\n`;
    const { ssh, conn: c } = await connectOverSsh(env, { hostKeys: parseKnownHosts(hashed) });
    try {
      expect(await c.getHostname()).toBeTruthy();
    } finally {
      await c.close();
      ssh.close();
    }
  });

  it('rejects a host key that does not match known_hosts', async () => {
    const kh = parseKnownHosts(`${foreignHostKeyLine(`[${env.sshHost}]:${env.sshPort}`)}\n`);
    const err = await errorOf(connectOverSsh(env, { hostKeys: kh }));
    expect(err).toBeInstanceOf(SshError);
    expect((err as SshError).reason).toBe('SSHHandshakeFailed');
    expect((err as SshError).message).toMatch(/host key .* does not match/);
  });

  it('rejects a host with no known_hosts entry (port matters)', async () => {
    // An entry for the bare host means port 22, not the test port.
    const line = readFileSync(env.knownHostsFile, 'utf8').trim().split(' ').slice(1).join(' ');
    const err = await errorOf(connectOverSsh(env, { hostKeys: parseKnownHosts(`${env.sshHost} ${line}\n`) }));
    expect((err as SshError).reason).toBe('SSHHandshakeFailed');
    expect((err as SshError).message).toContain('no known_hosts entry');
  });

  it('reports a missing key file as SSHMaterialUnavailable and a garbage key as SSHMaterialInvalid', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvm-ssh-'));
    const missing = await errorOf(loadPrivateKey(join(dir, 'nope')));
    expect(missing).toBeInstanceOf(SshError);
    expect((missing as SshError).reason).toBe('SSHMaterialUnavailable');
    expect((missing as SshError).message).toContain(join(dir, 'nope'));

    writeFileSync(join(dir, 'bad'), 'not a key\n');
    const bad = await errorOf(loadPrivateKey(join(dir, 'bad')));
    expect((bad as SshError).reason).toBe('SSHMaterialInvalid');

    const noKh = await errorOf(loadKnownHosts(join(dir, 'known_hosts')));
    expect((noKh as SshError).reason).toBe('SSHMaterialUnavailable');

    // a key that never went through loadPrivateKey is caught at connect time
    const garbage = await errorOf(connectOverSsh(env, { privateKey: 'garbage' }));
    expect((garbage as SshError).reason).toBe('SSHMaterialInvalid');
  });

  it('reports a key sshd does not authorize as SSHHandshakeFailed', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvm-ssh-'));
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'other')]);
    const err = await errorOf(connectOverSsh(env, { privateKey: await loadPrivateKey(join(dir, 'other')) }));
    expect((err as SshError).reason).toBe('SSHHandshakeFailed');
    expect((err as SshError).message).toContain('authentication');
  });

  it('reports a closed port as Unreachable and a missing socket as LibvirtConnectFailed', async () => {
    const key = await loadPrivateKey(env.sshKeyFile);
    const closed = await errorOf(
      connectSsh({
        host: '127.0.0.1',
        port: 1,
        username: env.sshUser,
        privateKey: key,
        hostKeys: 'insecure-ignore',
      }),
    );
    expect((closed as SshError).reason).toBe('Unreachable');

    const nosock = await errorOf(connectOverSsh(env, { socketPath: '/var/run/libvirt/no-such-sock' }));
    expect((nosock as SshError).reason).toBe('LibvirtConnectFailed');
  });

  it('gives up on an aborted connect with reason Timeout', async () => {
    const err = await errorOf(
      openLibvirtOverSsh({
        host: env.sshHost,
        port: env.sshPort,
        username: env.sshUser,
        privateKey: await loadPrivateKey(env.sshKeyFile),
        hostKeys: 'insecure-ignore',
        signal: AbortSignal.abort(new Error('deadline')),
      }),
    );
    expect((err as SshError).reason).toBe('Timeout');
  });
});
