/**
 * The reconciler's status patches are JSON merge patches, merged into sub-objects on the
 * server: a key the new status no longer has must travel as null, or the stored object keeps
 * it (a replacement that lost its address, a restart record that changed shape). Checked on the
 * patch itself and through a real store's status subresource.
 */
import { describe, expect, it } from 'vitest';
import { API_VERSION, PROXY_KIND } from '../../../src/api/constants.ts';
import type { ProxyStatus } from '../../../src/api/proxy.ts';
import { statusPatch } from '../../../src/controller/status.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { mergePatch } from '../../../src/runtime/patch.ts';

const base: ProxyStatus = {
  phase: 'Replacing',
  pending: { providerID: 'p/2', instanceName: 'px-2', address: '10.0.0.2', port: 3128 },
  restart: {
    requestedAt: '2026-01-01T00:00:00Z',
    phase: 'Failed',
    since: '2026-01-01T00:01:00Z',
    previousAddress: '10.0.0.1',
    message: 'restart failed: boom',
  },
};

const next: ProxyStatus = {
  phase: 'Replacing',
  pending: { providerID: 'p/3', instanceName: 'px-3' },
  restart: { requestedAt: '2026-01-01T00:05:00Z', phase: 'Draining', since: '2026-01-01T00:05:00Z' },
};

describe('status merge patches', () => {
  it('null the keys a sub-object lost and send only what changed', () => {
    const patch = statusPatch(base, next);
    expect(patch).toEqual({
      pending: { providerID: 'p/3', instanceName: 'px-3', address: null, port: null },
      restart: {
        requestedAt: '2026-01-01T00:05:00Z',
        phase: 'Draining',
        since: '2026-01-01T00:05:00Z',
        previousAddress: null,
        message: null,
      },
    });
    expect(mergePatch(base, patch)).toEqual(next);
    expect(statusPatch(next, next)).toBeUndefined();
    expect(statusPatch(base, { phase: 'Ready' })).toEqual({ phase: 'Ready', pending: null, restart: null });
  });

  it('the stored status is exactly the new one after the patch', async () => {
    const store = createMemoryStore();
    await store.proxies.create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name: 'p', namespace: 'crawl' },
      spec: { provider: 'dev' },
    });
    const key = { namespace: 'crawl', name: 'p' };
    await store.proxies.patchStatus(key, base as Record<string, unknown>);
    const written = await store.proxies.patchStatus(key, statusPatch(base, next) ?? {});
    expect(written.status).toEqual(next);
  });
});
