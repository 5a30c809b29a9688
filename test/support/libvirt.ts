/**
 * test/support/libvirt — the real libvirtd + sshd started by scripts/ci/libvirt-up.sh: reads the
 * env file it writes, fails loudly when they are not up, and opens connections to libvirt
 * directly on the unix socket or through ssh.ts over the loopback sshd. Also a tiny TCG domain
 * (no disk, no NIC, SeaBIOS with nothing to boot) and unique 'ci-' names for test objects.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { LibvirtConnection, type OpenOptions } from '../../src/provider/kvm/libvirt.ts';
import {
  loadKnownHosts,
  loadPrivateKey,
  openLibvirtOverSsh,
  type SshSession,
} from '../../src/provider/kvm/ssh.ts';

export const LIBVIRT_CI_DIR = process.env.LIBVIRT_CI_DIR ?? '/var/tmp/egress-proxies-ci/libvirt';

export interface LibvirtEnv {
  socketPath: string;
  uri: string;
  pool: string;
  poolPath: string;
  sshHost: string;
  sshPort: number;
  sshUser: string;
  sshKeyFile: string;
  knownHostsFile: string;
  hostKeyPub: string;
  domainPrefix: string;
  keepaliveIntervalSeconds: number;
}

const NOT_UP =
  'libvirtd/sshd for the kvm tests are not up: run `sudo bash scripts/ci/libvirt-up.sh` first ' +
  '(needs libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils openssh-server)';

/** The environment written by libvirt-up.sh; throws (never skips) when it is missing. */
export function libvirtEnv(): LibvirtEnv {
  const file = `${LIBVIRT_CI_DIR}/env.json`;
  if (!existsSync(file)) throw new Error(`${NOT_UP} — ${file} does not exist`);
  return JSON.parse(readFileSync(file, 'utf8')) as LibvirtEnv;
}

/** Throws with instructions unless libvirtd answers on its socket and sshd accepts TCP. */
export async function requireLibvirt(): Promise<LibvirtEnv> {
  const env = libvirtEnv();
  const probe = (opts: { path: string } | { host: string; port: number }, what: string) =>
    new Promise<void>((resolve, reject) => {
      const s = connect(opts);
      s.setTimeout(3000, () => {
        s.destroy();
        reject(new Error(`${NOT_UP} — ${what} timed out`));
      });
      s.once('connect', () => {
        s.destroy();
        resolve();
      });
      s.once('error', (err) => reject(new Error(`${NOT_UP} — ${what}: ${err.message}`)));
    });
  await probe({ path: env.socketPath }, `libvirt socket ${env.socketPath}`);
  await probe({ host: env.sshHost, port: env.sshPort }, `sshd ${env.sshHost}:${env.sshPort}`);
  return env;
}

/** A libvirt connection straight over the local unix socket. */
export async function connectLocal(env: LibvirtEnv, opts: OpenOptions = {}): Promise<LibvirtConnection> {
  const sock = connect(env.socketPath);
  await new Promise<void>((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', reject);
  });
  return LibvirtConnection.open(sock, { uri: env.uri, ...opts });
}

/** A libvirt connection through ssh.ts over the loopback sshd, verifying the host key. */
export async function connectOverSsh(
  env: LibvirtEnv,
  opts: Partial<Parameters<typeof openLibvirtOverSsh>[0]> = {},
): Promise<{ ssh: SshSession; conn: LibvirtConnection }> {
  return openLibvirtOverSsh({
    host: env.sshHost,
    port: env.sshPort,
    username: env.sshUser,
    privateKey: await loadPrivateKey(env.sshKeyFile),
    hostKeys: await loadKnownHosts(env.knownHostsFile),
    socketPath: env.socketPath,
    uri: env.uri,
    timeoutMs: 10_000,
    ...opts,
  });
}

/** A unique name for a test object, with the prefix libvirt-down.sh cleans up. */
export function ciName(env: LibvirtEnv, what: string): string {
  return `${env.domainPrefix}${what}-${randomBytes(4).toString('hex')}`;
}

/**
 * The smallest domain QEMU/TCG will run: SeaBIOS with nothing to boot, no disk, no NIC; a
 * guest-agent channel with no agent behind it (so agent calls fail the way they do while a
 * real guest boots).
 */
export function tinyDomainXml(name: string): string {
  return `<domain type='qemu'>
  <name>${name}</name>
  <memory unit='MiB'>32</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <memballoon model='none'/>
  </devices>
</domain>`;
}

export function rawVolumeXml(name: string, capacity: number): string {
  return `<volume><name>${name}</name><capacity unit='bytes'>${capacity}</capacity><target><format type='raw'/></target></volume>`;
}
