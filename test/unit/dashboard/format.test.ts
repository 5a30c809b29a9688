/**
 * The page's pure logic (dashboard/web/format), run under Node: time left as people read it,
 * filtering by every word typed, and sorting that keeps ties in name order.
 */
import { describe, expect, it } from 'vitest';
import {
  activeCooldowns,
  age,
  longestIncreasing,
  matchesQuery,
  pageBounds,
  resortRows,
  sharedNote,
  sortRows,
  timeLeft,
} from '../../../src/dashboard/web/format.ts';
import type { FleetRow } from '../../../src/dashboard/web/types.ts';
import { seededRandom } from '../../support/random.ts';

const NOW = Date.parse('2026-01-01T00:00:00Z');

function row(name: string, over: Partial<FleetRow> = {}): FleetRow {
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    pool: null,
    poolLabel: null,
    provider: 'local',
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    leasable: true,
    reason: null,
    latencyMillis: 10,
    activeLeases: 0,
    maxLeases: 0,
    cooldownUntil: null,
    targetCooldowns: [],
    egressIP: null,
    address: '127.0.0.1:3128',
    problem: null,
    ...over,
  };
}

describe('timeLeft', () => {
  it.each([
    [0, 'ended'],
    [-5000, 'ended'],
    [400, '1 s'],
    [42_000, '42 s'],
    [598_000, '9 min 58 s'],
    [3_780_000, '1 h 03 min'],
  ])('%i ms → %s', (ms, text) => expect(timeLeft(NOW + ms, NOW)).toBe(text));
});

describe('activeCooldowns', () => {
  it('lists the global cooldown first, then running per-target ones, dropping ended ones', () => {
    const r = row('a', {
      cooldownUntil: new Date(NOW + 5000).toISOString(),
      targetCooldowns: [
        { target: 'old.example', until: new Date(NOW - 1).toISOString(), sharedFrom: null },
        { target: 'shop.example', until: new Date(NOW + 60_000).toISOString(), sharedFrom: null },
      ],
    });
    expect(activeCooldowns(r, NOW)).toEqual([
      { target: null, until: NOW + 5000, sharedFrom: null },
      { target: 'shop.example', until: NOW + 60_000, sharedFrom: null },
    ]);
  });
});

describe('matchesQuery', () => {
  const r = row('eu-1', {
    pool: 'research',
    egressIP: '203.0.113.9',
    targetCooldowns: [{ target: 'shop.example', until: '', sharedFrom: null }],
  });
  it.each([
    ['', true],
    ['EU-1', true],
    ['research ready', true],
    ['203.0.113', true],
    ['shop.example', true],
    ['healthy', true],
    ['unhealthy', false],
    ['research gcp', false],
  ])('"%s" → %s', (q, want) => expect(matchesQuery(r, q)).toBe(want));
});

describe('sortRows', () => {
  const rows = [
    row('c', { latencyMillis: 5 }),
    row('a', { latencyMillis: 50 }),
    row('b', { healthy: false, latencyMillis: 1 }),
    row('d', { latencyMillis: 5 }),
  ];
  it('puts unhealthy proxies last by latency and keeps ties in name order', () => {
    expect(sortRows(rows, { column: 'latency', descending: false }, NOW).map((r) => r.name)).toEqual([
      'c',
      'd',
      'a',
      'b',
    ]);
  });
  it('reverses on descending', () => {
    expect(sortRows(rows, { column: 'key', descending: true }, NOW).map((r) => r.name)).toEqual([
      'd',
      'c',
      'b',
      'a',
    ]);
  });
});

describe('ages and shared cooldowns', () => {
  it.each([
    [0, '0 s'],
    [-2000, '0 s'],
    [42_400, '42 s'],
    [185_000, '3 min 05 s'],
  ])('a grant %i ms ago is %s old', (ms, text) => expect(age(NOW - ms, NOW)).toBe(text));

  it('names the reported proxy by its name within the row’s namespace, in full elsewhere', () => {
    expect(sharedNote({ proxy: 'crawl/local-2', address: '127.0.0.3' }, 'crawl')).toBe(
      'via 127.0.0.3, blocked on local-2',
    );
    expect(sharedNote({ proxy: 'other/local-2', address: '127.0.0.3' }, 'crawl')).toBe(
      'via 127.0.0.3, blocked on other/local-2',
    );
  });

  it('finds a shared cooldown by the reported proxy and the address', () => {
    const r = row('demo-x', {
      targetCooldowns: [
        { target: 'shop.example', until: '', sharedFrom: { proxy: 'crawl/local-2', address: '127.0.0.2' } },
      ],
    });
    expect(matchesQuery(r, 'local-2')).toBe(true);
    expect(matchesQuery(r, '127.0.0.2 shop')).toBe(true);
  });
});

