/**
 * runtime/embedded/store — the standalone ObjectStore. Proxies and Secrets come from manifest
 * files (re-read on change and periodically); everything the operator writes (status,
 * finalizers, annotations, generated Secrets, ProviderHealths) lives in a journaled state file
 * that is durable before any write resolves, so a restart — even after kill -9 — resumes with
 * the same UIDs, credentials and instance IDs. A lock file keeps a second process off the state.
 */
import { type FSWatcher, watch as fsWatch, mkdirSync, statSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { validateProxy as defaultValidateProxy } from '../../api/validate.ts';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import type { Clock } from '../clock.ts';
import { type EngineEvent, ObjectEngine } from '../objects/engine.ts';
import { storeOnEngine } from '../objects/store-adapter.ts';
import {
  PROVIDER_HEALTH_RESOURCE,
  PROXY_RESOURCE,
  qualifiedName,
  SECRET_RESOURCE,
  type StoredObject,
} from '../objects/types.ts';
import { deepClone } from '../patch.ts';
import type { ObjectStore } from '../store.ts';
import { type AppliedManifest, Journal, type JournalRecord, objectKey, readState } from './journal.ts';
import { acquireLock, type Lock } from './lock.ts';
import {
  type FileScan,
  formatManifestError,
  listManifestFiles,
  type ManifestDoc,
  type ManifestError,
  type ProxyValidator,
  readManifestFile,
} from './manifests.ts';

export interface EmbeddedStoreOptions {
  /** A manifest file or a directory of them; omit to run on the state file alone. */
  manifests?: string;
  /** The state file (created if missing); the lock is `<statePath>.lock`. */
  statePath: string;
  log?: Logger;
  clock?: Clock;
  /** Proxy admission; defaults to api/validate's validateProxy. */
  validateProxy?: ProxyValidator;
  /** Periodic full rescan of the manifests, as a fallback to file watching (default 10 s; 0: off). */
  rescanIntervalMs?: number;
  /** Quiet period after a file change before rescanning (default 200 ms). */
  debounceMs?: number;
  /** Journal records after which the state file is rewritten as a snapshot (default 5000). */
  compactAfterRecords?: number;
}

export interface EmbeddedStore extends ObjectStore {
  readonly engine: ObjectEngine;
  /** Re-reads the manifests now and applies them; returns the current manifest errors. */
  rescan(): Promise<ManifestError[]>;
  /** Errors of the last scan (files with errors keep their previous version in effect). */
  manifestErrors(): ManifestError[];
  /** Resolves when every committed change is on disk. */
  flush(): Promise<void>;
}

interface Waiter {
  target: number;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** Group-commit persistence: changes queue as journal records; one append+fdatasync covers many writes. */
class Persister {
  private readonly journal: Journal;
  private readonly snapshot: () => { state: Parameters<Journal['snapshot']>[0]; seq: number };
  private readonly log: Logger;
  private readonly compactAfter: number;
  private pending: JournalRecord[] = [];
  private seq = 0;
  private flushed = 0;
  private running: Promise<void> | undefined;
  private waiters: Waiter[] = [];
  private scheduled: Array<{ target: number; fn: () => void }> = [];
  private needSnapshot = false;
  private closed = false;

  constructor(
    journal: Journal,
    snapshot: () => { state: Parameters<Journal['snapshot']>[0]; seq: number },
    log: Logger,
    compactAfter: number,
  ) {
    this.journal = journal;
    this.snapshot = snapshot;
    this.log = log;
    this.compactAfter = compactAfter;
  }

  get sequence(): number {
    return this.seq;
  }

  record(r: JournalRecord): void {
    this.pending.push(r);
    this.seq += 1;
    this.kick();
  }

  /** Resolves once everything recorded so far is durable. */
  durable(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('the standalone store is stopped'));
    const target = this.seq;
    if (this.flushed >= target) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.waiters.push({ target, resolve, reject });
      this.kick();
    });
  }

  /** Runs `fn` (in order) once everything recorded so far is durable. */
  schedule(fn: () => void): void {
    this.scheduled.push({ target: this.seq, fn });
    if (this.flushed >= this.seq) queueMicrotask(() => this.drain());
  }

  private drain(): void {
    while (this.scheduled.length && (this.scheduled[0] as { target: number }).target <= this.flushed) {
      (this.scheduled.shift() as { fn: () => void }).fn();
    }
  }

  private kick(): void {
    if (!this.running && !this.closed) {
      this.running = this.loop().finally(() => {
        this.running = undefined;
        if (this.pending.length || this.waiters.some((w) => w.target > this.flushed)) this.kick();
      });
    }
  }

  private settle(upTo: number, err?: unknown): void {
    this.flushed = Math.max(this.flushed, upTo);
    const left: Waiter[] = [];
    for (const w of this.waiters) {
      if (w.target <= upTo) {
        if (err) w.reject(err);
        else w.resolve();
      } else {
        left.push(w);
      }
    }
    this.waiters = left;
    this.drain();
  }

  private async loop(): Promise<void> {
    // Let the writes of the current tick join this batch.
    await new Promise((r) => setImmediate(r));
    while ((this.pending.length || this.needSnapshot) && !this.closed) {
      const snapshotNow = this.needSnapshot || this.journal.records + this.pending.length > this.compactAfter;
      if (snapshotNow) {
        const { state, seq } = this.snapshot();
        this.pending = [];
        try {
          await this.journal.snapshot(state);
          this.needSnapshot = false;
          this.settle(seq);
        } catch (e) {
          this.needSnapshot = true;
          this.log.error({ err: e }, 'writing the standalone state file failed');
          this.settle(seq, new Error(`state file write failed: ${(e as Error).message}`));
          return;
        }
        continue;
      }
      const batch = this.pending;
      const upTo = this.seq;
      this.pending = [];
      try {
        await this.journal.append(batch);
        this.settle(upTo);
      } catch (e) {
        // The file may now hold a partial batch: rewrite it whole on the next attempt.
        this.needSnapshot = true;
        this.log.error({ err: e }, 'appending to the standalone state file failed');
        this.settle(upTo, new Error(`state file write failed: ${(e as Error).message}`));
        return;
      }
    }
  }

  async close(): Promise<void> {
    await this.durable().catch(() => {});
    while (this.running) await this.running;
    this.closed = true;
    await this.journal.close();
  }
}

