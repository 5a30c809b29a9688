/**
 * test/e2e/kube/support/global-setup — starts the tier's control plane once (building it first when
 * the cache has none) and hands its address, CA and admin token to every test file through
 * vitest's `provide`/`inject`; stops it when the tier ends. With `E2E_KUBECONFIG` set, the
 * files that need no control plane of their own run against that cluster instead (see
 * docs/testing.md, "Against your own cluster").
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import type { TestProject } from 'vitest/node';
import { type ControlPlaneInfo, controlPlaneBinaries, startControlPlane } from './control-plane.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    controlPlane: ControlPlaneInfo;
  }
}

/** A user's cluster from a kubeconfig whose user authenticates with a bearer token. */
function ownCluster(file: string): ControlPlaneInfo {
  const kc = new KubeConfig();
  kc.loadFromFile(file);
  const cluster = kc.getCurrentCluster();
  const token = kc.getCurrentUser()?.token;
  if (!cluster || !token)
    throw new Error(
      `E2E_KUBECONFIG ${file}: needs a current context whose user has a bearer token (cluster-admin)`,
    );
  const dir = mkdtempSync(join(tmpdir(), 'e2e-kube-own-'));
  let caFile = cluster.caFile ?? '';
  if (!caFile && cluster.caData) {
    caFile = join(dir, 'ca.crt');
    writeFileSync(caFile, Buffer.from(cluster.caData, 'base64'));
  }
  return {
    server: cluster.server,
    adminToken: token,
    kubeconfig: file,
    caFile,
    etcd: '',
    bin: controlPlaneBinaries(), // the matching kubectl
    dir,
    auditLog: '',
    version: 'own cluster',
  };
}

export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
  const own = process.env.E2E_KUBECONFIG;
  if (own) {
    project.provide('controlPlane', ownCluster(own));
    return undefined;
  }
  const started = Date.now();
  const cp = await startControlPlane();
  process.stderr.write(
    `[e2e-kube] kube-apiserver ${cp.version} on ${cp.server} ready in ${((Date.now() - started) / 1000).toFixed(1)} s\n`,
  );
  const { restartApiServer: _r, stop, ...info } = cp;
  project.provide('controlPlane', info);
  return stop;
}
