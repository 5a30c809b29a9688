/**
 * The memory store passes the ObjectStore contract, and its seed helpers do what tests expect.
 */
import { describe, expect, it } from 'vitest';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { proxyFixture, runStoreContract } from '../../support/store-contract.ts';

runStoreContract('memory', async () => ({ store: createMemoryStore(), cleanup: async () => {} }));

describe('memory store seeding', () => {
  it('seeds a proxy with status and a secret from stringData', async () => {
    const store = createMemoryStore();
    const p = store.seedProxy({
      ...proxyFixture('ns', 'a'),
      status: { phase: 'Ready', address: '127.0.0.1' },
    });
    expect(p.status?.phase).toBe('Ready');
    expect(store.proxies.get({ namespace: 'ns', name: 'a' })?.status?.address).toBe('127.0.0.1');
    const s = store.seedSecret({ metadata: { name: 's', namespace: 'ns' }, stringData: { k: 'v' } });
    expect(Buffer.from(s.data?.k ?? '', 'base64').toString()).toBe('v');
  });
});
