/**
 * The gcp provider through the real @google-cloud/compute client (REST transport) against a
 * stateful fake Compute Engine on loopback: what is sent, how answers become instances and
 * error classes, cancellation, health checks and credentials loading.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { googleAuthLibrary } from 'google-gax';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { GcpProviderConfig } from '../../../src/config/schema.ts';
import type { CallContext, CreateRequest } from '../../../src/provider/contract.ts';
import { classify, ProviderError } from '../../../src/provider/errors.ts';
import { GcpApiError } from '../../../src/provider/gcp/errors.ts';
import { createGcpProvider, type GcpProvider } from '../../../src/provider/gcp/index.ts';
import { type FakeGce, type Json, startFakeGce } from '../../support/fake-gce.ts';
import { closedPort } from '../../support/origins.ts';

const PROJECT = 'proj-test-1';
const ZONE = 'europe-west1-b';
const creds = { username: 'crawler-7', password: 'S3cret-pass-word-xyz' };
const UID = '0a1b2c3d-1111-2222-3333-444455556666';

let fake: FakeGce;
let logText = '';
const providers: GcpProvider[] = [];

const log = pino(
  { level: 'trace' },
  new Writable({
    write(chunk: Buffer, _enc, cb) {
      logText += chunk.toString();
      cb();
    },
  }),
);

function ctx(signal: AbortSignal = new AbortController().signal): CallContext {
  return { signal, log };
}

function req(extra: Partial<CreateRequest> = {}): CreateRequest {
  return {
    name: 'px-0a1b2c3d11112222-9f8e7d6c5b',
    uid: UID,
    namespace: 'crawl',
    proxyName: 'eu-1',
    zone: ZONE,
    port: 3128,
    credentials: creds,
    ...extra,
  };
}

function endpoint(port = fake.port) {
  return { apiEndpoint: '127.0.0.1', port, protocol: 'http' };
}

function make(
  config: Partial<GcpProviderConfig> = {},
  opts: { port?: number; auth?: boolean; listPageSize?: number; callTimeoutMs?: number } = {},
): GcpProvider {
  const p = createGcpProvider({
    name: 'gcp-test',
    config: { project: PROJECT, ...config },
    log,
    clientOptions: {
      ...endpoint(opts.port),
      ...(opts.auth === false ? {} : { authClient: new googleAuthLibrary.PassThroughClient() }),
    },
    callTimeoutMs: opts.callTimeoutMs ?? 3000,
    ...(opts.listPageSize ? { listPageSize: opts.listPageSize } : {}),
  });
  providers.push(p);
  return p;
}

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProviderError);
  return err as ProviderError;
}

const inserts = () => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/instances'));

beforeAll(async () => {
  fake = await startFakeGce({ zones: ['us-central1-a', 'europe-west1-b', 'asia-east1-c'] });
});
afterAll(async () => {
  await fake.close();
});
beforeEach(() => {
  fake.requests.length = 0;
  fake.instances.clear();
  fake.firewalls.clear();
  fake.clearFaults();
  logText = '';
});
afterEach(async () => {
  await Promise.all(providers.splice(0).map((p) => p.close()));
});

describe('create', () => {
  it('inserts a labelled VM with an external IP and the default cloud-init, without logging secrets', async () => {
    const p = make({ diskSizeGb: 20 });
    const inst = await p.create(ctx(), req());

    expect(inst).toMatchObject({
      id: `projects/${PROJECT}/zones/${ZONE}/instances/px-0a1b2c3d11112222-9f8e7d6c5b`,
      name: 'px-0a1b2c3d11112222-9f8e7d6c5b',
      state: 'Pending',
      uid: UID,
      namespace: 'crawl',
    });
    expect(inst.createdAt?.toISOString()).toBe('2026-11-30T12:05:06.789Z');
    const [post] = inserts();
    expect(post?.path).toBe(`/compute/v1/projects/${PROJECT}/zones/${ZONE}/instances`);
    const body = JSON.parse(post!.body) as Json & {
      metadata: { items: Array<{ key: string; value: string }> };
    };
    expect(body.labels).toEqual({
      'proxy-operator-managed': 'true',
      'proxy-operator-uid': UID,
      'proxy-operator-namespace': 'crawl',
      'managed-by': 'egress-proxies-operator',
    });
    expect(body.machineType).toBe(`zones/${ZONE}/machineTypes/e2-micro`);
    expect(body.networkInterfaces).toEqual([
      {
        network: 'global/networks/default',
        accessConfigs: [{ name: 'External NAT', type: 'ONE_TO_ONE_NAT' }],
      },
    ]);
    expect(body.tags).toEqual({ items: ['egress-proxy'] });
    expect(body.disks).toMatchObject([
      {
        boot: true,
        autoDelete: true,
        initializeParams: { diskSizeGb: '20', sourceImage: expect.stringContaining('ubuntu-os-cloud') },
      },
    ]);
    expect(body.scheduling).toBeUndefined();
    const userData = body.metadata.items.find((i) => i.key === 'user-data')?.value ?? '';
    expect(userData.startsWith('#cloud-config\n')).toBe(true);
    expect(userData).toMatch(/crawler-7:\$apr1\$/);
    expect(userData).toContain('http_port 3128');
    // The default egress policy is part of the VM's squid.conf.
    expect(userData).toContain('acl egress_connect_ports port 443');
    expect(userData).toMatch(/acl egress_denied_dst dst .*169\.254\.0\.0\/16/);
    // The VM gets a hash, never the password itself.
    expect(userData).not.toContain(creds.password);

    expect(logText).toContain('gcp instance insert accepted');
    expect(logText).not.toContain(creds.password);
    expect(logText).not.toContain('$apr1$');
    expect(logText).not.toContain('cloud-config');
  });

  it("writes the provider's egressPolicy into the default cloud-init's squid.conf", async () => {
    const p = make({ egressPolicy: { connectPorts: [443, 8443], denyCIDRs: ['198.51.100.0/24'] } });
    await p.create(ctx(), req());
    const body = JSON.parse(inserts()[0]!.body) as {
      metadata: { items: Array<{ key: string; value: string }> };
    };
    const userData = body.metadata.items.find((i) => i.key === 'user-data')?.value ?? '';
    expect(userData).toContain('acl egress_connect_ports port 443 8443');
    expect(userData).toContain('acl egress_http_ports port 80 443 8443');
    expect(userData).toContain('198.51.100.0/24');
  });

  it('passes a Proxy cloud-init byte for byte, resolves image keys and provisions spot VMs', async () => {
    const p = make({
      spot: true,
      images: { squid: 'projects/my-images/global/images/squid-v3' },
      subnetwork: 'proxies',
      serviceAccountEmail: 'proxy-vm@proj-test-1.iam.gserviceaccount.com',
    });
    const cloudInit = '#cloud-config\nruncmd:\n  - [echo, "my own proxy setup é"]\n';
    await p.create(ctx(), req({ cloudInit, image: 'squid', machineType: 'e2-small' }));
    const body = JSON.parse(inserts()[0]!.body) as Json & {
      metadata: { items: Array<{ key: string; value: string }> };
      disks: Array<{ initializeParams: { sourceImage: string } }>;
    };
    expect(body.metadata.items).toEqual([{ key: 'user-data', value: cloudInit }]);
    expect(body.disks[0]!.initializeParams.sourceImage).toBe('projects/my-images/global/images/squid-v3');
    expect(body.machineType).toBe(`zones/${ZONE}/machineTypes/e2-small`);
    expect(body.scheduling).toEqual({
      provisioningModel: 'SPOT',
      instanceTerminationAction: 'DELETE',
      automaticRestart: false,
      onHostMaintenance: 'TERMINATE',
    });
    expect(body.networkInterfaces).toMatchObject([
      { subnetwork: 'regions/europe-west1/subnetworks/proxies' },
    ]);
    expect(body.serviceAccounts).toMatchObject([{ email: 'proxy-vm@proj-test-1.iam.gserviceaccount.com' }]);
    expect(logText).not.toContain('my own proxy setup');
  });

  it('rejects a request without placement.zone or with an unknown image, sending nothing', async () => {
    const p = make();
    const noZone = await failure(p.create(ctx(), req({ zone: undefined })));
    expect(noZone.errorClass).toBe('Permanent');
    expect(noZone.message).toContain('placement.zone');
    const badImage = await failure(p.create(ctx(), req({ image: 'nope' })));
    expect(badImage.errorClass).toBe('Permanent');
    expect(badImage.message).toContain('placement.image "nope"');
    expect(fake.requests).toHaveLength(0);
  });

  it('treats 409 (already exists) as success and returns the instance as it is', async () => {
    fake.put(PROJECT, ZONE, 'px-0a1b2c3d11112222-9f8e7d6c5b', {
      labels: { 'proxy-operator-managed': 'true', 'proxy-operator-uid': UID },
      networkInterfaces: [{ accessConfigs: [{ type: 'ONE_TO_ONE_NAT', natIP: '203.0.113.7' }] }],
    });
    const inst = await make().create(ctx(), req());
    expect(inst).toMatchObject({ state: 'Running', address: '203.0.113.7', uid: UID });
    expect(inserts()).toHaveLength(1);
  });

  it('refuses an existing instance of that name that belongs to another Proxy', async () => {
    fake.put(PROJECT, ZONE, 'px-0a1b2c3d11112222-9f8e7d6c5b', {
      labels: { 'proxy-operator-uid': 'someone-else' },
    });
    const err = await failure(make().create(ctx(), req()));
    expect(err.errorClass).toBe('Permanent');
    expect(err.message).toContain('does not belong to this Proxy');
  });

  it('reports an accepted insert as Pending even when the read-back fails', async () => {
    fake.inject({ match: /^GET .*\/instances\//, status: 503, reason: 'backendError' });
    const inst = await make().create(ctx(), req());
    expect(inst).toMatchObject({ state: 'Pending', uid: UID, name: 'px-0a1b2c3d11112222-9f8e7d6c5b' });
    expect(fake.instances.size).toBe(1);
  });

  it('redacts secrets a server error echoes back', async () => {
    fake.inject({
      match: /^POST /,
      status: 400,
      reason: 'invalid',
      message: `Invalid value for field 'resource.metadata': '${creds.password}'`,
    });
    const err = await failure(make().create(ctx(), req()));
    expect(err.errorClass).toBe('Permanent');
    expect(err.message).toContain('HTTP 400 invalid');
    expect(err.message).not.toContain(creds.password);
    expect((err.cause as GcpApiError).message).not.toContain(creds.password);
  });
});

describe('get', () => {
  const statuses: Array<[string, string | undefined, string]> = [
    ['PROVISIONING', undefined, 'Pending'],
    ['STAGING', undefined, 'Pending'],
    ['RUNNING', '198.51.100.4', 'Running'],
    ['RUNNING', undefined, 'Pending'],
    ['STOPPING', '198.51.100.4', 'Stopping'],
    ['STOPPED', undefined, 'Stopped'],
    ['SUSPENDING', undefined, 'Stopping'],
    ['SUSPENDED', undefined, 'Stopped'],
    ['REPAIRING', undefined, 'Unknown'],
    ['TERMINATED', undefined, 'Terminated'],
  ];
  it.each(statuses)('maps %s (natIP %s) to %s', async (status, natIP, state) => {
    fake.put(PROJECT, ZONE, 'px-a', {
      status,
      labels: { 'proxy-operator-uid': UID, 'proxy-operator-namespace': 'crawl' },
      networkInterfaces: [{ accessConfigs: natIP ? [{ natIP }] : [] }],
    });
    const inst = await make().get(ctx(), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`);
    expect(inst.state).toBe(state);
    expect(inst.address).toBe(natIP);
    expect(inst).toMatchObject({ name: 'px-a', uid: UID, namespace: 'crawl' });
  });

  it('answers NotFound for a missing instance and Permanent for a malformed ID (no request)', async () => {
    const p = make();
    const gone = await failure(p.get(ctx(), `projects/${PROJECT}/zones/${ZONE}/instances/px-gone`));
    expect(gone.errorClass).toBe('NotFound');
    fake.requests.length = 0;
    for (const id of ['px-a', `projects/${PROJECT}/zones/${ZONE}/instances/`, 'local/px-a']) {
      expect((await failure(p.get(ctx(), id))).errorClass).toBe('Permanent');
    }
    expect(fake.requests).toHaveLength(0);
  });
});

describe('delete', () => {
  it('deletes, following its operation, and is idempotent', async () => {
    fake.put(PROJECT, ZONE, 'px-a');
    const p = make();
    const id = `projects/${PROJECT}/zones/${ZONE}/instances/px-a`;
    await p.delete(ctx(), id);
    expect(fake.instances.size).toBe(0);
    await p.delete(ctx(), id);
    expect(fake.requests.filter((r) => r.method === 'DELETE')).toHaveLength(2);
  });
});

describe('listByTag', () => {
  it('follows every page across zones, skipping empty scopes and unmanaged instances', async () => {
    const managed = { 'proxy-operator-managed': 'true', 'proxy-operator-uid': UID };
    const zones = ['us-central1-a', 'europe-west1-b', 'asia-east1-c', 'us-east1-d'];
    for (let i = 0; i < 7; i++) {
      fake.put(PROJECT, zones[i % zones.length]!, `px-${i}`, { labels: managed });
    }
    fake.put(PROJECT, ZONE, 'someone-elses-vm', { labels: { team: 'x' } });
    fake.put('other-project-1', ZONE, 'px-other', { labels: managed });

    const got = await make({}, { listPageSize: 2 }).listByTag(ctx());
    expect(got.map((i) => i.id).sort()).toEqual(
      [...Array(7).keys()]
        .map((i) => `projects/${PROJECT}/zones/${zones[i % zones.length]}/instances/px-${i}`)
        .sort(),
    );
    expect(got.every((i) => i.uid === UID && i.createdAt !== undefined)).toBe(true);
    const lists = fake.requests.filter((r) => r.path.endsWith('/aggregated/instances'));
    expect(lists).toHaveLength(4);
    expect(lists[0]!.query).toEqual({
      filter: 'labels.proxy-operator-managed = true',
      maxResults: '2',
      returnPartialSuccess: 'true',
    });
    expect(lists.slice(1).map((r) => r.query.pageToken)).toEqual(['2', '4', '6']);
  });

  it('lists the zones that answer when another zone is unreachable', async () => {
    const managed = { 'proxy-operator-managed': 'true', 'proxy-operator-uid': UID };
    fake.put(PROJECT, 'us-central1-a', 'px-up', { labels: managed });
    fake.unreachableZones = ['europe-west1-b'];
    try {
      const got = await make().listByTag(ctx());
      expect(got.map((i) => i.id)).toEqual([`projects/${PROJECT}/zones/us-central1-a/instances/px-up`]);
    } finally {
      fake.unreachableZones = [];
    }
  });

  it('labels VMs with the installation, and adopts one from before installations keeping its labels', async () => {
    const p = make();
    await p.create(ctx(), req({ name: 'px-new', installation: 'installation-a' }));
    const old = { 'proxy-operator-managed': 'true', 'proxy-operator-uid': UID, team: 'crawl' };
    fake.put(PROJECT, ZONE, 'px-old', { labels: old });
    let listed = await p.listByTag(ctx());
    expect(listed.find((i) => i.name === 'px-new')?.installation).toBe('installation-a');
    expect(listed.find((i) => i.name === 'px-old')?.installation).toBeUndefined();

    const id = `projects/${PROJECT}/zones/${ZONE}/instances/px-old`;
    await p.adopt(ctx(), id, 'installation-a');
    listed = await p.listByTag(ctx());
    expect(listed.find((i) => i.name === 'px-old')).toMatchObject({
      installation: 'installation-a',
      uid: UID,
    });
    expect(fake.instances.get(`${PROJECT}/${ZONE}/px-old`)?.labels).toEqual({
      ...old,
      'proxy-operator-installation': 'installation-a',
    });
    const setLabels = fake.requests.filter((r) => r.path.endsWith('/px-old/setLabels'));
    expect(setLabels).toHaveLength(1);
    const gone = `projects/${PROJECT}/zones/${ZONE}/instances/px-missing`;
    expect((await failure(p.adopt(ctx(), gone, 'installation-a'))).errorClass).toBe('NotFound');
  });

  it('returns an empty list for a project without managed instances', async () => {
    expect(await make().listByTag(ctx())).toEqual([]);
  });
});

describe('errors', () => {
  const cases: Array<[string, Parameters<FakeGce['inject']>[0], string]> = [
    ['403 QUOTA_EXCEEDED', { match: /./, status: 403, reason: 'QUOTA_EXCEEDED' }, 'QuotaExceeded'],
    [
      '403 ZONE_RESOURCE_POOL_EXHAUSTED',
      { match: /./, status: 403, reason: 'ZONE_RESOURCE_POOL_EXHAUSTED' },
      'QuotaExceeded',
    ],
    ['429 rateLimitExceeded', { match: /./, status: 429, reason: 'rateLimitExceeded' }, 'QuotaExceeded'],
    ['429 without a quota reason', { match: /./, status: 429, reason: 'tooManyRequests' }, 'Transient'],
    ['403 forbidden', { match: /./, status: 403, reason: 'forbidden' }, 'Permanent'],
    ['400 invalid', { match: /./, status: 400, reason: 'invalid' }, 'Permanent'],
    ['401 unauthorized', { match: /./, status: 401, reason: 'authError' }, 'Permanent'],
    ['500', { match: /./, status: 500, reason: 'backendError' }, 'Transient'],
    ['503', { match: /./, status: 503, reason: 'backendError' }, 'Transient'],
    ['502 with an HTML body', { match: /./, status: 502, rawBody: '<html>bad gateway</html>' }, 'Transient'],
    ['connection reset', { match: /./, status: 0, drop: true }, 'Transient'],
    ['no answer within the call timeout', { match: /./, status: 200, delayMs: 1500 }, 'Transient'],
  ];
  it.each(cases)('%s → %s', async (_name, fault, cls) => {
    fake.inject(fault);
    const p = make({}, { callTimeoutMs: 500 });
    for (const call of [
      () => p.get(ctx(), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`),
      () => p.create(ctx(), req()),
      () => p.listByTag(ctx()),
    ]) {
      const err = await failure(call());
      expect(err.errorClass).toBe(cls);
      expect(classify(err)).toBe(cls);
      expect(err.cause).toBeInstanceOf(GcpApiError);
    }
  });

  it('keeps status and reason in the message and the cause', async () => {
    fake.inject({ match: /./, status: 403, reason: 'QUOTA_EXCEEDED', message: "Quota 'CPUS' exceeded." });
    const err = await failure(make().get(ctx(), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`));
    expect(err.message).toBe(
      `gcp-test get projects/${PROJECT}/zones/${ZONE}/instances/px-a: HTTP 403 QUOTA_EXCEEDED: Quota 'CPUS' exceeded.`,
    );
    expect(err.cause).toMatchObject({ httpStatusCode: 403, reason: 'QUOTA_EXCEEDED' });
  });
});

describe('cancellation', () => {
  it('every call returns promptly when its signal aborts', async () => {
    fake.inject({ match: /./, status: 200, delayMs: 2500 });
    const p = make({}, { callTimeoutMs: 10_000 });
    const calls = [
      (s: AbortSignal) => p.get(ctx(s), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`),
      (s: AbortSignal) => p.create(ctx(s), req()),
      (s: AbortSignal) => p.delete(ctx(s), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`),
      (s: AbortSignal) => p.listByTag(ctx(s)),
    ];
    for (const call of calls) {
      const ac = new AbortController();
      const started = Date.now();
      setTimeout(() => ac.abort(), 50);
      const err = await failure(call(ac.signal));
      expect(Date.now() - started).toBeLessThan(1500);
      expect(err.errorClass).toBe('Transient');
      expect(err.message).toContain('aborted');
    }
  });

  it('an already aborted signal sends nothing', async () => {
    const ac = new AbortController();
    ac.abort();
    const p = make();
    await failure(p.get(ctx(), `projects/${PROJECT}/zones/${ZONE}/instances/px-x`)); // builds the client
    fake.requests.length = 0;
    await failure(p.get(ctx(ac.signal), `projects/${PROJECT}/zones/${ZONE}/instances/px-a`));
    await failure(p.listByTag(ctx(ac.signal)));
    // Absence has no event to wait for: a request the calls had sent would reach the fake within
    // milliseconds on loopback, so a short bounded observation window is the only proof left.
    await new Promise((r) => setTimeout(r, 200));
    expect(fake.requests).toHaveLength(0);
  });
});

describe('check', () => {
  it('reads one page of at most one managed instance', async () => {
    for (let i = 0; i < 5; i++)
      fake.put(PROJECT, ZONE, `px-${i}`, { labels: { 'proxy-operator-managed': 'true' } });
    const [t] = await make().check(ctx());
    expect(t).toMatchObject({ name: PROJECT, address: '127.0.0.1', ready: true, reason: 'Reachable' });
    expect(t!.latencyMillis).toBeGreaterThanOrEqual(0);
    expect(fake.requests).toHaveLength(1);
    expect(fake.requests[0]!.query).toEqual({
      filter: 'labels.proxy-operator-managed = true',
      maxResults: '1',
      returnPartialSuccess: 'true',
    });
  });

  it('stays Reachable when one zone of the project is unreachable', async () => {
    fake.put(PROJECT, ZONE, 'px-0', { labels: { 'proxy-operator-managed': 'true' } });
    fake.unreachableZones = ['europe-west1-b'];
    try {
      const [t] = await make().check(ctx());
      expect(t).toMatchObject({ name: PROJECT, ready: true, reason: 'Reachable' });
    } finally {
      fake.unreachableZones = [];
    }
  });

  const reasons: Array<[string, Parameters<FakeGce['inject']>[0], string]> = [
    ['401', { match: /./, status: 401, reason: 'authError', message: 'Invalid Credentials' }, 'Unauthorized'],
    [
      '403',
      {
        match: /./,
        status: 403,
        reason: 'accessNotConfigured',
        message: 'Compute Engine API has not been used',
      },
      'Forbidden',
    ],
    ['500', { match: /./, status: 500, reason: 'backendError' }, 'APIError'],
    ['400', { match: /./, status: 400, reason: 'invalid' }, 'APIError'],
    ['reset', { match: /./, status: 0, drop: true }, 'Unreachable'],
  ];
  it.each(reasons)('%s → %s, never throwing', async (_n, fault, reason) => {
    fake.inject(fault);
    const [t] = await make().check(ctx());
    expect(t).toMatchObject({ ready: false, reason });
    expect(t!.message?.length).toBeGreaterThan(0);
    if (fault.message) expect(t!.message).toContain(fault.message);
  });

  it('reports Unreachable for a closed port and Timeout when the signal ends first', async () => {
    const [closed] = await make({}, { port: await closedPort() }).check(ctx());
    expect(closed).toMatchObject({ ready: false, reason: 'Unreachable' });

    fake.inject({ match: /./, status: 200, delayMs: 2000 });
    const started = Date.now();
    const [slow] = await make().check(ctx(AbortSignal.timeout(100)));
    expect(slow).toMatchObject({ ready: false, reason: 'Timeout' });
    expect(Date.now() - started).toBeLessThan(1500);
  });
});

describe('credentials file', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'gcp-creds-'));
    writeFileSync(join(dir, 'subject-token'), 'subject');
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** An external_account file: its token URL can point at the fake (a service account's cannot). */
  const credentialsJson = () =>
    JSON.stringify({
      type: 'external_account',
      audience: '//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/x',
      subject_token_type: 'urn:ietf:params:oauth:token-type:jwt',
      token_url: `http://127.0.0.1:${fake.port}/token`,
      credential_source: { file: join(dir, 'subject-token') },
    });

  it('a missing file does not fail construction; calls fail transiently until it appears', async () => {
    const file = join(dir, 'key.json');
    fake.put(PROJECT, ZONE, 'px-a');
    const p = make({ credentialsFile: file }, { auth: false });
    expect(logText).toContain('credentials file does not exist yet');

    const id = `projects/${PROJECT}/zones/${ZONE}/instances/px-a`;
    const err = await failure(p.get(ctx(), id));
    expect(err.errorClass).toBe('Transient');
    expect(err.message).toContain(`gcp.credentialsFile ${file}`);
    const [t] = await p.check(ctx());
    expect(t).toMatchObject({ ready: false, reason: 'Unreachable' });
    expect(fake.requests).toHaveLength(0);

    writeFileSync(file, credentialsJson());
    expect((await p.get(ctx(), id)).name).toBe('px-a');
    const call = fake.requests.find((r) => r.path.endsWith('/instances/px-a'));
    expect(call?.headers.authorization).toBe(`Bearer fake-token-${fake.tokensIssued}`);
    expect(fake.tokensIssued).toBeGreaterThan(0);
    expect((await p.check(ctx()))[0]).toMatchObject({ ready: true });
  });

  it('an unparsable file is a permanent error naming the field', async () => {
    const file = join(dir, 'broken.json');
    writeFileSync(file, '{not json');
    const err = await failure(make({ credentialsFile: file }, { auth: false }).listByTag(ctx()));
    expect(err.errorClass).toBe('Permanent');
    expect(err.message).toContain('gcp.credentialsFile');
  });
});

