/**
 * The Helm chart (charts/egress-proxies-operator) with the helm this tier builds
 * (control-plane/build.sh helm) and the real API server. In this tier because helm and kubectl
 * are built here. Proves: `helm lint --strict`; the values schema refuses an invalid providers
 * config naming the field; with default values the chart renders the objects of `kubectl
 * kustomize config/default` (after the normaliser below; the gateway on equals config/default
 * with the gateway component); the optional ServiceMonitor, PodDisruptionBudget and
 * NetworkPolicy; then docs/deployment.md's Helm path as written — install, the operator running
 * Proxies as its ServiceAccount, an upgrade whose values change rolls the Deployment, and the
 * documented uninstall that leaves no Proxy on a finalizer, every instance deleted by the
 * operator before its Deployment, and the CRDs in place until the page deletes them.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import YAML from 'yaml';
import { INSTANCE_LABEL_INSTALLATION } from '../../../src/api/constants.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { helmBinaries, kubectl } from './support/control-plane.ts';
import {
  auditSince,
  type Block,
  DOC,
  docBlocks,
  exists as existsIn,
  instancesDeletedBeforeOperator,
  missingObjects,
  proxiesReady,
  ROOT,
  releaseEveryFinalizer,
  runDocBlock,
  startDocOperator,
  userClone,
} from './support/doc-page.ts';
import { type NodeAgent, startNodeAgent } from './support/node-agent.ts';
import {
  OPERATOR_NS,
  OPERATOR_SA,
  OPERATOR_USER,
  type RunningOperator,
  serviceAccountKubeconfig,
} from './support/operator.ts';

const cp = inject('controlPlane');
const k = (...args: string[]) => kubectl(cp, args);
const exists = (...args: string[]) => existsIn(cp, ...args);
const CHART = 'charts/egress-proxies-operator';
const RELEASE = 'egress-proxies-operator';
const PROVIDERS_CM = 'egress-proxies-operator-providers';

let scratch: string;
let clone: string;
let helmDir: string;
let helmEnv: Record<string, string>;
let agent: NodeAgent | undefined;
let operator: RunningOperator | undefined;

function helm(args: string[]): string {
  try {
    return execFileSync(join(helmDir, 'helm'), args, {
      cwd: clone,
      encoding: 'utf8',
      env: { ...process.env, ...helmEnv, KUBECONFIG: cp.kubeconfig },
      stdio: ['ignore', 'pipe', 'pipe'],
      maxBuffer: 64 * 1024 * 1024,
      timeout: 120_000,
    });
  } catch (e) {
    // helm lint reports its findings on stdout, other commands their error on stderr.
    const err = e as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `helm ${args.join(' ')}: ${`${err.stdout ?? ''}${err.stderr ?? ''}`.trim() || err.message}`,
    );
  }
}

interface Obj {
  apiVersion: string;
  kind: string;
  metadata: {
    name: string;
    namespace?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  };
  [k: string]: unknown;
}

const parseAll = (yaml: string): Obj[] =>
  YAML.parseAllDocuments(yaml)
    .map((d) => d.toJS() as Obj | null)
    .filter((o): o is Obj => o !== null);

/** The labels Helm charts add by convention; the only labels the chart may add. */
const CHART_LABELS = [
  'helm.sh/chart',
  'app.kubernetes.io/managed-by',
  'app.kubernetes.io/instance',
  'app.kubernetes.io/version',
];

interface DeploymentLike {
  spec: {
    template: {
      metadata: { annotations?: Record<string, string> };
      spec: {
        containers: { args: string[]; env: { name: string }[] }[];
        volumes: { name: string; configMap?: { name: string } }[];
      };
    };
  };
}

/**
 * One object as the comparison sees it, keyed by kind, namespace and name. What it takes away
 * is exactly what differs by design: the chart's labels; the Pod template's checksum annotation
 * (the chart rolls on a config change by it, kustomize by the hash in the ConfigMap's name, so
 * that hash goes from the kustomize side); the providers file's text (parsed, comments and
 * layout aside).
 */
