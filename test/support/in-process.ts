/**
 * test/support/in-process — setup file of the unit tier (vitest.config.ts): a unit test runs in
 * the test process only, so every way node:child_process starts a program throws here, and a
 * file that tried (even where the code under test caught the error) fails when it ends, naming
 * the command. Such a file belongs in test/integration/ or test/e2e/ (docs/testing.md).
 */
import { createRequire, syncBuiltinESMExports } from 'node:module';
import { afterAll } from 'vitest';

const require = createRequire(import.meta.url);
const childProcess = require('node:child_process') as Record<string, unknown>;
const attempts: string[] = [];

for (const name of ['spawn', 'spawnSync', 'exec', 'execSync', 'execFile', 'execFileSync', 'fork']) {
  childProcess[name] = (command: unknown, args: unknown) => {
    const line = [String(command), ...(Array.isArray(args) ? args.map(String) : [])].join(' ');
    attempts.push(`${name}(${line})`);
    throw new Error(
      `unit tier: ${name}(${line}) would start a child process; a test that starts processes belongs in test/integration/ or test/e2e/ (docs/testing.md)`,
    );
  };
}
syncBuiltinESMExports();

afterAll(() => {
  if (attempts.length > 0) {
    throw new Error(
      `unit tier: this file tried to start child processes: ${attempts.join('; ')}; move it to test/integration/ or test/e2e/ (docs/testing.md)`,
    );
  }
});
