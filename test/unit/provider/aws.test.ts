/**
 * The aws provider's pure parts: the RunInstances input (tags, ClientToken, IMDSv2, network,
 * spot), placement, image and instance type resolution, states, the error mapping, the egress
 * policy that always denies the metadata service, and the IAM policy of docs/providers/aws.md
 * covering every command the provider's source sends.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { deniedAddressMatcher } from '../../../src/config/egress.ts';
import type { AwsProviderConfig } from '../../../src/config/schema.ts';
import { classForCode, toProviderError } from '../../../src/provider/aws/errors.ts';
import { awsEgressPolicy, createAwsProvider } from '../../../src/provider/aws/index.ts';
import {
  awsSettings,
  buildRunInstancesInput,
  clientToken,
  parseProviderID,
  placementOf,
  resolveImage,
  resolveInstanceType,
  stateFromEc2,
} from '../../../src/provider/aws/instance.ts';
import { canRestart } from '../../../src/provider/contract.ts';
import { createRequest } from '../../support/provider-calls.ts';

const ROOT = join(import.meta.dirname, '..', '..', '..');
const config: AwsProviderConfig = {
  regions: [
    {
      name: 'eu-west-1',
      subnets: [
        { id: 'subnet-0000000000000000a', zone: 'eu-west-1a' },
        { id: 'subnet-0000000000000000b', zone: 'eu-west-1b' },
      ],
    },
    { name: 'us-east-1', subnets: [{ id: 'subnet-0000000000000000c', zone: 'us-east-1a' }] },
  ],
  securityGroup: { sourceRanges: ['203.0.113.0/24'] },
};

describe('aws request building', () => {
  const req = createRequest('px-abc-123', { installation: 'inst-1' });
  const input = (over: Partial<AwsProviderConfig> = {}) =>
    buildRunInstancesInput({
      req,
      settings: awsSettings({ ...config, ...over }),
      subnetId: 'subnet-0000000000000000a',
      imageId: 'ami-0123456789abcdef0',
      instanceType: 't3.micro',
      securityGroupIds: ['sg-0123456789abcdef0'],
      userData: '#cloud-config\n',
    });

  it('tags instance and volume in the call, requires IMDSv2 with one hop, one public interface', () => {
    const i = input();
    const tags = Object.fromEntries((i.TagSpecifications?.[0]?.Tags ?? []).map((t) => [t.Key, t.Value]));
    expect(tags).toEqual({
      Name: 'px-abc-123',
      'proxy-operator-managed': 'true',
      'proxy-operator-uid': 'uid-px-abc-123',
      'proxy-operator-namespace': 'crawl',
      'proxy-operator-installation': 'inst-1',
      'managed-by': 'egress-proxies-operator',
    });
    expect(i.TagSpecifications?.map((t) => t.ResourceType)).toEqual(['instance', 'volume']);
    expect(i.MetadataOptions).toEqual({
      HttpTokens: 'required',
      HttpPutResponseHopLimit: 1,
      HttpEndpoint: 'enabled',
    });
    expect(i.NetworkInterfaces).toEqual([
      {
        DeviceIndex: 0,
        SubnetId: 'subnet-0000000000000000a',
        Groups: ['sg-0123456789abcdef0'],
        AssociatePublicIpAddress: true,
        DeleteOnTermination: true,
      },
    ]);
    expect(Buffer.from(i.UserData ?? '', 'base64').toString()).toBe('#cloud-config\n');
    expect(i.InstanceMarketOptions).toBeUndefined();
  });

  it('ClientToken: stable for one installation, Proxy, name and subnet; different when any changes', () => {
    const t = clientToken(req, 'subnet-a');
    expect(t).toMatch(/^[0-9a-f]{64}$/);
    expect(clientToken({ ...req }, 'subnet-a')).toBe(t);
    expect(input().ClientToken).toBe(clientToken(req, 'subnet-0000000000000000a'));
    for (const other of [
      clientToken({ ...req, installation: 'inst-2' }, 'subnet-a'),
      clientToken({ ...req, uid: 'uid-other' }, 'subnet-a'),
      clientToken({ ...req, name: 'px-abc-124' }, 'subnet-a'),
      clientToken(req, 'subnet-b'),
    ])
      expect(other).not.toBe(t);
  });

  it('IPv6 and spot with a max price', () => {
    const i = input({ ipv6: true, publicIPv4: false, market: 'spot', maxPrice: '0.02' });
    expect(i.NetworkInterfaces?.[0]).toMatchObject({ AssociatePublicIpAddress: false, Ipv6AddressCount: 1 });
    expect(i.InstanceMarketOptions).toEqual({
      MarketType: 'spot',
      SpotOptions: {
        SpotInstanceType: 'one-time',
        InstanceInterruptionBehavior: 'terminate',
        MaxPrice: '0.02',
      },
    });
  });

  it('placement.zone: a zone, a region, none (the first region), or an error naming the field', () => {
    const s = awsSettings(config);
    expect(placementOf('eu-west-1b', s).subnets.map((x) => x.zone)).toEqual(['eu-west-1b']);
    expect(placementOf('us-east-1', s).region.name).toBe('us-east-1');
    expect(placementOf(undefined, s).subnets).toHaveLength(2);
    expect(() => placementOf('ap-south-1a', s)).toThrow(/placement\.zone "ap-south-1a" is neither/);
  });

  it('images and instance types: keys, literal values, defaults, errors naming the field', () => {
    expect(resolveImage(undefined, {})).toMatch(/^ssm:\/aws\/service\/canonical\/ubuntu/);
    expect(resolveImage('squid', { squid: 'ami-0123456789abcdef0' })).toBe('ami-0123456789abcdef0');
    expect(resolveImage('ami-0123456789abcdef1', {})).toBe('ami-0123456789abcdef1');
    expect(() => resolveImage('ubuntu', {})).toThrow(/placement\.image "ubuntu"/);
    expect(resolveInstanceType(undefined, {})).toBe('t3.micro');
    expect(resolveInstanceType('big', { big: 'c7i.large' })).toBe('c7i.large');
    expect(resolveInstanceType('m7g.medium', {})).toBe('m7g.medium');
    expect(() => resolveInstanceType('huge', {})).toThrow(/placement\.machineType "huge"/);
  });

  it('provider IDs and states', () => {
    expect(parseProviderID('regions/eu-west-1/instances/px-a-1')).toEqual({
      region: 'eu-west-1',
      name: 'px-a-1',
    });
    expect(() => parseProviderID('i-0123456789abcdef0')).toThrow(/malformed providerID/);
    expect(stateFromEc2('running', true)).toBe('Running');
    expect(stateFromEc2('running', false)).toBe('Pending');
    expect(stateFromEc2('stopped', false)).toBe('Stopped');
    expect(stateFromEc2('shutting-down', true)).toBe('Terminated');
  });
});

describe('aws restart', () => {
  it('is offered on demand, not on spot (one-time spot instances cannot be stopped)', () => {
    expect(canRestart(createAwsProvider({ name: 'a', config }))).toBe(true);
    expect(canRestart(createAwsProvider({ name: 'b', config: { ...config, market: 'spot' } }))).toBe(false);
  });
});

describe('aws egress policy', () => {
  it('denies the metadata service even when allowCIDRs opens link-local and unique-local ranges', () => {
    const denied = deniedAddressMatcher(
      awsEgressPolicy({ ...config, egressPolicy: { allowCIDRs: ['169.254.0.0/16', 'fc00::/7'] } }),
    );
    expect(denied('169.254.169.254')).toBe(true);
    expect(denied('fd00:ec2::254')).toBe(true);
    expect(denied('169.254.1.1')).toBe(false);
  });
});

describe('aws error mapping', () => {
  const sdkError = (code: string, http: number) =>
    Object.assign(new Error(`message of ${code}`), {
      name: code,
      $fault: 'client',
      $metadata: { httpStatusCode: http },
    });
  it.each([
    ['RequestLimitExceeded', 503, 'Transient'],
    ['Throttling', 400, 'Transient'],
    ['InsufficientInstanceCapacity', 500, 'QuotaExceeded'],
    ['VcpuLimitExceeded', 400, 'QuotaExceeded'],
    ['InstanceLimitExceeded', 400, 'QuotaExceeded'],
    ['UnauthorizedOperation', 403, 'Permanent'],
    ['AuthFailure', 401, 'Permanent'],
    ['InvalidAMIID.NotFound', 400, 'Permanent'],
    ['InvalidAMIID.Malformed', 400, 'Permanent'],
    ['InternalError', 500, 'Transient'],
  ])('%s (HTTP %d) is %s with the code in the message', (code, http, cls) => {
    expect(classForCode(code, http)).toBe(cls);
    const pe = toProviderError(sdkError(code, http), {
      op: 'create',
      provider: 'aws-main',
      providerID: 'regions/eu-west-1/instances/px-a',
    });
    expect(pe.errorClass).toBe(cls);
    expect(pe.message).toBe(`aws-main create regions/eu-west-1/instances/px-a: ${code}: message of ${code}`);
  });

  it('an abort is Transient; secrets are redacted from messages', () => {
    const abort = Object.assign(new Error('aborted'), { name: 'AbortError' });
    expect(toProviderError(abort, { op: 'get', provider: 'p' }).errorClass).toBe('Transient');
    const leaky = sdkError('InvalidParameterValue', 400);
    leaky.message = 'bad user data #cloud-config secret-hash';
    const pe = toProviderError(leaky, { op: 'create', provider: 'p', secrets: ['secret-hash'] });
    expect(pe.message).not.toContain('secret-hash');
  });
});

describe('the IAM policy of docs/providers/aws.md', () => {
  /** Every `new XxxCommand(` and `paginateXxx(` in the provider's source, with its service. */
  function actionsCalled(): string[] {
    const dir = join(ROOT, 'src', 'provider', 'aws');
    const actions = new Set<string>();
    for (const f of readdirSync(dir).filter((x) => x.endsWith('.ts'))) {
      const text = readFileSync(join(dir, f), 'utf8');
      const ssm = new Set<string>();
      for (const m of text.matchAll(/import\s*\{([^}]*)\}\s*from\s*'@aws-sdk\/client-ssm'/g)) {
        for (const name of m[1]!.split(',')) ssm.add(name.replace(/\btype\b/, '').trim());
      }
      for (const m of text.matchAll(/new (\w+)Command\(/g)) {
        const cmd = `${m[1]}Command`;
        actions.add(`${ssm.has(cmd) ? 'ssm' : 'ec2'}:${m[1]}`);
      }
      for (const m of text.matchAll(/\bpaginate(\w+)\(/g)) actions.add(`ec2:${m[1]}`);
    }
    return [...actions].sort();
  }

  function policyActions(): Set<string> {
    const doc = readFileSync(join(ROOT, 'docs', 'providers', 'aws.md'), 'utf8');
    const json = /## IAM permissions[\s\S]*?```json\n([\s\S]*?)```/.exec(doc)?.[1];
    expect(json, 'docs/providers/aws.md has an IAM policy block').toBeTruthy();
    const policy = JSON.parse(json!) as { Statement: { Effect: string; Action: string | string[] }[] };
    return new Set(policy.Statement.filter((s) => s.Effect === 'Allow').flatMap((s) => [s.Action].flat()));
  }

  it('allows every EC2 and SSM action the provider calls', () => {
    const called = actionsCalled();
    // The scan finds what it should: a provider that calls nothing would pass vacuously.
    expect(called).toEqual(
      expect.arrayContaining([
        'ec2:RunInstances',
        'ec2:DescribeInstances',
        'ec2:TerminateInstances',
        'ssm:GetParameter',
      ]),
    );
    const allowed = policyActions();
    expect(called.filter((a) => !allowed.has(a))).toEqual([]);
  });
});
