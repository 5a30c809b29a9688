/**
 * provider/kvm/pool — one SSH + libvirt connection per KVM host, shared by every call: dialled
 * on first use, reused while open, dialled again after it closes. The SSH key and known_hosts
 * are read lazily (a Secret mount may appear after start): a missing file is Transient, an
 * unusable one Permanent. Waiting for a host's connection ends with the caller's signal; the
 * dial itself is shared and bounded by its own timeout.
 */
import type { Logger } from 'pino';
import { silentLogger } from '../../log/index.ts';
import { ProviderError, permanent, transient } from '../errors.ts';
import type { LibvirtConnection } from './libvirt.ts';
import type { KeepaliveOptions } from './rpc.ts';
import {
  type DialStage,
  type KnownHosts,
  loadKnownHosts,
  loadPrivateKey,
  openLibvirtOverSsh,
  SshError,
  type SshSession,
  stalledDialError,
} from './ssh.ts';

export interface PoolHost {
  name: string;
  /** host:port (IPv6 as [addr]:port). */
  address: string;
  user: string;
  socket: string;
}

export interface HostPoolOptions {
  hosts: PoolHost[];
  sshKeyFile: string;
  knownHostsFile?: string | undefined;
  insecureIgnoreHostKey: boolean;
  /** libvirt URI on the hosts. Default qemu:///system. */
  uri?: string;
  /** Bounds one dial (TCP + SSH handshake + libvirt handshake). Default 15 s. */
  dialTimeoutMs?: number;
  keepalive?: KeepaliveOptions | false;
  log?: Logger;
}

export function splitHostPort(address: string): { host: string; port: number } {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(address) ?? /^([^:]+):(\d+)$/.exec(address);
  if (!m) return { host: address, port: 22 };
  return { host: m[1] ?? address, port: Number(m[2]) };
}

interface Live {
  ssh: SshSession;
  conn: LibvirtConnection;
}

interface Material {
  privateKey: Buffer;
  hostKeys: KnownHosts | 'insecure-ignore';
}

