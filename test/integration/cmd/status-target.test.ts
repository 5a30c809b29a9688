/**
 * `status --target HOST` as a user runs it: the real CLI against a running standalone operator
 * whose example proxies saw one `blocked` report for a site. The site may be given as a URL in
 * any case; the table says, for that site only, which proxies are leasable and which cool down
 * (and for how long), and the last line sums it up. Without --target the same cooldown shows as
 * one of the proxy's cooldowns.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  runCli,
  startStandalone,
  type Workspace,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 60_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];

let ws: Workspace;
let proc: CliProcess;
let blocked: string;

beforeAll(async () => {
  ws = await createWorkspace();
  proc = startStandalone(ws);
  await waitForReady(ws, proc, NAMES, 60_000);
  const client = clientFor(ws);
  const grant = await client.lease({ target: 'shop.example', ttlSeconds: 60 });
  await client.report(grant.id, { result: 'blocked', cooldownSeconds: 900 });
  blocked = grant.proxy.name;
  // Another site's cooldown, which --target shop.example must leave out.
  const other = await client.lease({ target: 'other.example', ttlSeconds: 60 });
  await client.report(other.id, { result: 'blocked', cooldownSeconds: 900 });
});

afterAll(cleanupCli);

async function status(...args: string[]): Promise<string> {
  const run = await runCli(['status', '--server', ws.discoveryUrl, ...args], ws.dir);
  expect(run.code, `${run.stdout}\n${run.stderr}`).toBe(0);
  return run.stdout;
}

describe('status --target', () => {
  it('shows leasability and cooldowns for that one site, given as a URL in any case', async () => {
    const out = await status('--target', 'https://Shop.Example/some/page?q=1');
    const lines = out.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAMESPACE\s+NAME\s+PHASE\s+.*LEASABLE\s+COOLDOWNS$/);
    // Proxies sharing the blocked one's egress IP share its cooldown (none in this example: three
    // proxies, three addresses), so exactly one proxy cools down for the site.
    const rowOf = (name: string) => lines.find((l) => new RegExp(`^crawl\\s+${name}\\s`).test(l)) ?? '';
    expect(rowOf(blocked)).toMatch(/no \(CoolingDownForTarget\)\s+shop\.example 1[45]m$/);
    for (const name of NAMES.filter((n) => n !== blocked)) expect(rowOf(name)).toMatch(/\byes\s+-$/);
    expect(out).not.toContain('other.example');
    expect(lines.at(-1)).toBe('TARGET shop.example: 2 of 3 leasable now, 1 cooling down for it');
  });

  it('without --target lists every cooldown and no summary line', async () => {
    const out = await status();
    expect(out).toContain('shop.example');
    expect(out).toContain('other.example');
    expect(out).not.toContain('TARGET ');
  });

  it('answers JSON for that site with -o json', async () => {
    const rows = JSON.parse(await status('--target', 'shop.example', '-o', 'json')) as {
      name: string;
      leasable: boolean;
      reason: string | null;
    }[];
    expect(rows.map((r) => [r.name, r.leasable])).toEqual(NAMES.map((n) => [n, n !== blocked]));
    expect(rows.find((r) => r.name === blocked)?.reason).toBe('CoolingDownForTarget');
  });
});
