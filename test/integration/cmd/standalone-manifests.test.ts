/**
 * End-to-end: editing Proxy manifests while the real `standalone` CLI runs — a new file brings
 * up a proxy, a spec change that changes the spec-hash replaces its instance, removing the file
 * deletes it and closes its listener, and a bad manifest is reported precisely and changes
 * nothing.
 */
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { DiscoveryClient, ProxySnapshot } from '../../../src/discovery/client.ts';
import {
  accepts,
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  healthCheckUrl,
  type LogLine,
  startStandalone,
  type Workspace,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';

// Real child processes on a possibly loaded 2-core machine: generous, one-sided limits.
vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];

let ws: Workspace;
let proc: CliProcess;
let client: DiscoveryClient;

beforeAll(async () => {
  ws = await createWorkspace();
  proc = startStandalone(ws);
  client = clientFor(ws);
  await waitForReady(ws, proc, NAMES, 40_000);
}, 60_000);

afterAll(cleanupCli);

function proxyYaml(name: string, pool: string, spec: Record<string, string | number> = {}): string {
  const extra = Object.entries(spec)
    .map(([k, v]) => `  ${k}: ${v}\n`)
    .join('');
  return [
    'apiVersion: crawl.example.com/v1alpha1',
    'kind: Proxy',
    'metadata:',
    `  name: ${name}`,
    '  namespace: crawl',
    `  labels: {pool: ${pool}}`,
    'spec:',
    '  provider: local',
    `${extra}  healthCheck:`,
    `    url: ${healthCheckUrl(ws)}`,
    '    expectStatus: 204',
    '',
  ].join('\n');
}

const started = (proxy: string) => (l: LogLine) =>
  l.msg === 'local proxy started' && l.proxy === `crawl/${proxy}`;

function startedInstances(proxy: string): string[] {
  return proc.logs.filter(started(proxy)).map((l) => String(l.instance));
}

function stoppedInstances(): string[] {
  return proc.logs.filter((l) => l.msg === 'local proxy stopped').map((l) => String(l.instance));
}

async function snapshot(name: string): Promise<ProxySnapshot | undefined> {
  return (await client.listProxies()).find((p) => p.name === name);
}

function readyHealthy(name: string, pred: (p: ProxySnapshot) => boolean = () => true) {
  return waitFor(
    async () => {
      const p = await snapshot(name);
      return p !== undefined && p.phase === 'Ready' && p.healthy && pred(p) && p;
    },
    `${name} Ready and healthy`,
    30_000,
    proc,
  );
}

describe('standalone CLI: manifest edits while running', () => {
  it('adds, replaces (spec-hash change) and removes a proxy from its file', async () => {
    const file = join(ws.proxiesDir, 'local-4.yaml');

    // Add.
    writeFileSync(file, proxyYaml('local-4', 'extra'));
    const first = await readyHealthy('local-4');
    const [firstInstance] = startedInstances('local-4');
    expect(firstInstance).toMatch(/^px-[0-9a-f]+-[0-9a-f]+$/);
    expect(await accepts(first.port as number)).toBe(true);
    const grant = await client.lease({ selector: 'pool=extra', ttlSeconds: 30 });
    expect(grant.proxy).toMatchObject({ name: 'local-4', port: first.port });
    await client.release(grant.id);

    // Replace: spec.port is part of the spec-hash; the local provider tries the asked port first.
    const taken = new Set((await client.listProxies()).map((p) => p.port));
    let newPort = ws.portRange.to;
    while (taken.has(newPort)) newPort--;
    writeFileSync(file, proxyYaml('local-4', 'extra', { port: newPort }));
    const second = await readyHealthy('local-4', (p) => p.port !== first.port);
    expect(second.port).toBe(newPort);
    const instances = startedInstances('local-4');
    expect(instances).toHaveLength(2);
    expect(instances[1]).not.toBe(firstInstance);
    // Same Proxy (UID part of the name), new spec (hash part).
    expect(instances[1]?.split('-')[1]).toBe(firstInstance?.split('-')[1]);
    await waitFor(
      () => stoppedInstances().includes(firstInstance as string),
      'old instance stopped',
      30_000,
      proc,
    );
    expect(await accepts(first.port as number)).toBe(false);
    expect(await accepts(newPort)).toBe(true);
    const grant2 = await client.lease({ selector: 'pool=extra', ttlSeconds: 30 });
    expect(grant2.proxy.port).toBe(newPort);

    // Remove, while a crawler still holds a lease on it.
    rmSync(file);
    await waitFor(
      async () => (await client.listProxies()).every((p) => p.name !== 'local-4'),
      'local-4 gone from /v1/proxies',
      30_000,
      proc,
    );
    await waitFor(async () => !(await accepts(newPort)), `port ${newPort} closed`, 10_000, proc);
    expect(stoppedInstances()).toContain(instances[1]);
    await expect(client.lease({ selector: 'pool=extra' })).rejects.toMatchObject({ status: 409 });
    await client.release(grant2.id);
    // The example proxies were not touched.
    expect((await client.listProxies()).map((p) => p.name)).toEqual(NAMES);
  });

  it('reports a bad manifest by file, document and field, and changes nothing', async () => {
    const before = await client.listProxies();
    const stoppedBefore = stoppedInstances().length;

    // A new file whose second document is invalid: neither document is applied.
    const bad = `${proxyYaml('local-9', 'bad')}---\n${proxyYaml('local-10', 'bad').replace(
      '    expectStatus: 204',
      '    expectStatus: 204\n    intervalSeconds: 5\n    failureThreshold: 2\n    timeoutSeconds: 10',
    )}`;
    writeFileSync(join(ws.proxiesDir, 'bad.yaml'), bad);
    // An existing file made invalid: local-1 keeps its last good version (and its instance).
    writeFileSync(
      join(ws.proxiesDir, 'local-1.yaml'),
      proxyYaml('local-1', 'eu', { port: ws.portRange.from }).replace(
        '    expectStatus: 204',
        '    expectStatus: 204\n    timeoutSeconds: 30',
      ),
    );

    const err = await proc.waitForLog(
      (l) => l.msg.startsWith('invalid manifest') && l.msg.includes('bad.yaml'),
      'error naming bad.yaml',
    );
    expect(err.msg).toMatch(/bad\.yaml: document 2: spec\.healthCheck\.timeoutSeconds: /);
    expect(err.level).toBeGreaterThanOrEqual(50);
    const err1 = await proc.waitForLog(
      (l) => l.msg.startsWith('invalid manifest') && l.msg.includes('local-1.yaml'),
      'error naming local-1.yaml',
    );
    expect(err1.msg).toMatch(/local-1\.yaml: document 1: spec\.healthCheck\.timeoutSeconds: /);

    // Barrier: a good file written afterwards is applied, so the bad scans are done.
    writeFileSync(join(ws.proxiesDir, 'local-5.yaml'), proxyYaml('local-5', 'late'));
    await readyHealthy('local-5');

    const after = await client.listProxies();
    expect(after.map((p) => p.name)).toEqual([...NAMES, 'local-5']);
    for (const p of before) {
      expect(after.find((a) => a.name === p.name)).toMatchObject({
        phase: 'Ready',
        healthy: true,
        port: p.port,
      });
    }
    expect(stoppedInstances()).toHaveLength(stoppedBefore);
    expect(startedInstances('local-1')).toHaveLength(1);
    // Logged once per distinct problem, not on every rescan.
    expect(proc.logs.filter((l) => l.msg.includes('bad.yaml: document 2'))).toHaveLength(1);
  });
});
