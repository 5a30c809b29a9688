/**
 * The metrics endpoint as a listener, over loopback: `--metrics-secure` serves HTTPS with a
 * certificate generated at start (checked by Node's X.509 parser and a verifying TLS client) or
 * the tls.crt/tls.key of `--metrics-cert-dir`; header and idle timeouts and the connection cap
 * hold with small values.
 */
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { Counter, Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { metricsTls } from '../../../src/cmd/modes.ts';
import { silentLogger } from '../../../src/log/index.ts';
import type { TlsFiles } from '../../../src/metrics/listener.ts';
import { selfSignedCertificate } from '../../../src/metrics/selfsigned.ts';
import { type MetricsServer, startMetricsServer } from '../../../src/metrics/server.ts';
import { exchange, openIdle, send, slowHeaders } from '../../support/listeners.ts';
import { until } from '../../support/wait.ts';

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function start(
  opts: { tls?: TlsFiles; limits?: Parameters<typeof startMetricsServer>[0]['limits'] } = {},
): Promise<MetricsServer> {
  const registry = new Registry();
  new Counter({ name: 'proxy_operator_test_total', help: 't', registers: [registry] }).inc(2);
  const server = await startMetricsServer({ bindAddress: '127.0.0.1:0', registry, ...opts });
  if (!server) throw new Error('not started');
  closers.push(() => server.close());
  return server;
}

describe('--metrics-secure: HTTPS', () => {
  it('every certificate it makes is valid DER that TLS accepts (random serials included)', () => {
    // A serial starting with a zero byte once made a non-minimal INTEGER that OpenSSL refuses
    // ("illegal padding"): one start in a few hundred would fail.
    for (let i = 0; i < 600; i++) {
      const c = selfSignedCertificate();
      expect(() => createSecureContext({ cert: c.cert, key: c.key })).not.toThrow();
    }
  });

  it('serves with a self-signed certificate made at start, valid for loopback', async () => {
    const tls = metricsTls({ metricsSecure: true }, silentLogger());
    if (!tls) throw new Error('no TLS');
    const x509 = new X509Certificate(tls.cert);
    expect(x509.checkHost('localhost')).toBe('localhost');
    expect(x509.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(x509.ca).toBe(false);
    expect(Date.parse(x509.validTo)).toBeGreaterThan(Date.now() + 300 * 86_400_000);
    const s = await start({ tls });
    // A client that verifies the chain against the certificate itself, and the host name.
    const res = await send(`https://127.0.0.1:${s.port}/metrics`, { ca: tls.cert });
    expect(res.status).toBe(200);
    expect(res.text).toContain('proxy_operator_test_total 2');
    await expect(send(`https://127.0.0.1:${s.port}/metrics`)).rejects.toThrow(/self-signed|certificate/);
    const plain = await exchange(s.port, 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
      timeoutMs: 5_000,
    });
    expect(plain.received).not.toContain('proxy_operator_test_total');
  });

  it('serves the tls.crt and tls.key of --metrics-cert-dir; a bad directory names the flag', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'metrics-cert-'));
    closers.push(() => rmSync(dir, { recursive: true, force: true }));
    const own = selfSignedCertificate({ commonName: 'from-cert-dir' });
    writeFileSync(join(dir, 'tls.crt'), own.cert);
    writeFileSync(join(dir, 'tls.key'), own.key);
    const tls = metricsTls({ metricsSecure: true, metricsCertDir: dir }, silentLogger());
    expect(tls?.cert).toBe(own.cert);
    const s = await start({ tls });
    expect((await send(`https://localhost:${s.port}/metrics`, { ca: own.cert })).status).toBe(200);
    expect(() =>
      metricsTls({ metricsSecure: true, metricsCertDir: join(dir, 'nope') }, silentLogger()),
    ).toThrow(/--metrics-cert-dir: cannot read .*tls\.crt/);
    writeFileSync(join(dir, 'tls.key'), selfSignedCertificate().key);
    expect(() => metricsTls({ metricsSecure: true, metricsCertDir: dir }, silentLogger())).toThrow(
      /--metrics-cert-dir: the certificate and key do not form a usable pair/,
    );
    expect(() => metricsTls({ metricsSecure: false, metricsCertDir: dir }, silentLogger())).toThrow(
      /needs --metrics-secure/,
    );
    expect(metricsTls({ metricsSecure: false }, silentLogger())).toBeUndefined();
  });
});

describe('timeouts and the connection cap', () => {
  const limits = { headersTimeoutMs: 300, requestTimeoutMs: 600, idleTimeoutMs: 400, maxConnections: 2 };

  it('closes a slow-header client after the header timeout (plain and HTTPS)', async () => {
    const s = await start({ limits });
    const r = await slowHeaders(s.port, { everyMs: 50, timeoutMs: 5_000 });
    expect(r.linesSent).toBeGreaterThan(2);
    expect(r.closedAfterMs).toBeLessThan(3_000);
    const secure = await start({ limits, tls: selfSignedCertificate() });
    const t = await slowHeaders(secure.port, { everyMs: 50, timeoutMs: 5_000, tls: true });
    expect(t.closedAfterMs).toBeLessThan(3_000);
  });

  it('closes a connection that never sends a byte', async () => {
    const s = await start({ limits });
    expect(await (await openIdle(s.port)).closed).toBeLessThan(3_000);
  });

  it('refuses connections beyond the cap', async () => {
    const s = await start({
      limits: { ...limits, headersTimeoutMs: 5_000, requestTimeoutMs: 10_000, idleTimeoutMs: 10_000 },
    });
    const held = await Promise.all([openIdle(s.port), openIdle(s.port)]);
    const extra = await exchange(s.port, 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
      timeoutMs: 5_000,
    });
    expect(extra.received).toBe('');
    for (const h of held) h.socket.destroy();
    await until('a scrape below the cap', async () => {
      const res = await send(`http://127.0.0.1:${s.port}/metrics`).catch(() => undefined);
      return res?.status === 200;
    });
  });
});
