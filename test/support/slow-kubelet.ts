/**
 * test/support/slow-kubelet — plays the kubelet for the kubernetes provider's Pods like
 * operator-env's `playKubelet`, but gives every Pod its own loopback address (127.0.0.2,
 * 127.0.0.3, … — a Pod IP each, as in a cluster, so an old and a new Pod can serve the same
 * port side by side) and can be slow: while `slow` is set, a new Pod is marked Running with its
 * Pod IP at once, but its Squid starts only when the test calls `serve(pod)` — the way a VM is
 * Running long before cloud-init has started Squid.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { StoredObject } from '../../src/runtime/objects/types.ts';
import type { KubeServer } from './kube-server/index.ts';
import { SQUID_BIN } from './squid.ts';
import { until } from './wait.ts';

export interface SlowKubelet {
  /** New Pods wait for `serve` before their Squid starts. */
  slow: boolean;
  /** Pods Running whose Squid has not started. */
  waiting(): string[];
  /** Starts the Squid of a waiting Pod; resolves once it listens. */
  serve(pod: string): Promise<void>;
  stop(): Promise<void>;
}

export function playSlowKubelet(server: KubeServer): SlowKubelet {
  const dir = mkdtempSync(join(tmpdir(), 'slow-kubelet-'));
  const running = new Map<string, ChildProcess>();
  const known = new Map<string, { ip: string; start: () => Promise<void> }>();
  const waiting = new Set<string>();
  let nextIp = 2;
  let stopped = false;
  const asProxy = process.getuid?.() === 0;
  const self: SlowKubelet = {
    slow: false,
    waiting: () => [...waiting],
    serve: async (pod) => {
      const k = [...known.keys()].find((key) => key.endsWith(`/${pod}`));
      if (!k || !waiting.has(k)) throw new Error(`pod ${pod} is not waiting`);
      waiting.delete(k);
      await known.get(k)?.start();
    },
    stop: async () => {
      stopped = true;
      await loop;
      for (const child of running.values()) child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };

  const markRunning = (pod: StoredObject, ip: string) =>
    server.resource('pods').update(
      {
        ...pod,
        status: { phase: 'Running', podIP: ip, conditions: [{ type: 'Ready', status: 'True' }] },
      } as StoredObject,
      { subresource: 'status' },
    );

  const admit = (pod: StoredObject): boolean => {
    const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
    const secret = server.resource('secrets').get(pod.metadata.namespace, pod.metadata.name);
    if (!secret) return false; // the provider writes it right after the Pod; next round
    const ip = `127.0.0.${nextIp++}`;
    const spec = pod.spec as { containers: { ports: { containerPort: number }[] }[] };
    const port = spec.containers[0]?.ports[0]?.containerPort as number;
    const data = secret.data as Record<string, string>;
    const podDir = join(dir, `pod-${pod.metadata.name}`);
    mkdirSync(podDir, { recursive: true });
    const conf = Buffer.from(data['squid.conf'] as string, 'base64')
      .toString()
      .replace(`http_port ${port}`, `http_port ${ip}:${port}`)
      .replaceAll('/etc/squid-operator/', `${podDir}/`);
    writeFileSync(join(podDir, 'squid.conf'), conf);
    writeFileSync(join(podDir, 'htpasswd'), Buffer.from(data.htpasswd as string, 'base64'));
    for (const f of ['stdout', 'stderr']) writeFileSync(join(podDir, f), '');
    chmodSync(dir, 0o755);
    chmodSync(podDir, 0o755);
    if (asProxy) {
      for (const f of ['', 'squid.conf', 'htpasswd', 'stdout', 'stderr']) chownSync(join(podDir, f), 13, 13);
    }
    const start = async () => {
      const child = spawn(
        SQUID_BIN,
        ['-N', '-n', `slow${process.pid}${pod.metadata.name.slice(-8)}`, '-f', join(podDir, 'squid.conf')],
        {
          stdio: ['ignore', openSync(join(podDir, 'stdout'), 'a'), openSync(join(podDir, 'stderr'), 'a')],
          ...(asProxy ? { uid: 13, gid: 13 } : {}),
        },
      );
      running.set(key, child);
      await until(
        `squid of ${pod.metadata.name} to listen`,
        () =>
          new Promise<boolean | undefined>((r) => {
            const sock = connect({ host: ip, port }, () => {
              sock.destroy();
              r(true);
            });
            sock.on('error', () => r(undefined));
          }),
        15_000,
      );
    };
    known.set(key, { ip, start });
    return true;
  };

  const loop = (async () => {
    while (!stopped) {
      const pods = server.resource('pods').all();
      const live = new Set(pods.map((p) => `${p.metadata.namespace}/${p.metadata.name}`));
      for (const pod of pods) {
        const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
        if (known.has(key) || !admit(pod)) continue;
        const { ip, start } = known.get(key)!;
        if (self.slow) {
          waiting.add(key);
          markRunning(pod, ip); // Running with an address, not serving yet
        } else {
          await start();
          markRunning(pod, ip);
        }
      }
      for (const [key, child] of running) {
        if (!live.has(key)) {
          child.kill('SIGKILL');
          running.delete(key);
        }
      }
      await new Promise<void>((r) => setTimeout(r, 100));
    }
  })();
  return self;
}
