/**
 * One kvm host's health verdict from what its libvirt answers, over a stand-in for the host's
 * shared connection: no libvirtd needed.
 */
import { describe, expect, it } from 'vitest';
import { checkHost } from '../../../src/provider/kvm/check.ts';
import { ErrorCode, type LibvirtConnection, PoolState } from '../../../src/provider/kvm/libvirt.ts';
import type { HostPool } from '../../../src/provider/kvm/pool.ts';
import { LibvirtError } from '../../../src/provider/kvm/rpc.ts';
import { SshError } from '../../../src/provider/kvm/ssh.ts';

const host = { name: 'nas1', address: 'nas1.lan:22', user: 'virt', pool: 'vms' };
const GiB = 1024 ** 3;

/** A pool whose probe runs `fn` on a connection answering from `answers`, or fails with `err`. */
function poolWith(answers: Partial<Record<keyof LibvirtConnection, unknown>>, err?: Error): HostPool {
  const conn = Object.fromEntries(
    Object.entries(answers).map(([k, v]) => [k, async () => (v instanceof Error ? Promise.reject(v) : v)]),
  ) as unknown as LibvirtConnection;
  return {
    probe: async <T>(_h: string, _s: AbortSignal, fn: (c: LibvirtConnection) => Promise<T>) => {
      if (err) throw err;
      return fn(conn);
    },
  } as unknown as HostPool;
}

const healthy = {
  getLibVersion: 9_000_000,
  getHostname: 'nas1',
  storagePoolLookupByName: { name: 'vms', uuid: Buffer.alloc(16) },
};

describe('kvm host check', () => {
  it('reports PoolNotActive, not ready, for a pool that exists but is not running', async () => {
    const pool = poolWith({
      ...healthy,
      storagePoolGetInfo: {
        state: PoolState.INACTIVE,
        capacity: 100 * GiB,
        allocation: 0,
        available: 60 * GiB,
      },
    });
    const t = await checkHost(pool, host, new AbortController().signal);
    expect(t).toMatchObject({ name: 'nas1', ready: false, reason: 'PoolNotActive' });
    expect(t.message).toBe('storage pool vms is inactive, not running');
    expect(t.details).toMatchObject({ poolState: 'inactive', hostname: 'nas1', poolAvailable: '60.0GiB' });
  });

  it('is Reachable for a running pool', async () => {
    const pool = poolWith({
      ...healthy,
      storagePoolGetInfo: {
        state: PoolState.RUNNING,
        capacity: 100 * GiB,
        allocation: 0,
        available: 60 * GiB,
      },
    });
    expect(await checkHost(pool, host, new AbortController().signal)).toMatchObject({
      ready: true,
      reason: 'Reachable',
      details: { user: 'virt', pool: 'vms', libvirtVersion: '9.0.0' },
    });
  });

  it.each([
    ['a dial that fails', undefined, new SshError('Unreachable', 'cannot reach nas1.lan:22'), 'Unreachable'],
    [
      'a libvirt error',
      {
        ...healthy,
        storagePoolLookupByName: new LibvirtError({
          code: ErrorCode.NO_STORAGE_POOL,
          domain: 0,
          level: 2,
          message: 'no pool vms',
        }),
      },
      undefined,
      'PoolNotFound',
    ],
  ])('keeps the user and pool in the details of a failing host (%s)', async (_what, answers, err, reason) => {
    const t = await checkHost(poolWith(answers ?? {}, err), host, new AbortController().signal);
    expect(t).toMatchObject({ ready: false, reason });
    expect(t.details).toEqual({ user: 'virt', pool: 'vms' });
  });
});
