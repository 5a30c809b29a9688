/**
 * The gateway end to end: real curl, Python urllib and python3-requests configured with nothing
 * but the gateway URL, through real Squid upstreams to real TLS and plain-HTTP origins.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { peersOf, pythonCrawl, run, startWorld, type World } from '../../support/gateway/world.ts';

describe('gateway with Squid upstreams', () => {
  let w: World;
  beforeAll(async () => {
    w = await startWorld({
      // localhost blocks the first upstream (it leaves from 127.0.0.11); 127.0.0.1 blocks nobody.
      origin: {
        statusFor: (peer, host) => (peer === '127.0.0.11' && host === 'localhost' ? 403 : undefined),
      },
    });
  }, 60_000);
  afterAll(async () => {
    await w?.close();
  });

  it('curl: CONNECT through the gateway names the upstream and reaches the TLS origin', async () => {
    const r = await run('curl', [
      '-sS',
      '-i',
      '--cacert',
      w.caFile,
      '-x',
      w.url('crawler-session-curl1'),
      `${w.tls.baseUrl}/`,
    ]);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^HTTP\/1\.1 200 Connection Established\r\nX-Egress-Proxy: crawl\/sq\d\r\n/);
    expect(r.stdout).toMatch(/HTTP\/1\.1 204/);
  });

  it('curl: plain http:// is forwarded in absolute form with X-Egress-Proxy on the response', async () => {
    const r = await run('curl', ['-sS', '-i', '-x', w.url('crawler'), `${w.http.baseUrl}/`]);
    expect(r.stdout).toMatch(/^HTTP\/1\.1 204/);
    expect(r.stdout).toMatch(/X-Egress-Proxy: crawl\/sq\d/i);
  });

  it('an unknown user-name option is refused with 407 and a message saying which', async () => {
    const r = await run('curl', ['-sS', '-i', '-x', w.url('crawler-color-red'), `${w.http.baseUrl}/`]);
    expect(r.stdout).toMatch(/^HTTP\/1\.1 407/);
    expect(r.stdout).toContain('unknown option "color"');
    const wrong = await run('curl', [
      '-sS',
      '-i',
      '-x',
      w.url('crawler').replace('gw-test-token', 'nope'),
      `${w.http.baseUrl}/`,
    ]);
    expect(wrong.stdout).toMatch(/^HTTP\/1\.1 407/);
    expect(wrong.stdout).not.toContain('gw-test-token');
  });

  it('the egress policy applies before any upstream is chosen', async () => {
    const before = w.leases.activeLeases();
    const r = await run('curl', ['-sS', '-i', '-x', w.url('crawler'), 'https://127.0.0.1:9/']);
    expect(r.stdout).toMatch(/^HTTP\/1\.1 403/);
    expect(w.leases.snapshot().every((p) => p.lastLeasedAt === null || p.activeLeases === 0)).toBe(true);
    expect(w.leases.activeLeases()).toBe(before);
  });

  for (const client of ['urllib', 'requests'] as const) {
    it(`${client}: a sticky session keeps one upstream across 100 requests`, async () => {
      const r = await pythonCrawl(
        client,
        w.url(`crawler-session-${client}7`),
        `${w.tls.baseUrl}/`,
        100,
        w.caFile,
      );
      expect(r.stderr).toBe('');
      const peers = peersOf(r.stdout);
      expect([...peers.values()]).toEqual([100]);
    }, 60_000);
  }

  it('requests without a session rotate across upstreams', async () => {
    const r = await pythonCrawl('requests', w.url('crawler'), `${w.http.baseUrl}/`, 30, w.caFile);
    expect(peersOf(r.stdout).size).toBe(3);
  }, 60_000);

  it('a per-site block moves only that site off the blocked upstream', async () => {
    const site = w.http.baseUrl.replace('127.0.0.1', 'localhost');
    const blocked = await pythonCrawl('urllib', w.url('crawler'), `${site}/`, 30, w.caFile);
    // The first request through 127.0.0.11 got 403 (reported blocked) and was answered from the
    // next upstream (the default rules): the crawler saw no 403, and none went there after it.
    const lines = blocked.stdout.trim().split('\n');
    expect(lines.filter((l) => l.startsWith('403'))).toHaveLength(0);
    expect(lines).toHaveLength(30);
    expect(peersOf(blocked.stdout).get('127.0.0.11')).toBeUndefined();
    const cooled = w.leases.snapshot({ target: 'localhost' }).find((p) => p.name === 'sq1');
    expect(cooled?.reason).toBe('CoolingDownForTarget');
    // The other site still uses all three upstreams.
    const other = await pythonCrawl('urllib', w.url('crawler'), `${w.http.baseUrl}/`, 30, w.caFile);
    expect(peersOf(other.stdout).get('127.0.0.11')).toBeGreaterThan(0);
  }, 60_000);
});
