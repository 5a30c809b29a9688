/**
 * test/unit/runtime/owners — ownerReference garbage collection on the object engine, as the
 * standalone store and the REST test server run it: a dependent goes once all its owners are
 * gone, through its finalizers; one left behind by a crash is collected when collection
 * starts; a dependent of a kind the engine does not serve is never judged.
 */
import { describe, expect, it } from 'vitest';
import { ObjectEngine } from '../../../src/runtime/objects/engine.ts';
import { collectOwnedObjects } from '../../../src/runtime/objects/owners.ts';
import {
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  SECRET_RESOURCE,
  type StoredObject,
} from '../../../src/runtime/objects/types.ts';

const ref = (o: StoredObject) => ({
  apiVersion: o.apiVersion as string,
  kind: o.kind as string,
  name: o.metadata.name,
  uid: o.metadata.uid as string,
  controller: true,
});

function engine(): ObjectEngine {
  const e = new ObjectEngine();
  for (const t of [PROXY_RESOURCE, PROXY_POOL_RESOURCE, SECRET_RESOURCE]) e.register(t);
  return e;
}

function seed(e: ObjectEngine) {
  const pools = e.collection(PROXY_POOL_RESOURCE);
  const proxies = e.collection(PROXY_RESOURCE);
  const a = pools.create({ metadata: { name: 'a', namespace: 'crawl' }, spec: {} } as StoredObject);
  const b = pools.create({ metadata: { name: 'b', namespace: 'crawl' }, spec: {} } as StoredObject);
  const mk = (name: string, owners: StoredObject[], finalizers?: string[]) =>
    proxies.create({
      metadata: {
        name,
        namespace: 'crawl',
        ownerReferences: owners.map(ref),
        ...(finalizers ? { finalizers } : {}),
      },
      spec: {},
    } as StoredObject);
  mk('only-a', [a], ['crawl.example.com/instance-cleanup']);
  mk('a-and-b', [a, b]);
  mk('free', []);
  return { pools, proxies };
}

describe('ownerReference garbage collection', () => {
  it('deletes dependents whose owners are all gone, through their finalizers', async () => {
    const e = engine();
    const gc = collectOwnedObjects(e);
    const { pools, proxies } = seed(e);
    pools.delete('crawl', 'a');
    await gc.settled();
    // Its finalizer holds it: deletion requested, the reconciler finishes it.
    expect(proxies.get('crawl', 'only-a')?.metadata.deletionTimestamp).toBeDefined();
    expect(proxies.get('crawl', 'a-and-b')?.metadata.deletionTimestamp).toBeUndefined();
    pools.delete('crawl', 'b');
    await gc.settled();
    expect(proxies.get('crawl', 'a-and-b')).toBeUndefined();
    expect(proxies.get('crawl', 'free')).toBeDefined();
    gc.stop();
  });

  it('collects dependents orphaned while nobody collected (a crash, a restored state file)', async () => {
    const before = engine();
    const { pools } = seed(before);
    pools.delete('crawl', 'a');
    pools.delete('crawl', 'b');
    const secret = before.collection(SECRET_RESOURCE).create({
      metadata: {
        name: 's',
        namespace: 'crawl',
        ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: 'p', uid: 'gone' }],
      },
    } as StoredObject);
    const after = engine();
    after.restore(before.snapshot());
    const gc = collectOwnedObjects(after);
    await gc.settled();
    const proxies = after.collection(PROXY_RESOURCE);
    expect(proxies.get('crawl', 'only-a')?.metadata.deletionTimestamp).toBeDefined();
    expect(proxies.get('crawl', 'a-and-b')).toBeUndefined();
    // A Pod is not served here: its absence proves nothing.
    expect(after.collection(SECRET_RESOURCE).get('crawl', 's')?.metadata.uid).toBe(secret.metadata.uid);
    gc.stop();
  });
});
