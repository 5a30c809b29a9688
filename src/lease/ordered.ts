/**
 * lease/ordered — the two ordered containers the lease store needs so that a grant does not
 * scan the fleet: a chunked sorted list (insert/delete O(log n + chunk), in-order walk from the
 * front) and a binary min-heap whose items know their position, so a lease's expiry can be
 * re-keyed or dropped in O(log n) (also used for cooldown ends).
 */

const CHUNK = 128;

/**
 * Sorted list of distinct items, stored as chunks of at most 2×CHUNK sorted items. A binary
 * search over chunk tails finds the chunk; the splice inside it is bounded by the chunk size, so
 * cost per operation stays nearly flat from 100 to 100,000 items.
 */
export class SortedList<T> {
  private chunks: T[][] = [];
  private count = 0;
  private readonly cmp: (a: T, b: T) => number;

  constructor(cmp: (a: T, b: T) => number) {
    this.cmp = cmp;
  }

  get size(): number {
    return this.count;
  }

  /** Index of the first chunk whose last item is >= item (or the last chunk). */
  private chunkFor(item: T): number {
    let lo = 0;
    let hi = this.chunks.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const chunk = this.chunks[mid]!;
      if (this.cmp(chunk[chunk.length - 1]!, item) < 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  private static lowerBound<T>(arr: T[], item: T, cmp: (a: T, b: T) => number): number {
    let lo = 0;
    let hi = arr.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmp(arr[mid]!, item) < 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  insert(item: T): void {
    this.count++;
    if (this.chunks.length === 0) {
      this.chunks.push([item]);
      return;
    }
    const ci = this.chunkFor(item);
    const chunk = this.chunks[ci]!;
    chunk.splice(SortedList.lowerBound(chunk, item, this.cmp), 0, item);
    if (chunk.length > 2 * CHUNK) this.chunks.splice(ci + 1, 0, chunk.splice(CHUNK));
  }

  /** Removes the item equal (cmp === 0) to `item`; false when absent. */
  delete(item: T): boolean {
    if (this.chunks.length === 0) return false;
    const ci = this.chunkFor(item);
    const chunk = this.chunks[ci]!;
    const i = SortedList.lowerBound(chunk, item, this.cmp);
    if (i >= chunk.length || this.cmp(chunk[i]!, item) !== 0) return false;
    chunk.splice(i, 1);
    this.count--;
    if (chunk.length === 0) this.chunks.splice(ci, 1);
    return true;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (const chunk of this.chunks) yield* chunk;
  }

  /** The items after `item` (cmp > 0) in order, found by binary search: no walk of those before it. */
  *after(item: T): IterableIterator<T> {
    if (this.chunks.length === 0) return;
    let ci = this.chunkFor(item);
    let chunk = this.chunks[ci]!;
    let i = SortedList.lowerBound(chunk, item, this.cmp);
    if (i < chunk.length && this.cmp(chunk[i]!, item) === 0) i++;
    for (; ci < this.chunks.length; ci++, i = 0) {
      chunk = this.chunks[ci]!;
      for (; i < chunk.length; i++) yield chunk[i]!;
    }
  }

  /** First item accepted by `pred`, walking in order; undefined when none. */
  find(pred: (item: T) => boolean): T | undefined {
    for (const chunk of this.chunks) {
      for (const item of chunk) if (pred(item)) return item;
    }
    return undefined;
  }
}

/** A min-heap whose items know their position, so any item can be removed or re-keyed in O(log n). */
export class IndexedHeap<T extends { heapIndex: number }> {
  private items: T[] = [];
  private readonly less: (a: T, b: T) => boolean;

  constructor(less: (a: T, b: T) => boolean) {
    this.less = less;
  }

  get size(): number {
    return this.items.length;
  }

  peek(): T | undefined {
    return this.items[0];
  }

  push(item: T): void {
    item.heapIndex = this.items.length;
    this.items.push(item);
    this.up(item.heapIndex);
  }

  /** Removes and returns the least item. */
  pop(): T | undefined {
    const top = this.items[0];
    if (top) this.remove(top);
    return top;
  }

  /** Restores order after the item's key changed. */
  update(item: T): void {
    if (!this.has(item)) return;
    this.up(item.heapIndex);
    this.down(item.heapIndex);
  }

  remove(item: T): void {
    if (!this.has(item)) return;
    const i = item.heapIndex;
    const last = this.items.pop()!;
    item.heapIndex = -1;
    if (last === item) return;
    this.items[i] = last;
    last.heapIndex = i;
    this.up(i);
    this.down(last.heapIndex);
  }

  private has(item: T): boolean {
    return item.heapIndex >= 0 && this.items[item.heapIndex] === item;
  }

  private swap(i: number, j: number): void {
    const a = this.items;
    const x = a[i]!;
    const y = a[j]!;
    a[i] = y;
    a[j] = x;
    x.heapIndex = j;
    y.heapIndex = i;
  }

  private up(i: number): void {
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(this.items[i]!, this.items[p]!)) return;
      this.swap(i, p);
      i = p;
    }
  }

  private down(i: number): void {
    const a = this.items;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < a.length && this.less(a[l]!, a[m]!)) m = l;
      if (r < a.length && this.less(a[r]!, a[m]!)) m = r;
      if (m === i) return;
      this.swap(i, m);
      i = m;
    }
  }
}
