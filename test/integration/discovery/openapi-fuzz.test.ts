/**
 * The lease API fuzzed from its own OpenAPI document: schemathesis (PyPI, every package pinned in
 * scripts/ci/schemathesis/requirements.txt, run from the private virtual environment npm test
 * makes with `bash scripts/ci/venv.sh schemathesis`) against the real standalone operator on the bundled
 * example, with the bearer token, through every phase (coverage, fuzzing, stateful) from a fixed
 * seed: no server error (5xx), no response outside the document (a status it does not declare, a
 * body that does not match the declared schema, another content type or headers), no invalid
 * request accepted. Settings: test/support/fixtures/schemathesis.toml. See docs/testing.md.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RUN_MARKER } from '../../../scripts/test/prerequisites.ts';
import { DiscoveryClient } from '../../../src/discovery/client.ts';
import {
  CliProcess,
  cleanupCli,
  createWorkspace,
  REPO_ROOT,
  standaloneArgs,
  type Workspace,
  waitFor,
} from '../../support/cli.ts';
import { privateVenv } from '../../support/python.ts';

// A real operator and a few thousand generated requests on a possibly loaded 2-core machine.
vi.setConfig({ testTimeout: 240_000, hookTimeout: 90_000 });

const TOKEN = 'fuzz-token-0123456789abcdef';
const CONFIG = `${REPO_ROOT}/test/support/fixtures/schemathesis.toml`;
/** Kills schemathesis after this long: a hung run fails the test instead of the tier. */
const RUN_LIMIT_MS = 200_000;

let ws: Workspace;
let proc: CliProcess;

/** The venv's directory; throws with the command that makes it (npm test runs it before the tests). */
function schemathesisVenv(): string {
  return privateVenv('schemathesis');
}

function runSchemathesis(
  venv: string,
  args: string[],
  cwd: string,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(`${venv}/bin/schemathesis`, args, {
      cwd,
      // Nothing of the caller's Python set-up (PYTHONPATH, a version manager) reaches it; the run
      // marker does, so npm test stops it if this worker dies.
      env: {
        PATH: '/usr/bin:/bin',
        HOME: cwd,
        LANG: 'C.UTF-8',
        NO_COLOR: '1',
        PYTHONDONTWRITEBYTECODE: '1',
        ...(process.env[RUN_MARKER] ? { [RUN_MARKER]: process.env[RUN_MARKER] } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const take = (chunk: Buffer) => {
      output += chunk.toString('utf8');
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    const timer = setTimeout(() => {
      output += `\n[test] schemathesis killed after ${RUN_LIMIT_MS} ms`;
      child.kill('SIGKILL');
    }, RUN_LIMIT_MS);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

beforeAll(async () => {
  ws = await createWorkspace();
  proc = new CliProcess(standaloneArgs(ws), ws.dir, { env: { DISCOVERY_TOKEN: TOKEN } });
  const client = new DiscoveryClient({ baseUrl: ws.discoveryUrl, token: TOKEN, timeoutMs: 5_000 });
  // Proxies that lease, so the fuzzer reaches grants, renewals and reports, not only refusals.
  await waitFor(
    async () => {
      const proxies = await client.listProxies().catch(() => []);
      return proxies.length === 3 && proxies.every((p) => p.phase === 'Ready' && p.healthy);
    },
    'the example proxies Ready and healthy',
    60_000,
    proc,
  );
});

afterAll(cleanupCli);

describe('the lease API against its OpenAPI document (schemathesis)', () => {
  it('answers thousands of generated requests without a server error or a response the document does not declare', async () => {
    const venv = schemathesisVenv();
    const started = Date.now();
    const { code, output } = await runSchemathesis(
      venv,
      [
        '--config-file',
        CONFIG,
        'run',
        `${ws.discoveryUrl}/openapi.json`,
        '--header',
        `Authorization: Bearer ${TOKEN}`,
      ],
      ws.dir,
    );
    const seconds = Math.round((Date.now() - started) / 1000);
    process.stderr.write(`[openapi-fuzz] schemathesis took ${seconds} s\n`);
    // The failures section (each with its curl reproduction), or the whole output if there is none.
    const failures = output.includes('FAILURES') ? output.slice(output.indexOf('FAILURES') - 40) : output;
    expect(code, `schemathesis exited ${code}:\n${failures.slice(0, 20_000)}`).toBe(0);
    // It really ran: every phase that has work, and many cases, none of them failing.
    expect(output).toMatch(/✅ {2}Coverage/);
    expect(output).toMatch(/✅ {2}Fuzzing/);
    expect(output).toMatch(/✅ {2}Stateful/);
    const generated = /(\d+) generated, (\d+) passed/.exec(output);
    expect(generated, output.slice(-3_000)).not.toBeNull();
    expect(Number(generated?.[1])).toBeGreaterThan(1_000);
    expect(generated?.[2]).toBe(generated?.[1]);
    // A 500 is logged with its cause; none may have happened, whatever the answers said.
    expect(proc.logs.filter((l) => l.msg === 'discovery handler error')).toEqual([]);
    expect(proc.hasExited).toBe(false);
  });
});
