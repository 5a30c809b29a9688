/**
 * The gcp provider's pure parts: provider IDs, status mapping, labels, the insert body, error
 * classification, credentials files, and the default cloud-init — whose Squid config and
 * htpasswd line are checked by the real squid parser and basic_ncsa_auth.
 */

import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { googleAuthLibrary } from 'google-gax';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import type { CreateRequest } from '../../../src/provider/contract.ts';
import { ProviderError, redact } from '../../../src/provider/errors.ts';
import { credentialsFromFile, endpointOptions } from '../../../src/provider/gcp/clients.ts';
import { classForStatus, GcpApiError, toProviderError } from '../../../src/provider/gcp/errors.ts';
import { buildFirewallRule, firewallRuleName, ruleMatches } from '../../../src/provider/gcp/firewall.ts';
import {
  buildInsertResource,
  DEFAULT_IMAGE,
  gcpSettings,
  instanceFromGce,
  parseProviderID,
  providerIDOf,
  requestProblems,
  resolveImage,
  sanitizeGcpLabelValue,
  stateFromStatus,
} from '../../../src/provider/gcp/instance.ts';
import { defaultCloudInit } from '../../../src/provider/squid/cloud-init.ts';
import { NCSA_AUTH_HELPER, squidConfig, VM_HTPASSWD } from '../../../src/provider/squid/config.ts';
import { closedPort, type Origin, startHttpOrigin } from '../../support/origins.ts';
import { basicAuthHeader, statusViaProxy, stopSquidProcess, untilSquidAnswers } from '../../support/squid.ts';

const SQUID = '/usr/sbin/squid';
const creds = { username: 'crawler-1', password: 'p w:d%&+é-Secr3t' };

function req(extra: Partial<CreateRequest> = {}): CreateRequest & { zone: string } {
  return {
    name: 'px-0a1b2c3d-9f8e7d6c',
    uid: '0a1b2c3d-1111-2222-3333-444455556666',
    namespace: 'crawl',
    proxyName: 'eu-1',
    zone: 'europe-west1-b',
    port: 3128,
    credentials: creds,
    ...extra,
  } as CreateRequest & { zone: string };
}

describe('provider IDs', () => {
  it('round-trips and accepts domain-scoped projects', () => {
    const ref = { project: 'my-proj-1', zone: 'us-central1-a', name: 'px-a1' };
    expect(parseProviderID(providerIDOf(ref))).toEqual(ref);
    expect(parseProviderID('projects/example.com:proj-x1/zones/asia-east1-c/instances/px-b').project).toBe(
      'example.com:proj-x1',
    );
  });

  it.each([
    '',
    'px-a',
    'local/px-a',
    'namespaces/ns/pods/px-a',
    'projects/my-proj-1/zones/us-central1-a/instances/',
    'projects/my-proj-1/zones/us-central1-a/instances/PX-A',
    'projects/my-proj-1/zones/us-central1-a/instances/px-a/extra',
    'projects/my-proj-1/zones//instances/px-a',
    'projects/MY/zones/us-central1-a/instances/px-a',
    'projects/my-proj-1/regions/us-central1/instances/px-a',
    '/projects/my-proj-1/zones/us-central1-a/instances/px-a',
  ])('rejects %j as Permanent', (id) => {
    let err: unknown;
    try {
      parseProviderID(id, 'gcp-main');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ProviderError);
    expect((err as ProviderError).errorClass).toBe('Permanent');
    expect((err as ProviderError).message).toContain('gcp-main: malformed providerID');
  });
});

