/**
 * test/e2e/kube/support/doc-page — docs/deployment.md as the tier runs it: its fenced blocks
 * with their `<!-- tier: MODE ID -->` markers, a bash that runs a block in a user's fresh copy of
 * the repository, and the clean-up both page tests need (deployment-doc.test.ts runs the
 * kustomize path, helm.test.ts the Helm path). Modes:
 *   run            the kustomize path runs the block;
 *   operator       the kustomize path starts the operator there instead (no kubelet runs the image);
 *   helm           the Helm path runs the block;
 *   helm-operator  the Helm path starts the operator there instead;
 *   skip           nobody runs it (Docker, kind, a registry), and the block says so.
 */
import { spawn } from 'node:child_process';
import { cpSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { FINALIZER } from '../../../../src/api/constants.ts';
import { until } from '../../../support/wait.ts';
import { type ControlPlaneInfo, kubectl } from './control-plane.ts';
import { OPERATOR_NS, type RunningOperator, startOperator } from './operator.ts';

export const ROOT = resolve(import.meta.dirname, '../../../..');
export const DOC = resolve(ROOT, 'docs/deployment.md');

export type Mode = 'run' | 'operator' | 'helm' | 'helm-operator' | 'skip';
export interface Block {
  mode: Mode;
  id: string;
  code: string;
  line: number;
}

/** The fenced blocks of the page with their markers; a block without one is an error. */
export function docBlocks(markdown: string): Block[] {
  const lines = markdown.split('\n');
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^```/.test(lines[i] ?? '')) continue;
    const open = i;
    let j = i + 1;
    while (j < lines.length && !/^```\s*$/.test(lines[j] ?? '')) j++;
    const code = lines.slice(open + 1, j).join('\n');
    let m = open - 1;
    while (m >= 0 && (lines[m] ?? '').trim() === '') m--;
    const marker = /^<!-- tier: (run|operator|helm|helm-operator|skip) ([a-z0-9-]+) -->$/.exec(
      (lines[m] ?? '').trim(),
    );
    if (!marker)
      throw new Error(
        `docs/deployment.md:${open + 1}: a fenced block without a <!-- tier: MODE ID --> marker`,
      );
    blocks.push({ mode: marker[1] as Mode, id: marker[2] as string, code, line: open + 1 });
    i = j;
  }
  return blocks;
}

/**
 * A fresh copy of the repository in `dir`, as a user's clone after `npm ci`: config/, charts/,
 * src/ (the CLI runs only as the entry point it is, not through a link), scripts/uninstall.sh,
 * package.json and the Dockerfile; node_modules linked. Plus the user's own files the Secrets
 * block names.
 */
export function userClone(dir: string): string {
  const clone = join(dir, 'clone');
  mkdirSync(clone);
  for (const d of ['config', 'charts', 'src']) cpSync(join(ROOT, d), join(clone, d), { recursive: true });
  mkdirSync(join(clone, 'scripts'));
  cpSync(join(ROOT, 'scripts/uninstall.sh'), join(clone, 'scripts/uninstall.sh'));
  for (const f of ['package.json', 'Dockerfile']) cpSync(join(ROOT, f), join(clone, f));
  symlinkSync(join(ROOT, 'node_modules'), join(clone, 'node_modules'));
  writeFileSync(join(clone, 'id_ed25519'), 'not a real key\n');
  writeFileSync(join(clone, 'known_hosts'), 'nas1 ssh-ed25519 AAAA\n');
  writeFileSync(join(clone, 'gcp-key.json'), '{}\n');
  return clone;
}

/**
 * Runs a block as a shell does, stopping at its first failing command, in `cwd` with the tier's
 * binaries first on PATH and KUBECONFIG set to the cluster admin. Asynchronous: the node agent
 * runs in this process and must go on binding and removing Pods meanwhile.
 */
