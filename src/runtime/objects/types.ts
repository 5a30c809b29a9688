/**
 * runtime/objects/types — what the object engine needs to know about a resource type (its REST
 * identity, scope, whether it has a status subresource and a generation) and the types the
 * operator and its test server use.
 */
import {
  GROUP,
  PROVIDER_HEALTH_KIND,
  PROVIDER_HEALTH_PLURAL,
  PROXY_KIND,
  PROXY_PLURAL,
  PROXY_POOL_KIND,
  PROXY_POOL_PLURAL,
  VERSION,
} from '../../api/constants.ts';
import type { KubeObject } from '../../api/meta.ts';
import { POOL_SCALE_PATHS } from '../../api/proxypool.ts';
import { StoreError } from '../store.ts';

/** A stored object: a KubeObject with any other top-level fields (spec, status, data, …). */
export type StoredObject = KubeObject & { [k: string]: unknown };

export interface ResourceType {
  /** '' for the core group. */
  group: string;
  version: string;
  kind: string;
  plural: string;
  namespaced: boolean;
  /** With a status subresource, main-resource writes ignore `.status` and create drops it. */
  statusSubresource: boolean;
  /** Whether metadata.generation is maintained (custom resources: yes; Secrets, Leases: no). */
  generation: boolean;
  shortNames?: string[];
  /** A scale subresource (`/scale`, autoscaling/v1 Scale): where replicas and the selector live. */
  scale?: { specReplicasPath: string; statusReplicasPath: string; labelSelectorPath: string };
  /** Server-side conversion before validation (e.g. Secret stringData → data). */
  normalize?: (obj: StoredObject) => void;
  /** Extra server-side validation run on every create/update; return an error to reject. */
  validate?: (obj: StoredObject) => StoreError | undefined;
}

export function apiVersionOf(t: ResourceType): string {
  return t.group ? `${t.group}/${t.version}` : t.version;
}

/** `proxies.crawl.example.com`, `secrets`: the name Kubernetes uses in messages. */
export function qualifiedName(t: ResourceType): string {
  return t.group ? `${t.plural}.${t.group}` : t.plural;
}

export const PROXY_RESOURCE: ResourceType = {
  group: GROUP,
  version: VERSION,
  kind: PROXY_KIND,
  plural: PROXY_PLURAL,
  namespaced: true,
  statusSubresource: true,
  generation: true,
  shortNames: ['px'],
};

export const PROXY_POOL_RESOURCE: ResourceType = {
  group: GROUP,
  version: VERSION,
  kind: PROXY_POOL_KIND,
  plural: PROXY_POOL_PLURAL,
  namespaced: true,
  statusSubresource: true,
  generation: true,
  shortNames: ['pxp'],
  scale: POOL_SCALE_PATHS,
};

export const PROVIDER_HEALTH_RESOURCE: ResourceType = {
  group: GROUP,
  version: VERSION,
  kind: PROVIDER_HEALTH_KIND,
  plural: PROVIDER_HEALTH_PLURAL,
  namespaced: false,
  statusSubresource: true,
  generation: true,
  shortNames: ['ph'],
};

export const SECRET_RESOURCE: ResourceType = {
  group: '',
  version: 'v1',
  kind: 'Secret',
  plural: 'secrets',
  namespaced: true,
  statusSubresource: false,
  generation: false,
  normalize: normalizeSecret,
  validate: validateSecret,
};

export const POD_RESOURCE: ResourceType = {
  group: '',
  version: 'v1',
  kind: 'Pod',
  plural: 'pods',
  namespaced: true,
  statusSubresource: true,
  generation: true,
};

const MICRO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$/;

export const LEASE_RESOURCE: ResourceType = {
  group: 'coordination.k8s.io',
  version: 'v1',
  kind: 'Lease',
  plural: 'leases',
  namespaced: true,
  statusSubresource: false,
  generation: false,
  validate: validateLease,
};

/** Like the apiserver: MicroTime fields must carry exactly six fractional digits (a Date gives three). */
function validateLease(obj: StoredObject): StoreError | undefined {
  const spec = obj.spec as Record<string, unknown> | undefined;
  if (!spec) return undefined;
  for (const f of ['acquireTime', 'renewTime']) {
    const v = spec[f];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'string' || !MICRO_TIME.test(v)) {
      return new StoreError(
        'BadRequest',
        400,
        `Lease in version "v1" cannot be handled as a Lease: spec.${f}: parsing time ${JSON.stringify(v)}: expected RFC3339 with microseconds (e.g. 2006-01-02T15:04:05.000000Z)`,
      );
    }
  }
  return undefined;
}

/** Secret data must be base64, like the apiserver decodes it. */
function validateSecret(obj: StoredObject): StoreError | undefined {
  const data = obj.data;
  if (data === undefined || data === null) return undefined;
  if (typeof data !== 'object' || Array.isArray(data)) {
    return new StoreError('BadRequest', 400, 'Secret.data must be an object of base64 strings');
  }
  for (const [k, v] of Object.entries(data)) {
    if (typeof v !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) {
      return new StoreError('BadRequest', 400, `Secret.data[${JSON.stringify(k)}]: illegal base64 data`);
    }
  }
  return undefined;
}

/** Like the apiserver: `stringData` is write-only and merged into `data` as base64. */
function normalizeSecret(obj: StoredObject): void {
  const sd = obj.stringData;
  if (sd === undefined) return;
  delete obj.stringData;
  if (typeof sd !== 'object' || sd === null) return;
  const data = { ...((obj.data as Record<string, string> | undefined) ?? {}) };
  for (const [k, v] of Object.entries(sd)) data[k] = Buffer.from(String(v), 'utf8').toString('base64');
  obj.data = data;
}
