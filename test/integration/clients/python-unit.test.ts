/**
 * The Python package's own unit tests (clients/python/tests), run with Debian's python3 as part
 * of the suite: a failing Python test fails `npm test`. The middleware's tests import Scrapy and
 * Twisted (python3-scrapy): missing, the test fails naming the fix rather than skipping them.
 */
import { describe, expect, it } from 'vitest';
import { PYTHON_CLIENT, requirePython, runPython } from '../../support/python.ts';

describe('clients/python unit tests', () => {
  it('pass under python3 -m unittest', async () => {
    requirePython(['scrapy', 'twisted']);
    const run = await runPython(['-m', 'unittest', 'discover', '-s', 'tests', '-t', '.'], {
      cwd: PYTHON_CLIENT,
    });
    expect(run.code, run.output).toBe(0);
    expect(run.output).toMatch(/Ran [1-9]\d* tests/);
    expect(run.output).not.toMatch(/skipped/);
  }, 60_000);
});
