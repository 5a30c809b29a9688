/**
 * dashboard/snapshot-events — events read off two successive lease-store snapshots: health
 * flips, a new or longer cooldown for a target (a `blocked` report) and a new or longer global
 * cooldown (a `failed` report). Observing snapshots keeps the lease API's own paths untouched.
 */
import type { ProxySnapshot } from '../lease/types.ts';
import type { EventKind } from './web/types.ts';

/** What the previous snapshot said about one proxy. */
export interface Observed {
  healthy: boolean;
  cooldownUntil: number;
  targets: Map<string, number>;
}

export interface DerivedEvent {
  kind: EventKind;
  /** "namespace/name" of the proxy, null for a pool's event. */
  proxy: string | null;
  message: string;
}

/** A cooldown renewed by less than this is the same cooldown (timestamps are rounded). */
const SAME_COOLDOWN_MS = 1000;

export function observe(s: ProxySnapshot): Observed {
  const targets = new Map<string, number>();
  for (const c of s.targetCooldowns) targets.set(c.target, Date.parse(c.until));
  return { healthy: s.healthy, cooldownUntil: s.cooldownUntil ? Date.parse(s.cooldownUntil) : 0, targets };
}

function timeLeft(until: number, now: number): string {
  const s = Math.max(0, Math.round((until - now) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

/** The events between `before` and `now` for one proxy (none for a proxy seen the first time). */
export function snapshotEvents(
  key: string,
  before: Observed | undefined,
  now: Observed,
  latencyMillis: number | null,
  at: number,
): DerivedEvent[] {
  if (!before) return [];
  const out: DerivedEvent[] = [];
  if (before.healthy !== now.healthy) {
    out.push(
      now.healthy
        ? {
            kind: 'healthy',
            proxy: key,
            message: `healthy${latencyMillis !== null ? ` (${Math.round(latencyMillis)} ms)` : ''}`,
          }
        : {
            kind: 'unhealthy',
            proxy: key,
            message: 'unhealthy: no new leases until it passes its probes again',
          },
    );
  }
  if (now.cooldownUntil > at && now.cooldownUntil > before.cooldownUntil + SAME_COOLDOWN_MS) {
    out.push({
      kind: 'failed',
      proxy: key,
      message: `reported failed: cooling down for every target, ${timeLeft(now.cooldownUntil, at)} left`,
    });
  }
  for (const [target, until] of now.targets) {
    const was = before.targets.get(target) ?? 0;
    if (until > at && until > was + SAME_COOLDOWN_MS) {
      out.push({
        kind: 'blocked',
        proxy: key,
        message: `blocked by ${target}: cooling down for it, ${timeLeft(until, at)} left`,
      });
    }
  }
  return out;
}
