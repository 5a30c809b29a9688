/**
 * lease/durable — the lease store's durable state as one compact JSON document: live leases,
 * per-proxy global and per-target cooldowns, drain start times and recently ended leases (still
 * reportable). Records are positional arrays to keep a 100,000-cooldown checkpoint small; the
 * parser checks every field, so a damaged checkpoint is refused as a whole, never half-applied.
 */
import { LeaseStateError } from './errors.ts';

export const LEASE_STATE_VERSION = 1;

/**
 * [id, proxy key, proxy uid, target or null, expiresAt ms, instance (providerID) it was granted
 * on — absent in checkpoints written before drains counted leases per instance, digest of the
 * lease's own password — only for leases on proxies that check credentials per lease].
 */
export type LeaseRecord = [string, string, string, string | null, number, string?, string?];
/** [proxy key, proxy uid, global cooldown end ms (0 = none), draining since ms (0 = not), [[target, until ms], …]]. */
export type ProxyRecord = [string, string, number, number, [string, number][]];
/** [id, proxy key, proxy uid, target or null, ended at ms]. */
export type EndedRecord = [string, string, string, string | null, number];

export interface LeaseState {
  v: typeof LEASE_STATE_VERSION;
  /** When it was taken (ms since the epoch). */
  at: number;
  leases: LeaseRecord[];
  proxies: ProxyRecord[];
  ended: EndedRecord[];
}

const isStr = (v: unknown): v is string => typeof v === 'string';
const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;

function checkLeaseLike(r: unknown, where: string): void {
  if (
    !Array.isArray(r) ||
    r.length < 5 ||
    r.length > 7 ||
    !r.slice(5).every(isStr) ||
    !isStr(r[0]) ||
    !isStr(r[1]) ||
    !isStr(r[2]) ||
    !(r[3] === null || isStr(r[3])) ||
    !isTime(r[4])
  ) {
    throw new LeaseStateError(`${where} is not [id, key, uid, target, time]`);
  }
}

function checkProxy(r: unknown, where: string): void {
  if (!Array.isArray(r) || r.length !== 5 || !isStr(r[0]) || !isStr(r[1]) || !isTime(r[2]) || !isTime(r[3])) {
    throw new LeaseStateError(`${where} is not [key, uid, cooldownUntil, drainingSince, targets]`);
  }
  const targets = r[4];
  if (!Array.isArray(targets)) throw new LeaseStateError(`${where}.targets is not a list`);
  for (const t of targets) {
    if (!Array.isArray(t) || t.length !== 2 || !isStr(t[0]) || !isTime(t[1])) {
      throw new LeaseStateError(`${where}.targets has an entry that is not [target, until]`);
    }
  }
}

/** Parses and checks a checkpoint document; throws LeaseStateError naming the first bad field. */
export function parseLeaseState(text: string): LeaseState {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new LeaseStateError('not valid JSON');
  }
  if (typeof doc !== 'object' || doc === null) throw new LeaseStateError('not an object');
  const d = doc as Record<string, unknown>;
  if (d.v !== LEASE_STATE_VERSION) throw new LeaseStateError(`unknown version ${String(d.v)}`);
  if (!isTime(d.at)) throw new LeaseStateError('at is not a time');
  for (const k of ['leases', 'proxies', 'ended'] as const) {
    if (!Array.isArray(d[k])) throw new LeaseStateError(`${k} is not a list`);
  }
  for (const [i, r] of (d.leases as unknown[]).entries()) checkLeaseLike(r, `leases[${i}]`);
  for (const [i, r] of (d.proxies as unknown[]).entries()) checkProxy(r, `proxies[${i}]`);
  for (const [i, r] of (d.ended as unknown[]).entries()) checkLeaseLike(r, `ended[${i}]`);
  return d as unknown as LeaseState;
}

export function emptyLeaseState(at: number): LeaseState {
  return { v: LEASE_STATE_VERSION, at, leases: [], proxies: [], ended: [] };
}
