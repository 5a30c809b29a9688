/**
 * test/e2e/kube/support/operator — runs the real CLI (`main.ts operator`) against the real API server
 * the way the shipped Deployment runs it: the flags of config/manager/manager.yaml on loopback
 * addresses, POD_NAMESPACE, a DISCOVERY_TOKEN, and the identity of the ServiceAccount from
 * config/rbac through a token from the TokenRequest API (`kubectl create token`), never the
 * cluster admin. Also reads the audit log for what that identity asked for.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CliProcess, REPO_ROOT } from '../../../support/cli.ts';
import { consecutive, freePortRange } from '../../../support/ports.ts';
import { until } from '../../../support/wait.ts';
import { type ControlPlaneInfo, kubectl } from './control-plane.ts';

export const OPERATOR_NS = 'egress-proxies-system';
export const OPERATOR_SA = 'egress-proxies-operator';
export const OPERATOR_USER = `system:serviceaccount:${OPERATOR_NS}:${OPERATOR_SA}`;
export const LEADER_LEASE = 'egress-proxies-operator-leader';

/** A kubeconfig for `serviceAccount` in `namespace`, holding a fresh TokenRequest token. */
export function serviceAccountKubeconfig(
  cp: ControlPlaneInfo,
  namespace: string,
  serviceAccount: string,
  file: string,
): { file: string; token: string } {
  const token = kubectl(cp, ['create', 'token', serviceAccount, '-n', namespace, '--duration=3h']).trim();
  writeFileSync(
    file,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      '- name: e2e',
      '  cluster:',
      `    server: ${cp.server}`,
      `    certificate-authority: ${cp.caFile}`,
      'users:',
      `- name: ${serviceAccount}`,
      '  user:',
      `    token: ${token}`,
      'contexts:',
      '- name: e2e',
      `  context: {cluster: e2e, user: ${serviceAccount}, namespace: ${namespace}}`,
      'current-context: e2e',
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  return { file, token };
}

export interface RunningOperator {
  name: string;
  proc: CliProcess;
  discovery: string;
  probes: string;
  metrics: string;
  /** The gateway's address (`127.0.0.1:<port>`). */
  gateway: string;
  /** The identity it elects with (from its start line). */
  identity(): string | undefined;
  stop(): Promise<void>;
}

export interface OperatorOptions {
  name: string;
  dir: string;
  kubeconfig: string;
  providersConfig: string;
  discoveryToken: string;
  /** A CA file the operator trusts besides the system's (the health checks' TLS origin). */
  extraCaFile?: string;
  extraArgs?: string[];
}

export async function startOperator(o: OperatorOptions): Promise<RunningOperator> {
  // Ports below the ephemeral range: a kernel-assigned one can be taken by an outgoing
  // connection between this call and the bind (seen as EADDRINUSE).
  const [discoveryPort, probePort, metricsPort, gatewayPort] = consecutive(await freePortRange(4));
  const args = [
    'operator',
    '--providers-config',
    o.providersConfig,
    '--kubeconfig',
    o.kubeconfig,
    // The Deployment's flags (config/manager/manager.yaml), on loopback.
    '--leader-elect',
    '--metrics-bind-address',
    `127.0.0.1:${metricsPort}`,
    '--metrics-secure',
    '--log-format',
    'json',
    '--discovery-bind-address',
    `127.0.0.1:${discoveryPort}`,
    '--health-probe-bind-address',
    `127.0.0.1:${probePort}`,
    // The gateway (config/components/gateway), served by every replica.
    '--gateway-bind-address',
    `127.0.0.1:${gatewayPort}`,
    '--log-level',
    'debug',
    '--shutdown-grace-period',
    '5s',
    ...(o.extraArgs ?? []),
  ];
  const proc = new CliProcess(args, o.dir, {
    env: {
      POD_NAMESPACE: OPERATOR_NS,
      DISCOVERY_TOKEN: o.discoveryToken,
      HOME: o.dir,
      ...(o.extraCaFile ? { NODE_EXTRA_CA_CERTS: o.extraCaFile } : {}),
    },
  });
  const op: RunningOperator = {
    name: o.name,
    proc,
    discovery: `http://127.0.0.1:${discoveryPort}`,
    probes: `http://127.0.0.1:${probePort}`,
    metrics: `https://127.0.0.1:${metricsPort}`,
    gateway: `127.0.0.1:${gatewayPort}`,
    identity: () =>
      proc.logs.find((l) => l.msg.startsWith('manager started'))?.identity as string | undefined,
    stop: async () => {
      proc.signal('SIGTERM');
      const timer = setTimeout(() => void proc.killHard(), 20_000);
      await proc.exited;
      clearTimeout(timer);
    },
  };
  await until(`operator ${o.name} /readyz`, async () => (await fetch(`${op.probes}/readyz`)).status === 200, {
    timeoutMs: 60_000,
    intervalMs: 100,
    failFast: () => (proc.hasExited ? `operator ${o.name} exited:\n${proc.tail(40)}` : undefined),
  });
  return op;
}

/** Providers config file of the test: the shipped kubernetes provider, opened to one loopback origin. */
export function writeProvidersConfig(dir: string, originPort: number): string {
  const file = join(dir, 'providers.yaml');
  const shipped = readFileSync(join(REPO_ROOT, 'config/manager/providers.yaml'), 'utf8');
  // The shipped provider block, plus the one change a loopback test origin needs (the default
  // egress policy refuses loopback destinations, as it should in a cluster).
  const opened = shipped.replace(
    /( {4}kubernetes:\n)/,
    `$1      egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${originPort}]}\n`,
  );
  if (opened === shipped)
    throw new Error('config/manager/providers.yaml: no kubernetes provider block found');
  // The gateway's own egress policy, opened to the same origin.
  writeFileSync(
    file,
    `${opened}\ngateway:\n  egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${originPort}]}\n`,
  );
  return file;
}

/** One request of the audit log, as far as RBAC is concerned. */
export interface AuditedRequest {
  user: string;
  verb: string;
  apiGroup: string;
  resource: string;
  subresource?: string;
  namespace?: string;
  name?: string;
  code?: number;
  uri: string;
}

export function auditedRequests(cp: ControlPlaneInfo, user: string): AuditedRequest[] {
  const out: AuditedRequest[] = [];
  for (const line of readFileSync(cp.auditLog, 'utf8').split('\n')) {
    if (!line) continue;
    const e = JSON.parse(line) as {
      stage: string;
      user: { username: string };
      verb: string;
      requestURI: string;
      objectRef?: {
        apiGroup?: string;
        resource?: string;
        subresource?: string;
        namespace?: string;
        name?: string;
      };
      responseStatus?: { code?: number };
    };
    if (e.user.username !== user || !e.objectRef?.resource) continue;
    if (e.stage !== 'ResponseComplete' && e.stage !== 'ResponseStarted' && e.stage !== 'Panic') continue;
    out.push({
      user,
      verb: e.verb,
      apiGroup: e.objectRef.apiGroup ?? '',
      resource: e.objectRef.resource,
      ...(e.objectRef.subresource ? { subresource: e.objectRef.subresource } : {}),
      ...(e.objectRef.namespace ? { namespace: e.objectRef.namespace } : {}),
      ...(e.objectRef.name ? { name: e.objectRef.name } : {}),
      ...(e.responseStatus?.code !== undefined ? { code: e.responseStatus.code } : {}),
      uri: e.requestURI,
    });
  }
  return out;
}
