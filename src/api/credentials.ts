/**
 * api/credentials — where a Proxy's Basic-auth credentials live and who reads which Secret:
 * the Secret named by spec.credentialsSecretRef, else the generated `<proxy>-auth` Secret (see
 * docs/architecture.md, "Decisions"). One resolver serves the reconciler (which generates the
 * Secret), the lease feed (which hands credentials out inside grants) and the health engine
 * (which probes with them); the resolver that reads them is runtime/credentials. Never log them.
 */

import {
  CREDENTIALS_PASSWORD_KEY,
  CREDENTIALS_SECRET_SUFFIX,
  CREDENTIALS_USERNAME_KEY,
} from './constants.ts';
import { keyOf, type ObjectKey, type Secret } from './meta.ts';
import { type ProxyObject, proxyType } from './proxy.ts';

/** A proxy's Basic-auth user and password. Never log them. */
export interface Credentials {
  username: string;
  password: string;
}

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
