/**
 * api/credentials — where a Proxy's Basic-auth credentials live and who reads which Secret:
 * the Secret named by spec.credentialsSecretRef, else the generated `<proxy>-auth` Secret (see
 * docs/architecture.md, "Decisions"). One resolver serves the reconciler (which generates the
 * Secret), the lease feed (which hands credentials out inside grants) and the health engine
 * (which probes with them). Never log what it returns.
 */

import type { Credentials } from '../provider/contract.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { isNotFound, type ObjectStore, type SecretClient, type Unsubscribe } from '../runtime/store.ts';
import {
  CREDENTIALS_PASSWORD_KEY,
  CREDENTIALS_SECRET_SUFFIX,
  CREDENTIALS_USERNAME_KEY,
} from './constants.ts';
import { keyOf, type ObjectKey, type Secret } from './meta.ts';
import { type ProxyObject, proxyType } from './proxy.ts';

export function credentialsSecretKey(proxy: ProxyObject): ObjectKey {
  const name = proxy.spec.credentialsSecretRef?.name ?? `${proxy.metadata.name}${CREDENTIALS_SECRET_SUFFIX}`;
  return { namespace: proxy.metadata.namespace, name };
}

/** Whether a Proxy is served with credentials at all: Managed ones always, External ones by reference. */
export function hasCredentials(proxy: ProxyObject): boolean {
  return proxyType(proxy.spec) === 'Managed' || proxy.spec.credentialsSecretRef !== undefined;
}

export function credentialsFromSecret(secret: Secret): Credentials | undefined {
  const user = secret.data?.[CREDENTIALS_USERNAME_KEY];
  const pass = secret.data?.[CREDENTIALS_PASSWORD_KEY];
  if (user === undefined || pass === undefined) return undefined;
  const username = Buffer.from(user, 'base64').toString('utf8');
  const password = Buffer.from(pass, 'base64').toString('utf8');
  if (!username || !password) return undefined;
  return { username, password };
}

/** Secrets a Proxy depends on (cloud-init and credentials), as `namespace/name` keys. */
export function secretRefsOf(p: ProxyObject): string[] {
  const refs: string[] = [];
  const ci = p.spec.cloudInit?.secretRef?.name;
  if (ci) refs.push(keyOf({ metadata: { namespace: p.metadata.namespace, name: ci } }));
  if (hasCredentials(p)) refs.push(keyOf({ metadata: credentialsSecretKey(p) }));
  return refs;
}

/** The Proxy cache index of `secretRefsOf`: which Proxies read a Secret. */
export const SECRET_REFS_INDEX = 'secret-refs';

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

/**
 * The credentials a Proxy is served with, or undefined when there are none (an External
 * proxy without credentialsSecretRef, or a Secret not created yet / lacking the keys).
 */
export async function readProxyCredentials(
  secrets: SecretClient,
  proxy: ProxyObject,
  signal?: AbortSignal,
): Promise<Credentials | undefined> {
  if (!hasCredentials(proxy)) return undefined;
  const secret = await findSecret(secrets, credentialsSecretKey(proxy), signal);
  return secret && credentialsFromSecret(secret);
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
  /** See `readProxyCredentials`; a read failure other than NotFound throws. */
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
