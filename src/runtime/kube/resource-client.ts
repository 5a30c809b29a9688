/**
 * runtime/kube/resource-client — the store's per-resource clients: reads from the informer's
 * cache, writes through the API, and every successful write applied to the cache at once so a
 * caller reads its own writes before the watch event arrives. Secrets are cached only under
 * the label selectors of SECRET_SOURCES.
 */
import { LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../api/constants.ts';
import { type KubeObject, keyOf, type ObjectKey, type Secret } from '../../api/meta.ts';
import {
  type IndexFunc,
  type ListOptions,
  type ResourceClient,
  type SecretClient,
  StoreError,
  type Unsubscribe,
  type WatchEvent,
  type WriteOptions,
} from '../store.ts';
import { type Informer, MultiSourceSink } from './informer.ts';
import type { RawApi } from './rest.ts';

/** Whether an API response body is a (possibly deleting) object rather than a Status. */
function isObject<T extends KubeObject>(v: unknown): v is T {
  return typeof v === 'object' && v !== null && 'metadata' in v && (v as { kind?: string }).kind !== 'Status';
}

/** A removed-finalizer response for an object the server then deleted. */
function isGone(obj: KubeObject): boolean {
  return Boolean(obj.metadata.deletionTimestamp) && (obj.metadata.finalizers?.length ?? 0) === 0;
}

export class KubeResourceClient<T extends KubeObject> implements ResourceClient<T> {
  readonly informer: Informer<T>;
  private readonly api: RawApi<T>;
  private readonly inScope: (obj: KubeObject) => boolean;

  /**
   * true: no reflector feeds this cache, so it holds what this process read and wrote (a
   * resource kept without list/watch rights, the ProviderHealths).
   */
  private readonly unwatched: boolean;

  constructor(
    api: RawApi<T>,
    informer: Informer<T>,
    inScope: (obj: KubeObject) => boolean,
    opts: { unwatched?: boolean } = {},
  ) {
    this.api = api;
    this.informer = informer;
    this.inScope = inScope;
    this.unwatched = opts.unwatched ?? false;
  }

  private cache(obj: T): T {
    if (!this.inScope(obj)) return obj;
    if (isGone(obj)) this.informer.deleted(obj.metadata, obj.metadata.uid);
    else this.informer.upsert(obj);
    return obj;
  }

  get(key: ObjectKey): T | undefined {
    return this.informer.get(keyOf({ metadata: key }));
  }

  list(opts?: ListOptions): T[] {
    return this.informer.list(opts);
  }

  addIndex(name: string, fn: IndexFunc<T>): void {
    this.informer.addIndex(name, fn);
  }

  byIndex(name: string, value: string): T[] {
    return this.informer.byIndex(name, value);
  }

  async read(key: ObjectKey, opts?: WriteOptions): Promise<T> {
    const obj = await this.api.read(key, opts?.signal);
    return this.unwatched ? this.cache(obj) : obj;
  }

  async readList(opts: ListOptions & WriteOptions = {}): Promise<T[]> {
    const out: T[] = [];
    const signal = opts.signal ?? new AbortController().signal;
    let next: string | undefined;
    do {
      const page = await this.api.list(
        opts.namespace,
        {
          ...(opts.labelSelector ? { labelSelector: opts.labelSelector } : {}),
          limit: 500,
          ...(next ? { continue: next } : {}),
        },
        signal,
      );
      out.push(...page.items.filter((o) => this.inScope(o)));
      next = page.metadata?.continue || undefined;
    } while (next);
    return out;
  }

  async create(obj: T, opts?: WriteOptions): Promise<T> {
    return this.cache(await this.api.create(obj, opts?.signal));
  }

  async update(obj: T, opts?: WriteOptions): Promise<T> {
    return this.cache(await this.api.replace(obj, opts?.signal));
  }

  async patchStatus(
    key: ObjectKey,
    status: Record<string, unknown>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<T> {
    // metadata.resourceVersion in a merge patch is a precondition: 409 if the object moved.
    const body: Record<string, unknown> = { status };
    if (opts?.resourceVersion !== undefined) body.metadata = { resourceVersion: opts.resourceVersion };
    return this.cache(await this.api.patch(key, body, 'merge', true, opts?.signal));
  }

  async delete(key: ObjectKey, opts?: WriteOptions & { uid?: string }): Promise<void> {
    const out = await this.api.delete(key, opts?.uid, opts?.signal);
    if (isObject<T>(out) && out.metadata.deletionTimestamp && (out.metadata.finalizers?.length ?? 0) > 0) {
      this.cache(out);
    } else {
      // Deleted: the API answers with a Status, or with the object as it was.
      this.informer.deleted(key, isObject<T>(out) ? out.metadata.uid : opts?.uid);
    }
  }

  async addFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T> {
    const base = obj.metadata.resourceVersion ? obj : await this.read(obj.metadata, opts);
    const current = base.metadata.finalizers ?? [];
    const finalizers = current.includes(finalizer) ? current : [...current, finalizer];
    const out = await this.writeFinalizers(base, finalizers, opts);
    if (!out)
      throw new StoreError('NotFound', 404, `${this.api.what} ${keyOf(base)}: gone while adding a finalizer`);
    return out;
  }

  async removeFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T | undefined> {
    const base = obj.metadata.resourceVersion ? obj : await this.read(obj.metadata, opts);
    const finalizers = (base.metadata.finalizers ?? []).filter((f) => f !== finalizer);
    const out = await this.writeFinalizers(base, finalizers, opts);
    return out && !isGone(out) ? out : undefined;
  }

  /**
   * Merge patch of the whole finalizer list guarded by the resourceVersion it was computed
   * from, so a concurrent change to the list is a 409 rather than a lost finalizer.
   */
  private async writeFinalizers(base: T, finalizers: string[], opts?: WriteOptions): Promise<T | undefined> {
    const body = { metadata: { resourceVersion: base.metadata.resourceVersion, finalizers } };
    const out: unknown = await this.api.patch(base.metadata, body, 'merge', false, opts?.signal);
    if (isObject<T>(out)) return this.cache(out);
    // Some servers answer the patch that deletes the object with a Status instead of it.
    this.informer.deleted(base.metadata, base.metadata.uid);
    return undefined;
  }

  watch(handler: (event: WatchEvent<T>) => void): Unsubscribe {
    return this.informer.subscribe(handler);
  }

  synced(signal?: AbortSignal): Promise<void> {
    return this.informer.synced(signal);
  }
}

export interface SecretSource {
  name: string;
  labelSelector: string;
  accept: (s: Secret) => boolean;
}

/** The label selectors under which Secrets are cached (an unlabelled Secret reads as missing). */
export const SECRET_SOURCES: SecretSource[] = [
  {
    name: 'cloud-init',
    labelSelector: `${LABEL_CLOUD_INIT_SECRET}=true`,
    accept: (s) => s.metadata.labels?.[LABEL_CLOUD_INIT_SECRET] === 'true',
  },
  {
    name: 'credentials',
    labelSelector: LABEL_CREDENTIALS_FOR,
    accept: (s) => Object.hasOwn(s.metadata.labels ?? {}, LABEL_CREDENTIALS_FOR),
  },
];

export class KubeSecretClient implements SecretClient {
  readonly informer: Informer<Secret>;
  readonly sink: MultiSourceSink<Secret>;
  private readonly api: RawApi<Secret>;
  private readonly inScope: (obj: KubeObject) => boolean;

  constructor(api: RawApi<Secret>, informer: Informer<Secret>, inScope: (obj: KubeObject) => boolean) {
    this.api = api;
    this.informer = informer;
    this.sink = new MultiSourceSink(informer);
    this.inScope = inScope;
  }

  get(key: ObjectKey): Secret | undefined {
    return this.informer.get(keyOf({ metadata: key }));
  }

  read(key: ObjectKey, opts?: WriteOptions): Promise<Secret> {
    return this.api.read(key, opts?.signal);
  }

  async create(secret: Secret, opts?: WriteOptions): Promise<Secret> {
    const out = await this.api.create(secret, opts?.signal);
    if (this.inScope(out)) this.sink.writeThrough(out, SECRET_SOURCES);
    return out;
  }

  async addLabels(
    key: ObjectKey,
    labels: Record<string, string>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<Secret> {
    const metadata: Record<string, unknown> = { labels };
    if (opts?.resourceVersion !== undefined) metadata.resourceVersion = opts.resourceVersion;
    const out = await this.api.patch(key, { metadata }, 'merge', false, opts?.signal);
    // Cached at once, so the next reconcile reads it from the cache; the watch confirms it.
    if (this.inScope(out)) this.sink.writeThrough(out, SECRET_SOURCES);
    return out;
  }

  async delete(key: ObjectKey, opts?: WriteOptions): Promise<void> {
    const out = await this.api.delete(key, undefined, opts?.signal);
    this.sink.deleted(key, isObject<Secret>(out) ? out.metadata.uid : undefined);
  }

  watch(handler: (event: WatchEvent<Secret>) => void): Unsubscribe {
    return this.informer.subscribe(handler);
  }

  synced(signal?: AbortSignal): Promise<void> {
    return this.informer.synced(signal);
  }
}
