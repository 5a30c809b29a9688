/**
 * Vitest config of the real-API-server tier (`npm run test:kube`; `npm test` runs it after the
 * main suite): one real etcd + kube-apiserver + kube-controller-manager for the whole tier
 * (support/global-setup.ts), one file at a time, since the files share that control plane.
 */
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/e2e-kube/**/*.test.ts'],
    globalSetup: ['test/e2e-kube/support/global-setup.ts'],
    testTimeout: 180_000,
    hookTimeout: 300_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
