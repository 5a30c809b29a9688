/**
 * The table of recently ended leases (reports after the fact): kept by time, a re-added id
 * counting as newest, checked against a plain list on random sequences of adds, lookups, ticks
 * and purges; and its byte budget — never exceeded by its own accounting, the oldest forgotten
 * first when it is full, each lease forgotten early counted.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { EndedLeases } from '../../../src/lease/ended.ts';
import type { Entry } from '../../../src/lease/entry.ts';
import { newLeaseId } from '../../../src/lease/lease.ts';
import { TEST_SEED } from '../../support/random.ts';

const RETENTION_MS = 1000;
const proxyA = { key: 'ns/a' } as Entry;
const proxyB = { key: 'ns/b' } as Entry;

interface ModelRow {
  id: string;
  proxy: Entry;
  target: string | undefined;
  endedAt: number;
}

const leaseIds = Array.from({ length: 12 }, () => newLeaseId());
const ids = fc.constantFrom(...leaseIds);
const ops = fc.array(
  fc.oneof(
    {
      weight: 5,
      arbitrary: fc.record({
        kind: fc.constant('add' as const),
        id: ids,
        target: fc.constantFrom(undefined, 'a.example', 'b.example'),
        proxy: fc.constantFrom('a' as const, 'b' as const),
      }),
    },
    { weight: 3, arbitrary: fc.record({ kind: fc.constant('get' as const), id: ids }) },
    {
      weight: 2,
      arbitrary: fc.record({ kind: fc.constant('tick' as const), ms: fc.integer({ min: 0, max: 400 }) }),
    },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('purge' as const) }) },
  ),
  { maxLength: 200 },
);

describe('EndedLeases', () => {
  it('answers like a plain list: retention by time, oldest first, re-adds as newest', () => {
    fc.assert(
      fc.property(ops, (sequence) => {
        const table = new EndedLeases({ retentionMs: RETENTION_MS, maxBytes: 2 ** 20 });
        let model: ModelRow[] = [];
        let now = 0;
        for (const op of sequence) {
          if (op.kind === 'add') {
            const proxy = op.proxy === 'a' ? proxyA : proxyB;
            expect(table.add(op.id, { entry: proxy, target: op.target, endedAt: now })).toBe(true);
            model = model.filter((r) => r.id !== op.id);
            model.push({ id: op.id, proxy, target: op.target, endedAt: now });
          } else if (op.kind === 'get') {
            const row = model.find((r) => r.id === op.id && r.endedAt + RETENTION_MS > now);
            const got = table.get(op.id, now);
            expect(got && { proxy: got.entry, target: got.target, endedAt: got.endedAt }).toEqual(
              row && { proxy: row.proxy, target: row.target, endedAt: row.endedAt },
            );
          } else if (op.kind === 'tick') {
            now += op.ms;
          } else {
            table.purge(now);
            model = model.filter((r) => r.endedAt + RETENTION_MS > now);
          }
          expect(table.size).toBe(model.length);
          expect([...table.entries()].map(([id, e]) => [id, e.target, e.endedAt])).toEqual(
            model.map((r) => [r.id, r.target, r.endedAt]),
          );
        }
        expect(table.evictedEarlyCount).toBe(0);
      }),
      { seed: TEST_SEED, numRuns: 300 },
    );
  });

  it('keeps only lease ids it issues (lowercase UUIDs); any other is never found', () => {
    const table = new EndedLeases({ retentionMs: RETENTION_MS, maxBytes: 2 ** 20 });
    const id = newLeaseId();
    for (const bad of ['lease-1', id.toUpperCase(), id.replace(/-/g, '_'), `${id}0`, '']) {
      expect(table.add(bad, { entry: proxyA, target: undefined, endedAt: 0 })).toBe(false);
      expect(table.get(bad, 0)).toBeUndefined();
    }
    expect(table.add(id, { entry: proxyA, target: undefined, endedAt: 0 })).toBe(true);
    expect(table.get(id, 0)?.entry).toBe(proxyA);
    expect(table.size).toBe(1);
  });

  it('past its budget forgets the oldest first and counts each lease forgotten early', () => {
    const maxBytes = 6000;
    let counted = 0;
    const table = new EndedLeases({ retentionMs: RETENTION_MS, maxBytes, onEvictedEarly: () => counted++ });
    const added = Array.from({ length: 5000 }, () => newLeaseId());
    for (const id of added) {
      table.add(id, { entry: proxyA, target: undefined, endedAt: 0 });
      table.purge(0);
      expect(table.bytes).toBeLessThanOrEqual(maxBytes);
    }
    const slots = table.slots;
    // Slots take at most three quarters of the budget (the rest is for targets).
    expect(slots).toBeGreaterThan(50);
    expect(slots * 36).toBeLessThanOrEqual(maxBytes * 0.75);
    expect(table.size).toBe(slots);
    expect(counted).toBe(added.length - slots);
    expect(table.evictedEarlyCount).toBe(counted);
    expect(table.get(added[added.length - slots - 1]!, 0)).toBeUndefined();
    expect(table.get(added[added.length - slots]!, 0)?.entry).toBe(proxyA);
    expect([...table.entries()][0]?.[0]).toBe(added[added.length - slots]);
    // Leases whose time is up make room without counting.
    for (let i = 0; i < slots; i++) {
      table.add(newLeaseId(), { entry: proxyB, target: undefined, endedAt: RETENTION_MS });
    }
    expect(counted).toBe(added.length - slots);
  });

  it('counts each distinct target held once against the budget, and frees it with its last lease', () => {
    const maxBytes = 4000;
    const table = new EndedLeases({ retentionMs: RETENTION_MS, maxBytes });
    for (let i = 0; i < 1000; i++) table.add(newLeaseId(), { entry: proxyA, target: undefined, endedAt: 0 });
    const slotsOnly = table.bytes;
    expect(table.evictedEarlyCount).toBe(1000 - table.slots);
    const before = table.evictedEarlyCount;
    // Ten distinct targets fit in what the slots leave; the same ten again cost nothing more.
    for (let i = 0; i < 100; i++) {
      table.add(newLeaseId(), { entry: proxyA, target: `site-${i % 10}.example`, endedAt: 0 });
    }
    expect(table.bytes).toBe(slotsOnly + 10 * (72 + 16));
    expect(table.evictedEarlyCount - before).toBe(100);
    // Forty do not: older leases, and with them their targets, go first.
    for (let i = 0; i < 1000; i++) {
      table.add(newLeaseId(), { entry: proxyA, target: `site-${i % 40}.example`, endedAt: 0 });
      expect(table.bytes).toBeLessThanOrEqual(maxBytes);
    }
    expect(table.get([...table.entries()].at(-1)![0], 0)?.target).toBe('site-39.example');
    table.purge(RETENTION_MS);
    expect(table.size).toBe(0);
    expect(table.bytes).toBe(slotsOnly);
  });

  it('keeps nothing with a budget too small for one slot', () => {
    const table = new EndedLeases({ retentionMs: RETENTION_MS, maxBytes: 0 });
    const id = newLeaseId();
    expect(table.add(id, { entry: proxyA, target: undefined, endedAt: 0 })).toBe(false);
    expect(table.size).toBe(0);
    expect(table.get(id, 0)).toBeUndefined();
    expect([...table.entries()]).toEqual([]);
  });
});
