/**
 * What restoring the lease checkpoint decides (src/lease/checkpoint.ts): a good one is
 * restored; none starts empty; a store that cannot be read is an ordinary error (retried by the
 * caller); a damaged document is refused with LeaseCheckpointDamagedError naming it and left
 * untouched, or with `discard` kept aside, warned about and replaced by an empty start.
 */
import { describe, expect, it } from 'vitest';
import { asideStamp, type CheckpointStorage, LeaseCheckpointer } from '../../../src/lease/checkpoint.ts';
import { LeaseCheckpointDamagedError, LeaseStateError } from '../../../src/lease/errors.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';
import { captureLog } from '../../support/log.ts';

class MemoryStorage implements CheckpointStorage {
  readonly where = '/state/operator.state.leases';
  text: string | undefined;
  aside: Array<{ at: number; text: string | undefined }> = [];
  failLoad: Error | undefined;
  async load(): Promise<string | undefined> {
    if (this.failLoad) throw this.failLoad;
    return this.text;
  }
  async save(text: string): Promise<void> {
    this.text = text;
  }
  async setAside(at: number): Promise<string> {
    this.aside.push({ at, text: this.text });
    this.text = undefined;
    return `${this.where}.damaged-${asideStamp(at)}`;
  }
}

const signal = new AbortController().signal;

function setup() {
  const clock = new FakeClock(Date.parse('2026-01-02T03:04:05Z'));
  const leases = new LeaseStore({ clock });
  leases.upsertProxy(proxyInfo('p1'));
  const storage = new MemoryStorage();
  const logged = captureLog();
  const checkpointer = new LeaseCheckpointer({ leases, storage, clock, log: logged.log });
  return { clock, leases, storage, logged, checkpointer };
}

/** A checkpoint holding a 3600 s global cooldown on p1. */
async function goodCheckpoint(): Promise<string> {
  const { leases, storage, checkpointer } = setup();
  const out = leases.lease({});
  if (!out.granted) throw new Error('expected a grant');
  leases.report(out.grant.id, { result: 'failed', cooldownSeconds: 3600 });
  await checkpointer.save(signal);
  leases.close();
  return storage.text as string;
}

describe('restoring the lease checkpoint', () => {
  it('restores a good one, and starts empty when there is none', async () => {
    const text = await goodCheckpoint();
    const a = setup();
    a.storage.text = text;
    expect(await a.checkpointer.restore(signal)).toEqual({ leases: 0, proxies: 1 });
    expect(a.leases.snapshot()[0]?.reason).toBe('CoolingDown');
    const b = setup();
    expect(await b.checkpointer.restore(signal)).toEqual({ leases: 0, proxies: 0 });
    for (const s of [a, b]) s.leases.close();
  });

  it('passes on a store that cannot be read now, for the caller to retry', async () => {
    const { storage, checkpointer, leases } = setup();
    storage.failLoad = new Error('connect ECONNREFUSED');
    await expect(checkpointer.restore(signal, { discard: true })).rejects.toThrow('ECONNREFUSED');
    expect(storage.aside).toEqual([]);
    leases.close();
  });

  it('refuses a damaged document naming it, and leaves it as it is', async () => {
    const damaged = `${await goodCheckpoint()}x`;
    const { storage, checkpointer, leases } = setup();
    storage.text = damaged;
    const err = await checkpointer.restore(signal).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LeaseCheckpointDamagedError);
    expect((err as Error).message).toMatch(
      /^lease checkpoint \/state\/operator\.state\.leases is damaged \(not valid JSON\); it is left as it is\. .*--discard-lease-state/,
    );
    expect((err as Error).cause).toBeInstanceOf(LeaseStateError);
    expect(storage.text).toBe(damaged);
    expect(storage.aside).toEqual([]);
    leases.close();
  });

  it('refuses damage the storage itself finds (torn shards) the same way', async () => {
    const { storage, checkpointer, leases } = setup();
    storage.load = async () => {
      throw new LeaseStateError('no set of shards is whole');
    };
    await expect(checkpointer.restore(signal)).rejects.toThrow(/is damaged \(no set of shards is whole\)/);
    leases.close();
  });

  it('with discard keeps the damaged copy aside, warns naming both places, and starts empty', async () => {
    const damaged = `${await goodCheckpoint()}x`;
    const { storage, checkpointer, leases, logged, clock } = setup();
    storage.text = damaged;
    expect(await checkpointer.restore(signal, { discard: true })).toEqual({ leases: 0, proxies: 0 });
    expect(storage.aside).toEqual([{ at: clock.now(), text: damaged }]);
    expect(leases.snapshot()[0]?.reason).toBeNull();
    const warn = logged.lines.find((l) => l.level === 40);
    expect(warn).toMatchObject({
      where: storage.where,
      keptAt: `${storage.where}.damaged-20260102t030405z`,
      damage: 'lease checkpoint: not valid JSON',
    });
    expect(String(warn?.msg)).toMatch(/--discard-lease-state: starting with NO leases or cooldowns/);
    leases.close();
  });
});
