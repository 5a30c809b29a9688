/**
 * Vitest config of the real-API-server tier (`npm run test:kube`; `npm test` runs it after the
 * main suite): one real etcd + kube-apiserver + kube-controller-manager for the whole tier
 * (support/global-setup.ts), one file at a time, since the files share that control plane.
 * With E2E_KUBECONFIG set only the files that need nothing but an API server run (the others
 * restart the API server, compact etcd, read its audit log or run Pods on a test node).
 */
import { defineConfig } from 'vitest/config';

const OWN_CLUSTER_FILES = ['install', 'cel-parity', 'store-contract', 'fidelity'];

export default defineConfig({
  test: {
    include: process.env.E2E_KUBECONFIG
      ? OWN_CLUSTER_FILES.map((f) => `test/e2e/kube/${f}.test.ts`)
      : ['test/e2e/kube/**/*.test.ts'],
    globalSetup: ['test/e2e/kube/support/global-setup.ts'],
    testTimeout: 180_000,
    hookTimeout: 300_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
