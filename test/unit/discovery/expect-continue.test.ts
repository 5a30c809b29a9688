/**
 * `Expect: 100-continue` on the lease API: a client is invited to send its body only when its
 * request would pass the token check (or, without a token, the Host check); any other request
 * gets its refusal as the first and only answer, so a client without the token is never asked
 * for a body. Raw sockets, so the bytes on the wire are what is asserted.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { rawClient } from '../../support/gateway/local-world.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'continue-token-0123456789';
const BODY = '{"target":"shop.example"}';

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function start(token: string | undefined): Promise<DiscoveryServer> {
  const leases = new LeaseStore({ clock: new FakeClock(Date.now()) });
  leases.upsertProxy(proxyInfo('a', { host: '127.0.0.1', credentials: { username: 'u', password: 'p' } }));
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry: new Registry(),
    ...(token === undefined ? {} : { token }),
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return server;
}

function grantHead(port: number, headers: string[]): string {
  return [
    'POST /v1/leases HTTP/1.1',
    ...headers,
    'Content-Type: application/json',
    `Content-Length: ${BODY.length}`,
    'Expect: 100-continue',
    '',
    '',
  ]
    .join('\r\n')
    .replace('{port}', String(port));
}

describe('lease API: Expect: 100-continue', () => {
  const refusals: [string, string | undefined, string[], number][] = [
    ['no token', TOKEN, ['Host: 127.0.0.1:{port}'], 401],
    ['a wrong token', TOKEN, ['Host: 127.0.0.1:{port}', 'Authorization: Bearer wrong'], 401],
    ['no token configured and a foreign Host', undefined, ['Host: evil.example'], 403],
  ];
  for (const [what, token, headers, status] of refusals) {
    it(`${what}: answered ${status} without 100 Continue`, async () => {
      const server = await start(token);
      const port = Number(new URL(server.url).port);
      const c = await rawClient(port);
      c.write(grantHead(port, headers));
      const head = await c.waitFor('\r\n\r\n');
      expect(head).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(head).not.toContain('100 Continue');
      c.socket.destroy();
    });
  }

  for (const [what, token, headers] of [
    ['the right token', TOKEN, ['Host: 127.0.0.1:{port}', `Authorization: Bearer ${TOKEN}`]],
    ['no token configured and a loopback Host', undefined, ['Host: 127.0.0.1:{port}']],
  ] as const) {
    it(`${what}: 100 Continue first, then the body is read and the lease granted`, async () => {
      const server = await start(token);
      const port = Number(new URL(server.url).port);
      const c = await rawClient(port);
      c.write(grantHead(port, [...headers]));
      await c.waitFor('\r\n\r\n');
      expect(c.received()).toBe('HTTP/1.1 100 Continue\r\n\r\n');
      c.write(BODY);
      const all = await c.waitFor('"expiresAt"');
      expect(all.slice('HTTP/1.1 100 Continue\r\n\r\n'.length)).toMatch(/^HTTP\/1\.1 201 /);
      c.socket.destroy();
    });
  }
});
