/**
 * Ended leases stay reportable for 15 minutes whatever the release rate (src/lease/ended.ts):
 * 1,000 releases a second for 15 minutes of fake time fit the default budget; past a smaller
 * budget the oldest go early and are counted; gateway connection leases are kept apart, so they
 * never push API clients' leases out; leases nobody can name later are not kept at all.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_ENDED_LEASE_BYTES } from '../../../src/lease/ended.ts';
import type { LeaseStoreOptions } from '../../../src/lease/options.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const MINUTE = 60_000;
const stores: LeaseStore[] = [];
function store(clock: FakeClock, opts: LeaseStoreOptions = {}): LeaseStore {
  const s = new LeaseStore({ clock, ...opts });
  stores.push(s);
  s.upsertProxy(proxyInfo('p1'));
  return s;
}
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

/** Grants and releases one lease (for one of 50 sites); returns its id. */
function leaseAndRelease(s: LeaseStore, i: number, lateReports?: 'client' | 'session' | 'none'): string {
  const via = lateReports === undefined || lateReports === 'client' ? 'api' : 'gateway';
  const out = s.lease({ target: `site-${i % 50}.example` }, undefined, via, lateReports);
  if (!out.granted) throw new Error('expected a grant');
  s.release(out.grant.id);
  return out.grant.id;
}

/** A report that changes nothing (`success`): true while the lease is still reportable. */
const reportable = (s: LeaseStore, id: string) => s.report(id, { result: 'success' });

describe('ended leases kept by time', () => {
  it('keeps each of 1,000 releases a second reportable for 15 minutes, in the default budget', () => {
    const clock = new FakeClock();
    const evicted: string[] = [];
    const s = store(clock, { onEndedLeaseEvicted: (h) => evicted.push(h) });
    const firstOfSecond: string[] = [];
    let n = 0;
    for (let second = 0; second < 15 * 60; second++) {
      for (let i = 0; i < 1000; i++) {
        const id = leaseAndRelease(s, n++);
        if (i === 0) firstOfSecond.push(id);
      }
      if (second % 60 === 59) {
        // Every lease of the whole run so far is still reportable (ended < 15 min ago).
        for (let k = 0; k <= second; k += 59) expect(reportable(s, firstOfSecond[k]!)).toBe(true);
      }
      clock.advance(1000);
    }
    // 15 minutes of releases less the first second's, which have just gone.
    const stats = s.endedLeaseStats();
    expect(stats.client.leases).toBe(899_000);
    expect(stats.client.bytes).toBeLessThanOrEqual(DEFAULT_ENDED_LEASE_BYTES);
    // Compact: about 50 bytes a lease, slots, index and targets included.
    expect(stats.client.bytes / stats.client.leases).toBeLessThan(60);
    expect(evicted).toEqual([]);
    // The oldest, released 15 minutes ago, has just gone; a minute later a minute's worth more.
    expect(reportable(s, firstOfSecond[0]!)).toBe(false);
    expect(reportable(s, firstOfSecond[1]!)).toBe(true);
    clock.advance(MINUTE);
    expect(reportable(s, firstOfSecond[60]!)).toBe(false);
    expect(reportable(s, firstOfSecond[61]!)).toBe(true);
    expect(s.endedLeaseStats().client.leases).toBe(839_000);
  });

  it('past a smaller budget forgets the oldest early and counts each', () => {
    const clock = new FakeClock();
    let evicted = 0;
    const budget = 2 ** 20;
    const s = store(clock, { endedLeaseBytes: budget, onEndedLeaseEvicted: () => evicted++ });
    const ids: string[] = [];
    for (let second = 0; second < 60; second++) {
      for (let i = 0; i < 1000; i++) ids.push(leaseAndRelease(s, ids.length));
      clock.advance(1000);
    }
    const stats = s.endedLeaseStats().client;
    expect(stats.bytes).toBeLessThanOrEqual(budget);
    expect(stats.leases + evicted).toBe(60_000);
    expect(evicted).toBeGreaterThan(0);
    // The newest are kept, the oldest went.
    expect(reportable(s, ids[0]!)).toBe(false);
    expect(reportable(s, ids[ids.length - stats.leases]!)).toBe(true);
    expect(reportable(s, ids[ids.length - stats.leases - 1]!)).toBe(false);
  });
});

describe('gateway connection leases are kept apart', () => {
  it('never push API leases out, whatever their number', () => {
    const clock = new FakeClock();
    const evicted: string[] = [];
    const s = store(clock, {
      endedLeaseBytes: 2 ** 20,
      endedConnectionBytes: 2 ** 20,
      onEndedLeaseEvicted: (h) => evicted.push(h),
    });
    const api = Array.from({ length: 1000 }, (_, i) => leaseAndRelease(s, i));
    const sessions: string[] = [];
    for (let i = 0; i < 100_000; i++) sessions.push(leaseAndRelease(s, i, 'session'));
    for (let i = 0; i < 100_000; i++) leaseAndRelease(s, i, 'none');
    for (const id of api) expect(reportable(s, id)).toBe(true);
    // Sessions' leases are reportable too, the newest of them within their own budget.
    expect(reportable(s, sessions.at(-1)!)).toBe(true);
    expect(reportable(s, sessions[0]!)).toBe(false);
    const stats = s.endedLeaseStats();
    expect(stats.client.leases).toBe(1000);
    expect(stats.session.leases + evicted.length).toBe(100_000);
    expect(stats.session.bytes).toBeLessThanOrEqual(2 ** 20);
    expect(new Set(evicted)).toEqual(new Set(['session']));
  });

  it("keeps no lease nobody can report, and only API clients' ended leases in a checkpoint", () => {
    const clock = new FakeClock();
    const s = store(clock);
    const none = leaseAndRelease(s, 0, 'none');
    const session = leaseAndRelease(s, 1, 'session');
    const client = leaseAndRelease(s, 2);
    expect(reportable(s, none)).toBe(false);
    expect(reportable(s, session)).toBe(true);
    expect(s.exportState().ended.map((r) => r[0])).toEqual([client]);
  });
});
