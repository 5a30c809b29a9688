/**
 * lease/checkpoint — makes the lease store's decisions durable: restores the last checkpoint
 * before the store serves, then saves one every interval (only when something changed) and a
 * last one at step-down, so a graceful handover loses nothing and a crash at most one interval.
 * Where a checkpoint lives is the mode's business (`CheckpointStorage`): a file beside the
 * standalone state file, ConfigMaps in the operator namespace in a cluster.
 *
 * A damaged checkpoint is never passed over silently: that would drop every cooldown, and the
 * next save would overwrite the evidence. `restore` refuses it (LeaseCheckpointDamagedError)
 * unless told to discard it, and then keeps the damaged copy aside before starting empty.
 */
import type { Registry } from 'prom-client';
import { type Logger, silentLogger } from '../log/index.ts';
import { counter, gauge } from '../metrics/register.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { parseLeaseState } from './durable.ts';
import { LeaseCheckpointDamagedError, LeaseStateError } from './errors.ts';
import type { LeaseStore } from './store.ts';

export const DEFAULT_CHECKPOINT_INTERVAL_MS = 5_000;

export interface CheckpointStorage {
  /** Where, for logs (no secrets: paths and object names only). */
  readonly where: string;
  /**
   * The last checkpoint saved, or undefined when there is none. Throws LeaseStateError when
   * what is stored is damaged beyond the document (a ConfigMap set whose shards disagree), any
   * other error when the store cannot be read now (retried).
   */
  load(signal: AbortSignal): Promise<string | undefined>;
  /**
   * Keeps a damaged checkpoint, exactly as stored, where no save overwrites it, named after
   * `at` (ms); resolves to where it went.
   */
  setAside(at: number, signal: AbortSignal): Promise<string>;
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
   * Loads the last checkpoint into the store. A damaged one is refused whole: it throws
   * LeaseCheckpointDamagedError naming it and leaves it untouched, or with `discard` keeps it
   * aside (CheckpointStorage.setAside) and starts empty, with a warning naming both places.
   * Any other error means the store could not be read now: the caller retries.
   */
  async restore(
    signal: AbortSignal,
    opts: { discard?: boolean } = {},
  ): Promise<{ leases: number; proxies: number }> {
    const { storage, leases, log, clock } = this.o;
    let state: ReturnType<typeof parseLeaseState> | undefined;
    let damage: LeaseStateError | undefined;
    try {
      const text = await storage.load(signal);
      if (text !== undefined) state = parseLeaseState(text);
    } catch (err) {
      if (!(err instanceof LeaseStateError)) throw err;
      damage = err;
    }
    if (damage) {
      if (!opts.discard) throw new LeaseCheckpointDamagedError(storage.where, damage);
      const keptAt = await storage.setAside(clock.now(), signal);
      log.warn(
        { where: storage.where, keptAt, damage: damage.message },
        'lease checkpoint damaged; --discard-lease-state: starting with NO leases or cooldowns (the damaged copy is kept aside)',
      );
      return { leases: 0, proxies: 0 };
    }
    if (state === undefined) {
      log.info({ where: storage.where }, 'no lease checkpoint yet; starting with no leases or cooldowns');
      return { leases: 0, proxies: 0 };
    }
    const restored = leases.restoreState(state);
    const asOf = state.at;
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

/** `at` as a compact UTC stamp for names of kept copies: `20260101t120000z`. */
export function asideStamp(at: number): string {
  return new Date(at)
    .toISOString()
    .replace(/\.\d+Z$/, 'z')
    .replace(/[-:]/g, '')
    .toLowerCase();
}
