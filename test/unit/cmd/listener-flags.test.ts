/**
 * The listener flags of the discovery API and metrics: defaults, parsing, and precise refusals
 * naming the flag (TLS files in pairs, positive timeouts, header ≤ request, host names).
 */
import { describe, expect, it } from 'vitest';
import { FlagError, parseCommandLine } from '../../../src/cmd/flags.ts';

const standalone = (...extra: string[]) => {
  const p = parseCommandLine(['standalone', '--config', 'x', ...extra]);
  if (p.command !== 'standalone') throw new Error('not standalone');
  return p.flags;
};

describe('listener flags', () => {
  it('defaults: 10s head, 30s request, 30s idle; 1024 discovery and 64 metrics connections', () => {
    const f = standalone();
    expect(f.discoveryLimits).toEqual({
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 30_000,
      idleTimeoutMs: 30_000,
      maxConnections: 1024,
    });
    expect(f.metricsLimits.maxConnections).toBe(64);
    expect(f.discoveryTls).toBeUndefined();
    expect(f.discoveryAllowedHosts).toEqual([]);
  });

  it('parses every listener flag', () => {
    const f = standalone(
      '--http-header-timeout=2s',
      '--http-request-timeout=5s',
      '--http-idle-timeout=1m',
      '--discovery-max-connections=10',
      '--metrics-max-connections=3',
      '--discovery-tls-cert=c.pem',
      '--discovery-tls-key=k.pem',
      '--discovery-allowed-hosts=api.internal, .crawl.svc.cluster.local',
    );
    expect(f.discoveryLimits).toEqual({
      headersTimeoutMs: 2000,
      requestTimeoutMs: 5000,
      idleTimeoutMs: 60_000,
      maxConnections: 10,
    });
    expect(f.metricsLimits.maxConnections).toBe(3);
    expect(f.discoveryTls).toEqual({ certFile: 'c.pem', keyFile: 'k.pem' });
    expect(f.discoveryAllowedHosts).toEqual(['api.internal', '.crawl.svc.cluster.local']);
    const op = parseCommandLine([
      'operator',
      '--providers-config',
      'p',
      '--metrics-secure',
      '--metrics-cert-dir',
      '/certs',
    ]);
    expect(op.command === 'operator' && op.flags.metricsCertDir).toBe('/certs');
  });

  it.each([
    [['--discovery-tls-cert', 'c.pem'], '--discovery-tls-key: required together with --discovery-tls-cert'],
    [['--discovery-tls-key', 'k.pem'], '--discovery-tls-cert: required together with --discovery-tls-key'],
    [['--http-header-timeout', '0'], '--http-header-timeout: must be more than 0'],
    [['--http-idle-timeout', 'soon'], '--http-idle-timeout'],
    [['--http-header-timeout', '1m'], '--http-header-timeout: must not exceed --http-request-timeout'],
    [['--discovery-max-connections', '0'], '--discovery-max-connections'],
    [['--metrics-max-connections', 'many'], '--metrics-max-connections'],
    [['--discovery-allowed-hosts', 'evil.example/x'], '--discovery-allowed-hosts'],
  ])('%j is refused naming the flag', (args, message) => {
    expect(() => standalone(...args)).toThrow(FlagError);
    expect(() => standalone(...args)).toThrow(message);
  });

  it('status trims a token read with a trailing newline', () => {
    const p = parseCommandLine(['status', '--token', 'tok\n']);
    expect(p.command === 'status' && p.flags.token).toBe('tok');
  });
});
