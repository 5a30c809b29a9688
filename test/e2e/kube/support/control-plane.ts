/**
 * test/e2e/kube/support/control-plane — a real Kubernetes control plane on loopback for the
 * real-API-server tier: etcd, kube-apiserver (token auth, RBAC, service-account keys) and
 * kube-controller-manager (garbage collector, namespace lifecycle, service accounts), built by
 * control-plane/build.sh from the wrapper module and started as child processes in one temp dir.
 * Each process runs in its own process group and inherits the test run's marker, so `npm test`
 * stops it even when a worker is killed. `restartApiServer` and `compact` serve the watch tests.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import { consecutive, freePortRange } from '../../../support/ports.ts';
import { until } from '../../../support/wait.ts';

export const BUILD_SCRIPT = resolve(import.meta.dirname, '../control-plane/build.sh');

/** What a test needs to reach the control plane; plain data, so globalSetup can hand it over. */
export interface ControlPlaneInfo {
  /** https://127.0.0.1:<port> */
  server: string;
  /** Bearer token of a `system:masters` user (the cluster admin). */
  adminToken: string;
  /** kubeconfig file for that user, with the server's own certificate as CA. */
  kubeconfig: string;
  /** The serving certificate (self-signed by kube-apiserver), PEM. */
  caFile: string;
  /** etcd's client URL (for compaction). */
  etcd: string;
  /** Directory of the binaries (kubectl among them). */
  bin: string;
  /** Scratch directory of this control plane. */
  dir: string;
  /**
   * The API server's audit log (JSON lines, level Metadata): who called which verb on which
   * resource with which answer. The RBAC tests read what the operator's ServiceAccount used.
   */
  auditLog: string;
  version: string;
}

export interface ControlPlane extends ControlPlaneInfo {
  /**
   * Stops kube-apiserver and starts it again on the same port and etcd (watch tests);
   * `whileDown` runs between the stop and the start.
   */
  restartApiServer(whileDown?: () => Promise<void>): Promise<void>;
  stop(): Promise<void>;
}

interface Proc {
  name: string;
  child: ChildProcess;
  log: string;
}

