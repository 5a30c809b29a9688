/**
 * health/status-writer — persists verdicts to Proxy status: the `Healthy` condition only on a
 * transition, status.health on a transition or (at most once a minute) when the latency moved
 * a lot. Every write is preconditioned on resourceVersion, so the reconciler's conditions are
 * never clobbered; a Conflict re-reads and writes again (runtime/retry). A proxy gone means
 * there is nothing to write.
 */
import { findCondition, setCondition } from '../api/conditions.ts';
import { CONDITION_HEALTHY } from '../api/constants.ts';
import { type Condition, parseKey } from '../api/meta.ts';
import type { ProxyObject, ReplacementHealth } from '../api/proxy.ts';
import type { Logger } from '../log/index.ts';
import type { Clock } from '../runtime/clock.ts';
import { retryOnConflict } from '../runtime/retry.ts';
import { isNotFound, type ObjectStore } from '../runtime/store.ts';
import { latencyMovedALot, REASON_NOT_SERVING, REASON_PROBE_SUCCEEDED } from './policy.ts';
import type { ProbedInstance } from './probed-instance.ts';

/** Status writes of latency alone: at most this often per proxy. */
export const LATENCY_WRITE_MIN_INTERVAL_MS = 60_000;

export interface HealthStatusWriterOptions {
  store: ObjectStore;
  clock: Clock;
  log: Logger;
  /** False once the target was removed or replaced: its write is dropped. */
  isCurrent(t: ProbedInstance): boolean;
}

export class HealthStatusWriter {
  private readonly opts: HealthStatusWriterOptions;
  /** At most one write per target at a time; a newer verdict is written by the next probe. */
  private readonly writing = new Map<ProbedInstance, Promise<void>>();
  private count = 0;

  constructor(opts: HealthStatusWriterOptions) {
    this.opts = opts;
  }

  /** Status writes done. */
  get writes(): number {
    return this.count;
  }

  resetStats(): void {
    this.count = 0;
  }

  /** The verdict of `t` changed: status must follow. */
  verdictChanged(t: ProbedInstance): void {
    t.status.version++;
  }

  /** A healthy probe measured `latencyMs`: worth a write when it moved a lot, once a minute. */
  latencyObserved(t: ProbedInstance, latencyMs: number, now: number): void {
    const s = t.status;
    if (
      latencyMovedALot(s.latencyWritten, latencyMs) &&
      now - s.latencyWrittenAt >= LATENCY_WRITE_MIN_INTERVAL_MS
    ) {
      s.latencyDirty = true;
    }
  }

  /** Starts a write when one is due and none is running for `t`; failures wait for the next probe. */
  maybeWrite(t: ProbedInstance, signal: AbortSignal): void {
    if (this.writing.has(t) || t.verdict.healthy === undefined) return;
    if (t.status.version === t.status.writtenVersion && !t.status.latencyDirty) return;
    const p = this.write(t, signal)
      .catch((err) => {
        this.opts.log.warn({ proxy: t.key, err }, 'health status write failed; retrying on the next probe');
      })
      .finally(() => this.writing.delete(t));
    this.writing.set(t, p);
  }

