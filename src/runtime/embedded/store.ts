/**
 * runtime/embedded/store — the standalone ObjectStore. Proxies and Secrets come from manifest
 * files (ManifestSync); everything the operator writes (status, finalizers, annotations,
 * generated Secrets, ProviderHealths) lives in a journaled state file (Persister) that is
 * durable before any write resolves, so a restart — even after kill -9 — resumes with the same
 * UIDs, credentials, instance IDs and installation id. A disk that stops taking writes while
 * running does not stop the process: it serves from memory, fails readiness and rewrites the
 * whole state once the disk takes it again (persister, state-writes). A lock file keeps a
 * second process off the state; a caller that must outlive the store's last write (the CLI:
 * listeners, lease checkpoint) takes the lock itself and passes it in.
 */
import { mkdirSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { validateProxy as defaultValidateProxy } from '../../api/validate.ts';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import { type Clock, systemClock } from '../clock.ts';
import { ObjectEngine } from '../objects/engine.ts';
import { collectOwnedObjects } from '../objects/owners.ts';
import { storeOnEngine } from '../objects/store-adapter.ts';
import {
  PROVIDER_HEALTH_RESOURCE,
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  qualifiedName,
  SECRET_RESOURCE,
} from '../objects/types.ts';
import type { ObjectStore } from '../store.ts';
import { type ResolvedInstallation, resolveInstallationId, writeInstallationIdCopy } from './installation.ts';
import { Journal, objectKey, readState } from './journal.ts';
import { acquireLock, type Lock } from './lock.ts';
import { ManifestSync } from './manifest-sync.ts';
import type { ManifestError, ProxyValidator } from './manifests.ts';
import { Persister } from './persister.ts';
import { StateWrites } from './state-writes.ts';
import { removeStaleTempFiles } from './temp-files.ts';

export interface EmbeddedStoreOptions {
  /** A manifest file or a directory of them; omit to run on the state file alone. */
  manifests?: string;
  /** The state file (created if missing); the lock is `<statePath>.lock`. */
  statePath: string;
  log?: Logger;
  /** Object timestamps and the manifest rescan timers. */
  clock?: Clock;
  /** Proxy admission; defaults to api/validate's validateProxy. */
  validateProxy?: ProxyValidator;
  /** Periodic full rescan of the manifests, as a fallback to file watching (default 10 s; 0: off). */
  rescanIntervalMs?: number;
  /** Quiet period after a file change before rescanning (default 200 ms). */
  debounceMs?: number;
  /**
   * Let a rescan delete more than half of the manifest Proxies at once (all of them included);
   * without it such a rescan deletes nothing and warns (`--allow-empty-manifests`).
   */
  allowEmptyManifests?: boolean;
  /** Journal records after which the state file is rewritten as a snapshot (default 5000). */
  compactAfterRecords?: number;
  /** Backoff between rewrites of a state file that cannot be written (default 500 ms to 10 s). */
  retryMs?: { initial: number; max: number };
  /** `--installation-id`: must agree with the id the state keeps, else is kept in it. */
  installationId?: string;
  /**
   * `<statePath>.lock`, already held by the caller, who releases it after its own last write;
   * without it the store takes the lock and releases it when it stops.
   */
  lock?: Lock;
}

export interface EmbeddedStore extends ObjectStore {
  readonly engine: ObjectEngine;
  /** Re-reads the manifests now and applies them; returns the current manifest errors. */
  rescan(): Promise<ManifestError[]>;
  /** Errors of the last scan (files with errors keep their previous version in effect). */
  manifestErrors(): ManifestError[];
  /** Resolves when every committed change is on disk. */
  flush(): Promise<void>;
  /** The installation id kept in the state, and where it came from at this start. */
  readonly installation: ResolvedInstallation;
  /**
   * Whether the state directory takes writes; files the caller writes beside the state file
   * (the lease checkpoint) report here too, so one readiness check covers them all.
   */
  readonly writes: StateWrites;
}

/**
 * Creates the state directory private (0700). One that exists with group or other access is
 * left as the user made it — it may be shared on purpose — but named in a warning, since the
 * state holds proxy credentials (its files are 0600 whatever the directory).
 */
export function prepareStateDir(dir: string, log: Logger): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const mode = statSync(dir).mode & 0o777;
  if (mode & 0o077) {
    log.warn(
      { stateDir: dir, mode: `0${mode.toString(8)}` },
      `state directory ${dir} is open to group or others (mode 0${mode.toString(8)}); the state holds proxy credentials: chmod 700 it unless that is intended`,
    );
  }
}

