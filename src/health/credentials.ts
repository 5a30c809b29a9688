/**
 * health/credentials — the credentials each probed proxy is probed with, from the process's
 * one credentials resolver (runtime/credentials). A read of a Secret outside the cache is reused
 * for at most a lifetime; the resolver forgets it when the Secret changes, and this module
 * makes it forget after a 407. An instance whose credentials generation is known is probed with
 * that generation's credentials (api/served-credentials), so a rotation in progress probes each
 * instance with what it really serves. Never log what it returns.
 */

import type { Credentials } from '../api/credentials.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { servedCredentials } from '../api/served-credentials.ts';
import type { Logger } from '../log/index.ts';
import type { Clock } from '../runtime/clock.ts';
import { type CredentialsResolver, createCredentialsResolver } from '../runtime/credentials.ts';
import type { ObjectStore } from '../runtime/store.ts';

/** Credentials are re-read at least this often (and at once after a 407). */
export const CREDENTIALS_TTL_MS = 5 * 60_000;

/** undefined: the proxy has none; null: reading them failed (skip this probe). */
export type ProbeCredentials = Credentials | undefined | null;

export interface ProbeCredentialsSourceOptions {
  store: ObjectStore;
  clock: Clock;
  log: Logger;
  /** The process's resolver; one of this source's own (closed by `close`) when omitted. */
  resolver?: CredentialsResolver;
  ttlMs?: number;
}

export class ProbeCredentialsSource {
  private readonly opts: ProbeCredentialsSourceOptions;
  private readonly ttlMs: number;
  /** The probed proxies as last seen by the engine, by target key. */
  private readonly proxies = new Map<string, ProxyObject>();
  /** The credentials generation each target's instance serves, when known. */
  private readonly generations = new Map<string, number>();
  private own: CredentialsResolver | undefined;

  constructor(opts: ProbeCredentialsSourceOptions) {
    this.opts = opts;
    this.ttlMs = opts.ttlMs ?? CREDENTIALS_TTL_MS;
  }

  private get resolver(): CredentialsResolver {
    if (this.opts.resolver) return this.opts.resolver;
    this.own ??= createCredentialsResolver(this.opts.store, { clock: this.opts.clock });
    return this.own;
  }

  /**
   * Follows `proxy` (by target `key`): probes use the credentials of `generation` — what the
   * probed instance was created with — else what its spec's Secret holds now.
   */
  track(key: string, proxy: ProxyObject, generation?: number): void {
    this.proxies.set(key, proxy);
    if (generation) this.generations.set(key, generation);
    else this.generations.delete(key);
  }

  forget(key: string): void {
    this.proxies.delete(key);
    this.generations.delete(key);
  }

  /** The proxy answered 407: read again before the next probe. */
  invalidate(key: string): void {
    const proxy = this.proxies.get(key);
    if (proxy) this.resolver.invalidate(proxy);
  }

  /** The credentials for proxy `key`; null when reading them failed (the probe is skipped). */
  async get(key: string, signal: AbortSignal): Promise<ProbeCredentials> {
    const proxy = this.proxies.get(key);
    if (!proxy) return null;
    const served = servedCredentials(this.opts.store.secrets, proxy, this.generations.get(key));
    if (served) return served;
    try {
      return await this.resolver.credentialsFor(proxy, { signal, maxAgeMs: this.ttlMs });
    } catch (err) {
      this.opts.log.warn({ proxy: key, err }, 'cannot read proxy credentials; probe skipped');
      return null;
    }
  }

  /** Closes a resolver of its own; a later `get` makes a new one. */
  close(): void {
    this.own?.close();
    this.own = undefined;
  }
}