describe('pages of the proxies table', () => {
  it('cuts the filtered rows into pages, and moves back to the last page when the rows shrink', () => {
    expect(pageBounds(10_000, 0, 100)).toEqual({ page: 0, pages: 100, start: 0, end: 100 });
    expect(pageBounds(10_000, 99, 100)).toEqual({ page: 99, pages: 100, start: 9900, end: 10_000 });
    // A filter left 150 rows while page 40 was shown: the last page, not an empty one.
    expect(pageBounds(150, 40, 100)).toEqual({ page: 1, pages: 2, start: 100, end: 150 });
    expect(pageBounds(0, 3, 100)).toEqual({ page: 0, pages: 1, start: 0, end: 0 });
    expect(pageBounds(5, -1, 100)).toEqual({ page: 0, pages: 1, start: 0, end: 5 });
  });
});

describe('re-sorting after an update', () => {
  it('gives the order a full sort gives, for rows changed, added and removed, in every order but cooldowns', () => {
    const random = seededRandom();
    const columns = ['key', 'pool', 'provider', 'phase', 'latency', 'leases', 'egressIP', 'address'] as const;
    const make = (i: number) =>
      row(`p-${i}`, {
        latencyMillis: random() < 0.1 ? null : Math.round(random() * 50),
        healthy: random() > 0.2,
        activeLeases: Math.floor(random() * 3),
        pool: random() < 0.3 ? null : `pool-${Math.floor(random() * 3)}`,
      });
    for (let round = 0; round < 50; round++) {
      const order = { column: columns[round % columns.length] ?? 'key', descending: round % 3 === 0 };
      const before = new Map<string, FleetRow>();
      for (let i = 0; i < 200; i++) before.set(`crawl/p-${i}`, make(i));
      const sorted = sortRows([...before.values()], order, NOW);
      const touched = new Set<string>();
      const fresh: FleetRow[] = [];
      for (let k = 0; k < 30; k++) {
        const i = Math.floor(random() * 260);
        const key = `crawl/p-${i}`;
        touched.add(key);
        if (random() < 0.2) before.delete(key);
        else before.set(key, make(i));
      }
      for (const key of touched) {
        const r = before.get(key);
        if (r) fresh.push(r);
      }
      const expected = sortRows([...before.values()], order, NOW).map((r) => r.key);
      expect(resortRows(sorted, touched, fresh, order, NOW).map((r) => r.key)).toEqual(expected);
    }
  });
});

describe('rows that stay in place', () => {
  it('finds a longest increasing run: the rows a reorder leaves where they are', () => {
    expect(longestIncreasing([])).toEqual([]);
    expect(longestIncreasing([0, 1, 2, 3])).toEqual([0, 1, 2, 3]);
    // One row moved from the end to the front: only it moves.
    expect(longestIncreasing([3, 0, 1, 2])).toEqual([0, 1, 2]);
    // One row moved down: the others stay.
    expect(longestIncreasing([1, 2, 0, 3, 4])).toEqual([1, 2, 3, 4]);
    const random = seededRandom();
    for (let round = 0; round < 100; round++) {
      const xs = Array.from({ length: 30 }, (_, i) => i).sort(() => random() - 0.5);
      const lis = longestIncreasing(xs);
      for (let i = 1; i < lis.length; i++) expect(lis[i]).toBeGreaterThan(lis[i - 1] as number);
      // A subsequence of xs, in its order.
      let at = -1;
      for (const v of lis) {
        at = xs.indexOf(v, at + 1);
        expect(at).toBeGreaterThanOrEqual(0);
      }
      // As long as the quadratic method finds.
      const best = xs.map(() => 1);
      for (let i = 0; i < xs.length; i++)
        for (let j = 0; j < i; j++)
          if ((xs[j] as number) < (xs[i] as number))
            best[i] = Math.max(best[i] as number, (best[j] as number) + 1);
      expect(lis.length).toBe(Math.max(...best));
    }
  });
});
