/**
 * lease/lease — one lease as the store holds it, and the small rules about a single lease: its
 * id, and when the drain that limits its renewals began.
 */
import { randomFillSync } from 'node:crypto';
import type { LateReports } from './ended.ts';
import type { Entry } from './entry.ts';
import type { LeaseVia } from './types.ts';

export interface Lease {
  id: string;
  entry: Entry;
  target: string | undefined;
  /** The instance (providerID) the proxy served from at the grant: a drain waits for it. */
  instance: string;
  expiresAt: number;
  /** When it was granted (ms); absent when restored from a checkpoint, which does not keep it. */
  grantedAt?: number;
  /** Who asked for it; absent when restored from a checkpoint. */
  via?: LeaseVia;
  /**
   * Digest of the lease's own password (lease/lease-credentials) when its proxy is served per
   * lease; absent when the grant handed out the proxy's credentials.
   */
  secret?: string;
  /** Who may report it once it has ended: where lease/lease-table keeps it then. */
  lateReports: LateReports;
  /** Position in the expiry heap (-1 when not in it). */
  heapIndex: number;
}

const HEX_CODES = Array.from('0123456789abcdef', (c) => c.charCodeAt(0));
/** Random bytes drawn in blocks: one system call per 256 ids. */
const randomPool = Buffer.alloc(16 * 256);
let randomOffset = randomPool.length;
const idBytes = Buffer.alloc(36);

/**
 * A random (version 4) UUID, written byte by byte into one buffer and read out as one flat
 * string: `randomUUID()` assembles its string from many small pieces, and kept as such a tree
 * (live and ended leases keep their ids) it costs ~600 bytes instead of ~60; flattening it
 * afterwards cost more than drawing the id (docs/benchmarks.md).
 */
export function newLeaseId(): string {
  if (randomOffset === randomPool.length) {
    randomFillSync(randomPool);
    randomOffset = 0;
  }
  const r = randomOffset;
  randomOffset += 16;
  randomPool[r + 6] = (randomPool[r + 6]! & 0x0f) | 0x40;
  randomPool[r + 8] = (randomPool[r + 8]! & 0x3f) | 0x80;
  let at = 0;
  for (let i = 0; i < 16; i++) {
    if (i === 4 || i === 6 || i === 8 || i === 10) idBytes[at++] = 0x2d;
    const b = randomPool[r + i]!;
    idBytes[at++] = HEX_CODES[b >> 4]!;
    idBytes[at++] = HEX_CODES[b & 15]!;
  }
  return idBytes.toString('latin1', 0, 36);
}

let lastIsoMillis = Number.NaN;
let lastIso = '';

/** ISO 8601 of `ms`; the last answer is kept, as grants in one millisecond share their expiry. */
export function iso(ms: number): string {
  if (ms !== lastIsoMillis) {
    lastIso = new Date(ms).toISOString();
    lastIsoMillis = ms;
  }
  return lastIso;
}

/** When the drain that concerns a lease on `instance` began (ms), or 0 when nothing drains it. */
export function drainStart(e: Entry, instance: string): number {
  if (e.draining && e.drainingSince > 0) return e.drainingSince;
  if (instance === '' || instance === e.instance) return 0;
  const d = e.drainingInstances.find((x) => x.providerID === instance);
  return d ? Date.parse(d.since) : 0;
}
