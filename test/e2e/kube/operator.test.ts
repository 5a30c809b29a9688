/**
 * The operator on the real API server, as installed by config/default and running as its own
 * ServiceAccount (a TokenRequest token, never the cluster admin), with the kubernetes provider's
 * Pods run as real Squids by the test node agent:
 *   - the whole lifecycle: Proxy → Pod + Secrets → Squid → Ready → lease → HTTPS tunnel → blocked
 *     cooldown → spec change → health-gated replacement → delete → finalizer → nothing left;
 *   - a ProxyPool scaled with `kubectl scale`; the skip-cleanup annotation and orphan sweep;
 *   - the metrics endpoint's TokenReview + SubjectAccessReview with the documented binding;
 *   - two replicas: leader election on a real Lease, kill -9 of the leader, the standby leads
 *     and restores leases and cooldowns from the ConfigMap checkpoints; both serve the API and
 *     the gateway;
 *   - RBAC sufficient (no request of the operator was ever refused) and minimal (every granted
 *     verb was used, read from the API server's audit log).
 * The tests run in order and share the installation.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Agent, ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import YAML from 'yaml';
import {
  ANNOTATION_SKIP_CLEANUP,
  FINALIZER,
  INSTANCE_LABEL_INSTALLATION,
  INSTANCE_LABEL_UID,
  LABEL_MANAGED_BY,
  LABEL_POOL,
  MANAGED_BY_VALUE,
} from '../../../src/api/constants.ts';
import { type Origin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { until } from '../../support/wait.ts';
import { kubectl } from './support/control-plane.ts';
import { NODE_REGION, NODE_ZONE, type NodeAgent, startNodeAgent } from './support/node-agent.ts';
import {
  auditedRequests,
  LEADER_LEASE,
  OPERATOR_NS,
  OPERATOR_SA,
  OPERATOR_USER,
  type RunningOperator,
  serviceAccountKubeconfig,
  startOperator,
  writeProvidersConfig,
} from './support/operator.ts';
import { rest } from './support/rest.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');
const k = (...args: string[]) => kubectl(cp, args);
const api = rest(cp.server, cp.adminToken, cp.caFile);
const NS = 'crawl';
const TOKEN = 'e2e-discovery-token';
const AUTH = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };
const GROUP = '/apis/crawl.example.com/v1alpha1';

let dir: string;
let origin: Origin;
let agent: NodeAgent;
let caFile: string;
let providers: string;
let kubeconfig: string;
const operators: RunningOperator[] = [];

interface Condition {
  type: string;
  status: string;
  reason?: string;
}
interface ProxyObj {
  metadata: { name: string; uid: string; finalizers?: string[]; deletionTimestamp?: string };
  status?: {
    phase?: string;
    address?: string;
    port?: number;
    providerID?: string;
    location?: { region?: string; zone?: string };
    conditions?: Condition[];
  };
}
interface Grant {
  id: string;
  proxy: { name: string; url: string; host: string; port: number };
}

const cond = (p: ProxyObj | undefined, type: string) => p?.status?.conditions?.find((c) => c.type === type);

async function getProxy(name: string): Promise<ProxyObj | undefined> {
  const r = await api.call('GET', `${GROUP}/namespaces/${NS}/proxies/${name}`);
  return r.status === 200 ? (r.body as ProxyObj) : undefined;
}

async function untilHealthy(name: string, timeoutMs = 90_000): Promise<ProxyObj> {
  return until(
    `${name} Ready and Healthy`,
    async () => {
      const p = await getProxy(name);
      if (p?.status?.phase === 'Ready' && cond(p, 'Healthy')?.status === 'True') return p;
      // Thrown, so a timeout names the last state and what the node agent met.
      throw new Error(
        `${JSON.stringify(p?.status ?? null)}; node agent: ${agent.problems().join('; ') || 'no problems'}`,
      );
    },
    { timeoutMs, intervalMs: 250 },
  );
}

function proxyManifest(
  name: string,
  extra: Record<string, unknown> = {},
  annotations: Record<string, string> = {},
) {
  return {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: { name, namespace: NS, labels: { pool: 'e2e' }, annotations },
    spec: {
      type: 'Managed',
      provider: 'kubernetes',
      port: 3128,
      healthCheck: {
        url: `${origin.baseUrl}/generate_204`,
        expectStatus: 204,
        intervalSeconds: 1,
        timeoutSeconds: 2,
        failureThreshold: 3,
        successThreshold: 1,
      },
      ...extra,
    },
  };
}

const apply = (obj: unknown) =>
  kubectl(cp, ['apply', '--server-side', '--field-manager=e2e-user', '-f', '-'], JSON.stringify(obj));

/** Pods and Secrets the kubernetes provider made for a Proxy (by the instance labels). */
async function instanceObjects(proxyUid: string): Promise<string[]> {
  const sel = encodeURIComponent(`${INSTANCE_LABEL_UID}=${proxyUid}`);
  const names: string[] = [];
  for (const kind of ['pods', 'secrets']) {
    const r = await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/${kind}?labelSelector=${sel}`);
    for (const o of r.body.items as { metadata: { name: string } }[])
      names.push(`${kind}/${o.metadata.name}`);
  }
  return names;
}

async function lease(op: RunningOperator, body: Record<string, unknown>): Promise<Grant> {
  return until(
    `a lease from ${op.name}`,
    async () => {
      const res = await fetch(`${op.discovery}/v1/leases`, {
        method: 'POST',
        headers: AUTH,
        body: JSON.stringify(body),
      });
      return res.status === 201 ? ((await res.json()) as Grant) : undefined;
    },
    { timeoutMs: 30_000, intervalMs: 200 },
  );
}

/** An HTTPS request to the origin through the leased proxy (CONNECT tunnel, full TLS verification). */
async function throughProxy(proxyUrl: string): Promise<number> {
  const dispatcher = new ProxyAgent({ uri: proxyUrl, requestTls: { ca: testPki().caCert } });
  try {
    const res = await undiciFetch(`${origin.baseUrl}/generate_204`, {
      dispatcher,
      signal: AbortSignal.timeout(10_000),
    });
    await res.arrayBuffer();
    return res.status;
  } catch (e) {
    // A refused CONNECT is an error whose cause chain carries the proxy's status.
    for (let c: unknown = e; c instanceof Error; c = c.cause) {
      const m = /Proxy response \((\d{3})\)/.exec(c.message);
      if (m) return Number(m[1]);
    }
    throw e;
  } finally {
    await dispatcher.close();
  }
}

async function leaderIdentity(): Promise<string | undefined> {
  const r = await api.call(
    'GET',
    `/apis/coordination.k8s.io/v1/namespaces/${OPERATOR_NS}/leases/${LEADER_LEASE}`,
  );
  return r.status === 200 ? (r.body.spec?.holderIdentity as string | undefined) : undefined;
}

async function runOperator(name: string): Promise<RunningOperator> {
  const op = await startOperator({
    name,
    dir,
    kubeconfig,
    providersConfig: providers,
    discoveryToken: TOKEN,
    extraCaFile: caFile,
    extraArgs: [
      '--lease-checkpoint-interval',
      '500ms',
      '--provider-check-interval',
      '10s',
      '--gc-interval',
      '10s',
      '--gc-min-age',
      '1s',
      // Every replica's gateway holds share leases on every upstream, so a replaced or removed
      // instance drains until this timeout: short, so the waits below stay far from their bounds.
      '--drain-timeout',
      '15s',
    ],
  });
  operators.push(op);
  return op;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'e2e-kube-operator-'));
  k('apply', '--server-side', '--field-manager=e2e-install', '-k', resolve(ROOT, 'config/default'));
  for (const crd of ['proxies', 'proxypools', 'providerhealths'])
    k('wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`);
  try {
    k('create', 'namespace', NS);
  } catch (e) {
    if (!/AlreadyExists/.test((e as Error).message)) throw e;
  }
  origin = await startTlsOrigin();
  caFile = join(dir, 'test-ca.pem');
  writeFileSync(caFile, testPki().caCert);
  providers = writeProvidersConfig(dir, origin.port);
  kubeconfig = serviceAccountKubeconfig(cp, OPERATOR_NS, OPERATOR_SA, join(dir, 'operator.kubeconfig')).file;
  agent = await startNodeAgent(cp);
});

