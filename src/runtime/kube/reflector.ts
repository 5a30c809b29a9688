/**
 * runtime/kube/reflector — keeps a cache in step with the API server: a paginated list, then a
 * watch from the list's resourceVersion with bookmarks; a 410 Gone relists, any other failure
 * retries with capped exponential backoff. It never gives up and never throws into the process
 * (client-node's own informer stops for good on most errors and crashes on handler throws).
 */
import type { KubeObject } from '../../api/meta.ts';
import { type Logger, silentLogger } from '../../log/index.ts';
import { backoffDelay } from '../workqueue.ts';
import { statusCodeOf, toStoreError } from './errors.ts';
import type { CacheSink } from './informer.ts';

export interface ListPage<T> {
  items: T[];
  metadata?: { resourceVersion?: string; continue?: string };
}

/** The subset of client-node's Watch the reflector uses (injectable for tests). */
export interface WatchClient {
  watch(
    path: string,
    query: Record<string, string | number | boolean | undefined>,
    callback: (type: string, obj: unknown) => void,
    done: (err: unknown) => void,
  ): Promise<AbortController>;
}

export interface ReflectorOptions<T extends KubeObject> {
  name: string;
  /** One page of the list (pass `limit`/`continue` through; `signal` cancels). */
  list(opts: { limit: number; continue?: string; signal: AbortSignal }): Promise<ListPage<T>>;
  watchClient: WatchClient;
  /** REST collection path, e.g. `/apis/g/v/namespaces/ns/proxies` or `/api/v1/secrets`. */
  watchPath: string;
  labelSelector?: string;
  sink: CacheSink<T>;
  /** Called after the first complete list has been written to the sink. */
  onSynced?: () => void;
  log?: Logger;
  pageSize?: number;
  /** Server-side watch timeout; below client-node's 30 s client inactivity abort. Default 25 s. */
  watchTimeoutSeconds?: number;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * Uniform [0, 1) source for the ±20 % backoff jitter; default Math.random (tests pass a
   * seeded one), as runtime/leader/lease.ts does for its retry jitter.
   */
  random?: () => number;
  /** Objects from JSON decoding (watch) and from typed clients (list) normalised alike. */
  normalize?: (obj: unknown) => T;
}

type WatchEnd =
  | { kind: 'closed'; progressed: boolean }
  | { kind: 'gone' }
  | { kind: 'error'; err: unknown; progressed: boolean };

class GoneError extends Error {}

export class Reflector<T extends KubeObject> {
  private readonly o: ReflectorOptions<T>;
  private readonly log: Logger;
  private resourceVersion: string | undefined;
  private synced = false;
  private failures = 0;
  /** Counters for tests and debugging. */
  readonly stats = { lists: 0, watches: 0, relistsOnGone: 0, errors: 0 };

  constructor(o: ReflectorOptions<T>) {
    this.o = o;
    this.log = (o.log ?? silentLogger()).child({ reflector: o.name });
  }

  get name(): string {
    return this.o.name;
  }

  hasSynced(): boolean {
    return this.synced;
  }

  lastSyncResourceVersion(): string | undefined {
    return this.resourceVersion;
  }

  /** Runs until `signal` aborts; never rejects. */
  async run(signal: AbortSignal): Promise<void> {
    let needList = true;
    while (!signal.aborted) {
      try {
        if (needList) {
          await this.listAll(signal);
          needList = false;
          this.failures = 0;
        }
        const startedAt = Date.now();
        const end = await this.watchOnce(signal);
        if (signal.aborted) return;
        if (end.kind === 'gone') {
          this.stats.relistsOnGone++;
          this.log.info('watch resourceVersion expired (410); relisting');
          needList = true;
          continue;
        }
        if (end.progressed) this.failures = 0;
        if (end.kind === 'error') {
          this.stats.errors++;
          await this.backoff(signal, 'watch failed', end.err);
        } else if (!end.progressed && Date.now() - startedAt < 1000) {
          // A server that ends watches at once must not turn this into a busy loop.
          await this.backoff(signal, 'watch closed immediately', undefined);
        }
      } catch (err) {
        if (signal.aborted) return;
        this.stats.errors++;
        if (err instanceof GoneError) {
          this.log.info('list continue token expired; relisting from scratch');
          continue;
        }
        await this.backoff(signal, 'list failed', err);
      }
    }
  }

