/**
 * Selecting on where a proxy runs: the lease feed carries status.location, the lease store's
 * selectors (grants, snapshots, cached views) match it as topology.kubernetes.io/region and
 * /zone beside the proxy's labels, and a gateway replica's mirror selects on it the same way
 * from the leader's sync answer (the `zone-…` user-name option).
 */
import { describe, expect, it } from 'vitest';
import { parseUsername } from '../../../src/gateway/username.ts';
import { proxyInfo as feedInfo } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { acquire, newLeader, newReplica, stepDown, sync } from '../../support/gateway/in-process.ts';
import { proxyInfo } from '../../support/lease.ts';

const ZONE = 'topology.kubernetes.io/zone';
const REGION = 'topology.kubernetes.io/region';

function fleet() {
  return [
    proxyInfo('b1', { location: { region: 'europe-west1', zone: 'europe-west1-b' }, labels: { pool: 'eu' } }),
    proxyInfo('c1', { location: { region: 'europe-west1', zone: 'europe-west1-c' }, labels: { pool: 'eu' } }),
    proxyInfo('nas', { location: { zone: 'nas1' } }),
    // No location: its own label of the topology key is what selectors see.
    proxyInfo('ext', { labels: { [ZONE]: 'europe-west1-b' } }),
  ];
}

function routingSelector(username: string): string {
  const parsed = parseUsername(username);
  if (!parsed.ok) throw new Error(parsed.message);
  return parsed.options.selector ?? '';
}

describe('lease selectors on location', () => {
  it('grants and lists by region and zone, beside the labels', () => {
    const store = new LeaseStore({ clock: new FakeClock() });
    try {
      for (const p of fleet()) store.upsertProxy(p);
      const names = (selector: string) => store.snapshot({ selector }).map((s) => s.name);
      expect(names(`${ZONE}=europe-west1-b`)).toEqual(['b1', 'ext']);
      expect(names(`${REGION}=europe-west1,pool=eu`)).toEqual(['b1', 'c1']);
      expect(names(`${ZONE} in (nas1,europe-west1-c)`)).toEqual(['c1', 'nas']);
      expect(names(`!${REGION}`)).toEqual(['ext', 'nas']);
      expect(names(routingSelector('crawler-region-europe-west1-zone-europe-west1-c'))).toEqual(['c1']);
      // Listings show it; a proxy without one has no `location` field.
      const [nas] = store.snapshot({ selector: `${ZONE}=nas1` });
      expect(nas?.location).toEqual({ zone: 'nas1' });
      expect(store.snapshot({ selector: '!pool' }).find((s) => s.name === 'ext')).not.toHaveProperty(
        'location',
      );
      const g = store.lease({ selector: `${ZONE}=nas1` });
      expect(g.granted && g.grant.proxy.name).toBe('nas');
    } finally {
      store.close();
    }
  });

  it('a proxy whose instance moves moves between cached views', () => {
    const store = new LeaseStore({ clock: new FakeClock() });
    try {
      store.upsertProxy(proxyInfo('m', { location: { zone: 'a' } }));
      expect(store.lease({ selector: `${ZONE}=a`, ttlSeconds: 1 }).granted).toBe(true);
      expect(store.lease({ selector: `${ZONE}=b` }).granted).toBe(false);
      store.upsertProxy(proxyInfo('m', { location: { zone: 'b' } }));
      expect(store.lease({ selector: `${ZONE}=b` }).granted).toBe(true);
      expect(store.lease({ selector: `${ZONE}=a` }).granted).toBe(false);
      // A location that goes away takes its topology keys with it.
      store.upsertProxy(proxyInfo('m'));
      expect(store.snapshot({ selector: ZONE })).toEqual([]);
    } finally {
      store.close();
    }
  });

  it('the lease feed carries status.location', () => {
    const info = feedInfo(
      {
        apiVersion: 'crawl.example.com/v1alpha1',
        kind: 'Proxy',
        metadata: { name: 'p', namespace: 'crawl', uid: 'u' },
        spec: { type: 'Managed', provider: 'gcp' },
        status: { phase: 'Ready', address: '10.0.0.1', location: { region: 'eu', zone: 'eu-b' } },
      },
      undefined,
    );
    expect(info.location).toEqual({ region: 'eu', zone: 'eu-b' });
  });

  it("a gateway replica's mirror selects on the location the leader sends", async () => {
    const clock = new FakeClock();
    const leader = newLeader(clock, fleet());
    const replica = newReplica(clock, () => leader);
    try {
      for (let i = 0; i < 3; i++) await sync(replica);
      const got = await acquire(replica, clock, 'shop.example', {
        selector: routingSelector('crawler-zone-europe-west1-c'),
      });
      expect(got.ok && got.acquired.upstream.key).toBe('crawl/c1');
      if (got.ok) replica.chooser.release(got.acquired);
      const none = await acquire(replica, clock, 'shop.example', {
        selector: routingSelector('crawler-zone-elsewhere-1'),
      });
      expect(none.ok).toBe(false);
    } finally {
      replica.chooser.close();
      stepDown(leader);
    }
  });
});
