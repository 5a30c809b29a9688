/**
 * provider/aws/instance — pure translations between our contract and EC2: provider IDs, the
 * RunInstances input (tags, idempotency token, IMDSv2, network interface, spot), image and
 * instance type resolution, zone → subnets, and EC2's six instance states as ours.
 */
import { createHash } from 'node:crypto';
import type { Instance as Ec2Instance, RunInstancesCommandInput, Tag } from '@aws-sdk/client-ec2';
import {
  INSTANCE_LABEL_INSTALLATION,
  INSTANCE_LABEL_MANAGED,
  INSTANCE_LABEL_NAMESPACE,
  INSTANCE_LABEL_UID,
  MANAGED_BY_VALUE,
} from '../../api/constants.ts';
import { locationOf } from '../../api/location.ts';
import { AWS_DEFAULTS } from '../../config/defaults.ts';
import type { AwsProviderConfig, AwsRegion } from '../../config/schema.ts';
import type { CreateRequest, Instance, InstanceState } from '../contract.ts';
import { permanent } from '../errors.ts';
import { htpasswdProblem } from '../squid/htpasswd.ts';

/** The tag holding the deterministic instance name (EC2's console shows it). */
export const NAME_TAG = 'Name';
/** The instance metadata service's addresses: the egress policy always denies them on AWS. */
export const METADATA_CIDRS = ['169.254.169.254/32', 'fd00:ec2::254/128'] as const;
/** Every state but terminated: what find-by-name and listByTag look at. */
export const LIVE_STATES = ['pending', 'running', 'shutting-down', 'stopping', 'stopped'];

const NAME = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const REGION = /^[a-z]{2}(-[a-z]+)+-\d+$/;
const ID_PATTERN = /^regions\/([^/]+)\/instances\/([^/]+)$/;

export interface AwsRef {
  region: string;
  name: string;
}

export function providerIDOf(ref: AwsRef): string {
  return `regions/${ref.region}/instances/${ref.name}`;
}

/** `regions/<region>/instances/<name>`, strictly; anything else can never become valid. */
export function parseProviderID(id: string, provider = 'aws'): AwsRef {
  const m = ID_PATTERN.exec(id);
  const [, region = '', name = ''] = m ?? [];
  if (!m || !REGION.test(region) || !NAME.test(name)) {
    throw permanent(
      `${provider}: malformed providerID ${JSON.stringify(id)}, want regions/<region>/instances/<name>`,
      { provider, providerID: id },
    );
  }
  return { region, name };
}

/**
 * The RunInstances idempotency token: one per installation, Proxy, instance name (its UID and
 * spec-hash, so one per generation of the spec) and subnet. A create retried after a crash or a
 * lost answer sends the same token and gets the same instance back, never a second one; the
 * subnet is part of it because a different subnet is a different request to EC2
 * (IdempotentParameterMismatch), and the next zone is only tried after this one said no.
 */