describe('stateFromStatus', () => {
  it.each([
    ['PROVISIONING', false, 'Pending'],
    ['STAGING', false, 'Pending'],
    ['RUNNING', true, 'Running'],
    ['RUNNING', false, 'Pending'],
    ['STOPPING', true, 'Stopping'],
    ['STOPPED', false, 'Stopped'],
    ['SUSPENDING', false, 'Stopping'],
    ['SUSPENDED', false, 'Stopped'],
    ['REPAIRING', true, 'Unknown'],
    ['TERMINATED', false, 'Terminated'],
    ['SOMETHING_NEW', true, 'Unknown'],
    [undefined, false, 'Unknown'],
  ] as const)('%s (address %s) → %s', (status, hasAddress, state) => {
    expect(stateFromStatus(status, hasAddress)).toBe(state);
  });

  it('reads identity, address and creation time back from the instance', () => {
    const inst = instanceFromGce(
      {
        name: 'px-a',
        status: 'RUNNING',
        zone: 'https://www.googleapis.com/compute/v1/projects/p-roj1/zones/us-central1-a',
        labels: { 'proxy-operator-uid': 'u-1', 'proxy-operator-namespace': 'crawl' },
        creationTimestamp: '2026-11-30T04:05:06.789-08:00',
        networkInterfaces: [{ accessConfigs: [] }, { accessConfigs: [{ natIP: '203.0.113.9' }] }],
      },
      'p-roj1',
    );
    expect(inst).toEqual({
      id: 'projects/p-roj1/zones/us-central1-a/instances/px-a',
      name: 'px-a',
      state: 'Running',
      address: '203.0.113.9',
      uid: 'u-1',
      namespace: 'crawl',
      createdAt: new Date('2026-11-30T12:05:06.789Z'),
      // Where it runs: the zone, and the region it belongs to.
      location: { region: 'us-central1', zone: 'us-central1-a' },
    });
    expect(
      instanceFromGce({ name: 'x', creationTimestamp: 'garbage' }, 'p', 'z1-a').createdAt,
    ).toBeUndefined();
  });
});

describe('labels', () => {
  it.each([
    ['0a1b2c3d-1111-2222-3333-444455556666', '0a1b2c3d-1111-2222-3333-444455556666'],
    ['Crawl.Team', 'crawl_team'],
    ['a'.repeat(80), 'a'.repeat(63)],
    ['ns/with spaces', 'ns_with_spaces'],
  ])('%j → %j', (input, want) => {
    const got = sanitizeGcpLabelValue(input);
    expect(got).toBe(want);
    expect(got).toMatch(/^[a-z0-9_-]{0,63}$/);
  });
});

describe('buildInsertResource', () => {
  const s = gcpSettings({ project: 'proj-test-1' });

  it('builds a VM with defaults: e2-micro, Ubuntu, 10 GB, NAT, tags, no spot', () => {
    const r = buildInsertResource(req(), s, 'USERDATA');
    expect(r).toMatchObject({
      name: 'px-0a1b2c3d-9f8e7d6c',
      machineType: 'zones/europe-west1-b/machineTypes/e2-micro',
      labels: { 'proxy-operator-managed': 'true', 'proxy-operator-namespace': 'crawl' },
      tags: { items: ['egress-proxy'] },
      disks: [
        { boot: true, autoDelete: true, initializeParams: { sourceImage: DEFAULT_IMAGE, diskSizeGb: '10' } },
      ],
      networkInterfaces: [
        { network: 'global/networks/default', accessConfigs: [{ type: 'ONE_TO_ONE_NAT' }] },
      ],
      metadata: { items: [{ key: 'user-data', value: 'USERDATA' }] },
    });
    expect(r).not.toHaveProperty('scheduling');
    expect(r).not.toHaveProperty('serviceAccounts');
  });

  it('honours network paths, subnetwork, tag, spot and a full machine type', () => {
    const r = buildInsertResource(
      req({ machineType: 'zones/europe-west1-b/machineTypes/n2-standard-2' }),
      gcpSettings({
        project: 'proj-test-1',
        network: 'projects/host-proj/global/networks/shared',
        subnetwork: 'projects/host-proj/regions/europe-west1/subnetworks/px',
        spot: true,
        diskSizeGb: 30,
        firewall: { sourceRanges: ['10.0.0.0/8'], targetTag: 'crawl-px' },
      }),
      'U',
    );
    expect(r.machineType).toBe('zones/europe-west1-b/machineTypes/n2-standard-2');
    expect(r.networkInterfaces[0]).toMatchObject({
      network: 'projects/host-proj/global/networks/shared',
      subnetwork: 'projects/host-proj/regions/europe-west1/subnetworks/px',
    });
    expect(r.tags).toEqual({ items: ['crawl-px'] });
    expect(r.scheduling).toMatchObject({ provisioningModel: 'SPOT', instanceTerminationAction: 'DELETE' });
    expect(r.disks[0]!.initializeParams.diskSizeGb).toBe('30');
  });

  it.each([
    [undefined, {}, DEFAULT_IMAGE],
    [undefined, { default: 'projects/x/global/images/y' }, 'projects/x/global/images/y'],
    ['squid', { squid: 'projects/x/global/images/squid-1' }, 'projects/x/global/images/squid-1'],
    [
      'projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts',
      {},
      'projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts',
    ],
    [
      'https://www.googleapis.com/compute/v1/projects/x/global/images/y',
      {},
      'https://www.googleapis.com/compute/v1/projects/x/global/images/y',
    ],
  ])('image %j with %j → %s', (image, images, want) => {
    expect(resolveImage(image, images)).toBe(want);
  });

  it('rejects unknown images and machine types naming the field', () => {
    expect(() => resolveImage('ubuntu', { squid: 'projects/x/global/images/s' })).toThrow(
      /placement\.image "ubuntu".*have: squid/,
    );
    expect(() => resolveImage('http://example.com/x.img', {})).toThrow(/placement\.image/);
    expect(() => buildInsertResource(req({ machineType: 'E2 Micro' }), s, 'U')).toThrow(
      /placement\.machineType/,
    );
  });

  it('lists every request problem, naming fields and never values of credentials', () => {
    const problems = requestProblems(
      req({
        zone: undefined,
        name: 'Bad_Name',
        port: 0,
        credentials: { username: 'a:b', password: 'secret' },
      }),
    );
    expect(problems.join('\n')).toMatch(/placement\.zone is required/);
    expect(problems.join('\n')).toMatch(/name "Bad_Name"/);
    expect(problems.join('\n')).toMatch(/port 0/);
    expect(problems.join('\n')).toMatch(/credentials\.username/);
    expect(problems.join('\n')).not.toContain('secret');
    expect(requestProblems(req({ zone: 'not a zone' }))[0]).toMatch(/placement\.zone "not a zone"/);
    expect(requestProblems(req())).toEqual([]);
  });
});

