import { describe, expect, it } from 'vitest';
import { FlagError, helpText, parseCommandLine, parseDuration } from '../../../src/cmd/flags.ts';

function fails(argv: string[]): string {
  try {
    parseCommandLine(argv);
  } catch (err) {
    expect(err).toBeInstanceOf(FlagError);
    return (err as Error).message;
  }
  throw new Error(`expected ${argv.join(' ')} to fail`);
}

describe('command line', () => {
  it('parses standalone with loopback defaults', () => {
    const parsed = parseCommandLine(['standalone', '--config', 'examples/standalone']);
    expect(parsed.command).toBe('standalone');
    if (parsed.command !== 'standalone') return;
    expect(parsed.flags.config).toBe('examples/standalone');
    expect(parsed.flags.discoveryBindAddress).toBe('127.0.0.1:8090');
    expect(parsed.flags.metricsBindAddress).toBe('0');
    expect(parsed.flags.providerCheckIntervalMs).toBe(60_000);
    expect(parsed.flags.providerCheckTimeoutMs).toBe(15_000);
    expect(parsed.flags.gcIntervalMs).toBe(600_000);
  });

  it('parses the operator flags (docs/deployment.md)', () => {
    const parsed = parseCommandLine([
      'operator',
      '--providers-config=/etc/p.yaml',
      '--leader-elect',
      '--proxy-namespace',
      'crawl',
      '--metrics-bind-address',
      ':8443',
      '--metrics-secure',
      '--provider-check-interval',
      '30s',
      '--gc-min-age',
      '1h30m',
    ]);
    if (parsed.command !== 'operator') throw new Error('wrong command');
    expect(parsed.flags).toMatchObject({
      providersConfig: '/etc/p.yaml',
      leaderElect: true,
      proxyNamespace: 'crawl',
      metricsBindAddress: ':8443',
      metricsSecure: true,
      providerCheckIntervalMs: 30_000,
      providerCheckTimeoutMs: 15_000,
      gcMinAgeMs: 5_400_000,
      discoveryBindAddress: ':8090',
    });
  });

  it('fails fast with one line naming the problem', () => {
    expect(fails(['standalone'])).toMatch(/--config is required/);
    expect(fails(['operator'])).toMatch(/--providers-config is required/);
    expect(fails(['standalone', '-c', 'x', '--bogus'])).toMatch(/unknown flag --bogus/);
    expect(fails(['standalone', '-c', 'x', '--provider-check-interval', '5s'])).toMatch(
      /--provider-check-interval: must be 0 \(off\) or at least 10s/,
    );
    expect(
      fails(['standalone', '-c', 'x', '--provider-check-interval', '20s', '--provider-check-timeout', '30s']),
    ).toMatch(/--provider-check-timeout: must not exceed/);
    expect(fails(['standalone', '-c', 'x', '--gc-interval', 'ten'])).toMatch(
      /--gc-interval: "ten" is not a duration/,
    );
    expect(fails(['standalone', '-c', 'x', '--discovery-bind-address', 'localhost'])).toMatch(
      /--discovery-bind-address: "localhost" has no port \(want "host:port", ":port", or "0" to disable\)/,
    );
    expect(fails(['standalone', '-c', 'x', '--log-format', 'xml'])).toMatch(/--log-format/);
    expect(fails(['launch'])).toMatch(/unknown command "launch"/);
    expect(fails(['status', '-o', 'yaml'])).toMatch(/--output: "yaml"/);
    expect(parseCommandLine(['status', '--target', 'shop.example'])).toMatchObject({
      command: 'status',
      flags: { target: 'shop.example' },
    });
  });

  it('turns provider checks off with 0 and defaults the timeout from the interval', () => {
    const off = parseCommandLine(['standalone', '-c', 'x', '--provider-check-interval', '0']);
    if (off.command !== 'standalone') throw new Error('wrong command');
    expect(off.flags.providerCheckIntervalMs).toBe(0);
    const short = parseCommandLine(['standalone', '-c', 'x', '--provider-check-interval', '10s']);
    if (short.command !== 'standalone') throw new Error('wrong command');
    expect(short.flags.providerCheckTimeoutMs).toBe(10_000);
  });

  it('reads durations the way Go flags do', () => {
    expect(parseDuration('x', '500ms')).toBe(500);
    expect(parseDuration('x', '1h2m3s')).toBe(3_723_000);
    expect(parseDuration('x', '0')).toBe(0);
    expect(() => parseDuration('x', '10')).toThrow(FlagError);
    expect(() => parseDuration('x', '10s5')).toThrow(FlagError);
  });

  it('accepts Go-style --flag=true|false (and 1/0, t/f) for every boolean flag; the last one wins', () => {
    const op = (...extra: string[]) => {
      const parsed = parseCommandLine(['operator', '--providers-config', 'p.yaml', ...extra]);
      if (parsed.command !== 'operator') throw new Error('wrong command');
      return parsed.flags;
    };
    expect(op('--metrics-secure=false').metricsSecure).toBe(false);
    expect(op('--metrics-secure=true').metricsSecure).toBe(true);
    expect(op('--leader-elect=true', '--metrics-secure=FALSE')).toMatchObject({
      leaderElect: true,
      metricsSecure: false,
    });
    expect(op('--leader-elect=1').leaderElect).toBe(true);
    expect(op('--leader-elect', '--leader-elect=0').leaderElect).toBe(false);
    expect(op('--leader-elect=false', '--leader-elect').leaderElect).toBe(true);
    expect(op('--trace-health-probes=t', '--gcp-wire-full-payloads=True')).toMatchObject({
      traceHealthProbes: true,
      gcpWireFullPayloads: true,
    });
    const sa = parseCommandLine(['standalone', '-c', 'x', '--allow-empty-manifests=true']);
    if (sa.command !== 'standalone') throw new Error('wrong command');
    expect(sa.flags.allowEmptyManifests).toBe(true);
    // A value after the terminator is not a flag.
    expect(fails(['operator', '--providers-config', 'p', '--', '--leader-elect=true'])).toMatch(
      /--leader-elect=true/,
    );
  });

  it('rejects any other value of a boolean flag, naming the flag and the value', () => {
    expect(fails(['operator', '--providers-config', 'p', '--metrics-secure=yes'])).toBe(
      '--metrics-secure: "yes" is not a boolean (use true or false)',
    );
    expect(fails(['operator', '--providers-config', 'p', '--leader-elect='])).toBe(
      '--leader-elect: "" is not a boolean (use true or false)',
    );
    expect(fails(['standalone', '-c', 'x', '--trace-health-probes=on'])).toMatch(
      /--trace-health-probes: "on"/,
    );
  });

  it('turns GC off with --gc-interval 0', () => {
    const off = parseCommandLine(['standalone', '-c', 'x', '--gc-interval', '0']);
    if (off.command !== 'standalone') throw new Error('wrong command');
    expect(off.flags.gcIntervalMs).toBe(0);
    expect(helpText('standalone')).toMatch(/--gc-interval <dur> +Orphan instance sweep; 0 = off/);
  });

  it('reads the lease authority flags with their defaults, and refuses bad values by name', () => {
    const d = parseCommandLine(['operator', '--providers-config', 'p.yaml']);
    if (d.command !== 'operator') throw new Error('wrong command');
    expect(d.flags.leases).toEqual({
      checkpointIntervalMs: 5000,
      maxActiveLeases: 100_000,
      drainTimeoutMs: 600_000,
      endedLeaseBytes: 64 * 2 ** 20,
      discardLeaseState: false,
    });
    const set = parseCommandLine([
      'standalone',
      '-c',
      'x',
      '--lease-checkpoint-interval',
      '250ms',
      '--max-active-leases',
      '500',
      '--drain-timeout',
      '2m',
      '--ended-lease-memory',
      '1Gi',
      '--discard-lease-state',
    ]);
    if (set.command !== 'standalone') throw new Error('wrong command');
    expect(set.flags.leases).toEqual({
      checkpointIntervalMs: 250,
      maxActiveLeases: 500,
      drainTimeoutMs: 120_000,
      endedLeaseBytes: 2 ** 30,
      discardLeaseState: true,
    });
    const bad = (args: string[]) => () => parseCommandLine(['standalone', '-c', 'x', ...args]);
    expect(bad(['--lease-checkpoint-interval', '0'])).toThrow(
      /--lease-checkpoint-interval: must be from 100ms/,
    );
    expect(bad(['--lease-checkpoint-interval', 'soon'])).toThrow(/--lease-checkpoint-interval: "soon"/);
    expect(bad(['--max-active-leases', '0'])).toThrow(/--max-active-leases: "0" must be a whole number/);
    expect(bad(['--drain-timeout', '10'])).toThrow(/--drain-timeout: "10" is not a duration/);
    for (const size of ['64', '64MB', '0Mi', '65Gi']) {
      expect(bad(['--ended-lease-memory', size])).toThrow(
        `--ended-lease-memory: "${size}" must be a size from 1Mi to 64Gi`,
      );
    }
    expect(helpText('standalone')).toMatch(/--discard-lease-state +Start from no leases or cooldowns/);
    expect(helpText('operator')).toMatch(/--max-active-leases <n> +Live leases at most/);
  });

  it('has help for every command', () => {
    expect(parseCommandLine([])).toEqual({ command: 'help' });
    expect(parseCommandLine(['standalone', '--help'])).toEqual({ command: 'help', topic: 'standalone' });
    expect(parseCommandLine(['--version'])).toEqual({ command: 'version' });
    expect(helpText()).toMatch(/standalone --config/);
    expect(helpText('operator')).toMatch(/--leader-elect/);
    expect(helpText('operator')).toMatch(/--gc-min-age/);
  });
});

