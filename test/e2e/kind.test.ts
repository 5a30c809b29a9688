/**
 * The real-cluster suite (`npm run test:e2e`), for users with a kind cluster: builds the image,
 * loads it into kind, installs config/default, then drives a Proxy on the kubernetes provider
 * through Ready/Healthy, a lease from the discovery API and deletion. It needs docker, kind and
 * kubectl on PATH and a kubeconfig whose current context is the kind cluster.
 *
 *   E2E_KIND_CLUSTER  kind cluster name (default "kind")
 *   E2E_IMAGE         image tag to build and load (default egress-proxies-operator:e2e)
 *   E2E_SKIP_BUILD=1  use an image already loaded into the cluster
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { CoreV1Api, CustomObjectsApi, KubeConfig } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../support/ports.ts';
import { until } from '../support/wait.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CLUSTER = process.env.E2E_KIND_CLUSTER ?? 'kind';
const IMAGE = process.env.E2E_IMAGE ?? 'egress-proxies-operator:e2e';
const OPERATOR_NS = 'egress-proxies-system';
const PROXY_NS = 'e2e-crawl';
const PROXY = 'e2e-kube-1';
const GROUP = { group: 'crawl.example.com', version: 'v1alpha1', plural: 'proxies' };

function run(cmd: string, args: string[], input?: string): string {
  try {
    return execFileSync(cmd, args, {
      cwd: ROOT,
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe'],
      ...(input === undefined ? {} : { input }),
      maxBuffer: 64 * 1024 * 1024,
    });
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(' ')} failed: ${err.stderr || err.message}`);
  }
}

function requireTool(tool: string, args: string[]): void {
  try {
    execFileSync(tool, args, { stdio: 'ignore' });
  } catch {
    throw new Error(
      `\`${tool} ${args.join(' ')}\` failed: the e2e suite needs docker (running), kind and kubectl`,
    );
  }
}

interface Condition {
  type: string;
  status: string;
  reason?: string;
}
interface ProxyObj {
  metadata: { uid?: string; finalizers?: string[] };
  status?: { phase?: string; address?: string; port?: number; conditions?: Condition[] };
}

const kc = new KubeConfig();
kc.loadFromDefault();
const custom = kc.makeApiClient(CustomObjectsApi);
const core = kc.makeApiClient(CoreV1Api);
let portForward: ChildProcess | undefined;

async function getProxy(): Promise<ProxyObj | undefined> {
  try {
    return (await custom.getNamespacedCustomObject({
      ...GROUP,
      namespace: PROXY_NS,
      name: PROXY,
    })) as ProxyObj;
  } catch (e) {
    if ((e as { code?: number }).code === 404) return undefined;
    throw e;
  }
}

const cond = (p: ProxyObj | undefined, type: string) => p?.status?.conditions?.find((c) => c.type === type);

beforeAll(async () => {
  requireTool('kubectl', ['version', '--client']);
  if (!process.env.E2E_SKIP_BUILD) {
    requireTool('docker', ['info']);
    requireTool('kind', ['version']);
    run('docker', ['build', '-t', IMAGE, '.']);
    run('kind', ['load', 'docker-image', IMAGE, '--name', CLUSTER]);
  }
  const rendered = run('kubectl', ['kustomize', 'config/default'])
    .replace(/image: egress-proxies-operator:latest/g, `image: ${IMAGE}`)
    // The probe below reaches the discovery Service through the Squid Pod: open kind's Service
    // range and port 8090, which the default egress policy refuses (docs/configuration.md).
    .replace(
      /maxFileDescriptors: 4096/,
      'maxFileDescriptors: 4096\n          egressPolicy: {allowCIDRs: ["10.96.0.0/12"], connectPorts: [443, 8090]}',
    );
  run('kubectl', ['apply', '--server-side', '-f', '-'], rendered);
  run('kubectl', ['wait', '--for=condition=Established', '--timeout=60s', 'crd/proxies.crawl.example.com']);
  run('kubectl', [
    '-n',
    OPERATOR_NS,
    'rollout',
    'status',
    'deploy/egress-proxies-operator',
    '--timeout=300s',
  ]);
  run('kubectl', ['apply', '-f', '-'], `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${PROXY_NS}\n`);
});

afterAll(async () => {
  portForward?.kill('SIGTERM');
  try {
    run('kubectl', ['delete', 'namespace', PROXY_NS, '--wait=true', '--timeout=120s', '--ignore-not-found']);
  } catch {
    // Best effort: a failed test may leave it behind for inspection.
  }
});

describe('egress-proxies-operator on a kind cluster', () => {
  it('rejects an invalid Proxy at the API server (CRD schema + CEL)', () => {
    const bad = `apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: bad, namespace: ${PROXY_NS}}\nspec: {type: External}\n`;
    expect(() => run('kubectl', ['apply', '-f', '-'], bad)).toThrow(/endpoint/);
  });

  it('provisions a Proxy on the kubernetes provider to Ready and Healthy', async () => {
    await custom.createNamespacedCustomObject({
      ...GROUP,
      namespace: PROXY_NS,
      body: {
        apiVersion: 'crawl.example.com/v1alpha1',
        kind: 'Proxy',
        metadata: { name: PROXY, namespace: PROXY_NS, labels: { pool: 'e2e' } },
        spec: {
          type: 'Managed',
          provider: 'kubernetes',
          placement: { machineType: 'small' },
          healthCheck: {
            // The discovery API's own 204, reached through the proxy via cluster DNS.
            url: `http://egress-proxies-operator-discovery.${OPERATOR_NS}.svc:8090/generate_204`,
            expectStatus: 204,
            intervalSeconds: 5,
            timeoutSeconds: 5,
          },
        },
      },
    });
    const p = await until(
      'Ready and Healthy',
      async () => {
        const obj = await getProxy();
        return obj?.status?.phase === 'Ready' &&
          cond(obj, 'Provisioned')?.status === 'True' &&
          cond(obj, 'Healthy')?.status === 'True'
          ? obj
          : undefined;
      },
      { timeoutMs: 240_000, intervalMs: 1000 },
    );
    expect(p.metadata.finalizers).toContain('crawl.example.com/instance-cleanup');
    expect(p.status?.address).toMatch(/^[0-9a-f.:]+$/);
    const secret = await core.readNamespacedSecret({ namespace: PROXY_NS, name: `${PROXY}-auth` });
    expect(secret.metadata?.labels?.['crawl.example.com/credentials-for']).toBe(PROXY);
    expect(secret.metadata?.ownerReferences?.[0]?.uid).toBe(p.metadata.uid);
    const pods = await core.listNamespacedPod({
      namespace: OPERATOR_NS,
      labelSelector: `proxy-operator-uid=${p.metadata.uid}`,
    });
    expect(pods.items).toHaveLength(1);
  });

  it('leases the proxy through the discovery API', async () => {
    const port = await freePort();
    portForward = spawn(
      'kubectl',
      ['-n', OPERATOR_NS, 'port-forward', 'svc/egress-proxies-operator-discovery', `${port}:8090`],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const token = process.env.DISCOVERY_TOKEN;
    const grant = await until(
      'a lease',
      async () => {
        const res = await fetch(`http://127.0.0.1:${port}/v1/leases`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            ...(token ? { authorization: `Bearer ${token}` } : {}),
          },
          body: JSON.stringify({ namespace: PROXY_NS, selector: 'pool=e2e', ttlSeconds: 60 }),
        });
        return res.ok
          ? ((await res.json()) as { id: string; proxy: { name: string; url: string; host: string } })
          : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 1000 },
    );
    const p = await getProxy();
    expect(grant.proxy.name).toBe(PROXY);
    expect(grant.proxy.host).toBe(p?.status?.address);
    // Managed proxies are never open: the grant carries the credentials.
    expect(new URL(grant.proxy.url).username).not.toBe('');
    const released = await fetch(`http://127.0.0.1:${port}/v1/leases/${grant.id}`, {
      method: 'DELETE',
      headers: token ? { authorization: `Bearer ${token}` } : {},
    });
    expect(released.status).toBeLessThan(300);
  });

  it('deletes the instance before letting the Proxy go', async () => {
    const uid = (await getProxy())?.metadata.uid;
    await custom.deleteNamespacedCustomObject({ ...GROUP, namespace: PROXY_NS, name: PROXY });
    await until('the Proxy to disappear', async () => ((await getProxy()) === undefined ? true : undefined), {
      timeoutMs: 120_000,
      intervalMs: 1000,
    });
    const pods = await core.listNamespacedPod({
      namespace: OPERATOR_NS,
      labelSelector: `proxy-operator-uid=${uid}`,
    });
    expect(pods.items.filter((pod) => !pod.metadata?.deletionTimestamp)).toHaveLength(0);
  });
});
