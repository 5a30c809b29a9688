/**
 * provider/kvm/ssh — reaches a KVM host's libvirt socket over SSH: loads the private key and
 * OpenSSH known_hosts (plain, hashed and [host]:port entries, @revoked markers), verifies the
 * host key, opens a direct-streamlocal channel to libvirt-sock and hands it to the RPC client.
 * Every failure is an SshError whose `reason` names the step, for health checks and logs.
 */
import { createHmac } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import type { Clock } from '../../runtime/clock.ts';
import { LibvirtConnection } from './libvirt.ts';
import type { KeepaliveOptions } from './rpc.ts';

export const DEFAULT_LIBVIRT_SOCKET = '/var/run/libvirt/libvirt-sock';

/** Which step failed; the values match the kvm health-check reasons. */
export type SshFailureReason =
  | 'SSHMaterialUnavailable' // key / known_hosts file missing or unreadable (may heal)
  | 'SSHMaterialInvalid' // key / known_hosts file present but unusable (won't heal by itself)
  | 'Unreachable' // TCP connect failed
  | 'SSHHandshakeFailed' // host key rejected, authentication failed, protocol error
  | 'LibvirtConnectFailed' // the streamlocal channel to libvirt-sock could not be opened
  | 'Timeout';

export class SshError extends Error {
  readonly reason: SshFailureReason;
  constructor(reason: SshFailureReason, message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'SshError';
    this.reason = reason;
  }
}

// --- key material ---

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

interface KnownHostEntry {
  marker: 'revoked' | 'cert-authority' | undefined;
  patterns: string[];
  keyType: string;
  key: Buffer;
  line: number;
}

export type HostKeyVerdict =
  | { ok: true }
  | { ok: false; why: 'unknown-host' | 'key-mismatch' | 'revoked'; detail: string };

/** Host key algorithms ssh2 can verify. */
const HOST_KEY_ALGORITHMS = new Set([
  'ssh-ed25519',
  'ecdsa-sha2-nistp256',
  'ecdsa-sha2-nistp384',
  'ecdsa-sha2-nistp521',
  'rsa-sha2-512',
  'rsa-sha2-256',
  'ssh-rsa',
]);

/** Parsed OpenSSH known_hosts. */
export class KnownHosts {
  readonly entries: readonly KnownHostEntry[];

  constructor(entries: KnownHostEntry[]) {
    this.entries = entries;
  }

  /**
   * Host key algorithms to offer for host:port, so the server presents a key type we can
   * verify (OpenSSH does the same); undefined when known_hosts has no entry for it.
   */
  hostKeyAlgorithms(host: string, port: number): string[] | undefined {
    const names = port === 22 ? [host, `[${host}]:22`] : [`[${host}]:${port}`];
    const types = new Set(
      this.entries
        .filter((e) => e.marker === undefined && names.some((n) => hostMatches(e.patterns, n)))
        .map((e) => e.keyType),
    );
    if (types.size === 0) return undefined;
    const algos: string[] = [];
    for (const t of types)
      algos.push(...(t === 'ssh-rsa' ? ['rsa-sha2-512', 'rsa-sha2-256', 'ssh-rsa'] : [t]));
    const usable = algos.filter((a) => HOST_KEY_ALGORITHMS.has(a));
    return usable.length > 0 ? usable : undefined;
  }

  /** Decides whether `key` (the SSH wire-format host key blob) is trusted for host:port. */
  verify(host: string, port: number, key: Buffer): HostKeyVerdict {
    const names = port === 22 ? [host, `[${host}]:22`] : [`[${host}]:${port}`];
    const matching = this.entries.filter((e) => names.some((n) => hostMatches(e.patterns, n)));
    if (matching.some((e) => e.marker === 'revoked' && e.key.equals(key))) {
      return { ok: false, why: 'revoked', detail: `host key for ${names[0]} is marked @revoked` };
    }
    const plain = matching.filter((e) => e.marker === undefined);
    if (plain.some((e) => e.key.equals(key))) return { ok: true };
    if (plain.length === 0) {
      return { ok: false, why: 'unknown-host', detail: `no known_hosts entry for ${names[0]}` };
    }
    return {
      ok: false,
      why: 'key-mismatch',
      detail: `host key for ${names[0]} does not match known_hosts (line ${plain.map((e) => e.line).join(', ')})`,
    };
  }
}

/** Parses known_hosts text; a malformed line is an error naming its line number. */
export function parseKnownHosts(text: string): KnownHosts {
  const entries: KnownHostEntry[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.trim();
    if (raw === '' || raw.startsWith('#')) continue;
    const fields = raw.split(/\s+/);
    let marker: KnownHostEntry['marker'];
    if (fields[0]?.startsWith('@')) {
      const m = fields.shift()!;
      if (m === '@revoked') marker = 'revoked';
      else if (m === '@cert-authority') marker = 'cert-authority';
      else throw new SshError('SSHMaterialInvalid', `known_hosts line ${i + 1}: unknown marker ${m}`);
    }
    const [hosts, keyType, b64] = fields;
    if (!hosts || !keyType || !b64) {
      throw new SshError('SSHMaterialInvalid', `known_hosts line ${i + 1}: expected "hosts keytype key"`);
    }
    const key = Buffer.from(b64, 'base64');
    if (key.length < 4 || key.toString('base64').replace(/=+$/, '') !== b64.replace(/=+$/, '')) {
      throw new SshError('SSHMaterialInvalid', `known_hosts line ${i + 1}: key is not valid base64`);
    }
    // The blob starts with its own type name; a mismatch means a corrupt or hand-edited line.
    const typeLen = key.readUInt32BE(0);
    if (key.subarray(4, 4 + typeLen).toString('latin1') !== keyType) {
      throw new SshError(
        'SSHMaterialInvalid',
        `known_hosts line ${i + 1}: key blob is not of type ${keyType}`,
      );
    }
    entries.push({ marker, patterns: hosts.split(','), keyType, key, line: i + 1 });
  }
  return new KnownHosts(entries);
}

