/**
 * The aws provider through the official SDK against moto's server on loopback
 * (test/support/moto.ts): what EC2 is asked for (tags, ClientToken, IMDSv2, the managed
 * security group), stop/start for a new address, two installations in one account under the
 * orphan sweep, `ssm:` images, and every error mapping — moto's own errors where it answers
 * them (a bad AMI), the others injected by the test layer in front of moto, the happy path
 * always moto's. Integration tier: moto_server is a child process from a private venv.
 */
import {
  CreateSecurityGroupCommand,
  DescribeInstanceAttributeCommand,
  DescribeInstancesCommand,
  DescribeSecurityGroupsCommand,
  type EC2Client,
} from '@aws-sdk/client-ec2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_VERSION, PROXY_KIND } from '../../../src/api/constants.ts';
import type { AwsProviderConfig } from '../../../src/config/schema.ts';
import { OrphanSweeper } from '../../../src/orphans/sweeper.ts';
import { type AwsProvider, createAwsProvider } from '../../../src/provider/aws/index.ts';
import { clientToken } from '../../../src/provider/aws/instance.ts';
import { classify, ProviderError } from '../../../src/provider/errors.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import {
  MOTO_CREDENTIALS,
  type Moto,
  type MotoFront,
  motoEc2,
  seedRegion,
  startMoto,
  startMotoFront,
} from '../../support/moto.ts';
import { callContext, createRequest } from '../../support/provider-calls.ts';

const REGION = 'eu-west-1';
const ZONES = [`${REGION}a`, `${REGION}b`];
let moto: Moto;
let front: MotoFront;
let seed: Awaited<ReturnType<typeof seedRegion>>;
let ec2: EC2Client;
const providers: AwsProvider[] = [];
let n = 0;
const ctx = () => callContext();
const uniq = (what: string) => `px-${what}-${++n}`;

function config(over: Partial<AwsProviderConfig> = {}): AwsProviderConfig {
  return {
    regions: [{ name: REGION, subnets: seed.subnets }],
    images: { default: seed.imageId },
    securityGroup: { sourceRanges: ['198.51.100.0/24', '2001:db8::/32'] },
    endpoint: front.url,
    ...over,
  };
}

function provider(over: Partial<AwsProviderConfig> = {}, maxAttempts = 1): AwsProvider {
  const p = createAwsProvider({
    name: 'aws-moto',
    config: config(over),
    clientOptions: { credentials: MOTO_CREDENTIALS, maxAttempts },
  });
  providers.push(p);
  return p;
}

async function raw(name: string) {
  const out = await ec2.send(
    new DescribeInstancesCommand({ Filters: [{ Name: 'tag:Name', Values: [name] }] }),
  );
  return (out.Reservations ?? [])
    .flatMap((r) => r.Instances ?? [])
    .filter((i) => i.State?.Name !== 'terminated');
}

