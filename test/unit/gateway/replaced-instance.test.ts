/**
 * Gateway scale-out when a proxy's instance is replaced (a new Pod or VM) while a replica holds
 * a share of it: for an unlimited proxy the next share round moves the replica to the new
 * instance — its next connection dials the new address — and the slot lease on the old instance
 * is kept only REPLACED_SLOT_GRACE_MS for the connections still on it, so the old instance's
 * drain ends then instead of at the drain deadline. While no new instance serves yet, and for a
 * limited proxy (its slots are capacity the old instance holds), the slots stay on the old
 * instance until the drain deadline, as before.
 */
import { describe, expect, it } from 'vitest';
import { REPLACED_SLOT_GRACE_MS } from '../../../src/gateway/hub.ts';
import { SYNC_INTERVAL_MS } from '../../../src/gateway/link.ts';
import type { AcquireOutcome } from '../../../src/gateway/upstreams.ts';
import { FakeClock } from '../../support/clock.ts';
import { acquire, newLeader, newReplica, sync } from '../../support/gateway/in-process.ts';
import { proxyInfo } from '../../support/lease.ts';

const TARGET = 'shop.test';

function hostOf(o: AcquireOutcome): string {
  if (!o.ok) throw new Error(`no upstream: ${o.message}`);
  return o.acquired.upstream.host;
}

/** A leader with `p0` on instance i-1 and one replica whose share of it is settled. */
async function world(maxLeases: number) {
  const clock = new FakeClock();
  const leader = newLeader(clock, [proxyInfo('p0', { maxLeases, instance: 'i-1', host: '10.0.0.1' })]);
  const replica = newReplica(clock, () => leader);
  const round = async () => {
    clock.advance(SYNC_INTERVAL_MS);
    await sync(replica);
  };
  for (let i = 0; i < 3; i++) await round();
  const replace = () =>
    leader.store.upsertProxy(
      proxyInfo('p0', {
        maxLeases,
        instance: 'i-2',
        host: '10.0.0.2',
        drainingInstances: [
          { providerID: 'i-1', host: '10.0.0.1', port: 3128, since: new Date(clock.now()).toISOString() },
        ],
      }),
    );
  const leasesOn = (instance: string) => leader.store.leasesOn('crawl/p0', instance);
  return { clock, leader, replica, round, replace, leasesOn };
}

describe('an instance replaced under a replica’s share', () => {
  it('unlimited proxy: the next round dials the new instance; the old one is let go after the grace', async () => {
    const { clock, replica, round, replace, leasesOn } = await world(0);
    const before = await acquire(replica, clock, TARGET);
    expect(hostOf(before)).toBe('10.0.0.1');
    replace();
    await round();
    const after = await acquire(replica, clock, TARGET);
    expect(hostOf(after)).toBe('10.0.0.2');
    expect(leasesOn('i-2')).toBe(1);
    // The connection opened before still has its instance: kept through the grace.
    const graceRounds = Math.floor(REPLACED_SLOT_GRACE_MS / SYNC_INTERVAL_MS) - 2;
    for (let i = 0; i < graceRounds; i++) await round();
    expect(leasesOn('i-1')).toBe(1);
    for (let i = 0; i < 3; i++) await round();
    expect(leasesOn('i-1')).toBe(0);
    expect(leasesOn('i-2')).toBe(1);
    if (before.ok) replica.chooser.release(before.acquired);
    if (after.ok) replica.chooser.release(after.acquired);
  });

  it('unlimited proxy whose new instance is not there yet: the share stays on the old one', async () => {
    const { clock, leader, replica, round, leasesOn } = await world(0);
    expect(hostOf(await acquire(replica, clock, TARGET))).toBe('10.0.0.1');
    // The old instance drains, and no new one serves yet (no instance, no address).
    leader.store.upsertProxy(
      proxyInfo('p0', {
        host: '',
        drainingInstances: [
          { providerID: 'i-1', host: '10.0.0.1', port: 3128, since: new Date(clock.now()).toISOString() },
        ],
      }),
    );
    // Past the grace a replaced instance gets: the slot is still the replica's, on the old one.
    for (let i = 0; i < REPLACED_SLOT_GRACE_MS / SYNC_INTERVAL_MS + 5; i++) await round();
    expect(leasesOn('i-1')).toBe(1);
  });

  it('limited proxy: its slots stay on the old instance, as the capacity it holds', async () => {
    const { clock, replica, round, replace, leasesOn } = await world(2);
    const before = await acquire(replica, clock, TARGET);
    expect(hostOf(before)).toBe('10.0.0.1');
    const held = leasesOn('i-1');
    expect(held).toBeGreaterThan(0);
    replace();
    for (let i = 0; i < 5; i++) await round();
    expect(leasesOn('i-1')).toBe(held);
    if (before.ok) replica.chooser.release(before.acquired);
  });
});
