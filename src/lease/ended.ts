/**
 * lease/ended — leases that were released or expired recently, so a crawler that learns late
 * that a site blocked it can still report it (docs/lease-api.md: reports after the fact). Kept
 * by time — `retentionMs` after its end, whatever the release rate — in a byte budget: only
 * when the budget is full is the oldest forgotten early, and `onEvictedEarly` counts it.
 *
 * Entries are compact, because at 1,000 releases a second 15 minutes is 900,000 of them: the id
 * as its 128 bits, the end time, the proxy's entry (a reference shared with the fleet: it
 * carries the key, uid and egress address a report needs) and the target as an index into a
 * table of the distinct targets held. About 44 bytes a lease (~150 as strings in a Map), in
 * typed arrays that grow by doubling up to three quarters of the budget, the rest being the
 * targets'. The slots form a ring in end order, so the oldest is forgotten in constant time; an
 * open-addressing table of slot numbers, keyed by the id's random bits, finds an id's slot.
 *
 * Only ids of the form lease/lease issues (lowercase UUIDs) are kept; any other is never found.
 */
import type { Entry } from './entry.ts';

export const REPORTABLE_AFTER_END_MS = 15 * 60_000;
/** Default budget of the API clients' ended leases: 1,000 releases a second for 15 minutes fit. */
export const DEFAULT_ENDED_LEASE_BYTES = 64 * 2 ** 20;
/** Gateway connection leases a sticky session may still report: a budget of their own. */
export const DEFAULT_ENDED_CONNECTION_BYTES = 16 * 2 ** 20;

/** Bytes per slot: id 16, end time 8, entry reference 8, target index 4. */
const SLOT_BYTES = 16 + 8 + 8 + 4;
/** Bytes per index cell (a slot number + 1, 0 = empty); the index has 2–4 cells per slot. */
const INDEX_CELL_BYTES = 4;
/** A distinct target held: its string (header and characters), map entry, table cells. */
const TARGET_OVERHEAD_BYTES = 72;
const MIN_CAPACITY = 1024;
/**
 * The slots grow to at most this share of the budget, so the distinct targets always have room
 * of their own (a quarter of 64 MiB holds ~170,000 of them): slots taking the whole budget would
 * make every new target forget leases early.
 */
const SLOTS_SHARE = 3 / 4;

/**
 * Who may still report a lease once it has ended, which decides where it is kept: an API
 * client (`client`, the API clients' table), a gateway sticky session that remembers it
 * (`session`, a table of its own, so gateway traffic never pushes API leases out), or nobody
 * (`none`: a gateway connection without a session, a gateway replica's slot lease — not kept).
 */
export type LateReports = 'client' | 'session' | 'none';

export interface EndedLease {
  entry: Entry;
  target: string | undefined;
  endedAt: number;
}

export interface EndedLeasesOptions {
  retentionMs: number;
  /** Bytes at most (slots, index and targets, as accounted by `bytes`); 0 keeps nothing. */
  maxBytes: number;
  /** Called once per lease forgotten before its retention ran out, for want of budget. */
  onEvictedEarly?: () => void;
}

const HEX = '0123456789abcdef';
const idWords = new Uint32Array(4);

/** The value of a lowercase hex digit's char code, -1 for anything else. */
function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  return -1;
}

/**
 * Writes the 128 bits of `id` into `idWords`; false when it is not a lease id (a lowercase
 * UUID, lease/lease). One pass over the characters: it runs on every release.
 */
function readId(id: string): boolean {
  if (id.length !== 36) return false;
  let word = 0;
  let digits = 0;
  for (let i = 0; i < 36; i++) {
    const c = id.charCodeAt(i);
    if (i === 8 || i === 13 || i === 18 || i === 23) {
      if (c !== 45) return false;
      continue;
    }
    const v = hexValue(c);
    if (v < 0) return false;
    word = (word << 4) | v;
    if (++digits % 8 === 0) idWords[digits / 8 - 1] = word >>> 0;
  }
  return true;
}

