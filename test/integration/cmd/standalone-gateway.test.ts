/**
 * End-to-end: the real `standalone` CLI serves the gateway on `--gateway-bind-address`, routing
 * curl through its local proxies by the user name's options; without a token it says so loudly
 * and serves loopback only. curl and Python's urllib, given nothing but the gateway URL, reach a
 * TLS origin through the local proxies too.
 */
import { appendFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
});
