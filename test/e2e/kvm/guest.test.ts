/**
 * The KVM end-to-end tier: a Proxy on the kvm provider, run by the real `standalone` CLI through
 * its embedded store, served by a real Debian guest on QEMU/TCG behind the real libvirtd + sshd
 * of scripts/ci/libvirt-up.sh. The guest image comes from scripts/ci/build-guest-image.sh (cached)
 * and boots directly from its kernel and initrd (the image entry's `kernel`, `initrd`, `cmdline`);
 * its NIC sits on the CI bridge, where dnsmasq hands out addresses. Nothing leaves this machine.
 *
 * One test, in order: create → the operator is killed with SIGKILL while the VM boots and
 * started again (it adopts the same domain, no second one) → cloud-init applies the generated
 * user-data (Squid with the Proxy's htpasswd) → the guest agent reports the address → Ready →
 * the health probe through the VM's Squid to a TLS origin on the bridge address → Healthy → a
 * lease → an HTTPS request through the leased proxy, and 407 without credentials → delete: the
 * domain, its overlay and its seed go, the cached base image stays.
 */
import { execFileSync } from 'node:child_process';
import {
  createReadStream,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMetadata } from '../../../src/provider/kvm/domain.ts';
import type { LibvirtConnection } from '../../../src/provider/kvm/libvirt.ts';
import { type DomainRef, DomainState, UndefineFlags } from '../../../src/provider/kvm/libvirt-protocol.ts';
import {
  basicAuth,
  CliProcess,
  cleanupCli,
  clientFor,
  freePort,
  REPO_ROOT,
  standaloneArgs,
  type Workspace,
  waitFor,
} from '../../support/cli.ts';
import { connectLocal, type LibvirtEnv, requireLibvirt } from '../../support/libvirt.ts';
import { type Origin, startTlsOrigin, TLS_ORIGIN_BRIDGE_ADDRESS, testPki } from '../../support/origins.ts';

const BUILD_SCRIPT = join(REPO_ROOT, 'scripts/ci/build-guest-image.sh');
const NAMESPACE = 'kvm-e2e';
const PROXY = 'vm-1';
const PROVIDER = 'kvm-ci';
const IMAGE_KEY = 'ci-guest';
const PROXY_PORT = 3128;
/** TCG boots a Debian guest in one to two minutes; allow for a busy machine. */
const BOOT_TIMEOUT_MS = 600_000;

interface GuestImage {
  disk: string;
  sha256: string;
  kernel: string;
  initrd: string;
  cmdline: string;
}

interface BridgeEnv extends LibvirtEnv {
  bridge?: string;
  bridgeAddress?: string;
}

/** The cached guest image (built by the script when missing: root only, several minutes). */
function guestImage(): GuestImage {
  let dir: string;
  try {
    dir = execFileSync('bash', [BUILD_SCRIPT], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
      timeout: 1_200_000,
    }).trim();
  } catch (err) {
    throw new Error(
      `the KVM tier's guest image is missing and could not be built: run \`sudo bash scripts/ci/build-guest-image.sh\` (${(err as Error).message})`,
    );
  }
  return JSON.parse(readFileSync(join(dir, 'image.json'), 'utf8')) as GuestImage;
}

