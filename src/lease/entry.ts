/**
 * lease/entry — one proxy as the lease store holds it, and the one rule that decides whether it
 * may be leased now: `notLeasableReason` names the first rule a proxy fails, and a proxy is
 * eligible exactly when it names none. Grants, snapshots and the refusal funnel (lease/census,
 * through `standingOf`) all go by it.
 */
import { phaseServes } from '../api/proxy.ts';
import type {
  CooldownOrigin,
  DrainingInstanceInfo,
  NotLeasableReason,
  ProxyInfo,
  ProxySnapshot,
} from './types.ts';

/** One per-target cooldown: kept in its entry's map and in the fleet-wide heap (lease/target-cooldowns). */
export interface TargetCooldown {
  at: number;
  target: string;
  entry: Entry;
  /** Set when it was taken on from another proxy on the same egress address; undefined for its own. */
  from: CooldownOrigin | undefined;
  /** Position in the heap of lease/target-cooldowns. */
  heapIndex: number;
}

/** A proxy's facts (credentials folded into `url`) plus its lease state. */
export interface Entry
  extends Omit<ProxyInfo, 'credentials' | 'latencyMillis' | 'problem' | 'instance' | 'drainingInstances'> {
  problem: ProxyInfo['problem'];
  /** What selectors match: `labels` plus the location's topology keys (api/location). */
  selectable: Readonly<Record<string, string>>;
  /** providerID of the serving instance ('' when unknown, e.g. External proxies). */
  instance: string;
  drainingInstances: DrainingInstanceInfo[];
  /** Live leases per instance they were granted on: what a drain waits for. */
  activeByInstance: Map<string, number>;
  /** true once the health engine has spoken: its verdicts win over the status condition. */
  healthFromVerdict: boolean;
  url: string;
  latencyMillis: number | undefined;
  active: number;
  /** Grant sequence number of the last grant (0 = never): strict "least recently leased". */
  lastLeasedSeq: number;
  lastLeasedAt: number | undefined;
  globalUntil: number;
  /** Per-target cooldowns by target; owned by lease/target-cooldowns, which purges ended ones. */
  targetUntil: Map<string, TargetCooldown>;
  /** When the lease store first saw this proxy draining (0 = not draining): the drain deadline counts from it. */
  drainingSince: number;
  /** In the store's views (eligible when last updated). */
  indexed: boolean;
  /** Where the views' censuses count it (lease/census); undefined while uncounted. */
  standing: Standing | undefined;
  removed: boolean;
}

export function newEntry(info: Pick<ProxyInfo, 'key' | 'namespace' | 'name' | 'uid'>): Entry {
  return {
    key: info.key,
    namespace: info.namespace,
    name: info.name,
    uid: info.uid,
    labels: {},
    selectable: {},
    phase: '',
    healthy: false,
    healthFromVerdict: false,
    draining: false,
    deleting: false,
    maxLeases: 0,
    host: '',
    port: 0,
    url: '',
    problem: undefined,
    instance: '',
    drainingInstances: [],
    activeByInstance: new Map(),
    latencyMillis: undefined,
    active: 0,
    lastLeasedSeq: 0,
    lastLeasedAt: undefined,
    globalUntil: 0,
    targetUntil: new Map(),
    drainingSince: 0,
    indexed: false,
    standing: undefined,
    removed: false,
  };
}

/** Counts a lease granted on (delta 1) or released from (delta -1) `instance` of `e`. */
export function countLease(e: Entry, instance: string, delta: number): void {
  const n = (e.activeByInstance.get(instance) ?? 0) + delta;
  if (n > 0) e.activeByInstance.set(instance, n);
  else e.activeByInstance.delete(instance);
}

