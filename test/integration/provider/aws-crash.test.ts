/**
 * Crash safety of the aws provider under the Proxy reconciler: Proxies created, replaced (a
 * zone change) and deleted through the real SDK against moto's server, with the reconciler
 * "killed" at random before and after every provider call and status write
 * (test/support/controller/chaos.ts) and restarted. At the end of each phase moto holds exactly
 * one live instance per Proxy, the one its status names — 0 leaked, 0 duplicated — and none
 * after deletion. Integration tier: moto_server is a child process (test/support/moto.ts).
 */
import { DescribeInstancesCommand, type EC2Client } from '@aws-sdk/client-ec2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_VERSION, PROXY_KIND } from '../../../src/api/constants.ts';
import { createProxyReconciler, type ProxyReconciler } from '../../../src/controller/reconciler.ts';
import { type AwsProvider, createAwsProvider } from '../../../src/provider/aws/index.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { Chaos } from '../../support/controller/chaos.ts';
import { NS, testOptions } from '../../support/controller/harness.ts';
import { MOTO_CREDENTIALS, type Moto, motoEc2, seedRegion, startMoto } from '../../support/moto.ts';
import { TEST_SEED } from '../../support/random.ts';

const REGION = 'eu-west-1';
const COUNT = 20;
let moto: Moto;
let ec2: EC2Client;
let provider: AwsProvider;

beforeAll(async () => {
  moto = await startMoto();
  const seed = await seedRegion(moto.url, REGION, [`${REGION}a`, `${REGION}b`]);
  ec2 = motoEc2(moto.url, REGION);
  provider = createAwsProvider({
    name: 'aws',
    config: {
      regions: [{ name: REGION, subnets: seed.subnets }],
      images: { default: seed.imageId },
      securityGroup: { sourceRanges: ['203.0.113.0/24'] },
      endpoint: moto.url,
    },
    clientOptions: { credentials: MOTO_CREDENTIALS, maxAttempts: 1 },
  });
}, 60_000);

afterAll(async () => {
  await provider?.close();
  ec2?.destroy();
  await moto?.close();
});

/** Live managed instances in moto, by Proxy UID tag. */
async function liveByUid(): Promise<Map<string, { name: string; zone: string }[]>> {
  const out = await ec2.send(
    new DescribeInstancesCommand({
      Filters: [
        { Name: 'tag:proxy-operator-managed', Values: ['true'] },
        { Name: 'instance-state-name', Values: ['pending', 'running', 'stopping', 'stopped'] },
      ],
    }),
  );
  const by = new Map<string, { name: string; zone: string }[]>();
  for (const i of (out.Reservations ?? []).flatMap((r) => r.Instances ?? [])) {
    const tag = (k: string) => i.Tags?.find((t) => t.Key === k)?.Value ?? '';
    const uid = tag('proxy-operator-uid');
    by.set(uid, [...(by.get(uid) ?? []), { name: tag('Name'), zone: i.Placement?.AvailabilityZone ?? '' }]);
  }
  return by;
}

async function converge(
  chaos: Chaos,
  rec: { current: ProxyReconciler; make: () => ProxyReconciler },
  keys: string[],
): Promise<void> {
  let pending = new Set(keys);
  for (let round = 0; round < 200 && pending.size > 0; round++) {
    const next = new Set<string>();
    for (const key of pending) {
      const signal = chaos.begin();
      try {
        const res = await rec.current.reconcile(key, signal);
        if (res.requeueAfter) next.add(key);
      } catch {
        if (signal.aborted) rec.current = rec.make();
        next.add(key);
      }
    }
    pending = next;
  }
  expect([...pending], `not converged (TEST_SEED=${TEST_SEED})`).toEqual([]);
}

async function expectOnePerProxy(store: ObjectStore, names: string[], zone: string): Promise<void> {
  const live = await liveByUid();
  for (const name of names) {
    const p = store.proxies.get({ namespace: NS, name })!;
    expect(p.status?.phase, name).toBe('Ready');
    const mine = live.get(p.metadata.uid!) ?? [];
    expect(mine, `${name}: duplicated or missing`).toHaveLength(1);
    expect(`regions/${REGION}/instances/${mine[0]?.name}`).toBe(p.status?.providerID);
    expect(mine[0]?.zone).toBe(zone);
    live.delete(p.metadata.uid!);
  }
  expect([...live.keys()], 'leaked instances').toEqual([]);
}

describe('aws provider crash safety (moto)', () => {
  it(`${COUNT} Proxies created, replaced and deleted with random kills: 0 leaked, 0 duplicated (TEST_SEED=${TEST_SEED})`, async () => {
    const store = createMemoryStore();
    const chaos = new Chaos(TEST_SEED);
    chaos.rate = 0.15;
    const providers = new Map([['aws', chaos.wrapProvider(provider)]]);
    const make = () =>
      createProxyReconciler({
        store: chaos.wrapStore(store),
        providers,
        options: testOptions,
        installation: 'crash-test',
      });
    const rec = { current: make(), make };
    const names = Array.from({ length: COUNT }, (_, i) => `p-${i}`);
    const keys = names.map((n) => `${NS}/${n}`);
    for (const name of names) {
      await store.proxies.create({
        apiVersion: API_VERSION,
        kind: PROXY_KIND,
        metadata: { name, namespace: NS },
        spec: { provider: 'aws', placement: { zone: `${REGION}a` } },
      });
    }
    await converge(chaos, rec, keys);
    await expectOnePerProxy(store, names, `${REGION}a`);

    for (const name of names) {
      const p = store.proxies.get({ namespace: NS, name })!;
      await store.proxies.update({ ...p, spec: { ...p.spec, placement: { zone: `${REGION}b` } } });
    }
    await converge(chaos, rec, keys);
    await expectOnePerProxy(store, names, `${REGION}b`);

    for (const name of names) await store.proxies.delete({ namespace: NS, name });
    await converge(chaos, rec, keys);
    expect(store.proxies.list()).toEqual([]);
    expect([...(await liveByUid()).keys()], 'leaked instances').toEqual([]);
    expect(chaos.kills).toBeGreaterThan(10);
  }, 180_000);
});