async function proxiesLeft(): Promise<ProxyObj[]> {
  const r = await api.call('GET', `${GROUP}/namespaces/${NS}/proxies`);
  return r.status === 200 ? (r.body.items as ProxyObj[]) : [];
}

afterAll(async () => {
  // Whatever a failed test left: deleted while an operator still runs, so finalizers are honoured;
  // what is still held after that is released, so the tier's other files find a clean cluster.
  await api.call('DELETE', `${GROUP}/namespaces/${NS}/proxypools`);
  await api.call('DELETE', `${GROUP}/namespaces/${NS}/proxies`);
  await until('the namespace emptied', async () => (await proxiesLeft()).length === 0, {
    timeoutMs: operators.length > 0 ? 60_000 : 1_000,
    intervalMs: 250,
  }).catch(() => undefined);
  for (const p of await proxiesLeft())
    await api.call(
      'PATCH',
      `${GROUP}/namespaces/${NS}/proxies/${p.metadata.name}`,
      { metadata: { finalizers: null } },
      {
        contentType: 'application/merge-patch+json',
      },
    );
  await Promise.all(operators.map((o) => o.stop()));
  await agent?.stop();
  await origin?.close();
  await api.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('the operator on the real API server, as its own ServiceAccount', () => {
  let a: RunningOperator;

  it('starts, leads, reports its provider healthy and removes the ProviderHealth of a retired one', async () => {
    // Left by an earlier configuration with a provider this one no longer has.
    apply({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProviderHealth',
      metadata: { name: 'retired-gcp', labels: { [LABEL_MANAGED_BY]: MANAGED_BY_VALUE } },
    });
    a = await runOperator('a');
    await until(
      'the retired ProviderHealth deleted',
      async () => (await api.call('GET', `${GROUP}/providerhealths/retired-gcp`)).status === 404,
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    await until('a to lead', async () => (await leaderIdentity()) === a.identity(), { timeoutMs: 30_000 });
    const ph = await until(
      'ProviderHealth kubernetes Ready',
      async () => {
        const r = await api.call('GET', `${GROUP}/providerhealths/kubernetes`);
        return r.status === 200 && cond(r.body, 'Ready')?.status === 'True' ? r.body : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 500 },
    );
    expect(ph.status.type).toBe('kubernetes');
  });

  it('the lifecycle: Proxy → Pod → real Squid → lease → tunnel → cooldown → replacement → delete', async () => {
    apply(proxyManifest('kube-1'));
    const ready = await untilHealthy('kube-1');
    expect(ready.metadata.finalizers).toContain(FINALIZER);
    expect(await instanceObjects(ready.metadata.uid)).toHaveLength(2); // the Pod and its Squid config Secret
    const pod = (ready.status?.providerID ?? '').split('/').pop() as string;
    expect(agent.running().get(`${OPERATOR_NS}/${pod}`)).toBe(ready.status?.address);
    // Where it runs: its Node's topology labels (a `get nodes` the RBAC check below sees used).
    expect(ready.status?.location).toEqual({ region: NODE_REGION, zone: NODE_ZONE });
    // The generated credentials Secret names its Proxy as owner (blockOwnerDeletion: the
    // finalizers rule of the ClusterRole is what lets the operator set it).
    const auth = await api.call('GET', `/api/v1/namespaces/${NS}/secrets/kube-1-auth`);
    expect(auth.body.metadata.ownerReferences).toEqual([
      expect.objectContaining({
        kind: 'Proxy',
        name: 'kube-1',
        uid: ready.metadata.uid,
        blockOwnerDeletion: true,
      }),
    ]);

    // Lease, then an HTTPS request through the Pod's Squid; without credentials: 407.
    const g = await lease(a, {
      namespace: NS,
      selector: `pool=e2e,topology.kubernetes.io/zone=${NODE_ZONE}`,
      target: 'shop.example',
      ttlSeconds: 120,
    });
    expect(g.proxy.host).toBe(ready.status?.address);
    expect(await throughProxy(g.proxy.url)).toBe(204);
    const anonymous = new URL(g.proxy.url);
    anonymous.username = '';
    anonymous.password = '';
    expect(await throughProxy(anonymous.href)).toBe(407);

    // Blocked for shop.example: no proxy for that site, still one for another.
    const rep = await fetch(`${a.discovery}/v1/leases/${g.id}/report`, {
      method: 'POST',
      headers: AUTH,
      body: JSON.stringify({ result: 'blocked', cooldownSeconds: 3600 }),
    });
    expect(rep.status).toBe(200);
    const refused = await fetch(`${a.discovery}/v1/leases`, {
      method: 'POST',
      headers: AUTH,
      body: JSON.stringify({ namespace: NS, selector: 'pool=e2e', target: 'shop.example' }),
    });
    expect(refused.status).toBe(409);
    expect(((await refused.json()) as { coolingDownForTarget: number }).coolingDownForTarget).toBe(1);
    const other = await lease(a, {
      namespace: NS,
      selector: 'pool=e2e',
      target: 'other.example',
      ttlSeconds: 60,
    });
    await fetch(`${a.discovery}/v1/leases/${other.id}`, { method: 'DELETE', headers: AUTH });

    // A spec change replaces the Pod behind a health gate: the old one serves until the new one passes.
    const before = ready.status?.address;
    apply(proxyManifest('kube-1', { placement: { machineType: 'small' } }));
    const replaced = await until(
      'kube-1 on a new Pod, healthy',
      async () => {
        const p = await getProxy('kube-1');
        return p?.status?.phase === 'Ready' &&
          p.status.address !== before &&
          cond(p, 'Healthy')?.status === 'True'
          ? p
          : undefined;
      },
      { timeoutMs: 90_000, intervalMs: 250 },
    );
    const newPod = (replaced.status?.providerID ?? '').split('/').pop() as string;
    expect(newPod).not.toBe(pod);
    const podSpec = await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/pods/${newPod}`);
    expect(podSpec.body.spec.containers[0].resources).toEqual({
      requests: { cpu: '100m', memory: '128Mi' },
      limits: { memory: '128Mi' },
    });
    await until(
      'the old Pod gone',
      async () => (await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/pods/${pod}`)).status === 404,
      { timeoutMs: 60_000, intervalMs: 250 },
    );

    // Delete: the finalizer holds the Proxy until the Pod and its Secret are gone; then nothing is left.
    k('delete', 'px', 'kube-1', '-n', NS, '--wait=false');
    await until('kube-1 gone', async () => (await getProxy('kube-1')) === undefined, {
      timeoutMs: 60_000,
      intervalMs: 250,
    });
    expect(await instanceObjects(ready.metadata.uid)).toEqual([]);
    await until(
      'kube-1-auth collected with its owner',
      async () => (await api.call('GET', `/api/v1/namespaces/${NS}/secrets/kube-1-auth`)).status === 404,
      { timeoutMs: 60_000, intervalMs: 250 },
    );
    expect(agent.problems()).toEqual([]);
  });

  it('a ProxyPool follows kubectl scale up and down', async () => {
    apply({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProxyPool',
      metadata: { name: 'fleet', namespace: NS },
      spec: {
        replicas: 1,
        template: { metadata: { labels: { pool: 'fleet' } }, spec: proxyManifest('x').spec },
      },
    });
    const healthyMembers = async (n: number) =>
      until(
        `${n} healthy pool Proxies`,
        async () => {
          const r = await api.call(
            'GET',
            `${GROUP}/namespaces/${NS}/proxies?labelSelector=${encodeURIComponent(`${LABEL_POOL}=fleet`)}`,
          );
          const items = r.body.items as ProxyObj[];
          const ok = items.filter(
            (p) => !p.metadata.deletionTimestamp && cond(p, 'Healthy')?.status === 'True',
          );
          return items.length === n && ok.length === n ? items : undefined;
        },
        { timeoutMs: 120_000, intervalMs: 500 },
      );
    await healthyMembers(1);
    expect(k('scale', 'pxp/fleet', '-n', NS, '--replicas=3')).toContain('scaled');
    const three = await healthyMembers(3);
    // Every member names the pool as its controlling owner, with blockOwnerDeletion.
    for (const p of three as unknown as { metadata: { ownerReferences: unknown[] } }[])
      expect(p.metadata.ownerReferences).toEqual([
        expect.objectContaining({
          kind: 'ProxyPool',
          name: 'fleet',
          controller: true,
          blockOwnerDeletion: true,
        }),
      ]);
    await until(
      'the pool status counts 3 ready',
      async () => {
        const r = await api.call('GET', `${GROUP}/namespaces/${NS}/proxypools/fleet`);
        return r.body.status?.readyReplicas === 3 && r.body.status?.healthyReplicas === 3;
      },
      { timeoutMs: 60_000, intervalMs: 500 },
    );
    expect(k('get', 'pxp', 'fleet', '-n', NS, '--no-headers').trim().split(/\s+/).slice(0, 3)).toEqual([
      'fleet',
      '3',
      '3',
    ]);
    // The dashboard (its sampler fed by the operator's informers) shows the three, then sends
    // only what changes: the two removed members, by name, after the revision it answered.
    const keyOf = (p: { metadata: { name: string } }) => `${NS}/${p.metadata.name}`;
    const dashboard = async (query: string) => {
      const r = await fetch(`${a.discovery}/v1/dashboard/state?${query}`, { headers: AUTH });
      expect(r.status).toBe(200);
      return (await r.json()) as {
        revision: number;
        removed: string[];
        proxies: { name: string; namespace: string }[];
      };
    };
    const before = await until(
      'the dashboard to show the three members',
      async () => {
        const st = await dashboard('limit=1000');
        const shown = new Set(st.proxies.map((p) => `${p.namespace}/${p.name}`));
        return three.every((p) => shown.has(keyOf(p))) ? st : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 500 },
    );
    k('scale', 'pxp/fleet', '-n', NS, '--replicas=1');
    const [kept] = await healthyMembers(1);
    const removed = three.filter((p) => p.metadata.uid !== kept?.metadata.uid);
    expect(removed).toHaveLength(2);
    await until(
      'the dashboard to send the two removed members as removed',
      async () => {
        const delta = await dashboard(`since=${before.revision}`);
        return removed.every((p) => delta.removed.includes(keyOf(p))) ? delta : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 500 },
    );
    // The two removed Proxies are gone with their Pods and Secrets.
    await until(
      'the removed members instances deleted',
      async () =>
        (await Promise.all(removed.map((p) => instanceObjects(p.metadata.uid)))).flat().length === 0,
      { timeoutMs: 60_000, intervalMs: 250 },
    );
  });

  it('skip-cleanup abandons the instance; orphan sweep then collects it', async () => {
    apply(proxyManifest('abandon-1', {}, { [ANNOTATION_SKIP_CLEANUP]: 'true' }));
    const p = await untilHealthy('abandon-1');
    const pod = (p.status?.providerID ?? '').split('/').pop() as string;
    // An instance made before installations existed gets the installation label from GC (a patch).
    k('label', 'pod', pod, '-n', OPERATOR_NS, `${INSTANCE_LABEL_INSTALLATION}-`);
    await until(
      'GC to adopt the unlabelled Pod',
      async () => {
        const r = await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/pods/${pod}`);
        return r.body.metadata?.labels?.[INSTANCE_LABEL_INSTALLATION] !== undefined;
      },
      { timeoutMs: 60_000, intervalMs: 500 },
    );
    k('delete', 'px', 'abandon-1', '-n', NS, '--wait=false');
    await until('abandon-1 gone', async () => (await getProxy('abandon-1')) === undefined, {
      timeoutMs: 30_000,
      intervalMs: 250,
    });
    // Abandoned: the finalizer went without deleting the Pod…
    expect((await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/pods/${pod}`)).status).toBe(200);
    // …which is now an orphan of this installation, and the collector deletes it.
    await until(
      'orphan sweep to delete the abandoned Pod',
      async () => (await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/pods/${pod}`)).status === 404,
      { timeoutMs: 90_000, intervalMs: 500 },
    );
  });

  it('metrics: a token bound to the metrics-reader ClusterRole scrapes, others are refused', async () => {
    try {
      k('create', 'namespace', 'monitoring');
    } catch (e) {
      if (!/AlreadyExists/.test((e as Error).message)) throw e;
    }
    k('create', 'serviceaccount', 'prometheus', '-n', 'monitoring');
    k('create', 'serviceaccount', 'stranger', '-n', 'monitoring');
    // The binding of docs/deployment.md (which another file of the tier may have made already).
    const binding = k(
      'create',
      'clusterrolebinding',
      'prometheus-egress-proxies-metrics',
      '--clusterrole=egress-proxies-operator-metrics-reader',
      '--serviceaccount=monitoring:prometheus',
      '--dry-run=client',
      '-o',
      'yaml',
    );
    kubectl(cp, ['apply', '-f', '-'], binding);
    // The metrics certificate is self-signed at start (no --metrics-cert-dir).
    const insecure = new Agent({ connect: { rejectUnauthorized: false } });
    const scrape = async (token?: string) => {
      const res = await undiciFetch(`${a.metrics}/metrics`, {
        headers: token ? { authorization: `Bearer ${token}` } : {},
        dispatcher: insecure,
      });
      return { status: res.status, text: await res.text() };
    };
    const token = (sa: string) => k('create', 'token', sa, '-n', 'monitoring').trim();
    const ok = await scrape(token('prometheus'));
    expect(ok.status).toBe(200);
    expect(ok.text).toContain('proxy_operator_');
    // The kubernetes provider's check of this very API server, as a scraper sees it.
    expect(ok.text).toMatch(
      /^proxy_operator_provider_target_up\{provider="kubernetes",target="apiserver"\} 1$/m,
    );
    expect((await scrape(token('stranger'))).status).toBe(403);
    expect((await scrape()).status).toBe(401);
    await insecure.close();
  });

  it('providerhealth-viewer: a token bound to it reads ProviderHealths and cannot change them', async () => {
    try {
      k('create', 'namespace', 'oncall');
    } catch (e) {
      if (!/AlreadyExists/.test((e as Error).message)) throw e;
    }
    k('create', 'serviceaccount', 'viewer', '-n', 'oncall');
    k(
      'create',
      'clusterrolebinding',
      'oncall-providerhealth',
      '--clusterrole=egress-proxies-operator-providerhealth-viewer',
      '--serviceaccount=oncall:viewer',
    );
    const token = k('create', 'token', 'viewer', '-n', 'oncall').trim();
    // RBAC bindings take effect asynchronously in the authorizer's cache.
    const listed = await until(
      'the viewer binding to take effect',
      async () => {
        const r = await api.call('GET', `${GROUP}/providerhealths`, undefined, { token });
        return r.status === 200 && r;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    expect(listed.body.items.map((o: { metadata: { name: string } }) => o.metadata.name)).toContain(
      'kubernetes',
    );
    expect(
      (await api.call('GET', `${GROUP}/providerhealths/kubernetes/status`, undefined, { token })).status,
    ).toBe(200);
    const patch = await api.call(
      'PATCH',
      `${GROUP}/providerhealths/kubernetes/status`,
      { status: { targetsReady: '9/9' } },
      { token, contentType: 'application/merge-patch+json' },
    );
    expect(patch.status).toBe(403);
    expect(
      (await api.call('DELETE', `${GROUP}/providerhealths/kubernetes`, undefined, { token })).status,
    ).toBe(403);
  });

  it('two replicas: kill -9 of the leader, the standby leads and restores leases and cooldowns', async () => {
    apply(proxyManifest('ha-1'));
    // ha-2 brings its own credentials: the operator labels that Secret so it is watched.
    k(
      'create',
      'secret',
      'generic',
      'ha-2-creds',
      '-n',
      NS,
      '--from-literal=username=crawler',
      '--from-literal=password=e2e-secret-1',
    );
    apply(proxyManifest('ha-2', { credentialsSecretRef: { name: 'ha-2-creds' } }));
    await untilHealthy('ha-1');
    await untilHealthy('ha-2');
    const creds = await api.call('GET', `/api/v1/namespaces/${NS}/secrets/ha-2-creds`);
    expect(creds.body.metadata.labels).toMatchObject({ 'crawl.example.com/credentials-for': 'referenced' });
    const b = await runOperator('b');
    expect(await leaderIdentity()).toBe(a.identity());
    // Both replicas serve the gateway: an HTTPS request through each reaches the origin.
    const viaGateway = (op: RunningOperator) =>
      throughProxy(`http://crawler-pool-e2e:${TOKEN}@${op.gateway}`);
    await until(
      'the gateway of both replicas carrying a request',
      async () => ((await viaGateway(a)) === 204 && (await viaGateway(b)) === 204 ? true : undefined),
      { timeoutMs: 30_000, intervalMs: 500 },
    );
    // A standby serves the API too (forwarding to the leader): both answer.
    const held = await lease(b, {
      namespace: NS,
      selector: 'pool=e2e',
      target: 'shop2.example',
      ttlSeconds: 300,
    });
    const blocked = await lease(a, {
      namespace: NS,
      selector: 'pool=e2e',
      target: 'shop3.example',
      ttlSeconds: 300,
    });
    const rep = await fetch(`${a.discovery}/v1/leases/${blocked.id}/report`, {
      method: 'POST',
      headers: AUTH,
      body: JSON.stringify({ result: 'blocked', cooldownSeconds: 3600 }),
    });
    expect(rep.status).toBe(200);
    // The checkpoint (every 500 ms) must hold both before the leader dies.
    await until(
      'a checkpoint holding the lease and the cooldown',
      async () => {
        const r = await api.call('GET', `/api/v1/namespaces/${OPERATOR_NS}/configmaps`);
        const text = JSON.stringify(r.body.items ?? []);
        return text.includes(held.id) && text.includes('shop3.example');
      },
      { timeoutMs: 15_000, intervalMs: 200 },
    );
    await a.proc.killHard();
    operators.splice(operators.indexOf(a), 1);
    await until('b to lead', async () => (await leaderIdentity()) === b.identity(), {
      timeoutMs: 60_000,
      intervalMs: 250,
    });
    // The lease survived: renewable on the new leader.
    const renew = await until(
      'the held lease renewable on b',
      async () => {
        const r = await fetch(`${b.discovery}/v1/leases/${held.id}/renew`, {
          method: 'POST',
          headers: AUTH,
          body: JSON.stringify({ ttlSeconds: 300 }),
        });
        return r.status === 200 ? r.status : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    expect(renew).toBe(200);
    // The cooldown survived: the blocked proxy is not offered for shop3.example.
    for (let i = 0; i < 4; i++) {
      const g = await lease(b, {
        namespace: NS,
        selector: 'pool=e2e',
        target: 'shop3.example',
        ttlSeconds: 30,
      });
      expect(g.proxy.name).not.toBe(blocked.proxy.name);
      await fetch(`${b.discovery}/v1/leases/${g.id}`, { method: 'DELETE', headers: AUTH });
    }
    // And the tunnel of the held lease still works; the surviving replica's gateway serves on.
    expect(await throughProxy(held.proxy.url)).toBe(204);
    expect(await viaGateway(b)).toBe(204);
    // Cleanup for the RBAC tally: delete the Proxies through the new leader.
    k('delete', 'px', 'ha-1', 'ha-2', '-n', NS, '--wait=false');
    await until('ha proxies gone', async () => !(await getProxy('ha-1')) && !(await getProxy('ha-2')), {
      timeoutMs: 60_000,
      intervalMs: 250,
    });
    // The pool's last Proxy goes with the pool (garbage collector), through the operator's finalizer.
    k('delete', 'pxp', 'fleet', '-n', NS);
    await until('no Proxy left in the namespace', async () => (await proxiesLeft()).length === 0, {
      timeoutMs: 60_000,
      intervalMs: 250,
    });
  });

  it('RBAC: no request of the operator was refused, and every granted verb was used', () => {
    const requests = auditedRequests(cp, OPERATOR_USER);
    expect(requests.length).toBeGreaterThan(100);
    expect(requests.filter((r) => r.code === 403).map((r) => `${r.verb} ${r.uri}`)).toEqual([]);
    const used = new Set(
      requests.map((r) => `${r.apiGroup}/${r.resource}${r.subresource ? `/${r.subresource}` : ''}:${r.verb}`),
    );
    const granted: string[] = [];
    for (const file of ['role.yaml', 'leader_election_role.yaml', 'metrics_auth_role.yaml']) {
      const role = YAML.parse(readFileSync(resolve(ROOT, 'config/rbac', file), 'utf8')) as {
        rules: { apiGroups: string[]; resources: string[]; verbs: string[] }[];
      };
      for (const rule of role.rules)
        for (const g of rule.apiGroups)
          for (const res of rule.resources) for (const v of rule.verbs) granted.push(`${g}/${res}:${v}`);
    }
    // `update` on */finalizers is never a request: the OwnerReferencesPermissionEnforcement
    // admission plugin checks it when the operator sets blockOwnerDeletion (asserted above on
    // the credentials Secret and on the pool's Proxies, with that plugin on).
    const admissionOnly = new Set([
      'crawl.example.com/proxies/finalizers:update',
      'crawl.example.com/proxypools/finalizers:update',
    ]);
    const unused = granted.filter((g) => !used.has(g) && !admissionOnly.has(g));
    expect(unused).toEqual([]);
    const notGranted = [...used].filter((u) => !granted.includes(u));
    expect(notGranted).toEqual([]);
  });
});