/** Grant order: least recently leased, then lowest latency (unknown last), then name. */
export function compareEntries(a: Entry, b: Entry): number {
  if (a.lastLeasedSeq !== b.lastLeasedSeq) return a.lastLeasedSeq - b.lastLeasedSeq;
  const la = a.latencyMillis ?? Number.POSITIVE_INFINITY;
  const lb = b.latencyMillis ?? Number.POSITIVE_INFINITY;
  if (la !== lb) return la < lb ? -1 : 1;
  if (a.name !== b.name) return a.name < b.name ? -1 : 1;
  if (a.namespace !== b.namespace) return a.namespace < b.namespace ? -1 : 1;
  return 0;
}

/** Whether `e` is cooling down for `target` (ended cooldowns are purged by lease/target-cooldowns). */
export function coolingFor(e: Entry, target: string, now: number): boolean {
  const c = e.targetUntil.get(target);
  return c !== undefined && c.at > now;
}

/**
 * The first leasing rule `e` fails, or undefined when it may be leased (for `target`, when
 * given). Serving follows `phaseServes` (api/proxy) at the address the feed derived; a proxy
 * being deleted serves nowhere.
 */
export function notLeasableReason(
  e: Entry,
  target: string | undefined,
  now: number,
): NotLeasableReason | undefined {
  if (e.deleting) return 'Deleting';
  if (!phaseServes(e.phase) || e.host === '') return 'NotReady';
  if (!e.healthy) return 'Unhealthy';
  if (e.draining) return 'Draining';
  if (e.globalUntil > now) return 'CoolingDown';
  if (target !== undefined && coolingFor(e, target, now)) return 'CoolingDownForTarget';
  if (e.maxLeases > 0 && e.active >= e.maxLeases) return 'AtCapacity';
  return undefined;
}

/** Where an entry stands in the refusal funnel (lease/census), target cooldowns aside. */
export type Standing = 'notReady' | 'unhealthy' | 'draining' | 'coolingDown' | 'atCapacity' | 'leasable';

/** The standing of `e` now; undefined for an entry the store has let go of. */
export function standingOf(e: Entry, now: number): Standing | undefined {
  if (e.removed) return undefined;
  switch (notLeasableReason(e, undefined, now)) {
    case 'Deleting':
    case 'NotReady':
      return 'notReady';
    case 'Unhealthy':
      return 'unhealthy';
    case 'Draining':
      return 'draining';
    case 'CoolingDown':
      return 'coolingDown';
    case 'AtCapacity':
      return 'atCapacity';
    default:
      return 'leasable';
  }
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

/** The public view of `e`; target cooldowns that have ended are left out. */
export function snapshotOf(e: Entry, target: string | undefined, now: number): ProxySnapshot {
  const reason = notLeasableReason(e, target, now) ?? null;
  const snap: ProxySnapshot = {
    namespace: e.namespace,
    name: e.name,
    phase: e.phase,
    healthy: e.healthy,
    draining: e.draining,
    deleting: e.deleting,
    host: e.host || null,
    port: e.host ? e.port : null,
    egressIP: e.egressIP ?? null,
    latencyMillis: e.latencyMillis ?? null,
    activeLeases: e.active,
    maxLeases: e.maxLeases,
    lastLeasedAt: e.lastLeasedAt === undefined ? null : iso(e.lastLeasedAt),
    cooldownUntil: e.globalUntil > now ? iso(e.globalUntil) : null,
    targetCooldowns: [...e.targetUntil.values()]
      .filter((c) => c.at > now)
      .sort((a, b) => (a.target < b.target ? -1 : 1))
      .map((c) => ({ target: c.target, until: iso(c.at) })),
    leasable: reason === null,
    reason,
    problem: e.problem ? { ...e.problem } : null,
  };
  if (e.location) snap.location = { ...e.location };
  if (e.drainingInstances.length > 0) {
    snap.drainingInstances = e.drainingInstances.map((d) => ({
      host: d.host,
      port: d.port,
      since: d.since,
      activeLeases: e.activeByInstance.get(d.providerID) ?? 0,
    }));
  }
  return snap;
}