async function rejection(p: Promise<unknown>): Promise<ProviderError> {
  const err = await p.then(
    () => new Error('expected a rejection'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProviderError);
  expect(classify(err)).toBe((err as ProviderError).errorClass);
  return err as ProviderError;
}

beforeAll(async () => {
  moto = await startMoto();
  front = await startMotoFront(moto.url);
  seed = await seedRegion(moto.url, REGION, ZONES);
  ec2 = motoEc2(moto.url, REGION);
}, 60_000);

afterAll(async () => {
  for (const p of providers) await p.close();
  ec2?.destroy();
  await front?.close();
  await moto?.close();
});

describe('aws provider against moto', () => {
  it('creates with every tag in the call, IMDSv2 with one hop, the managed group and the location', async () => {
    // Even with link-local and unique-local ranges opened, the metadata service stays denied.
    const p = provider({ egressPolicy: { allowCIDRs: ['169.254.0.0/16', 'fc00::/7'] } });
    const name = uniq('shape');
    const created = await p.create(ctx(), createRequest(name, { installation: 'inst-a' }));
    expect(created).toMatchObject({ name, uid: `uid-${name}`, installation: 'inst-a' });
    // RunInstances answers pending; the next read finds it running with its address.
    const inst = await p.get(ctx(), created.id);
    expect(inst).toMatchObject({ name, installation: 'inst-a', state: 'Running' });
    expect(inst.address).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(inst.location).toEqual({ region: REGION, zone: ZONES[0] });
    const [r] = await raw(name);
    const tags = Object.fromEntries((r?.Tags ?? []).map((t) => [t.Key, t.Value]));
    expect(tags).toMatchObject({
      Name: name,
      'proxy-operator-managed': 'true',
      'proxy-operator-uid': `uid-${name}`,
      'proxy-operator-namespace': 'crawl',
      'proxy-operator-installation': 'inst-a',
    });
    expect(r?.MetadataOptions).toMatchObject({ HttpTokens: 'required', HttpPutResponseHopLimit: 1 });
    const groups = await ec2.send(
      new DescribeSecurityGroupsCommand({
        Filters: [{ Name: 'group-name', Values: ['egress-proxy-tcp-3128'] }],
      }),
    );
    const perm = groups.SecurityGroups?.[0]?.IpPermissions?.[0];
    expect(perm).toMatchObject({ IpProtocol: 'tcp', FromPort: 3128, ToPort: 3128 });
    expect(perm?.IpRanges?.map((x) => x.CidrIp)).toEqual(['198.51.100.0/24']);
    expect(perm?.Ipv6Ranges?.map((x) => x.CidrIpv6)).toEqual(['2001:db8::/32']);
    // On the primary interface, where RunInstances put it.
    expect(r?.NetworkInterfaces?.[0]?.Groups?.map((g) => g.GroupId)).toEqual([
      groups.SecurityGroups?.[0]?.GroupId,
    ]);
    // The user data is the shared Squid cloud-init, base64 as EC2 wants it.
    const userData = await ec2.send(
      new DescribeInstanceAttributeCommand({
        InstanceId: r?.InstanceId,
        Attribute: 'userData',
      }),
    );
    const text = Buffer.from(userData.UserData?.Value ?? '', 'base64').toString('utf8');
    expect(text.startsWith('#cloud-config')).toBe(true);
    expect(text).toContain('169.254.169.254');
    expect(text).toContain('fd00:ec2::254');
  });

  it('a managed group left without its rule (a crash between the two calls) gets the rule', async () => {
    await ec2.send(
      new CreateSecurityGroupCommand({
        GroupName: 'egress-proxy-tcp-8888',
        VpcId: seed.vpcId,
        Description: 'left over',
      }),
    );
    const p = provider();
    await p.create(ctx(), createRequest(uniq('repair'), { port: 8888 }));
    const groups = await ec2.send(
      new DescribeSecurityGroupsCommand({
        Filters: [{ Name: 'group-name', Values: ['egress-proxy-tcp-8888'] }],
      }),
    );
    expect(groups.SecurityGroups?.[0]?.IpPermissions?.[0]).toMatchObject({ FromPort: 8888, ToPort: 8888 });
  });

  it('RunInstances carries the ClientToken of installation, Proxy, name and subnet', async () => {
    // moto 5.2.5 does not honour ClientToken (a second RunInstances with the same token makes a
    // second instance; EC2 returns the first): the token is checked as sent, and the retry
    // below is kept to one instance by the Name-tag lookup that precedes every RunInstances.
    const p = provider();
    const name = uniq('token');
    const req = createRequest(name, { installation: 'inst-a' });
    const seen: string[] = [];
    front.onBody = (action, body) => {
      if (action === 'RunInstances') seen.push(new URLSearchParams(body).get('ClientToken') ?? '');
    };
    try {
      await p.create(ctx(), req);
    } finally {
      front.onBody = undefined;
    }
    expect(seen).toEqual([clientToken(req, seed.subnets[0]!.id)]);
    expect(seen[0]).toMatch(/^[0-9a-f]{64}$/);
  });

  it('a create whose answer was lost is found by its Name tag on the retry: one instance', async () => {
    const p = provider();
    const name = uniq('lost');
    // moto made it; the answer never reached the provider.
    front.inject({ action: 'RunInstances', code: 'InternalError', status: 500, count: 1, passThrough: true });
    const err = await rejection(p.create(ctx(), createRequest(name)));
    expect(err.errorClass).toBe('Transient');
    const again = await p.create(ctx(), createRequest(name));
    expect(again.name).toBe(name);
    expect(await raw(name)).toHaveLength(1);
  });

  it('restart stops and starts the same instance for a new public address', async () => {
    const p = provider();
    const name = uniq('restart');
    const created = await p.create(ctx(), createRequest(name));
    const first = await p.get(ctx(), created.id);
    // EC2's LaunchTime has whole seconds: decide the restart a second after the launch.
    await new Promise((r) => setTimeout(r, 1100));
    const since = new Date();
    const idBefore = (await raw(name))[0]?.InstanceId;
    let inst = first;
    for (let i = 0; i < 10; i++) {
      inst = await p.restart!(ctx(), first.id, since);
      if (inst.state === 'Running' && i > 0) break;
    }
    expect(inst.state).toBe('Running');
    expect((await raw(name))[0]?.InstanceId).toBe(idBefore);
    expect(front.calls.get('StopInstances')).toBeGreaterThanOrEqual(1);
    expect(front.calls.get('StartInstances')).toBeGreaterThanOrEqual(1);
    expect(inst.address).toBeTruthy();
    expect(inst.address).not.toBe(first.address);
    // Asked again for the same restart: done, nothing stopped again.
    const stops = front.calls.get('StopInstances');
    await p.restart!(ctx(), first.id, since);
    expect(front.calls.get('StopInstances')).toBe(stops);
  });

  it('two installations in one account: each sweep deletes only its own orphans', async () => {
    const p = provider();
    const a = uniq('inst-a');
    const b = uniq('inst-b');
    // Installation b has a Proxy owning its instance; installation a has none.
    const storeB = createMemoryStore();
    const owner = await storeB.proxies.create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name: 'owner', namespace: 'crawl' },
      spec: { provider: 'aws-moto' },
    });
    const uidB = owner.metadata.uid ?? '';
    await p.create(ctx(), createRequest(a, { installation: 'installation-a' }));
    await p.create(ctx(), createRequest(b, { uid: uidB, installation: 'installation-b' }));
    const sweep = async (installation: string) => {
      const store = createMemoryStore();
      const gc = new OrphanSweeper({
        store,
        providers: () => [['aws-moto', p]],
        intervalMs: 60_000,
        minAgeMs: 0,
        installation,
      });
      return gc.sweep(new AbortController().signal);
    };
    const ra = await sweep('installation-a');
    expect(ra.deleted['aws-moto']).toEqual([`regions/${REGION}/instances/${a}`]);
    expect(await raw(a)).toEqual([]);
    expect(await raw(b)).toHaveLength(1);
    // Installation b's own sweep keeps its owned instance.
    const owned = await new OrphanSweeper({
      store: storeB,
      providers: () => [['aws-moto', p]],
      intervalMs: 60_000,
      minAgeMs: 0,
      installation: 'installation-b',
    }).sweep(new AbortController().signal);
    expect(owned.deleted['aws-moto'] ?? []).toEqual([]);
    expect(await raw(b)).toHaveLength(1);
  });

  it('ssm: images are resolved through SSM public parameters', async () => {
    const p = provider({
      images: { default: 'ssm:/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2' },
    });
    const name = uniq('ssm');
    const inst = await p.create(ctx(), createRequest(name));
    expect((await p.get(ctx(), inst.id)).state).toBe('Running');
    expect(front.calls.get('GetParameter')).toBeGreaterThanOrEqual(1);
    const [r] = await raw(name);
    expect(r?.ImageId).toMatch(/^ami-/);
  });

  describe('errors', () => {
    it('a bad AMI is Permanent with the AWS code', async () => {
      // moto 5.2.5 starts instances of AMIs it does not know: the answer is injected.
      const p = provider({ images: { default: 'ami-00000000deadbeef' } });
      front.inject({ action: 'RunInstances', code: 'InvalidAMIID.NotFound', status: 400, count: 1 });
      const err = await rejection(p.create(ctx(), createRequest(uniq('bad-ami'))));
      expect(err.errorClass).toBe('Permanent');
      expect(err.message).toMatch(/InvalidAMIID\.(NotFound|Malformed)/);
    });

    it('throttling is Transient after the SDK retried with backoff', async () => {
      const p = provider({}, 3);
      const before = front.calls.get('DescribeInstances') ?? 0;
      front.inject({ action: 'DescribeInstances', code: 'RequestLimitExceeded', status: 503 });
      try {
        const err = await rejection(p.get(ctx(), `regions/${REGION}/instances/px-x`));
        expect(err.errorClass).toBe('Transient');
        expect(err.message).toContain('RequestLimitExceeded');
        expect((front.calls.get('DescribeInstances') ?? 0) - before).toBe(3);
      } finally {
        front.clear();
      }
      front.inject({ action: 'DescribeInstances', code: 'Throttling', status: 400, count: 1 });
      // One throttled answer, then moto's: the SDK's retry hides it.
      await rejection(p.get(ctx(), `regions/${REGION}/instances/px-missing`)).then((e) =>
        expect(e.errorClass).toBe('NotFound'),
      );
    });

    it('no capacity in the first zone: the instance starts in the next one', async () => {
      const p = provider();
      front.inject({
        action: 'RunInstances',
        code: 'InsufficientInstanceCapacity',
        status: 500,
        bodyIncludes: seed.subnets[0]!.id,
      });
      try {
        const inst = await p.create(ctx(), createRequest(uniq('capacity')));
        expect(inst.location?.zone).toBe(ZONES[1]);
      } finally {
        front.clear();
      }
    });

    it('no capacity in any zone: QuotaExceeded naming the zones, and ProviderHealth says so', async () => {
      const p = provider();
      front.inject({ action: 'RunInstances', code: 'InsufficientInstanceCapacity', status: 500 });
      try {
        const err = await rejection(p.create(ctx(), createRequest(uniq('no-capacity'))));
        expect(err.errorClass).toBe('QuotaExceeded');
        expect(err.message).toContain(`${ZONES[0]} (${seed.subnets[0]!.id}): InsufficientInstanceCapacity`);
        expect(err.message).toContain(ZONES[1]);
      } finally {
        front.clear();
      }
      const [t] = await p.check(ctx());
      expect(t).toMatchObject({ name: REGION, ready: false, reason: 'QuotaExceeded' });
    });

    it.each(['VcpuLimitExceeded', 'InstanceLimitExceeded'])(
      '%s is QuotaExceeded with the code, and ProviderHealth is not ready until a create succeeds',
      async (code) => {
        const p = provider();
        expect((await p.check(ctx()))[0]).toMatchObject({ ready: true, reason: 'Reachable' });
        front.inject({ action: 'RunInstances', code, status: 400, count: 1 });
        const err = await rejection(p.create(ctx(), createRequest(uniq('quota'))));
        expect(err.errorClass).toBe('QuotaExceeded');
        expect(err.message).toContain(code);
        const [t] = await p.check(ctx());
        expect(t).toMatchObject({ ready: false, reason: 'QuotaExceeded' });
        expect(t?.message).toContain(code);
        await p.create(ctx(), createRequest(uniq('quota-ok')));
        expect((await p.check(ctx()))[0]).toMatchObject({ ready: true });
      },
    );

    it.each([
      ['UnauthorizedOperation', 403],
      ['AuthFailure', 401],
    ])('%s is Permanent with the AWS code in the message', async (code, status) => {
      const p = provider();
      front.inject({ action: 'RunInstances', code, status, count: 1 });
      const err = await rejection(p.create(ctx(), createRequest(uniq('denied'))));
      expect(err.errorClass).toBe('Permanent');
      expect(err.message).toContain(code);
    });

    it('the check reports unauthorized credentials per region', async () => {
      const p = provider();
      front.inject({ action: 'DescribeInstances', code: 'AuthFailure', status: 401, count: 1 });
      const [t] = await p.check(ctx());
      expect(t).toMatchObject({ name: REGION, ready: false, reason: 'Unauthorized' });
      expect(t?.message).toContain('AuthFailure');
    });
  });
});
