/**
 * The real `standalone` CLI started under a low open-files limit (a shell's `ulimit -n 1024`, as
 * many supervisors give): it reads the limit it really has, fits every connection cap under it,
 * says so in one warning, lowers a cap flag asked above it with a warning naming the flag, and
 * serves.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  CliProcess,
  cleanupCli,
  createWorkspace,
  MAIN,
  NODE,
  standaloneArgs,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 60_000 });
afterEach(cleanupCli);

describe('standalone under a low open-files limit', () => {
  it('warns once naming the limit and the caps, lowers the flag, and serves', async () => {
    const ws = await createWorkspace();
    const proc = new CliProcess(standaloneArgs(ws, ['--gateway-max-connections', '5000']), ws.dir, {
      // dash's `ulimit -n` sets the soft and the hard limit: Node cannot raise it back.
      command: ['sh', '-c', 'ulimit -n 1024 && exec "$0" "$@"', NODE, MAIN],
    });
    await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3']);
    const low = proc.logs.filter((l) => String(l.msg).startsWith('open-files limit'));
    expect(low).toHaveLength(1);
    expect(low[0]).toMatchObject({ level: 40, fdLimit: '1024', fdLimitSource: '/proc/self/limits' });
    const caps = low[0]?.caps as { gateway: number; discovery: number; localProxies: number; probes: number };
    expect(caps.gateway).toBeLessThan(384);
    expect(caps.gateway * 2 + caps.discovery + caps.localProxies * 2 + caps.probes).toBeLessThanOrEqual(
      1024 - 256,
    );
    const flag = proc.logs.find((l) => l.flag === '--gateway-max-connections');
    expect(flag).toMatchObject({ level: 40, requested: 5000, cap: caps.gateway });
  });
});
