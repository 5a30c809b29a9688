/**
 * The aws block of the providers config: a valid entry (two accounts as two entries), and one
 * failing case per rule, each naming the field path and what to write there.
 */
import { describe, expect, it } from 'vitest';
import { validateProvidersConfig } from '../../../src/config/validate.ts';

type Obj = Record<string, unknown>;

const region = (patch: Obj = {}): Obj => ({
  name: 'eu-west-1',
  subnets: [
    { id: 'subnet-0123456789abcdef0', zone: 'eu-west-1a' },
    { id: 'subnet-0123456789abcdef1', zone: 'eu-west-1b' },
  ],
  ...patch,
});
const aws = (patch: Obj = {}, name = 'aws-main'): Obj => ({
  name,
  type: 'aws',
  aws: { regions: [region()], securityGroup: { sourceRanges: ['203.0.113.0/24'] }, ...patch },
});
const errorsOf = (...providers: Obj[]) => {
  const r = validateProvidersConfig({ providers });
  return r.ok ? [] : r.errors.map((e) => [e.path, e.message]);
};

describe('providers config: aws', () => {
  it('accepts a full entry, and two accounts as two entries', () => {
    const full = aws({
      profile: 'crawl-prod',
      instanceTypes: { default: 't3.micro', big: 'c7i.large' },
      images: {
        default: 'ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id',
        pinned: 'ami-0123456789abcdef0',
      },
      ipv6: true,
      market: 'spot',
      maxPrice: '0.01',
      endpoint: 'http://127.0.0.1:5000',
      egressPolicy: { denyCIDRs: ['198.51.100.0/24'] },
    });
    const second = aws(
      {
        regions: [
          region({
            name: 'us-east-1',
            subnets: [{ id: 'subnet-0aaaaaaaaaaaaaaaa', zone: 'us-east-1a' }],
            securityGroupIds: ['sg-0123456789abcdef0'],
          }),
        ],
        securityGroup: undefined,
      },
      'aws-other-account',
    );
    expect(errorsOf(full, second)).toEqual([]);
  });

  it.each<[string, Obj, string, string]>([
    ['no block', { aws: undefined }, 'providers[0].aws', 'is required for type aws'],
    [
      'no region',
      { aws: { regions: [], securityGroup: { sourceRanges: ['203.0.113.0/24'] } } },
      'providers[0].aws.regions',
      'must list at least one region',
    ],
  ])('%s', (_what, patch, path, words) => {
    const entry = { ...aws(), ...patch };
    if (patch.aws === undefined) delete entry.aws;
    const errs = errorsOf(entry);
    expect(
      errs.some(([p, m]) => p === path && String(m).includes(words)),
      JSON.stringify(errs),
    ).toBe(true);
  });

  it.each<[string, Obj, string, string]>([
    [
      'a bad region',
      { regions: [region({ name: 'Europe' })] },
      'aws.regions[0].name',
      'must be an AWS region',
    ],
    ['a region twice', { regions: [region(), region()] }, 'aws.regions[1].name', 'duplicate region'],
    [
      'no subnet',
      { regions: [region({ subnets: [] })] },
      'aws.regions[0].subnets',
      'must list at least one subnet',
    ],
    [
      'a bad subnet ID',
      { regions: [region({ subnets: [{ id: 'net-1', zone: 'eu-west-1a' }] })] },
      'aws.regions[0].subnets[0].id',
      'must be a subnet ID',
    ],
    [
      'a zone of another region',
      { regions: [region({ subnets: [{ id: 'subnet-0123456789abcdef0', zone: 'us-east-1a' }] })] },
      'aws.regions[0].subnets[0].zone',
      'availability zone of eu-west-1',
    ],
    [
      'a bad group ID',
      { regions: [region({ securityGroupIds: ['default'] })] },
      'aws.regions[0].securityGroupIds[0]',
      'must be a security group ID',
    ],
    [
      'no group at all',
      { securityGroup: undefined },
      'aws.regions[0].securityGroupIds',
      'unless aws.securityGroup is set',
    ],
    [
      'a bad source range',
      { securityGroup: { sourceRanges: ['anywhere'] } },
      'aws.securityGroup.sourceRanges[0]',
      'must be a CIDR range',
    ],
    [
      'no source range',
      { securityGroup: { sourceRanges: [] } },
      'aws.securityGroup.sourceRanges',
      'at least one CIDR range',
    ],
    [
      'a bad instance type',
      { instanceTypes: { default: 'micro' } },
      'aws.instanceTypes.default',
      'must be an EC2 instance type',
    ],
    [
      'a bad image',
      { images: { default: 'ubuntu' } },
      'aws.images.default',
      'must be an AMI ID (ami-…) or ssm:<parameter>',
    ],
    ['no public address', { publicIPv4: false }, 'aws.publicIPv4', 'no public address'],
    ['maxPrice without spot', { maxPrice: '0.01' }, 'aws.maxPrice', 'only used with market: spot'],
    ['a bad maxPrice', { market: 'spot', maxPrice: 'cheap' }, 'aws.maxPrice', 'must be a positive price'],
    ['a bad endpoint', { endpoint: 'localhost:5000' }, 'aws.endpoint', 'must be an http(s) URL'],
    ['an empty profile', { profile: ' ' }, 'aws.profile', 'must not be empty'],
    ['an unknown field', { zone: 'eu-west-1a' }, 'aws.zone', 'is not a known field'],
    ['a bad market', { market: 'reserved' }, 'aws.market', 'on-demand'],
    ['a bad egress range', { egressPolicy: { denyCIDRs: ['x'] } }, 'aws.egressPolicy.denyCIDRs[0]', '"x"'],
  ])('%s names %s', (_what, patch, field, words) => {
    const errs = errorsOf(aws(patch));
    const hit = errs.find(([p]) => p === `providers[0].${field}`);
    expect(hit, JSON.stringify(errs)).toBeTruthy();
    expect(String(hit?.[1])).toContain(`providers[0] (aws-main): ${field} `);
    expect(String(hit?.[1])).toContain(words);
  });
});