function logTail(p: Proc, lines = 30): string {
  try {
    return readFileSync(p.log, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

function startProcess(dir: string, name: string, bin: string, args: string[]): Proc {
  const log = join(dir, `${name}.log`);
  const fd = openSync(log, 'a');
  // Own process group: Ctrl-C in the terminal reaches the test runner, which stops these in order.
  const child = spawn(bin, args, { cwd: dir, stdio: ['ignore', fd, fd], detached: true });
  child.unref();
  return { name, child, log };
}

async function stopProcess(p: Proc | undefined, graceMs = 5000): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise<void>((r) => p.child.once('exit', () => r()));
  p.child.kill('SIGTERM');
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

function failFastOn(p: Proc): () => string | undefined {
  return () =>
    p.child.exitCode !== null || p.child.signalCode !== null
      ? `${p.name} exited (${p.child.exitCode ?? p.child.signalCode}):\n${logTail(p)}`
      : undefined;
}

function built(args: string[]): string {
  const out = execFileSync('bash', [BUILD_SCRIPT, ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const dir = out.trim().split('\n').at(-1);
  if (!dir) throw new Error(`${BUILD_SCRIPT} ${args.join(' ')} printed no directory`);
  return dir;
}

/** Builds the binaries, or finds them in the cache; returns their directory. */
export function controlPlaneBinaries(): string {
  return built([]);
}

/** Builds helm (control-plane/helm), or finds it in the cache; returns its directory. */
export function helmBinaries(): string {
  return built(['helm']);
}

export interface ControlPlaneOptions {
  bin?: string;
  /** Extra kube-apiserver flags after the defaults (a later flag wins), e.g. `--watch-cache=false`. */
  apiServerArgs?: string[];
}

export async function startControlPlane(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
  const bin = opts.bin ?? controlPlaneBinaries();
  const version = readFileSync(resolve(import.meta.dirname, '../control-plane/KUBE_VERSION'), 'utf8').trim();
  const dir = mkdtempSync(join(tmpdir(), 'e2e-kube-'));
  const certDir = join(dir, 'certs');
  mkdirSync(certDir);
  // Ports below the ephemeral range: a kernel-assigned one can be taken by an outgoing
  // connection between this call and the bind (seen as EADDRINUSE).
  const [etcdPort, etcdPeer, apiPort, kcmPort] = consecutive(await freePortRange(4));
  const etcd = `http://127.0.0.1:${etcdPort}`;
  const server = `https://127.0.0.1:${apiPort}`;
  const adminToken = randomBytes(24).toString('base64url');
  const kcmToken = randomBytes(24).toString('base64url');
  writeFileSync(
    join(dir, 'tokens.csv'),
    [
      `${adminToken},admin,admin-uid,"system:masters"`,
      // The controller manager's own identity, bound to its built-in ClusterRole by the bootstrap policy.
      `${kcmToken},system:kube-controller-manager,kcm-uid`,
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  writeFileSync(join(dir, 'sa.key'), privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
  writeFileSync(join(dir, 'sa.pub'), publicKey.export({ type: 'spki', format: 'pem' }));
  const caFile = join(certDir, 'apiserver.crt');
  const auditLog = join(dir, 'audit.log');
  writeFileSync(
    join(dir, 'audit-policy.yaml'),
    [
      'apiVersion: audit.k8s.io/v1',
      'kind: Policy',
      'omitStages: [RequestReceived]',
      'rules:',
      // Metadata only: verbs, resources, users and codes, never a Secret's or token's content.
      '- level: Metadata',
      '',
    ].join('\n'),
  );
  const kubeconfigFor = (token: string) =>
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      '- name: e2e',
      '  cluster:',
      `    server: ${server}`,
      `    certificate-authority: ${caFile}`,
      'users:',
      '- name: e2e',
      '  user:',
      `    token: ${token}`,
      'contexts:',
      '- name: e2e',
      '  context: {cluster: e2e, user: e2e, namespace: default}',
      'current-context: e2e',
      '',
    ].join('\n');
  const kubeconfig = join(dir, 'admin.kubeconfig');
  writeFileSync(kubeconfig, kubeconfigFor(adminToken), { mode: 0o600 });
  writeFileSync(join(dir, 'kcm.kubeconfig'), kubeconfigFor(kcmToken), { mode: 0o600 });

  const procs: Partial<Record<'etcd' | 'apiserver' | 'kcm', Proc>> = {};
  const stopAll = async () => {
    await stopProcess(procs.kcm);
    await stopProcess(procs.apiserver);
    await stopProcess(procs.etcd);
  };
  try {
    procs.etcd = startProcess(dir, 'etcd', join(bin, 'etcd'), [
      '--name=e2e',
      `--data-dir=${join(dir, 'etcd')}`,
      `--listen-client-urls=${etcd}`,
      `--advertise-client-urls=${etcd}`,
      `--listen-peer-urls=http://127.0.0.1:${etcdPeer}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeer}`,
      `--initial-cluster=e2e=http://127.0.0.1:${etcdPeer}`,
      '--unsafe-no-fsync',
      '--log-level=warn',
    ]);
    await until('etcd /health', async () => (await fetch(`${etcd}/health`)).ok, {
      timeoutMs: 30_000,
      intervalMs: 100,
      failFast: failFastOn(procs.etcd),
    });
    const apiArgs = [
      `--etcd-servers=${etcd}`,
      `--cert-dir=${certDir}`,
      `--secure-port=${apiPort}`,
      '--bind-address=127.0.0.1',
      '--advertise-address=127.0.0.1',
      '--service-cluster-ip-range=10.0.0.0/24',
      '--allow-privileged=true',
      '--authorization-mode=RBAC',
      `--token-auth-file=${join(dir, 'tokens.csv')}`,
      `--service-account-issuer=${server}`,
      `--service-account-key-file=${join(dir, 'sa.pub')}`,
      `--service-account-signing-key-file=${join(dir, 'sa.key')}`,
      // The owner-reference check some distributions turn on: proves the ClusterRole's finalizers rules.
      '--enable-admission-plugins=OwnerReferencesPermissionEnforcement',
      `--audit-policy-file=${join(dir, 'audit-policy.yaml')}`,
      `--audit-log-path=${auditLog}`,
      '--audit-log-mode=blocking',
      '--v=1',
      ...(opts.apiServerArgs ?? []),
    ];
    const startApi = async () => {
      procs.apiserver = startProcess(dir, 'kube-apiserver', join(bin, 'kube-apiserver'), apiArgs);
      const admin = new Agent({ connect: { rejectUnauthorized: false } });
      try {
        await until(
          'kube-apiserver /readyz',
          async () =>
            (
              await undiciFetch(`${server}/readyz`, {
                dispatcher: admin,
                headers: { authorization: `Bearer ${adminToken}` },
              })
            ).ok,
          { timeoutMs: 90_000, intervalMs: 200, failFast: failFastOn(procs.apiserver) },
        );
      } finally {
        await admin.close();
      }
    };
    await startApi();
    procs.kcm = startProcess(dir, 'kube-controller-manager', join(bin, 'kube-controller-manager'), [
      `--kubeconfig=${join(dir, 'kcm.kubeconfig')}`,
      `--authentication-kubeconfig=${join(dir, 'kcm.kubeconfig')}`,
      `--authorization-kubeconfig=${join(dir, 'kcm.kubeconfig')}`,
      '--controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller',
      `--secure-port=${kcmPort}`,
      '--bind-address=127.0.0.1',
      '--leader-elect=false',
      // Each controller runs as its own ServiceAccount with its bootstrap role, as in a real cluster.
      '--use-service-account-credentials=true',
      `--root-ca-file=${caFile}`,
      `--service-account-private-key-file=${join(dir, 'sa.key')}`,
      '--v=1',
    ]);
    const cp: ControlPlane = {
      server,
      adminToken,
      kubeconfig,
      caFile,
      etcd,
      bin,
      dir,
      auditLog,
      version,
      restartApiServer: async (whileDown) => {
        await stopProcess(procs.apiserver);
        await whileDown?.();
        await startApi();
      },
      stop: async () => {
        await stopAll();
        rmSync(dir, { recursive: true, force: true });
      },
    };
    // The default ServiceAccount appears once the controller manager runs: Pods need it.
    await until(
      'the default ServiceAccount (kube-controller-manager running)',
      () => {
        try {
          kubectl(cp, ['get', 'serviceaccount', 'default', '-n', 'default', '-o', 'name']);
          return true;
        } catch {
          return false;
        }
      },
      { timeoutMs: 60_000, intervalMs: 250, failFast: failFastOn(procs.kcm) },
    );
    return cp;
  } catch (e) {
    await stopAll();
    throw e;
  }
}

const KUBECTL_TIMEOUT_MS = 120_000;

/** Runs the matching kubectl as the cluster admin; returns stdout, throws with stderr. */
export function kubectl(cp: ControlPlaneInfo, args: string[], input?: string): string {
  try {
    return execFileSync(join(cp.bin, 'kubectl'), ['--kubeconfig', cp.kubeconfig, ...args], {
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe'],
      maxBuffer: 64 * 1024 * 1024,
      // A synchronous call blocks the test's own timeouts: bound it (a `--wait` on an object
      // whose finalizer nobody removes would wait forever).
      timeout: KUBECTL_TIMEOUT_MS,
      killSignal: 'SIGKILL',
      ...(input === undefined ? {} : { input }),
    });
  } catch (e) {
    const err = e as { stderr?: string; message: string; signal?: string };
    if (err.signal === 'SIGKILL')
      throw new Error(`kubectl ${args.join(' ')}: no answer within ${KUBECTL_TIMEOUT_MS / 1000} s`);
    throw new Error(`kubectl ${args.join(' ')}: ${err.stderr?.trim() || err.message}`);
  }
}
