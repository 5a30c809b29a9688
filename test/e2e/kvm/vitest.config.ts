/**
 * Vitest config of the KVM end-to-end tier (`npm run test:kvm`; `npm test` runs it after the main
 * suite): a real Debian guest booted on QEMU/TCG, so minutes per test and one file at a time.
 */
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/e2e/kvm/**/*.test.ts'],
    testTimeout: 900_000,
    hookTimeout: 1_200_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
