import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET } from '../../../src/api/constants.ts';
import { WorkQueue } from '../../../src/runtime/workqueue.ts';
import { createHarness, NS } from '../../support/controller/harness.ts';
import { until as waitUntil } from '../../support/wait.ts';

const until = (cond: () => boolean, ms = 10_000) => waitUntil('condition', cond, ms);

describe('reconciler on the real work queue', () => {
  it('brings 20 Proxies up (one waiting for its cloud-init Secret) and tears them down', async () => {
    const h = await createHarness({
      backend: 'embedded',
      fake: { pendingGets: 2 },
      options: { provisionPollMs: 20, deletionPollMs: 20 },
    });
    const queue = new WorkQueue({ name: 'proxies', baseDelayMs: 10, maxDelayMs: 50 });
    const stop = new AbortController();
    const off = h.rec.watchSources((k) => queue.add(k));
    const workers = queue.runWorkers({
      concurrency: 4,
      signal: stop.signal,
      process: (key) => h.rec.reconcile(key, stop.signal),
    });
    const names = Array.from({ length: 20 }, (_, i) => `q-${i}`);
    for (const n of names.slice(1)) await h.seed(n);
    await h.seed(names[0]!, { cloudInit: { secretRef: { name: 'late', key: 'user-data' } } });
    const ready = () => names.filter((n) => h.proxy(n)?.status?.phase === 'Ready').length;
    await until(() => ready() === 19);
    expect(h.proxy(names[0]!)?.status?.conditions?.[0]?.reason).toBe('CloudInitError');

    await h.seedSecret({
      metadata: { name: 'late', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': Buffer.from('#cloud-config\n').toString('base64') },
    });
    await until(() => ready() === 20);
    expect(h.fake.instances.size).toBe(20);

    for (const n of names) await h.store.proxies.delete({ namespace: NS, name: n });
    await until(() => names.every((n) => h.proxy(n) === undefined));
    expect(h.fake.instances.size).toBe(0);

    stop.abort();
    await workers;
    off();
  });
});
