/**
 * pool/members — what the pool controller knows about each Proxy of a pool, read from the Proxy
 * alone (pure): whether it serves, passed its health checks, can be leased, was made from the
 * current template, when age rotation is due, whether it is already draining away, and where an
 * in-place restart for a new IP (rotation strategy Restart) stands.
 */
import { createHash } from 'node:crypto';
import {
  ANNOTATION_POOL_DRAIN_SINCE,
  ANNOTATION_POOL_TEMPLATE_HASH,
  ANNOTATION_RESTART_REQUESTED,
  CONDITION_HEALTHY,
} from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import { type ProxyObject, servingEndpoint } from '../api/proxy.ts';
import { DEFAULT_ROTATION_JITTER, parseDurationMs, type Rotation } from '../api/proxypool.ts';

export interface Member {
  proxy: ProxyObject;
  key: string;
  /** Its instance serves (Ready or Replacing with an address). */
  ready: boolean;
  /** Ready, and the health engine's Healthy condition is True. */
  healthy: boolean;
  /** Healthy and not draining: what crawlers can lease (cooldowns and maxLeases aside). */
  leasable: boolean;
  /** Made from the pool's current template. */
  current: boolean;
  /** When age rotation replaces it (ms since the epoch); Infinity without rotation. */
  rotateAtMs: number;
  /** Created at (ms since the epoch). */
  bornMs: number;
  /** Picked for removal: gets no new leases since then (ms); undefined otherwise. */
  drainingSinceMs: number | undefined;
  /** Being deleted (its instance is going). */
  deleting: boolean;
  /** Live leases on its instances. */
  leases: number;
  /** Asked to restart in place (the restart-requested annotation), until the pool lifts it. */
  restarting: boolean;
  /** Its instance runs again after the requested restart (status.restart Done for the request). */
  restartDone: boolean;
  /** When it did (status.restart.finishedAt, ms); NaN otherwise. */
  restartDoneAtMs: number;
  /** The requested restart failed (status.restart Failed for the request): replaced instead. */
  restartFailed: boolean;
}

/**
 * The fixed per-proxy factor r in [0, 1) of the rotation jitter: a digest of the UID, so every
 * replica of the operator and every restart picks the same moment for the same Proxy.
 */
export function jitterFactor(uid: string): number {
  return createHash('sha256').update(uid).digest().readUInt32BE(0) / 2 ** 32;
}

/** When a Proxy born at `bornMs` is recycled: maxAge × (1 − jitter × r) later. */
export function rotationDue(rotation: Rotation | undefined, uid: string, bornMs: number): number {
  if (!rotation) return Number.POSITIVE_INFINITY;
  const maxAge = parseDurationMs(rotation.maxAge);
  if (!Number.isFinite(maxAge)) return Number.POSITIVE_INFINITY;
  const jitter = rotation.jitter ?? DEFAULT_ROTATION_JITTER;
  return bornMs + Math.round(maxAge * (1 - jitter * jitterFactor(uid)));
}

function healthyCondition(p: ProxyObject): boolean {
  return p.status?.conditions?.some((c) => c.type === CONDITION_HEALTHY && c.status === 'True') === true;
}

/** Live leases on any instance the Proxy serves or drains. */
function leasesOnProxy(p: ProxyObject, leasesOn: (key: string, providerID: string) => number): number {
  const key = keyOf(p);
  const ids = new Set<string>();
  if (p.status?.providerID) ids.add(p.status.providerID);
  for (const d of p.status?.draining ?? []) ids.add(d.providerID);
  let n = 0;
  for (const id of ids) n += leasesOn(key, id);
  return n;
}

export interface MemberInputs {
  templateHash: string;
  rotation: Rotation | undefined;
  leasesOn: (key: string, providerID: string) => number;
}

/** When the Proxy last got a new IP in place (status.restart Done), ms; NaN when never. */
function lastRestartMs(p: ProxyObject): number {
  const r = p.status?.restart;
  return r?.phase === 'Done' && r.finishedAt ? Date.parse(r.finishedAt) : Number.NaN;
}

export function memberOf(p: ProxyObject, inputs: MemberInputs): Member {
  const annotations = p.metadata.annotations ?? {};
  const requested = annotations[ANNOTATION_RESTART_REQUESTED];
  const answer =
    requested !== undefined && p.status?.restart?.requestedAt === requested ? p.status.restart : undefined;
  const deleting = p.metadata.deletionTimestamp !== undefined;
  const ready = servingEndpoint(p) !== undefined;
  const healthy = ready && healthyCondition(p);
  const drainSince = annotations[ANNOTATION_POOL_DRAIN_SINCE];
  const parsedSince = drainSince !== undefined ? Date.parse(drainSince) : Number.NaN;
  const drainingSinceMs = drainSince === undefined ? undefined : Number.isNaN(parsedSince) ? 0 : parsedSince;
  const born = Date.parse(p.metadata.creationTimestamp ?? '');
  const bornMs = Number.isNaN(born) ? 0 : born;
  // Age rotation counts from the last new IP: creation, or the last in-place restart.
  const restartedMs = lastRestartMs(p);
  const ageFromMs = Number.isNaN(restartedMs) ? bornMs : Math.max(bornMs, restartedMs);
  return {
    proxy: p,
    key: keyOf(p),
    ready,
    healthy,
    leasable: healthy && p.spec.drain !== true && drainingSinceMs === undefined && !deleting,
    current: annotations[ANNOTATION_POOL_TEMPLATE_HASH] === inputs.templateHash,
    rotateAtMs: rotationDue(inputs.rotation, p.metadata.uid ?? p.metadata.name, ageFromMs),
    bornMs,
    drainingSinceMs,
    deleting,
    leases: leasesOnProxy(p, inputs.leasesOn),
    restarting: requested !== undefined,
    restartDone: answer?.phase === 'Done',
    restartDoneAtMs: answer?.phase === 'Done' ? Date.parse(answer.finishedAt ?? '') : Number.NaN,
    restartFailed: answer?.phase === 'Failed',
  };
}

/**
 * Scale-down order (docs/configuration.md): not Ready first, then unhealthy, then the fewest
 * live leases, then the oldest; the name breaks ties so every pass picks the same victims.
 */
export function victimOrder(a: Member, b: Member): number {
  return (
    Number(a.ready) - Number(b.ready) ||
    Number(a.healthy) - Number(b.healthy) ||
    a.leases - b.leases ||
    a.bornMs - b.bornMs ||
    (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)
  );
}