export function clientToken(
  req: Pick<CreateRequest, 'installation' | 'uid' | 'name'>,
  subnetId: string,
): string {
  const text = [req.installation ?? '', req.uid, req.name, subnetId].join('\n');
  // 64 characters: EC2's limit for ClientToken.
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

export function instanceTags(req: Pick<CreateRequest, 'name' | 'uid' | 'namespace' | 'installation'>): Tag[] {
  const tags: Record<string, string> = {
    [NAME_TAG]: req.name,
    [INSTANCE_LABEL_MANAGED]: 'true',
    [INSTANCE_LABEL_UID]: req.uid,
    [INSTANCE_LABEL_NAMESPACE]: req.namespace,
    ...(req.installation ? { [INSTANCE_LABEL_INSTALLATION]: req.installation } : {}),
    'managed-by': MANAGED_BY_VALUE,
  };
  return Object.entries(tags).map(([Key, Value]) => ({ Key, Value }));
}

export function tagOf(inst: { Tags?: Tag[] | undefined }, key: string): string | undefined {
  return inst.Tags?.find((t) => t.Key === key)?.Value;
}

/** EC2's states as ours. running counts only with a public address (the proxy needs one). */
export function stateFromEc2(state: string | undefined, hasAddress: boolean): InstanceState {
  switch (state) {
    case 'pending':
      return 'Pending';
    case 'running':
      return hasAddress ? 'Running' : 'Pending';
    case 'stopping':
      return 'Stopping';
    case 'stopped':
      return 'Stopped';
    case 'shutting-down':
    case 'terminated':
      return 'Terminated';
    default:
      return 'Unknown';
  }
}

/** The public IPv4 address, else the first IPv6 address of the primary interface. */
export function publicAddress(inst: Ec2Instance): string | undefined {
  if (inst.PublicIpAddress) return inst.PublicIpAddress;
  if (inst.Ipv6Address) return inst.Ipv6Address;
  for (const nic of inst.NetworkInterfaces ?? []) {
    for (const a of nic.Ipv6Addresses ?? []) if (a.Ipv6Address) return a.Ipv6Address;
  }
  return undefined;
}

export function instanceFromEc2(inst: Ec2Instance, region: string): Instance {
  const name = tagOf(inst, NAME_TAG) ?? '';
  const address = publicAddress(inst);
  const out: Instance = {
    id: providerIDOf({ region, name }),
    name,
    state: stateFromEc2(inst.State?.Name, address !== undefined),
  };
  if (address) out.address = address;
  const uid = tagOf(inst, INSTANCE_LABEL_UID);
  if (uid) out.uid = uid;
  const ns = tagOf(inst, INSTANCE_LABEL_NAMESPACE);
  if (ns) out.namespace = ns;
  const installation = tagOf(inst, INSTANCE_LABEL_INSTALLATION);
  if (installation) out.installation = installation;
  if (inst.LaunchTime && !Number.isNaN(inst.LaunchTime.getTime())) out.createdAt = inst.LaunchTime;
  const location = locationOf(region, inst.Placement?.AvailabilityZone);
  if (location) out.location = location;
  return out;
}

// ---- create ---------------------------------------------------------------------------------

/** The provider config with defaults filled in. */
export interface AwsSettings {
  regions: AwsRegion[];
  instanceTypes: Record<string, string>;
  images: Record<string, string>;
  sourceRanges: string[] | undefined;
  publicIPv4: boolean;
  ipv6: boolean;
  spot: boolean;
  maxPrice: string | undefined;
}

export function awsSettings(c: AwsProviderConfig): AwsSettings {
  return {
    regions: c.regions,
    instanceTypes: c.instanceTypes ?? {},
    images: c.images ?? {},
    sourceRanges: c.securityGroup ? [...c.securityGroup.sourceRanges] : undefined,
    publicIPv4: c.publicIPv4 ?? AWS_DEFAULTS.publicIPv4,
    ipv6: c.ipv6 ?? AWS_DEFAULTS.ipv6,
    spot: (c.market ?? AWS_DEFAULTS.market) === 'spot',
    maxPrice: c.maxPrice,
  };
}

/**
 * Where a request goes: placement.zone names an availability zone (its subnets) or a region (all
 * of its subnets, in order); none: the first region. Throws (a message) when it names neither.
 */
export function placementOf(
  zone: string | undefined,
  s: AwsSettings,
): { region: AwsRegion; subnets: AwsRegion['subnets'] } {
  const first = s.regions[0];
  if (!first) throw new Error('aws.regions lists no region');
  if (zone === undefined || zone === '') return { region: first, subnets: first.subnets };
  for (const r of s.regions) {
    if (r.name === zone) return { region: r, subnets: r.subnets };
    const inZone = r.subnets.filter((sn) => sn.zone === zone);
    if (inZone.length > 0) return { region: r, subnets: inZone };
  }
  const known = s.regions.flatMap((r) => [r.name, ...r.subnets.map((sn) => sn.zone)]);
  throw new Error(
    `placement.zone ${JSON.stringify(zone)} is neither a region nor a zone of aws.regions (have: ${[...new Set(known)].join(', ')})`,
  );
}

/** placement.machineType: a key of instanceTypes, else an instance type itself. */
export function resolveInstanceType(machineType: string | undefined, types: Record<string, string>): string {
  if (machineType === undefined) return types.default ?? AWS_DEFAULTS.instanceType;
  const mapped = types[machineType];
  if (mapped !== undefined) return mapped;
  if (/^[a-z][a-z0-9-]*\.[a-z0-9]+$/.test(machineType)) return machineType;
  const known = Object.keys(types).sort().join(', ') || 'none configured';
  throw new Error(
    `placement.machineType ${JSON.stringify(machineType)} is neither a key of aws.instanceTypes (have: ${known}) nor an instance type (e.g. t3.micro)`,
  );
}

/** placement.image: a key of images, else an AMI ID or `ssm:<parameter>`. */
export function resolveImage(image: string | undefined, images: Record<string, string>): string {
  if (image === undefined) return images.default ?? AWS_DEFAULTS.image;
  const mapped = images[image];
  if (mapped !== undefined) return mapped;
  if (/^ami-[0-9a-f]{8,17}$/.test(image) || /^ssm:\/\S+$/.test(image)) return image;
  const known = Object.keys(images).sort().join(', ') || 'none configured';
  throw new Error(
    `placement.image ${JSON.stringify(image)} is neither a key of aws.images (have: ${known}) nor an AMI ID or ssm:<parameter>`,
  );
}

/** Everything about a request that would produce an invalid instance, as one list. */
export function requestProblems(req: CreateRequest): string[] {
  const problems: string[] = [];
  if (!NAME.test(req.name)) {
    problems.push(`name ${JSON.stringify(req.name)} is not a valid instance name (a DNS label, ≤ 63)`);
  }
  if (!Number.isInteger(req.port) || req.port < 1 || req.port > 65535) {
    problems.push(`port ${req.port} is not a port (1-65535)`);
  }
  const cred = htpasswdProblem(req.credentials);
  if (cred) problems.push(cred);
  return problems;
}

/** The RunInstances input for one subnet. `userData` is secret: never log the result. */
export function buildRunInstancesInput(o: {
  req: CreateRequest;
  settings: AwsSettings;
  subnetId: string;
  imageId: string;
  instanceType: string;
  securityGroupIds: string[];
  userData: string;
}): RunInstancesCommandInput {
  const { req, settings: s } = o;
  const tags = instanceTags(req);
  return {
    ClientToken: clientToken(req, o.subnetId),
    ImageId: o.imageId,
    InstanceType: o.instanceType as RunInstancesCommandInput['InstanceType'],
    MinCount: 1,
    MaxCount: 1,
    UserData: Buffer.from(o.userData, 'utf8').toString('base64'),
    // IMDSv2 only, and one hop: a process behind the proxy (or a container) cannot reach the
    // instance's credentials even if the egress policy were opened.
    MetadataOptions: { HttpTokens: 'required', HttpPutResponseHopLimit: 1, HttpEndpoint: 'enabled' },
    NetworkInterfaces: [
      {
        DeviceIndex: 0,
        SubnetId: o.subnetId,
        Groups: o.securityGroupIds,
        AssociatePublicIpAddress: s.publicIPv4,
        DeleteOnTermination: true,
        ...(s.ipv6 ? { Ipv6AddressCount: 1 } : {}),
      },
    ],
    // Stopping from the OS (a shutdown in the guest) ends the instance instead of parking it.
    InstanceInitiatedShutdownBehavior: 'terminate',
    // Tagged in the same call: there is never an untagged instance for the sweep to miss.
    TagSpecifications: [
      { ResourceType: 'instance', Tags: tags },
      { ResourceType: 'volume', Tags: tags },
    ],
    ...(s.spot
      ? {
          // One-time spot: an interrupted instance is terminated, get answers NotFound and the
          // reconciler's lost-instance path creates a replacement.
          InstanceMarketOptions: {
            MarketType: 'spot',
            SpotOptions: {
              SpotInstanceType: 'one-time',
              InstanceInterruptionBehavior: 'terminate',
              ...(s.maxPrice ? { MaxPrice: s.maxPrice } : {}),
            },
          },
        }
      : {}),
  };
}