  /** Waits for the writes in flight. */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.writing.values(), ...this.unserved.values()]);
  }

  private readonly unserved = new Map<string, Promise<void>>();

  /**
   * Healthy=Unknown (NotServing) on Proxy `key` of `uid`: the verdict in status was about an
   * instance that no longer serves there. `stillUnjudged` says whether that is still so when the
   * write happens (a new instance may have passed meanwhile; its verdict wins).
   */
  notServing(
    key: string,
    uid: string,
    message: string,
    stillUnjudged: () => boolean,
    signal: AbortSignal,
  ): void {
    if (this.unserved.has(key)) return;
    const { store, clock } = this.opts;
    const ref = parseKey(key);
    const attempt = async (obj: ProxyObject | undefined): Promise<void> => {
      if (!obj || obj.metadata.uid !== uid || obj.metadata.deletionTimestamp || !stillUnjudged()) return;
      const c = findCondition(obj.status?.conditions, CONDITION_HEALTHY);
      if (!c || (c.status === 'Unknown' && c.reason === REASON_NOT_SERVING)) return;
      const conditions = setCondition(
        obj.status?.conditions,
        { type: CONDITION_HEALTHY, status: 'Unknown', reason: REASON_NOT_SERVING, message },
        new Date(clock.now()),
      );
      await store.proxies.patchStatus(
        ref,
        { conditions, health: { latencyMillis: null, consecutiveFailures: 0, lastError: null } },
        { resourceVersion: obj.metadata.resourceVersion, signal },
      );
      this.count++;
    };
    const p = retryOnConflict(store.proxies.get(ref), attempt, () => store.proxies.read(ref, { signal }), {
      signal,
    })
      .catch((err) => {
        if (!isNotFound(err) && !signal.aborted) {
          this.opts.log.warn({ proxy: key, err }, 'health status write (not serving) failed');
        }
      })
      .finally(() => this.unserved.delete(key));
    this.unserved.set(key, p);
  }

  /** Writes status.replacementHealth, unless the pending instance changed or it says the same already. */
  private async writeReplacement(
    t: ProbedInstance,
    obj: ProxyObject,
    healthy: boolean,
    version: number,
    now: number,
    signal: AbortSignal,
  ): Promise<void> {
    const key = parseKey(t.proxyKey);
    const stored = obj.status?.replacementHealth;
    if (obj.status?.pending?.providerID !== t.instance) {
      t.status.writtenVersion = version; // switched or abandoned: nothing to say
      return;
    }
    if (stored?.providerID === t.instance && stored.healthy === healthy && (healthy || !t.last.message)) {
      t.status.writtenVersion = version; // e.g. after a restart: already said
      return;
    }
    const replacementHealth = replacementHealthOf(t, healthy, now);
    await this.opts.store.proxies.patchStatus(
      key,
      { replacementHealth },
      { resourceVersion: obj.metadata.resourceVersion, signal },
    );
    this.count++;
    t.status.writtenVersion = version;
  }

  private async write(t: ProbedInstance, signal: AbortSignal): Promise<void> {
    const { store, clock } = this.opts;
    // What is written is the state when the write starts, whatever a retry re-reads.
    const version = t.status.version;
    const verdictWrite = version !== t.status.writtenVersion;
    const healthy = t.verdict.healthy === true;
    const health = healthField(t, healthy);
    const now = clock.now();
    const key = parseKey(t.proxyKey);
    const attempt = async (obj: ProxyObject | undefined): Promise<void> => {
      if (!obj || obj.metadata.uid !== t.uid || !this.opts.isCurrent(t)) return; // gone or replaced
      if (t.role === 'replacement') {
        await this.writeReplacement(t, obj, healthy, version, now, signal);
        return;
      }
      const patch: Record<string, unknown> = { health };
      if (verdictWrite) {
        const desired = desiredCondition(t, healthy);
        const existing = obj.status?.conditions?.find((c) => c.type === CONDITION_HEALTHY);
        if (
          version === 1 &&
          !t.status.latencyDirty &&
          existing?.status === desired.status &&
          existing.reason === desired.reason
        ) {
          // First verdict after a restart that matches what is stored: nothing to write.
          t.status.writtenVersion = version;
          t.status.latencyWrittenAt = now;
          return;
        }
        patch.conditions = setCondition(obj.status?.conditions, desired, new Date(now));
      }
      await store.proxies.patchStatus(key, patch, { resourceVersion: obj.metadata.resourceVersion, signal });
      this.count++;
      t.status.writtenVersion = version;
      t.status.latencyDirty = false;
      if (healthy) {
        t.status.latencyWritten = t.last.latencyMs;
        t.status.latencyWrittenAt = now;
      }
    };
    try {
      await retryOnConflict(store.proxies.get(key), attempt, () => store.proxies.read(key, { signal }), {
        signal,
      });
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
  }
}

/** The verdict on status.pending, as status.replacementHealth (the reconciler switches on it). */
function replacementHealthOf(t: ProbedInstance, healthy: boolean, now: number): Record<string, unknown> {
  const rh: Omit<ReplacementHealth, 'lastError'> & { lastError: string | null } = {
    providerID: t.instance,
    healthy,
    lastProbeTime: new Date(t.last.time ?? now).toISOString(),
    // A merge patch: null clears the error of an earlier failing verdict.
    lastError: !healthy && t.last.message ? `${t.last.reason ?? 'ProbeFailed'}: ${t.last.message}` : null,
  };
  return rh;
}

/** status.health as of the last counted probe; nulls clear what no longer applies. */
function healthField(t: ProbedInstance, healthy: boolean): Record<string, unknown> {
  return {
    latencyMillis: healthy && t.last.latencyMs !== undefined ? t.last.latencyMs : null,
    lastProbeTime: t.last.time !== undefined ? new Date(t.last.time).toISOString() : null,
    consecutiveFailures: t.verdict.consecutiveFailures,
    lastError: healthy ? null : (t.last.message ?? null),
  };
}

function desiredCondition(t: ProbedInstance, healthy: boolean): Omit<Condition, 'lastTransitionTime'> {
  return {
    type: CONDITION_HEALTHY,
    status: healthy ? 'True' : 'False',
    reason: t.last.reason ?? (healthy ? REASON_PROBE_SUCCEEDED : 'ProbeFailed'),
    message: t.last.message ?? '',
  };
}
