/**
 * health/probed-instances — the engine's table of probed instances: a serving instance per Proxy
 * (`namespace/name`) and, during a replacement, its pending instance (`…#replacement`). Adding,
 * re-pointing and removing an instance keeps the scheduler, the shared control probes, the
 * credentials source and the per-proxy metric series in step with the table.
 */
import { keyOf } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { Clock } from '../runtime/clock.ts';
import { type ControlProbes, controlKeyOf } from './control.ts';
import type { ProbeCredentialsSource } from './credentials.ts';
import type { HealthMetrics } from './metrics.ts';
import { nextSlot, type ResolvedCheck, scheduleOffset } from './policy.ts';
import { type InstanceRole, newProbedInstance, type ProbedInstance } from './probed-instance.ts';
import type { SlotScheduler } from './scheduler.ts';

export const REPLACEMENT_SUFFIX = '#replacement';

/** The table key of a Proxy's pending replacement. */
export function replacementKey(key: string): string {
  return `${key}${REPLACEMENT_SUFFIX}`;
}

export type Endpoint = { host: string; port: number };

export function sameInstance(t: ProbedInstance, instance: string, endpoint: Endpoint): boolean {
  return t.instance === instance && t.host === endpoint.host && t.port === endpoint.port;
}

export interface InstanceIdentity {
  key: string;
  role: InstanceRole;
  instance: string;
  generation: number | undefined;
  /** The verdict needs the thresholds from Unknown (policy VerdictState.gated). */
  gated: boolean;
}

export interface TargetTableDeps {
  clock: Clock;
  scheduler: SlotScheduler;
  controls: ControlProbes;
  credentials: ProbeCredentialsSource;
  metrics: HealthMetrics;
}

export class ProbedInstanceTable {
  private readonly map = new Map<string, ProbedInstance>();
  private readonly deps: TargetTableDeps;

  constructor(deps: TargetTableDeps) {
    this.deps = deps;
  }

  get size(): number {
    return this.map.size;
  }

  get(key: string): ProbedInstance | undefined {
    return this.map.get(key);
  }

  values(): IterableIterator<ProbedInstance> {
    return this.map.values();
  }

  add(proxy: ProxyObject, id: InstanceIdentity, endpoint: Endpoint, check: ResolvedCheck): ProbedInstance {
    const { clock, controls, scheduler, metrics } = this.deps;
    const namespace = proxy.metadata.namespace ?? '';
    const name = proxy.metadata.name;
    const uid = proxy.metadata.uid ?? keyOf(proxy);
    const t = newProbedInstance({
      ...id,
      proxyKey: keyOf(proxy),
      uid,
      namespace,
      name,
      host: endpoint.host,
      port: endpoint.port,
      check,
      controlKey: controlKeyOf(check),
      storedLatency: id.role === 'serving' ? proxy.status?.health?.latencyMillis : undefined,
      histogram: metrics.duration.labels({ namespace, proxy: name }),
    });
    this.map.set(id.key, t);
    controls.acquire(check);
    // The replacement's own slot, so it does not probe in lockstep with the serving instance.
    const offset = scheduleOffset(
      id.role === 'serving' ? uid : `${uid}${REPLACEMENT_SUFFIX}`,
      check.intervalMs,
    );
    scheduler.add(id.key, check.intervalMs, nextSlot(clock.now(), offset, check.intervalMs));
    return t;
  }

  /** Same instance, maybe a new port or check: re-point it, re-time it when the interval changed. */
  refresh(current: ProbedInstance, uid: string, endpoint: Endpoint, check: ResolvedCheck): void {
    const { clock, controls, scheduler } = this.deps;
    const retime = current.check.intervalMs !== check.intervalMs;
    const oldControl = current.controlKey;
    current.host = endpoint.host;
    current.port = endpoint.port;
    current.check = check;
    current.controlKey = controlKeyOf(check);
    if (oldControl !== current.controlKey) {
      controls.release(oldControl);
      controls.acquire(check);
    }
    if (retime) {
      const offset = scheduleOffset(
        current.role === 'serving' ? uid : `${uid}${REPLACEMENT_SUFFIX}`,
        check.intervalMs,
      );
      scheduler.retime(current.key, check.intervalMs, nextSlot(clock.now(), offset, check.intervalMs));
    }
  }

  /** Drops `key` (only the object with `uid`, when given). */
  remove(key: string, uid: string | undefined): void {
    const { scheduler, credentials, controls, metrics } = this.deps;
    const t = this.map.get(key);
    if (!t || (uid !== undefined && t.uid !== uid)) return;
    this.map.delete(key);
    scheduler.delete(key);
    credentials.forget(key);
    controls.release(t.controlKey);
    if (t.role === 'replacement') return; // its series are the proxy's, shared with the serving instance
    metrics.duration.remove({ namespace: t.namespace, proxy: t.name });
    for (const reason of t.failureReasons) {
      metrics.failures.remove({ namespace: t.namespace, proxy: t.name, reason });
    }
  }
}
