/**
 * test/support/moto — moto's EC2 and SSM emulation (PyPI `moto[server]`, pinned in
 * scripts/ci/moto/requirements.txt) started as `moto_server` on a free loopback port from the
 * private virtual environment npm test makes (`bash scripts/ci/venv.sh moto`), and a small
 * HTTP layer in front of it for what moto cannot be made to answer: injected AWS errors by
 * action, and public addresses rewritten to loopback ones a test can serve a proxy on. A missing
 * environment or a server that does not come up fails the test file, never skips it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { CreateSubnetCommand, CreateVpcCommand, DescribeImagesCommand, EC2Client } from '@aws-sdk/client-ec2';
import { RUN_MARKER } from '../../scripts/test/prerequisites.ts';
import { freePort } from './ports.ts';
import { privateVenv } from './python.ts';

export const MOTO_CREDENTIALS = { accessKeyId: 'testing', secretAccessKey: 'testing' };

/** The venv's directory; throws with the command that makes it (npm test runs it first). */
export function motoVenv(): string {
  return privateVenv('moto');
}

export interface Moto {
  url: string;
  close(): Promise<void>;
}

/** moto_server on 127.0.0.1:<free port>, answering once this resolves. */
export async function startMoto(): Promise<Moto> {
  const venv = motoVenv();
  const port = await freePort();
  const child: ChildProcess = spawn(`${venv}/bin/moto_server`, ['-H', '127.0.0.1', '-p', String(port)], {
    env: {
      PATH: '/usr/bin:/bin',
      LANG: 'C.UTF-8',
      PYTHONDONTWRITEBYTECODE: '1',
      ...(process.env[RUN_MARKER] ? { [RUN_MARKER]: process.env[RUN_MARKER] } : {}),
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (c: Buffer) => {
    stderr = (stderr + c.toString('utf8')).slice(-4000);
  });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`moto_server exited (${child.exitCode}): ${stderr}`);
    const up = await fetch(`${url}/moto-api/`).then(
      (r) => r.status < 500,
      () => false,
    );
    if (up) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`moto_server did not answer on ${url} within 30 s: ${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    url,
    close: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

export function motoEc2(url: string, region: string): EC2Client {
  return new EC2Client({ region, endpoint: url, credentials: MOTO_CREDENTIALS, maxAttempts: 1 });
}

/** A VPC with one subnet per zone, and an AMI moto knows, for a provider config. */
export async function seedRegion(
  url: string,
  region: string,
  zones: string[],
): Promise<{ vpcId: string; subnets: { id: string; zone: string }[]; imageId: string }> {
  const ec2 = motoEc2(url, region);
  const vpc = await ec2.send(new CreateVpcCommand({ CidrBlock: '10.20.0.0/16' }));
  const vpcId = vpc.Vpc?.VpcId ?? '';
  const subnets: { id: string; zone: string }[] = [];
  for (const [i, zone] of zones.entries()) {
    const s = await ec2.send(
      new CreateSubnetCommand({ VpcId: vpcId, CidrBlock: `10.20.${i}.0/24`, AvailabilityZone: zone }),
    );
    subnets.push({ id: s.Subnet?.SubnetId ?? '', zone });
  }
  const images = await ec2.send(new DescribeImagesCommand({ Owners: ['amazon'] }));
  const imageId = images.Images?.find((i) => i.ImageId && i.Architecture === 'x86_64')?.ImageId ?? '';
  ec2.destroy();
  if (!vpcId || subnets.some((s) => !s.id) || !imageId) throw new Error('moto: could not seed the region');
  return { vpcId, subnets, imageId };
}

/** An AWS error answered instead of moto's, for requests of `action`. */
export interface Fault {
  action: string;
  code: string;
  status?: number;
  /** How many requests get it (default: every one until cleared). */
  count?: number;
  /** Only requests whose body contains this (e.g. a subnet ID). */
  bodyIncludes?: string;
  /** moto still gets the request and acts on it; only its answer is replaced (a lost answer). */
  passThrough?: boolean;
}

export interface MotoFront {
  url: string;
  inject(f: Fault): void;
  clear(): void;
  /** Requests seen, by action. */
  calls: Map<string, number>;
  /** Called with every request's action and form body (tests read parameters sent). */
  onBody: ((action: string, body: string) => void) | undefined;
  /** Rewrite public IPv4 addresses in answers to 127.x.y.z (a test can listen there). */
  loopbackAddresses: boolean;
  close(): Promise<void>;
}

/** a.b.c.d → 127.b.c.d: a loopback address per moto address, stable across answers. */
export function loopbackOf(ip: string): string {
  const [, b, c, d] = ip.split('.');
  return `127.${b}.${c}.${d}`;
}

async function body(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** The EC2 query API's error document, as the SDK parses it. */
function errorXml(code: string): string {
  return `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>${code}</Code><Message>injected by the test: ${code}</Message></Error></Errors><RequestID>test-0000</RequestID></Response>`;
}

export async function startMotoFront(motoUrl: string): Promise<MotoFront> {
  const target = new URL(motoUrl);
  let faults: Fault[] = [];
  const calls = new Map<string, number>();
  const front: MotoFront = {
    url: '',
    inject: (f) => faults.push({ ...f }),
    clear: () => {
      faults = [];
    },
    calls,
    onBody: undefined,
    loopbackAddresses: false,
    close: () => new Promise((r) => server.close(() => r())),
  };
  /** Sends a request to moto and drops its answer. */
  const forward = (req: IncomingMessage, raw: Buffer) =>
    new Promise<void>((resolve) => {
      const up = httpRequest(
        {
          host: target.hostname,
          port: target.port,
          method: req.method,
          path: req.url,
          headers: { ...req.headers, host: target.host },
        },
        (ur) => {
          ur.resume();
          ur.on('end', () => resolve());
        },
      );
      up.on('error', () => resolve());
      up.end(raw);
    });
  const server: Server = createServer(async (req, res) => {
    const raw = await body(req);
    const text = raw.toString('utf8');
    // EC2 speaks the query protocol (Action=…); SSM JSON with the action in X-Amz-Target.
    const amzTarget = String(req.headers['x-amz-target'] ?? '');
    const action = new URLSearchParams(text).get('Action') ?? amzTarget.slice(amzTarget.lastIndexOf('.') + 1);
    calls.set(action, (calls.get(action) ?? 0) + 1);
    front.onBody?.(action, text);
    const fault = faults.find(
      (f) => f.action === action && (!f.bodyIncludes || text.includes(f.bodyIncludes)),
    );
    if (fault) {
      if (fault.count !== undefined && --fault.count <= 0) faults = faults.filter((f) => f !== fault);
      if (fault.passThrough) await forward(req, raw);
      res.writeHead(fault.status ?? 400, { 'content-type': 'text/xml' });
      res.end(errorXml(fault.code));
      return;
    }
    const up = httpRequest(
      {
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, host: target.host },
      },
      async (ur) => {
        let out = await body(ur);
        if (front.loopbackAddresses && /<ipAddress>|<publicIp>/.test(out.toString('utf8'))) {
          const rewritten = out
            .toString('utf8')
            .replace(
              /<(ipAddress|publicIp)>(\d+\.\d+\.\d+\.\d+)<\/\1>/g,
              (_m, tag: string, ip: string) => `<${tag}>${loopbackOf(ip)}</${tag}>`,
            );
          out = Buffer.from(rewritten, 'utf8');
        }
        const headers = { ...ur.headers, 'content-length': String(out.length) };
        delete headers['transfer-encoding'];
        res.writeHead(ur.statusCode ?? 502, headers);
        res.end(out);
      },
    );
    up.on('error', (err) => {
      res.writeHead(502);
      res.end(String(err));
    });
    up.end(raw);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  front.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return front;
}
