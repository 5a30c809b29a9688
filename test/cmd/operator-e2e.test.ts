/**
 * Cluster mode end to end: the real CLI (`main.ts operator`) as a child process against the
 * stateful Kubernetes REST test server, driven only through the API and the discovery API, as a
 * user would. Covers the Proxy lifecycle (finalizer, Ready, Healthy, credentials Secret,
 * ProviderHealth, a lease that tunnels, deletion), the leader Lease, hand-over between two
 * replicas on SIGTERM, and reconciliation surviving watch cuts and 410 Gone.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  CONDITION_HEALTHY,
  CONDITION_PROVISIONED,
  FINALIZER,
  LABEL_CREDENTIALS_FOR,
} from '../../src/api/constants.ts';
import type { Condition } from '../../src/api/meta.ts';
import type { StoredObject } from '../../src/runtime/objects/types.ts';
import { type KubeServer, startKubeServer } from '../support/kube-server/index.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const NODE = join(ROOT, 'node_modules/.bin/node');
const MAIN = join(ROOT, 'src/cmd/main.ts');
const TOKEN = 'e2e-token';
const PROXY_NS = 'crawl';
const OPERATOR_NS = 'operator-system';
const LEADER_LEASE = 'egress-proxies-operator-leader';

async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const port = (srv.address() as { port: number }).port;
  srv.close();
  await once(srv, 'close');
  return port;
}

async function canBind(port: number): Promise<boolean> {
  const srv = createServer();
  return new Promise((r) => {
    srv.once('error', () => r(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => r(true)));
  });
}

/** A run of `n` ports that are free right now, for the local provider's portRange. */
async function freePortRange(n: number): Promise<{ from: number; to: number }> {
  for (;;) {
    const from = 30_000 + Math.floor(Math.random() * 25_000);
    let ok = true;
    for (let p = from; p < from + n && ok; p++) ok = await canBind(p);
    if (ok) return { from, to: from + n - 1 };
  }
}

async function until<T>(what: string, fn: () => T | undefined | Promise<T | undefined>, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}

interface Operator {
  child: ChildProcess;
  logs: LogLine[];
  stderr: string[];
  discovery: string;
  probes: string;
  identity(): string | undefined;
  exited: Promise<number | null>;
  stop(): Promise<number | null>;
}

let server: KubeServer;
let dir: string;
let kubeconfig: string;
const operators: Operator[] = [];

beforeEach(async () => {
  server = await startKubeServer({ token: TOKEN, bookmarkIntervalMs: 500 });
  dir = mkdtempSync(join(tmpdir(), 'operator-e2e-'));
  kubeconfig = join(dir, 'kubeconfig.yaml');
  writeFileSync(
    kubeconfig,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      '- name: test',
      '  cluster:',
      `    server: ${server.url}`,
      '    insecure-skip-tls-verify: true',
      'users:',
      '- name: test',
      '  user:',
      `    token: ${TOKEN}`,
      'contexts:',
      '- name: test',
      '  context: {cluster: test, user: test, namespace: default}',
      'current-context: test',
      '',
    ].join('\n'),
  );
});

afterEach(async () => {
  await Promise.all(operators.splice(0).map((o) => o.stop()));
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
});

async function startOperator(opts: { leaderElect?: boolean; name: string }): Promise<Operator> {
  const range = await freePortRange(8);
  const providers = join(dir, `providers-${opts.name}.yaml`);
  writeFileSync(
    providers,
    `providers:\n  - name: local\n    type: local\n    local:\n      bindAddress: 127.0.0.1\n      portRange: {from: ${range.from}, to: ${range.to}}\n`,
  );
  const discoveryPort = await freePort();
  const probePort = await freePort();
  const args = [
    MAIN,
    'operator',
    '--providers-config',
    providers,
    '--kubeconfig',
    kubeconfig,
    '--discovery-bind-address',
    `127.0.0.1:${discoveryPort}`,
    '--health-probe-bind-address',
    `127.0.0.1:${probePort}`,
    '--provider-check-interval',
    '10s',
    '--log-format',
    'json',
    '--log-level',
    'debug',
    '--shutdown-grace-period',
    '5s',
    ...(opts.leaderElect ? ['--leader-elect'] : []),
  ];
  const child = spawn(NODE, args, {
    cwd: ROOT,
    env: { ...process.env, POD_NAMESPACE: OPERATOR_NS, DISCOVERY_TOKEN: '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: LogLine[] = [];
  const stderr: string[] = [];
  let buf = '';
  child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
    buf += chunk;
    let nl = buf.indexOf('\n');
    while (nl >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      try {
        logs.push(JSON.parse(line) as LogLine);
      } catch {
        stderr.push(line);
      }
      nl = buf.indexOf('\n');
    }
  });
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => stderr.push(chunk));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const op: Operator = {
    child,
    logs,
    stderr,
    discovery: `http://127.0.0.1:${discoveryPort}`,
    probes: `http://127.0.0.1:${probePort}`,
    identity: () => logs.find((l) => l.msg.startsWith('manager started'))?.identity as string | undefined,
    exited,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
  operators.push(op);
  const ready = await until(
    `${opts.name} /readyz`,
    async () => {
      if (child.exitCode !== null) {
        throw new Error(`operator exited with ${child.exitCode}: ${stderr.join('')}`);
      }
      const res = await fetch(`${op.probes}/readyz`);
      return res.status === 200;
    },
    20_000,
  );
  expect(ready).toBe(true);
  return op;
}

function discoveryPortOf(op: Operator): number {
  return Number(new URL(op.discovery).port);
}

async function createProxy(name: string, probeTarget: Operator): Promise<StoredObject> {
  const res = await fetch(`${server.url}/apis/crawl.example.com/v1alpha1/namespaces/${PROXY_NS}/proxies`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'Proxy',
      metadata: { name, namespace: PROXY_NS, labels: { pool: 'e2e' } },
      spec: {
        type: 'Managed',
        provider: 'local',
        port: 3128,
        healthCheck: {
          url: `http://127.0.0.1:${discoveryPortOf(probeTarget)}/generate_204`,
          expectStatus: 204,
          intervalSeconds: 1,
          timeoutSeconds: 2,
          failureThreshold: 3,
          successThreshold: 1,
        },
      },
    }),
  });
  expect(res.status).toBe(201);
  return (await res.json()) as StoredObject;
}

