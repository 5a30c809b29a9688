/**
 * The page's pure logic (dashboard/web/format), run under Node: time left as people read it,
 * filtering by every word typed, and sorting that keeps ties in name order.
 */
import { describe, expect, it } from 'vitest';
import { activeCooldowns, matchesQuery, sortRows, timeLeft } from '../../../src/dashboard/web/format.ts';
import type { FleetRow } from '../../../src/dashboard/web/types.ts';

const NOW = Date.parse('2026-01-01T00:00:00Z');

function row(name: string, over: Partial<FleetRow> = {}): FleetRow {
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    pool: null,
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
        { target: 'old.example', until: new Date(NOW - 1).toISOString() },
        { target: 'shop.example', until: new Date(NOW + 60_000).toISOString() },
      ],
    });
    expect(activeCooldowns(r, NOW)).toEqual([
      { target: null, until: NOW + 5000 },
      { target: 'shop.example', until: NOW + 60_000 },
    ]);
  });
});

describe('matchesQuery', () => {
  const r = row('eu-1', {
    pool: 'research',
    egressIP: '203.0.113.9',
    targetCooldowns: [{ target: 'shop.example', until: '' }],
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