function normalise(objs: Obj[], source: 'chart' | 'kustomize'): Map<string, Obj> {
  const out = new Map<string, Obj>();
  for (const original of objs) {
    const o = structuredClone(original);
    if (source === 'chart') {
      for (const l of CHART_LABELS) delete o.metadata.labels?.[l];
      if (o.kind === 'Deployment') {
        const tpl = (o as unknown as DeploymentLike).spec.template.metadata;
        for (const a of Object.keys(tpl.annotations ?? {}))
          if (a.startsWith('checksum/')) delete tpl.annotations?.[a];
        if (tpl.annotations && Object.keys(tpl.annotations).length === 0) delete tpl.annotations;
      }
    } else {
      const generated = new RegExp(`^${PROVIDERS_CM}-[a-z0-9]{10}$`);
      if (o.kind === 'ConfigMap' && generated.test(o.metadata.name)) o.metadata.name = PROVIDERS_CM;
      if (o.kind === 'Deployment')
        for (const v of (o as unknown as DeploymentLike).spec.template.spec.volumes)
          if (v.configMap && generated.test(v.configMap.name)) v.configMap.name = PROVIDERS_CM;
    }
    if (o.kind === 'ConfigMap' && o.metadata.name === PROVIDERS_CM) {
      const data = o.data as Record<string, string>;
      data['providers.yaml'] = YAML.parse(data['providers.yaml'] ?? '') as never;
    }
    out.set(`${o.kind} ${o.metadata.namespace ?? ''}/${o.metadata.name}`, o);
  }
  return out;
}

const template = (...args: string[]) =>
  parseAll(helm(['template', RELEASE, CHART, '--namespace', OPERATOR_NS, '--include-crds', ...args]));

beforeAll(() => {
  helmDir = helmBinaries();
  scratch = mkdtempSync(join(tmpdir(), 'e2e-kube-helm-'));
  clone = userClone(scratch);
  // Helm's own cache and config stay in the scratch directory.
  helmEnv = {
    HELM_CACHE_HOME: join(scratch, 'helm/cache'),
    HELM_CONFIG_HOME: join(scratch, 'helm/config'),
    HELM_DATA_HOME: join(scratch, 'helm/data'),
  };
  // A clean cluster: what an earlier file installed goes (its Proxies' finalizers released).
  releaseEveryFinalizer(cp);
  k('delete', '-k', join(ROOT, 'config/default'), '--ignore-not-found', '--wait');
  k('delete', 'namespace', 'crawl', '--ignore-not-found', '--wait');
});

