/**
 * Vitest config of the real-cluster suite (`npm run test:e2e`); `npm test` never runs it.
 * One file at a time, long timeouts: it builds an image and waits for a cluster.
 */
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/e2e/**/*.test.ts'],
    testTimeout: 300_000,
    hookTimeout: 600_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
