/**
 * test/e2e/kube/support/node-agent — a test-only node for the real API server, since no kubelet runs
 * here: it registers a Ready Node (with topology labels), binds unscheduled Pods to it, and runs each Squid Pod for real —
 * the container's files from the Pod's Secret and ConfigMap volumes written into a directory per
 * Pod (mount paths rewritten), Squid started as the unprivileged `proxy` user on the Pod's own
 * loopback address (127.0.0.2, 127.0.0.3, … — a Pod IP each, as in a cluster) — then reports the
 * Pod Running and Ready with that podIP. A Pod being deleted gets its Squid stopped and is removed
 * with grace period 0, as a kubelet does. Pods of other images stay Pending: nothing runs them.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SQUID_BIN } from '../../../support/squid.ts';
import { until } from '../../../support/wait.ts';
import type { ControlPlaneInfo } from './control-plane.ts';
import { type Rest, rest } from './rest.ts';

export const NODE_NAME = 'e2e-node';
/** The Node's topology labels: the region and zone its proxy Pods report. */
export const NODE_REGION = 'e2e-region';
export const NODE_ZONE = 'e2e-region-a';
const PROXY_UID = 13;

interface Volume {
  name: string;
  secret?: { secretName: string };
  configMap?: { name: string };
}
interface Container {
  name: string;
  command?: string[];
  ports?: { containerPort: number }[];
  volumeMounts?: { name: string; mountPath: string }[];
}
interface Pod {
  metadata: { name: string; namespace: string; uid: string; deletionTimestamp?: string };
  spec: { nodeName?: string; containers: Container[]; volumes?: Volume[] };
  status?: { phase?: string };
}

export interface NodeAgent {
  /** Pods whose Squid runs now (`namespace/name` → Pod IP). */
  running(): Map<string, string>;
  /** Problems met running Pods (files missing, Squid exiting), for a failing test to print. */
  problems(): string[];
  stop(): Promise<void>;
}

function canBind(host: string, port: number): Promise<boolean> {
  const srv = createServer();
  return new Promise((r) => {
    srv.once('error', () => r(false));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => r(true)));
  });
}

function listening(host: string, port: number): Promise<boolean | undefined> {
  return new Promise((r) => {
    const sock = connect({ host, port }, () => {
      sock.destroy();
      r(true);
    });
    sock.on('error', () => r(undefined));
  });
}

