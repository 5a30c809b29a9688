/**
 * End-to-end: the real `standalone` CLI serves the gateway on `--gateway-bind-address`, routing
 * curl through its local proxies by the user name's options; without a token it says so loudly
 * and serves loopback only. curl and Python's urllib, given nothing but the gateway URL, reach a
 * TLS origin through the local proxies too. With `--gateway-inspect` it keeps its CA in the state
 * dir and serves its certificate.
 */
import { appendFileSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { cleanupCli, createWorkspace, startStandalone, waitForReady } from '../../support/cli.ts';
import { pythonCrawl, run } from '../../support/gateway/world.ts';
import { startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { freePort } from '../../support/ports.ts';

vi.setConfig({ testTimeout: 120_000 });
afterEach(cleanupCli);

describe('standalone gateway', () => {
  it('routes curl through the pool the user name asks for, naming the upstream', async () => {
    const origin = await startHttpOrigin();
    const tls = await startTlsOrigin();
    try {
      const ws = await createWorkspace({ openPorts: [origin.port, tls.port] });
      appendFileSync(
        ws.providersFile,
        `\ngateway:\n  egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${origin.port}, ${tls.port}]}\n`,
      );
      const port = await freePort();
      const proc = startStandalone(ws, ['--gateway-bind-address', `127.0.0.1:${port}`]);
      await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3']);
      const url = `http://crawler-pool-eu-session-1:anything@127.0.0.1:${port}`;
      const seen = new Set<string>();
      for (let i = 0; i < 5; i++) {
        const r = await run('curl', ['-sS', '-i', '-x', url, `${origin.baseUrl}/`]);
        expect(r.stdout).toMatch(/^HTTP\/1\.1 204/);
        seen.add(/X-Egress-Proxy: (\S+)/i.exec(r.stdout)?.[1] ?? '');
      }
      expect([...seen]).toHaveLength(1);
      expect([...seen][0]).toMatch(/^crawl\/local-[12]$/); // the example's pool=eu proxies
      const us = await run('curl', [
        '-sS',
        '-i',
        '-x',
        url.replace('pool-eu', 'pool-us'),
        `${origin.baseUrl}/`,
      ]);
      expect(us.stdout).toMatch(/X-Egress-Proxy: crawl\/local-3/i);
      const none = await run('curl', [
        '-sS',
        '-i',
        '-x',
        url.replace('pool-eu', 'pool-asia'),
        `${origin.baseUrl}/`,
      ]);
      expect(none.stdout).toMatch(/^HTTP\/1\.1 503/);
      expect(proc.logs.some((l) => String(l.msg).includes('WITHOUT a password'))).toBe(true);

      // TLS through the local proxies: curl's CONNECT reply names the upstream; urllib crawls.
      const caFile = join(mkdtempSync(join(tmpdir(), 'gw-ca-')), 'ca.pem');
      writeFileSync(caFile, testPki().caCert);
      const secure = await run('curl', ['-sS', '-i', '--cacert', caFile, '-x', url, `${tls.baseUrl}/`]);
      expect(secure.stdout).toMatch(/X-Egress-Proxy: crawl\/local-[12]/i);
      expect(secure.stdout).toMatch(/HTTP\/1\.1 204/);
      const crawl = await pythonCrawl('urllib', url.replace('-session-1', ''), `${tls.baseUrl}/`, 10, caFile);
      expect(crawl.code, crawl.stderr).toBe(0);
      expect(
        crawl.stdout
          .trim()
          .split('\n')
          .filter((l) => l.startsWith('204 ')),
      ).toHaveLength(10);
    } finally {
      await origin.close();
      await tls.close();
    }
  });

  it('inspects HTTPS with a CA kept 0600 in the state dir, the same after a restart, served at /v1/gateway/ca.pem', async () => {
    const tls = await startTlsOrigin();
    try {
      const ws = await createWorkspace({ openPorts: [tls.port] });
      appendFileSync(
        ws.providersFile,
        `\ngateway:\n  egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${tls.port}]}\n`,
      );
      const dir = mkdtempSync(join(tmpdir(), 'gw-inspect-'));
      const originCa = join(dir, 'origin-ca.pem');
      writeFileSync(originCa, testPki().caCert);
      const port = await freePort();
      const args = [
        '--gateway-bind-address',
        `127.0.0.1:${port}`,
        '--gateway-inspect',
        '--gateway-origin-ca',
        originCa,
      ];
      const first = startStandalone(ws, args);
      await waitForReady(ws, first, ['local-1', 'local-2', 'local-3']);
      const served = await fetch(`${ws.discoveryUrl}/v1/gateway/ca.pem`);
      expect(served.status).toBe(200);
      expect(served.headers.get('content-type')).toBe('application/x-pem-file');
      const pem = await served.text();
      const caDir = join(dirname(ws.statePath), 'gateway-ca');
      expect(statSync(join(caDir, 'ca.key')).mode & 0o777).toBe(0o600);
      expect(readFileSync(join(caDir, 'ca.pem'), 'utf8')).toBe(pem);
      // curl trusting the gateway CA only: the answer comes through an inspected connection.
      const caFile = join(dir, 'gateway-ca.pem');
      writeFileSync(caFile, pem);
      const r = await run('curl', [
        '-sS',
        '-i',
        '--cacert',
        caFile,
        '-x',
        `http://crawler:x@127.0.0.1:${port}`,
        `${tls.baseUrl}/`,
      ]);
      expect(r.stdout).toMatch(/HTTP\/1\.1 204/);
      expect(r.stdout).toMatch(/X-Egress-Proxy: crawl\/local-\d/i);
      await first.killHard();
      const second = startStandalone(ws, args);
      await waitForReady(ws, second, ['local-1', 'local-2', 'local-3']);
      expect(await (await fetch(`${ws.discoveryUrl}/v1/gateway/ca.pem`)).text()).toBe(pem);
      // The key never reaches the log; the fingerprint does.
      const key = readFileSync(join(caDir, 'ca.key'), 'utf8').split('\n')[1] ?? 'missing';
      for (const p of [first, second]) {
        expect(p.stdout).not.toContain('PRIVATE KEY');
        expect(p.stdout).not.toContain(key);
        expect(p.logs.some((l) => String(l.msg).startsWith('gateway inspects HTTPS'))).toBe(true);
      }
    } finally {
      await tls.close();
    }
  });
});
