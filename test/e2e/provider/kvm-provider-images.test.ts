/**
 * Base images are immutable, on a real libvirtd + QEMU (TCG) over a real sshd on loopback: a
 * changed image (a new sha256 in the providers config) becomes a new base volume beside the old
 * one, a VM running on the old base keeps its backing file untouched, and the old base is
 * removed only once no overlay references it. Needs scripts/ci/libvirt-up.sh.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { KvmProviderConfig } from '../../../src/config/schema.ts';
import { silentLogger } from '../../../src/log/index.ts';
import type { CallContext, CreateRequest } from '../../../src/provider/contract.ts';
import { createKvmProvider, type KvmProvider } from '../../../src/provider/kvm/index.ts';
import { DomainState, type LibvirtConnection } from '../../../src/provider/kvm/libvirt.ts';
import { ciName, connectLocal, type LibvirtEnv, requireLibvirt } from '../../support/libvirt.ts';

const USER_NIC = "<interface type='user'><model type='virtio'/></interface>";

let env: LibvirtEnv;
let local: LibvirtConnection;
let server: Server;
let baseUrl = '';
/** What the image URL serves: the test swaps it to publish a new image under the same URL. */
let served: Buffer;
const images: Record<'old' | 'new', { bytes: Buffer; sha: string }> = {
  old: { bytes: Buffer.alloc(0), sha: '' },
  new: { bytes: Buffer.alloc(0), sha: '' },
};
const tag = randomBytes(3).toString('hex');
const key = `ci-imm-${tag}`;
const providers: KvmProvider[] = [];
const created: string[] = [];
let setupError: unknown;

const ctx = (ms = 60_000): CallContext => ({ signal: AbortSignal.timeout(ms), log: silentLogger() });

function config(sha: string): KvmProviderConfig {
  return {
    sshKeyFile: env.sshKeyFile,
    knownHostsFile: env.knownHostsFile,
    domainType: 'qemu',
    diskSizeGb: 1,
    installGuestAgent: false,
    images: { [key]: { url: `${baseUrl}/image.qcow2`, sha256: sha, firmware: 'bios' } },
    machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
    hosts: [
      {
        name: 'ci',
        address: `${env.sshHost}:${env.sshPort}`,
        user: env.sshUser,
        bridge: 'br-not-used-in-tests',
        pool: env.pool,
        socket: env.socketPath,
      },
    ],
  };
}

/** A provider as the operator builds one from the providers config (a reload builds a new one). */
function provider(sha: string): KvmProvider {
  const p = createKvmProvider({
    name: 'kvm-ci',
    config: config(sha),
    interfaceXml: USER_NIC,
    dialTimeoutMs: 10_000,
  });
  providers.push(p);
  return p;
}

function request(name: string): CreateRequest {
  return {
    name,
    uid: `uid-${name}`,
    namespace: 'team-a',
    proxyName: 'egress',
    port: 3128,
    credentials: { username: 'u', password: 'p4ss' },
    cloudInit: `#cloud-config\n# for ${name}\n`,
  };
}

async function pool() {
  return local.storagePoolLookupByName(env.pool);
}

async function volumeNames(): Promise<string[]> {
  const p = await pool();
  await local.storagePoolRefresh(p);
  return (await local.storagePoolListAllVolumes(p)).map((v) => v.name);
}

async function volumePath(name: string): Promise<string> {
  return local.storageVolGetPath(await local.storageVolLookupByName(await pool(), name));
}

async function sha256Of(name: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const b of local.storageVolDownload(await local.storageVolLookupByName(await pool(), name)))
    hash.update(b);
  return hash.digest('hex');
}

/** `qemu-img info` of a VM's overlay with its whole backing chain (fails if a file is missing). */
function chain(path: string): Array<{ filename: string; 'backing-filename'?: string; format: string }> {
  return JSON.parse(
    execFileSync('qemu-img', ['info', '-U', '--backing-chain', '--output=json', path], { encoding: 'utf8' }),
  ) as Array<{ filename: string; 'backing-filename'?: string; format: string }>;
}

const bases = async () => (await volumeNames()).filter((v) => v.startsWith(`base-${key}`));

