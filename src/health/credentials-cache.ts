/**
 * health/credentials-cache — the credentials each probed proxy is probed with, cached per
 * proxy so a probe starts in the same turn as its slot. An entry lives at most a TTL, and is
 * dropped at once when its Secret changes or a probe got a 407. Never log what it holds.
 */

import { credentialsSecretKey, readProxyCredentials } from '../api/credentials.ts';
import { parseKey } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import type { Logger } from '../log/index.ts';
import type { Credentials } from '../provider/contract.ts';
import type { Clock } from '../runtime/clock.ts';
import type { ObjectStore } from '../runtime/store.ts';

/** Credentials are re-read at least this often (and at once after a 407). */
export const CREDENTIALS_TTL_MS = 5 * 60_000;

/** undefined: the proxy has none; null: reading them failed (skip this probe). */
export type ProbeCredentials = Credentials | undefined | null;

interface Entry {
  namespace: string;
  /** Name of the credentials Secret; a change drops what was read. */
  secretName: string;
  /** What was read, and when; absent until read and after an invalidation. */
  read?: { creds: Credentials | undefined; at: number };
}

export interface CredentialsCacheOptions {
  store: ObjectStore;
  clock: Clock;
  log: Logger;
  ttlMs?: number;
}

export class CredentialsCache {
  private readonly store: ObjectStore;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly ttlMs: number;
  private readonly entries = new Map<string, Entry>();

  constructor(opts: CredentialsCacheOptions) {
    this.store = opts.store;
    this.clock = opts.clock;
    this.log = opts.log;
    this.ttlMs = opts.ttlMs ?? CREDENTIALS_TTL_MS;
  }

  /** Follows `proxy` (by `key`): a new credentials Secret name drops what was read. */
  track(key: string, proxy: ProxyObject): void {
    const secretName = credentialsSecretKey(proxy).name;
    const e = this.entries.get(key);
    if (e && e.secretName === secretName) return;
    this.entries.set(key, { namespace: proxy.metadata.namespace ?? '', secretName });
  }

  forget(key: string): void {
    this.entries.delete(key);
  }

  /** The proxy answered 407: read again before the next probe. */
  invalidate(key: string): void {
    const e = this.entries.get(key);
    if (e) e.read = undefined;
  }

  /** A Secret changed: every proxy whose credentials live there reads them again. */
  secretChanged(namespace: string, name: string): void {
    for (const e of this.entries.values()) {
      if (e.namespace === namespace && e.secretName === name) e.read = undefined;
    }
  }

  /**
   * The credentials for proxy `key` (object `uid`): synchronously while the cached ones are
   * fresh, else read from the store. While the cache holds no object with that uid (deleted,
   * or recreated and not yet seen), what was last read: that probe's result is dropped anyway.
   */
  get(key: string, uid: string, signal: AbortSignal): ProbeCredentials | Promise<ProbeCredentials> {
    const e = this.entries.get(key);
    if (e?.read && this.clock.now() - e.read.at < this.ttlMs) return e.read.creds;
    return this.load(key, uid, signal);
  }

  private async load(key: string, uid: string, signal: AbortSignal): Promise<ProbeCredentials> {
    const now = this.clock.now();
    const proxy = this.store.proxies.get(parseKey(key));
    if (!proxy || proxy.metadata.uid !== uid) return this.entries.get(key)?.read?.creds;
    try {
      const creds = await readProxyCredentials(this.store.secrets, proxy, signal);
      const e = this.entries.get(key);
      if (e) e.read = { creds, at: now };
      return creds;
    } catch (err) {
      this.log.warn({ proxy: key, err: errorMessage(err) }, 'cannot read proxy credentials; probe skipped');
      return null;
    }
  }
}
