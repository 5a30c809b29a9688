/**
 * test/integration/provider/local-egress-addresses — `local.egressAddresses` on real sockets: an origin on
 * loopback records the source address of every request, and each local proxy must reach it
 * from its own address, through CONNECT tunnels and plain-HTTP forwarding alike, for IPv4
 * (127.0.0.2–4) and IPv6 (addresses `npm test` adds to lo). The assignment is stable: a
 * re-created instance and a restarted provider (given the address from status) keep it, other
 * Proxies' addresses are left to them, and more proxies than addresses share evenly.
 * The origins are loopback, which the default egress policy refuses: each provider allows its
 * origin explicitly (allowCIDRs + connectPorts), as a lab setup would.
 */
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  addTestAddressesCommand,
  ipv6Disabled,
  TEST_IPV6_ADDRESSES,
  TEST_IPV6_PREFIX,
} from '../../../scripts/test/test-addresses.ts';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { bindProblem } from '../../../src/config/egress-addresses.ts';
import type { LocalProviderConfig } from '../../../src/config/schema.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { createLocalProvider, type LocalProvider } from '../../../src/provider/local/index.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';
import { freePortRange } from '../../support/ports.ts';
import { callContext, createRequest, TEST_CREDENTIALS as creds } from '../../support/provider-calls.ts';
import { basicAuthHeader } from '../../support/squid.ts';

const auth = basicAuthHeader(creds.username, creds.password);

