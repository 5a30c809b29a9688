/**
 * `Expect: 100-continue` through the gateway: a client is invited to upload its body only once
 * its request is authenticated, allowed by the egress policy and has an upstream; every refusal
 * (407, 403, 503) is the first and only answer it gets, so an anonymous client is never asked
 * for a body. Raw sockets, so the bytes on the wire are what is asserted.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { basic, type LocalWorld, rawClient, startLocalWorld } from '../../support/gateway/local-world.ts';

let w: LocalWorld | undefined;
afterEach(async () => {
  await w?.close();
  w = undefined;
});

const BODY = 'hello world';

/** An upload through the gateway that waits for 100 Continue; `auth` is the Proxy-Authorization value. */
function uploadHead(target: string, auth: string | undefined): string {
  return [
    `POST ${target} HTTP/1.1`,
    `Host: ${new URL(target).host}`,
    ...(auth === undefined ? [] : [`Proxy-Authorization: ${auth}`]),
    'Content-Type: text/plain',
    `Content-Length: ${BODY.length}`,
    'Expect: 100-continue',
    '',
    '',
  ].join('\r\n');
}

describe('gateway: Expect: 100-continue', () => {
  const refusals: [string, (w: LocalWorld) => [string, string | undefined], number][] = [
    ['no credentials', (w) => [`http://127.0.0.1:${w.httpPort}/up`, undefined], 407],
    ['a wrong password', (w) => [`http://127.0.0.1:${w.httpPort}/up`, basic('crawler', 'wrong')], 407],
    ['a bad user name', (w) => [`http://127.0.0.1:${w.httpPort}/up`, basic('crawler-color-red')], 407],
    ['a destination the policy refuses', () => ['http://127.0.0.1:1/up', basic('crawler')], 403],
    [
      'no upstream to carry it',
      (w) => [`http://127.0.0.1:${w.httpPort}/up`, basic('crawler-pool-none')],
      503,
    ],
  ];
  for (const [what, request, status] of refusals) {
    it(`${what}: answered ${status} without 100 Continue, the body never asked for`, async () => {
      w = await startLocalWorld();
      const [target, auth] = request(w);
      const c = await rawClient(w.gateway.port);
      c.write(uploadHead(target, auth));
      // The refusal closes the connection; the client never sent its body.
      await c.closed;
      expect(c.received()).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(c.received()).not.toContain('100 Continue');
      expect(w.originRequests()).toBe(0);
    });
  }

  it('authenticated and allowed: 100 Continue first, then the body reaches the origin', async () => {
    w = await startLocalWorld();
    const c = await rawClient(w.gateway.port);
    c.write(uploadHead(`http://127.0.0.1:${w.httpPort}/up`, basic('crawler')));
    await c.waitFor('\r\n\r\n');
    expect(c.received()).toBe('HTTP/1.1 100 Continue\r\n\r\n');
    c.write(BODY);
    const all = await c.waitFor(`got ${BODY.length} bytes`);
    expect(all.slice('HTTP/1.1 100 Continue\r\n\r\n'.length)).toMatch(/^HTTP\/1\.1 200 /);
    expect(all).toMatch(/X-Egress-Proxy: crawl\/up\d/i);
    c.socket.destroy();
  });
});
