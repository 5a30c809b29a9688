/**
 * provider/kvm/ssh — reaches a KVM host's libvirt socket over SSH: loads the private key,
 * connects and authenticates (verifying the host key against known_hosts), opens a
 * direct-streamlocal channel to libvirt-sock and hands it to the RPC client. Every failure is an
 * SshError whose `reason` names the step, for health checks and logs.
 */
import { readFile } from 'node:fs/promises';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import type { Clock } from '../../runtime/clock.ts';
import type { KnownHosts } from './known-hosts.ts';
import { LibvirtConnection } from './libvirt.ts';
import type { KeepaliveOptions } from './rpc.ts';
import { handshakeError, SshError } from './ssh-error.ts';

export {
  type HostKeyVerdict,
  hashKnownHostName,
  KnownHosts,
  loadKnownHosts,
  parseKnownHosts,
} from './known-hosts.ts';
export { SshError, type SshFailureReason } from './ssh-error.ts';

export const DEFAULT_LIBVIRT_SOCKET = '/var/run/libvirt/libvirt-sock';

/** Reads and parses a private key file; a missing file is SSHMaterialUnavailable, a bad one SSHMaterialInvalid. */
export async function loadPrivateKey(path: string, passphrase?: string): Promise<Buffer> {
  let data: Buffer;
  try {
    data = await readFile(path);
  } catch (err) {
    throw new SshError(
      'SSHMaterialUnavailable',
      `cannot read SSH private key ${path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  const parsed = ssh2.utils.parseKey(data, passphrase);
  const key = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!key || key instanceof Error) {
    const why = key instanceof Error ? key.message : 'no key found';
    throw new SshError('SSHMaterialInvalid', `SSH private key ${path} is not usable: ${why}`);
  }
  if (!key.isPrivateKey())
    throw new SshError('SSHMaterialInvalid', `SSH private key ${path} holds a public key`);
  return data;
}

export interface SshConnectOptions {
  host: string;
  port?: number;
  username: string;
  /** Contents of the private key (see loadPrivateKey). */
  privateKey: Buffer | string;
  passphrase?: string;
  /** Trusted host keys, or 'insecure-ignore' to accept any host key (tests, first contact). */
  hostKeys: KnownHosts | 'insecure-ignore';
  /** Bounds TCP connect + handshake + auth. Default 15 s. */
  timeoutMs?: number;
  /** SSH-level keepalive (0 disables). Default 15 s. */
  keepaliveIntervalMs?: number;
  signal?: AbortSignal | undefined;
  logger?: Logger;
  /** Told when the dial moves on: TCP connected (`ssh`), SSH ready (`libvirt`). */
  onStage?: (stage: DialStage) => void;
}

/**
 * Where a dial is: connecting TCP, in the SSH handshake (sshd accepted the connection), or in the
 * libvirt handshake over the forwarded socket. A dial that runs out of time reports its stage,
 * not a bare timeout: a stalled sshd is an sshd (or known_hosts) problem, not libvirt's.
 */
export type DialStage = 'tcp' | 'ssh' | 'libvirt';

/** The SshError for a dial that ran out of time (its own bound or the caller's) in `stage`. */
export function stalledDialError(stage: DialStage, where: string, cause?: unknown): SshError {
  const opts = cause === undefined ? undefined : { cause };
  if (stage === 'ssh') {
    return new SshError(
      'SSHHandshakeFailed',
      `SSH handshake with ${where} did not complete: the TCP connection is open but sshd did not finish the handshake`,
      opts,
    );
  }
  if (stage === 'libvirt') {
    return new SshError(
      'LibvirtConnectFailed',
      `libvirt handshake with ${where} did not complete: SSH is up but libvirtd did not answer`,
      opts,
    );
  }
  return new SshError('Timeout', `TCP connection to ${where} did not complete in time`, opts);
}

/** One authenticated SSH connection; open channels to unix sockets on the host through it. */
export class SshSession {
  readonly client: ssh2.Client;
  private closed = false;
  private readonly closeListeners = new Set<(err: Error | undefined) => void>();

  constructor(client: ssh2.Client) {
    this.client = client;
    const done = (err?: Error) => {
      if (this.closed) return;
      this.closed = true;
      for (const fn of [...this.closeListeners]) fn(err);
      this.closeListeners.clear();
    };
    client.on('close', () => done());
    client.on('error', (err: Error) => done(err));
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  onClose(fn: (err: Error | undefined) => void): () => void {
    if (this.closed) {
      queueMicrotask(() => fn(undefined));
      return () => {};
    }
    this.closeListeners.add(fn);
    return () => this.closeListeners.delete(fn);
  }

  /** direct-streamlocal@openssh.com to `socketPath` on the host. */
  openStreamLocal(socketPath: string, signal?: AbortSignal, timeoutMs = 10_000): Promise<Duplex> {
    return new Promise<Duplex>((resolve, reject) => {
      if (this.closed) {
        reject(new SshError('Unreachable', 'SSH connection is closed'));
        return;
      }
      let settled = false;
      const finish = (err: Error | undefined, ch?: Duplex) => {
        if (settled) {
          ch?.destroy();
          return;
        }
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        offClose();
        if (err) reject(err);
        else resolve(ch!);
      };
      const onAbort = () =>
        finish(new SshError('Timeout', `opening ${socketPath} over SSH aborted`, { cause: signal?.reason }));
      const timer = setTimeout(
        () =>
          finish(new SshError('Timeout', `opening ${socketPath} over SSH took longer than ${timeoutMs} ms`)),
        timeoutMs,
      );
      const offClose = this.onClose((err) =>
        finish(
          new SshError('Unreachable', `SSH connection closed while opening ${socketPath}`, { cause: err }),
        ),
      );
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      this.client.openssh_forwardOutStreamLocal(socketPath, (err, channel) => {
        if (err) {
          finish(
            new SshError(
              'LibvirtConnectFailed',
              `cannot open ${socketPath} on the host over SSH: ${err.message}`,
              {
                cause: err,
              },
            ),
          );
          return;
        }
        finish(undefined, channel);
      });
    });
  }

  close(): void {
    this.client.end();
  }
}

/**
 * ssh2's connect config: offers only host key algorithms known_hosts can vouch for, and verifies
 * the presented key, reporting why it was refused through `onHostKeyProblem`.
 */
function connectConfig(
  opts: SshConnectOptions,
  port: number,
  timeoutMs: number,
  onHostKeyProblem: (detail: string) => void,
): ssh2.ConnectConfig {
  const hostKeys = opts.hostKeys;
  const serverHostKey =
    hostKeys === 'insecure-ignore' ? undefined : hostKeys.hostKeyAlgorithms(opts.host, port);
  return {
    ...(serverHostKey
      ? { algorithms: { serverHostKey: serverHostKey as ssh2.ServerHostKeyAlgorithm[] } }
      : {}),
    host: opts.host,
    port,
    username: opts.username,
    privateKey: opts.privateKey,
    ...(opts.passphrase ? { passphrase: opts.passphrase } : {}),
    readyTimeout: timeoutMs,
    keepaliveInterval: opts.keepaliveIntervalMs ?? 15_000,
    keepaliveCountMax: 3,
    hostVerifier: (key: Buffer): boolean => {
      if (hostKeys === 'insecure-ignore') return true;
      const verdict = hostKeys.verify(opts.host, port, key);
      if (verdict.ok) return true;
      onHostKeyProblem(verdict.detail);
      return false;
    },
  };
}

/** Connects and authenticates; rejects with an SshError naming the failed step. */
export function connectSsh(opts: SshConnectOptions): Promise<SshSession> {
  const log = (opts.logger ?? silentLogger()).child({ component: 'kvm-ssh', host: opts.host });
  const port = opts.port ?? 22;
  const timeoutMs = opts.timeoutMs ?? 15_000;
  return new Promise<SshSession>((resolve, reject) => {
    const client = new ssh2.Client();
    let hostKeyProblem: string | undefined;
    let settled = false;
    let stage: DialStage = 'tcp';
    const where = `${opts.host}:${port}`;
    const finish = (err: Error | undefined) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      if (err) {
        client.removeAllListeners('ready');
        client.on('error', () => {}); // late errors from a connection we gave up on
        client.destroy();
        reject(err);
      } else {
        resolve(new SshSession(client));
      }
    };
    const onAbort = () => finish(stalledDialError(stage, where, opts.signal?.reason));
    const timer = setTimeout(() => finish(stalledDialError(stage, where)), timeoutMs);
    if (opts.signal?.aborted) return onAbort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    client.on('connect', () => {
      stage = 'ssh';
      opts.onStage?.('ssh');
    });
    client.on('ready', () => {
      log.debug('ssh ready');
      opts.onStage?.('libvirt');
      finish(undefined);
    });
    client.on('error', (err: Error & { level?: string; code?: string }) => {
      if (settled) return;
      if (err.level === 'client-timeout' && stage !== 'tcp' && !hostKeyProblem) {
        finish(stalledDialError(stage, where, err));
        return;
      }
      finish(handshakeError(err, { host: opts.host, port, username: opts.username }, hostKeyProblem));
    });
    client.on('close', () =>
      finish(new SshError('Unreachable', `SSH connection to ${opts.host}:${port} closed during handshake`)),
    );

    try {
      client.connect(
        connectConfig(opts, port, timeoutMs, (detail) => {
          hostKeyProblem = detail;
        }),
      );
    } catch (err) {
      // ssh2 throws synchronously for a private key it cannot parse.
      finish(
        new SshError(
          'SSHMaterialInvalid',
          `cannot start SSH to ${opts.host}:${port}: ${(err as Error).message}`,
          {
            cause: err,
          },
        ),
      );
    }
  });
}

export interface LibvirtOverSshOptions extends SshConnectOptions {
  socketPath?: string;
  uri?: string;
  clock?: Clock;
  keepalive?: KeepaliveOptions | false;
}

/**
 * SSH connect + streamlocal channel + libvirt handshake: one SSH session carrying one libvirt
 * connection. They live and die together: closing either (or keepalive declaring it dead)
 * closes the other.
 */
export async function openLibvirtOverSsh(
  opts: LibvirtOverSshOptions,
): Promise<{ ssh: SshSession; conn: LibvirtConnection }> {
  const ssh = await connectSsh(opts);
  try {
    const channel = await ssh.openStreamLocal(
      opts.socketPath ?? DEFAULT_LIBVIRT_SOCKET,
      opts.signal,
      opts.timeoutMs,
    );
    const conn = await LibvirtConnection.open(channel, {
      uri: opts.uri ?? 'qemu:///system',
      signal: opts.signal,
      label: opts.host,
      ...(opts.logger ? { logger: opts.logger } : {}),
      ...(opts.clock ? { clock: opts.clock } : {}),
      ...(opts.keepalive !== undefined ? { keepalive: opts.keepalive } : {}),
    });
    // The libvirt connection dying takes the SSH session with it, and vice versa.
    conn.onClose(() => ssh.close());
    ssh.onClose(() => conn.rpc.close());
    return { ssh, conn };
  } catch (err) {
    ssh.close();
    if (err instanceof SshError) throw err;
    if (opts.signal?.aborted) throw stalledDialError('libvirt', opts.host, err);
    throw new SshError(
      'LibvirtConnectFailed',
      `libvirt handshake with ${opts.host} failed: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
}
