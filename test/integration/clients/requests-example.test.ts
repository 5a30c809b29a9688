/**
 * The `requests` example of docs/lease-api.md, run as written (only the API URL changed) with Debian's
 * python3-requests and clients/python, against the real standalone operator without a token
 * (no KeyError), through its `pool=eu` proxies, to loopback origins: a page that loads, a TLS
 * origin whose certificate requests refuses (SSLError), a dead origin over plain HTTP (the
 * proxy's 502 with X-Proxy-Error) and over CONNECT (ProxyError 502), and a page that answers 403.
 * Only the 403 is reported (`blocked`, naming the proxy that carried it); nothing is reported
 * `failed`; every lease is released, also when the example raised.
 */
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  REPO_ROOT,
  startStandalone,
  waitForReady,
} from '../../support/cli.ts';
import { closedPort, startHttpOrigin, startTlsOrigin } from '../../support/origins.ts';
import { requirePython, runPython } from '../../support/python.ts';

vi.setConfig({ testTimeout: 120_000 });
afterEach(cleanupCli);

interface Outcome {
  status?: number | null;
  proxyError?: string | null;
  error?: string;
  message?: string;
}

describe('docs/lease-api.md: the requests example', () => {
  it('reports only what the table says, never leaks a lease, and needs no token', async () => {
    requirePython(['requests']);
    const plain = await startHttpOrigin({ defaultStatus: 200 });
    const tls = await startTlsOrigin({ defaultStatus: 200 });
    onTestFinished(async () => {
      await plain.close();
      await tls.close();
    });
    const dead = await closedPort();
    const ws = await createWorkspace({ openPorts: [plain.port, tls.port, dead] });
    const proc = startStandalone(ws);
    await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3'], 60_000);

    const urls = {
      ok: `${plain.baseUrl}/page`,
      tls: `${tls.baseUrl}/page`,
      deadPlain: `http://127.0.0.1:${dead}/page`,
      deadTunnel: `https://127.0.0.1:${dead}/page`,
      blocked: `${plain.baseUrl}/status/403`,
    };
    const run = await runPython(
      [
        join(import.meta.dirname, '../../support/fixtures/clients/requests_example.py'),
        join(REPO_ROOT, 'docs', 'lease-api.md'),
        ws.discoveryUrl,
        JSON.stringify(urls),
      ],
      { cwd: ws.dir },
    );
    expect(run.code, run.output).toBe(0);
    const line = run.output.split('\n').find((l) => l.startsWith('RESULT '));
    expect(line, run.output).toBeDefined();
    const out = JSON.parse((line ?? '').slice('RESULT '.length)) as Record<keyof typeof urls, Outcome>;

    expect(out.ok).toEqual({ status: 200, proxyError: null });
    expect(out.tls.error).toBe('SSLError');
    // The proxy works and says the origin did not: a page for the caller, nothing reported.
    expect(out.deadPlain).toEqual({ status: 502, proxyError: 'origin-unreachable' });
    expect(out.deadTunnel.error).toBe('ProxyError');
    expect(out.deadTunnel.message).toContain('502');
    expect(out.blocked).toEqual({ status: null, proxyError: null });

    const reported = proc.logs.filter((l) => l.msg === 'proxy reported');
    expect(reported.map((l) => [l.result, l.target])).toEqual([['blocked', '127.0.0.1']]);
    // The one cooldown is on the proxy that carried the 403, one of the pool=eu proxies.
    const proxies = await clientFor(ws).listProxies();
    const cooling = proxies.filter((p) => p.targetCooldowns.some((c) => c.target === '127.0.0.1'));
    expect(cooling.map((p) => `${p.namespace}/${p.name}`)).toEqual([String(reported[0]?.proxy)]);
    expect(['local-1', 'local-2']).toContain(cooling[0]?.name);
    // Released every time, also after SSLError and ProxyError.
    expect(proxies.map((p) => [p.name, p.activeLeases])).toEqual(proxies.map((p) => [p.name, 0]));
  });
});
