/**
 * provider/aws/clients — the SDK clients of one aws provider entry (one account): an EC2 client
 * and, for `ssm:` images, an SSM client per region, made on first use and kept in this object —
 * never in module globals, so two entries (two accounts, profiles or endpoints) never share one.
 * Credentials come from the SDK's default chain (environment, shared config and `profile`, web
 * identity / IRSA, ECS and EKS Pod Identity, IMDS) unless the caller passes its own (tests).
 */
import { EC2Client, type EC2ClientConfig } from '@aws-sdk/client-ec2';
import { SSMClient } from '@aws-sdk/client-ssm';

export interface AwsClientOptions {
  /** Named profile of the shared config files; default: the SDK default chain. */
  profile?: string | undefined;
  /** EC2 and SSM API URL (tests, EC2-compatible endpoints). */
  endpoint?: string | undefined;
  /** Static credentials instead of the default chain (tests against moto). */
  credentials?: EC2ClientConfig['credentials'];
  /** Attempts per call, including the SDK's own throttling retries with backoff (default 3). */
  maxAttempts?: number;
  /** Per-request socket timeout in ms (default 60 s). */
  requestTimeoutMs?: number;
}

export class AwsClients {
  private readonly ec2 = new Map<string, EC2Client>();
  private readonly ssm = new Map<string, SSMClient>();
  private readonly o: AwsClientOptions;
  private closed = false;

  constructor(o: AwsClientOptions) {
    this.o = o;
  }

  private common(region: string) {
    return {
      region,
      maxAttempts: this.o.maxAttempts ?? 3,
      ...(this.o.profile ? { profile: this.o.profile } : {}),
      ...(this.o.endpoint ? { endpoint: this.o.endpoint } : {}),
      ...(this.o.credentials ? { credentials: this.o.credentials } : {}),
      requestHandler: { requestTimeout: this.o.requestTimeoutMs ?? 60_000 },
      // The SDK logs nothing by default; say so: a request carries user-data.
      logger: undefined,
    };
  }

  ec2For(region: string): EC2Client {
    if (this.closed) throw new Error('provider is closed');
    let c = this.ec2.get(region);
    if (!c) {
      c = new EC2Client(this.common(region));
      this.ec2.set(region, c);
    }
    return c;
  }

  ssmFor(region: string): SSMClient {
    if (this.closed) throw new Error('provider is closed');
    let c = this.ssm.get(region);
    if (!c) {
      c = new SSMClient(this.common(region));
      this.ssm.set(region, c);
    }
    return c;
  }

  close(): void {
    this.closed = true;
    for (const c of this.ec2.values()) c.destroy();
    for (const c of this.ssm.values()) c.destroy();
    this.ec2.clear();
    this.ssm.clear();
  }
}
