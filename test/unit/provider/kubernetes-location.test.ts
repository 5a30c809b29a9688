/**
 * The kubernetes provider's location: a scheduled Pod reports its Node's region label and zone
 * label (`zoneLabel`) as region and zone, each Node read once per cache period; an unscheduled Pod, a Node without
 * the labels, a Node gone or not readable (no `get nodes`) give no location and never fail a get.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKubernetesProvider, type KubernetesProvider } from '../../../src/provider/kubernetes/index.ts';
import { createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import type { ResourceType } from '../../../src/runtime/objects/types.ts';
import { DEFAULT_RESOURCES, type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { captureLog } from '../../support/log.ts';
import { callContext as ctx, createRequest as req } from '../../support/provider-calls.ts';

const NODE_RESOURCE: ResourceType = {
  group: '',
  version: 'v1',
  kind: 'Node',
  plural: 'nodes',
  namespaced: false,
  statusSubresource: true,
  generation: false,
  unconditionalUpdate: true,
};

describe('kubernetes provider: region and zone from the Node', () => {
  let server: KubeServer;
  let clients: KubeClients;
  let provider: KubernetesProvider;
  const captured = captureLog('debug');

  beforeAll(async () => {
    server = await startKubeServer({ resources: [...DEFAULT_RESOURCES, NODE_RESOURCE] });
    clients = await createKubeClients(server.kubeConfig());
    provider = createKubernetesProvider({
      name: 'k8s',
      config: { namespace: 'proxies' },
      core: clients.core,
      log: captured.log,
    });
    const node = (name: string, labels: Record<string, string>) =>
      server.resource('nodes').create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels } });
    node('node-a', {
      'topology.kubernetes.io/region': 'europe-west1',
      'topology.kubernetes.io/zone': 'europe-west1-b',
    });
    node('node-bare', { 'kubernetes.io/hostname': 'node-bare' });
  });
  afterAll(async () => {
    await clients?.close();
    await server?.stop();
  });

  const schedule = (name: string, nodeName: string) =>
    server.resource('pods').patch('merge', { spec: { nodeName } }, { namespace: 'proxies', name });
  const nodeReads = (name: string) =>
    server.requests.filter((r) => r.method === 'GET' && r.path === `/api/v1/nodes/${name}`).length;

  it('reports no location before the Pod is scheduled, then its Node’s topology labels', async () => {
    const inst = await provider.create(ctx(), req('px-loc'));
    expect(inst.location).toBeUndefined();
    schedule('px-loc', 'node-a');
    expect((await provider.get(ctx(), inst.id)).location).toEqual({
      region: 'europe-west1',
      zone: 'europe-west1-b',
    });
    // The Node's labels are cached: a second get does not read it again.
    await provider.get(ctx(), inst.id);
    expect(nodeReads('node-a')).toBe(1);
  });

  it('gives no location for a Node without topology labels, or one that is gone', async () => {
    const bare = await provider.create(ctx(), req('px-bare'));
    schedule('px-bare', 'node-bare');
    expect((await provider.get(ctx(), bare.id)).location).toBeUndefined();
    const gone = await provider.create(ctx(), req('px-gone'));
    schedule('px-gone', 'node-gone');
    const inst = await provider.get(ctx(), gone.id);
    expect(inst.location).toBeUndefined();
    expect(inst.name).toBe('px-gone');
  });

  it('reads the zone by the provider’s zoneLabel, the label placement.zone selects Nodes by', async () => {
    server.resource('nodes').create({
      apiVersion: 'v1',
      kind: 'Node',
      metadata: {
        name: 'node-rack',
        labels: { 'topology.kubernetes.io/region': 'home', 'example.com/rack': 'rack-2' },
      },
    });
    const racks = createKubernetesProvider({
      name: 'racks',
      config: { namespace: 'proxies', zoneLabel: 'example.com/rack' },
      core: clients.core,
    });
    const inst = await racks.create(ctx(), req('px-rack'));
    schedule('px-rack', 'node-rack');
    expect((await racks.get(ctx(), inst.id)).location).toEqual({ region: 'home', zone: 'rack-2' });
  });

  it('without permission to read Nodes: no location, one warning, no retry on every get', async () => {
    const denied = await provider.create(ctx(), req('px-denied'));
    schedule('px-denied', 'node-denied');
    server.injectFault({ method: 'GET', path: /^\/api\/v1\/nodes\//, status: 403, times: Infinity });
    try {
      expect((await provider.get(ctx(), denied.id)).location).toBeUndefined();
      expect((await provider.get(ctx(), denied.id)).location).toBeUndefined();
      expect(nodeReads('node-denied')).toBe(1);
      const warnings = captured.lines.filter((l) => String(l.msg).includes('get nodes'));
      expect(warnings).toHaveLength(1);
    } finally {
      server.clearFaults();
    }
  });
});