/** Serves the guest disk over http on loopback: the provider downloads base images by URL. */
async function serveDisk(path: string): Promise<{ url: string; close: () => Promise<void> }> {
  const size = statSync(path).size;
  const server = http.createServer((req, res) => {
    if (req.url !== '/root.qcow2') {
      res.statusCode = 404;
      res.end();
      return;
    }
    res.writeHead(200, { 'content-length': size, 'content-type': 'application/octet-stream' });
    createReadStream(path).pipe(res);
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/root.qcow2`,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}

function providersYaml(env: BridgeEnv, image: GuestImage, diskUrl: string, originPort: number): string {
  return `providers:
  - name: ${PROVIDER}
    type: kvm
    kvm:
      sshKeyFile: ${env.sshKeyFile}
      knownHostsFile: ${env.knownHostsFile}
      domainType: qemu             # TCG: this machine has no /dev/kvm
      diskSizeGb: 4
      images:
        ${IMAGE_KEY}:
          url: ${diskUrl}
          sha256: ${image.sha256}
          format: qcow2
          firmware: bios
          kernel: ${image.kernel}
          initrd: ${image.initrd}
          cmdline: ${JSON.stringify(image.cmdline)}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 512}
      hosts:
        - name: ci-host
          address: "${env.sshHost}:${env.sshPort}"
          user: ${env.sshUser}
          bridge: ${env.bridge}
          pool: ${env.pool}
          socket: ${env.socketPath}
      # The TLS origin listens on the bridge address, on a port of its own.
      egressPolicy: {connectPorts: [443, ${originPort}]}
`;
}

function proxyYaml(origin: Origin): string {
  return `apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata:
  name: ${PROXY}
  namespace: ${NAMESPACE}
spec:
  provider: ${PROVIDER}
  port: ${PROXY_PORT}
  placement: {machineType: small, image: ${IMAGE_KEY}}
  healthCheck:
    url: ${origin.baseUrl}/generate_204
    expectStatus: 204
    intervalSeconds: 2
    timeoutSeconds: 5
`;
}

/** Domains whose metadata names our Proxy. */
async function domainsOfProxy(conn: LibvirtConnection): Promise<{ dom: DomainRef; uid?: string }[]> {
  const out: { dom: DomainRef; uid?: string }[] = [];
  for (const dom of await conn.listAllDomains()) {
    let xml: string;
    try {
      xml = await conn.domainGetXmlDesc(dom, 0);
    } catch {
      continue; // gone meanwhile
    }
    const meta = parseMetadata(xml);
    if (meta.managed && meta.namespace === NAMESPACE && meta.proxyName === PROXY) {
      out.push({ dom, ...(meta.uid ? { uid: meta.uid } : {}) });
    }
  }
  return out;
}

async function volumeNames(conn: LibvirtConnection, pool: string): Promise<string[]> {
  const p = await conn.storagePoolLookupByName(pool);
  await conn.storagePoolRefresh(p);
  return (await conn.storagePoolListAllVolumes(p)).map((v) => v.name);
}

/**
 * An HTTPS GET through the forward proxy at `proxyUrl` (CONNECT, then TLS to the origin with
 * the test CA): the CONNECT status, and the origin's status when the tunnel opened.
 */
function httpsViaProxy(
  proxyUrl: string,
  target: string,
  ca: string,
  auth: boolean,
): Promise<{ connect: number; status?: number; peer?: string }> {
  const proxy = new URL(proxyUrl);
  const url = new URL(target);
  return new Promise((ok, fail) => {
    const req = http.request({
      host: proxy.hostname,
      port: Number(proxy.port),
      method: 'CONNECT',
      path: `${url.hostname}:${url.port}`,
      headers: auth ? { 'proxy-authorization': basicAuth(proxyUrl) } : {},
      agent: false,
      timeout: 20_000,
    });
    req.once('timeout', () => req.destroy(new Error('CONNECT timed out')));
    req.once('error', fail);
    req.once('connect', (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        ok({ connect: res.statusCode ?? 0 });
        return;
      }
      const get = https.request(
        {
          host: url.hostname,
          port: Number(url.port),
          path: url.pathname,
          createConnection: () => tls.connect({ socket, ca, host: url.hostname }),
          timeout: 20_000,
        },
        (r) => {
          r.resume();
          r.once('end', () =>
            ok({ connect: 200, status: r.statusCode ?? 0, peer: String(r.headers['x-peer'] ?? '') }),
          );
        },
      );
      get.once('timeout', () => get.destroy(new Error('GET timed out')));
      get.once('error', fail);
      get.end();
    });
    req.end();
  });
}

describe('kvm provider end to end with a real guest (TCG)', () => {
  let env: BridgeEnv;
  let conn: LibvirtConnection;
  let image: GuestImage;
  let disk: Awaited<ReturnType<typeof serveDisk>>;
  let origin: Origin;
  let ws: Workspace;
  let caFile: string;
  const started = Date.now();

  beforeAll(async () => {
    env = await requireLibvirt();
    if (!env.bridge || !env.bridgeAddress) {
      throw new Error(
        'the CI bridge is not up (env.json has no bridge): run `sudo bash scripts/ci/libvirt-up.sh` again',
      );
    }
    expect(env.bridgeAddress).toBe(TLS_ORIGIN_BRIDGE_ADDRESS);
    conn = await connectLocal(env);
    image = guestImage();
    disk = await serveDisk(image.disk);
    origin = await startTlsOrigin({ host: env.bridgeAddress });

    const dir = mkdtempSync(join(tmpdir(), 'kvm-e2e-'));
    mkdirSync(join(dir, 'proxies'));
    caFile = join(dir, 'ca.crt');
    writeFileSync(caFile, testPki().caCert);
    writeFileSync(join(dir, 'providers.yaml'), providersYaml(env, image, disk.url, origin.port));
    writeFileSync(join(dir, 'proxies', `${PROXY}.yaml`), proxyYaml(origin));
    const [discoveryPort, healthPort] = [await freePort(), await freePort()];
    ws = {
      dir,
      providersFile: join(dir, 'providers.yaml'),
      proxiesDir: join(dir, 'proxies'),
      statePath: join(dir, 'state.json'),
      discoveryPort,
      healthPort,
      portRange: { from: 0, to: 0 },
      discoveryUrl: `http://127.0.0.1:${discoveryPort}`,
      healthUrl: `http://127.0.0.1:${healthPort}`,
    };
  });

  afterAll(async () => {
    await cleanupCli();
    // Whatever a failed run left behind: our domain, overlay and seed (the base may stay).
    if (conn) {
      for (const { dom } of await domainsOfProxy(conn).catch(() => [])) {
        await conn.domainDestroy(dom, 0).catch(() => undefined);
        await conn.domainUndefine(dom, UndefineFlags.NVRAM).catch(() => undefined);
      }
      const pool = await conn.storagePoolLookupByName(env.pool).catch(() => undefined);
      if (pool) {
        for (const vol of await conn.storagePoolListAllVolumes(pool).catch(() => [])) {
          if (vol.name.startsWith('px-')) await conn.storageVolDelete(vol, 0).catch(() => undefined);
        }
      }
      await conn.close();
    }
    await origin?.close();
    await disk?.close();
    if (ws) rmSync(ws.dir, { recursive: true, force: true });
  });

  it('boots, serves a lease through the VM, survives kill -9 while booting, and cleans up', async () => {
    const cliEnv = { NODE_EXTRA_CA_CERTS: caFile };
    // Removing the only manifest deletes every Proxy: a mass deletion the operator holds back
    // unless told (src/runtime/embedded/manifest-sync.ts).
    const start = () =>
      new CliProcess(standaloneArgs(ws, ['--allow-empty-manifests']), ws.dir, { env: cliEnv });
    const timings: Record<string, number> = {};
    const mark = (what: string) => {
      timings[what] = Math.round((Date.now() - started) / 100) / 10;
    };

    // 1. Create: the base image is downloaded into the pool, then overlay, seed and domain.
    let proc: CliProcess = start();
    const first = await waitFor(
      async () => {
        const doms = await domainsOfProxy(conn);
        if (doms.length === 0) return undefined;
        const { state } = await conn.domainGetState(doms[0]!.dom);
        return state === DomainState.RUNNING && doms;
      },
      'the Proxy’s domain defined and running',
      BOOT_TIMEOUT_MS,
      proc,
    );
    mark('domainRunning');
    expect(first).toHaveLength(1);
    const domain = first[0]!.dom;
    const xml = await conn.domainGetXmlDesc(domain, 0);
    expect(xml).toContain(`<kernel>${image.kernel}</kernel>`);
    expect(xml).toContain(`<initrd>${image.initrd}</initrd>`);
    expect(xml).toContain(`<source bridge='${env.bridge}'/>`);
    const vols = await volumeNames(conn, env.pool);
    expect(vols).toContain(`${domain.name}.qcow2`);
    expect(vols).toContain(`${domain.name}-seed.iso`);
    const bases = vols.filter((v) => v.startsWith(`base-${IMAGE_KEY}-`) && v.endsWith('.qcow2'));
    expect(bases).toEqual([`base-${IMAGE_KEY}-sha256-${image.sha256.slice(0, 16)}.qcow2`]);

    // 2. kill -9 while the guest boots; a new operator adopts the same domain.
    const before = (await clientFor(ws).listProxies())[0];
    expect(before?.phase).not.toBe('Ready');
    await proc.killHard();
    const killed = proc;
    proc = start();
    await waitFor(
      async () =>
        (
          await clientFor(ws)
            .listProxies()
            .catch(() => [])
        ).length > 0,
      'the restarted operator serving its discovery API',
      60_000,
      proc,
    );

    // 3. cloud-init, the guest agent's address, Ready.
    const ready = await waitFor(
      async () => {
        const p = (await clientFor(ws).listProxies()).find((s) => s.name === PROXY);
        return p?.phase === 'Ready' && p.host ? p : undefined;
      },
      'the Proxy Ready with the address the guest agent reports',
      BOOT_TIMEOUT_MS,
      proc,
    );
    mark('ready');
    expect(ready.host).toMatch(/^198\.51\.100\.\d+$/);
    expect(ready.port).toBe(PROXY_PORT);
    const after = await domainsOfProxy(conn);
    expect(after.map((d) => d.dom.name)).toEqual([domain.name]);
    expect(after[0]!.dom.uuid.equals(domain.uuid)).toBe(true);

    // 4. The health probe through the VM's Squid to the TLS origin on the bridge.
    await waitFor(
      async () => (await clientFor(ws).listProxies()).find((s) => s.name === PROXY && s.healthy),
      'the Proxy healthy (probe through the VM to the TLS origin)',
      BOOT_TIMEOUT_MS,
      proc,
    );
    mark('healthy');
    expect(origin.sources).toContain(ready.host);

    // 5. A lease, a real HTTPS request through it, and 407 without the credentials.
    const grant = await clientFor(ws).lease({ namespace: NAMESPACE, ttlSeconds: 300 });
    expect(grant.proxy.name).toBe(PROXY);
    expect(grant.proxy.host).toBe(ready.host);
    const target = `${origin.baseUrl}/status/200`;
    const res = await httpsViaProxy(grant.proxy.url, target, testPki().caCert, true);
    expect(res).toEqual({ connect: 200, status: 200, peer: ready.host });
    expect(await httpsViaProxy(grant.proxy.url, target, testPki().caCert, false)).toEqual({ connect: 407 });
    await clientFor(ws).release(grant.id);
    // The credentials never reach the operator's log.
    const password = decodeURIComponent(new URL(grant.proxy.url).password);
    expect(password.length).toBeGreaterThan(0);
    for (const p of [killed, proc]) {
      expect(p.stdout).not.toContain(password);
      expect(p.stderr).not.toContain(password);
    }

    // 6. Delete: domain, overlay and seed go; the cached base stays for the next VM.
    rmSync(join(ws.proxiesDir, `${PROXY}.yaml`));
    await waitFor(
      async () => {
        const names = await volumeNames(conn, env.pool);
        return (
          (await domainsOfProxy(conn)).length === 0 &&
          !names.includes(`${domain.name}.qcow2`) &&
          !names.includes(`${domain.name}-seed.iso`) &&
          names
        );
      },
      'domain, overlay and seed deleted',
      120_000,
      proc,
    );
    mark('deleted');
    const left = await volumeNames(conn, env.pool);
    expect(left).toContain(bases[0]);
    await expect(conn.domainLookupByName(domain.name)).rejects.toThrow();

    // Reported in the run's output: the tier's timings on this machine.
    const t = (k: string) => timings[k] ?? Number.NaN;
    console.log(
      `kvm e2e timings: ${JSON.stringify(timings)} s since the test began; domain running → Ready ${
        Math.round((t('ready') - t('domainRunning')) * 10) / 10
      } s, Ready → healthy ${Math.round((t('healthy') - t('ready')) * 10) / 10} s`,
    );
  });
});
