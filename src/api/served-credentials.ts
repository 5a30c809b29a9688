/**
 * api/served-credentials — the credentials each instance of a Proxy actually serves, one
 * immutable Secret per generation, `<proxy>-served-credentials-<generation>` (see
 * docs/health.md, "Replacements"). The credentials Secret holds what the NEXT instance will
 * serve; an instance keeps serving what it was created with until it is gone, so a rotation
 * must not change what the old instance is probed and leased with. The reconciler creates a
 * generation's Secret before any status field names it; the health engine and the lease feed
 * read it. Never log what it holds.
 */
import { LABEL_CREDENTIALS_FOR } from './constants.ts';
import { credentialsFromSecret } from './credentials.ts';
import type { ObjectKey, Secret } from './meta.ts';
import type { ProxyObject } from './proxy.ts';

/** Never ends in `-auth`, so it cannot be another Proxy's generated credentials Secret. */
export const SERVED_CREDENTIALS_INFIX = '-served-credentials-';

export interface GenerationCredentials {
  username: string;
  password: string;
}

export function servedCredentialsKey(p: ProxyObject, generation: number): ObjectKey {
  return {
    namespace: p.metadata.namespace,
    name: `${p.metadata.name}${SERVED_CREDENTIALS_INFIX}${generation}`,
  };
}

/** The Proxy a served-credentials Secret belongs to (its label names it), or undefined. */
export function proxyOfServedSecret(s: Secret): ObjectKey | undefined {
  const owner = s.metadata.labels?.[LABEL_CREDENTIALS_FOR];
  if (!owner) return undefined;
  const m = /^(.*)-served-credentials-[1-9][0-9]*$/.exec(s.metadata.name);
  if (!m || m[1] !== owner) return undefined;
  return { namespace: s.metadata.namespace, name: owner };
}

/** Generations a Proxy's status still refers to: the serving, pending and draining instances. */
export function generationsInUse(p: ProxyObject): Set<number> {
  const s = p.status;
  const out = new Set<number>();
  if (s?.credentialsGeneration) out.add(s.credentialsGeneration);
  if (s?.pending?.credentialsGeneration) out.add(s.pending.credentialsGeneration);
  for (const d of s?.draining ?? []) if (d.credentialsGeneration) out.add(d.credentialsGeneration);
  return out;
}

/** Whether `s` is this Proxy's (not left by an earlier Proxy of the same name). */
export function ownsServedSecret(p: ProxyObject, s: Secret): boolean {
  return s.metadata.ownerReferences?.some((o) => o.uid === p.metadata.uid) === true;
}

/**
 * The credentials generation `g` of `p` serves, from the cache (the Secret carries our
 * credentials label, so every backend caches it); undefined when unknown — the caller then
 * falls back to the credentials Secret, which is right for instances from before generations.
 */
export function servedCredentials(
  secrets: { get(key: ObjectKey): Secret | undefined },
  p: ProxyObject,
  g: number | undefined,
): GenerationCredentials | undefined {
  if (!g) return undefined;
  const s = secrets.get(servedCredentialsKey(p, g));
  if (!s || !ownsServedSecret(p, s)) return undefined;
  return credentialsFromSecret(s);
}
