/**
 * Where the installation id comes from: `--installation-id` (validated, naming the flag), else
 * in cluster mode the kube-system namespace UID, else in standalone mode an id generated once
 * and kept in `<state>.installation-id`.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FlagError, parseCommandLine } from '../../../src/cmd/flags.ts';
import {
  installationIdPath,
  loadOrCreateInstallationId,
} from '../../../src/runtime/embedded/installation.ts';
import { createKubeClients } from '../../../src/runtime/kube/client.ts';
import { clusterInstallationId } from '../../../src/runtime/kube/installation.ts';
import { startKubeServer } from '../../support/kube-server/index.ts';

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

describe('standalone installation id', () => {
  async function stateDir(): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), 'installation-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    return dir;
  }

  it('is generated once beside the state file and kept across restarts', async () => {
    const statePath = join(await stateDir(), 'standalone-state.json');
    const first = loadOrCreateInstallationId(statePath);
    expect(first.created).toBe(true);
    expect(first.path).toBe(installationIdPath(statePath));
    expect(first.path).toBe(`${statePath}.installation-id`);
    expect(first.id).toMatch(/^[0-9a-f-]{36}$/);
    expect((await readFile(first.path, 'utf8')).trim()).toBe(first.id);
    const again = loadOrCreateInstallationId(statePath);
    expect(again).toEqual({ id: first.id, path: first.path, created: false });
    // Another state file is another installation.
    const other = loadOrCreateInstallationId(join(await stateDir(), 'standalone-state.json'));
    expect(other.id).not.toBe(first.id);
  });

  it('refuses an empty or malformed id file, naming it, instead of starting a new installation', async () => {
    const statePath = join(await stateDir(), 'state.json');
    for (const content of ['', '  \n', 'Not An Id\n']) {
      await writeFile(installationIdPath(statePath), content);
      expect(() => loadOrCreateInstallationId(statePath)).toThrow(
        `installation id file ${installationIdPath(statePath)}`,
      );
    }
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