export function sh(
  cp: ControlPlaneInfo,
  cwd: string,
  code: string,
  extra: { path?: string[]; env?: Record<string, string> } = {},
): Promise<{ out: string; code: number }> {
  return new Promise((done) => {
    const child = spawn('bash', ['-e', '-c', code], {
      cwd,
      env: {
        ...process.env,
        ...extra.env,
        PATH: [...(extra.path ?? []), cp.bin, process.env.PATH ?? ''].join(':'),
        KUBECONFIG: cp.kubeconfig,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString('utf8');
    });
    child.stderr.on('data', (d: Buffer) => {
      out += d.toString('utf8');
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), 600_000);
    child.once('close', (status) => {
      clearTimeout(timer);
      done({ out, code: status ?? -1 });
    });
  });
}

export function exists(cp: ControlPlaneInfo, ...args: string[]): boolean {
  try {
    kubectl(cp, ['get', ...args, '-o', 'name']);
    return true;
  } catch {
    return false;
  }
}

/** Releases the finalizer of every Proxy left in the cluster, so nothing waits on an operator. */
export function releaseEveryFinalizer(cp: ControlPlaneInfo): void {
  if (!exists(cp, 'crd', 'proxies.crawl.example.com')) return;
  const rows = kubectl(cp, [
    'get',
    'proxies.crawl.example.com',
    '-A',
    '-o',
    'jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\\n"}{end}',
  ]);
  for (const row of rows.split('\n').filter(Boolean)) {
    const [ns, name] = row.split('/') as [string, string];
    kubectl(cp, [
      '-n',
      ns,
      'patch',
      'proxies.crawl.example.com',
      name,
      '--type=merge',
      '-p',
      '{"metadata":{"finalizers":null}}',
    ]);
  }
}

export interface AuditEntry {
  stage: string;
  verb: string;
  user: { username: string };
  objectRef?: { resource?: string; namespace?: string; name?: string };
  responseStatus?: { code?: number };
  stageTimestamp: string;
}

/** The completed requests of the API server's audit log since `since` (epoch ms). */
export function auditSince(cp: ControlPlaneInfo, since: number): AuditEntry[] {
  return readFileSync(cp.auditLog, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as AuditEntry)
    .filter((e) => e.stage === 'ResponseComplete' && Date.parse(e.stageTimestamp) >= since);
}

/**
 * Asserts the order the uninstall must keep: every one of `pods` (instance Pods in `namespace`)
 * was deleted by `operatorUser` before the first request that took the operator away (deleting
 * its Deployment or its namespace). Returns a list of problems, empty when the order held.
 */
export function instancesDeletedBeforeOperator(
  entries: AuditEntry[],
  pods: string[],
  namespace: string,
  operatorUser: string,
): string[] {
  const removal = entries
    .filter(
      (e) =>
        e.verb === 'delete' &&
        ((e.objectRef?.resource === 'deployments' && e.objectRef.name === 'egress-proxies-operator') ||
          (e.objectRef?.resource === 'namespaces' && e.objectRef.name === namespace)),
    )
    .map((e) => Date.parse(e.stageTimestamp))
    .sort((a, b) => a - b)[0];
  if (removal === undefined) return ['the Deployment was never deleted'];
  const problems: string[] = [];
  for (const pod of pods) {
    const deletes = entries.filter(
      (e) =>
        e.verb === 'delete' &&
        e.objectRef?.resource === 'pods' &&
        e.objectRef.namespace === namespace &&
        e.objectRef.name === pod &&
        (e.responseStatus?.code ?? 0) < 300 &&
        e.user.username === operatorUser,
    );
    if (deletes.length === 0) problems.push(`${pod}: never deleted by ${operatorUser}`);
    else if (Math.min(...deletes.map((e) => Date.parse(e.stageTimestamp))) >= removal)
      problems.push(`${pod}: deleted after the Deployment`);
  }
  return problems;
}

/** Runs a block of the page; fails naming its id and line, with what it printed. */
export async function runDocBlock(
  cp: ControlPlaneInfo,
  cwd: string,
  b: Block,
  extra: { path?: string[]; env?: Record<string, string> } = {},
): Promise<string> {
  const r = await sh(cp, cwd, b.code, extra);
  if (r.code !== 0)
    throw new Error(`block ${b.id} (docs/deployment.md:${b.line}) exited ${r.code}:\n${r.out}`);
  return r.out;
}

/** Names of every object of `objs` that is not in the cluster (empty: all installed). */
export function missingObjects(
  cp: ControlPlaneInfo,
  objs: { kind: string; metadata: { name: string; namespace?: string } }[],
): string[] {
  return objs
    .filter(
      (o) =>
        !exists(
          cp,
          o.kind.toLowerCase(),
          o.metadata.name,
          ...(o.metadata.namespace ? ['-n', o.metadata.namespace] : []),
        ),
    )
    .map((o) => `${o.kind} ${o.metadata.name}`);
}

/**
 * Starts the operator where the page's rollout would be: as its ServiceAccount (`kubeconfig`),
 * with the discovery token of the Secret the page made and the providers file the ConfigMap holds.
 */
export function startDocOperator(
  cp: ControlPlaneInfo,
  o: { name: string; dir: string; kubeconfig: string; providersConfig: string },
): Promise<RunningOperator> {
  const token = Buffer.from(
    kubectl(cp, [
      '-n',
      OPERATOR_NS,
      'get',
      'secret',
      'egress-proxies-operator-discovery-token',
      '-o',
      'jsonpath={.data.token}',
    ]),
    'base64',
  ).toString('utf8');
  return startOperator({
    ...o,
    discoveryToken: token,
    extraArgs: ['--drain-timeout', '15s', '--gc-interval', '10s'],
  });
}

/** Waits until `namespace` holds `count` Proxies, every one Ready on its instance and holding the finalizer. */
export async function proxiesReady(cp: ControlPlaneInfo, namespace: string, count: number): Promise<void> {
  await until(
    `${count} Proxies Ready on Squid Pods`,
    () => {
      const items = JSON.parse(kubectl(cp, ['get', 'px', '-n', namespace, '-o', 'json'])).items as {
        metadata: { finalizers?: string[] };
        status?: { phase?: string };
      }[];
      return (
        items.length === count &&
        items.every((p) => p.status?.phase === 'Ready' && p.metadata.finalizers?.includes(FINALIZER))
      );
    },
    { timeoutMs: 120_000, intervalMs: 500 },
  );
}
