/**
 * test/unit/pool/scale — `kubectl scale pxp/eu --replicas=N` against the Kubernetes REST test server
 * with the real @kubernetes/client-node: the merge patch kubectl sends to the scale subresource
 * changes the pool's spec.replicas, the Scale it reads back carries the pool's status.selector
 * (what an HPA needs), and the PUT an HPA sends works with a resourceVersion precondition.
 */
import { CustomObjectsApi } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import {
  API_VERSION,
  GROUP,
  LABEL_POOL,
  PROXY_POOL_KIND,
  PROXY_POOL_PLURAL,
  VERSION,
} from '../../../src/api/constants.ts';
import { callOptions } from '../../../src/runtime/kube/client.ts';
import type { StoredObject } from '../../../src/runtime/objects/types.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { poolSpec } from '../../support/pool/world.ts';

let server: KubeServer | undefined;
afterEach(async () => {
  await server?.stop();
  server = undefined;
});

/** What kubectl sends: a merge patch (client-node needs the Content-Type set explicitly). */
const mergePatch = callOptions({ patch: 'merge' });

const replicasOf = (s: KubeServer) =>
  (s.resource(PROXY_POOL_PLURAL).read('crawl', 'eu').spec as { replicas: number }).replicas;

const target = { group: GROUP, version: VERSION, namespace: 'crawl', plural: PROXY_POOL_PLURAL, name: 'eu' };

async function seedPool(s: KubeServer): Promise<void> {
  const pools = s.resource(PROXY_POOL_PLURAL);
  pools.create({
    apiVersion: API_VERSION,
    kind: PROXY_POOL_KIND,
    metadata: { name: 'eu', namespace: 'crawl' },
    spec: poolSpec(3),
  } as unknown as StoredObject);
  pools.patch(
    'merge',
    { status: { replicas: 3, selector: `${LABEL_POOL}=eu` } },
    { namespace: 'crawl', name: 'eu', subresource: 'status' },
  );
}

describe('the ProxyPool scale subresource (kubectl scale, HPA)', () => {
  it('a merge patch of spec.replicas, as kubectl scale sends it, changes the pool', async () => {
    server = await startKubeServer();
    await seedPool(server);
    const api = server.kubeConfig().makeApiClient(CustomObjectsApi);
    const scale = (await api.patchNamespacedCustomObjectScale(
      { ...target, body: { spec: { replicas: 20 } } },
      mergePatch,
    )) as { kind: string; spec: { replicas: number }; status: { replicas: number; selector: string } };
    expect(scale).toMatchObject({
      kind: 'Scale',
      spec: { replicas: 20 },
      status: { replicas: 3, selector: `${LABEL_POOL}=eu` },
    });
    expect(replicasOf(server)).toBe(20);
    const log = server.requests.find((r) => r.method === 'PATCH' && r.path.endsWith('/proxypools/eu/scale'));
    expect(log?.contentType).toBe('application/merge-patch+json');
  });

  it('GET and PUT of the Scale, as an HPA uses them, with a resourceVersion precondition', async () => {
    server = await startKubeServer();
    await seedPool(server);
    const api = server.kubeConfig().makeApiClient(CustomObjectsApi);
    const read = (await api.getNamespacedCustomObjectScale(target)) as {
      metadata: { resourceVersion: string };
      spec: { replicas: number };
      status: { selector: string };
    };
    expect(read.spec.replicas).toBe(3);
    expect(read.status.selector).toBe(`${LABEL_POOL}=eu`);
    await api.replaceNamespacedCustomObjectScale({ ...target, body: { ...read, spec: { replicas: 5 } } });
    expect(replicasOf(server)).toBe(5);
    // The old resourceVersion is stale now: a second writer from the same read gets a Conflict.
    await expect(
      api.replaceNamespacedCustomObjectScale({ ...target, body: { ...read, spec: { replicas: 7 } } }),
    ).rejects.toMatchObject({ code: 409 });
  });
});
