/**
 * operator-env — runs the real CLI (`main.ts operator`) as child processes against the stateful
 * Kubernetes REST test server, for the cluster-mode tests in test/integration/cmd and test/e2e/cmd: a kubeconfig
 * file, providers configs with the `local` provider on free ports, JSON log capture, Proxy
 * creation over HTTP, lease + tunnel helpers, and a kubelet stand-in that runs the kubernetes
 * provider's Pods as real Squids on loopback. `useOperatorEnv()` registers the per-test hooks.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterEach, beforeEach, expect } from 'vitest';
import { CONDITION_HEALTHY, CONDITION_PROVISIONED } from '../../src/api/constants.ts';
import type { Condition } from '../../src/api/meta.ts';
import type { StoredObject } from '../../src/runtime/objects/types.ts';
import { type KubeServer, startKubeServer } from './kube-server/index.ts';
import { canBind, freePortRange } from './ports.ts';
import { until as waitUntil } from './wait.ts';

export { canBind, freePortRange };

const ROOT = resolve(import.meta.dirname, '../..');
const NODE = join(ROOT, 'node_modules/.bin/node');
// OPERATOR_E2E_MAIN=<dir>/dist/cmd/main.js runs the same suite against a compiled build.
const MAIN = process.env.OPERATOR_E2E_MAIN ?? join(ROOT, 'src/cmd/main.ts');
export const TOKEN = 'e2e-token';
export const PROXY_NS = 'crawl';
export const OPERATOR_NS = 'operator-system';
export const LEADER_LEASE = 'egress-proxies-operator-leader';

import { freePort } from './ports.ts';

export { freePort };

/** The shared bounded wait, with the 30 s default operator start-ups need. */
export function until<T>(
  what: string,
  probe: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 30_000,
): Promise<T> {
  return waitUntil(what, probe, { timeoutMs, intervalMs: 50 });
}

export interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}

