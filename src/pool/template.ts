/**
 * pool/template — what a pool's Proxy is made of (pure): the digest that tells current Proxies
 * from outdated ones, the `<pool>-<5 chars>` name, and the Proxy object itself with the pool
 * label, the template hash and a controlling ownerReference (deleting the pool deletes it).
 */
import { createHash } from 'node:crypto';
import {
  ANNOTATION_POOL_TEMPLATE_HASH,
  API_VERSION,
  LABEL_POOL,
  PROXY_KIND,
  PROXY_POOL_KIND,
} from '../api/constants.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { PoolTemplate, ProxyPool } from '../api/proxypool.ts';
import { defaultProxy } from '../api/validate.ts';

/** Kubernetes' generateName alphabet: no vowels (no words), no look-alikes (0/o, 1/l). */
const SUFFIX_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789';
export const SUFFIX_LENGTH = 5;

function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(value).sort()) out[k] = canonical((value as Record<string, unknown>)[k]);
    return out;
  }
  return value;
}

/** 10 hex of a digest of the defaulted template: equal templates, equal hashes, in any key order. */
export function templateHash(template: PoolTemplate): string {
  const spec = defaultProxy({
    apiVersion: API_VERSION,
    kind: PROXY_KIND,
    metadata: { name: 'x' },
    spec: template.spec,
  }).spec;
  const text = JSON.stringify(canonical({ metadata: template.metadata ?? {}, spec }));
  return createHash('sha256').update(text).digest('hex').slice(0, 10);
}

/** `<pool>-<5 chars>`, the chars drawn with `random` (a number in [0, 1)). */
export function memberName(poolName: string, random: () => number): string {
  let suffix = '';
  for (let i = 0; i < SUFFIX_LENGTH; i++) {
    suffix += SUFFIX_ALPHABET[Math.floor(random() * SUFFIX_ALPHABET.length) % SUFFIX_ALPHABET.length];
  }
  return `${poolName}-${suffix}`;
}

/** A new Proxy of `pool` under `name`, from the template whose hash is `hash`. */
export function memberProxy(pool: ProxyPool, name: string, hash: string): ProxyObject {
  const tmpl = pool.spec.template;
  return defaultProxy({
    apiVersion: API_VERSION,
    kind: PROXY_KIND,
    metadata: {
      name,
      namespace: pool.metadata.namespace,
      labels: { ...(tmpl.metadata?.labels ?? {}), [LABEL_POOL]: pool.metadata.name },
      annotations: { ...(tmpl.metadata?.annotations ?? {}), [ANNOTATION_POOL_TEMPLATE_HASH]: hash },
      ownerReferences: [
        {
          apiVersion: API_VERSION,
          kind: PROXY_POOL_KIND,
          name: pool.metadata.name,
          uid: pool.metadata.uid ?? '',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
    },
    spec: structuredClone(tmpl.spec),
  });
}

/** Whether `p` is one of `pool`'s Proxies: its label and a controlling reference to this very pool. */
export function ownedBy(p: ProxyObject, pool: ProxyPool): boolean {
  return (
    p.metadata.labels?.[LABEL_POOL] === pool.metadata.name &&
    p.metadata.ownerReferences?.some((o) => o.controller === true && o.uid === pool.metadata.uid) === true
  );
}
