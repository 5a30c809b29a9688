/**
 * The Python package's own unit tests (clients/python/tests), run with Debian's python3 as part
 * of the suite: a failing Python test fails `npm test`.
 */
import { describe, expect, it } from 'vitest';
import { PYTHON_CLIENT, requirePython, runPython } from '../support/python.ts';

describe('clients/python unit tests', () => {
  it('pass under python3 -m unittest', async () => {
    requirePython();
    const run = await runPython(['-m', 'unittest', 'discover', '-s', 'tests', '-t', '.'], {
      cwd: PYTHON_CLIENT,
    });
    expect(run.code, run.output).toBe(0);
    expect(run.output).toMatch(/Ran [1-9]\d* tests/);
  }, 60_000);
});
