import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../../src/api/constants.ts';
import { createHarness, type Harness, NS } from '../../support/controller/harness.ts';
import { until } from '../../support/wait.ts';

const mk = createHarness;
const FENCE = 'fence-';

/**
 * Waits until the watch has delivered every event of the writes made so far, and returns the
 * keys enqueued meanwhile (fences left out). A fence Proxy is created after those writes; its
 * creation enqueues its own key, and the store delivers the events of all its collections in
 * commit order (one dispatcher, src/runtime/objects/store-adapter.ts). So once the fence key is
 * there, a key that is not there was never enqueued: absence is checked after an explicit
 * event, never after a guessed delay.
 */
function fences(h: Harness, keys: () => readonly string[]) {
  let n = 0;
  return async (): Promise<string[]> => {
    const name = `${FENCE}${++n}`;
    await h.seed(name);
    await until(`the watch to deliver the creation of ${name}`, () => keys().includes(`${NS}/${name}`));
    return keys().filter((k) => !k.startsWith(`${NS}/${FENCE}`));
  };
}

describe('reconciler watch sources', () => {
  it('enqueues on spec, annotation and deletion changes but not on status-only writes', async () => {
    const h = await mk();
    const keys: string[] = [];
    const off = h.rec.watchSources((k) => keys.push(k));
    const settled = fences(h, () => keys);
    await h.seed('eu-1');
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    keys.length = 0;

    await h.store.proxies.patchStatus({ namespace: NS, name: 'eu-1' }, { health: { latencyMillis: 3 } });
    expect(await settled()).toEqual([]);
    keys.length = 0;

    let p = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...p, spec: { ...p.spec, port: 3129 } });
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    keys.length = 0;

    p = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...p, metadata: { ...p.metadata, annotations: { a: 'b' } } });
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    keys.length = 0;

    // Deletion of an object with a finalizer: the deletion timestamp is the change.
    p = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...p, metadata: { ...p.metadata, finalizers: ['test/hold'] } });
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    keys.length = 0;
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    expect(h.proxy('eu-1')?.metadata.deletionTimestamp).toBeDefined();
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    off();
  });

  it('requeues the Proxies that read a labelled cloud-init Secret or their credentials Secret', async () => {
    const h = await mk();
    await h.seed('uses-init', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
    await h.seed('other');
    const keys: string[] = [];
    const off = h.rec.watchSources((k) => keys.push(k));
    const settled = fences(h, () => keys);
    // The watch replays the Proxies that exist as ADDED.
    expect((await settled()).sort()).toEqual([`${NS}/other`, `${NS}/uses-init`]);
    keys.length = 0;

    await h.seedSecret({
      metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': 'eA==' },
    });
    expect(await settled()).toEqual([`${NS}/uses-init`]);
    keys.length = 0;

    await h.seedSecret({
      metadata: { name: 'other-auth', namespace: NS, labels: { [LABEL_CREDENTIALS_FOR]: 'other' } },
      data: { username: 'dQ==', password: 'cA==' },
    });
    expect(await settled()).toEqual([`${NS}/other`]);
    off();
  });

  it('reconciles a Proxy whose Secret appears through the watch, end to end', async () => {
    const h = await mk();
    const keys: string[] = [];
    const off = h.rec.watchSources((k) => keys.push(k));
    const settled = fences(h, () => keys);
    await h.seed('eu-1', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    expect((await h.attempt('eu-1')).error).toBeDefined();
    keys.length = 0;
    await h.seedSecret({
      metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': 'eA==' },
    });
    expect(await settled()).toEqual([`${NS}/eu-1`]);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status?.phase).toBe('Ready');
    off();
  });
});
