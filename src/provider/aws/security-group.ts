/**
 * provider/aws/security-group — the managed security group that admits the proxy port from the
 * configured source ranges only: one per VPC and port, named after the port, tagged as ours, so
 * every Proxy on that port in that VPC shares it. Found by name or created, once per VPC, port
 * and process (a failed ensure is retried on the next create). A region that lists its own
 * `securityGroupIds` uses those instead and nothing is created.
 */

import { isIP } from 'node:net';
import {
  AuthorizeSecurityGroupIngressCommand,
  CreateSecurityGroupCommand,
  DescribeSecurityGroupsCommand,
  DescribeSubnetsCommand,
  type EC2Client,
} from '@aws-sdk/client-ec2';
import type { Logger } from 'pino';
import { INSTANCE_LABEL_MANAGED, MANAGED_BY_VALUE } from '../../api/constants.ts';
import type { CallContext } from '../contract.ts';
import { transient } from '../errors.ts';
import { parseError, toProviderError, type Where } from './errors.ts';

export function securityGroupName(port: number): string {
  return `egress-proxy-tcp-${port}`;
}

export interface GroupKeeperOptions {
  sourceRanges: string[];
  log: Logger;
  where: (op: string, providerID?: string) => Where;
}

export class SecurityGroupKeeper {
  private readonly ready = new Map<string, Promise<string>>();
  private readonly vpcs = new Map<string, Promise<string>>();
  private readonly o: GroupKeeperOptions;
  constructor(o: GroupKeeperOptions) {
    this.o = o;
  }

  /** The managed group's ID for the subnet's VPC and `port`, created when missing. */
  async ensure(
    ctx: CallContext,
    ec2: EC2Client,
    region: string,
    subnetId: string,
    port: number,
  ): Promise<string> {
    const vpc = await this.vpcOf(ctx, ec2, region, subnetId);
    const key = `${region}/${vpc}/${port}`;
    let ready = this.ready.get(key);
    if (!ready) {
      ready = this.create(ctx, ec2, vpc, port);
      this.ready.set(key, ready);
      ready.catch(() => this.ready.delete(key));
    }
    return ready;
  }

  private vpcOf(ctx: CallContext, ec2: EC2Client, region: string, subnetId: string): Promise<string> {
    const key = `${region}/${subnetId}`;
    let vpc = this.vpcs.get(key);
    if (!vpc) {
      vpc = (async () => {
        try {
          const out = await ec2.send(new DescribeSubnetsCommand({ SubnetIds: [subnetId] }), {
            abortSignal: ctx.signal,
          });
          const id = out.Subnets?.[0]?.VpcId;
          if (!id) throw new Error(`subnet ${subnetId} has no VPC`);
          return id;
        } catch (err) {
          throw toProviderError(
            err,
            this.o.where('create', `regions/${region}/subnets/${subnetId}`),
            ctx.signal,
          );
        }
      })();
      this.vpcs.set(key, vpc);
      vpc.catch(() => this.vpcs.delete(key));
    }
    return vpc;
  }

  private async create(ctx: CallContext, ec2: EC2Client, vpcId: string, port: number): Promise<string> {
    const name = securityGroupName(port);
    const where = this.o.where('create', `vpcs/${vpcId}/security-groups/${name}`);
    const opts = { abortSignal: ctx.signal };
    try {
      const found = await ec2.send(
        new DescribeSecurityGroupsCommand({
          Filters: [
            { Name: 'vpc-id', Values: [vpcId] },
            { Name: 'group-name', Values: [name] },
          ],
        }),
        opts,
      );
      const existing = found.SecurityGroups?.[0];
      if (existing?.GroupId) {
        // A group whose rule never got added (a crash between the two calls) gets it now.
        const open = (existing.IpPermissions ?? []).some((p) => p.FromPort === port && p.ToPort === port);
        if (!open) await this.authorize(ctx, ec2, existing.GroupId, port);
        return existing.GroupId;
      }
      let groupId: string | undefined;
      try {
        const made = await ec2.send(
          new CreateSecurityGroupCommand({
            GroupName: name,
            VpcId: vpcId,
            Description: `Proxy port ${port}, managed by ${MANAGED_BY_VALUE}`,
            TagSpecifications: [
              {
                ResourceType: 'security-group',
                Tags: [
                  { Key: INSTANCE_LABEL_MANAGED, Value: 'true' },
                  { Key: 'managed-by', Value: MANAGED_BY_VALUE },
                ],
              },
            ],
          }),
          opts,
        );
        groupId = made.GroupId;
      } catch (err) {
        // Another process made it in between: the next ensure finds it (and adds its rule).
        if (parseError(err).code === 'InvalidGroup.Duplicate') {
          throw transient(`${where.provider} create: security group ${name} was created concurrently`, where);
        }
        throw err;
      }
      if (!groupId) throw new Error('CreateSecurityGroup answered no GroupId');
      await this.authorize(ctx, ec2, groupId, port);
      this.o.log.info({ securityGroup: name, vpc: vpcId, groupId }, 'aws security group created');
      return groupId;
    } catch (err) {
      throw toProviderError(err, where, ctx.signal);
    }
  }

  /** Admits `port` from the source ranges; a rule already there is success. */
  private async authorize(ctx: CallContext, ec2: EC2Client, groupId: string, port: number): Promise<void> {
    const v4 = this.o.sourceRanges.filter((r) => isIP(r.split('/')[0] ?? '') === 4);
    const v6 = this.o.sourceRanges.filter((r) => isIP(r.split('/')[0] ?? '') === 6);
    try {
      await ec2.send(
        new AuthorizeSecurityGroupIngressCommand({
          GroupId: groupId,
          IpPermissions: [
            {
              IpProtocol: 'tcp',
              FromPort: port,
              ToPort: port,
              ...(v4.length ? { IpRanges: v4.map((CidrIp) => ({ CidrIp })) } : {}),
              ...(v6.length ? { Ipv6Ranges: v6.map((CidrIpv6) => ({ CidrIpv6 })) } : {}),
            },
          ],
        }),
        { abortSignal: ctx.signal },
      );
    } catch (err) {
      if (parseError(err).code !== 'InvalidPermission.Duplicate') throw err;
    }
  }
}
