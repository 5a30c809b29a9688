/**
 * End to end on loopback: the engine with the real probe, a real Squid and a real TLS origin
 * marks a proxy with the right credentials Healthy and one with wrong credentials Unhealthy
 * (ProxyAuthRequired), through the in-memory store.
 */
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { CONDITION_HEALTHY } from '../../../src/api/constants.ts';
import { HealthEngine, type HealthVerdict } from '../../../src/health/engine.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { type Origin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { type Squid, startSquid } from '../../support/squid.ts';

let squid: Squid;
let origin: Origin;

beforeAll(async () => {
  [squid, origin] = await Promise.all([startSquid(), startTlsOrigin()]);
});

afterAll(async () => {
  await Promise.all([squid?.stop(), origin?.close()]);
});

it('probes real proxies and writes the Healthy condition', async () => {
  const store = createMemoryStore();
  for (const [name, password] of [
    ['good', squid.password],
    ['bad', `${squid.password}-wrong`],
  ] as const) {
    store.seedSecret({
      metadata: { name: `${name}-creds`, namespace: 'crawl' },
      stringData: { username: squid.username, password },
    });
    store.seedProxy({
      metadata: { name, namespace: 'crawl' },
      spec: {
        type: 'External',
        endpoint: { host: squid.host, port: squid.port },
        credentialsSecretRef: { name: `${name}-creds` },
      },
    });
  }
  const verdicts: HealthVerdict[] = [];
  const engine = new HealthEngine({
    store,
    ca: testPki().caCert,
    defaults: { url: `${origin.baseUrl}/generate_204`, intervalMs: 200 },
    listener: (v) => verdicts.push(v),
  });
  const cond = (name: string) =>
    store.proxies
      .get({ namespace: 'crawl', name })
      ?.status?.conditions?.find((c) => c.type === CONDITION_HEALTHY);
  engine.start();
  try {
    // The status writes land after the verdicts: wait for both conditions, not a fixed time.
    await vi.waitFor(() => expect(verdicts.length >= 2 && cond('good') && cond('bad')).toBeTruthy(), {
      timeout: 10_000,
      interval: 50,
    });
  } finally {
    await engine.stop();
  }
  expect(cond('good')).toMatchObject({ status: 'True', reason: 'ProbeSucceeded' });
  expect(cond('bad')).toMatchObject({ status: 'False', reason: 'ProxyAuthRequired' });
  expect(JSON.stringify(store.proxies.list())).not.toContain(squid.password);
  expect(verdicts.find((v) => v.key === 'crawl/good')).toMatchObject({ healthy: true });
  expect(verdicts.find((v) => v.key === 'crawl/bad')).toMatchObject({
    healthy: false,
    reason: 'ProxyAuthRequired',
  });
});