const proxies = () => server.resource('proxies');
const leaderLease = () => server.resource('leases').get(OPERATOR_NS, LEADER_LEASE);
const leaseSpec = () => (leaderLease()?.spec ?? {}) as { holderIdentity?: string; renewTime?: string };
const getProxy = (name: string) => proxies().get(PROXY_NS, name);

function condition(obj: StoredObject | undefined, type: string): Condition | undefined {
  const status = obj?.status as { conditions?: Condition[] } | undefined;
  return status?.conditions?.find((c) => c.type === type);
}

interface ProxyStatus {
  phase?: string;
  address?: string;
  port?: number;
  providerID?: string;
}

const statusOf = (obj: StoredObject | undefined) => (obj?.status ?? {}) as ProxyStatus;

async function untilReadyAndHealthy(name: string, timeoutMs = 20_000): Promise<StoredObject> {
  return until(
    `${name} Ready and Healthy`,
    () => {
      const p = getProxy(name);
      return statusOf(p).phase === 'Ready' &&
        condition(p, CONDITION_PROVISIONED)?.status === 'True' &&
        condition(p, CONDITION_HEALTHY)?.status === 'True'
        ? p
        : undefined;
    },
    timeoutMs,
  );
}

interface Grant {
  id: string;
  proxy: { namespace: string; name: string; url: string; host: string; port: number };
}

async function lease(op: Operator): Promise<Grant> {
  return until(`a lease from ${op.discovery}`, async () => {
    const res = await fetch(`${op.discovery}/v1/leases`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ namespace: PROXY_NS, selector: 'pool=e2e', ttlSeconds: 60 }),
    });
    return res.status === 200 || res.status === 201 ? ((await res.json()) as Grant) : undefined;
  });
}

