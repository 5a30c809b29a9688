/**
 * The kvm provider against a real libvirtd + QEMU (TCG) over a real sshd on loopback, with the
 * base image (a tiny empty qcow2) served by a local HTTP server. The image boots nothing and has
 * no guest agent, so a created VM stays Pending; the tests check the pieces libvirt holds.
 * Needs scripts/ci/libvirt-up.sh.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { type AddressInfo, createServer as createTcpServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { KvmProviderConfig } from '../../../src/config/schema.ts';
import { silentLogger } from '../../../src/log/index.ts';
import type { CallContext, CreateRequest } from '../../../src/provider/contract.ts';
import { classify } from '../../../src/provider/errors.ts';
import { createKvmProvider, type KvmProvider } from '../../../src/provider/kvm/index.ts';
import {
  DomainState,
  ErrorCode,
  isLibvirtError,
  type LibvirtConnection,
} from '../../../src/provider/kvm/libvirt.ts';
import {
  ciName,
  connectLocal,
  type LibvirtEnv,
  requireLibvirt,
  tinyDomainXml,
} from '../../support/libvirt.ts';
import { captureLog } from '../../support/log.ts';

const USER_NIC = "<interface type='user'><model type='virtio'/></interface>";

let env: LibvirtEnv;
let local: LibvirtConnection;
let server: Server;
let baseUrl = '';
let image: Buffer;
let imageSha = '';
const requests: string[] = [];
const tag = randomBytes(3).toString('hex');
const providers: KvmProvider[] = [];
let setupError: unknown;

const ctx = (ms = 60_000): CallContext => ({ signal: AbortSignal.timeout(ms), log: silentLogger() });

function config(
  over: Partial<KvmProviderConfig> = {},
  host: Partial<KvmProviderConfig['hosts'][number]> = {},
) {
  const c: KvmProviderConfig = {
    sshKeyFile: env.sshKeyFile,
    knownHostsFile: env.knownHostsFile,
    domainType: 'qemu',
    diskSizeGb: 1,
    installGuestAgent: false,
    images: {
      [`ci-img-${tag}`]: { url: `${baseUrl}/tiny.qcow2`, sha256: imageSha, firmware: 'bios' },
    },
    machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
    hosts: [
      {
        name: 'ci',
        address: `${env.sshHost}:${env.sshPort}`,
        user: env.sshUser,
        bridge: 'br-not-used-in-tests',
        pool: env.pool,
        socket: env.socketPath,
        ...host,
      },
    ],
    ...over,
  };
  return c;
}

function provider(c: KvmProviderConfig = config(), log?: Logger): KvmProvider {
  const p = createKvmProvider({
    name: 'kvm-ci',
    config: c,
    interfaceXml: USER_NIC,
    dialTimeoutMs: 10_000,
    ...(log ? { log } : {}),
  });
  providers.push(p);
  return p;
}

function request(name: string, over: Partial<CreateRequest> = {}): CreateRequest {
  return {
    name,
    uid: `uid-${name}`,
    namespace: 'team-a',
    proxyName: 'egress',
    port: 3128,
    credentials: { username: 'u', password: 'p4ss' },
    cloudInit: `#cloud-config\n# for ${name}\n`,
    ...over,
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

async function readVolume(name: string): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const b of local.storageVolDownload(await local.storageVolLookupByName(await pool(), name)))
    parts.push(b);
  return Buffer.concat(parts);
}

async function domainExists(name: string): Promise<boolean> {
  try {
    await local.domainLookupByName(name);
    return true;
  } catch (err) {
    if (isLibvirtError(err, ErrorCode.NO_DOMAIN)) return false;
    throw err;
  }
}

async function removeDomain(name: string): Promise<void> {
  try {
    const d = await local.domainLookupByName(name);
    await local.domainDestroy(d).catch(() => undefined);
    await local.domainUndefine(d, 4).catch(() => undefined);
  } catch {
    // gone
  }
}

async function errorOf(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

/** Content-addressed: the configured checksum is in the name. */
const baseVolume = () => `base-ci-img-${tag}-sha256-${imageSha.slice(0, 16)}.qcow2`;
const created: string[] = [];

