/**
 * Probes through a real Squid (Basic auth via basic_ncsa_auth) to real TLS and HTTP origins on
 * loopback: every failure reason a user may see on a Proxy's Healthy condition.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ProbeResult, probe, probeDirect, TlsSessionCache } from '../../../src/health/probe.ts';
import { closedPort, type Origin, startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { type Squid, startSquid } from '../../support/squid.ts';

let squid: Squid;
let tlsOrigin: Origin;
let httpOrigin: Origin;
let ca: string;

beforeAll(async () => {
  ca = testPki().caCert;
  [squid, tlsOrigin, httpOrigin] = await Promise.all([startSquid(), startTlsOrigin(), startHttpOrigin()]);
});

afterAll(async () => {
  await Promise.all([squid?.stop(), tlsOrigin?.close(), httpOrigin?.close()]);
});

const creds = () => ({ username: squid.username, password: squid.password });
const target = () => ({ host: squid.host, port: squid.port, credentials: creds() });

function failed(r: ProbeResult): Extract<ProbeResult, { ok: false }> {
  if (r.ok) throw new Error(`expected a failure, got ${JSON.stringify(r)}`);
  return r;
}

function noSecrets(r: ProbeResult): void {
  const text = JSON.stringify(r);
  expect(text).not.toContain(squid.password);
  expect(text).not.toContain(Buffer.from(`${squid.username}:${squid.password}`).toString('base64'));
}

describe('probe through a real Squid', () => {
  it('succeeds over a CONNECT tunnel with TLS verification against a custom CA', async () => {
    const r = await probe(
      target(),
      { url: `${tlsOrigin.baseUrl}/generate_204`, expectStatus: 204, timeoutMs: 5000 },
      { ca },
    );
    expect(r).toMatchObject({ ok: true, status: 204 });
    expect(r.latencyMs).toBeGreaterThanOrEqual(0);
    // Squid logs a tunnel once it has closed, a moment after the probe has its answer.
    await expect.poll(() => squid.accessLog()).toContain(`CONNECT 127.0.0.1:${tlsOrigin.port}`);
  });

  it('sends SNI and verifies the name for a host-named URL', async () => {
    const r = await probe(
      target(),
      { url: `https://localhost:${tlsOrigin.port}/status/204`, expectStatus: 204, timeoutMs: 5000 },
      { ca },
    );
    expect(r).toMatchObject({ ok: true });
  });

  it('succeeds for http URLs with an absolute-form GET through the proxy', async () => {
    const before = httpOrigin.requests;
    const r = await probe(target(), {
      url: `${httpOrigin.baseUrl}/status/200`,
      expectStatus: 200,
      timeoutMs: 5000,
    });
    expect(r).toMatchObject({ ok: true, status: 200 });
    expect(httpOrigin.requests).toBe(before + 1);
  });

  it('resumes the TLS session on the next probe of the same origin', async () => {
    const cache = new TlsSessionCache();
    const check = { url: `${tlsOrigin.baseUrl}/generate_204`, expectStatus: 204, timeoutMs: 5000 };
    const before = tlsOrigin.resumedSessions();
    expect(await probe(target(), check, { ca, tlsSessionCache: cache })).toMatchObject({ ok: true });
    expect(cache.size).toBe(1);
    expect(await probe(target(), check, { ca, tlsSessionCache: cache })).toMatchObject({ ok: true });
    expect(await probe(target(), check, { ca, tlsSessionCache: cache })).toMatchObject({ ok: true });
    expect(tlsOrigin.resumedSessions() - before).toBeGreaterThanOrEqual(2);
  });

  it('reports ProxyAuthRequired without credentials', async () => {
    const r = failed(
      await probe(
        { host: squid.host, port: squid.port },
        { url: `${tlsOrigin.baseUrl}/`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    );
    expect(r.reason).toBe('ProxyAuthRequired');
    expect(r.status).toBe(407);
  });

  it('reports ProxyAuthRequired with a wrong password, and the message holds no credentials', async () => {
    const wrong = { username: squid.username, password: `${squid.password}x` };
    const r = failed(
      await probe(
        { host: squid.host, port: squid.port, credentials: wrong },
        { url: `${tlsOrigin.baseUrl}/`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    );
    expect(r.reason).toBe('ProxyAuthRequired');
    expect(r.message).not.toContain(wrong.password);
    noSecrets(r);
  });

  it('reports ProxyAuthRequired for http URLs too', async () => {
    const r = failed(
      await probe(
        { host: squid.host, port: squid.port },
        { url: `${httpOrigin.baseUrl}/`, expectStatus: 204, timeoutMs: 5000 },
      ),
    );
    expect(r.reason).toBe('ProxyAuthRequired');
  });

  it('reports ConnectRejected with the status when the proxy refuses the CONNECT', async () => {
    const r = failed(
      await probe(target(), { url: 'https://127.0.0.1:25/', expectStatus: 204, timeoutMs: 5000 }, { ca }),
    );
    expect(r.reason).toBe('ConnectRejected');
    expect(r.status).toBe(403);
    expect(r.message).toContain('403');
    noSecrets(r);
  });

  it('reports UnexpectedStatus when the origin answers another code', async () => {
    const r = failed(
      await probe(
        target(),
        { url: `${tlsOrigin.baseUrl}/status/503`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    );
    expect(r.reason).toBe('UnexpectedStatus');
    expect(r.status).toBe(503);
    expect(r.message).toContain('503');
  });

  it('reports ConnectFailed for a proxy that is not listening', async () => {
    const port = await closedPort();
    const r = failed(
      await probe(
        { host: '127.0.0.1', port, credentials: creds() },
        { url: `${tlsOrigin.baseUrl}/`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    );
    expect(r.reason).toBe('ConnectFailed');
    expect(r.message).toContain(String(port));
    noSecrets(r);
  });

  it('reports TLSFailed when the origin certificate is not trusted', async () => {
    const r = failed(
      await probe(target(), { url: `${tlsOrigin.baseUrl}/generate_204`, expectStatus: 204, timeoutMs: 5000 }),
    );
    expect(r.reason).toBe('TLSFailed');
    noSecrets(r);
  });

  it('reports Timeout when the origin hangs, within the deadline', async () => {
    const t0 = Date.now();
    const r = failed(
      await probe(target(), { url: `${tlsOrigin.baseUrl}/hang`, expectStatus: 204, timeoutMs: 400 }, { ca }),
    );
    expect(r.reason).toBe('Timeout');
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(r.latencyMs).toBeGreaterThanOrEqual(390);
  });

  it('stops at once when the signal aborts', async () => {
    const ac = new AbortController();
    const p = probe(
      target(),
      { url: `${tlsOrigin.baseUrl}/hang`, expectStatus: 204, timeoutMs: 20_000 },
      { ca, signal: ac.signal },
    );
    setTimeout(() => ac.abort(), 100);
    const t0 = Date.now();
    expect(failed(await p).reason).toBe('Timeout');
    expect(Date.now() - t0).toBeLessThan(2000);
  });
});

describe('direct control probe', () => {
  it('fetches the URL without a proxy and checks the status', async () => {
    expect(
      await probeDirect(
        { url: `${tlsOrigin.baseUrl}/generate_204`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    ).toMatchObject({ ok: true });
    expect(
      await probeDirect({ url: `${httpOrigin.baseUrl}/status/204`, expectStatus: 204, timeoutMs: 5000 }),
    ).toMatchObject({ ok: true });
    const r = failed(
      await probeDirect(
        { url: `${tlsOrigin.baseUrl}/status/500`, expectStatus: 204, timeoutMs: 5000 },
        { ca },
      ),
    );
    expect(r.reason).toBe('UnexpectedStatus');
  });

  it('fails with ConnectFailed when the target is down', async () => {
    const port = await closedPort();
    const r = failed(
      await probeDirect({ url: `https://127.0.0.1:${port}/`, expectStatus: 204, timeoutMs: 5000 }, { ca }),
    );
    expect(r.reason).toBe('ConnectFailed');
  });
});