/** A GET through the proxy, tunnelled (CONNECT) or in absolute form; resolves to the status. */
async function getVia(proxyPort: number, origin: Origin, mode: 'connect' | 'forward'): Promise<number> {
  const host = new URL(origin.baseUrl).host;
  if (mode === 'forward') {
    return new Promise((resolve, reject) => {
      const r = http.request(
        {
          host: '127.0.0.1',
          port: proxyPort,
          path: `${origin.baseUrl}/`,
          headers: { 'Proxy-Authorization': auth },
          agent: false,
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      r.on('error', reject);
      r.end();
    });
  }
  const socket = net.connect({ host: '127.0.0.1', port: proxyPort });
  await once(socket, 'connect');
  socket.write(`CONNECT ${host} HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${auth}\r\n\r\n`);
  let buf = '';
  while (!buf.includes('\r\n\r\n')) buf += ((await once(socket, 'data')) as [Buffer])[0].toString('latin1');
  if (!buf.startsWith('HTTP/1.1 200')) {
    socket.destroy();
    return Number(buf.split(' ')[1]);
  }
  socket.write(`GET / HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  let answer = '';
  socket.on('data', (d: Buffer) => {
    answer += d.toString('latin1');
  });
  await once(socket, 'end');
  socket.destroy();
  return Number(answer.split(' ')[1]);
}

const providers: LocalProvider[] = [];

/** A provider whose proxies may reach loopback origins on `ports` (a lab setup). */
async function provider(
  ports: number[],
  egressAddresses: LocalProviderConfig['egressAddresses'],
  reservations: Array<{ address: string; uid: string }> = [],
): Promise<LocalProvider> {
  const p = createLocalProvider({
    name: 'fleet',
    config: {
      portRange: await freePortRange(8),
      egressAddresses,
      egressPolicy: { allowCIDRs: ['127.0.0.1/32', '::1/128'], connectPorts: ports },
    },
    egressReservations: () => reservations,
  });
  providers.push(p);
  return p;
}

afterEach(async () => {
  await Promise.all(providers.splice(0).map((p) => p.close()));
});

describe('local egress addresses (IPv4)', () => {
  let origin: Origin;
  beforeAll(async () => {
    origin = await startHttpOrigin();
  });
  afterAll(() => origin.close());

  it('three proxies reach the origin from three addresses, tunnelled and forwarded', async () => {
    const p = await provider([origin.port], ['127.0.0.2', '127.0.0.3', '127.0.0.4']);
    const insts = await Promise.all(
      ['px-a', 'px-b', 'px-c'].map((n) => p.create(callContext(), createRequest(n))),
    );
    const assigned = insts.map((i) => i.egressIP);
    expect(new Set(assigned)).toEqual(new Set(['127.0.0.2', '127.0.0.3', '127.0.0.4']));
    for (const mode of ['connect', 'forward'] as const) {
      origin.sources.length = 0;
      for (const inst of insts) expect(await getVia(inst.port as number, origin, mode)).toBe(204);
      expect(origin.sources).toEqual(assigned);
    }
  });

  it('keeps each Proxy on its address: re-created, restarted with the status hint, replaced', async () => {
    const first = await provider([origin.port], { cidr: '127.0.0.0/29', count: 3 });
    const a = await first.create(callContext(), createRequest('px-a'));
    const b = await first.create(callContext(), createRequest('px-b'));
    await first.delete(callContext(), a.id);
    // Re-created in the same process: the name remembers its address, even with b created since.
    expect((await first.create(callContext(), createRequest('px-a'))).egressIP).toBe(a.egressIP);
    await first.close();

    // A new process: the addresses come back from status (the create hint), whatever the order.
    const held = [
      { address: a.egressIP as string, uid: 'uid-px-a' },
      { address: b.egressIP as string, uid: 'uid-px-b' },
    ];
    const second = await provider([origin.port], { cidr: '127.0.0.0/29', count: 3 }, held);
    const c = await second.create(callContext(), createRequest('px-c'));
    expect([a.egressIP, b.egressIP]).not.toContain(c.egressIP);
    const b2 = await second.create(callContext(), createRequest('px-b', { egressIP: b.egressIP as string }));
    const a2 = await second.create(callContext(), createRequest('px-a', { egressIP: a.egressIP as string }));
    expect([a2.egressIP, b2.egressIP]).toEqual([a.egressIP, b.egressIP]);
    // A replacement instance of px-a (new name, same Proxy) leaves from px-a's address.
    const replacement = await second.create(
      callContext(),
      createRequest('px-a-v2', { uid: 'uid-px-a', egressIP: a.egressIP as string }),
    );
    expect(replacement.egressIP).toBe(a.egressIP);
    origin.sources.length = 0;
    expect(await getVia(replacement.port as number, origin, 'connect')).toBe(204);
    expect(origin.sources).toEqual([a.egressIP]);
  });

  it('shares addresses evenly when proxies outnumber them', async () => {
    const p = await provider([origin.port], ['127.0.0.2', '127.0.0.3']);
    const names = ['px-1', 'px-2', 'px-3', 'px-4'];
    const insts = [];
    for (const n of names) insts.push(await p.create(callContext(), createRequest(n)));
    const counts = new Map<string, number>();
    for (const i of insts) counts.set(i.egressIP as string, (counts.get(i.egressIP as string) ?? 0) + 1);
    expect(counts).toEqual(
      new Map([
        ['127.0.0.2', 2],
        ['127.0.0.3', 2],
      ]),
    );
  });
});

describe('local egress addresses (IPv6)', () => {
  const disabled = ipv6Disabled();
  let origin: Origin;
  beforeAll(async () => {
    if (disabled) return;
    const missing: string[] = [];
    for (const a of TEST_IPV6_ADDRESSES) if ((await bindProblem(a)) !== undefined) missing.push(a);
    if (missing.length > 0) {
      throw new Error(
        `cannot bind the IPv6 test addresses ${missing.join(', ')}: npm test adds them as root; by hand: sudo sh -c '${addTestAddressesCommand()}'`,
      );
    }
    origin = await startHttpOrigin({ host: '::1' });
  });
  afterAll(() => origin?.close());

  it.skipIf(disabled !== undefined)(
    `proxies leave from their own IPv6 addresses (${disabled ?? 'IPv6 available'})`,
    async () => {
      const p = await provider([origin.port], { cidr: `${TEST_IPV6_PREFIX}/125`, count: 3 });
      const insts = await Promise.all(
        ['px-a', 'px-b', 'px-c'].map((n) => p.create(callContext(), createRequest(n))),
      );
      const assigned = insts.map((i) => i.egressIP);
      expect(new Set(assigned)).toEqual(new Set(TEST_IPV6_ADDRESSES.slice(0, 3)));
      for (const mode of ['connect', 'forward'] as const) {
        origin.sources.length = 0;
        for (const inst of insts) expect(await getVia(inst.port as number, origin, mode)).toBe(204);
        expect(origin.sources).toEqual(assigned);
      }
      // An IPv4-only origin is not reached from an IPv6 source: 502, and nothing arrives.
      const v4 = await startHttpOrigin();
      try {
        const both = await provider([origin.port, v4.port], { cidr: `${TEST_IPV6_PREFIX}/125`, count: 3 });
        const inst = await both.create(callContext(), createRequest('px-both'));
        expect(await getVia(inst.port as number, v4, 'forward')).toBe(502);
        expect(await getVia(inst.port as number, v4, 'connect')).toBe(502);
        expect(v4.sources).toEqual([]);
      } finally {
        await v4.close();
      }
    },
  );
});

describe('egress guard and a source address family', () => {
  it('dials the address of the source family, after checking every address', async () => {
    const guard = new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.1/32', '::1/128'] }),
      undefined,
      async () => ['127.0.0.1', '::1'],
    );
    expect(await guard.decide('dual.example', 443, undefined, 6)).toEqual({ allowed: true, address: '::1' });
    expect(await guard.decide('dual.example', 443, undefined, 4)).toEqual({
      allowed: true,
      address: '127.0.0.1',
    });
    const strict = new EgressGuard(resolveEgressPolicy({ allowCIDRs: ['::1/128'] }), undefined, async () => [
      '127.0.0.1',
      '::1',
    ]);
    // The IPv4 address is still checked (and denied) for an IPv6 proxy.
    expect(await strict.decide('dual.example', 443, undefined, 6)).toMatchObject({
      allowed: false,
      reason: 'address',
      rule: expect.stringContaining('127.0.0.1'),
    });
  });
});
