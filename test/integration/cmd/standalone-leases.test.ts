/**
 * End-to-end: the real `standalone` CLI keeps its lease decisions across restarts — a 24 h
 * `blocked` cooldown, a 50 min `failed` cooldown and a live lease are all back after SIGTERM and
 * start (nothing lost), and after kill -9 and start (at most one checkpoint interval lost; the
 * test waits until the checkpoint holds the decisions before killing).
 */
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { DiscoveryClient, LeaseGrant } from '../../../src/discovery/client.ts';
import {
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  httpViaProxy,
  startStandalone,
  type Workspace,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { startHttpOrigin } from '../../support/origins.ts';

vi.setConfig({ testTimeout: 150_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];
const ARGS = ['--lease-checkpoint-interval', '300ms'];

afterEach(cleanupCli);

interface Decisions {
  blocked: LeaseGrant;
  failed: LeaseGrant;
  live: LeaseGrant;
}

/** Three leases for one site: one reported blocked (24 h), one failed (50 min), one kept. */
async function decide(client: DiscoveryClient): Promise<Decisions> {
  const blocked = await client.lease({ target: 'shop.example', ttlSeconds: 600 });
  const failed = await client.lease({ target: 'shop.example', ttlSeconds: 600 });
  const live = await client.lease({ target: 'shop.example', ttlSeconds: 3600 });
  expect(new Set([blocked.proxy.name, failed.proxy.name, live.proxy.name]).size).toBe(3);
  await client.report(blocked.id, { result: 'blocked', cooldownSeconds: 86_400 });
  await client.report(failed.id, { result: 'failed', cooldownSeconds: 3000 });
  return { blocked, failed, live };
}

/** After the restart: both cooldowns hold, the live lease renews, and a late report still counts. */
async function expectRemembered(
  ws: Workspace,
  proc: CliProcess,
  d: Decisions,
  origin: string,
): Promise<void> {
  const client = clientFor(ws);
  const snap = await waitFor(
    async () => {
      const s = await client.listProxies({ target: 'shop.example' });
      return s.length === NAMES.length && s.every((p) => p.phase === 'Ready') && s;
    },
    'proxies listed after the restart',
    40_000,
    proc,
  );
  const by = Object.fromEntries(snap.map((p) => [p.name, p]));
  expect(by[d.blocked.proxy.name]?.targetCooldowns.map((t) => t.target)).toEqual(['shop.example']);
  expect(Date.parse(by[d.blocked.proxy.name]?.targetCooldowns[0]?.until ?? '')).toBeGreaterThan(
    Date.now() + 23 * 3600_000,
  );
  expect(Date.parse(by[d.failed.proxy.name]?.cooldownUntil ?? '')).toBeGreaterThan(Date.now() + 40 * 60_000);
  expect(by[d.live.proxy.name]?.activeLeases).toBe(1);
  const renewed = await client.renew(d.live.id, 60);
  expect(renewed.id).toBe(d.live.id);
  // The blocked lease was released before the restart and is still reportable.
  expect((await client.report(d.blocked.id, { result: 'blocked' })).id).toBe(d.blocked.id);
  // Local proxies check credentials per lease: the live lease's still open its proxy (once the
  // instance is back), the released lease's get 407.
  const at = (g: LeaseGrant, port: number) => g.proxy.url.replace(/@.*$/, `@127.0.0.1:${port}`);
  const livePort = by[d.live.proxy.name]?.port as number;
  await waitFor(
    async () =>
      (await httpViaProxy(at(d.live, livePort), `${origin}/status/200`, true).catch(() => undefined))
        ?.status === 200,
    'the live lease to tunnel after the restart',
    30_000,
    proc,
  );
  const blockedPort = by[d.blocked.proxy.name]?.port as number;
  expect((await httpViaProxy(at(d.blocked, blockedPort), `${origin}/status/200`, true)).status).toBe(407);
}

describe('standalone CLI: lease state across restarts', () => {
  it('SIGTERM then start: cooldowns and live leases are back', async () => {
    const origin = await startHttpOrigin();
    onTestFinished(() => origin.close());
    const ws = await createWorkspace({ openPorts: [origin.port] });
    const first = startStandalone(ws, ARGS);
    await waitForReady(ws, first, NAMES, 40_000);
    const d = await decide(clientFor(ws));
    first.signal('SIGTERM');
    const exit = await waitFor(() => first.hasExited && first.exited, 'exit after SIGTERM', 30_000);
    expect(exit.code).toBe(0);

    const second = startStandalone(ws, ARGS);
    await expectRemembered(ws, second, d, origin.baseUrl);
  });

  it('kill -9 then start: what was checkpointed is back', async () => {
    const origin = await startHttpOrigin();
    onTestFinished(() => origin.close());
    const ws = await createWorkspace({ openPorts: [origin.port] });
    const first = startStandalone(ws, ARGS);
    await waitForReady(ws, first, NAMES, 40_000);
    const d = await decide(clientFor(ws));
    const checkpoint = `${ws.statePath}.leases`;
    await waitFor(
      () => {
        try {
          const text = readFileSync(checkpoint, 'utf8');
          if (text.includes(new URL(d.live.proxy.url).password))
            throw new Error('a lease password in the checkpoint');
          return text.includes(d.live.id) && text.includes('shop.example') && text.includes(d.blocked.id);
        } catch {
          return false;
        }
      },
      'the checkpoint to hold the decisions',
      10_000,
      first,
    );
    const killed = await first.killHard();
    expect(killed.signal).toBe('SIGKILL');

    const second = startStandalone(ws, ARGS);
    await expectRemembered(ws, second, d, origin.baseUrl);
  });
});
