/**
 * Where the installation id comes from: `--installation-id` (validated, naming the flag), else
 * in cluster mode the kube-system namespace UID, else in standalone mode the id kept in the
 * state file (test/unit/runtime/embedded-installation.test.ts); the CLI refuses a state that lost it.
 */
import { existsSync } from 'node:fs';
import { readFile, unlink, writeFile } from 'node:fs/promises';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { FlagError, parseCommandLine } from '../../../src/cmd/flags.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createKubeClients } from '../../../src/runtime/kube/client.ts';
import { clusterInstallationId } from '../../../src/runtime/kube/installation.ts';
import { cleanupCli, createWorkspace, runCli, standaloneArgs } from '../../support/cli.ts';
import { startKubeServer } from '../../support/kube-server/index.ts';

vi.setConfig({ testTimeout: 60_000 });
afterAll(cleanupCli);

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('--installation-id', () => {
  it('is accepted by both modes when it is a valid label value', () => {
    const s = parseCommandLine(['standalone', '--config', 'x', '--installation-id', 'team-a_1']);
    expect(s.command === 'standalone' && s.flags.installationId).toBe('team-a_1');
    const o = parseCommandLine(['operator', '--providers-config', 'p', '--installation-id=prod-eu']);
    expect(o.command === 'operator' && o.flags.installationId).toBe('prod-eu');
    const none = parseCommandLine(['standalone', '--config', 'x']);
    expect(none.command === 'standalone' && none.flags.installationId).toBeUndefined();
  });

  it('rejects what cannot be a GCP and Kubernetes label value, naming the flag', () => {
    for (const bad of ['', 'Upper', '-lead', 'trail-', 'a.b', 'x'.repeat(64), 'with space']) {
      for (const argv of [
        ['operator', '--providers-config', 'p', `--installation-id=${bad}`],
        ['standalone', '--config', 'x', `--installation-id=${bad}`],
      ]) {
        expect(() => parseCommandLine(argv)).toThrow(FlagError);
        expect(() => parseCommandLine(argv)).toThrow(/^--installation-id: .*not a valid installation id/);
      }
    }
  });
});

describe('standalone installation id (the real CLI)', () => {
  it('refuses to start as a new installation when the state has objects but lost its id', async () => {
    const ws = await createWorkspace();
    // The state an older build leaves: objects in the journal, the id in a separate file.
    const store = await createEmbeddedStore({ statePath: ws.statePath, manifests: ws.proxiesDir });
    await store.stop();
    const lines = (await readFile(ws.statePath, 'utf8')).split('\n');
    const header = JSON.parse(lines[0] as string) as Record<string, unknown>;
    delete header.installation;
    lines[0] = JSON.stringify(header);
    await writeFile(ws.statePath, lines.join('\n'));
    await unlink(`${ws.statePath}.installation-id`);
    const before = await readFile(ws.statePath, 'utf8');

    // ...and that separate file lost.
    const res = await runCli(standaloneArgs(ws), ws.dir);
    expect(res.code).toBe(2);
    const out = res.stderr.trim().split('\n');
    expect(out).toHaveLength(1);
    expect(out[0]).toMatch(
      new RegExp(
        `^egress-proxies-operator: state file ${ws.statePath} holds \\d+ object\\(s\\) but no installation id`,
      ),
    );
    expect(out[0]).toContain('--installation-id <id>');
    expect(await readFile(ws.statePath, 'utf8')).toBe(before);
    expect(existsSync(`${ws.statePath}.lock`)).toBe(false);

    // A --installation-id that disagrees with the kept id names both.
    await writeFile(ws.statePath, before.replace(/^\{/, '{"installation":"kept-id",'));
    const other = await runCli(standaloneArgs(ws, ['--installation-id', 'other-id']), ws.dir);
    expect(other.code).toBe(2);
    expect(other.stderr).toContain(
      `--installation-id other-id disagrees with the installation id kept-id kept in state file ${ws.statePath}`,
    );
  });
});

describe('cluster installation id', () => {
  it('is the kube-system namespace UID: stable for one cluster, different for another', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) {
      const server = await startKubeServer();
      const clients = await createKubeClients(server.kubeConfig());
      cleanups.push(async () => {
        await clients.close();
        await server.stop();
      });
      const id = await clusterInstallationId(clients.core);
      expect(id).toMatch(/^[0-9a-f-]{36}$/);
      expect(await clusterInstallationId(clients.core)).toBe(id);
      ids.push(id);
    }
    expect(ids[0]).not.toBe(ids[1]);
  });

  it('says how to do without it when the namespace cannot be read', async () => {
    const server = await startKubeServer();
    const clients = await createKubeClients(server.kubeConfig());
    cleanups.push(async () => {
      await clients.close();
      await server.stop();
    });
    server.injectFault({
      method: 'GET',
      path: /\/namespaces\/kube-system$/,
      status: 403,
      message: 'forbidden',
    });
    await expect(clusterInstallationId(clients.core)).rejects.toThrow(/--installation-id/);
  });
});
