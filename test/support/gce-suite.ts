/**
 * test/support/gce-suite — one fake GCE server for a test file: started before its tests,
 * emptied before each one (requests, instances, operations, faults, operation delay) and closed
 * after them; the providers a test made are closed after that test.
 */
import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest';
import type { GcpProvider } from '../../src/provider/gcp/index.ts';
import { type FakeGce, startFakeGce } from './fake-gce.ts';

export interface GceSuite {
  /** The running fake (inside hooks and tests only). */
  readonly fake: FakeGce;
  /** Providers to close after the current test. */
  readonly providers: GcpProvider[];
}

export function useFakeGce(opts: { zones: string[]; boot?: boolean }): GceSuite {
  let started: FakeGce | undefined;
  const providers: GcpProvider[] = [];
  const suite: GceSuite = {
    get fake(): FakeGce {
      if (!started) throw new Error('the fake GCE runs only inside the suite (hooks and tests)');
      return started;
    },
    providers,
  };
  beforeAll(async () => {
    started = await startFakeGce({ zones: opts.zones });
    if (opts.boot) started.boot = true;
  });
  afterAll(async () => {
    await started?.close();
  });
  beforeEach(() => {
    const fake = suite.fake;
    fake.requests.length = 0;
    fake.instances.clear();
    fake.operations.clear();
    fake.clearFaults();
    fake.operationDelayMs = 0;
  });
  afterEach(async () => {
    await Promise.all(providers.splice(0).map((p) => p.close()));
  });
  return suite;
}
