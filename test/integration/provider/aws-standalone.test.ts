/**
 * Done-when of the aws provider: an `aws` entry added to the standalone example, pointed at
 * moto's server, brings Proxies to Ready and healthy through the real SDK in the real operator
 * process — create, get until running with an address, the health engine's probe through the
 * proxy, the lease API listing them.
 *
 * moto does not boot instances, so this test plays them, as cloud-init would: for each running
 * managed instance it reads the instance's user data back from moto, takes the Basic-auth
 * htpasswd line and the port from the Squid cloud-init there, and serves a forward proxy
 * checking credentials against that line on a loopback address standing for the instance's
 * public IP (moto's a.b.c.d → 127.b.c.d; the layer in front of moto rewrites the addresses the
 * operator reads the same way). What is proven: the SDK calls, the state mapping, the address,
 * the credentials and port the cloud-init carries; what is not: Squid on EC2 itself (the Squid
 * cloud-init runs on the KVM guest tier and in the Squid end-to-end tests).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  DescribeInstanceAttributeCommand,
  DescribeInstancesCommand,
  type EC2Client,
} from '@aws-sdk/client-ec2';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parse } from 'yaml';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { md5crypt } from '../../../src/provider/squid/htpasswd.ts';
import {
  CliProcess,
  cleanupCli,
  createWorkspace,
  standaloneArgs,
  type Workspace,
  waitForReady,
} from '../../support/cli.ts';
import {
  loopbackOf,
  type Moto,
  type MotoFront,
  motoEc2,
  seedRegion,
  startMoto,
  startMotoFront,
} from '../../support/moto.ts';

vi.setConfig({ testTimeout: 120_000, hookTimeout: 60_000 });

const REGION = 'eu-west-1';
let moto: Moto;
let front: MotoFront;
let ec2: EC2Client;
let ws: Workspace;
const vms = new Map<string, ForwardProxy>();
let timer: NodeJS.Timeout | undefined;

/** The htpasswd line and port of the default Squid cloud-init in `userData`. */
function fromCloudInit(userData: string): { line: string; port: number } {
  const doc = parse(userData) as { write_files: { path: string; content: string }[] };
  const line = doc.write_files.find((f) => f.path.endsWith('htpasswd'))?.content.trim() ?? '';
  const port = Number(/Basic auth on port (\d+)/.exec(userData)?.[1]);
  return { line, port };
}

/** Whether `user:pass` matches an `user:$apr1$salt$hash` line, as Squid's basic_ncsa_auth checks. */
function matches(line: string, user: string, pass: string): boolean {
  const [name, hash = ''] = line.split(':');
  const salt = hash.split('$')[2] ?? '';
  return name === user && md5crypt(pass, salt) === hash;
}

/** Serves a forward proxy for each running managed instance moto has, as its user data says. */
async function playInstances(discoveryPort: number): Promise<void> {
  const out = await ec2.send(
    new DescribeInstancesCommand({
      Filters: [
        { Name: 'tag:proxy-operator-managed', Values: ['true'] },
        { Name: 'instance-state-name', Values: ['running'] },
      ],
    }),
  );
  for (const inst of (out.Reservations ?? []).flatMap((r) => r.Instances ?? [])) {
    const id = inst.InstanceId ?? '';
    if (vms.has(id) || !inst.PublicIpAddress) continue;
    const attr = await ec2.send(
      new DescribeInstanceAttributeCommand({ InstanceId: id, Attribute: 'userData' }),
    );
    const { line, port } = fromCloudInit(Buffer.from(attr.UserData?.Value ?? '', 'base64').toString('utf8'));
    const proxy = new ForwardProxy({
      // Nobody knows this one: only the htpasswd line from the user data admits a client.
      credentials: { username: 'nobody', password: `unused-${id}-Xx1` },
      leaseCredentials: (u, p) => matches(line, u, p),
      log: silentLogger(),
      egress: new EgressGuard(
        resolveEgressPolicy({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [discoveryPort] }),
      ),
    });
    vms.set(id, proxy);
    await proxy.listen(port, loopbackOf(inst.PublicIpAddress));
  }
}

beforeAll(async () => {
  moto = await startMoto();
  front = await startMotoFront(moto.url);
  front.loopbackAddresses = true;
  const seed = await seedRegion(moto.url, REGION, [`${REGION}a`, `${REGION}b`]);
  ec2 = motoEc2(moto.url, REGION);
  ws = await createWorkspace();
  // The example, plus an aws entry pointed at moto (through the layer in front of it).
  const aws = [
    '  - name: aws-moto',
    '    type: aws',
    '    aws:',
    '      regions:',
    `        - name: ${REGION}`,
    '          subnets:',
    ...seed.subnets.map((s) => `            - {id: ${s.id}, zone: ${s.zone}}`),
    `      images: {default: ${seed.imageId}}`,
    '      securityGroup: {sourceRanges: ["203.0.113.0/24"]}',
    `      endpoint: ${front.url}`,
    '',
  ].join('\n');
  const providers = readFileSync(ws.providersFile, 'utf8');
  writeFileSync(ws.providersFile, providers.replace(/^providers:\n/m, `providers:\n${aws}`));
  for (const name of ['aws-1', 'aws-2']) {
    writeFileSync(
      join(ws.proxiesDir, `${name}.yaml`),
      [
        'apiVersion: crawl.example.com/v1alpha1',
        'kind: Proxy',
        `metadata: {name: ${name}, namespace: crawl}`,
        'spec:',
        '  provider: aws-moto',
        `  placement: {zone: ${REGION}b}`,
        '  healthCheck: {url: "http://operator.invalid/generate_204", expectStatus: 204}',
        '',
      ].join('\n'),
    );
  }
});

afterAll(async () => {
  if (timer) clearInterval(timer);
  await cleanupCli();
  for (const p of vms.values()) await p.close();
  ec2?.destroy();
  await front?.close();
  await moto?.close();
});

describe('standalone with an aws provider entry (moto)', () => {
  it('brings the aws Proxies to Ready and healthy through the real SDK', async () => {
    let busy = false;
    timer = setInterval(() => {
      if (busy) return;
      busy = true;
      playInstances(ws.discoveryPort)
        .catch(() => undefined)
        .finally(() => {
          busy = false;
        });
    }, 200);
    const proc = new CliProcess(standaloneArgs(ws), ws.dir, {
      env: {
        AWS_ACCESS_KEY_ID: 'testing',
        AWS_SECRET_ACCESS_KEY: 'testing',
        AWS_EC2_METADATA_DISABLED: 'true',
        AWS_CONFIG_FILE: join(ws.dir, 'no-aws-config'),
        AWS_SHARED_CREDENTIALS_FILE: join(ws.dir, 'no-aws-credentials'),
      },
    });
    const ready = await waitForReady(ws, proc, ['aws-1', 'aws-2', 'local-1', 'local-2', 'local-3'], 90_000);
    const awsOnes = ready.filter((p) => p.name.startsWith('aws-'));
    expect(awsOnes).toHaveLength(2);
    for (const p of awsOnes) {
      expect(p.phase).toBe('Ready');
      expect(p.healthy).toBe(true);
    }
    expect(vms.size).toBe(2);
    expect(front.calls.get('RunInstances')).toBe(2);
  });
});
