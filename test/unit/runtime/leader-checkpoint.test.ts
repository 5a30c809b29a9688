/**
 * The cluster home of the lease checkpoint, against the Kubernetes REST test server over real
 * client-node: a checkpoint larger than one shard is split over several ConfigMaps and read
 * back whole; saves alternate between two sets, so a save cut short (one shard of the newer set
 * left at an older generation) falls back to the previous complete checkpoint; a write racing
 * another leader's fails instead of overwriting it; sets of which none is whole are a damaged
 * checkpoint, kept aside by copying every shard before the originals are emptied.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseStateError } from '../../../src/lease/errors.ts';
import { createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import { ConfigMapCheckpoint } from '../../../src/runtime/leader/checkpoint-configmaps.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';

const NS = 'operator-system';
let server: KubeServer | undefined;
let clients: KubeClients | undefined;

afterEach(async () => {
  await clients?.close();
  await server?.stop();
  server = undefined;
  clients = undefined;
});

async function storage(shardChars: number): Promise<ConfigMapCheckpoint> {
  server ??= await startKubeServer();
  clients ??= await createKubeClients(server.kubeConfig());
  return new ConfigMapCheckpoint({ core: clients.core, namespace: NS, shardChars });
}

const signal = new AbortController().signal;
const names = () =>
  (server as KubeServer)
    .resource('configmaps')
    .list({ namespace: NS })
    .items.map((c) => c.metadata.name)
    .sort();

describe('ConfigMap lease checkpoint', () => {
  it('shards a large checkpoint, alternates sets, and reads the newest whole one back', async () => {
    const a = await storage(10);
    expect(await a.load(signal)).toBeUndefined();
    const first = 'x'.repeat(25);
    await a.save(first, signal);
    expect(names()).toEqual([
      'egress-proxies-operator-leases-a-0',
      'egress-proxies-operator-leases-a-1',
      'egress-proxies-operator-leases-a-2',
    ]);
    const second = `{"second":"${'y'.repeat(30)}"}`;
    await a.save(second, signal);
    expect(names().filter((n) => n.includes('-b-'))).toHaveLength(5);
    // A new leader (a fresh storage object) reads the newest checkpoint.
    const b = new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS, shardChars: 10 });
    expect(await b.load(signal)).toBe(second);
    // …and its next save goes to the other set, leaving the newest one intact.
    await b.save('third', signal);
    expect(
      await new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS }).load(signal),
    ).toBe('third');
  });

  it('falls back to the previous set when a save was cut short', async () => {
    const a = await storage(10);
    await a.save('first-checkpoint-text', signal);
    await a.save('second-checkpoint-text', signal);
    // A crash after writing shard 0 of a third save to set "a" but before its shard 1.
    const cms = (server as KubeServer).resource('configmaps');
    const head = cms.read(NS, 'egress-proxies-operator-leases-a-0');
    const annotations = {
      ...(head.metadata.annotations ?? {}),
      'crawl.example.com/checkpoint-generation': '3',
    };
    cms.update({
      ...head,
      metadata: { ...head.metadata, annotations },
      data: { chunk: 'third-chec' },
    } as never);
    const b = new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS, shardChars: 10 });
    expect(await b.load(signal)).toBe('second-checkpoint-text');
  });

  it('fails a save that races another writer instead of overwriting it', async () => {
    const a = await storage(100);
    await a.save('one', signal);
    await a.save('two', signal);
    const other = new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS });
    expect(await other.load(signal)).toBe('two');
    await other.save('from the new leader', signal); // set "a", generation 3
    await a.save('stale leader', signal).catch(() => {}); // set "a" too (its own generation 3)
    const check = new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS });
    expect(await check.load(signal)).toBe('from the new leader');
  });

  it('calls sets of which none is whole damaged, and keeps every shard aside before emptying it', async () => {
    const a = await storage(10);
    await a.save('first-checkpoint-text', signal);
    await a.save('second-checkpoint-text', signal);
    const cms = (server as KubeServer).resource('configmaps');
    for (const name of ['egress-proxies-operator-leases-a-1', 'egress-proxies-operator-leases-b-1']) {
      const cm = cms.read(NS, name);
      const annotations = {
        ...(cm.metadata.annotations ?? {}),
        'crawl.example.com/checkpoint-generation': '9',
      };
      cms.update({ ...cm, metadata: { ...cm.metadata, annotations } } as never);
    }
    const b = new ConfigMapCheckpoint({ core: (clients as KubeClients).core, namespace: NS, shardChars: 10 });
    await expect(b.load(signal)).rejects.toThrow(LeaseStateError);
    await expect(b.load(signal)).rejects.toThrow(/no set of shards is whole in configmaps operator-system/);
    const before = names();
    const original = cms.read(NS, 'egress-proxies-operator-leases-b-1');
    const where = await b.setAside(Date.parse('2026-01-02T03:04:05Z'), signal);
    expect(where).toBe(
      'configmaps operator-system/egress-proxies-operator-leases-damaged-20260102t030405z-{a,b}-N',
    );
    const kept = names().filter((n) => n.includes('damaged'));
    expect(kept).toEqual(before.map((n) => n.replace('leases-', 'leases-damaged-20260102t030405z-')).sort());
    // The originals stay, emptied (the Role grants no delete): generation 0, no text.
    for (const n of before) {
      const emptied = cms.read(NS, n);
      expect(emptied.data).toEqual({ chunk: '' });
      expect(emptied.metadata.annotations?.['crawl.example.com/checkpoint-generation']).toBe('0');
    }
    const copy = cms.read(NS, 'egress-proxies-operator-leases-damaged-20260102t030405z-b-1');
    expect(copy.data).toEqual(original.data);
    expect(copy.metadata.annotations).toEqual(original.metadata.annotations);
    // Nothing left to load; the next save starts afresh and never touches the copies.
    expect(await b.load(signal)).toBeUndefined();
    await b.save('fresh', signal);
    expect(await b.load(signal)).toBe('fresh');
    expect(names().filter((n) => n.includes('damaged'))).toEqual(kept);
  });
});
