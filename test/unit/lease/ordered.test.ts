import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { IndexedHeap, SortedList } from '../../../src/lease/ordered.ts';
import { TEST_SEED } from '../../support/random.ts';

describe('SortedList', () => {
  it('keeps distinct items sorted through any sequence of inserts and deletes', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.boolean(), fc.integer({ min: 0, max: 2000 })), { maxLength: 3000 }),
        (ops) => {
          const list = new SortedList<number>((a, b) => a - b);
          const model = new Set<number>();
          for (const [insert, v] of ops) {
            if (insert && !model.has(v)) {
              list.insert(v);
              model.add(v);
            } else if (!insert) {
              expect(list.delete(v)).toBe(model.delete(v));
            }
          }
          expect([...list]).toEqual([...model].sort((a, b) => a - b));
          expect(list.size).toBe(model.size);
          expect(list.find((x) => x % 7 === 3)).toBe(
            [...model].sort((a, b) => a - b).find((x) => x % 7 === 3),
          );
        },
      ),
      { numRuns: 60, seed: TEST_SEED },
    );
  });

  it('walks from after any item, present or not, across chunk boundaries (the paging of GET /v1/proxies)', () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.integer({ min: 0, max: 5000 }), { maxLength: 2000 }),
        fc.array(fc.integer({ min: -1, max: 5001 }), { minLength: 1, maxLength: 20 }),
        (items, probes) => {
          const list = new SortedList<number>((a, b) => a - b);
          for (const v of items) list.insert(v);
          const sorted = [...items].sort((a, b) => a - b);
          for (const p of probes) expect([...list.after(p)]).toEqual(sorted.filter((v) => v > p));
        },
      ),
      { numRuns: 40, seed: TEST_SEED },
    );
  });
});

describe('IndexedHeap', () => {
  it('pops in key order after arbitrary removals and re-keys', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 1000 }), { minLength: 1, maxLength: 300 }),
        fc.array(fc.tuple(fc.nat(), fc.option(fc.integer({ min: 0, max: 1000 }))), { maxLength: 100 }),
        (keys, edits) => {
          const heap = new IndexedHeap<{ key: number; heapIndex: number }>((a, b) => a.key < b.key);
          const items = keys.map((key) => ({ key, heapIndex: -1 }));
          for (const it of items) heap.push(it);
          const live = new Set(items);
          for (const [i, newKey] of edits) {
            const it = items[i % items.length]!;
            if (newKey === null) {
              heap.remove(it);
              live.delete(it);
            } else {
              it.key = newKey;
              heap.update(it);
            }
          }
          const popped: number[] = [];
          for (let top = heap.pop(); top; top = heap.pop()) popped.push(top.key);
          expect(heap.size).toBe(0);
          expect(popped).toEqual([...live].map((x) => x.key).sort((a, b) => a - b));
        },
      ),
      { numRuns: 100, seed: TEST_SEED },
    );
  });
});
