import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../src/api/constants.ts';
import { createHarness, NS } from './harness.ts';

const mk = createHarness;
const tick = () => new Promise((r) => setTimeout(r, 5));

describe('reconciler watch sources', () => {
  it('enqueues on spec, annotation and deletion changes but not on status-only writes', async () => {
    const h = await mk();
    const keys: string[] = [];
    const off = h.rec.watchSources((k) => keys.push(k));
    await h.seed('eu-1');
    await tick();
    expect(keys).toEqual([`${NS}/eu-1`]);
    keys.length = 0;

    await h.store.proxies.patchStatus({ namespace: NS, name: 'eu-1' }, { health: { latencyMillis: 3 } });
    await tick();
    expect(keys).toEqual([]);

    let p = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...p, spec: { ...p.spec, port: 3129 } });
    await tick();
    expect(keys).toEqual([`${NS}/eu-1`]);
    keys.length = 0;

    p = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...p, metadata: { ...p.metadata, annotations: { a: 'b' } } });
    await tick();
    expect(keys).toEqual([`${NS}/eu-1`]);
    off();
  });

  it('requeues the Proxies that read a labelled cloud-init Secret or their credentials Secret', async () => {
    const h = await mk();
    await h.seed('uses-init', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
    await h.seed('other');
    const keys: string[] = [];
    const off = h.rec.watchSources((k) => keys.push(k));
    await tick();
    keys.length = 0;

    await h.seedSecret({
      metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': 'eA==' },
    });
    await tick();
    expect(keys).toEqual([`${NS}/uses-init`]);
    keys.length = 0;

    await h.seedSecret({
      metadata: { name: 'other-auth', namespace: NS, labels: { [LABEL_CREDENTIALS_FOR]: 'other' } },
      data: { username: 'dQ==', password: 'cA==' },
    });
    await tick();
    expect(keys).toEqual([`${NS}/other`]);
    off();
  });

  it('reconciles a Proxy whose Secret appears through the watch, end to end', async () => {
    const h = await mk();
    const keys = new Set<string>();
    const off = h.rec.watchSources((k) => keys.add(k));
    await h.seed('eu-1', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
    await tick();
    expect((await h.attempt('eu-1')).error).toBeDefined();
    keys.clear();
    await h.seedSecret({
      metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': 'eA==' },
    });
    await tick();
    expect([...keys]).toEqual([`${NS}/eu-1`]);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status?.phase).toBe('Ready');
    off();
  });
});