/** Races `p` against `signal`: the caller stops waiting, `p` carries on. */
export function raceSignal<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(abortError(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

function abortError(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new Error('aborted');
}

export class HostPool {
  private readonly opts: HostPoolOptions;
  private readonly log: Logger;
  private readonly hosts = new Map<string, PoolHost>();
  private readonly live = new Map<string, Live>();
  private readonly dialing = new Map<string, Promise<Live>>();
  /** How far each dial in flight got, so a caller that stops waiting can say where it hung. */
  private readonly dialStage = new Map<string, DialStage>();
  /** Checks whose RPCs were abandoned on timeout and have not settled yet, by host. */
  private readonly abandonedProbe = new Map<string, Promise<unknown>>();
  private material: Material | undefined;
  private closed = false;
  /** Aborts dials still in flight when the pool closes. */
  private readonly stop = new AbortController();

  constructor(opts: HostPoolOptions) {
    this.opts = opts;
    this.log = (opts.log ?? silentLogger()).child({ component: 'kvm-pool' });
    for (const h of opts.hosts) this.hosts.set(h.name, h);
  }

  has(host: string): boolean {
    return this.hosts.has(host);
  }

  /** The host's shared connection, dialling it when there is none. */
  async get(host: string, signal: AbortSignal): Promise<LibvirtConnection> {
    const existing = this.live.get(host);
    if (existing?.conn.isOpen) return existing.conn;
    const h = this.hosts.get(host);
    if (!h) throw permanent(`kvm host ${JSON.stringify(host)} is not configured`);
    if (this.closed) throw transient('kvm connection pool is closed');
    let dial = this.dialing.get(host);
    if (!dial) {
      dial = this.dial(h);
      this.dialing.set(host, dial);
      const d = dial;
      d.then(
        (l) => {
          if (this.dialing.get(host) === d) this.dialing.delete(host);
          this.live.set(host, l);
          l.conn.onClose((err) => {
            if (this.live.get(host) === l) this.live.delete(host);
            this.log.info({ host, err }, 'kvm host connection closed');
          });
        },
        () => {
          if (this.dialing.get(host) === d) this.dialing.delete(host);
        },
      );
    }
    try {
      return (await raceSignal(dial, signal)).conn;
    } catch (err) {
      // Out of time while the shared dial hangs: name the step it hangs in, which points at
      // sshd or libvirtd rather than at the caller's deadline.
      const stage = this.dialStage.get(host);
      if (signal.aborted && stage && this.dialing.get(host) === dial) {
        throw stalledDialError(stage, h.address, err);
      }
      throw err;
    }
  }

  /**
   * Runs a health probe on the host's shared connection. When `signal` aborts, the probe's RPCs
   * are abandoned (the connection stays open for everyone else); while an abandoned probe of a
   * host has not settled, the next probe of that host fails at once instead of piling up.
   */
  async probe<T>(host: string, signal: AbortSignal, fn: (conn: LibvirtConnection) => Promise<T>): Promise<T> {
    const pending = this.abandonedProbe.get(host);
    if (pending) {
      throw new SshError('Timeout', `an earlier check of host ${host} is still waiting for libvirt`);
    }
    const conn = await this.get(host, signal);
    const run = fn(conn);
    try {
      return await raceSignal(run, signal);
    } catch (err) {
      if (signal.aborted) {
        const settled = run.then(
          () => undefined,
          () => undefined,
        );
        this.abandonedProbe.set(host, settled);
        void settled.then(() => {
          if (this.abandonedProbe.get(host) === settled) this.abandonedProbe.delete(host);
        });
      }
      throw err;
    }
  }

  /**
   * Reads the key and known_hosts once at start-up and warns when either cannot be read or
   * used, so a wrong path or a Secret that is not mounted shows up in the first lines of the
   * log rather than at the first reconcile or check. Never fails and keeps nothing: the files
   * may still appear, and the first dial reads them again.
   */
  async preflight(): Promise<void> {
    const check = async (file: string, what: string, load: (f: string) => Promise<unknown>) => {
      try {
        await load(file);
      } catch (err) {
        const reason = err instanceof SshError ? err.reason : 'SSHMaterialUnavailable';
        this.log.warn(
          { file, reason, message: (err as Error).message },
          `WARNING: kvm ${what} cannot be used yet; every call to these hosts fails until it can`,
        );
      }
    };
    await Promise.all([
      check(this.opts.sshKeyFile, 'SSH private key', (f) => loadPrivateKey(f)),
      !this.opts.insecureIgnoreHostKey && this.opts.knownHostsFile
        ? check(this.opts.knownHostsFile, 'known_hosts file', (f) => loadKnownHosts(f))
        : undefined,
    ]);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.stop.abort(new Error('kvm connection pool closed'));
    const all = [...this.live.values()];
    this.live.clear();
    await Promise.allSettled(
      all.map(async (l) => {
        await l.conn.close();
        l.ssh.close();
      }),
    );
    // Dials still in flight were aborted; any that landed anyway are closed.
    await Promise.allSettled(
      [...this.dialing.values()].map((d) =>
        d.then(async (l) => {
          await l.conn.close();
          l.ssh.close();
        }),
      ),
    );
  }

  private async dial(h: PoolHost): Promise<Live> {
    const material = await this.loadMaterial();
    const { host, port } = splitHostPort(h.address);
    this.dialStage.set(h.name, 'tcp');
    const signal = AbortSignal.any([
      AbortSignal.timeout(this.opts.dialTimeoutMs ?? 15_000),
      this.stop.signal,
    ]);
    const live = await openLibvirtOverSsh({
      onStage: (stage) => this.dialStage.set(h.name, stage),
      host,
      port,
      username: h.user,
      privateKey: material.privateKey,
      hostKeys: material.hostKeys,
      socketPath: h.socket,
      uri: this.opts.uri ?? 'qemu:///system',
      timeoutMs: this.opts.dialTimeoutMs ?? 15_000,
      signal,
      logger: this.log,
      ...(this.opts.keepalive !== undefined ? { keepalive: this.opts.keepalive } : {}),
    }).finally(() => this.dialStage.delete(h.name));
    if (this.closed) {
      await live.conn.close();
      live.ssh.close();
      throw transient('kvm connection pool is closed');
    }
    this.log.info({ host: h.name, address: h.address }, 'kvm host connected');
    return live;
  }

  /**
   * Key and known_hosts, read on first dial and kept once both load. Missing → Transient
   * (the Secret may still be mounting), unusable → Permanent; the SshError stays as cause.
   */
  private async loadMaterial(): Promise<Material> {
    if (this.material) return this.material;
    try {
      const privateKey = await loadPrivateKey(this.opts.sshKeyFile);
      let hostKeys: KnownHosts | 'insecure-ignore' = 'insecure-ignore';
      if (!this.opts.insecureIgnoreHostKey) {
        if (!this.opts.knownHostsFile) {
          throw new SshError('SSHMaterialInvalid', 'kvm.knownHostsFile is not configured');
        }
        hostKeys = await loadKnownHosts(this.opts.knownHostsFile);
      }
      this.material = { privateKey, hostKeys };
      return this.material;
    } catch (err) {
      if (err instanceof SshError) {
        const cls = err.reason === 'SSHMaterialUnavailable' ? 'Transient' : 'Permanent';
        throw new ProviderError(cls, err.message, { cause: err });
      }
      throw err;
    }
  }
}
