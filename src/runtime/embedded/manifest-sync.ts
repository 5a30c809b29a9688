/**
 * runtime/embedded/manifest-sync — keeps the engine in line with the manifest files: applies
 * every valid document (create, or update only the fields a manifest owns), deletes objects
 * whose document is gone — unless that would delete more than half of the Proxies at once
 * (manifest-rules) — and rescans when the files change (manifest-watch + debounce), periodically
 * as a fallback, and when a manifest object finishes deleting. A file with any error, or one
 * that adds a name another file owns, keeps its previous version in effect. Which labels and annotations each manifest set is remembered
 * (and persisted) so that removing one from the file removes it from the object, while keys
 * the operator added itself survive.
 */
import { realpath } from 'node:fs/promises';
import { dirname } from 'node:path';
import { PROXY_POOL_KIND } from '../../api/constants.ts';
import { errorMessage } from '../../log/errors.ts';
import type { Logger } from '../../log/index.ts';
import type { Clock, TimerHandle } from '../clock.ts';
import type { ObjectEngine } from '../objects/engine.ts';
import type { EngineEvent } from '../objects/types.ts';
import { PROXY_POOL_RESOURCE, PROXY_RESOURCE, qualifiedName, SECRET_RESOURCE } from '../objects/types.ts';
import { deepClone } from '../patch.ts';
import type { AppliedManifest } from './journal.ts';
import { collectDesired, isMassDeletion, type ProxyLoss } from './manifest-rules.ts';
import { ManifestWatcher } from './manifest-watch.ts';
import {
  type FileScan,
  formatManifestError,
  listManifestFiles,
  type ManifestDoc,
  type ManifestError,
  type ManifestRef,
  manifestKey,
  type ProxyValidator,
  parseManifestKey,
  readManifestFile,
  refName,
} from './manifests.ts';

export interface ManifestSyncOptions {
  engine: ObjectEngine;
  /** A manifest file or a directory of them; undefined: no manifests. */
  manifestsPath: string | undefined;
  validate: ProxyValidator;
  log: Logger;
  clock: Clock;
  /** The bookkeeping as last persisted (keyed by manifestKey). */
  applied: Record<string, AppliedManifest>;
  /** Journals a changed bookkeeping map. */
  save(applied: Record<string, AppliedManifest>): void;
  /** Resolves once every change recorded so far is durable. */
  durable(): Promise<void>;
  /** Periodic full rescan (0: off). */
  rescanIntervalMs: number;
  /** Quiet period after a file change before rescanning. */
  debounceMs: number;
  /** Let one rescan delete more than half of the Proxies (otherwise it deletes nothing). */
  allowEmptyManifests?: boolean;
}

/** How often the held-back mass deletion is logged again while nothing changes. */
const MASS_DELETION_WARN_EVERY_MS = 60_000;

/** What one manifest owns on its object. */
interface Owned {
  ref: ManifestRef;
  applied: AppliedManifest;
}

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

export class ManifestSync {
  private readonly opts: ManifestSyncOptions;
  private readonly engine: ObjectEngine;
  private readonly log: Logger;
  private readonly applied = new Map<string, Owned>();
  private readonly cache = new Map<string, FileScan>();
  private errors: ManifestError[] = [];
  private lastErrorText = '';
  private scanning: Promise<ManifestError[]> | undefined;
  private again = false;
  /** Deletions trigger rescans only after the first scan (that scan prunes in the same pass). */
  private reacting = false;
  private watcher: ManifestWatcher | undefined;
  /** The held-back mass deletion last warned about, and when. */
  private holding: { text: string; at: number } | undefined;
  private periodic: TimerHandle | undefined;
  private debounce: TimerHandle | undefined;
  private stopped = false;

  constructor(opts: ManifestSyncOptions) {
    this.opts = opts;
    this.engine = opts.engine;
    this.log = opts.log;
    for (const [key, applied] of Object.entries(opts.applied)) {
      this.applied.set(key, { ref: parseManifestKey(key), applied });
    }
  }

  /** The bookkeeping as the state file stores it. */
  bookkeeping(): Record<string, AppliedManifest> {
    return Object.fromEntries([...this.applied].map(([k, o]) => [k, deepClone(o.applied)]));
  }

  /** Errors of the last scan. */
  manifestErrors(): ManifestError[] {
    return [...this.errors];
  }

  /** Re-reads the manifests and applies them; concurrent calls share one scan plus one rerun. */
  rescan(): Promise<ManifestError[]> {
    if (this.scanning) {
      this.again = true;
      return this.scanning;
    }
    this.scanning = this.scanOnce().finally(() => {
      this.scanning = undefined;
      this.reacting = true;
      if (this.again) {
        this.again = false;
        // Nobody awaits the rerun: a failure is logged, never an unhandled rejection.
        this.rescanLogged();
      }
    });
    return this.scanning;
  }

