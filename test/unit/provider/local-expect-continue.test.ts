/**
 * `Expect: 100-continue` through a local proxy: a client is invited to upload its body only once
 * its request is authenticated and allowed by the egress policy; a refusal (407, 403) is the
 * first and only answer, so a client without credentials is never asked for a body. Raw
 * sockets, so the bytes on the wire are what is asserted.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { basic, rawClient } from '../../support/gateway/local-world.ts';

const BODY = 'hello world';
const creds = { username: 'u', password: 'p' };

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

/** A local proxy that may reach the origin's port on loopback, and the origin counting bodies. */
async function start(): Promise<{ proxy: ForwardProxy; originPort: number; uploads: () => number }> {
  let uploads = 0;
  const origin = http.createServer((req, res) => {
    let n = 0;
    req.on('data', (d: Buffer) => {
      n += d.length;
    });
    req.on('end', () => {
      uploads++;
      res.end(`got ${n} bytes`);
    });
  });
  await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
  closers.push(() => new Promise<void>((r) => origin.close(() => r())));
  const originPort = (origin.address() as AddressInfo).port;
  const proxy = new ForwardProxy({
    credentials: creds,
    log: silentLogger(),
    egress: new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [originPort] }),
    ),
  });
  await proxy.listen(0, '127.0.0.1');
  closers.push(() => proxy.close());
  return { proxy, originPort, uploads: () => uploads };
}

function uploadHead(target: string, auth: string | undefined): string {
  return [
    `POST ${target} HTTP/1.1`,
    `Host: ${new URL(target).host}`,
    ...(auth === undefined ? [] : [`Proxy-Authorization: ${auth}`]),
    `Content-Length: ${BODY.length}`,
    'Expect: 100-continue',
    '',
    '',
  ].join('\r\n');
}

describe('local proxy: Expect: 100-continue', () => {
  const refusals: [string, (port: number) => [string, string | undefined], number][] = [
    ['no credentials', (port) => [`http://127.0.0.1:${port}/up`, undefined], 407],
    ['a wrong password', (port) => [`http://127.0.0.1:${port}/up`, basic('u', 'wrong')], 407],
    ['a destination the policy refuses', () => ['http://127.0.0.1:1/up', basic('u', 'p')], 403],
  ];
  for (const [what, request, status] of refusals) {
    it(`${what}: answered ${status} without 100 Continue`, async () => {
      const w = await start();
      const [target, auth] = request(w.originPort);
      const c = await rawClient(w.proxy.port);
      c.write(uploadHead(target, auth));
      const head = await c.waitFor('\r\n\r\n');
      expect(head).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(head).not.toContain('100 Continue');
      expect(w.uploads()).toBe(0);
      c.socket.destroy();
    });
  }

  it('authenticated and allowed: 100 Continue first, then the body reaches the origin', async () => {
    const w = await start();
    const c = await rawClient(w.proxy.port);
    c.write(uploadHead(`http://127.0.0.1:${w.originPort}/up`, basic('u', 'p')));
    await c.waitFor('\r\n\r\n');
    expect(c.received()).toBe('HTTP/1.1 100 Continue\r\n\r\n');
    c.write(BODY);
    const all = await c.waitFor(`got ${BODY.length} bytes`);
    expect(all.slice('HTTP/1.1 100 Continue\r\n\r\n'.length)).toMatch(/^HTTP\/1\.1 200 /);
    c.socket.destroy();
  });
});
