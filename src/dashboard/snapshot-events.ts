/**
 * dashboard/snapshot-events — events read off two successive lease-store snapshots: health
 * flips, a new or longer cooldown for a target (a `blocked` report) and a new or longer global
 * cooldown (a `failed` report). Observing snapshots keeps the lease API's own paths untouched.
 * A cooldown a proxy took on from another proxy on its egress address is not its block: the
 * event names the proxy that was reported, and the proxies that share its address with it.
 */
import type { CooldownOrigin, CooldownOrigins, ProxySnapshot } from '../lease/types.ts';
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

/** A target cooldown that began or lengthened since the last sample, taken on from another proxy. */
export interface SharedBlock {
  /** "namespace/name" of the proxy that took it on. */
  proxy: string;
  target: string;
  until: number;
  from: CooldownOrigin;
}

/** A cooldown renewed by less than this is the same cooldown (timestamps are rounded). */
const SAME_COOLDOWN_MS = 1000;
/** Proxies named in one blocked event; the rest are counted. */
const MAX_NAMED_PEERS = 3;
const NO_ORIGINS: ReadonlyMap<string, CooldownOrigin> = new Map();

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

/**
 * The events between `before` and `now` for one proxy (none for a proxy seen the first time),
 * and the target cooldowns it took on from another proxy (`origins`: by target), left to
 * fleetEvents to attribute.
 */
export function snapshotEvents(
  key: string,
  before: Observed | undefined,
  now: Observed,
  latencyMillis: number | null,
  at: number,
  origins: ReadonlyMap<string, CooldownOrigin> = NO_ORIGINS,
): { events: DerivedEvent[]; blocked: Map<string, DerivedEvent>; shared: SharedBlock[] } {
  const out: DerivedEvent[] = [];
  /** Its own `blocked` events by target (also in `out`). */
  const blocked = new Map<string, DerivedEvent>();
  const shared: SharedBlock[] = [];
  if (!before) return { events: out, blocked, shared };
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
      const from = origins.get(target);
      if (from) {
        shared.push({ proxy: key, target, until, from });
        continue;
      }
      const event: DerivedEvent = {
        kind: 'blocked',
        proxy: key,
        message: `blocked by ${target}: cooling down for it, ${timeLeft(until, at)} left`,
      };
      out.push(event);
      blocked.set(target, event);
    }
  }
  return { events: out, blocked, shared };
}

function named(keys: readonly string[]): string {
  const shown = keys.slice(0, MAX_NAMED_PEERS).join(', ');
  return keys.length > MAX_NAMED_PEERS ? `${shown} and ${keys.length - MAX_NAMED_PEERS} more` : shown;
}

/**
 * The events of one sample over the fleet, and what it observed (the next sample's `previous`).
 * Cooldowns taken on from a blocked proxy on the same egress address join that proxy's
 * `blocked` event ("… with crawl/b on the same egress IP 127.0.0.2"); without one in this sample
 * (the proxy took the address later, or its own cooldown was already longer) each is an event
 * of its own, `shared-block`, saying where it came from.
 */
export function fleetEvents(
  previous: ReadonlyMap<string, Observed>,
  snapshots: readonly ProxySnapshot[],
  origins: CooldownOrigins,
  at: number,
): { observed: Map<string, Observed>; events: DerivedEvent[] } {
  const observed = new Map<string, Observed>();
  const events: DerivedEvent[] = [];
  const shared: SharedBlock[] = [];
  const blocked = new Map<string, DerivedEvent>();
  for (const s of snapshots) {
    const key = `${s.namespace}/${s.name}`;
    const seen = observe(s);
    observed.set(key, seen);
    const found = snapshotEvents(key, previous.get(key), seen, s.latencyMillis, at, origins.get(key));
    events.push(...found.events);
    for (const [target, e] of found.blocked) blocked.set(`${key}\u0000${target}`, e);
    shared.push(...found.shared);
  }
  const peers = new Map<string, { event: DerivedEvent; address: string; keys: string[] }>();
  for (const b of shared) {
    const own = blocked.get(`${b.from.proxy}\u0000${b.target}`);
    if (!own) {
      events.push({
        kind: 'shared-block',
        proxy: b.proxy,
        message: `via ${b.from.address}, blocked on ${b.from.proxy}: cooling down for ${b.target}, ${timeLeft(b.until, at)} left`,
      });
      continue;
    }
    const id = `${b.from.proxy}\u0000${b.target}\u0000${b.from.address}`;
    const group = peers.get(id) ?? { event: own, address: b.from.address, keys: [] };
    group.keys.push(b.proxy);
    peers.set(id, group);
  }
  for (const g of peers.values())
    g.event.message += `, with ${named(g.keys.sort())} on the same egress IP ${g.address}`;
  return { observed, events };
}