afterAll(async () => {
  await operator?.stop();
  await agent?.stop();
  try {
    releaseEveryFinalizer(cp);
  } catch {
    // nothing left to release
  }
  // The tier's other files share this API server: whatever this file installed goes.
  const cleanups: (() => unknown)[] = [
    () => helm(['uninstall', RELEASE, '--namespace', OPERATOR_NS, '--ignore-not-found']),
    () => k('delete', '-f', join(ROOT, CHART, 'crds'), '--ignore-not-found', '--wait'),
    () => k('delete', 'namespace', 'crawl', OPERATOR_NS, '--ignore-not-found', '--wait'),
  ];
  for (const c of cleanups) {
    try {
      c();
    } catch {
      // already gone, or never made
    }
  }
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('the Helm chart', () => {
  it('passes helm lint --strict; its schema refuses an invalid providers config, naming the field', () => {
    expect(helm(['lint', '--strict', CHART])).toContain('1 chart(s) linted, 0 chart(s) failed');
    const bad = join(scratch, 'bad-values.yaml');
    writeFileSync(bad, 'providersConfig:\n  providers:\n    - name: x\n      type: nope\n');
    expect(() => helm(['lint', '--strict', CHART, '--values', bad])).toThrow(
      /providersConfig\/providers\/0\/type.*value must be one of 'kubernetes'/,
    );
    writeFileSync(bad, 'gatway: {enabled: true}\n');
    expect(() => helm(['template', RELEASE, CHART, '--values', bad])).toThrow(
      /additional properties 'gatway' not allowed/,
    );
  });

  it('follows the version of package.json', () => {
    const chart = YAML.parse(readFileSync(join(ROOT, CHART, 'Chart.yaml'), 'utf8')) as Record<string, string>;
    const { version } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string };
    expect([chart.version, chart.appVersion]).toEqual([version, version]);
  });

  it('with default values renders the objects of kubectl kustomize config/default but the Namespace', () => {
    const chartObjs = template();
    const chart = normalise(chartObjs, 'chart');
    const kustomize = normalise(parseAll(k('kustomize', join(ROOT, 'config/default'))), 'kustomize');
    // The one object the chart leaves out: the page applies it from config/manager/namespace.yaml
    // before `helm install --namespace`, as Helm charts leave their namespace to the user
    // (config/default adds only its part-of label).
    const ns = `Namespace /${OPERATOR_NS}`;
    const [shipped] = parseAll(readFileSync(join(ROOT, 'config/manager/namespace.yaml'), 'utf8'));
    expect(kustomize.get(ns)).toEqual({
      ...shipped,
      metadata: {
        ...shipped?.metadata,
        labels: { ...shipped?.metadata.labels, 'app.kubernetes.io/part-of': 'egress-proxies-operator' },
      },
    });
    kustomize.delete(ns);
    expect([...chart.keys()].sort()).toEqual([...kustomize.keys()].sort());
    for (const [key, obj] of kustomize) expect(chart.get(key), key).toEqual(obj);
    // What the normaliser took away is only the chart's labels and its checksum annotation.
    const deploy = chartObjs.find((o) => o.kind === 'Deployment') as unknown as DeploymentLike;
    expect(Object.keys(deploy.spec.template.metadata.annotations ?? {})).toEqual([
      'checksum/providers-config',
    ]);
  });

  it('with gateway.enabled renders config/default with the gateway component', () => {
    mkdirSync(join(clone, 'gateway-overlay'));
    writeFileSync(
      join(clone, 'gateway-overlay/kustomization.yaml'),
      [
        'apiVersion: kustomize.config.k8s.io/v1beta1',
        'kind: Kustomization',
        'resources: [../config/default]',
        'components: [../config/components/gateway]',
        '',
      ].join('\n'),
    );
    const kustomize = normalise(parseAll(k('kustomize', join(clone, 'gateway-overlay'))), 'kustomize');
    kustomize.delete(`Namespace /${OPERATOR_NS}`);
    const chart = normalise(template('--set', 'gateway.enabled=true'), 'chart');
    expect([...chart.keys()].sort()).toEqual([...kustomize.keys()].sort());
    for (const [key, obj] of kustomize) expect(chart.get(key), key).toEqual(obj);
  });

  it('renders the optional ServiceMonitor, PodDisruptionBudget and NetworkPolicy, which the API server accepts', () => {
    const objs = template(
      '--set',
      'serviceMonitor.enabled=true,podDisruptionBudget.enabled=true,networkPolicy.enabled=true',
      '--set',
      'networkPolicy.clientCIDRs={198.51.100.0/24}',
    );
    const byKind = (kind: string) => objs.filter((o) => o.kind === kind);
    const [sm] = byKind('ServiceMonitor') as unknown as {
      spec: { selector: unknown; endpoints: Record<string, unknown>[] };
    }[];
    expect(sm?.spec.selector).toEqual({
      matchLabels: { 'app.kubernetes.io/name': RELEASE, 'app.kubernetes.io/component': 'metrics' },
    });
    expect(sm?.spec.endpoints[0]).toMatchObject({ port: 'metrics', scheme: 'https' });
    const [pdb, np] = [byKind('PodDisruptionBudget')[0], byKind('NetworkPolicy')[0]];
    expect(pdb?.spec).toMatchObject({ maxUnavailable: 1 });
    expect(JSON.stringify(np?.spec)).toContain('198.51.100.0/24');
    // The real API server validates both (the ServiceMonitor's CRD is prometheus-operator's).
    const out = kubectl(
      cp,
      ['apply', '--dry-run=server', '-n', 'default', '-f', '-'],
      [pdb, np]
        .map((o) => YAML.stringify({ ...o, metadata: { ...o?.metadata, namespace: 'default' } }))
        .join('---\n'),
    );
    expect(out).toContain('poddisruptionbudget.policy/egress-proxies-operator created (server dry run)');
    expect(out).toContain(
      'networkpolicy.networking.k8s.io/egress-proxies-operator-manager created (server dry run)',
    );
  });
});

describe('docs/deployment.md, the Helm path as written', () => {
  const blocks = docBlocks(readFileSync(DOC, 'utf8')).filter((b) => b.mode.startsWith('helm'));

  it('is marked in order: values, install, rollout (not run), upgrade, uninstall, CRDs', () => {
    expect(blocks.map((b) => `${b.mode} ${b.id}`)).toEqual([
      'helm helm-values',
      'helm helm-install',
      'helm-operator helm-rollout',
      'helm helm-upgrade',
      'helm helm-uninstall',
      'helm helm-crds',
    ]);
    expect(blocks.find((b) => b.mode === 'helm-operator')?.code).toMatch(/^# not run by the tests: /);
    // The README's Helm install is this path's commands, line for line.
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const section = /## In a Kubernetes cluster\n[\s\S]*?```sh\n([\s\S]*?)```/.exec(readme)?.[1] ?? '';
    const lines = section.split('\n').filter(Boolean);
    expect(lines.length).toBeGreaterThan(3);
    const run = blocks.map((b) => b.code).join('\n');
    for (const l of lines) expect(run, `README: ${l}`).toContain(l);
  });

  it('installs, runs Proxies, upgrades with a rolling values change and uninstalls without leaking an instance', async () => {
    const started = Date.now();
    let instancePods: string[] = [];
    for (const b of blocks) {
      if (b.mode === 'helm-operator') {
        agent = await startNodeAgent(cp);
        await startTheOperator();
        await runProxies();
        continue;
      }
      if (b.id === 'helm-upgrade') await beforeUpgrade();
      if (b.id === 'helm-uninstall') instancePods = podsOfInstances();
      const before = deploymentState();
      const out = await runBlock(b);
      if (b.id === 'helm-install') afterInstall();
      if (b.id === 'helm-upgrade') await afterUpgrade(before, out);
      if (b.id === 'helm-uninstall') {
        // No Proxy on a finalizer, no instance left, the release gone, the CRDs still there.
        expect(k('get', 'px,pxp', '-A', '-o', 'name').trim()).toBe('');
        expect(podsOfInstances()).toEqual([]);
        expect(instancePods).toHaveLength(3);
        expect(
          instancesDeletedBeforeOperator(auditSince(cp, started), instancePods, OPERATOR_NS, OPERATOR_USER),
        ).toEqual([]);
        expect(() => helm(['status', RELEASE, '--namespace', OPERATOR_NS])).toThrow(/not found/);
        expect(exists('deployment', RELEASE, '-n', OPERATOR_NS)).toBe(false);
        expect(k('get', 'clusterrole', '-o', 'name')).not.toContain('egress-proxies-operator');
        for (const crd of ['proxies', 'proxypools', 'providerhealths'])
          expect(exists('crd', `${crd}.crawl.example.com`), crd).toBe(true);
        expect(agent?.running().size).toBe(0);
        expect(agent?.problems()).toEqual([]);
        await operator?.stop();
        operator = undefined;
      }
    }
    for (const crd of ['proxies', 'proxypools', 'providerhealths'])
      expect(exists('crd', `${crd}.crawl.example.com`), crd).toBe(false);
    expect(exists('namespace', OPERATOR_NS)).toBe(false);
    k('delete', 'namespace', 'crawl', '--wait');
  });
});

const runBlock = (b: Block) => runDocBlock(cp, clone, b, { path: [helmDir], env: helmEnv });

function deployment(): Obj & DeploymentLike & { metadata: { generation: number } } {
  return JSON.parse(k('-n', OPERATOR_NS, 'get', 'deployment', RELEASE, '-o', 'json'));
}

function deploymentState(): { generation: number; checksum?: string } | undefined {
  if (!exists('deployment', RELEASE, '-n', OPERATOR_NS)) return undefined;
  const d = deployment();
  return {
    generation: d.metadata.generation,
    checksum: d.spec.template.metadata.annotations?.['checksum/providers-config'],
  };
}

/** Every object of the release is in the cluster; the Deployment runs the manager with the gateway. */
function afterInstall(): void {
  const manifest = parseAll(helm(['get', 'manifest', RELEASE, '--namespace', OPERATOR_NS]));
  expect(manifest.length).toBeGreaterThan(10);
  expect(missingObjects(cp, manifest)).toEqual([]);
  for (const crd of ['proxies', 'proxypools', 'providerhealths'])
    k('wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`);
  const manager = deployment().spec.template.spec.containers[0] as unknown as {
    image: string;
    args: string[];
  };
  expect(manager.image).toBe('registry.example.com/crawl/egress-proxies-operator:0.1.0');
  const parsed = parseCommandLine(manager.args);
  expect(parsed.command).toBe('operator');
  if (parsed.command === 'operator') expect(parsed.flags.gateway.bindAddress).toBe(':8888');
  expect(exists('service', 'egress-proxies-operator-gateway', '-n', OPERATOR_NS)).toBe(true);
}

/** What the ConfigMap holds, as the manager would read it from its mount. */
function providersFile(): string {
  const file = join(scratch, 'providers.yaml');
  writeFileSync(
    file,
    k('-n', OPERATOR_NS, 'get', 'configmap', PROVIDERS_CM, '-o', 'jsonpath={.data.providers\\.yaml}'),
  );
  return file;
}

/** Starts the operator where the rollout would: its ServiceAccount, the ConfigMap's config. */
async function startTheOperator(): Promise<void> {
  operator = await startDocOperator(cp, {
    name: 'helm',
    dir: scratch,
    kubeconfig: serviceAccountKubeconfig(cp, OPERATOR_NS, OPERATOR_SA, join(scratch, 'operator.kubeconfig'))
      .file,
    providersConfig: providersFile(),
  });
}

/** A Proxy and a pool of two, run by the operator on Squid Pods. */
async function runProxies(): Promise<void> {
  k('create', 'namespace', 'crawl');
  kubectl(
    cp,
    ['apply', '-f', '-'],
    [
      'apiVersion: crawl.example.com/v1alpha1',
      'kind: Proxy',
      'metadata: {name: squid-1, namespace: crawl}',
      'spec: {type: Managed, provider: kubernetes, placement: {machineType: small}}',
      '---',
      'apiVersion: crawl.example.com/v1alpha1',
      'kind: ProxyPool',
      'metadata: {name: fleet, namespace: crawl}',
      'spec:',
      '  replicas: 2',
      '  template:',
      '    metadata: {labels: {pool: fleet}}',
      '    spec: {type: Managed, provider: kubernetes, placement: {machineType: small}}',
      '',
    ].join('\n'),
  );
  await proxiesReady(cp, 'crawl', 3);
  expect(agent?.running().size).toBe(3);
}

/** The user's edit before the upgrade: a second resource profile in the providers config. */
async function beforeUpgrade(): Promise<void> {
  const values = join(clone, 'my-install/values.yaml');
  const text = readFileSync(values, 'utf8');
  const small = '          small: {cpu: 100m, memory: 128Mi}\n';
  expect(text).toContain(small);
  writeFileSync(values, text.replace(small, `${small}          large: {cpu: "1", memory: 512Mi}\n`));
}

/** The values change rolled the Deployment; the operator restarts on the new config, as its Pods would. */
async function afterUpgrade(
  before: { generation: number; checksum?: string } | undefined,
  out: string,
): Promise<void> {
  expect(out).toContain('has been upgraded');
  const now = deploymentState();
  expect(before?.checksum).toMatch(/^[0-9a-f]{64}$/);
  expect(now?.checksum).toMatch(/^[0-9a-f]{64}$/);
  expect(now?.checksum).not.toBe(before?.checksum);
  expect(now?.generation).toBe((before?.generation ?? 0) + 1);
  const status = JSON.parse(helm(['status', RELEASE, '--namespace', OPERATOR_NS, '-o', 'json'])) as {
    version: number;
    info: { status: string };
  };
  expect([status.version, status.info.status]).toEqual([2, 'deployed']);
  await operator?.stop();
  await startTheOperator();
  expect(readFileSync(providersFile(), 'utf8')).toContain('large');
}

function podsOfInstances(): string[] {
  return k(
    'get',
    'pods',
    '-n',
    OPERATOR_NS,
    '-l',
    INSTANCE_LABEL_INSTALLATION,
    '-o',
    'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}',
  )
    .split('\n')
    .filter(Boolean);
}
