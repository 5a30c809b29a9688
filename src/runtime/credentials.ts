/**
 * runtime/credentials — the one resolver of proxies' Basic-auth credentials over an object store
 * (which Secret holds them is api/credentials): the cache first, then a read of the source of
 * truth, with a remembered read for callers that accept an age. Never log what it returns.
 */
import {
  type Credentials,
  credentialsFromSecret,
  credentialsSecretKey,
  hasCredentials,
  SECRET_REFS_INDEX,
  secretRefsOf,
} from '../api/credentials.ts';
import { keyOf, type ObjectKey, type Secret } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { type Clock, systemClock } from './clock.ts';
import { isNotFound, type ObjectStore, type SecretClient, type Unsubscribe } from './store.ts';

/** A Secret from the cache, else read from the source of truth; undefined when it does not exist. */
async function findSecret(
  secrets: SecretClient,
  key: ObjectKey,
  signal?: AbortSignal,
): Promise<Secret | undefined> {
  const cached = secrets.get(key);
  if (cached) return cached;
  try {
    return await secrets.read(key, { signal });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

export interface CredentialsOptions {
  signal?: AbortSignal;
  /**
   * How old a remembered read of a Secret outside the cache may be (default 0: read again).
   * Cached Secrets are always current; the watch keeps them so.
   */
  maxAgeMs?: number;
}

export interface CredentialsResolver {
  /** The credentials Secret of `proxy` (cache first, then a read); undefined when it does not exist. */
  secretFor(proxy: ProxyObject, signal?: AbortSignal): Promise<Secret | undefined>;
  /**
   * The credentials a Proxy is served with, or undefined when there are none (an External proxy
   * without credentialsSecretRef, or a Secret not created yet / lacking the keys); a read failure
   * other than NotFound throws.
   */
  credentialsFor(proxy: ProxyObject, opts?: CredentialsOptions): Promise<Credentials | undefined>;
  /** Forgets a remembered read for `proxy` (e.g. after the proxy answered 407). */
  invalidate(proxy: ProxyObject): void;
  /** Cached Proxies that read Secret `key` (cloud-init or credentials). */
  proxiesUsingSecret(key: ObjectKey | string): ProxyObject[];
  /** Stops following Secret events. */
  close(): void;
}

export interface CredentialsResolverOptions {
  clock?: Clock;
}

/**
 * The one credentials resolver over `store`. It registers `SECRET_REFS_INDEX` on the Proxy
 * cache (shared by every resolver on the same store) and remembers reads of uncached Secrets
 * only for callers that accept an age; a Secret event for one forgets it.
 */
export function createCredentialsResolver(
  store: ObjectStore,
  opts: CredentialsResolverOptions = {},
): CredentialsResolver {
  const clock = opts.clock ?? systemClock;
  store.proxies.addIndex(SECRET_REFS_INDEX, secretRefsOf);
  const remembered = new Map<string, { creds: Credentials | undefined; at: number }>();
  let unsubscribe: Unsubscribe | undefined;
  let closed = false;
  const follow = () => {
    if (unsubscribe || closed) return;
    unsubscribe = store.secrets.watch((ev) => remembered.delete(keyOf(ev.object)));
  };

  return {
    secretFor: (proxy, signal) => findSecret(store.secrets, credentialsSecretKey(proxy), signal),

    async credentialsFor(proxy, o = {}) {
      if (!hasCredentials(proxy)) return undefined;
      const key = credentialsSecretKey(proxy);
      const cached = store.secrets.get(key);
      if (cached) return credentialsFromSecret(cached);
      const maxAge = o.maxAgeMs ?? 0;
      const k = keyOf({ metadata: key });
      const hit = remembered.get(k);
      if (hit && maxAge > 0 && clock.now() - hit.at < maxAge) return hit.creds;
      const secret = await findSecret(store.secrets, key, o.signal);
      const creds = secret && credentialsFromSecret(secret);
      if (maxAge > 0 && !closed) {
        remembered.set(k, { creds, at: clock.now() });
        follow();
      }
      return creds;
    },

    invalidate(proxy) {
      remembered.delete(keyOf({ metadata: credentialsSecretKey(proxy) }));
    },

    proxiesUsingSecret(key) {
      const k = typeof key === 'string' ? key : keyOf({ metadata: key });
      return store.proxies.byIndex(SECRET_REFS_INDEX, k);
    },

    close() {
      closed = true;
      unsubscribe?.();
      unsubscribe = undefined;
      remembered.clear();
    },
  };
}
