/**
 * controller/credentials — where a Proxy's Basic-auth credentials live (SPEC §2.3): the
 * Secret named by spec.credentialsSecretRef, else the generated `<proxy>-auth` Secret.
 * Shared by the reconciler (which generates them), the health engine (which probes with
 * them) and the lease feed (which hands them out inside grants). Never log the result.
 */
import {
  CREDENTIALS_PASSWORD_KEY,
  CREDENTIALS_SECRET_SUFFIX,
  CREDENTIALS_USERNAME_KEY,
} from '../api/constants.ts';
import type { ObjectKey, Secret } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { Credentials } from '../provider/contract.ts';
import { isNotFound, type SecretClient } from '../runtime/store.ts';

export function credentialsSecretKey(proxy: ProxyObject): ObjectKey {
  const name = proxy.spec.credentialsSecretRef?.name ?? `${proxy.metadata.name}${CREDENTIALS_SECRET_SUFFIX}`;
  return { namespace: proxy.metadata.namespace, name };
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

/**
 * The credentials a Proxy is served with, or undefined when there are none (an External
 * proxy without credentialsSecretRef, or a Secret not created yet / lacking the keys).
 */
export async function readProxyCredentials(
  secrets: SecretClient,
  proxy: ProxyObject,
  signal?: AbortSignal,
): Promise<Credentials | undefined> {
  if ((proxy.spec.type ?? 'Managed') === 'External' && !proxy.spec.credentialsSecretRef) return undefined;
  const key = credentialsSecretKey(proxy);
  const cached = secrets.get(key);
  if (cached) return credentialsFromSecret(cached);
  try {
    return credentialsFromSecret(await secrets.read(key, { signal }));
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** `http://host:port` without credentials, as published in status.url. */
export function proxyUrl(host: string, port: number): string {
  const h = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `http://${h}:${port}`;
}

/** `http://user:pass@host:port`, only ever returned inside a lease grant. */
export function proxyUrlWithCredentials(host: string, port: number, creds: Credentials | undefined): string {
  if (!creds) return proxyUrl(host, port);
  const h = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `http://${encodeURIComponent(creds.username)}:${encodeURIComponent(creds.password)}@${h}:${port}`;
}