describe('managed firewall rule', () => {
  it('creates the port rule once, for tagged instances, from the configured ranges', async () => {
    const p = make({ firewall: { sourceRanges: ['203.0.113.0/24', '198.51.100.0/24'] } });
    await p.create(ctx(), req());
    await p.create(ctx(), req({ name: 'px-second' }));
    const fw = fake.requests.filter((r) => r.path.includes('/global/firewalls'));
    expect(fw.map((r) => `${r.method} ${r.path}`)).toEqual([
      `GET /compute/v1/projects/${PROJECT}/global/firewalls/egress-proxy-tcp-3128`,
      `POST /compute/v1/projects/${PROJECT}/global/firewalls`,
    ]);
    expect(JSON.parse(fw[1]!.body)).toMatchObject({
      name: 'egress-proxy-tcp-3128',
      network: 'global/networks/default',
      direction: 'INGRESS',
      allowed: [{ IPProtocol: 'tcp', ports: ['3128'] }],
      sourceRanges: ['203.0.113.0/24', '198.51.100.0/24'],
      targetTags: ['egress-proxy'],
    });
    expect(JSON.parse(inserts()[0]!.body).tags).toEqual({ items: ['egress-proxy'] });
  });

  it('leaves an existing rule alone, and a failed ensure fails create and is retried', async () => {
    fake.inject({ match: /firewalls/, status: 403, reason: 'forbidden', times: 1 });
    const p = make({ firewall: { sourceRanges: ['203.0.113.0/24'], targetTag: 'crawl-proxy' } });
    const err = await failure(p.create(ctx(), req()));
    expect(err.errorClass).toBe('Permanent');
    expect(inserts()).toHaveLength(0);
    fake.firewalls.set(`${PROJECT}/crawl-proxy-tcp-3128`, {
      name: 'crawl-proxy-tcp-3128',
      sourceRanges: ['0.0.0.0/0'],
    });
    await p.create(ctx(), req());
    expect(fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/firewalls'))).toHaveLength(0);
    expect(logText).toContain('exists with other source ranges');
  });

  it('disabled: no firewall calls', async () => {
    await make({ firewall: { enabled: false, sourceRanges: [] } }).create(ctx(), req());
    expect(fake.requests.filter((r) => r.path.includes('firewalls'))).toHaveLength(0);
  });
});