describe('firewall rule', () => {
  it('admits the port from the ranges for the tag only', () => {
    const s = gcpSettings({ project: 'proj-test-1', firewall: { sourceRanges: ['203.0.113.0/24'] } });
    const rule = buildFirewallRule(s, 8080, ['203.0.113.0/24']);
    expect(rule).toMatchObject({
      name: 'egress-proxy-tcp-8080',
      direction: 'INGRESS',
      allowed: [{ IPProtocol: 'tcp', ports: ['8080'] }],
      targetTags: ['egress-proxy'],
    });
    expect(ruleMatches({ sourceRanges: ['203.0.113.0/24'], targetTags: ['egress-proxy'] }, rule)).toBe(true);
    expect(ruleMatches({ sourceRanges: ['0.0.0.0/0'], targetTags: ['egress-proxy'] }, rule)).toBe(false);
    const long = firewallRuleName('a'.repeat(63), 65535);
    expect(long.length).toBeLessThanOrEqual(63);
    expect(long).toMatch(/^[a-z]([-a-z0-9]*[a-z0-9])?$/);
  });

  it('is on only with a firewall block that is not disabled', () => {
    expect(gcpSettings({ project: 'p-roj1' }).firewall).toBeUndefined();
    expect(
      gcpSettings({ project: 'p-roj1', firewall: { enabled: false, sourceRanges: ['1.2.3.0/24'] } }).firewall,
    ).toBeUndefined();
    expect(gcpSettings({ project: 'p-roj1', firewall: { sourceRanges: ['1.2.3.0/24'] } }).firewall).toEqual({
      sourceRanges: ['1.2.3.0/24'],
    });
  });
});

describe('error classes', () => {
  it.each([
    [404, undefined, 'NotFound'],
    [403, 'QUOTA_EXCEEDED', 'QuotaExceeded'],
    [403, 'quotaExceeded', 'QuotaExceeded'],
    [403, 'rateLimitExceeded', 'QuotaExceeded'],
    [429, 'RATE_LIMIT_EXCEEDED', 'QuotaExceeded'],
    [403, 'ZONE_RESOURCE_POOL_EXHAUSTED', 'QuotaExceeded'],
    [403, 'forbidden', 'Permanent'],
    [403, undefined, 'Permanent'],
    [400, 'invalid', 'Permanent'],
    [401, undefined, 'Permanent'],
    [409, 'resourceNotReady', 'Transient'],
    [429, undefined, 'Transient'],
    [500, undefined, 'Transient'],
    [503, undefined, 'Transient'],
    [undefined, undefined, 'Transient'],
  ] as const)('HTTP %s %s → %s', (status, reason, cls) => {
    expect(classForStatus(status, reason)).toBe(cls);
  });

  it('never keeps the client error (it holds the request config) as cause', () => {
    const gax = Object.assign(new Error('boom'), {
      code: 7,
      httpStatusCode: 403,
      cause: { config: { headers: { authorization: 'Bearer tok' } } },
    });
    const err = toProviderError(gax, { op: 'get', provider: 'g' });
    expect(err.cause).toBeInstanceOf(GcpApiError);
    expect(JSON.stringify(err.cause)).not.toContain('Bearer');
    expect(redact('a SECRET b SECRET', ['SECRET', 'ab'])).toBe('a [redacted] b [redacted]');
  });
});

