/**
 * The lease checkpoint when its file cannot be written: FileCheckpoint reports each save to the
 * state-writes tracker (readiness fails naming the file, recovers on the next good save, no
 * temporary file left behind), and the checkpointer logs a failing save once per outage, not
 * every interval.
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseCheckpointer } from '../../../src/lease/checkpoint.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FileCheckpoint } from '../../../src/runtime/embedded/lease-checkpoint.ts';
import { StateWrites } from '../../../src/runtime/embedded/state-writes.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe('lease checkpoint on a state directory that takes no writes', () => {
  it('fails readiness naming the file while saves fail, logs once, and recovers on the next save', async () => {
    const root = mkdtempSync(join(tmpdir(), 'checkpoint-writes-'));
    dirs.push(root);
    const dir = join(root, 'missing'); // saves fail (ENOENT) until it exists
    const path = join(dir, 'state.json.leases');
    const captured = captureLog('info');
    const clock = new FakeClock();
    const writes = new StateWrites(captured.log, clock);
    const checkpointer = new LeaseCheckpointer({
      leases: new LeaseStore(),
      storage: new FileCheckpoint(path, writes.writer('lease checkpoint', path)),
      clock,
      log: captured.log,
    });
    const signal = new AbortController().signal;

    for (let i = 0; i < 3; i++) expect(await checkpointer.save(signal)).toBe(false);
    expect(() => writes.readiness()).toThrow(`lease checkpoint ${path} cannot be written since`);
    expect(writes.failingCount).toBe(1);
    const msgs = () => captured.lines.map((l) => l.msg);
    expect(msgs().filter((m) => /lease checkpoint failed/.test(String(m)))).toHaveLength(2); // tracker + checkpointer

    mkdirSync(dir);
    expect(await checkpointer.save(signal)).toBe(true);
    expect(writes.readiness()).toBeUndefined();
    expect(msgs()).toContain('lease checkpoint saved again');
    expect(msgs()).toContain('the lease checkpoint is written again; nothing decided meanwhile was lost');
    expect(readdirSync(dir)).toEqual(['state.json.leases']);
  });
});
