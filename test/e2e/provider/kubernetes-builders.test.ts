import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApiException, type V1Pod } from '@kubernetes/client-node';
import { fetch, ProxyAgent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CreateRequest } from '../../../src/provider/contract.ts';
import { classify } from '../../../src/provider/errors.ts';
import { checkReason, classForStatus, toProviderError } from '../../../src/provider/kubernetes/errors.ts';
import { operatorNamespace } from '../../../src/provider/kubernetes/index.ts';
import {
  buildPod,
  buildSecret,
  DEFAULT_SQUID_IMAGE,
  instanceFromPod,
  parseProviderID,
  podSettings,
  providerIDOf,
  sanitizeLabelValue,
  stateFromPod,
} from '../../../src/provider/kubernetes/pod.ts';
import {
  NCSA_AUTH_HELPER,
  type SquidConfigOptions,
  squidConfig,
} from '../../../src/provider/squid/config.ts';
import { htpasswdLine, md5crypt } from '../../../src/provider/squid/htpasswd.ts';
import { closedPort, type Origin, startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { basicAuthHeader, statusViaProxy, stopSquidProcess, untilSquidAnswers } from '../../support/squid.ts';

const SQUID = '/usr/sbin/squid';
const creds = { username: 'crawler-1', password: 'p w:d%&+é-Secr3t' };

function req(extra: Partial<CreateRequest> = {}): CreateRequest {
  return {
    name: 'px-0a1b2c3d-9f8e7d6c',
    uid: '0a1b2c3d-1111-2222-3333-444455556666',
    namespace: 'crawl',
    proxyName: 'eu-1',
    port: 3128,
    credentials: creds,
    ...extra,
  };
}

const settings = podSettings(
  {
    namespace: 'proxies',
    maxFileDescriptors: 2048,
    resourceProfiles: { small: { cpu: '100m', memory: '128Mi' }, tiny: { memory: '64Mi' } },
  },
  'operator-ns',
);

/** Squid's helper protocol: both fields RFC 1738-escaped, space separated. */
const helperLine = (u: string, p: string) => `${encodeURIComponent(u)} ${encodeURIComponent(p)}\n`;

function runHelper(htpasswdFile: string, lines: string): string {
  return execFileSync(NCSA_AUTH_HELPER, [htpasswdFile], { input: lines }).toString();
}

describe('htpasswd (APR1 MD5-crypt)', () => {
  it('matches the reference implementation byte for byte', () => {
    expect(md5crypt('pass', 'abcdefgh')).toBe('$apr1$abcdefgh$rK/lObuciIG5ziaV8BdHR/');
    expect(md5crypt('pass', 'abcdefgh', '$1$')).toBe('$1$abcdefgh$1s0bv7.OjNizlrMAOIQD7.');
    expect(md5crypt('a much longer password with ünïcode 0123456789', 'x/y.Z09', '$1$')).toBe(
      '$1$x/y.Z09$R2ZO/pu4qKJPWOeBP0vKu0',
    );
    for (let i = 0; i < 5; i++) {
      const pw = randomBytes(12).toString('base64url');
      // On stdin: a password starting with '-' would read as an option on the command line.
      const ref = execFileSync('openssl', ['passwd', '-apr1', '-salt', 'Qz9./abc', '-stdin'], {
        input: `${pw}\n`,
      })
        .toString()
        .trim();
      expect(md5crypt(pw, 'Qz9./abc')).toBe(ref);
    }
  });

  it('is accepted by the real basic_ncsa_auth, and wrong passwords are not', () => {
    const dir = mkdtempSync(join(tmpdir(), 'htpasswd-'));
    try {
      const file = join(dir, 'htpasswd');
      const random = { username: 'u', password: randomBytes(24).toString('base64url') };
      writeFileSync(file, htpasswdLine(creds) + htpasswdLine(random));
      const out = runHelper(
        file,
        helperLine(creds.username, creds.password) +
          helperLine(creds.username, 'wrong') +
          helperLine(random.username, random.password) +
          helperLine('nobody', creds.password),
      )
        .trim()
        .split('\n')
        .map((l) => l.trim().split(' ')[0]);
      expect(out).toEqual(['OK', 'ERR', 'OK', 'ERR']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses usernames and passwords that would break the file, without quoting them', () => {
    expect(() => htpasswdLine({ username: 'a:b', password: 'x' })).toThrow(/credentials\.username/);
    expect(() => htpasswdLine({ username: 'ok', password: 'qq\nzz' })).toThrow(/credentials\.password/);
    expect(() => htpasswdLine({ username: 'ok', password: 'qq\nzz' })).not.toThrow(/zz/);
  });
});

/** The pod profile, as the kubernetes provider builds it. */
const podConfig = (o: Omit<SquidConfigOptions, 'profile'>) => squidConfig({ profile: 'pod', ...o });

describe('squidConfig, pod profile', () => {
  it('requires auth for everything, denies the rest, and sets max_filedescriptors explicitly', () => {
    const conf = podConfig({ port: 3128 });
    const lines = conf.split('\n');
    expect(lines).toContain('http_port 3128');
    // Squid sizes memory by the fd limit; inheriting a container's huge limit OOM-kills it.
    expect(lines).toContain('max_filedescriptors 4096');
    expect(podConfig({ port: 8080, maxFileDescriptors: 1024 }).split('\n')).toContain(
      'max_filedescriptors 1024',
    );
    expect(lines).toContain(`auth_param basic program ${NCSA_AUTH_HELPER} /etc/squid-operator/htpasswd`);
    expect(lines).toContain('acl authed proxy_auth REQUIRED');
    const access = lines.filter((l) => l.startsWith('http_access'));
    // Authentication first, then the egress policy (403s), then the one allow.
    expect(access).toEqual([
      'http_access deny !authed',
      'http_access deny CONNECT !egress_connect_ports',
      'http_access deny !CONNECT !egress_http',
      'http_access deny !CONNECT !egress_http_ports',
      'http_access deny egress_denied_dst',
      'http_access allow authed',
      'http_access deny all',
    ]);
    expect(lines).toContain('cache deny all');
    expect(lines).toContain('access_log stdio:/dev/stdout');
    expect(() => podConfig({ port: 0 })).toThrow(/port/);
    expect(() => podConfig({ port: 3128, maxFileDescriptors: 10 })).toThrow(/maxFileDescriptors/);
  });

  it('is accepted by the real squid parser', () => {
    const dir = mkdtempSync(join(tmpdir(), 'squidconf-'));
    try {
      writeFileSync(join(dir, 'squid.conf'), podConfig({ port: 3128, htpasswdPath: join(dir, 'htpasswd') }));
      writeFileSync(join(dir, 'htpasswd'), htpasswdLine(creds));
      const out = execFileSync(SQUID, ['-k', 'parse', '-f', join(dir, 'squid.conf')], { stdio: 'pipe' });
      expect(out.toString()).not.toMatch(/FATAL|ERROR/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * The generated config and htpasswd run by a real Squid as the unprivileged `proxy` user (as in
 * the Pod), logging to its stdout: only the right credentials get through.
 */
describe('generated Squid config, run for real', () => {
  let child: ChildProcess;
  let dir: string;
  let port: number;
  let origin: Origin;
  let tls: Origin;
  const service = `kbt${process.pid}${randomBytes(3).toString('hex')}`;

  beforeAll(async () => {
    origin = await startHttpOrigin({ defaultStatus: 204 });
    tls = await startTlsOrigin({ defaultStatus: 204 });
    dir = mkdtempSync(join(tmpdir(), 'kube-squid-'));
    port = await closedPort();
    // The provider config's egress policy reaches the Pod's squid.conf: the test origins are
    // on loopback, which the default policy refuses (test/e2e/provider/squid-egress.test.ts).
    const lab = podSettings(
      {
        maxFileDescriptors: 2048,
        egressPolicy: { allowCIDRs: ['127.0.0.1/32'], connectPorts: [tls.port, origin.port] },
      },
      'operator-ns',
    );
    const secret = buildSecret(req({ port }), lab);
    const conf = Buffer.from(secret.data!['squid.conf']!, 'base64')
      .toString()
      .replace(`http_port ${port}`, `http_port 127.0.0.1:${port}`)
      .replaceAll('/etc/squid-operator/', `${dir}/`);
    writeFileSync(join(dir, 'squid.conf'), conf);
    writeFileSync(join(dir, 'htpasswd'), Buffer.from(secret.data!.htpasswd!, 'base64'));
    writeFileSync(join(dir, 'stdout'), '');
    writeFileSync(join(dir, 'stderr'), '');
    const asProxy = process.getuid?.() === 0;
    if (asProxy)
      for (const f of ['', 'squid.conf', 'htpasswd', 'stdout', 'stderr']) chownSync(join(dir, f), 13, 13);
    chmodSync(dir, 0o755);
    child = spawn(SQUID, ['-N', '-n', service, '-f', join(dir, 'squid.conf')], {
      stdio: ['ignore', openSync(join(dir, 'stdout'), 'a'), openSync(join(dir, 'stderr'), 'a')],
      ...(asProxy ? { uid: 13, gid: 13 } : {}),
    });
    await untilSquidAnswers(child, port, () => readFileSync(join(dir, 'stderr'), 'utf8').slice(-2000), dir);
  });

  afterAll(async () => {
    await stopSquidProcess(child, dir, service);
    await Promise.all([origin?.close(), tls?.close()]);
  });

  const viaSquid = (auth?: string) => statusViaProxy(port, `${origin.baseUrl}/status/200`, auth);
  const basic = basicAuthHeader;

  it('forwards with the right credentials and answers 407 otherwise', async () => {
    expect(await viaSquid(basic(creds.username, creds.password))).toBe(200);
    expect(await viaSquid()).toBe(407);
    expect(await viaSquid(basic(creds.username, 'nope'))).toBe(407);
    const dispatcher = new ProxyAgent({
      uri: `http://127.0.0.1:${port}`,
      token: basic(creds.username, creds.password),
      requestTls: { ca: testPki().caCert },
    });
    try {
      expect((await fetch(`${tls.baseUrl}/status/204`, { dispatcher })).status).toBe(204);
    } finally {
      await dispatcher.close();
    }
    // Logs land on the container's stdout/stderr, and the fd limit is the configured one.
    await expect
      .poll(() => readFileSync(join(dir, 'stdout'), 'utf8'), { timeout: 5000 })
      .toMatch(/TCP_DENIED\/407/);
    expect(readFileSync(join(dir, 'stderr'), 'utf8')).toMatch(/With 2048 file descriptors available/);
  });
});

describe('buildPod', () => {
  it('names, labels and annotates the Pod for the Proxy', () => {
    const pod = buildPod(req(), settings);
    expect(pod.metadata?.name).toBe('px-0a1b2c3d-9f8e7d6c');
    expect(pod.metadata?.namespace).toBe('proxies');
    expect(pod.metadata?.labels).toMatchObject({
      'proxy-operator-managed': 'true',
      'proxy-operator-uid': '0a1b2c3d-1111-2222-3333-444455556666',
      'proxy-operator-namespace': 'crawl',
    });
    expect(pod.metadata?.annotations?.['crawl.example.com/proxy']).toBe('crawl/eu-1');
  });

  it('runs the default image non-root with a TCP readiness probe on the port and the config Secret mounted', () => {
    const pod = buildPod(req({ port: 8080 }), settings);
    const c = pod.spec!.containers[0]!;
    expect(c.image).toBe(DEFAULT_SQUID_IMAGE);
    expect(DEFAULT_SQUID_IMAGE).toMatch(/^ubuntu\/squid:/);
    expect(c.ports).toEqual([{ name: 'proxy', containerPort: 8080, protocol: 'TCP' }]);
    expect(c.readinessProbe?.tcpSocket?.port).toBe(8080);
    expect(pod.spec?.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 13 });
    expect(c.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
    });
    expect(pod.spec?.volumes?.find((v) => v.secret)?.secret?.secretName).toBe(pod.metadata?.name);
    expect(c.command?.join(' ')).toContain('/etc/squid-operator/squid.conf');
    expect(pod.spec?.automountServiceAccountToken).toBe(false);
    expect(buildPod(req({ image: 'registry.example/squid:7' }), settings).spec!.containers[0]!.image).toBe(
      'registry.example/squid:7',
    );
  });

  it('maps placement: machineType to a resource profile, zone to node affinity', () => {
    const pod = buildPod(req({ machineType: 'small', zone: 'europe-west1-b' }), settings);
    expect(pod.spec!.containers[0]!.resources).toEqual({
      requests: { cpu: '100m', memory: '128Mi' },
      limits: { memory: '128Mi' },
    });
    expect(
      pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms,
    ).toEqual([
      {
        matchExpressions: [
          { key: 'topology.kubernetes.io/zone', operator: 'In', values: ['europe-west1-b'] },
        ],
      },
    ]);
    const custom = podSettings({ zoneLabel: 'example.com/rack' }, 'ns');
    expect(
      buildPod(req({ zone: 'r1' }), custom).spec?.affinity?.nodeAffinity
        ?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms[0]?.matchExpressions?.[0]?.key,
    ).toBe('example.com/rack');
    const plain = buildPod(req(), settings);
    expect(plain.spec?.affinity).toBeUndefined();
    expect(plain.spec!.containers[0]!.resources).toEqual({});
    expect(podSettings({}, 'operator-ns').namespace).toBe('operator-ns');
    expect(operatorNamespace({ POD_NAMESPACE: 'ops' })).toBe('ops');
  });

  it('rejects an unknown machineType and invalid names as Permanent, naming the field', () => {
    const err = (() => {
      try {
        buildPod(req({ machineType: 'huge' }), settings);
      } catch (e) {
        return e;
      }
    })();
    expect(classify(err)).toBe('Permanent');
    expect((err as Error).message).toMatch(/placement\.machineType "huge".*small, tiny/);
    expect(() => buildPod(req({ name: 'Not_A_DNS_Label' }), settings)).toThrow(/name/);
    expect(() => buildPod(req({ port: 70000 }), settings)).toThrow(/port/);
  });

  it('keeps credentials out of the Pod; the Secret carries them hashed', () => {
    const pod = JSON.stringify(buildPod(req(), settings));
    expect(pod).not.toContain(creds.password);
    const secret = buildSecret(req(), settings, { name: 'px-0a1b2c3d-9f8e7d6c', uid: 'pod-uid' });
    expect(JSON.stringify(secret)).not.toContain(creds.password);
    expect(secret.metadata?.name).toBe('px-0a1b2c3d-9f8e7d6c');
    expect(secret.metadata?.labels?.['proxy-operator-managed']).toBe('true');
    expect(secret.metadata?.ownerReferences).toEqual([
      { apiVersion: 'v1', kind: 'Pod', name: 'px-0a1b2c3d-9f8e7d6c', uid: 'pod-uid', controller: false },
    ]);
    const line = Buffer.from(secret.data!.htpasswd!, 'base64').toString();
    const [user, hash] = line.trim().split(':') as [string, string];
    expect(user).toBe(creds.username);
    const salt = hash.split('$')[2]!;
    expect(md5crypt(creds.password, salt)).toBe(hash);
    expect(Buffer.from(secret.data!['squid.conf']!, 'base64').toString()).toBe(
      podConfig({ port: 3128, maxFileDescriptors: 2048 }),
    );
  });

  it('sanitizes label values', () => {
    expect(sanitizeLabelValue('crawl')).toBe('crawl');
    expect(sanitizeLabelValue('-a/b c.')).toBe('a-b-c');
    expect(sanitizeLabelValue('x'.repeat(80))).toHaveLength(63);
    expect(sanitizeLabelValue('///')).toBe('');
  });
});

describe('reading Pods back', () => {
  const pod = (status: V1Pod['status'], meta: Partial<NonNullable<V1Pod['metadata']>> = {}): V1Pod => ({
    metadata: { name: 'px-a', namespace: 'proxies', ...meta },
    status,
  });
  const ready = [{ type: 'Ready', status: 'True' }];

  it('maps phase and conditions to instance states', () => {
    expect(stateFromPod(pod(undefined))).toBe('Pending');
    expect(stateFromPod(pod({ phase: 'Pending' }))).toBe('Pending');
    expect(stateFromPod(pod({ phase: 'Running', podIP: '10.0.0.5' }))).toBe('Pending');
    expect(stateFromPod(pod({ phase: 'Running', conditions: ready }))).toBe('Pending');
    expect(
      stateFromPod(
        pod({ phase: 'Running', podIP: '10.0.0.5', conditions: [{ type: 'Ready', status: 'False' }] }),
      ),
    ).toBe('Pending');
    expect(stateFromPod(pod({ phase: 'Running', podIP: '10.0.0.5', conditions: ready }))).toBe('Running');
    expect(stateFromPod(pod({ phase: 'Succeeded' }))).toBe('Terminated');
    expect(stateFromPod(pod({ phase: 'Failed' }))).toBe('Terminated');
    expect(stateFromPod(pod({ phase: 'Unknown' }))).toBe('Unknown');
    expect(
      stateFromPod(
        pod({ phase: 'Running', podIP: '10.0.0.5', conditions: ready }, { deletionTimestamp: new Date() }),
      ),
    ).toBe('Stopping');
  });

  it('reads identity, address, port and creation time back for GC', () => {
    const built = buildPod(req({ port: 8080 }), settings);
    const created = new Date('2026-11-30T10:00:00Z');
    const inst = instanceFromPod({
      ...built,
      metadata: { ...built.metadata, creationTimestamp: created },
      status: { phase: 'Running', podIP: '10.1.2.3', conditions: ready },
    });
    expect(inst).toEqual({
      id: 'namespaces/proxies/pods/px-0a1b2c3d-9f8e7d6c',
      name: 'px-0a1b2c3d-9f8e7d6c',
      state: 'Running',
      address: '10.1.2.3',
      port: 8080,
      uid: '0a1b2c3d-1111-2222-3333-444455556666',
      namespace: 'crawl',
      createdAt: created,
    });
  });

  it('parses provider IDs and rejects malformed ones as Permanent', () => {
    expect(parseProviderID(providerIDOf('proxies', 'px-a'))).toEqual({ namespace: 'proxies', name: 'px-a' });
    for (const bad of [
      'px-a',
      'namespaces/proxies/pods/',
      'namespaces//pods/px-a',
      'hosts/a/domains/b',
      'namespaces/a/pods/b/c',
    ]) {
      expect(
        classify(
          (() => {
            try {
              parseProviderID(bad);
            } catch (e) {
              return e;
            }
          })(),
        ),
      ).toBe('Permanent');
    }
  });
});

describe('kubernetes error mapping', () => {
  const status = (code: number, reason: string, message: string) =>
    new ApiException(
      code,
      'x',
      JSON.stringify({ kind: 'Status', status: 'Failure', code, reason, message }),
      {},
    );
  const where = { op: 'create', provider: 'k8s' };

  it('maps HTTP answers to error classes', () => {
    expect(classForStatus(404)).toBe('NotFound');
    expect(classForStatus(403, 'pods "px" is forbidden: exceeded quota: compute, requested: pods=1')).toBe(
      'QuotaExceeded',
    );
    for (const c of [400, 401, 403, 422]) expect(classForStatus(c)).toBe('Permanent');
    for (const c of [409, 429, 500, 503, 504]) expect(classForStatus(c)).toBe('Transient');
    const quota = toProviderError(
      status(403, 'Forbidden', 'pods "px" is forbidden: exceeded quota: q'),
      where,
    );
    expect(quota.errorClass).toBe('QuotaExceeded');
    expect(quota.message).toBe('k8s create: HTTP 403 Forbidden: pods "px" is forbidden: exceeded quota: q');
    expect(toProviderError(new TypeError('fetch failed'), where).errorClass).toBe('Transient');
  });

  it('never copies client-node error text (which embeds bodies and headers) or Secret messages', () => {
    const e = new ApiException(
      422,
      'x',
      JSON.stringify({ reason: 'Invalid', message: 'data[htpasswd]: s3cr3t' }),
      {
        authorization: 'Bearer tok',
      },
    );
    const pe = toProviderError(e, { ...where, statusMessage: false });
    expect(pe.message).toBe('k8s create: HTTP 422 Invalid');
    expect(pe.cause).toBeUndefined();
  });

  it('maps check failures to health reasons', () => {
    const aborted = AbortSignal.abort();
    expect(checkReason(status(401, 'Unauthorized', 'x'))).toBe('Unauthorized');
    expect(checkReason(status(403, 'Forbidden', 'x'))).toBe('Forbidden');
    expect(checkReason(status(500, 'InternalError', 'x'))).toBe('APIError');
    expect(checkReason(status(504, 'Timeout', 'x'))).toBe('Timeout');
    expect(checkReason(new Error('whatever'), aborted)).toBe('Timeout');
    expect(checkReason(new TypeError('fetch failed'))).toBe('Unreachable');
  });
});
