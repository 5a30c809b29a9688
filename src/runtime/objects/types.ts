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
import { ObjectError } from './errors.ts';

/** A stored object: a KubeObject with any other top-level fields (spec, status, data, …). */
export type StoredObject = KubeObject & { [k: string]: unknown };

export type EngineEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface EngineEvent {
  type: EngineEventType;
  /** The object after the change (for DELETED: its last state, carrying the deletion's resourceVersion). */
  object: StoredObject;
  /** The object before the change (MODIFIED, DELETED). */
  old?: StoredObject;
  /** The resourceVersion this change was committed at. */
  rv: number;
  resource: ResourceType;
}

export interface ListQuery {
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
}

export interface WatchQuery extends ListQuery {
  /** Resume after this version; undefined, '' or '0' start with synthetic ADDED for current state. */
  resourceVersion?: string;
}

export interface EngineWatch {
  stop(): void;
}

/** What a collection needs of the engine it belongs to: versions, uids, time, and the commit feed. */
export interface CollectionHost {
  readonly historyLimit: number;
  readonly resourceVersion: number;
  newUid(): string;
  nextRv(): number;
  emit(ev: EngineEvent): void;
  /** RFC 3339 with second precision, like metav1.Time. */
  now(): string;
}

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
  /**
   * An update without a resourceVersion overwrites whatever is stored (Secrets, ConfigMaps,
   * Pods); else it is refused (custom resources, Leases).
   */
  unconditionalUpdate?: boolean;
  shortNames?: string[];
  /** A scale subresource (`/scale`, autoscaling/v1 Scale): where replicas and the selector live. */
  scale?: { specReplicasPath: string; statusReplicasPath: string; labelSelectorPath: string };
  /** Server-side conversion before validation (e.g. Secret stringData → data). */
  normalize?: (obj: StoredObject) => void;
  /**
   * Extra server-side checks run on every create/update; return an error to reject: a
   * BadRequest where the object would not decode into the type, an Invalid (ObjectError with
   * causes) where it decodes but breaks a rule.
   */
  validate?: (obj: StoredObject) => StoreError | undefined;
}

/**
 * Types compiled into the API server (core, `*.k8s.io`) rather than custom resources: they
 * accept strategic merge patches, and their list items carry no kind.
 */
export function isBuiltIn(t: ResourceType): boolean {
  return t.group === '' || t.group.endsWith('.k8s.io');
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
  unconditionalUpdate: true,
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
  unconditionalUpdate: true,
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
  normalize: normalizeLease,
  validate: validateLease,
};

const LEASE_TIMES = ['acquireTime', 'renewTime'] as const;

/** Like the apiserver, which stores a MicroTime in UTC: `…T03:04:05.000001+02:00` → `…T01:04:05.000001Z`. */
function normalizeLease(obj: StoredObject): void {
  const spec = obj.spec as Record<string, unknown> | undefined;
  for (const f of LEASE_TIMES) {
    const v = spec?.[f];
    if (typeof v !== 'string' || !MICRO_TIME.test(v) || v.endsWith('Z')) continue;
    const micros = v.slice(20, 26);
    const utc = new Date(`${v.slice(0, 19)}${v.slice(26)}`).toISOString().slice(0, 19);
    (spec as Record<string, unknown>)[f] = `${utc}.${micros}Z`;
  }
}

/**
 * Like the apiserver: MicroTime fields must carry exactly six fractional digits (a Date gives
 * three), or the Lease does not decode; a decoded Lease needs a positive duration and a
 * non-negative transition count.
 */
