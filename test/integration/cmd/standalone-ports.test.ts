/**
 * End-to-end: the real `standalone` CLI on ports other than the defaults. The example's health
 * checks name no port (`operator.invalid`), so its proxies become Ready and healthy on whatever
 * --discovery-bind-address says; a second copy that moved only some of its ports stops at the
 * first listener it cannot bind, with one line naming that address and the flag to change.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  type CliProcess,
  cleanupCli,
  createWorkspace,
  freePort,
  runCli,
  standaloneArgs,
  startStandalone,
  type Workspace,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });

describe('standalone CLI: listeners on other ports', () => {
  let first: Workspace;
  let running: CliProcess;
  let gatewayPort: number;

  beforeAll(async () => {
    first = await createWorkspace();
    gatewayPort = await freePort();
    running = startStandalone(first, ['--gateway-bind-address', `127.0.0.1:${gatewayPort}`]);
    await waitForReady(first, running, ['local-1', 'local-2', 'local-3'], 60_000);
  });
  // One copy serves the whole file; cleanupCli stops it and removes the workspaces.
  afterAll(cleanupCli);

  it('health-checks the example against the API wherever --discovery-bind-address put it', () => {
    // Ready and healthy above, with the API on a port that is not 8090 and manifests as shipped.
    expect(first.discoveryPort).not.toBe(8090);
    for (const f of readdirSync(first.proxiesDir)) {
      const text = readFileSync(join(first.proxiesDir, f), 'utf8');
      expect(text).toContain('url: http://operator.invalid/generate_204');
      expect(text).not.toMatch(/url: \S*127\.0\.0\.1/);
    }
  });

  for (const [flag, ports] of [
    [
      '--discovery-bind-address',
      (ws: Workspace) => ({ discovery: first.discoveryPort, health: ws.healthPort }),
    ],
    [
      '--health-probe-bind-address',
      (ws: Workspace) => ({ discovery: ws.discoveryPort, health: first.healthPort }),
    ],
  ] as const) {
    it(`a second copy that kept the first one's port names ${flag}`, async () => {
      const second = await createWorkspace();
      const res = await runCli(standaloneArgs(second, [], ports(second)), second.dir);
      expect(res.code).not.toBe(0);
      const port = flag === '--discovery-bind-address' ? first.discoveryPort : first.healthPort;
      expect(res.stderr).toContain(`127.0.0.1:${port} is already in use`);
      expect(res.stderr).toMatch(new RegExp(`choose another address with ${flag}\\n`));
    });
  }

  it("a second copy that kept the first one's gateway port names --gateway-bind-address", async () => {
    const second = await createWorkspace();
    const res = await runCli(
      standaloneArgs(second, ['--gateway-bind-address', `127.0.0.1:${gatewayPort}`]),
      second.dir,
    );
    expect(res.code).not.toBe(0);
    expect(res.stderr).toContain(
      `egress-proxies-operator: gateway cannot listen: 127.0.0.1:${gatewayPort} is already in use (another copy of the operator, or another program?); choose another address with --gateway-bind-address`,
    );
  });
});