beforeAll(async () => {
  try {
    env = await requireLibvirt();
    local = await connectLocal(env);
    const dir = mkdtempSync(join(tmpdir(), 'kvm-images-'));
    for (const [which, size] of [
      ['old', '64M'],
      ['new', '96M'],
    ] as const) {
      const file = join(dir, `${which}.qcow2`);
      execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', file, size]);
      const bytes = readFileSync(file);
      images[which] = { bytes, sha: createHash('sha256').update(bytes).digest('hex') };
    }
    served = images.old.bytes;
    server = createServer((req, res) => {
      if (req.url === '/image.qcow2') res.end(served);
      else {
        res.statusCode = 404;
        res.end('no');
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  } catch (err) {
    setupError = err;
  }
}, 30_000);

// Every test fails (none is skipped) when libvirtd/sshd are not up, with the fix in the message.
beforeEach(() => {
  if (setupError) throw setupError;
});

afterAll(async () => {
  await Promise.allSettled(providers.map((p) => p.close()));
  if (local) {
    for (const name of created) {
      try {
        const d = await local.domainLookupByName(name);
        await local.domainDestroy(d).catch(() => undefined);
        await local.domainUndefine(d, 4).catch(() => undefined);
      } catch {
        // gone
      }
    }
    const p = await pool().catch(() => undefined);
    if (p) {
      for (const v of await local.storagePoolListAllVolumes(p)) {
        if (v.name.includes(tag) || created.some((n) => v.name.startsWith(n))) {
          await local.storageVolDelete(v).catch(() => undefined);
        }
      }
    }
    await local.close();
  }
  server?.close();
}, 60_000);

describe('kvm base images are immutable', () => {
  it('a new checksum makes a new base; the VM on the old one keeps its backing file until it is deleted', async () => {
    const before = provider(images.old.sha);
    const a = ciName(env, 'imm-a');
    created.push(a);
    const vmA = await before.create(ctx(), request(a));
    const oldBase = (await bases()).find((v) => !v.endsWith('.sha256'));
    expect(oldBase).toBeDefined();
    // Content-addressed: the checksum is in the name.
    expect(oldBase).toContain(images.old.sha.slice(0, 16));
    const oldPath = await volumePath(oldBase!);
    const overlayA = await volumePath(`${a}.qcow2`);
    expect(chain(overlayA)[0]?.['backing-filename']).toBe(oldPath);

    // The image is republished under the same URL and the config pins its new checksum.
    served = images.new.bytes;
    const after = provider(images.new.sha);
    const b = ciName(env, 'imm-b');
    created.push(b);
    await after.create(ctx(), request(b));
    const both = await bases();
    const newBase = both.find((v) => v !== oldBase && !v.endsWith('.sha256'));
    expect(newBase).toContain(images.new.sha.slice(0, 16));
    expect(both.sort()).toEqual([oldBase!, `${oldBase}.sha256`, newBase!, `${newBase}.sha256`].sort());
    expect(await sha256Of(newBase!)).toBe(images.new.sha);
    expect(chain(await volumePath(`${b}.qcow2`))[0]?.['backing-filename']).toBe(await volumePath(newBase!));

    // VM a still runs on the old base, which is byte for byte what it was and still readable.
    expect((await local.domainGetState(await local.domainLookupByName(a))).state).toBe(DomainState.RUNNING);
    expect(await sha256Of(oldBase!)).toBe(images.old.sha);
    const chainA = chain(overlayA);
    expect(chainA.map((l) => l.filename)).toEqual([overlayA, oldPath]);
    expect(chainA[1]?.format).toBe('qcow2');
    expect((await after.get(ctx(), vmA.id)).state).toBe('Pending');

    // Deleting b keeps both bases: a still needs the old one, the new one is current.
    await after.delete(ctx(), `hosts/ci/domains/${b}`);
    expect((await bases()).sort()).toEqual(both.sort());
    // Deleting a, the last VM on the old base, removes it (and its marker); the new one stays.
    await after.delete(ctx(), vmA.id);
    expect((await bases()).sort()).toEqual([newBase!, `${newBase}.sha256`].sort());
  }, 120_000);

  it('a rolled-back checksum finds its base again instead of replacing the current one', async () => {
    served = images.new.bytes;
    const p = provider(images.new.sha);
    const c = ciName(env, 'imm-c');
    created.push(c);
    await p.create(ctx(), request(c));
    const current = (await bases()).find((v) => !v.endsWith('.sha256'))!;
    served = images.old.bytes;
    const rolledBack = provider(images.old.sha);
    const d = ciName(env, 'imm-d');
    created.push(d);
    await rolledBack.create(ctx(), request(d));
    // c's base is untouched by the rollback, d runs on a base of the old checksum.
    expect(await sha256Of(current)).toBe(images.new.sha);
    expect(chain(await volumePath(`${c}.qcow2`))[0]?.['backing-filename']).toBe(await volumePath(current));
    const oldAgain = (await bases()).find(
      (v) => v.includes(images.old.sha.slice(0, 16)) && !v.endsWith('.sha256'),
    );
    expect(chain(await volumePath(`${d}.qcow2`))[0]?.['backing-filename']).toBe(await volumePath(oldAgain!));
    await rolledBack.delete(ctx(), `hosts/ci/domains/${c}`);
    await rolledBack.delete(ctx(), `hosts/ci/domains/${d}`);
    // Neither base is referenced now; the current config's one stays cached, the other goes.
    expect((await bases()).sort()).toEqual([oldAgain!, `${oldAgain}.sha256`].sort());
  }, 120_000);
});