export async function startNodeAgent(cp: ControlPlaneInfo): Promise<NodeAgent> {
  if (!existsSync(SQUID_BIN))
    throw new Error(
      `${SQUID_BIN} is missing: the node agent runs proxy Pods as real Squids (npm test installs it)`,
    );
  const api: Rest = rest(cp.server, cp.adminToken, cp.caFile);
  const dir = mkdtempSync(join(tmpdir(), 'e2e-node-'));
  chmodSync(dir, 0o755);
  const asProxy = process.getuid?.() === 0;
  const squids = new Map<string, { child: ChildProcess; ip: string; uid: string }>();
  const busy = new Set<string>();
  const problems: string[] = [];
  let nextIp = 2;
  let stopped = false;

  const ready = { type: 'Ready', status: 'True', reason: 'KubeletReady', message: 'e2e node agent' };
  const created = await api.call('POST', '/api/v1/nodes', {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name: NODE_NAME,
      labels: {
        'kubernetes.io/hostname': NODE_NAME,
        'topology.kubernetes.io/region': NODE_REGION,
        'topology.kubernetes.io/zone': NODE_ZONE,
      },
    },
  });
  if (created.status !== 201 && created.status !== 409)
    throw new Error(`registering node ${NODE_NAME}: ${created.status} ${JSON.stringify(created.body)}`);
  const heartbeat = async () => {
    const now = new Date().toISOString();
    await api.call(
      'PATCH',
      `/api/v1/nodes/${NODE_NAME}/status`,
      {
        status: {
          conditions: [{ ...ready, lastHeartbeatTime: now, lastTransitionTime: now }],
          addresses: [{ type: 'InternalIP', address: '127.0.0.1' }],
          capacity: { cpu: '2', memory: '8Gi', pods: '110' },
          allocatable: { cpu: '2', memory: '8Gi', pods: '110' },
        },
      },
      { contentType: 'application/strategic-merge-patch+json' },
    );
  };
  await heartbeat();

  const key = (p: Pod) => `${p.metadata.namespace}/${p.metadata.name}`;

  const bind = (p: Pod) =>
    api.call('POST', `/api/v1/namespaces/${p.metadata.namespace}/pods/${p.metadata.name}/binding`, {
      apiVersion: 'v1',
      kind: 'Binding',
      metadata: { name: p.metadata.name, namespace: p.metadata.namespace },
      target: { apiVersion: 'v1', kind: 'Node', name: NODE_NAME },
    });

  /** Writes the Pod's volumes into its directory; false while a referenced object is missing. */
  const materialise = async (p: Pod, podDir: string): Promise<Map<string, string> | undefined> => {
    const mounts = new Map<string, string>();
    const container = p.spec.containers.find((c) => c.command?.[0] === 'squid');
    for (const m of container?.volumeMounts ?? []) {
      const vol = p.spec.volumes?.find((v) => v.name === m.name);
      const local = join(podDir, 'volumes', m.name);
      mkdirSync(local, { recursive: true });
      mounts.set(m.mountPath, local);
      const source = vol?.secret
        ? `/api/v1/namespaces/${p.metadata.namespace}/secrets/${vol.secret.secretName}`
        : vol?.configMap
          ? `/api/v1/namespaces/${p.metadata.namespace}/configmaps/${vol.configMap.name}`
          : undefined;
      if (!source) continue; // emptyDir: an empty writable directory
      const got = await api.call('GET', source);
      if (got.status === 404) return undefined; // written right after the Pod: next round
      if (got.status !== 200) throw new Error(`GET ${source}: ${got.status}`);
      for (const [file, value] of Object.entries((got.body.data ?? {}) as Record<string, string>)) {
        writeFileSync(join(local, file), vol?.secret ? Buffer.from(value, 'base64') : value);
      }
    }
    return mounts;
  };

  const run = async (p: Pod) => {
    const container = p.spec.containers.find((c) => c.command?.[0] === 'squid');
    if (!container?.command) return; // only Squid Pods run here
    const podDir = join(dir, `${p.metadata.namespace}-${p.metadata.name}`);
    const mounts = await materialise(p, podDir);
    if (!mounts) return;
    const port = container.ports?.[0]?.containerPort ?? 3128;
    // A Pod IP of its own whose port nothing else holds (a Squid left by a killed run would).
    let ip = `127.0.0.${nextIp++}`;
    while (!(await canBind(ip, port))) ip = `127.0.0.${nextIp++}`;
    // One pass over every mount path, whole path segments only: a mount at /tmp must not
    // rewrite the /tmp/… directory another mount was already moved to.
    const paths = [...mounts.keys()]
      .sort((x, y) => y.length - x.length)
      .map((m) => m.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
    const mountPath = new RegExp(`(?<![\\w/.-])(${paths.join('|')})(?=/|\\s|$)`, 'gm');
    const local = (text: string) =>
      paths.length ? text.replace(mountPath, (m) => mounts.get(m) as string) : text;
    const args = container.command.slice(1).map(local);
    const confIdx = args.indexOf('-f') + 1;
    const confPath = args[confIdx] as string;
    const conf = local(readFileSync(confPath, 'utf8')).replace(
      new RegExp(`^http_port ${port}$`, 'm'),
      `http_port ${ip}:${port}`,
    );
    const localConf = join(podDir, 'squid.conf');
    writeFileSync(localConf, conf);
    args[confIdx] = localConf;
    const out = join(podDir, 'container.log');
    writeFileSync(out, '');
    if (asProxy) {
      const chownTree = (d: string) => {
        chownSync(d, PROXY_UID, PROXY_UID);
        for (const e of readdirSync(d, { withFileTypes: true })) {
          if (e.isDirectory()) chownTree(join(d, e.name));
          else chownSync(join(d, e.name), PROXY_UID, PROXY_UID);
        }
      };
      chownTree(podDir);
    }
    // squid -n gives each Pod's Squid its own service name (shared memory, pid registry).
    const child = spawn(SQUID_BIN, ['-n', `e2epod${process.pid}x${nextIp}`, ...args], {
      stdio: ['ignore', openSync(out, 'a'), openSync(out, 'a')],
      ...(asProxy ? { uid: PROXY_UID, gid: PROXY_UID } : {}),
    });
    squids.set(key(p), { child, ip, uid: p.metadata.uid });
    child.once('exit', (code, sig) => {
      if (!stopped && squids.get(key(p))?.child === child)
        problems.push(
          `squid of ${key(p)} exited (${code ?? sig}): ${readFileSync(out, 'utf8').split('\n').slice(-8).join(' | ')}`,
        );
    });
    await until(`squid of ${key(p)} to listen on ${ip}:${port}`, () => listening(ip, port), {
      timeoutMs: 15_000,
      intervalMs: 50,
      failFast: () => (child.exitCode !== null ? `squid exited ${child.exitCode}` : undefined),
    });
    const now = new Date().toISOString();
    const status = await api.call(
      'PATCH',
      `/api/v1/namespaces/${p.metadata.namespace}/pods/${p.metadata.name}/status`,
      {
        status: {
          phase: 'Running',
          hostIP: '127.0.0.1',
          podIP: ip,
          podIPs: [{ ip }],
          startTime: now,
          conditions: [
            { type: 'PodScheduled', status: 'True', lastTransitionTime: now },
            { type: 'Initialized', status: 'True', lastTransitionTime: now },
            { type: 'ContainersReady', status: 'True', lastTransitionTime: now },
            { type: 'Ready', status: 'True', lastTransitionTime: now },
          ],
          containerStatuses: [
            {
              name: container.name,
              ready: true,
              started: true,
              restartCount: 0,
              image: 'squid',
              imageID: '',
              state: { running: { startedAt: now } },
            },
          ],
        },
      },
      { contentType: 'application/strategic-merge-patch+json' },
    );
    if (status.status !== 200) problems.push(`status of ${key(p)}: ${status.status}`);
  };

  const kill = (k: string) => {
    const s = squids.get(k);
    if (!s) return;
    squids.delete(k);
    s.child.kill('SIGKILL');
  };

  const round = async () => {
    const list = await api.call('GET', '/api/v1/pods');
    if (list.status !== 200) return;
    const pods = list.body.items as Pod[];
    const live = new Set(pods.map(key));
    for (const p of pods) {
      const k = key(p);
      if (busy.has(k)) continue;
      if (p.metadata.deletionTimestamp) {
        kill(k);
        await api.call('DELETE', `/api/v1/namespaces/${p.metadata.namespace}/pods/${p.metadata.name}`, {
          apiVersion: 'v1',
          kind: 'DeleteOptions',
          gracePeriodSeconds: 0,
          preconditions: { uid: p.metadata.uid },
        });
        continue;
      }
      if (!p.spec.nodeName) {
        await bind(p);
        continue;
      }
      if (p.spec.nodeName !== NODE_NAME || squids.has(k)) continue;
      busy.add(k);
      run(p)
        .catch((e: Error) => problems.push(`running ${k}: ${e.message}`))
        .finally(() => busy.delete(k));
    }
    for (const [k, s] of squids) {
      // Gone from the API (or replaced by a Pod of the same name): stop it.
      const now = pods.find((p) => key(p) === k);
      if (!live.has(k) || now?.metadata.uid !== s.uid) kill(k);
    }
  };

  let beats = 0;
  const loop = (async () => {
    while (!stopped) {
      try {
        await round();
        if (++beats % 50 === 0) await heartbeat();
      } catch (e) {
        if (!stopped) problems.push(`node agent round: ${(e as Error).message}`);
      }
      await new Promise<void>((r) => setTimeout(r, 100));
    }
  })();

  return {
    running: () => new Map([...squids].map(([k, s]) => [k, s.ip])),
    problems: () => [...problems],
    stop: async () => {
      stopped = true;
      await loop;
      for (const k of [...squids.keys()]) kill(k);
      await api.call('DELETE', `/api/v1/nodes/${NODE_NAME}`);
      await api.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
