/**
 * e2e-kube/support/global-setup — starts the tier's control plane once (building it first when
 * the cache has none) and hands its address, CA and admin token to every test file through
 * vitest's `provide`/`inject`; stops it when the tier ends.
 */
import type { TestProject } from 'vitest/node';
import { type ControlPlaneInfo, startControlPlane } from './control-plane.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    controlPlane: ControlPlaneInfo;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const started = Date.now();
  const cp = await startControlPlane();
  process.stderr.write(
    `[e2e-kube] kube-apiserver ${cp.version} on ${cp.server} ready in ${((Date.now() - started) / 1000).toFixed(1)} s\n`,
  );
  const { restartApiServer: _r, stop, ...info } = cp;
  project.provide('controlPlane', info);
  return stop;
}