/** Fetches `url` through the leased proxy (CONNECT tunnel with the grant's credentials). */
async function throughProxy(proxyUrl: string, url: string): Promise<number> {
  const agent = new ProxyAgent({ uri: proxyUrl });
  try {
    const res = await undiciFetch(url, { dispatcher: agent, signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status;
  } finally {
    await agent.close();
  }
}

describe('operator (cluster mode) end to end', () => {
  it('takes a Proxy from creation to Ready/Healthy, leases it out, and cleans up on delete', async () => {
    const op = await startOperator({ name: 'a', leaderElect: true });

    const created = await createProxy('e2e-1', op);
    const uid = created.metadata.uid as string;

    await until('the finalizer', () => getProxy('e2e-1')?.metadata.finalizers?.includes(FINALIZER));
    const ready = await untilReadyAndHealthy('e2e-1');
    const st = statusOf(ready);
    expect(st.address).toBe('127.0.0.1');
    expect(st.port).toBeGreaterThan(0);
    expect(st.providerID).toMatch(/^local\//);

    // Generated credentials: a labelled Secret owned by the Proxy.
    const secret = server.resource('secrets').get(PROXY_NS, 'e2e-1-auth');
    expect(secret).toBeDefined();
    expect(secret?.metadata.labels?.[LABEL_CREDENTIALS_FOR]).toBe('e2e-1');
    const owners = (secret?.metadata ?? {}) as { ownerReferences?: { uid: string; kind: string }[] };
    expect(owners.ownerReferences).toEqual(
      expect.arrayContaining([expect.objectContaining({ kind: 'Proxy', uid })]),
    );

    // The provider health monitor publishes one object named after the provider.
    const ph = await until('ProviderHealth local', () => {
      const o = server.resource('providerhealths').get(undefined, 'local');
      return condition(o, 'Ready') ? o : undefined;
    });
    expect(condition(ph, 'Ready')?.status).toBe('True');

    // A lease through the discovery API, used as a crawler would.
    const grant = await lease(op);
    expect(grant.proxy).toMatchObject({
      namespace: PROXY_NS,
      name: 'e2e-1',
      host: '127.0.0.1',
      port: st.port,
    });
    expect(await throughProxy(grant.proxy.url, `${op.discovery}/generate_204`)).toBe(204);
    // The proxy is never open: without the grant's credentials it refuses.
    await expect(
      throughProxy(`http://127.0.0.1:${st.port}`, `${op.discovery}/generate_204`),
    ).rejects.toThrow();

    // --leader-elect: the Lease exists, names this process, and is renewed.
    await until('the leader Lease', () => leaderLease());
    const spec = leaseSpec();
    expect(spec.holderIdentity).toBe(op.identity());
    await until('a renewal of the leader Lease', () => leaseSpec().renewTime !== spec.renewTime, 10_000);

    // Delete: the finalizer is removed only after cleanup, then the object is gone.
    const del = await fetch(
      `${server.url}/apis/crawl.example.com/v1alpha1/namespaces/${PROXY_NS}/proxies/e2e-1`,
      { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } },
    );
    expect(del.status).toBeLessThan(300);
    await until('the Proxy to disappear', () => getProxy('e2e-1') === undefined);
    expect(server.resource('secrets').get(PROXY_NS, 'e2e-1-auth')).toBeUndefined();
    // The instance is gone with it: nothing listens on its port any more.
    await until('the proxy port to close', () => canBind(st.port as number));

    expect(await op.stop()).toBe(0);
    // A graceful stop hands the Lease back at once.
    expect(leaseSpec().holderIdentity ?? '').toBe('');
  }, 60_000);

  it('keeps reconciling new Proxies across watch cuts and 410 Gone', async () => {
    const op = await startOperator({ name: 'a' });

    const proxyLists = (from: number) =>
      server.requests.slice(from).filter((r) => !r.watch && r.method === 'GET' && r.path.endsWith('/proxies'))
        .length;
    const atCut = server.requests.length;
    server.closeWatches();
    await createProxy('after-cut', op);
    await untilReadyAndHealthy('after-cut');
    // A plain cut resumes the watch from the last resourceVersion: no relist.
    expect(proxyLists(atCut)).toBe(0);

    // Move the global resourceVersion past everything the reflectors saw, drop the history,
    // then cut the watches: resuming is answered 410 and the reflectors must relist.
    server.resource('secrets').create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'unrelated', namespace: 'elsewhere' },
    } as StoredObject);
    server.compact();
    const before = server.requests.length;
    server.closeWatches();
    await createProxy('after-410', op);
    await untilReadyAndHealthy('after-410');
    // The resumed watch got an in-stream 410 (Expired), so the Proxy reflector relisted.
    expect(proxyLists(before)).toBeGreaterThan(0);
  }, 60_000);

  it('with two replicas only the leader reconciles, and SIGTERM hands over quickly', async () => {
    const a = await startOperator({ name: 'a', leaderElect: true });
    await until('a to lead', () => leaseSpec().holderIdentity === a.identity());
    const b = await startOperator({ name: 'b', leaderElect: true });

    // Probe through b's discovery endpoint: it outlives a.
    await createProxy('ha-1', b);
    const first = statusOf(await untilReadyAndHealthy('ha-1'));
    const became = (op: Operator) => op.logs.some((l) => l.msg.startsWith('became leader'));
    const reconciled = (op: Operator) =>
      op.logs.some((l) => l.component === 'controller' && l.proxy === `${PROXY_NS}/ha-1`);
    expect(became(a)).toBe(true);
    expect(became(b)).toBe(false);
    expect(reconciled(b)).toBe(false);
    // b still serves the discovery API (every replica does), from the same objects.
    expect((await lease(b)).proxy.name).toBe('ha-1');

    const stoppedAt = Date.now();
    expect(await a.stop()).toBe(0);
    await until('b to take the lease', () => leaseSpec().holderIdentity === b.identity(), 10_000);
    expect(Date.now() - stoppedAt).toBeLessThan(10_000);
    await until('b to start leading', () => became(b));

    // a's local instance died with it: b re-provisions the Proxy and serves it.
    const again = await until('ha-1 re-provisioned by b', () => {
      const p = getProxy('ha-1');
      return statusOf(p).phase === 'Ready' &&
        condition(p, CONDITION_HEALTHY)?.status === 'True' &&
        reconciled(b)
        ? p
        : undefined;
    });
    expect(statusOf(again).address).toBe(first.address);
    const grant = await lease(b);
    expect(await throughProxy(grant.proxy.url, `${b.discovery}/generate_204`)).toBe(204);
  }, 90_000);
});
