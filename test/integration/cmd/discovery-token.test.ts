/**
 * DISCOVERY_TOKEN at start-up, through the real composition root: a blank value (spaces, a
 * newline-only Secret, empty) is an error naming the variable before anything starts, never
 * an open API; a token with a trailing newline (a Secret created from a file) is trimmed and
 * then required by the running API.
 */
import { existsSync } from 'node:fs';
import { trace } from '@opentelemetry/api';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { StartupError } from '../../../src/cmd/startup.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { cleanupCli, createWorkspace, standaloneArgs } from '../../support/cli.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 60_000 });
afterEach(cleanupCli);

const tracing = () => ({ tracer: trace.getTracer('test'), enabled: false, shutdown: async () => {} });

async function build(token: string) {
  const ws = await createWorkspace();
  const parsed = parseCommandLine(standaloneArgs(ws));
  if (parsed.command !== 'standalone') throw new Error('not standalone');
  const app = buildApp(parsed, {
    log: silentLogger(),
    env: { DISCOVERY_TOKEN: token },
    deps: { setupTracing: tracing },
  });
  return { ws, app };
}

describe('DISCOVERY_TOKEN', () => {
  it.each([
    ['spaces', '   '],
    ['a newline-only Secret value', '\n'],
    ['CRLF and tabs', '\t\r\n'],
    ['empty', ''],
  ])('%s: refused at start-up, naming the variable, before the state is touched', async (_, token) => {
    const { ws, app } = await build(token);
    const err = await app.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toMatch(/^DISCOVERY_TOKEN is set but (blank|empty)/);
    expect(existsSync(ws.statePath)).toBe(false);
  });

  it('a token ending in a newline is trimmed and required', async () => {
    const { ws, app: pending } = await build('s3cret-token\n');
    const app = await pending;
    const running = app.run();
    try {
      const url = await until('the discovery API', () => app.discoveryUrl(), { timeoutMs: 20_000 });
      expect(url).toBe(ws.discoveryUrl);
      expect((await fetch(`${url}/v1/proxies`)).status).toBe(401);
      const ok = await fetch(`${url}/v1/proxies`, { headers: { authorization: 'Bearer s3cret-token' } });
      expect(ok.status).toBe(200);
    } finally {
      await app.stop();
      await running.catch(() => undefined);
    }
  });
});