export async function loadKnownHosts(path: string): Promise<KnownHosts> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new SshError(
      'SSHMaterialUnavailable',
      `cannot read known_hosts ${path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  try {
    return parseKnownHosts(text);
  } catch (err) {
    if (err instanceof SshError) {
      throw new SshError(err.reason, `${path}: ${err.message}`, { cause: err });
    }
    throw err;
  }
}

/** OpenSSH's HashKnownHosts form of a name: |1|base64(salt)|base64(HMAC-SHA1(salt, name)). */
export function hashKnownHostName(name: string, salt: Buffer): string {
  const mac = createHmac('sha1', salt).update(name).digest('base64');
  return `|1|${salt.toString('base64')}|${mac}`;
}

function hostMatches(patterns: string[], name: string): boolean {
  let matched = false;
  for (const p of patterns) {
    if (p.startsWith('|1|')) {
      const [, , salt, mac] = p.split('|');
      if (!salt || !mac) continue;
      if (hashKnownHostName(name, Buffer.from(salt, 'base64')) === p) matched = true;
      continue;
    }
    const negated = p.startsWith('!');
    const pat = negated ? p.slice(1) : p;
    if (globMatch(pat.toLowerCase(), name.toLowerCase())) {
      if (negated) return false; // a matching negation wins over everything
      matched = true;
    }
  }
  return matched;
}

function globMatch(pattern: string, s: string): boolean {
  const re = new RegExp(
    `^${pattern
      .replace(/[.+^${}()|[\]\\]/g, '\\$&')
      .replace(/\*/g, '.*')
      .replace(/\?/g, '.')}$`,
  );
  return re.test(s);
}

// --- connecting ---

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

/** Connects and authenticates; rejects with an SshError naming the failed step. */
export function connectSsh(opts: SshConnectOptions): Promise<SshSession> {
  const log = (opts.logger ?? silentLogger()).child({ component: 'kvm-ssh', host: opts.host });
  const port = opts.port ?? 22;
  const timeoutMs = opts.timeoutMs ?? 15_000;
  return new Promise<SshSession>((resolve, reject) => {
    const client = new ssh2.Client();
    let hostKeyProblem: string | undefined;
    let settled = false;
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
    const onAbort = () =>
      finish(
        new SshError('Timeout', `SSH connection to ${opts.host}:${port} aborted`, {
          cause: opts.signal?.reason,
        }),
      );
    const timer = setTimeout(
      () =>
        finish(
          new SshError('Timeout', `SSH connection to ${opts.host}:${port} took longer than ${timeoutMs} ms`),
        ),
      timeoutMs,
    );
    if (opts.signal?.aborted) return onAbort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    client.on('ready', () => {
      log.debug('ssh ready');
      finish(undefined);
    });
    client.on('error', (err: Error & { level?: string; code?: string }) => {
      if (settled) return;
      if (hostKeyProblem) {
        finish(
          new SshError(
            'SSHHandshakeFailed',
            `SSH host key of ${opts.host}:${port} rejected: ${hostKeyProblem}`,
          ),
        );
      } else if (
        err.level === 'client-socket' ||
        err.code === 'ECONNREFUSED' ||
        err.code === 'EHOSTUNREACH'
      ) {
        finish(
          new SshError('Unreachable', `cannot reach ${opts.host}:${port}: ${err.message}`, { cause: err }),
        );
      } else if (err.level === 'client-timeout') {
        finish(new SshError('Timeout', `SSH handshake with ${opts.host}:${port} timed out`, { cause: err }));
      } else if (err.level === 'client-authentication') {
        finish(
          new SshError(
            'SSHHandshakeFailed',
            `SSH authentication as ${opts.username}@${opts.host}:${port} failed`,
            {
              cause: err,
            },
          ),
        );
      } else {
        finish(
          new SshError(
            'SSHHandshakeFailed',
            `SSH handshake with ${opts.host}:${port} failed: ${err.message}`,
            { cause: err },
          ),
        );
      }
    });
    client.on('close', () =>
      finish(new SshError('Unreachable', `SSH connection to ${opts.host}:${port} closed during handshake`)),
    );

    const hostKeys = opts.hostKeys;
    const serverHostKey =
      hostKeys === 'insecure-ignore' ? undefined : hostKeys.hostKeyAlgorithms(opts.host, port);
    try {
      client.connect({
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
          hostKeyProblem = verdict.detail;
          return false;
        },
      });
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
    if (opts.signal?.aborted) {
      throw new SshError('Timeout', `libvirt handshake with ${opts.host} aborted`, { cause: err });
    }
    throw new SshError(
      'LibvirtConnectFailed',
      `libvirt handshake with ${opts.host} failed: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
}