beforeAll(async () => {
  try {
    env = await requireLibvirt();
    local = await connectLocal(env);
    const dir = mkdtempSync(join(tmpdir(), 'kvm-provider-'));
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', join(dir, 'tiny.qcow2'), '64M']);
    image = readFileSync(join(dir, 'tiny.qcow2'));
    imageSha = createHash('sha256').update(image).digest('hex');
    server = createServer((req, res) => {
      requests.push(req.url ?? '');
      if (req.url === '/tiny.qcow2') res.end(image);
      else if (req.url === '/slow.qcow2') setTimeout(() => res.end(image), 300);
      else if (req.url?.startsWith('/busy.qcow2')) {
        res.statusCode = 503;
        res.end('busy');
      } else {
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
    for (const name of created) await removeDomain(name);
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

describe('kvm provider on a real libvirtd', () => {
  it('creates a running domain from a cached base image, overlay and seed; create again returns it', async () => {
    const logs = captureLog('debug');
    const p = provider(config(), logs.log);
    const name = ciName(env, 'create');
    created.push(name);
    const before = requests.length;
    const inst = await p.create({ ...ctx(), log: logs.log }, request(name));
    expect(inst).toMatchObject({
      id: `hosts/ci/domains/${name}`,
      name,
      state: 'Pending', // running, but no guest agent will ever report an address
      uid: `uid-${name}`,
      namespace: 'team-a',
    });
    expect(inst.createdAt).toBeInstanceOf(Date);

    const dom = await local.domainLookupByName(name);
    expect((await local.domainGetState(dom)).state).toBe(DomainState.RUNNING);
    const xml = await local.domainGetXmlDesc(dom);
    expect(xml).toContain("type='qemu'");
    expect(xml).toContain('org.qemu.guest_agent.0');
    expect(xml).toContain(`volume='${name}.qcow2'`);
    expect(xml).toMatch(/<vcpu[^>]*>1<\/vcpu>/);
    expect(xml).toContain("<memory unit='KiB'>65536</memory>");

    const vols = await volumeNames();
    expect(vols).toEqual(
      expect.arrayContaining([baseVolume(), `${baseVolume()}.sha256`, `${name}.qcow2`, `${name}-seed.iso`]),
    );
    expect((await readVolume(`${baseVolume()}.sha256`)).toString().trim()).toBe(imageSha);
    expect(
      createHash('sha256')
        .update(await readVolume(baseVolume()))
        .digest('hex'),
    ).toBe(imageSha);
    // The overlay is copy-on-write on the cached base image.
    const info = JSON.parse(
      execFileSync('qemu-img', ['info', '-U', '--output=json', await volumePath(`${name}.qcow2`)], {
        encoding: 'utf8',
      }),
    ) as { 'backing-filename'?: string; 'virtual-size': number };
    expect(info['backing-filename']).toBe(await volumePath(baseVolume()));
    expect(info['virtual-size']).toBe(1024 ** 3);
    // The seed carries the Proxy's cloud-init byte for byte.
    const seed = await readVolume(`${name}-seed.iso`);
    expect(seed.includes(Buffer.from('cidata'))).toBe(true);
    expect(seed.includes(Buffer.from(`#cloud-config\n# for ${name}\n`))).toBe(true);

    const again = await p.create(ctx(), request(name));
    expect(again.id).toBe(inst.id);
    expect(again.createdAt?.getTime()).toBe(inst.createdAt?.getTime());
    expect((await local.domainLookupByName(name)).uuid.equals(dom.uuid)).toBe(true);
    expect(requests.length - before).toBe(1);
    expect((await volumeNames()).filter((v) => v.startsWith(name))).toHaveLength(2);
    // Neither the password nor the cloud-init ever reaches a log line.
    expect(logs.raw.length).toBeGreaterThan(0);
    expect(logs.raw.join('\n')).not.toContain('p4ss');
    expect(logs.raw.join('\n')).not.toContain('#cloud-config');
  }, 90_000);

  it('resumes a create that crashed after the volumes were made, reusing them', async () => {
    const p = provider(
      config({ installGuestAgent: true, vendorData: '#cloud-config\nntp: {enabled: true}\n' }),
    );
    const name = ciName(env, 'resume');
    created.push(name);
    // No cloud-init of its own: the default one (Squid, Basic auth as an htpasswd hash).
    await p.create(
      ctx(),
      request(name, {
        cloudInit: undefined,
        credentials: { username: 'alice', password: 'Sup3r-Secret-Pw' },
      }),
    );
    const seed = await readVolume(`${name}-seed.iso`);
    expect(seed.includes(Buffer.from('packages:\n  - squid'))).toBe(true);
    expect(seed.includes(Buffer.from('alice:$apr1$'))).toBe(true);
    expect(seed.includes(Buffer.from('Sup3r-Secret-Pw'))).toBe(false);
    // vendor-data: the configured document and the guest-agent script, as base64 MIME parts.
    expect(seed.includes(Buffer.from('Content-Type: multipart/mixed'))).toBe(true);
    const vendor = Buffer.from('#cloud-config\nntp: {enabled: true}\n').toString('base64');
    expect(seed.includes(Buffer.from(vendor))).toBe(true);
    const overlayIno = statSync(await volumePath(`${name}.qcow2`)).ino;
    await removeDomain(name); // as if the process died between volumes and define
    expect(await domainExists(name)).toBe(false);

    const inst = await p.create(ctx(), request(name));
    expect(inst.state).toBe('Pending');
    expect((await local.domainGetState(await local.domainLookupByName(name))).state).toBe(
      DomainState.RUNNING,
    );
    expect(statSync(await volumePath(`${name}.qcow2`)).ino).toBe(overlayIno);
    expect((await volumeNames()).filter((v) => v.startsWith(name)).sort()).toEqual([
      `${name}-seed.iso`,
      `${name}.qcow2`,
    ]);

    // A crash between define and start: the defined domain is started, not redefined.
    const dom = await local.domainLookupByName(name);
    await local.domainDestroy(dom);
    expect((await p.get(ctx(), inst.id)).state).toBe('Stopped');
    await p.create(ctx(), request(name));
    const again = await local.domainLookupByName(name);
    expect(again.uuid.equals(dom.uuid)).toBe(true);
    expect((await local.domainGetState(again)).state).toBe(DomainState.RUNNING);
  }, 90_000);

  it('replaces a base image whose download never finished (no marker), once for concurrent creates', async () => {
    const key = `ci-img2-${tag}`;
    const c = config({
      images: { [key]: { url: `${baseUrl}/slow.qcow2`, sha256: imageSha, firmware: 'bios' } },
    });
    // A half-written base image from a crashed download: present, but no .sha256 marker.
    const p0 = await pool();
    const half = await local.storageVolCreateXml(
      p0,
      `<volume><name>base-${key}-sha256-${imageSha.slice(0, 16)}.qcow2</name><capacity unit='bytes'>4096</capacity><target><format type='raw'/></target></volume>`,
    );
    await local.storageVolUpload(half, Buffer.alloc(4096, 7));

    const p = provider(c);
    const a = ciName(env, 'share-a');
    const b = ciName(env, 'share-b');
    created.push(a, b);
    const before = requests.filter((r) => r === '/slow.qcow2').length;
    await Promise.all([p.create(ctx(), request(a)), p.create(ctx(), request(b))]);
    expect(requests.filter((r) => r === '/slow.qcow2').length - before).toBe(1);
    expect(
      createHash('sha256')
        .update(await readVolume(`base-${key}-sha256-${imageSha.slice(0, 16)}.qcow2`))
        .digest('hex'),
    ).toBe(imageSha);
    await p.delete(ctx(), `hosts/ci/domains/${a}`);
    await p.delete(ctx(), `hosts/ci/domains/${b}`);
  }, 90_000);

  it('reads instances back with their metadata and lists only managed domains', async () => {
    const p = provider();
    const name = ciName(env, 'meta');
    const stranger = ciName(env, 'stranger');
    created.push(name, stranger);
    const inst = await p.create(ctx(), request(name, { uid: 'c0ffee-uid', namespace: 'ns-x' }));
    await local.domainDefineXml(tinyDomainXml(stranger));

    const got = await p.get(ctx(), inst.id);
    expect(got).toMatchObject({ id: inst.id, name, uid: 'c0ffee-uid', namespace: 'ns-x', state: 'Pending' });
    // The host is the zone.
    expect(got.location).toEqual({ zone: 'ci' });
    expect(got.createdAt?.getTime()).toBe(inst.createdAt?.getTime());

    const listed = await p.listByTag(ctx());
    const mine = listed.find((i) => i.name === name);
    expect(mine).toMatchObject({ id: inst.id, uid: 'c0ffee-uid', namespace: 'ns-x' });
    expect(listed.some((i) => i.name === stranger)).toBe(false);

    // Not ours: a delete must refuse and leave it alone; a create of that name is refused too.
    const refused = await errorOf(p.delete(ctx(), `hosts/ci/domains/${stranger}`));
    expect(classify(refused)).toBe('Permanent');
    expect(await domainExists(stranger)).toBe(true);
    expect(classify(await errorOf(p.create(ctx(), request(stranger))))).toBe('Permanent');
    await removeDomain(stranger);
  }, 90_000);

  it('deletes domain, overlay and seed but never the current base image; delete is idempotent', async () => {
    const p = provider();
    const name = ciName(env, 'delete');
    created.push(name);
    const inst = await p.create(ctx(), request(name));
    await p.delete(ctx(), inst.id);
    expect(await domainExists(name)).toBe(false);
    const vols = await volumeNames();
    expect(vols.filter((v) => v.startsWith(name))).toEqual([]);
    expect(vols).toContain(baseVolume());
    await p.delete(ctx(), inst.id);
    expect(classify(await errorOf(p.get(ctx(), inst.id)))).toBe('NotFound');
    // A host no longer configured: delete has nothing to do, get is a Permanent error.
    await p.delete(ctx(), `hosts/gone/domains/${name}`);
    expect(classify(await errorOf(p.get(ctx(), `hosts/gone/domains/${name}`)))).toBe('Permanent');
    expect(classify(await errorOf(p.get(ctx(), 'hosts/ci/vms/x')))).toBe('Permanent');
    expect(classify(await errorOf(p.delete(ctx(), 'hosts/ci')))).toBe('Permanent');
  }, 90_000);

  it('defines the domain with the configured bridge NIC; a bridge missing on the host fails start, naming it', async () => {
    const bridge = `nobr${tag}`.slice(0, 15);
    const p = createKvmProvider({ name: 'kvm-ci', config: config({}, { bridge }), dialTimeoutMs: 10_000 });
    providers.push(p);
    const name = ciName(env, 'bridge');
    created.push(name);
    const err = await errorOf(p.create(ctx(), request(name)));
    expect(classify(err)).toBe('Transient'); // someone may still create the bridge
    expect((err as Error).message).toContain(bridge);
    const xml = await local.domainGetXmlDesc(await local.domainLookupByName(name));
    expect(xml).toMatch(
      new RegExp(
        `<interface type='bridge'>[\\s\\S]*?<source bridge='${bridge}'/>[\\s\\S]*?<model type='virtio'/>`,
      ),
    );
    await p.delete(ctx(), `hosts/ci/domains/${name}`);
    expect(await domainExists(name)).toBe(false);
    expect((await volumeNames()).filter((v) => v.startsWith(name))).toEqual([]);
  }, 60_000);

  it('fails Permanent on a checksum mismatch and leaves no cached image', async () => {
    const key = `ci-bad-${tag}`;
    const p = provider(
      config({
        images: { [key]: { url: `${baseUrl}/tiny.qcow2`, sha256: 'b'.repeat(64), firmware: 'bios' } },
      }),
    );
    const name = ciName(env, 'badsum');
    created.push(name);
    const err = await errorOf(p.create(ctx(), request(name)));
    expect(classify(err)).toBe('Permanent');
    expect((err as Error).message).toContain('sha256');
    const vols = await volumeNames();
    expect(vols.filter((v) => v.includes(key) || v.startsWith(name))).toEqual([]);
    expect(await domainExists(name)).toBe(false);
  }, 60_000);

  it('fails Permanent for a missing image URL, bad names and unknown placement', async () => {
    const p = provider(
      config({ images: { [`ci-404-${tag}`]: { url: `${baseUrl}/missing.qcow2`, firmware: 'bios' } } }),
    );
    expect(classify(await errorOf(p.create(ctx(), request(ciName(env, 'x404')))))).toBe('Permanent');
    expect(classify(await errorOf(p.create(ctx(), request('-bad name'))))).toBe('Permanent');
    const busy = provider(
      config({
        images: { [`ci-503-${tag}`]: { url: `${baseUrl}/busy.qcow2?token=s3cr3t`, firmware: 'bios' } },
      }),
    );
    const busyErr = await errorOf(busy.create(ctx(), request(ciName(env, 'x503'))));
    expect(classify(busyErr)).toBe('Transient');
    expect((busyErr as Error).message).toContain('HTTP 503');
    expect((busyErr as Error).message).not.toContain('s3cr3t');
    expect(classify(await errorOf(p.create(ctx(), request(ciName(env, 'z'), { zone: 'nas9' }))))).toBe(
      'Permanent',
    );
    expect(classify(await errorOf(p.create(ctx(), request(ciName(env, 'm'), { machineType: 'huge' }))))).toBe(
      'Permanent',
    );
  }, 60_000);

  it('a missing SSH key is Transient until it appears; an unusable one is Permanent', async () => {
    const later = join(mkdtempSync(join(tmpdir(), 'kvm-key-')), 'id_ed25519');
    const p = provider(config({ sshKeyFile: later }));
    expect(classify(await errorOf(p.get(ctx(), 'hosts/ci/domains/x')))).toBe('Transient');
    const [t] = await p.check(ctx());
    expect(t).toMatchObject({ name: 'ci', ready: false, reason: 'SSHMaterialUnavailable' });
    // The Secret mount appears: the same provider recovers without a restart.
    copyFileSync(env.sshKeyFile, later);
    expect(classify(await errorOf(p.get(ctx(), 'hosts/ci/domains/ci-none')))).toBe('NotFound');

    // Present but not a key: Permanent (it will not heal by waiting).
    const bad = join(mkdtempSync(join(tmpdir(), 'kvm-key-')), 'id_ed25519');
    writeFileSync(bad, 'not a key\n');
    const q = provider(config({ sshKeyFile: bad }));
    expect(classify(await errorOf(q.get(ctx(), 'hosts/ci/domains/x')))).toBe('Permanent');
    const [u] = await q.check(ctx());
    expect(u).toMatchObject({ name: 'ci', ready: false, reason: 'SSHMaterialUnavailable' });
  });
});

describe('kvm provider check', () => {
  it('reports a healthy host with its details', async () => {
    const p = provider();
    const [t] = await p.check(ctx(20_000));
    expect(t).toMatchObject({
      name: 'ci',
      address: `${env.sshHost}:${env.sshPort}`,
      ready: true,
      reason: 'Reachable',
    });
    expect(t?.details).toMatchObject({ pool: env.pool, poolState: 'running', user: env.sshUser });
    expect(t?.details?.libvirtVersion).toMatch(/^\d+\.\d+\.\d+$/);
    expect(t?.details?.hostname).toBeTruthy();
    expect(t?.details?.poolAvailable).toMatch(/GiB$/);
  }, 30_000);

  it('reports PoolNotFound for a pool that does not exist, and Unreachable for a closed port', async () => {
    const free = createTcpServer();
    await new Promise<void>((resolve) => free.listen(0, '127.0.0.1', resolve));
    const closedPort = (free.address() as AddressInfo).port;
    await new Promise<void>((resolve) => free.close(() => resolve()));

    const p = provider(
      config({
        hosts: [
          {
            name: 'ci',
            address: `${env.sshHost}:${env.sshPort}`,
            user: env.sshUser,
            bridge: 'br0',
            pool: `ci-no-pool-${tag}`,
            socket: env.socketPath,
          },
          {
            name: 'down',
            address: `127.0.0.1:${closedPort}`,
            user: env.sshUser,
            bridge: 'br0',
            pool: env.pool,
            socket: env.socketPath,
          },
        ],
      }),
    );
    const targets = await p.check(ctx(20_000));
    expect(targets.map((t) => [t.name, t.ready, t.reason])).toEqual([
      ['ci', false, 'PoolNotFound'],
      ['down', false, 'Unreachable'],
    ]);
    // The shared connection of the healthy host is still usable afterwards.
    expect(classify(await errorOf(p.get(ctx(), 'hosts/ci/domains/ci-none')))).toBe('NotFound');
  }, 30_000);
});
