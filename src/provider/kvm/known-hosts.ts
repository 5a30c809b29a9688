/**
 * provider/kvm/known-hosts — OpenSSH known_hosts: parses plain, hashed and [host]:port entries
 * and @revoked markers, picks the host key algorithms to offer, and decides whether a host key
 * is trusted. A malformed file is SSHMaterialInvalid, an unreadable one SSHMaterialUnavailable.
 */
import { createHmac } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { SshError } from './ssh-error.ts';

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