export interface Operator {
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

/** Registers hooks giving each test a fresh API server, temp dir and kubeconfig. */
export function useOperatorEnv(): void {
  beforeEach(setUp);
  afterEach(tearDown);
}

/** The current test's API server. */
export function kube(): KubeServer {
  return server;
}

async function setUp(): Promise<void> {
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
}

async function tearDown(): Promise<void> {
  await Promise.all(operators.splice(0).map((o) => o.stop()));
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}

export async function startOperator(opts: {
  leaderElect?: boolean;
  name: string;
  extraArgs?: string[];
  /** Extra providers config entries (YAML list items). */
  extraProviders?: string;
  /** The discovery API's port; default a free one. */
  discoveryPort?: number;
  /**
   * Loopback ports this operator's local proxies may reach (the egress policy refuses loopback
   * by default): another replica's discovery API the tests probe through them.
   */
  openPorts?: number[];
  /** Environment variables besides the test's own (e.g. the downward API's POD_IP). */
  env?: Record<string, string>;
}): Promise<Operator> {
  const range = await freePortRange(8);
  const providers = join(dir, `providers-${opts.name}.yaml`);
  writeFileSync(
    providers,
    `providers:\n  - name: local\n    type: local\n    local:\n      bindAddress: 127.0.0.1\n      portRange: {from: ${range.from}, to: ${range.to}}\n${
      opts.openPorts
        ? `      egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${opts.openPorts.join(', ')}]}\n`
        : ''
    }${opts.extraProviders ?? ''}`,
  );
  const discoveryPort = opts.discoveryPort ?? (await freePort());
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
    ...(opts.extraArgs ?? []),
  ];
  const child = spawn(NODE, args, {
    cwd: ROOT,
    // No DISCOVERY_TOKEN at all: an empty one is a start-up error.
    env: Object.fromEntries(
      Object.entries({ ...process.env, POD_NAMESPACE: OPERATOR_NS, ...opts.env }).filter(
        ([k]) => k !== 'DISCOVERY_TOKEN',
      ),
    ),
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
  const state = await until(
    `${opts.name} /readyz`,
    async () => {
      if (child.exitCode !== null) return 'exited';
      const res = await fetch(`${op.probes}/readyz`);
      return res.status === 200 ? 'ready' : undefined;
    },
    30_000,
  );
  if (state === 'exited') {
    throw new Error(
      `operator ${opts.name} exited with ${child.exitCode} before it was ready: ${stderr.join('')}`,
    );
  }
  return op;
}

/** DELETE through the API, as kubectl would. */
export async function deleteProxy(name: string, namespace = PROXY_NS): Promise<void> {
  const res = await fetch(
    `${server.url}/apis/crawl.example.com/v1alpha1/namespaces/${namespace}/proxies/${name}`,
    {
      method: 'DELETE',
      headers: { authorization: `Bearer ${TOKEN}` },
    },
  );
  expect(res.status).toBeLessThan(300);
}

export function discoveryPortOf(op: Operator): number {
  return Number(new URL(op.discovery).port);
}

export async function createProxy(
  name: string,
  probeTarget: Operator,
  namespace = PROXY_NS,
  spec: Record<string, unknown> = { provider: 'local', port: 3128 },
): Promise<StoredObject> {
  const res = await fetch(`${server.url}/apis/crawl.example.com/v1alpha1/namespaces/${namespace}/proxies`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'Proxy',
      metadata: { name, namespace, labels: { pool: 'e2e' } },
      spec: {
        type: 'Managed',
        ...spec,
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

export const proxies = () => server.resource('proxies');
export const leaderLease = () => server.resource('leases').get(OPERATOR_NS, LEADER_LEASE);
export const leaseSpec = () => (leaderLease()?.spec ?? {}) as { holderIdentity?: string; renewTime?: string };
export const getProxy = (name: string) => proxies().get(PROXY_NS, name);

export function condition(obj: StoredObject | undefined, type: string): Condition | undefined {
  const status = obj?.status as { conditions?: Condition[] } | undefined;
  return status?.conditions?.find((c) => c.type === type);
}

export interface ProxyStatus {
  phase?: string;
  address?: string;
  port?: number;
  providerID?: string;
}

export const statusOf = (obj: StoredObject | undefined) => (obj?.status ?? {}) as ProxyStatus;

export async function untilReadyAndHealthy(name: string, timeoutMs = 30_000): Promise<StoredObject> {
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

export interface Grant {
  id: string;
  proxy: { namespace: string; name: string; url: string; host: string; port: number };
}

export async function lease(op: Operator): Promise<Grant> {
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
export async function throughProxy(proxyUrl: string, url: string): Promise<number> {
  const agent = new ProxyAgent({ uri: proxyUrl });
  try {
    const res = await undiciFetch(url, { dispatcher: agent, signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status;
  } finally {
    await agent.close();
  }
}

const SQUID = '/usr/sbin/squid';

/**
 * Plays the kubelet for the kubernetes provider's Pods: each new Pod's Squid runs for real on
 * 127.0.0.1 with the squid.conf and htpasswd from the Pod's Secret (paths moved to a temp dir),
 * as the unprivileged `proxy` user like in the Pod, and the Pod is then marked Running + Ready
 * with podIP 127.0.0.1. Deleted Pods get their Squid stopped.
 */
export function playKubelet(): { stop(): Promise<void> } {
  const running = new Map<string, ChildProcess>();
  const starting = new Set<string>();
  let stopped = false;
  const asProxy = process.getuid?.() === 0;
  const startPod = async (pod: StoredObject) => {
    const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
    const secret = server.resource('secrets').get(pod.metadata.namespace, pod.metadata.name);
    if (!secret) return; // the provider writes it right after the Pod; next round
    starting.add(key);
    const spec = pod.spec as { containers: { ports: { containerPort: number }[] }[] };
    const port = spec.containers[0]?.ports[0]?.containerPort as number;
    const data = secret.data as Record<string, string>;
    const podDir = join(dir, `pod-${pod.metadata.name}`);
    mkdirSync(podDir, { recursive: true });
    const conf = Buffer.from(data['squid.conf'] as string, 'base64')
      .toString()
      .replace(`http_port ${port}`, `http_port 127.0.0.1:${port}`)
      .replaceAll('/etc/squid-operator/', `${podDir}/`);
    writeFileSync(join(podDir, 'squid.conf'), conf);
    writeFileSync(join(podDir, 'htpasswd'), Buffer.from(data.htpasswd as string, 'base64'));
    for (const f of ['stdout', 'stderr']) writeFileSync(join(podDir, f), '');
    chmodSync(dir, 0o755);
    chmodSync(podDir, 0o755);
    if (asProxy) {
      for (const f of ['', 'squid.conf', 'htpasswd', 'stdout', 'stderr']) chownSync(join(podDir, f), 13, 13);
    }
    const child = spawn(
      SQUID,
      ['-N', '-n', `e2e${process.pid}${pod.metadata.name.slice(-8)}`, '-f', join(podDir, 'squid.conf')],
      {
        stdio: ['ignore', openSync(join(podDir, 'stdout'), 'a'), openSync(join(podDir, 'stderr'), 'a')],
        ...(asProxy ? { uid: 13, gid: 13 } : {}),
      },
    );
    running.set(key, child);
    await until(
      'squid to listen',
      () =>
        new Promise<boolean | undefined>((r) => {
          const sock = connect({ host: '127.0.0.1', port }, () => {
            sock.destroy();
            r(true);
          });
          sock.on('error', () => r(undefined));
        }),
      15_000,
    );
    server.resource('pods').update(
      {
        ...pod,
        status: {
          phase: 'Running',
          podIP: '127.0.0.1',
          conditions: [{ type: 'Ready', status: 'True' }],
        },
      } as StoredObject,
      { subresource: 'status' },
    );
    starting.delete(key);
  };
  const loop = (async () => {
    while (!stopped) {
      const pods = server.resource('pods').all();
      const live = new Set(pods.map((p) => `${p.metadata.namespace}/${p.metadata.name}`));
      for (const pod of pods) {
        const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
        if (!running.has(key) && !starting.has(key)) await startPod(pod);
      }
      for (const [key, child] of running) {
        if (!live.has(key)) {
          child.kill('SIGKILL');
          running.delete(key);
        }
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
      for (const child of running.values()) child.kill('SIGKILL');
    },
  };
}