describe('endpointOptions', () => {
  it.each([
    [undefined, {}],
    ['compute.example.com', { apiEndpoint: 'compute.example.com' }],
    ['127.0.0.1:8080', { apiEndpoint: '127.0.0.1', port: 8080 }],
    ['http://127.0.0.1:9000', { apiEndpoint: '127.0.0.1', port: 9000, protocol: 'http' }],
    [
      'https://private.googleapis.com',
      { apiEndpoint: 'private.googleapis.com', port: 443, protocol: 'https' },
    ],
  ])('%j → %j', (input, want) => {
    expect(endpointOptions(input)).toEqual(want);
  });
});

describe('credentialsFromFile', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'gcp-keys-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, content: unknown) => {
    const p = join(dir, name);
    writeFileSync(p, typeof content === 'string' ? content : JSON.stringify(content));
    return p;
  };

  it('builds a JWT client from a service-account key', async () => {
    const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const key = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    const client = await credentialsFromFile(
      file('sa.json', {
        type: 'service_account',
        client_email: 'op@p.iam.gserviceaccount.com',
        private_key: key,
      }),
    );
    expect(client).toBeInstanceOf(googleAuthLibrary.JWT);
    expect((client as InstanceType<typeof googleAuthLibrary.JWT>).email).toBe('op@p.iam.gserviceaccount.com');
  });

  it.each([
    ['missing', undefined, 'Transient', /not readable \(ENOENT\)/],
    ['not json', '{', 'Permanent', /not JSON/],
    ['incomplete key', { type: 'service_account', client_email: 'a@b' }, 'Permanent', /private_key/],
    ['unknown type', { type: 'impersonated_service_account' }, 'Permanent', /not supported/],
  ])('%s → %s', async (name, content, cls, msg) => {
    const p = content === undefined ? join(dir, 'absent.json') : file(`${name}.json`, content);
    const err = await credentialsFromFile(p).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((err as ProviderError).errorClass).toBe(cls);
    expect((err as ProviderError).message).toMatch(msg);
    expect((err as ProviderError).message).toContain('gcp.credentialsFile');
  });
});