/** Opens (or creates) the standalone state, takes the lock and applies the manifests once. */
export async function createEmbeddedStore(opts: EmbeddedStoreOptions): Promise<EmbeddedStore> {
  const statePath = resolve(opts.statePath);
  // A caller holding the lock has prepared the directory already.
  if (opts.lock) return open(opts, statePath, opts.lock);
  prepareStateDir(dirname(statePath), opts.log ?? silentLogger());
  const lock = acquireLock(`${statePath}.lock`);
  try {
    return await open(opts, statePath, lock);
  } catch (e) {
    lock.release();
    throw e;
  }
}

async function open(opts: EmbeddedStoreOptions, statePath: string, lock: Lock): Promise<EmbeddedStore> {
  const log = opts.log ?? silentLogger();
  const clock = opts.clock ?? systemClock;
  // Under the lock, before this process writes: no other operator writes beside this state now.
  const removed = removeStaleTempFiles(statePath);
  if (removed.length > 0) log.info({ removed }, 'removed temporary files of stopped processes');
  const engine = new ObjectEngine({ clock });
  for (const t of [PROXY_RESOURCE, PROXY_POOL_RESOURCE, PROVIDER_HEALTH_RESOURCE, SECRET_RESOURCE]) {
    engine.register(t);
  }
  const loaded = await readState(statePath);
  if (loaded) {
    engine.restore(loaded.state.engine);
    if (loaded.tornTail)
      log.warn({ statePath }, 'ignored a partial last record in the state file (an interrupted write)');
    log.info({ statePath, resourceVersion: engine.resourceVersion }, 'standalone state loaded');
  }
  const applied = loaded?.state.manifests ?? {};
  const installation = resolveInstallationId({
    statePath,
    kept: loaded?.state.installationId,
    flag: opts.installationId,
    objects: Object.values(loaded?.state.engine.objects ?? {}).reduce((n, list) => n + list.length, 0),
  });
  const installationId = installation.id;
  if (installation.warning) log.warn({ statePath }, installation.warning);
  // Opening rewrites the snapshot: from here on the id is in the state file, whatever its source.
  const journal = await Journal.create(statePath, {
    engine: engine.snapshot(),
    manifests: applied,
    installationId,
  });
  // The copy only after the state holds the id: the state file stays the authority.
  if (installation.copy !== installationId) {
    try {
      writeInstallationIdCopy(statePath, installationId);
    } catch (err) {
      log.warn({ err, statePath }, 'writing the copy of the installation id failed; the state file keeps it');
    }
  }
  if (installation.source === 'generated')
    log.info({ installation: installationId, statePath }, 'generated the installation id (new state)');
  if (installation.source === 'legacy-file' || installation.source === 'flag')
    log.info(
      { installation: installationId, statePath, from: installation.source },
      'installation id is now kept in the state file',
    );
  const writes = new StateWrites(log, clock);
  const persister: Persister = new Persister({
    journal,
    snapshot: () => ({
      state: { engine: engine.snapshot(), manifests: sync.bookkeeping(), installationId },
      seq: persister.sequence,
    }),
    log,
    compactAfter: opts.compactAfterRecords ?? 5000,
    health: writes.writer('state file', statePath),
    clock,
    ...(opts.retryMs ? { retryMs: opts.retryMs } : {}),
  });
  const sync = new ManifestSync({
    engine,
    manifestsPath: opts.manifests ? resolve(opts.manifests) : undefined,
    validate: opts.validateProxy ?? defaultValidateProxy,
    log,
    clock,
    applied,
    save: (m) => persister.record({ m }),
    durable: () => persister.durable(),
    rescanIntervalMs: opts.rescanIntervalMs ?? 10_000,
    debounceMs: opts.debounceMs ?? 200,
    allowEmptyManifests: opts.allowEmptyManifests ?? false,
  });
  engine.onCommit((ev) => {
    persister.record({
      rv: ev.rv,
      r: qualifiedName(ev.resource),
      k: objectKey(ev.object),
      o: ev.type === 'DELETED' ? null : ev.object,
    });
    sync.observe(ev);
  });
  // Deleting a ProxyPool deletes its Proxies, as the garbage collector does in a cluster.
  const garbage = collectOwnedObjects(engine);

  const store = storeOnEngine(engine, {
    log,
    schedule: (fn) => persister.schedule(fn),
    durable: () => persister.durable(),
  });
  await sync.rescan();

  let started = false;
  let stopped = false;
  async function stop(): Promise<void> {
    if (stopped) return;
    stopped = true;
    await sync.stop();
    garbage.stop();
    await garbage.settled();
    await persister.close();
    if (!opts.lock) lock.release();
  }
  return {
    ...store,
    engine,
    rescan: () => sync.rescan(),
    manifestErrors: () => sync.manifestErrors(),
    flush: () => persister.durable(),
    installation,
    writes,
    // The signal is not a stop: the manager stops the store after its runnables drained, so
    // their last writes still reach the journal.
    async start(_signal: AbortSignal) {
      if (started || stopped) return;
      started = true;
      sync.startWatching();
    },
    stop,
  };
}
