/**
 * End-to-end: the real `standalone` CLI keeps its state lock through the whole shutdown. A
 * second process started while the first is still draining (a request in flight holds the
 * discovery API open) is refused with the lock error; the lock goes only once every port of
 * the first is closed; and what the first wrote last (the final snapshot and lease checkpoint)
 * is what the next start finds.
 */
import { existsSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { afterAll, describe, expect, it, vi } from 'vitest';
import {
  accepts,
  cleanupCli,
  clientFor,
  createWorkspace,
  freePort,
  runCli,
  standaloneArgs,
  startStandalone,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 150_000, hookTimeout: 90_000 });
afterAll(cleanupCli);

const NAMES = ['local-1', 'local-2', 'local-3'];

/** Opens a lease request whose body never finishes: the discovery API cannot close until it does. */
async function requestInFlight(port: number): Promise<net.Socket> {
  const socket = net.connect(port, '127.0.0.1');
  await new Promise<void>((ok, fail) => {
    socket.once('connect', ok);
    socket.once('error', fail);
  });
  socket.on('error', () => {});
  let answer = '';
  socket.setEncoding('utf8').on('data', (chunk: string) => {
    answer += chunk;
  });
  socket.write(
    `POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: 64\r\nExpect: 100-continue\r\n\r\n`,
  );
  // The interim answer says the server parsed the headers: the connection is now busy, not an
  // idle one that a closing server drops at once.
  await until('100 Continue', () => answer.startsWith('HTTP/1.1 100 Continue'), { timeoutMs: 10_000 });
  socket.write('{');
  return socket;
}

describe('standalone CLI: the state lock during shutdown', () => {
  it('refuses a second process while the first drains, and frees the state only after its last write and port', async () => {
    const ws = await createWorkspace();
    const first = startStandalone(ws);
    const ready = await waitForReady(ws, first, NAMES, 60_000);
    const client = clientFor(ws);
    const lease = await client.lease({ target: 'shop.example', ttlSeconds: 3600 });
    const ports = [ws.discoveryPort, ws.healthPort, ...ready.map((p) => p.port as number)];

    const held = await requestInFlight(ws.discoveryPort);
    first.signal('SIGTERM');
    await first.waitForLog((l) => /shutting down gracefully/.test(l.msg), 'the shutdown');

    // Started during the drain, on ports of its own: only the lock can stop it.
    const second = await runCli(
      standaloneArgs(ws, [], { discovery: await freePort(), health: await freePort() }),
      ws.dir,
      30_000,
    );
    expect(first.hasExited).toBe(false);
    expect(second.code).toBe(2);
    expect(second.stderr).toContain(`state is in use by another standalone process (pid ${first.pid})`);

    // The drain ends when the held request does; the lock must outlast every port of the first.
    held.destroy();
    await until('the lock released', () => !existsSync(`${ws.statePath}.lock`), {
      timeoutMs: 30_000,
      intervalMs: 5,
    });
    for (const port of ports)
      expect(await accepts(port, 500), `port ${port} closed before the lock went`).toBe(false);
    const exit = await first.exited;
    expect(exit.code).toBe(0);

    // The final snapshot is one complete line holding the fleet and the installation id.
    const text = readFileSync(ws.statePath, 'utf8');
    expect(text.trimEnd().split('\n')).toHaveLength(1);
    const header = JSON.parse(text) as { installation: string; objects: Record<string, unknown[]> };
    expect(header.installation).toMatch(/^[0-9a-f-]{36}$/);

    // ...and the next start finds what the first left: the same fleet, the lease still held.
    const third = startStandalone(ws);
    const again = await waitForReady(ws, third, NAMES, 60_000);
    expect(again.map((p) => [p.name, p.port])).toEqual(ready.map((p) => [p.name, p.port]));
    await waitFor(
      async () => (await client.listProxies()).find((p) => p.name === lease.proxy.name)?.activeLeases === 1,
      'the lease restored from the final checkpoint',
      20_000,
      third,
    );
    expect((await client.renew(lease.id, 60)).id).toBe(lease.id);
    expect(
      third.logs.some((l) => /installation id is now kept|generated the installation id/.test(l.msg)),
    ).toBe(false);
  });
});