function writeId(words: Uint32Array, at: number): string {
  let hex = '';
  for (let w = 0; w < 4; w++) {
    const v = words[at + w]!;
    for (let shift = 28; shift >= 0; shift -= 4) hex += HEX[(v >>> shift) & 15];
  }
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function indexSizeFor(capacity: number): number {
  let n = 1;
  while (n < 2 * capacity) n *= 2;
  return n;
}

function slotsBytes(capacity: number): number {
  return capacity === 0 ? 0 : capacity * SLOT_BYTES + indexSizeFor(capacity) * INDEX_CELL_BYTES;
}

export class EndedLeases {
  private readonly retentionMs: number;
  private readonly maxBytes: number;
  private readonly onEvictedEarly: () => void;
  private capacity = 0;
  private words = new Uint32Array(0);
  private endedAt = new Float64Array(0);
  /** undefined marks a free or vacated slot (an id re-added later in the ring). */
  private owners: Array<Entry | undefined> = [];
  /** Index into `targetNames`, -1 for a lease without a target. */
  private targetOf = new Int32Array(0);
  /** Open addressing, linear probing: slot + 1, 0 = empty; a power of two in size. */
  private index = new Int32Array(0);
  /** The oldest slot, how many slots from it are in use, and how many of those are vacated. */
  private head = 0;
  private used = 0;
  private vacated = 0;
  private readonly targetIds = new Map<string, number>();
  private targetNames: Array<string | undefined> = [];
  private targetRefs: number[] = [];
  private freeTargets: number[] = [];
  private targetBytes = 0;
  private evictedEarly = 0;

  constructor(opts: EndedLeasesOptions) {
    this.retentionMs = opts.retentionMs;
    this.maxBytes = Math.max(0, Math.floor(opts.maxBytes));
    this.onEvictedEarly = opts.onEvictedEarly ?? (() => {});
  }

  /** Leases held (expired ones not yet purged included). */
  get size(): number {
    return this.used - this.vacated;
  }

  /** Bytes held by this table as accounted against its budget (allocated slots, index, targets). */
  get bytes(): number {
    return slotsBytes(this.capacity) + this.targetBytes;
  }

  /** Slots allocated (the most leases held before the next growth). */
  get slots(): number {
    return this.capacity;
  }

  /** Leases forgotten before their retention ran out, since construction. */
  get evictedEarlyCount(): number {
    return this.evictedEarly;
  }

  /** Keeps `id` (re-adding an id moves it to the newest end); false when it cannot be kept. */
  add(id: string, ended: EndedLease): boolean {
    if (!readId(id)) return false;
    const previous = this.find();
    if (previous >= 0) {
      this.unindex(previous);
      this.vacate(previous);
      this.vacated++;
    }
    const target = this.targetSlot(ended.target, ended.endedAt);
    if (target === -2 || !this.makeRoom(ended.endedAt)) {
      if (target >= 0) this.releaseTarget(target);
      return false;
    }
    // The id was read before makeRoom, which reads no id: `idWords` still holds it.
    const slot = (this.head + this.used) % this.capacity;
    this.used++;
    this.words.set(idWords, slot * 4);
    this.endedAt[slot] = ended.endedAt;
    this.owners[slot] = ended.entry;
    this.targetOf[slot] = target;
    this.insert(slot);
    return true;
  }

  get(id: string, now: number): EndedLease | undefined {
    if (!readId(id)) return undefined;
    const slot = this.find();
    if (slot < 0) return undefined;
    const ended = this.at(slot);
    return ended && ended.endedAt + this.retentionMs > now ? ended : undefined;
  }

  /** Forgets the leases whose retention ran out by `now`. */
  purge(now: number): void {
    while (this.used > 0) {
      const slot = this.head;
      if (this.owners[slot] !== undefined && this.endedAt[slot]! + this.retentionMs > now) return;
      this.dropOldestSlot();
    }
  }

  /** Every lease kept, oldest first (expired ones not yet purged included). */
  *entries(): IterableIterator<[string, EndedLease]> {
    for (let i = 0; i < this.used; i++) {
      const slot = (this.head + i) % this.capacity;
      const ended = this.at(slot);
      if (ended) yield [writeId(this.words, slot * 4), ended];
    }
  }

  private at(slot: number): EndedLease | undefined {
    const entry = this.owners[slot];
    if (entry === undefined) return undefined;
    const t = this.targetOf[slot]!;
    return { entry, target: t < 0 ? undefined : this.targetNames[t], endedAt: this.endedAt[slot]! };
  }

  /**
   * A free slot at the newest end: closes vacated gaps, else grows within the budget, else
   * forgets the oldest lease (counted when it was still reportable at `now`). False when the
   * budget holds no slot at all.
   */
  private makeRoom(now: number): boolean {
    if (this.used < this.capacity) return true;
    if (this.vacated > 0) {
      this.rebuild(this.capacity);
      return true;
    }
    const grown = this.grownCapacity();
    if (grown > this.capacity) {
      this.rebuild(grown);
      return true;
    }
    if (this.capacity === 0) return false;
    const slot = this.head;
    if (this.endedAt[slot]! + this.retentionMs > now) {
      this.evictedEarly++;
      this.onEvictedEarly();
    }
    this.dropOldestSlot();
    return true;
  }

  /** Double the capacity, or as much as the budget allows; the current one when nothing fits. */
  private grownCapacity(): number {
    const room = Math.min(this.maxBytes - this.targetBytes, Math.floor(this.maxBytes * SLOTS_SHARE));
    let cap = Math.max(MIN_CAPACITY, this.capacity * 2);
    if (slotsBytes(cap) <= room) return cap;
    // The largest capacity under the budget: shrink towards the current one.
    let lo = this.capacity;
    let hi = cap;
    while (hi - lo > 1) {
      cap = Math.floor((lo + hi) / 2);
      if (slotsBytes(cap) <= room) lo = cap;
      else hi = cap;
    }
    return lo;
  }

  /** Lays the kept leases out in order from slot 0 of fresh arrays of `capacity` slots. */
  private rebuild(capacity: number): void {
    const words = new Uint32Array(capacity * 4);
    const endedAt = new Float64Array(capacity);
    const owners: Array<Entry | undefined> = new Array(capacity).fill(undefined);
    const targetOf = new Int32Array(capacity);
    let n = 0;
    for (let i = 0; i < this.used; i++) {
      const slot = (this.head + i) % this.capacity;
      if (this.owners[slot] === undefined) continue;
      words.set(this.words.subarray(slot * 4, slot * 4 + 4), n * 4);
      endedAt[n] = this.endedAt[slot]!;
      owners[n] = this.owners[slot];
      targetOf[n] = this.targetOf[slot]!;
      n++;
    }
    const held = idWords.slice();
    this.capacity = capacity;
    this.words = words;
    this.endedAt = endedAt;
    this.owners = owners;
    this.targetOf = targetOf;
    this.index = new Int32Array(indexSizeFor(capacity));
    this.head = 0;
    this.used = n;
    this.vacated = 0;
    for (let slot = 0; slot < n; slot++) this.insert(slot);
    idWords.set(held);
  }

  private dropOldestSlot(): void {
    const slot = this.head;
    if (this.owners[slot] !== undefined) {
      this.unindex(slot);
      this.vacate(slot);
    } else {
      this.vacated--;
    }
    this.head = (this.head + 1) % this.capacity;
    this.used--;
  }

  /** Empties a slot; it keeps its place in the ring until the head passes it. */
  private vacate(slot: number): void {
    this.owners[slot] = undefined;
    const t = this.targetOf[slot]!;
    if (t >= 0) this.releaseTarget(t);
    this.targetOf[slot] = -1;
  }

  // ---- the id index ----

  private home(w: Uint32Array, at: number): number {
    // The id's bits are random (lease/lease); mixing two words guards against a poor source.
    return (Math.imul(w[at]! ^ w[at + 3]!, 0x9e3779b1) >>> 0) & (this.index.length - 1);
  }

  /** The slot holding the id in `idWords`, or -1. */
  private find(): number {
    if (this.index.length === 0) return -1;
    const mask = this.index.length - 1;
    for (let i = this.home(idWords, 0); ; i = (i + 1) & mask) {
      const cell = this.index[i]!;
      if (cell === 0) return -1;
      const at = (cell - 1) * 4;
      const w = this.words;
      if (
        w[at] === idWords[0] &&
        w[at + 1] === idWords[1] &&
        w[at + 2] === idWords[2] &&
        w[at + 3] === idWords[3]
      ) {
        return cell - 1;
      }
    }
  }

  private insert(slot: number): void {
    const mask = this.index.length - 1;
    let i = this.home(this.words, slot * 4);
    while (this.index[i] !== 0) i = (i + 1) & mask;
    this.index[i] = slot + 1;
  }

  /** Removes `slot` from the index, shifting later cells of its run back (no tombstones). */
  private unindex(slot: number): void {
    const mask = this.index.length - 1;
    let i = this.home(this.words, slot * 4);
    while (this.index[i] !== slot + 1) i = (i + 1) & mask;
    for (let j = (i + 1) & mask; this.index[j] !== 0; j = (j + 1) & mask) {
      const h = this.home(this.words, (this.index[j]! - 1) * 4);
      // The cell at j may move to i when its home is not in the cyclic range (i, j].
      if (i <= j ? h <= i || h > j : h <= i && h > j) {
        this.index[i] = this.index[j]!;
        i = j;
      }
    }
    this.index[i] = 0;
  }

  // ---- the distinct targets ----

  /**
   * The target's index with one more reference, -1 for none, -2 when the budget cannot hold
   * it even after forgetting every older lease.
   */
  private targetSlot(target: string | undefined, now: number): number {
    if (target === undefined) return -1;
    const known = this.targetIds.get(target);
    if (known !== undefined) {
      this.targetRefs[known]!++;
      return known;
    }
    const cost = TARGET_OVERHEAD_BYTES + Math.ceil(target.length / 8) * 8;
    while (this.bytes + cost > this.maxBytes && this.size > 0) {
      this.purge(now);
      if (this.bytes + cost <= this.maxBytes || this.size === 0) break;
      if (this.owners[this.head] !== undefined) {
        this.evictedEarly++;
        this.onEvictedEarly();
      }
      this.dropOldestSlot();
    }
    if (this.bytes + cost > this.maxBytes) return -2;
    const t = this.freeTargets.pop() ?? this.targetNames.length;
    this.targetNames[t] = target;
    this.targetRefs[t] = 1;
    this.targetIds.set(target, t);
    this.targetBytes += cost;
    return t;
  }

  private releaseTarget(t: number): void {
    if (--this.targetRefs[t]! > 0) return;
    const name = this.targetNames[t]!;
    this.targetIds.delete(name);
    this.targetNames[t] = undefined;
    this.freeTargets.push(t);
    this.targetBytes -= TARGET_OVERHEAD_BYTES + Math.ceil(name.length / 8) * 8;
  }
}
