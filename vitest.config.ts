/**
 * The vitest config of the three test tiers (docs/testing.md), one project each: a test file's
 * directory is its tier. `vitest run --project unit` (npm run test:unit) runs the in-process tier
 * alone; without --project all three run, one tier after the other (groupOrder, which vitest also
 * requires of projects with different maxWorkers), as `npm test` does before the real-API-server
 * and KVM suites (test/e2e/kube and test/e2e/kvm, each with its own config, run by
 * scripts/test/run.ts).
 */
import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: 'forks',
    reporters: ['default'],
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          // Mostly waiting on sockets and timers: two files at a time even on two cores (vitest's
          // default is one fewer than the cores), which keeps the tier under two minutes.
          maxWorkers: Math.max(2, availableParallelism() - 1),
          sequence: { groupOrder: 0 },
          // Refuses child processes: a unit test runs in the test process only.
          setupFiles: ['test/support/in-process.ts'],
        },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          sequence: { groupOrder: 1 },
        },
      },
      {
        extends: true,
        test: {
          name: 'e2e',
          include: ['test/e2e/**/*.test.ts'],
          exclude: ['test/e2e/kube/**', 'test/e2e/kvm/**', '**/node_modules/**'],
          sequence: { groupOrder: 2 },
        },
      },
    ],
  },
});