describe('default cloud-init', () => {
  const ci = defaultCloudInit(req({ port: 8443 }), { salt: 'Qz9./abc' });
  const doc = parse(ci) as {
    packages: string[];
    write_files: Array<{ path: string; content: string; permissions: string }>;
    runcmd: string[][];
  };
  const squidConf = doc.write_files.find((f) => f.path.endsWith('squid.conf'))!.content;
  const htpasswd = doc.write_files.find((f) => f.path === VM_HTPASSWD)!.content;

  it('is a #cloud-config installing Squid with our config, auth file and a restart', () => {
    expect(ci.startsWith('#cloud-config\n')).toBe(true);
    expect(doc.packages).toEqual(['squid']);
    expect(squidConf).toBe(squidConfig({ profile: 'vm', port: 8443 }));
    expect(squidConf.split('\n')).toEqual(
      expect.arrayContaining([
        'http_port 8443',
        'max_filedescriptors 4096',
        `auth_param basic program ${NCSA_AUTH_HELPER} ${VM_HTPASSWD}`,
        'http_access allow authed',
        'http_access deny all',
        'access_log daemon:/var/log/squid/access.log squid',
        'pid_filename /run/squid.pid',
      ]),
    );
    expect(squidConf).not.toContain('/dev/stdout');
    expect(htpasswd).toMatch(/^crawler-1:\$apr1\$Qz9\.\/abc\$[./0-9A-Za-z]{22}\n$/);
    expect(ci).not.toContain(creds.password);
    expect(doc.runcmd.map((c) => c.join(' '))).toEqual(
      expect.arrayContaining([`chgrp proxy ${VM_HTPASSWD}`, 'systemctl restart squid']),
    );
  });

  it('its squid.conf is accepted by the real squid parser', () => {
    const dir = mkdtempSync(join(tmpdir(), 'gcp-squidconf-'));
    try {
      writeFileSync(join(dir, 'squid.conf'), squidConf);
      const out = execFileSync(SQUID, ['-k', 'parse', '-f', join(dir, 'squid.conf')], { stdio: 'pipe' });
      expect(out.toString()).not.toMatch(/FATAL|ERROR/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('its htpasswd line is accepted by the real basic_ncsa_auth, and wrong passwords are not', () => {
    const dir = mkdtempSync(join(tmpdir(), 'gcp-htpasswd-'));
    try {
      writeFileSync(join(dir, 'htpasswd'), htpasswd);
      const esc = (s: string) => encodeURIComponent(s);
      const answer = execFileSync(NCSA_AUTH_HELPER, [join(dir, 'htpasswd')], {
        input: `${esc(creds.username)} ${esc(creds.password)}\n${esc(creds.username)} ${esc('wrong')}\n`,
      }).toString();
      expect(
        answer
          .split('\n')
          .slice(0, 2)
          .map((l) => l.split(' ')[0]),
      ).toEqual(['OK', 'ERR']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * The default cloud-init's files run by a real Squid as the `proxy` user, with the VM paths
 * moved into a temp dir: the daemon access log and cache.log work, and only the right
 * credentials get through.
 */
describe('default cloud-init, run for real', () => {
  let child: ChildProcess;
  let dir: string;
  let port: number;
  let origin: Origin;
  const service = `gbt${process.pid}${randomBytes(3).toString('hex')}`;

  beforeAll(async () => {
    origin = await startHttpOrigin({ defaultStatus: 204 });
    dir = mkdtempSync(join(tmpdir(), 'gcp-squid-'));
    port = await closedPort();
    // The origin is on loopback, which the default egress policy refuses: open exactly it.
    const egress = resolveEgressPolicy({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [origin.port] });
    const doc = parse(defaultCloudInit(req({ port }), { egress })) as {
      write_files: Array<{ path: string; content: string }>;
    };
    const content = (suffix: string) => doc.write_files.find((f) => f.path.endsWith(suffix))!.content;
    const conf = content('squid.conf')
      .replace(`http_port ${port}`, `http_port 127.0.0.1:${port}`)
      .replaceAll(`${VM_HTPASSWD}`, join(dir, 'htpasswd'))
      .replaceAll('/var/log/squid/', `${dir}/`)
      .replace('/run/squid.pid', join(dir, 'squid.pid'))
      .replace('coredump_dir /var/spool/squid', `coredump_dir ${dir}`);
    writeFileSync(join(dir, 'squid.conf'), conf);
    writeFileSync(join(dir, 'htpasswd'), content('htpasswd'));
    const asProxy = process.getuid?.() === 0;
    if (asProxy) for (const f of ['', 'squid.conf', 'htpasswd']) chownSync(join(dir, f), 13, 13);
    chmodSync(dir, 0o755);
    child = spawn(SQUID, ['-N', '-n', service, '-f', join(dir, 'squid.conf')], {
      stdio: 'ignore',
      ...(asProxy ? { uid: 13, gid: 13 } : {}),
    });
    await untilSquidAnswers(child, port, () => '', dir);
  });

  afterAll(async () => {
    await stopSquidProcess(child, dir, service);
    await origin?.close();
  });

  const viaSquid = (auth?: string) => statusViaProxy(port, `${origin.baseUrl}/status/200`, auth);
  const basic = basicAuthHeader;

  it('forwards with the right credentials, answers 407 otherwise, and logs to files', async () => {
    expect(await viaSquid(basic(creds.username, creds.password))).toBe(200);
    expect(await viaSquid()).toBe(407);
    expect(await viaSquid(basic(creds.username, 'nope'))).toBe(407);
    await expect
      .poll(
        () => (existsSync(join(dir, 'access.log')) ? readFileSync(join(dir, 'access.log'), 'utf8') : ''),
        {
          timeout: 5000,
        },
      )
      .toMatch(/TCP_DENIED\/407/);
    expect(readFileSync(join(dir, 'cache.log'), 'utf8')).toMatch(/With 4096 file descriptors available/);
  });
});