describe('gateway inspection flags (docs/gateway.md, "HTTPS inspection")', () => {
  const gateway = (...extra: string[]) => {
    const parsed = parseCommandLine(['standalone', '--config', 'examples/standalone', ...extra]);
    if (parsed.command !== 'standalone') throw new Error('not standalone');
    return parsed.flags.gateway;
  };

  it('is off by default; the deprecated blocked statuses are unset unless given', () => {
    expect(gateway()).toMatchObject({ inspect: false, inspectExclude: [] });
    expect(gateway().blockedStatuses).toBeUndefined();
    expect(gateway('--gateway-blocked-statuses', '403,503').blockedStatuses).toEqual([403, 503]);
  });

  it('reads inspection, excluded host globs and an origin CA bundle', () => {
    expect(
      gateway(
        '--gateway-inspect',
        '--gateway-inspect-exclude',
        '*.bank.example, login.example',
        '--gateway-origin-ca',
        '/etc/ca.pem',
      ),
    ).toMatchObject({
      inspect: true,
      inspectExclude: ['*.bank.example', 'login.example'],
      originCaFile: '/etc/ca.pem',
    });
  });

  it('refuses a bad glob, and exclusions without inspection', () => {
    expect(
      fails(['standalone', '--config', 'x', '--gateway-inspect', '--gateway-inspect-exclude', 'a b']),
    ).toMatch(/^--gateway-inspect-exclude: "a b" is not a host glob/);
    expect(fails(['standalone', '--config', 'x', '--gateway-inspect-exclude', '*.bank.example'])).toBe(
      '--gateway-inspect-exclude and --gateway-origin-ca need --gateway-inspect',
    );
  });
});
