import { describe, expect, it } from 'vitest';
import { retryOnConflict } from '../../../src/runtime/retry.ts';
import { StoreError } from '../../../src/runtime/store.ts';

const conflict = () => new StoreError('Conflict', 409, 'the object has been modified');

describe('retryOnConflict', () => {
  it('re-reads after a Conflict and writes the fresh object', async () => {
    const seen: number[] = [];
    const result = await retryOnConflict(
      1,
      async (v) => {
        seen.push(v);
        if (v < 3) throw conflict();
        return `wrote ${v}`;
      },
      async () => seen.length + 1,
    );
    expect(result).toBe('wrote 3');
    expect(seen).toEqual([1, 2, 3]);
  });

  it('gives the last Conflict back after the allowed writes', async () => {
    let writes = 0;
    const run = retryOnConflict(
      0,
      async () => {
        writes++;
        throw conflict();
      },
      async () => 0,
      { attempts: 3 },
    );
    await expect(run).rejects.toMatchObject({ reason: 'Conflict' });
    expect(writes).toBe(3);
  });

  it('throws any other error at once, without re-reading', async () => {
    let rereads = 0;
    const run = retryOnConflict(
      0,
      async () => {
        throw new StoreError('NotFound', 404, 'gone');
      },
      async () => {
        rereads++;
        return 0;
      },
    );
    await expect(run).rejects.toMatchObject({ reason: 'NotFound' });
    expect(rereads).toBe(0);
  });
});