  private async backoff(signal: AbortSignal, what: string, err: unknown): Promise<void> {
    const base = backoffDelay(this.failures++, this.o.initialBackoffMs ?? 500, this.o.maxBackoffMs ?? 30_000);
    const ms = Math.round(base * (0.8 + (this.o.random ?? Math.random)() * 0.4));
    this.log.warn({ err, retryInMs: ms }, `${what}; retrying`);
    await abortableSleep(ms, signal);
  }

  private async listAll(signal: AbortSignal): Promise<void> {
    this.stats.lists++;
    const items: T[] = [];
    let cont: string | undefined;
    let rv: string | undefined;
    do {
      let page: ListPage<T>;
      try {
        page = await this.o.list({
          limit: this.o.pageSize ?? 500,
          ...(cont !== undefined && { continue: cont }),
          signal,
        });
      } catch (e) {
        if (cont !== undefined && statusCodeOf(e) === 410) throw new GoneError('continue expired');
        throw e;
      }
      for (const it of page.items ?? []) items.push(this.normalize(it));
      rv = page.metadata?.resourceVersion;
      cont = page.metadata?.continue || undefined;
    } while (cont !== undefined && !signal.aborted);
    if (signal.aborted) return;
    this.o.sink.replace(items);
    this.resourceVersion = rv;
    if (!this.synced) {
      this.synced = true;
      this.o.onSynced?.();
    }
    this.log.debug({ count: items.length, resourceVersion: rv }, 'listed');
  }

  private normalize(obj: unknown): T {
    return this.o.normalize ? this.o.normalize(obj) : (obj as T);
  }

  private watchOnce(signal: AbortSignal): Promise<WatchEnd> {
    this.stats.watches++;
    return new Promise<WatchEnd>((resolve) => {
      let progressed = false;
      let outcome: WatchEnd | undefined;
      let controller: AbortController | undefined;
      let settled = false;
      const finish = (end: WatchEnd) => {
        if (settled) return;
        settled = true;
        signal.removeEventListener('abort', onAbort);
        controller?.abort();
        resolve(end);
      };
      const onAbort = () => {
        controller?.abort();
        finish({ kind: 'closed', progressed });
      };
      signal.addEventListener('abort', onAbort, { once: true });
      const query: Record<string, string | number | boolean | undefined> = {
        allowWatchBookmarks: true,
        resourceVersion: this.resourceVersion,
        timeoutSeconds: this.o.watchTimeoutSeconds ?? 25,
        labelSelector: this.o.labelSelector,
      };
      const onEvent = (type: string, raw: unknown) => {
        if (settled) return;
        try {
          if (type === 'ERROR') {
            const code = (raw as { code?: number } | undefined)?.code;
            outcome =
              code === 410
                ? { kind: 'gone' }
                : { kind: 'error', err: new Error(`watch ERROR event: ${describe(raw)}`), progressed };
            controller?.abort();
            finish(outcome);
            return;
          }
          const obj = this.normalize(raw);
          const rv = obj?.metadata?.resourceVersion;
          if (type === 'ADDED' || type === 'MODIFIED') this.o.sink.upsert(obj);
          else if (type === 'DELETED') this.o.sink.remove(obj);
          else if (type !== 'BOOKMARK') return;
          if (rv) this.resourceVersion = rv;
          progressed = true;
        } catch (err) {
          // A bad object or a broken sink must not kill the stream or the process.
          this.log.error({ err, type }, 'failed to apply watch event');
        }
      };
      const onDone = (err: unknown) => {
        if (settled) return;
        if (outcome) return finish(outcome);
        if (!err || signal.aborted) return finish({ kind: 'closed', progressed });
        if (statusCodeOf(err) === 410) return finish({ kind: 'gone' });
        // client-node aborts a watch after 30 s without data: reconnect at once.
        if (err instanceof Error && err.name === 'TimeoutError')
          return finish({ kind: 'closed', progressed });
        finish({ kind: 'error', err, progressed });
      };
      this.o.watchClient.watch(this.o.watchPath, query, onEvent, onDone).then(
        (c) => {
          controller = c;
          if (settled || signal.aborted) c.abort();
        },
        (err) => onDone(err ?? new Error('watch failed')),
      );
    });
  }
}

function describe(e: unknown): string {
  if (e === undefined) return 'no error';
  const store = toStoreError(e, 'request');
  if (store instanceof Error) {
    const code = statusCodeOf(store);
    return code && !store.message.includes(`HTTP ${code}`)
      ? `${store.message} (HTTP ${code})`
      : store.message;
  }
  try {
    return JSON.stringify(e);
  } catch {
    return String(e);
  }
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
