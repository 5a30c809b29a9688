/**
 * lease/checkpoint — makes the lease store's decisions durable: restores the last checkpoint
 * before the store serves, then saves one every interval (only when something changed) and a
 * last one at step-down, so a graceful handover loses nothing and a crash at most one interval.
 * Where a checkpoint lives is the mode's business (`CheckpointStorage`): a file beside the
 * standalone state file, ConfigMaps in the operator namespace in a cluster.
 */
import type { Registry } from 'prom-client';
import { type Logger, silentLogger } from '../log/index.ts';
import { counter, gauge } from '../metrics/register.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { parseLeaseState } from './durable.ts';
import type { LeaseStore } from './store.ts';

export const DEFAULT_CHECKPOINT_INTERVAL_MS = 5_000;

export interface CheckpointStorage {
  /** Where, for logs (no secrets: paths and object names only). */
  readonly where: string;
  /** The last checkpoint saved, or undefined when there is none. */
  load(signal: AbortSignal): Promise<string | undefined>;
  /** Replaces the checkpoint; resolves once it is durable. */
  save(text: string, signal: AbortSignal): Promise<void>;
}

export interface CheckpointerOptions {
  leases: LeaseStore;
  storage: CheckpointStorage;
  intervalMs?: number;
  clock?: Clock;
  log?: Logger;
  registry?: Registry;
}

export class LeaseCheckpointer {
  private readonly o: Required<Omit<CheckpointerOptions, 'registry'>>;
  private savedAt = -1;
  /** The last save failed (logged once until one succeeds). */
  private failing = false;
  private readonly saves;
  private readonly bytes;

  constructor(o: CheckpointerOptions) {
    this.o = {
      leases: o.leases,
      storage: o.storage,
      intervalMs: o.intervalMs ?? DEFAULT_CHECKPOINT_INTERVAL_MS,
      clock: o.clock ?? systemClock,
      log: o.log ?? silentLogger(),
    };
    this.saves = o.registry
      ? counter(o.registry, {
          name: 'proxy_operator_lease_checkpoints_total',
          help: 'Lease checkpoints saved (result=success) or failed (result=error).',
          labelNames: ['result'] as const,
        })
      : undefined;
    this.bytes = o.registry
      ? gauge(o.registry, {
          name: 'proxy_operator_lease_checkpoint_bytes',
          help: 'Size of the last lease checkpoint saved.',
        })
      : undefined;
  }

  /**
   * Loads the last checkpoint into the store. A damaged one is refused whole and logged: serving
   * from an empty store beats not serving at all, and the next save replaces it.
   */
  async restore(signal: AbortSignal): Promise<{ leases: number; proxies: number }> {
    const { storage, leases, log } = this.o;
    const text = await storage.load(signal);
    if (text === undefined) {
      log.info({ where: storage.where }, 'no lease checkpoint yet; starting with no leases or cooldowns');
      return { leases: 0, proxies: 0 };
    }
    let restored: { leases: number; proxies: number };
    let asOf: number;
    try {
      const state = parseLeaseState(text);
      asOf = state.at;
      restored = leases.restoreState(state);
    } catch (err) {
      log.error({ err, where: storage.where }, 'lease checkpoint unreadable; starting without it');
      return { leases: 0, proxies: 0 };
    }
    this.savedAt = leases.changes;
    // `asOf` says what a crash may have lost: decisions made after it.
    log.info(
      { where: storage.where, ...restored, asOf: new Date(asOf).toISOString() },
      'restored leases and cooldowns from the checkpoint',
    );
    return restored;
  }

  /** Saves now if anything changed since the last save; false when the save failed. */
  async save(signal: AbortSignal): Promise<boolean> {
    const { storage, leases, log } = this.o;
    const changes = leases.changes;
    if (changes === this.savedAt) return true;
    const text = JSON.stringify(leases.exportState());
    try {
      await storage.save(text, signal);
      this.savedAt = changes;
      this.saves?.inc({ result: 'success' });
      this.bytes?.set(Buffer.byteLength(text));
      if (this.failing) log.info({ where: storage.where }, 'lease checkpoint saved again');
      this.failing = false;
      return true;
    } catch (err) {
      this.saves?.inc({ result: 'error' });
      // Once per outage, not every interval: a full disk would otherwise log every few seconds.
      if (!this.failing)
        log.warn(
          { err, where: storage.where },
          'saving the lease checkpoint failed; retrying every interval',
        );
      this.failing = true;
      return false;
    }
  }

  /** Saves every interval until `signal` aborts; the final save is the caller's (see `stepDown`). */
  async run(signal: AbortSignal): Promise<void> {
    const { clock, intervalMs } = this.o;
    while (!signal.aborted) {
      await new Promise<void>((resolve) => {
        const t = clock.setTimeout(done, intervalMs);
        function done() {
          clock.clearTimeout(t);
          signal.removeEventListener('abort', done);
          resolve();
        }
        signal.addEventListener('abort', done, { once: true });
      });
      if (signal.aborted) return;
      await this.save(signal);
    }
  }
}
