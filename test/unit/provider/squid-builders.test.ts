import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { defaultCloudInit } from '../../../src/provider/squid/cloud-init.ts';
import { squidConfig } from '../../../src/provider/squid/config.ts';

/**
 * The fixtures pin the bytes every provider installs (first written by the per-provider builders
 * the shared squid/ module replaced). They change only on purpose: the default egress policy
 * added its http_access rules, the origin-failure header its two lines (docs/api.md); anything else
 * showing up here is an accident.
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