const keyOfDoc = (d: ManifestDoc) => d.key;

function mergeOwned(
  current: Record<string, string> | undefined,
  desired: Record<string, string> | undefined,
  previouslyOwned: string[],
): Record<string, string> | undefined {
  const out: Record<string, string> = { ...(current ?? {}) };
  for (const k of previouslyOwned) if (!desired || !Object.hasOwn(desired, k)) delete out[k];
  Object.assign(out, desired ?? {});
  return Object.keys(out).length ? out : undefined;
}

/** Opens (or creates) the standalone state, takes the lock and applies the manifests once. */
export async function createEmbeddedStore(opts: EmbeddedStoreOptions): Promise<EmbeddedStore> {
  const log = opts.log ?? silentLogger();
  const statePath = resolve(opts.statePath);
  const manifestsPath = opts.manifests ? resolve(opts.manifests) : undefined;
  const validate = opts.validateProxy ?? defaultValidateProxy;
  mkdirSync(dirname(statePath), { recursive: true, mode: 0o700 });
  const lock: Lock = acquireLock(`${statePath}.lock`);
  try {
    return await open();
  } catch (e) {
    lock.release();
    throw e;
  }

  async function open(): Promise<EmbeddedStore> {
    const engine = new ObjectEngine(opts.clock ? { clock: opts.clock } : {});
    const types = [PROXY_RESOURCE, PROVIDER_HEALTH_RESOURCE, SECRET_RESOURCE];
    for (const t of types) engine.register(t);
    const loaded = await readState(statePath);
    let applied: Record<string, AppliedManifest> = {};
    if (loaded) {
      engine.restore(loaded.state.engine);
      applied = loaded.state.manifests;
      if (loaded.tornTail)
        log.warn({ statePath }, 'ignored a partial last record in the state file (an interrupted write)');
      log.info({ statePath, resourceVersion: engine.resourceVersion }, 'standalone state loaded');
    }
    const journal = await Journal.create(statePath, { engine: engine.snapshot(), manifests: applied });
    let persister: Persister;
    persister = new Persister(
      journal,
      () => ({
        state: { engine: engine.snapshot(), manifests: deepClone(applied) },
        seq: persister.sequence,
      }),
      log,
      opts.compactAfterRecords ?? 5000,
    );
    const saveApplied = () => persister.record({ m: deepClone(applied) });

    let rescanSoon: () => void = () => {};
    engine.onCommit((ev: EngineEvent) => {
      const r = qualifiedName(ev.resource);
      persister.record({
        rv: ev.rv,
        r,
        k: objectKey(ev.object),
        o: ev.type === 'DELETED' ? null : ev.object,
      });
      if (
        ev.type === 'DELETED' &&
        applied[`${r}|${ev.object.metadata.namespace}/${ev.object.metadata.name}`]
      ) {
        rescanSoon(); // a manifest object finished deleting: drop its bookkeeping, or recreate it
      }
    });

    const store = storeOnEngine(engine, {
      log,
      schedule: (fn) => persister.schedule(fn),
      durable: () => persister.durable(),
    });

    // ---- manifests ----
    const cache = new Map<string, FileScan>();
    let errors: ManifestError[] = [];
    let lastErrorText = '';
    let scanning: Promise<ManifestError[]> | undefined;
    let again = false;

    const stored = (key: string): StoredObject | undefined => {
      const [r, nsName] = key.split('|') as [string, string];
      const slash = nsName.indexOf('/');
      return engine.collection(r).get(nsName.slice(0, slash), nsName.slice(slash + 1));
    };

    async function scanFiles(): Promise<{ scans: FileScan[]; listError?: ManifestError }> {
      if (!manifestsPath) return { scans: [] };
      let files: string[];
      try {
        files = await listManifestFiles(manifestsPath);
      } catch (e) {
        return {
          scans: [],
          listError: { file: manifestsPath, message: `cannot read manifests: ${(e as Error).message}` },
        };
      }
      const scans: FileScan[] = [];
      for (const f of files) {
        const prev = cache.get(f);
        const scan = await readManifestFile(f, validate, stored);
        // Unchanged text: keep the earlier verdict (re-validating against itself adds nothing).
        if (prev && prev.text !== undefined && prev.text === scan.text) scans.push(prev);
        else scans.push(scan);
      }
      cache.clear();
      for (const s of scans) cache.set(s.file, s);
      return { scans };
    }

    function applyDoc(doc: ManifestDoc): void {
      const c = engine.collection(doc.type);
      const ns = doc.obj.metadata.namespace as string;
      const cur = c.get(ns, doc.obj.metadata.name);
      const prev = applied[doc.key];
      const owned = {
        file: doc.file,
        labels: Object.keys(doc.obj.metadata.labels ?? {}),
        annotations: Object.keys(doc.obj.metadata.annotations ?? {}),
      };
      if (!cur) {
        c.create(doc.obj);
      } else if (cur.metadata.deletionTimestamp) {
        return; // still finishing an earlier deletion; recreated once it is gone
      } else {
        const next = deepClone(cur);
        const labels = mergeOwned(cur.metadata.labels, doc.obj.metadata.labels, prev?.labels ?? []);
        const annotations = mergeOwned(
          cur.metadata.annotations,
          doc.obj.metadata.annotations,
          prev?.annotations ?? [],
        );
        if (labels) next.metadata.labels = labels;
        else delete next.metadata.labels;
        if (annotations) next.metadata.annotations = annotations;
        else delete next.metadata.annotations;
        if (doc.type === SECRET_RESOURCE) {
          next.data = doc.obj.data;
          if (doc.obj.type !== undefined) next.type = doc.obj.type;
        } else {
          next.spec = doc.obj.spec;
        }
        c.update(next);
      }
      applied[doc.key] = owned;
    }

    async function scanOnce(): Promise<ManifestError[]> {
      const { scans, listError } = await scanFiles();
      const errs: ManifestError[] = listError ? [listError] : [];
      if (listError) {
        // The manifest path itself is unreadable: change nothing.
        errors = errs;
        reportErrors();
        return errors;
      }
      const badFiles = new Set<string>();
      const desired = new Map<string, ManifestDoc>();
      for (const s of scans) {
        let fileErrors = [...s.errors];
        if (fileErrors.length === 0) {
          for (const d of s.docs) {
            const other = desired.get(keyOfDoc(d));
            if (other) {
              fileErrors.push({
                file: s.file,
                document: d.index,
                path: 'metadata.name',
                message: `${d.key.split('|')[1]} is already defined in ${other.file} (document ${other.index})`,
              });
            }
          }
        }
        if (fileErrors.length) {
          badFiles.add(s.file);
          errs.push(...fileErrors);
          fileErrors = [];
          continue;
        }
        for (const d of s.docs) desired.set(d.key, d);
      }
      let changedBookkeeping = false;
      for (const d of desired.values()) {
        const before = JSON.stringify(applied[d.key]);
        try {
          applyDoc(d);
        } catch (e) {
          errs.push({ file: d.file, document: d.index, message: (e as Error).message });
        }
        if (JSON.stringify(applied[d.key]) !== before) changedBookkeeping = true;
      }
      for (const [key, a] of Object.entries(applied)) {
        if (desired.has(key) || badFiles.has(a.file)) continue;
        const [r, nsName] = key.split('|') as [string, string];
        const slash = nsName.indexOf('/');
        const c = engine.collection(r);
        const ns = nsName.slice(0, slash);
        const name = nsName.slice(slash + 1);
        const cur = c.get(ns, name);
        if (cur && !cur.metadata.deletionTimestamp) {
          log.info({ object: nsName, resource: r, file: a.file }, 'manifest removed: deleting the object');
          c.delete(ns, name);
        }
        if (!c.get(ns, name)) {
          delete applied[key];
          changedBookkeeping = true;
        }
      }
      if (changedBookkeeping) saveApplied();
      errors = errs;
      reportErrors();
      await persister.durable();
      return errors;
    }

    function reportErrors(): void {
      const text = errors.map(formatManifestError).join('\n');
      if (text === lastErrorText) return;
      lastErrorText = text;
      for (const e of errors) {
        log.error(
          { file: e.file, document: e.document, field: e.path },
          `invalid manifest, previous version kept: ${formatManifestError(e)}`,
        );
      }
      if (!text && manifestsPath) log.info({ manifests: manifestsPath }, 'manifests valid');
    }

    function rescan(): Promise<ManifestError[]> {
      if (scanning) {
        again = true;
        return scanning;
      }
      scanning = scanOnce().finally(() => {
        scanning = undefined;
        if (again) {
          again = false;
          void rescan();
        }
      });
      return scanning;
    }

    await rescan();

    // ---- change detection ----
    let watcher: FSWatcher | undefined;
    let timer: NodeJS.Timeout | undefined;
    let debounce: NodeJS.Timeout | undefined;
    let started = false;
    let stopped = false;
    rescanSoon = () => {
      if (stopped) return;
      if (debounce) clearTimeout(debounce);
      debounce = setTimeout(() => {
        debounce = undefined;
        rescan().catch((e) => log.error({ err: e }, 'manifest rescan failed'));
      }, opts.debounceMs ?? 200);
      debounce.unref();
    };

    function startWatching(): void {
      if (!manifestsPath) return;
      let isDir = false;
      try {
        isDir = statSync(manifestsPath).isDirectory();
      } catch {
        isDir = !MANIFEST_FILE_LIKE.test(manifestsPath);
      }
      const dir = isDir ? manifestsPath : dirname(manifestsPath);
      const only = isDir ? undefined : basename(manifestsPath);
      try {
        watcher = fsWatch(dir, { persistent: false }, (_ev, file) => {
          if (!only || !file || file.toString() === only) rescanSoon();
        });
        watcher.on('error', (e) =>
          log.warn({ err: e }, 'manifest watch failed; relying on periodic rescans'),
        );
      } catch (e) {
        log.warn({ err: e, dir }, 'cannot watch manifests; relying on periodic rescans');
      }
      const every = opts.rescanIntervalMs ?? 10_000;
      if (every > 0) {
        timer = setInterval(
          () => rescan().catch((e) => log.error({ err: e }, 'manifest rescan failed')),
          every,
        );
        timer.unref();
      }
    }

    async function stop(): Promise<void> {
      if (stopped) return;
      stopped = true;
      watcher?.close();
      if (timer) clearInterval(timer);
      if (debounce) clearTimeout(debounce);
      while (scanning) await scanning.catch(() => {});
      await persister.close();
      lock.release();
    }

    return {
      ...store,
      engine,
      rescan,
      manifestErrors: () => [...errors],
      flush: () => persister.durable(),
      async start(signal: AbortSignal) {
        if (started || stopped) return;
        started = true;
        startWatching();
        signal.addEventListener('abort', () => void stop(), { once: true });
      },
      stop,
    };
  }
}

const MANIFEST_FILE_LIKE = /\.(ya?ml|json)$/i;
