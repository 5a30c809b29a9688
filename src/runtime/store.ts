/**
 * runtime/store — the seam between the control loops and where objects live. The reconciler,
 * health engine, orphan sweep and monitors talk only to these interfaces; the Kubernetes backend
 * (runtime/kube) and the embedded standalone backend (runtime/embedded) implement them with
 * the same semantics: resourceVersion preconditions (409 Conflict), generation bumps on spec
 * changes only, deletionTimestamp + finalizers, NotFound.
 */
import type { KubeObject, ObjectKey, Secret } from '../api/meta.ts';
import type { ProviderHealth } from '../api/providerhealth.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { ProxyPool } from '../api/proxypool.ts';

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface WatchEvent<T> {
  type: WatchEventType;
  object: T;
  /** The previously cached version, for MODIFIED and DELETED. */
  old?: T;
}

export type Unsubscribe = () => void;

export interface ListOptions {
  namespace?: string;
  /** Kubernetes label selector syntax (`a=b,c!=d,e in (x,y),!f`). */
  labelSelector?: string;
}

export interface WriteOptions {
  signal?: AbortSignal;
}

/** The values one cached object is found under in an index (e.g. the Secrets a Proxy reads). */
export type IndexFunc<T> = (obj: T) => string[];

/**
 * Secondary indexes over a cache, kept in step with it like client-go's indexers: a question
 * such as "which Proxies read this Secret" is answered from the cache instead of a map each
 * consumer keeps by hand from watch events.
 */
export interface CacheIndexer<T> {
  /**
   * Maintains index `name` from now on, existing objects included. Registering a name again
   * with the same function is a no-op, so several consumers may ask for one shared index; a
   * different function under a taken name throws.
   */
  addIndex(name: string, fn: IndexFunc<T>): void;
  /** Cached objects whose index `name` holds `value`, sorted by key; throws for an unknown index. */
  byIndex(name: string, value: string): T[];
}

/**
 * One resource type. `get`/`list` read the informer cache (synchronous, may lag writes);
 * `read` goes to the source of truth. Writes return the stored object.
 */
export interface ResourceClient<T extends KubeObject> extends CacheIndexer<T> {
  get(key: ObjectKey): T | undefined;
  list(opts?: ListOptions): T[];
  /** Uncached read; throws a NotFound StoreError. */
  read(key: ObjectKey, opts?: WriteOptions): Promise<T>;
  /** Uncached list (every page): for a resource read too rarely to keep a cache of. */
  readList(opts?: ListOptions & WriteOptions): Promise<T[]>;
  create(obj: T, opts?: WriteOptions): Promise<T>;
  /** Replace metadata+spec; `metadata.resourceVersion` is a precondition (Conflict on mismatch). */
  update(obj: T, opts?: WriteOptions): Promise<T>;
  /**
   * Merge-patch the status subresource. With `resourceVersion`, the write only applies to that
   * version (Conflict otherwise) — how two status writers avoid clobbering each other.
   */
  patchStatus(
    key: ObjectKey,
    status: Record<string, unknown>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<T>;
  /** Sets deletionTimestamp when finalizers remain; removes otherwise. NotFound if absent. */
  delete(key: ObjectKey, opts?: WriteOptions & { uid?: string }): Promise<void>;
  /** Adds a finalizer guarded by the resourceVersion (Conflict if the object moved). */
  addFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T>;
  /** Removes a finalizer guarded by the resourceVersion; may delete the object. */
  removeFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T | undefined>;
  /** Informer events; handlers must not throw (errors are logged and dropped). */
  watch(handler: (event: WatchEvent<T>) => void): Unsubscribe;
  /** Resolves when the cache holds a complete initial list. */
  synced(signal?: AbortSignal): Promise<void>;
}

/** Secrets: cached only when they carry a selected label (cloud-init, our credentials). */
export interface SecretClient {
  /** Cached; only labelled Secrets are visible (an unlabelled one reads as missing). */
  get(key: ObjectKey): Secret | undefined;
  /** Uncached read of any Secret (credentialsSecretRef need not be labelled). */
  read(key: ObjectKey, opts?: WriteOptions): Promise<Secret>;
  create(secret: Secret, opts?: WriteOptions): Promise<Secret>;
  /**
   * Adds (or overwrites) these labels with a merge patch, guarded by `resourceVersion` when
   * given. A Secret that gains a selected label enters the cache and its events follow.
   */
  addLabels(
    key: ObjectKey,
    labels: Record<string, string>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<Secret>;
  delete(key: ObjectKey, opts?: WriteOptions): Promise<void>;
  watch(handler: (event: WatchEvent<Secret>) => void): Unsubscribe;
  synced(signal?: AbortSignal): Promise<void>;
}

export interface ObjectStore {
  readonly proxies: ResourceClient<ProxyObject>;
  readonly proxyPools: ResourceClient<ProxyPool>;
  readonly providerHealths: ResourceClient<ProviderHealth>;
  readonly secrets: SecretClient;
  /** Start informers/watches (idempotent). */
  start(signal: AbortSignal): Promise<void>;
  stop(): Promise<void>;
}

export type StoreErrorReason =
  | 'NotFound'
  | 'Conflict'
  | 'AlreadyExists'
  | 'Invalid'
  | 'Gone'
  | 'Forbidden'
  | 'Unavailable'
  | 'BadRequest';

/** A store error with the Kubernetes reason and HTTP code; other errors are transport errors. */
export class StoreError extends Error {
  readonly reason: StoreErrorReason;
  readonly code: number;
  constructor(reason: StoreErrorReason, code: number, message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'StoreError';
    this.reason = reason;
    this.code = code;
  }
}

export const isNotFound = (e: unknown): boolean => e instanceof StoreError && e.reason === 'NotFound';
export const isConflict = (e: unknown): boolean => e instanceof StoreError && e.reason === 'Conflict';
export const isAlreadyExists = (e: unknown): boolean =>
  e instanceof StoreError && e.reason === 'AlreadyExists';
