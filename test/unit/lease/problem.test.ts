/**
 * A Proxy stuck on CredentialsError or CloudInitError (its Provisioned condition): the lease
 * feed publishes the problem to the lease store (so /v1/proxies and `status` show it) and logs
 * it once per problem, not on every Proxy event; a fixed problem clears and is logged as such.
 */
import { afterEach, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { formatStatusTable } from '../../../src/cmd/status.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

const T = '2026-01-01T00:00:00Z';
const provisioned = (status: 'True' | 'False', reason: string, message: string) => [
  { type: 'Provisioned', status, reason, message, lastTransitionTime: T },
];
const MISSING = 'credentials Secret "eu-creds" (spec.credentialsSecretRef) not found';

it('shows the problem in the snapshot and the status table, and logs it once', async () => {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const leases = new LeaseStore({ clock });
  const captured = captureLog('debug');
  const ac = new AbortController();
  const feed = startLeaseFeed({ store, leases, signal: ac.signal, clock, log: captured.log });
  cleanups.push(() => {
    ac.abort();
    leases.close();
  });
  const key = { namespace: 'crawl', name: 'eu-1' };
  store.seedProxy({
    metadata: { ...key },
    spec: { type: 'Managed', provider: 'local', credentialsSecretRef: { name: 'eu-creds' } },
    status: { phase: 'Pending', conditions: provisioned('False', 'CredentialsError', MISSING) },
  } as ProxyObject);
  await feed.idle();
  // Every reconcile pass and every status write is an event; the problem stays the same.
  for (let i = 0; i < 5; i++) {
    await store.proxies.patchStatus(key, { message: `${MISSING} (${i})` });
    await feed.idle();
  }
  const [snap] = leases.snapshot();
  expect(snap).toMatchObject({ name: 'eu-1', leasable: false, reason: 'NotReady' });
  expect(snap?.problem).toEqual({ reason: 'CredentialsError', message: MISSING });
  const table = formatStatusTable(leases.snapshot());
  expect(table).toContain('NEEDS ATTENTION');
  expect(table).toContain(`crawl/eu-1: CredentialsError: ${MISSING}`);
  const warned = () => captured.lines.filter((l) => l.msg === 'proxy needs attention');
  expect(warned()).toHaveLength(1);
  expect(warned()[0]).toMatchObject({ proxy: 'crawl/eu-1', reason: 'CredentialsError', message: MISSING });

  // A different problem is news; then fixed: cleared in the snapshot, logged once as resolved.
  await store.proxies.patchStatus(key, {
    conditions: provisioned('False', 'CloudInitError', 'cloud-init Secret "ci" not found'),
  });
  await feed.idle();
  expect(warned()).toHaveLength(2);
  expect(leases.snapshot()[0]?.problem?.reason).toBe('CloudInitError');
  for (let i = 0; i < 3; i++) {
    await store.proxies.patchStatus(key, {
      message: null,
      conditions: provisioned('True', 'InstanceRunning', `running ${i}`),
    } as never);
    await feed.idle();
  }
  expect(leases.snapshot()[0]?.problem).toBeNull();
  expect(captured.lines.filter((l) => l.msg === 'proxy problem resolved')).toHaveLength(1);
  expect(formatStatusTable(leases.snapshot())).not.toContain('NEEDS ATTENTION');
});
