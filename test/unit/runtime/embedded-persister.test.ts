/**
 * The standalone persister when the state file stops taking writes (full disk, read-only
 * directory): writes still resolve from memory, the failure is logged once and fails readiness,
 * retries back off, and the first rewrite that succeeds carries every change made meanwhile.
 * A journal stand-in fails on demand; the retry timers run on a fake clock.
 */
import { describe, expect, it } from 'vitest';
import type { JournalRecord, PersistedState } from '../../../src/runtime/embedded/journal.ts';
import { Persister } from '../../../src/runtime/embedded/persister.ts';
import { StateWrites } from '../../../src/runtime/embedded/state-writes.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

const enospc = () => Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
const erofs = () => Object.assign(new Error('EROFS: read-only file system, open'), { code: 'EROFS' });

/** A journal that keeps what it was given and fails while `failWith` is set. */
class FakeJournal {
  failWith: (() => Error) | undefined;
  appended: JournalRecord[] = [];
  snapshots: number[] = [];
  attempts = 0;
  /** Holds the next snapshot until released (a write in flight). */
  hold: Promise<void> | undefined;
  records = 0;

  async snapshot(state: PersistedState): Promise<void> {
    this.attempts += 1;
    if (this.hold) await this.hold;
    if (this.failWith) throw this.failWith();
    this.snapshots.push(state.engine.resourceVersion);
    this.records = 0;
  }

  async append(records: JournalRecord[]): Promise<void> {
    this.attempts += 1;
    if (this.failWith) throw this.failWith();
    this.appended.push(...records);
    this.records += records.length;
  }

  async close(): Promise<void> {}
}

function setup() {
  const clock = new FakeClock();
  const captured = captureLog('info');
  const writes = new StateWrites(captured.log, clock);
  const journal = new FakeJournal();
  let rv = 0;
  const persister: Persister = new Persister({
    journal,
    // The "state" is the last resourceVersion recorded: enough to see what a snapshot carried.
    snapshot: () => ({
      state: { engine: { resourceVersion: rv, objects: {} }, manifests: {} },
      seq: persister.sequence,
    }),
    log: captured.log,
    compactAfter: 1000,
    health: writes.writer('state file', '/state/standalone-state.json'),
    clock,
    retryMs: { initial: 500, max: 2000 },
  });
  const write = (): Promise<void> => {
    rv += 1;
    persister.record({ rv, r: 'proxies', k: `p-${rv}`, o: null });
    return persister.durable();
  };
  const errors = () => captured.lines.filter((l) => (l.level as number) >= 50);
  return { clock, captured, writes, journal, persister, write, errors, rv: () => rv };
}

describe('standalone persister on a state file that cannot be written', () => {
  it('answers writes from memory, logs once, fails readiness, backs off, and rewrites everything on recovery', async () => {
    const t = setup();
    await t.write();
    expect(t.journal.appended).toHaveLength(1);
    expect(t.writes.readiness()).toBeUndefined();

    t.journal.failWith = enospc;
    await t.write(); // the failing append still resolves: the change is in memory
    expect(() => t.writes.readiness()).toThrow(
      /state file \/state\/standalone-state\.json cannot be written since .*ENOSPC.*serving from memory, retrying/,
    );
    expect(t.errors()).toHaveLength(1);
    expect(t.errors()[0]).toMatchObject({ writer: 'state file', code: 'ENOSPC' });

    // While failing, writes touch no disk and add no log line.
    const attempts = t.journal.attempts;
    for (let i = 0; i < 20; i++) await t.write();
    expect(t.journal.attempts).toBe(attempts);

    // Retries: a whole snapshot each time, 500 ms then 1 s then capped at 2 s.
    t.clock.advance(499);
    expect(t.journal.attempts).toBe(attempts);
    t.clock.advance(1);
    await until('the first retry', () => t.journal.attempts === attempts + 1);
    t.clock.advance(999);
    await Promise.resolve();
    expect(t.journal.attempts).toBe(attempts + 1);
    t.clock.advance(1);
    await until('the second retry', () => t.journal.attempts === attempts + 2);
    t.clock.advance(2000);
    await until('the third retry', () => t.journal.attempts === attempts + 3);
    t.clock.advance(2000);
    await until('the fourth retry (capped)', () => t.journal.attempts === attempts + 4);
    expect(t.errors()).toHaveLength(1);

    // Another reason is a new state: logged once more.
    t.journal.failWith = erofs;
    t.clock.advance(2000);
    await until('a retry failing with EROFS', () => t.errors().length === 2);
    expect(() => t.writes.readiness()).toThrow(/EROFS/);

    // The disk takes writes again: one snapshot holding every change, readiness back.
    t.journal.failWith = undefined;
    t.clock.advance(2000);
    await until('the recovering snapshot', () => t.journal.snapshots.length === 1);
    expect(t.journal.snapshots).toEqual([t.rv()]);
    expect(t.writes.readiness()).toBeUndefined();
    expect(t.captured.lines.map((l) => l.msg)).toContain(
      'the state file is written again; nothing decided meanwhile was lost',
    );
    await t.write(); // appends again
    expect(t.journal.appended.at(-1)).toMatchObject({ rv: t.rv() });
    expect(t.clock.pendingTimers()).toBe(0);
  });

  it('writes a change made while a recovering snapshot is in flight', async () => {
    const t = setup();
    t.journal.failWith = enospc;
    await t.write();
    t.journal.failWith = undefined;
    let release = () => {};
    t.journal.hold = new Promise<void>((r) => {
      release = r;
    });
    t.clock.advance(500);
    await until('the retry in flight', () => t.journal.attempts === 2);
    await t.write(); // recorded after the snapshot's state was taken
    t.journal.hold = undefined;
    release();
    await until('a second snapshot with the later change', () => t.journal.snapshots.at(-1) === t.rv());
    expect(t.writes.readiness()).toBeUndefined();
  });

  it('says on stop that changes the file could not take are lost', async () => {
    const t = setup();
    t.journal.failWith = erofs;
    await t.write();
    await t.persister.close();
    expect(t.errors().map((l) => l.msg)).toEqual([
      'writing the state file failed; serving from memory and retrying (not ready until it is written)',
      expect.stringMatching(/^stopping with changes the state file could not take: they are lost/),
    ]);
    expect(t.clock.pendingTimers()).toBe(0);
  });
});
