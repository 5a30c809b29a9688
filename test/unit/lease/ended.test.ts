/**
 * The table of recently ended leases (reports after the fact): kept for the retention, under a
 * count cap with the oldest forgotten first, a re-added id counting as newest. Random sequences
 * of adds, lookups and purges are checked against a plain list that does the same the obvious
 * way, including long runs at the cap — where the table used to slow down with every release.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { EndedLeases } from '../../../src/lease/ended.ts';
import type { Entry } from '../../../src/lease/entry.ts';
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

const ids = fc.constantFrom(...Array.from({ length: 12 }, (_, i) => `lease-${i}`));
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
  it('answers like a plain list: retention, the cap, oldest first, re-adds as newest', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 6 }), ops, (cap, sequence) => {
        const table = new EndedLeases(RETENTION_MS, cap);
        let model: ModelRow[] = [];
        let now = 0;
        for (const op of sequence) {
          if (op.kind === 'add') {
            const proxy = op.proxy === 'a' ? proxyA : proxyB;
            table.add(op.id, { entry: proxy, target: op.target, endedAt: now });
            model = model.filter((r) => r.id !== op.id);
            model.push({ id: op.id, proxy, target: op.target, endedAt: now });
            if (model.length > cap) model.shift();
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
          expect([...table.entries()].map(([id, e]) => [id, e.endedAt])).toEqual(
            model.map((r) => [r.id, r.endedAt]),
          );
        }
      }),
      { seed: TEST_SEED, numRuns: 300 },
    );
  });

  it('keeps the newest `cap` leases through many times its capacity of releases', () => {
    const cap = 1000;
    const table = new EndedLeases(RETENTION_MS, cap);
    for (let i = 0; i < 50 * cap; i++) {
      table.add(`lease-${i}`, { entry: proxyA, target: undefined, endedAt: 0 });
      table.purge(0);
    }
    expect(table.size).toBe(cap);
    expect(table.get(`lease-${50 * cap - cap - 1}`, 0)).toBeUndefined();
    expect(table.get(`lease-${50 * cap - cap}`, 0)?.entry).toBe(proxyA);
    expect(table.get(`lease-${50 * cap - 1}`, 0)?.entry).toBe(proxyA);
    expect([...table.entries()][0]?.[0]).toBe(`lease-${50 * cap - cap}`);
  });

  it('keeps nothing with a cap of 0', () => {
    const table = new EndedLeases(RETENTION_MS, 0);
    table.add('lease-1', { entry: proxyA, target: undefined, endedAt: 0 });
    expect(table.size).toBe(0);
    expect(table.get('lease-1', 0)).toBeUndefined();
    expect([...table.entries()]).toEqual([]);
  });
});