function validateLease(obj: StoredObject): StoreError | undefined {
  const spec = obj.spec as Record<string, unknown> | undefined;
  if (!spec) return undefined;
  for (const f of LEASE_TIMES) {
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
  const causes: { field: string; bound: string; value: unknown }[] = [];
  const d = spec.leaseDurationSeconds;
  if (typeof d === 'number' && d <= 0)
    causes.push({ field: 'leaseDurationSeconds', bound: 'greater than 0', value: d });
  const t = spec.leaseTransitions;
  if (typeof t === 'number' && t < 0)
    causes.push({ field: 'leaseTransitions', bound: 'greater than or equal to 0', value: t });
  if (causes.length === 0) return undefined;
  return invalidField(
    obj,
    'Lease.coordination.k8s.io',
    'Lease',
    'coordination.k8s.io',
    causes.map((c) => ({
      field: `spec.${c.field}`,
      message: `Invalid value: ${c.value}: must be ${c.bound}`,
    })),
  );
}

/** A 422 with causes, worded like the apiserver's validation errors. */
export function invalidField(
  obj: StoredObject,
  groupKind: string,
  kind: string,
  group: string,
  causes: { field: string; message: string }[],
): ObjectError {
  const name = obj.metadata?.name ?? '';
  const text = causes.map((c) => `${c.field}: ${c.message}`).join(', ');
  return new ObjectError(
    'Invalid',
    422,
    `${groupKind} "${name}" is invalid: ${causes.length > 1 ? `[${text}]` : text}`,
    {
      ...(name ? { name } : {}),
      ...(group ? { group } : {}),
      kind,
      causes: causes.map((c) => ({ reason: 'FieldValueInvalid', message: c.message, field: c.field })),
    },
  );
}

const DATA_KEY = /^[-._a-zA-Z0-9]+$/;

/** Keys of Secret and ConfigMap data: what a file name in a volume may be. */
export function dataKeyErrors(
  obj: StoredObject,
  fields: readonly string[],
): { field: string; message: string }[] {
  const out: { field: string; message: string }[] = [];
  for (const f of fields) {
    const m = obj[f];
    if (m === null || typeof m !== 'object') continue;
    for (const k of Object.keys(m)) {
      if (k.length > 253 || !DATA_KEY.test(k) || k === '.' || k === '..')
        out.push({
          field: `${f}[${k}]`,
          message: `Invalid value: ${JSON.stringify(k)}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'`,
        });
    }
  }
  return out;
}

/** Secret data must be base64, like the apiserver decodes it; keys must be valid file names. */
function validateSecret(obj: StoredObject): StoreError | undefined {
  const data = obj.data;
  if (data === undefined || data === null) return undefined;
  if (typeof data !== 'object' || Array.isArray(data)) {
    return new StoreError('BadRequest', 400, 'Secret.data must be an object of base64 strings');
  }
  for (const [k, v] of Object.entries(data)) {
    if (!isBase64(v)) {
      return new StoreError(
        'BadRequest',
        400,
        `Secret in version "v1" cannot be handled as a Secret: data[${JSON.stringify(k)}]: illegal base64 data`,
      );
    }
  }
  const causes = dataKeyErrors(obj, ['data']);
  return causes.length > 0 ? invalidField(obj, 'Secret', 'Secret', '', causes) : undefined;
}

export function isBase64(v: unknown): boolean {
  return typeof v === 'string' && /^[A-Za-z0-9+/]*={0,2}$/.test(v) && v.length % 4 === 0;
}

/**
 * Like the apiserver: `stringData` is write-only and merged into `data` as base64, `type`
 * defaults to Opaque, and an empty `data` is not stored.
 */
function normalizeSecret(obj: StoredObject): void {
  const sd = obj.stringData;
  delete obj.stringData;
  if (typeof sd === 'object' && sd !== null) {
    const data = { ...((obj.data as Record<string, string> | undefined) ?? {}) };
    for (const [k, v] of Object.entries(sd)) data[k] = Buffer.from(String(v), 'utf8').toString('base64');
    obj.data = data;
  }
  if (obj.type === undefined || obj.type === '') obj.type = 'Opaque';
  omitEmpty(obj, ['data']);
}

/** Drops the top-level maps the apiserver does not store when empty (`omitempty` fields). */
export function omitEmpty(obj: StoredObject, fields: readonly string[]): void {
  for (const f of fields) {
    const v = obj[f];
    if (v === null || (typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0))
      delete obj[f];
  }
}
