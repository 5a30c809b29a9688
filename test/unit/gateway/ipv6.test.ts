/**
 * test/unit/gateway/ipv6 — IPv6 literal destinations through a gateway in this process: CONNECT
 * `[v6]:port` and absolute-form `http://[v6]/` reach the upstream (a fake forward proxy on
 * loopback that records what it is asked and never connects anywhere) and lease the site in its
 * one spelling, so a block reported for it cools that site for API leases too; IPv4-mapped,
 * NAT64 and 6to4 spellings of denied IPv4 addresses are refused like the IPv4 address, and a
 * mapped public address is dialled as the IPv4 address.
 */
import { once } from 'node:events';
import net from 'node:net';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { Gateway } from '../../../src/gateway/server.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'gw-ipv6-token';
const AUTH = `Basic ${Buffer.from(`crawler:${TOKEN}`).toString('base64')}`;

/** A forward proxy that answers every CONNECT 200 and every request 200 (403 for /blocked). */
async function fakeUpstream(): Promise<{ port: number; asked: string[]; close(): Promise<void> }> {
  const asked: string[] = [];
  const server = net.createServer((s) => {
    let head = '';
    s.on('error', () => s.destroy());
    s.on('data', function onData(d: Buffer) {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      s.off('data', onData);
      const line = head.slice(0, head.indexOf('\r\n'));
      asked.push(line);
      if (line.startsWith('CONNECT ')) s.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      else {
        const status = line.includes('/blocked ') ? '403 Forbidden' : '200 OK';
        s.end(`HTTP/1.1 ${status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok`);
      }
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as net.AddressInfo).port,
    asked,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

/** The status line of a raw request to the gateway (CONNECT or absolute form). */
async function statusOf(port: number, requestLine: string, host: string): Promise<string> {
  const s = net.connect({ host: '127.0.0.1', port });
  await once(s, 'connect');
  s.write(`${requestLine}\r\nHost: ${host}\r\nProxy-Authorization: ${AUTH}\r\n\r\n`);
  let buf = '';
  while (!buf.includes('\r\n')) buf += ((await once(s, 'data')) as [Buffer])[0].toString('latin1');
  s.destroy();
  return buf.slice(0, buf.indexOf('\r\n'));
}

describe('gateway: IPv6 literal destinations', () => {
  let upstream: Awaited<ReturnType<typeof fakeUpstream>>;
  let leases: LeaseStore;
  let gateway: Gateway;

  beforeAll(async () => {
    upstream = await fakeUpstream();
    leases = new LeaseStore({ clock: systemClock });
    leases.upsertProxy(proxyInfo('up1', { host: '127.0.0.1', port: upstream.port }));
    gateway = new Gateway({
      bind: { host: '127.0.0.1', port: 0 },
      token: TOKEN,
      chooser: new LeaseStoreChooser(leases, systemClock),
      // The default policy: the destinations below are never connected to, only named.
      egress: new EgressGuard(resolveEgressPolicy()),
      clock: systemClock,
      log: silentLogger(),
      registry: new Registry(),
      tracer: trace.getTracer('test'),
      limits: { upstreamTimeoutMs: 3000 },
    });
    await gateway.listen();
  });
  afterAll(async () => {
    await gateway?.close();
    leases?.close();
    await upstream?.close();
  });

  it('tunnels CONNECT [v6]:port through an upstream, asking it for the checked address', async () => {
    upstream.asked.length = 0;
    expect(await statusOf(gateway.port, 'CONNECT [2001:db8::1]:443 HTTP/1.1', '[2001:db8::1]:443')).toBe(
      'HTTP/1.1 200 Connection Established',
    );
    expect(await statusOf(gateway.port, 'CONNECT [2001:DB8:0::2]:443 HTTP/1.1', 'x')).toBe(
      'HTTP/1.1 200 Connection Established',
    );
    expect(upstream.asked).toEqual([
      'CONNECT [2001:db8::1]:443 HTTP/1.1',
      'CONNECT [2001:db8::2]:443 HTTP/1.1',
    ]);
  });

  it('forwards http://[v6]/ and cools the site in its one spelling when it is blocked', async () => {
    upstream.asked.length = 0;
    expect(await statusOf(gateway.port, 'GET http://[2001:db8::1]/ HTTP/1.1', '[2001:db8::1]')).toBe(
      'HTTP/1.1 200 OK',
    );
    expect(upstream.asked).toEqual(['GET http://[2001:db8::1]/ HTTP/1.1']);
    expect(await statusOf(gateway.port, 'GET http://[2001:db8::5]/blocked HTTP/1.1', '[2001:db8::5]')).toBe(
      'HTTP/1.1 403 Forbidden',
    );
    // The gateway reported the block for the site; the API knows it under every spelling.
    for (const target of ['2001:db8::5', '[2001:db8:0:0::5]', 'https://[2001:DB8::5]:8443/x']) {
      expect(leases.lease({ target }).granted, target).toBe(false);
    }
    const other = leases.lease({ target: '[2001:db8::6]' });
    expect(other.granted && other.grant.target).toBe('[2001:db8::6]');
  });

  it('refuses IPv6 spellings of denied IPv4 addresses like the IPv4 address, before any upstream', async () => {
    upstream.asked.length = 0;
    for (const authority of [
      '[::ffff:10.0.0.1]:443',
      '[::ffff:7f00:1]:443',
      '[64:ff9b::a9fe:a9fe]:443',
      '[2002:c0a8:101::1]:443',
      '[ff02::1]:443',
      '255.255.255.255:443',
    ]) {
      expect(await statusOf(gateway.port, `CONNECT ${authority} HTTP/1.1`, authority), authority).toBe(
        'HTTP/1.1 403 Forbidden',
      );
    }
    expect(await statusOf(gateway.port, 'GET http://[::ffff:127.0.0.1]/ HTTP/1.1', 'x')).toMatch(
      /^HTTP\/1\.1 403 /,
    );
    expect(await statusOf(gateway.port, 'GET http://[64:ff9b::a00:1]/ HTTP/1.1', 'x')).toMatch(
      /^HTTP\/1\.1 403 /,
    );
    expect(upstream.asked).toEqual([]);
  });

  it('an IPv4-mapped public address is the IPv4 site, dialled as the IPv4 address', async () => {
    upstream.asked.length = 0;
    expect(await statusOf(gateway.port, 'CONNECT [::ffff:198.51.100.7]:443 HTTP/1.1', 'x')).toBe(
      'HTTP/1.1 200 Connection Established',
    );
    expect(upstream.asked).toEqual(['CONNECT 198.51.100.7:443 HTTP/1.1']);
  });
});
