/**
 * The state route sends what changed: a viewer that holds a revision is sent only the rows that
 * changed after it and the keys that went, so an idle poll is the same few hundred bytes at
 * 100 or 10,000 proxies; a first load reads the fleet in pages by key; a revision the server
 * cannot answer from (too old, another process's) gets the fleet anew. The history is sent for
 * the rows a page shows only.
 */
import { describe, expect, it } from 'vitest';
import { Dashboard } from '../../../src/dashboard/dashboard.ts';
import { RowLog } from '../../../src/dashboard/row-log.ts';
import type { DashboardState, FleetRow } from '../../../src/dashboard/web/types.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

function world(proxies: number) {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const leases = new LeaseStore({ clock });
  for (let i = 0; i < proxies; i++)
    leases.upsertProxy(proxyInfo(`p-${String(i).padStart(5, '0')}`, { latencyMillis: 10 }));
  const dashboard = new Dashboard({ leases, store, clock });
  const text = (q: Parameters<Dashboard['stateJson']>[1] = {}, after = 0) => dashboard.stateJson(after, q);
  const state = (q: Parameters<Dashboard['stateJson']>[1] = {}, after = 0) =>
    JSON.parse(text(q, after)) as DashboardState;
  /** The next sample: the dashboard re-samples once its last one is half a second old. */
  const later = () => clock.advance(1000);
  return { clock, leases, dashboard, state, text, later };
}

const keys = (rows: readonly FleetRow[]) => rows.map((r) => r.key);

describe('dashboard state deltas', () => {
  it('sends only the rows that changed since the revision held, and the keys that went', () => {
    const { leases, state, later } = world(5);
    const first = state();
    expect(first.full).toBe(true);
    expect(first.removed).toEqual([]);
    expect(first.next).toBeNull();
    expect(keys(first.proxies)).toEqual([
      'crawl/p-00000',
      'crawl/p-00001',
      'crawl/p-00002',
      'crawl/p-00003',
      'crawl/p-00004',
    ]);

    later();
    const idle = state({ since: first.revision });
    expect(idle).toMatchObject({ full: false, proxies: [], removed: [] });
    expect(idle.revision).toBeGreaterThan(first.revision);
    // The totals and panels come whole every time: they are small.
    expect(idle.totals.proxies).toBe(5);

    leases.setHealth('crawl/p-00002', 'uid-p-00002', { healthy: false });
    leases.removeProxy('crawl/p-00004');
    leases.upsertProxy(proxyInfo('p-00009'));
    later();
    const delta = state({ since: idle.revision });
    expect(delta.full).toBe(false);
    expect(keys(delta.proxies).sort()).toEqual(['crawl/p-00002', 'crawl/p-00009']);
    expect(delta.proxies.find((r) => r.key === 'crawl/p-00002')?.healthy).toBe(false);
    expect(delta.removed).toEqual(['crawl/p-00004']);
    expect(delta.totals).toMatchObject({ proxies: 5, healthy: 4 });

    // A viewer two revisions behind is sent both revisions' changes.
    expect(keys(state({ since: first.revision }).proxies).sort()).toEqual(['crawl/p-00002', 'crawl/p-00009']);
  });

  it('keeps an idle poll the same size at 100 and 10,000 proxies', () => {
    const idleBytes = (n: number) => {
      const { text, state, later } = world(n);
      const { revision } = state();
      later();
      return Buffer.byteLength(text({ since: revision }));
    };
    const small = idleBytes(100);
    const large = idleBytes(10_000);
    // Only numbers of more digits differ (the totals, the pool counts).
    expect(large - small).toBeLessThan(64);
    expect(large).toBeLessThan(2048);
  });

  it('loads the fleet in pages by key, and the rows that changed meanwhile come with the next poll', () => {
    const { leases, state, later } = world(6);
    const first = state({ limit: 2 });
    expect(first).toMatchObject({ full: true, next: 'crawl/p-00001' });
    expect(keys(first.proxies)).toEqual(['crawl/p-00000', 'crawl/p-00001']);
    // Between two pages: one row already read changes, one not yet read goes.
    leases.setHealth('crawl/p-00000', 'uid-p-00000', { healthy: false });
    leases.removeProxy('crawl/p-00003');
    later();
    const second = state({ from: first.next ?? '', limit: 2 });
    expect(second).toMatchObject({ full: true, next: 'crawl/p-00004' });
    expect(keys(second.proxies)).toEqual(['crawl/p-00002', 'crawl/p-00004']);
    const third = state({ from: second.next ?? '', limit: 2 });
    expect(third).toMatchObject({ full: true, next: null });
    expect(keys(third.proxies)).toEqual(['crawl/p-00005']);
    const caughtUp = state({ since: first.revision });
    expect(caughtUp.full).toBe(false);
    expect(keys(caughtUp.proxies)).toEqual(['crawl/p-00000']);
    expect(caughtUp.removed).toEqual(['crawl/p-00003']);
  });

  it("answers a revision it cannot account for with the whole fleet: another process's, or one too old", () => {
    const { state, later } = world(3);
    const { revision } = state();
    expect(state({ since: revision + 1000 })).toMatchObject({ full: true, next: null });
    expect(state({ since: revision + 1000 }).proxies).toHaveLength(3);
    expect(state({ since: 0 }).full).toBe(true);
    later();
    expect(state({ since: revision }).full).toBe(false);
  });

  it('forgets removals older than the revisions it keeps, and then answers with the fleet', () => {
    const log = new RowLog(100, 3);
    log.apply([{ key: 'a' }, { key: 'b' }]);
    const held = log.revision;
    log.apply([{ key: 'a' }]);
    expect(log.since(held)).toMatchObject({ full: false, removed: '["b"]', count: 0 });
    for (let i = 0; i < 3; i++) log.apply([{ key: 'a' }]);
    expect(log.since(held)).toBeUndefined();
    expect(log.page(undefined)).toMatchObject({ full: true, proxies: '[{"key":"a"}]', next: null });
  });

  it('starts its revisions from the clock, so a restarted server never answers an old page as a delta', () => {
    const { state, clock } = world(1);
    const before = state().revision;
    clock.advance(1000);
    const restarted = new Dashboard({
      leases: new LeaseStore({ clock }),
      store: createMemoryStore({ clock }),
      clock,
    });
    const after = JSON.parse(restarted.stateJson(0, { since: before })) as DashboardState;
    expect(after.full).toBe(true);
  });

  it("sends the history of the proxies asked for only (the page's rows)", () => {
    const { dashboard, state } = world(5);
    state();
    const body = JSON.parse(dashboard.historyJsonText(['crawl/p-00001', 'crawl/p-00003', 'crawl/none'])) as {
      series: Record<string, unknown>;
    };
    expect(Object.keys(body.series)).toEqual(['crawl/p-00001', 'crawl/p-00003']);
    expect(Object.keys(JSON.parse(dashboard.historyJsonText()).series)).toHaveLength(5);
  });
});