  /** Engine commit hook: a manifest object that finished deleting is dropped or recreated. */
  observe(ev: EngineEvent): void {
    if (ev.type !== 'DELETED' || !this.reacting) return;
    const { namespace, name } = ev.object.metadata;
    const ref = { resource: qualifiedName(ev.resource), namespace: namespace ?? '', name };
    if (this.applied.has(manifestKey(ref))) this.rescanSoon();
  }

  /** Starts file watching and the periodic rescan. */
  startWatching(): void {
    const path = this.opts.manifestsPath;
    if (!path || this.stopped) return;
    this.watcher = new ManifestWatcher(path, () => this.rescanSoon(), this.log);
    this.watcher.start();
    void this.watchLinkTargets();
    if (this.opts.rescanIntervalMs > 0) this.schedulePeriodic();
  }

  /** Symlinked manifests: watch the directories their targets live in. */
  private async watchLinkTargets(): Promise<void> {
    if (!this.watcher) return;
    const dirs = new Set<string>();
    for (const file of this.cache.keys()) {
      const real = await realpath(file).catch(() => undefined);
      if (real && real !== file) dirs.add(dirname(real));
    }
    this.watcher?.watchTargets(dirs);
  }

  /** Stops watching and waits for a scan in flight. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    this.watcher = undefined;
    if (this.periodic) this.opts.clock.clearTimeout(this.periodic);
    if (this.debounce) this.opts.clock.clearTimeout(this.debounce);
    while (this.scanning) await this.scanning.catch(() => {});
  }

  private schedulePeriodic(): void {
    this.periodic = this.opts.clock.setTimeout(() => {
      if (this.stopped) return;
      this.schedulePeriodic();
      this.rescanLogged();
    }, this.opts.rescanIntervalMs);
  }

  private rescanSoon(): void {
    if (this.stopped) return;
    if (this.debounce) this.opts.clock.clearTimeout(this.debounce);
    this.debounce = this.opts.clock.setTimeout(() => {
      this.debounce = undefined;
      this.rescanLogged();
    }, this.opts.debounceMs);
  }

  private rescanLogged(): void {
    this.rescan().catch((e) => this.log.error({ err: e }, 'manifest rescan failed'));
  }

  private async scanFiles(): Promise<{ scans: FileScan[]; listError?: ManifestError }> {
    const path = this.opts.manifestsPath;
    if (!path) return { scans: [] };
    let files: string[];
    try {
      files = await listManifestFiles(path);
    } catch (e) {
      return { scans: [], listError: { file: path, message: `cannot read manifests: ${errorMessage(e)}` } };
    }
    const stored = (ref: ManifestRef) => this.engine.collection(ref.resource).get(ref.namespace, ref.name);
    const scans: FileScan[] = [];
    for (const f of files) {
      const prev = this.cache.get(f);
      const scan = await readManifestFile(f, this.opts.validate, stored);
      // Unchanged text: keep the earlier verdict (re-validating against itself adds nothing).
      if (prev && prev.text !== undefined && prev.text === scan.text) scans.push(prev);
      else scans.push(scan);
    }
    this.cache.clear();
    for (const s of scans) this.cache.set(s.file, s);
    return { scans };
  }

  private async scanOnce(): Promise<ManifestError[]> {
    const { scans, listError } = await this.scanFiles();
    if (listError) {
      // The manifest path itself is unreadable: change nothing.
      this.report([listError]);
      return this.errors;
    }
    const { desired, badFiles, errors } = collectDesired(scans, (key) => this.applied.get(key)?.applied.file);
    let changed = false;
    for (const d of desired.values()) {
      const before = JSON.stringify(this.applied.get(d.key)?.applied);
      try {
        this.apply(d);
      } catch (e) {
        errors.push({ file: d.file, document: d.index, message: errorMessage(e) });
      }
      if (JSON.stringify(this.applied.get(d.key)?.applied) !== before) changed = true;
    }
    if (this.mayPrune(this.proxyLoss(desired, badFiles)) && this.prune(desired, badFiles)) changed = true;
    if (changed) this.opts.save(this.bookkeeping());
    this.report(errors);
    if (this.watcher) void this.watchLinkTargets();
    await this.opts.durable();
    return this.errors;
  }

  /** Creates the object, or updates the fields its manifest owns. */
  private apply(doc: ManifestDoc): void {
    const c = this.engine.collection(doc.type);
    const cur = c.get(doc.ref.namespace, doc.ref.name);
    const prev = this.applied.get(doc.key)?.applied;
    if (!cur) {
      c.create(doc.obj);
    } else if (cur.metadata.deletionTimestamp) {
      return; // still finishing an earlier deletion; recreated once it is gone
    } else {
      const next = deepClone(cur);
      const { labels: wantLabels, annotations: wantAnnotations } = doc.obj.metadata;
      const labels = mergeOwned(cur.metadata.labels, wantLabels, prev?.labels ?? []);
      const annotations = mergeOwned(cur.metadata.annotations, wantAnnotations, prev?.annotations ?? []);
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
    this.applied.set(doc.key, {
      ref: doc.ref,
      applied: {
        file: doc.file,
        labels: Object.keys(doc.obj.metadata.labels ?? {}),
        annotations: Object.keys(doc.obj.metadata.annotations ?? {}),
      },
    });
  }

  /**
   * How many live Proxies the manifests account for — their own, and those their ProxyPools own —
   * and how many pruning now would delete: a removed pool takes its Proxies with it (owner GC).
   */
  private proxyLoss(desired: Map<string, ManifestDoc>, badFiles: Set<string>): ProxyLoss {
    const proxies = qualifiedName(PROXY_RESOURCE);
    const pools = qualifiedName(PROXY_POOL_RESOURCE);
    const ownedByPool = this.liveProxiesByPoolUid();
    let before = 0;
    let lost = 0;
    for (const [key, { ref, applied }] of this.applied) {
      if (ref.resource !== proxies && ref.resource !== pools) continue;
      const cur = this.engine.collection(ref.resource).get(ref.namespace, ref.name);
      if (!cur || cur.metadata.deletionTimestamp) continue;
      const count = ref.resource === proxies ? 1 : (ownedByPool.get(cur.metadata.uid ?? '') ?? 0);
      before += count;
      if (!desired.has(key) && !badFiles.has(applied.file)) lost += count;
    }
    return { before, lost };
  }

  /** Live Proxies per controlling ProxyPool uid. */
  private liveProxiesByPoolUid(): Map<string, number> {
    const counts = new Map<string, number>();
    for (const p of this.engine.collection(qualifiedName(PROXY_RESOURCE)).all()) {
      if (p.metadata.deletionTimestamp) continue;
      const owner = p.metadata.ownerReferences?.find(
        (o) => o.controller === true && o.kind === PROXY_POOL_KIND,
      );
      if (owner) counts.set(owner.uid, (counts.get(owner.uid) ?? 0) + 1);
    }
    return counts;
  }

  /**
   * False while a rescan would delete more than half of the Proxies and the user has not
   * confirmed with --allow-empty-manifests: nothing is deleted (Secrets neither), and a warning
   * repeats on rescans, at most once a minute unless the numbers change.
   */
  private mayPrune(loss: ProxyLoss): boolean {
    const mass = isMassDeletion(loss);
    const fields = {
      manifests: this.opts.manifestsPath,
      proxiesBefore: loss.before,
      proxiesAfter: loss.before - loss.lost,
    };
    if (!mass) {
      if (this.holding) this.log.info(fields, 'manifests restored: deletions resume normally');
      this.holding = undefined;
      return true;
    }
    if (this.opts.allowEmptyManifests) {
      this.log.warn(
        fields,
        `deleting ${loss.lost} of ${loss.before} Proxies at once (--allow-empty-manifests)`,
      );
      return true;
    }
    const text = `${loss.before}/${loss.lost}`;
    const now = this.opts.clock.now();
    if (!this.holding || this.holding.text !== text || now - this.holding.at >= MASS_DELETION_WARN_EVERY_MS) {
      this.holding = { text, at: now };
      this.log.warn(
        fields,
        `the manifests no longer define ${loss.lost} of the ${loss.before} Proxies (directly or through their ` +
          'ProxyPools); deleting more than half ' +
          'at once looks like an accident (an emptied file or directory), so nothing is deleted. Restore the ' +
          'files, or restart with --allow-empty-manifests to delete them',
      );
    }
    return false;
  }

  /**
   * Deletes objects whose document is gone (but not those of a file that now has errors) and
   * forgets them once deleted; true when the bookkeeping changed.
   */
  private prune(desired: Map<string, ManifestDoc>, badFiles: Set<string>): boolean {
    let changed = false;
    for (const [key, { ref, applied }] of this.applied) {
      if (desired.has(key) || badFiles.has(applied.file)) continue;
      const c = this.engine.collection(ref.resource);
      const cur = c.get(ref.namespace, ref.name);
      if (cur && !cur.metadata.deletionTimestamp) {
        this.log.info(
          { object: refName(ref), resource: ref.resource, file: applied.file },
          'manifest removed: deleting the object',
        );
        c.delete(ref.namespace, ref.name);
      }
      if (!c.get(ref.namespace, ref.name)) {
        this.applied.delete(key);
        changed = true;
      }
    }
    return changed;
  }

  private report(errors: ManifestError[]): void {
    this.errors = errors;
    const text = errors.map(formatManifestError).join('\n');
    if (text === this.lastErrorText) return;
    this.lastErrorText = text;
    for (const e of errors) {
      this.log.error(
        { file: e.file, document: e.document, field: e.path },
        `invalid manifest, previous version kept: ${formatManifestError(e)}`,
      );
    }
    if (!text && this.opts.manifestsPath)
      this.log.info({ manifests: this.opts.manifestsPath }, 'manifests valid');
  }
}
