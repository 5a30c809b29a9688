import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { defaultCloudInit } from '../../../src/provider/squid/cloud-init.ts';
import { squidConfig } from '../../../src/provider/squid/config.ts';

/**
 * The fixtures pin the bytes every provider installs (first written by the per-provider builders
 * the shared squid/ module replaced). They change only on purpose: the default egress policy
 * added its http_access rules, the origin-failure header its two lines (docs/lease-api.md), the
 * default deny list its special ranges (192.0.0.0/24, 224.0.0.0/3, ff00::/8, 64:ff9b:1::/48) and
 * the NAT64/6to4 images of every denied IPv4 range (docs/configuration.md); anything else
 * showing up here is an accident. The operator's own listeners render only when the providers
 * are told of them (the operator-endpoint cases below), so these files carry none.
 */
const fixture = (name: string) =>
  readFileSync(new URL(`../../support/fixtures/provider/squid/${name}`, import.meta.url), 'utf8');

describe('squidConfig keeps every provider byte-identical', () => {
  it('pod profile (kubernetes provider)', () => {
    expect(squidConfig({ profile: 'pod', port: 3128 })).toBe(fixture('pod-3128.conf'));
    expect(squidConfig({ profile: 'pod', port: 8080, maxFileDescriptors: 1024 })).toBe(
      fixture('pod-8080-fds1024.conf'),
    );
    expect(
      squidConfig({
        profile: 'pod',
        port: 3128,
        listenAddress: '127.0.0.1',
        htpasswdPath: '/tmp/t/htpasswd',
        authHelper: '/opt/auth',
      }),
    ).toBe(fixture('pod-listen-paths.conf'));
  });

  it('vm profile (gcp and kvm default cloud-init)', () => {
    expect(squidConfig({ profile: 'vm', port: 8443 })).toBe(fixture('vm-8443.conf'));
    expect(squidConfig({ profile: 'vm', port: 3128, maxFileDescriptors: 2048 })).toBe(
      fixture('vm-3128-fds2048.conf'),
    );
  });

  it('the default cloud-init around it', () => {
    const req = {
      port: 8443,
      credentials: { username: 'crawler-1', password: 'pw-Secret-1' },
      namespace: 'crawl',
      proxyName: 'p-1',
    };
    expect(defaultCloudInit(req, { salt: 'Qz9./abc' })).toBe(fixture('cloud-init-8443.yaml'));
    expect(defaultCloudInit({ ...req, port: 3128 }, { salt: 'Qz9./abc', maxFileDescriptors: 2048 })).toBe(
      fixture('cloud-init-3128-fds2048.yaml'),
    );
  });
});

describe("the operator's own listeners in squid.conf", () => {
  const operator = {
    addresses: ['10.1.2.3', '::ffff:10.1.2.4', 'fd00::5'],
    ports: [8080, 8081],
    probePort: 8090,
  };

  it('deny (operator address AND port) after authentication, before every other rule, probe excepted', () => {
    const conf = squidConfig({
      profile: 'pod',
      port: 3128,
      operator: { ...operator, ports: [8080, 8081, 8090] },
    });
    const lines = conf.split('\n');
    expect(lines).toContain('acl operator_dst dst 10.1.2.3/32 10.1.2.4/32 fd00::5/128');
    expect(lines).toContain('acl operator_ports port 8080 8081 8090');
    expect(lines).toContain(
      'acl operator_probe all-of operator_probe_port operator_probe_method operator_probe_path',
    );
    const deny = lines.indexOf('http_access deny operator_dst operator_ports !operator_probe');
    expect(deny).toBeGreaterThan(lines.indexOf('http_access deny !authed'));
    expect(deny).toBeLessThan(lines.indexOf('http_access deny egress_denied_dst'));
    expect(deny).toBeLessThan(lines.indexOf('http_access allow authed'));
  });

  it('without a probe port the rule has no exception; with nothing known nothing is rendered', () => {
    const conf = squidConfig({
      profile: 'vm',
      port: 3128,
      operator: { addresses: ['10.1.2.3'], ports: [9090] },
    });
    expect(conf).toContain('\nhttp_access deny operator_dst operator_ports\n');
    expect(conf).not.toContain('operator_probe');
    for (const none of [
      { addresses: [], ports: [8080] },
      { addresses: ['10.1.2.3'], ports: [] },
    ]) {
      expect(squidConfig({ profile: 'pod', port: 3128, operator: none })).toBe(fixture('pod-3128.conf'));
    }
  });

  it('refuses an address or port that is not one, naming the field', () => {
    expect(() =>
      squidConfig({
        profile: 'pod',
        port: 3128,
        operator: { addresses: ['10.0.0.1\nhttp_access allow all'], ports: [1] },
      }),
    ).toThrow(/^operator\.addresses: .* is not an IP address$/);
    expect(() =>
      squidConfig({ profile: 'pod', port: 3128, operator: { addresses: ['10.0.0.1'], ports: [70000] } }),
    ).toThrow(/^operator\.ports: 70000 is not a port/);
  });
});

describe('the renderers refuse what would inject a line, whatever validated it before', () => {
  it('squidConfig: a line break or space in a spliced value, a bad port or range, naming the field', () => {
    expect(() =>
      squidConfig({ profile: 'pod', port: 3128, listenAddress: '127.0.0.1\nhttp_access allow all' }),
    ).toThrow(/^listenAddress: must be non-empty, without whitespace or control characters$/);
    expect(() => squidConfig({ profile: 'pod', port: 3128, htpasswdPath: '/tmp/a b' })).toThrow(
      /^htpasswdPath:/,
    );
    expect(() => squidConfig({ profile: 'pod', port: 3128, authHelper: '/opt/auth\r' })).toThrow(
      /^authHelper:/,
    );
    const egress = { deniedCIDRs: ['10.0.0.0/8'], connectPorts: [443], httpPorts: [80] };
    expect(() =>
      squidConfig({ profile: 'pod', port: 3128, egress: { ...egress, connectPorts: [443, 0] } }),
    ).toThrow(/^egress\.connectPorts: 0 is not a port/);
    expect(() =>
      squidConfig({
        profile: 'pod',
        port: 3128,
        egress: { ...egress, deniedCIDRs: ['10.0.0.0/8\nhttp_access allow all'] },
      }),
    ).toThrow(/^egress\.deniedCIDRs: .* is not a CIDR$/);
    expect(squidConfig({ profile: 'pod', port: 3128, egress })).toContain(
      'acl egress_denied_dst dst 10.0.0.0/8\n',
    );
  });

  it('defaultCloudInit: a control character in the names of its header comment', () => {
    const req = {
      port: 8443,
      credentials: { username: 'u', password: 'p' },
      namespace: 'crawl',
      proxyName: 'web\nruncmd: [[reboot]]',
    };
    expect(() => defaultCloudInit(req, { salt: 'Qz9./abc' })).toThrow(
      /^proxyName: must not contain control characters$/,
    );
    expect(() => defaultCloudInit({ ...req, proxyName: 'web', namespace: 'a\u0007' })).toThrow(/^namespace:/);
    expect(defaultCloudInit({ ...req, proxyName: 'web' }, { salt: 'Qz9./abc' })).toMatch(/^#cloud-config\n/);
  });
});
