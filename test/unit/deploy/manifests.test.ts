/**
 * The deployment tree under config/ and the image build: every YAML parses, every kustomization
 * reference exists, the objects the default overlay installs refer to each other correctly, the
 * RBAC grants exactly what the code calls (an explicit table, checked against the source in both
 * directions), and the manager runs locked down with flags the real CLI parser accepts.
 */

import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { loadProvidersConfig } from '../../../src/config/load.ts';
import { NODE_LAUNCH_FLAGS } from '../../../src/runtime/v8-flags.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const CONFIG = join(ROOT, 'config');

type Obj = {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; namespace?: string; labels?: Record<string, string> };
  [k: string]: unknown;
};

function walk(dir: string, out: string[] = []): string[] {
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (/\.ya?ml$/.test(e)) out.push(p);
  }
  return out;
}

function parseFile(path: string): Obj[] {
  const docs = YAML.parseAllDocuments(readFileSync(path, 'utf8'), { uniqueKeys: true });
  for (const d of docs) {
    if (d.errors.length > 0) throw new Error(`${relative(ROOT, path)}: ${d.errors[0]?.message}`);
  }
  return docs.map((d) => d.toJS() as Obj).filter((o) => o !== null && o !== undefined);
}

interface Kustomization {
  namespace?: string;
  resources?: string[];
  configMapGenerator?: { name: string; files?: string[] }[];
  images?: { name: string; newName?: string; newTag?: string }[];
}

const CLUSTER_SCOPED = new Set([
  'Namespace',
  'ClusterRole',
  'ClusterRoleBinding',
  'CustomResourceDefinition',
]);

/** A small kustomize: resources (files and directories), namespace, ConfigMap generators. */
function build(dir: string): Obj[] {
  const k = parseFile(join(dir, 'kustomization.yaml'))[0] as Kustomization;
  const out: Obj[] = [];
  for (const r of k.resources ?? []) {
    const p = join(dir, r);
    if (!existsSync(p)) throw new Error(`${relative(ROOT, dir)}/kustomization.yaml: ${r} does not exist`);
    out.push(...(statSync(p).isDirectory() ? build(p) : parseFile(p)));
  }
  for (const g of k.configMapGenerator ?? []) {
    const data: Record<string, string> = {};
    for (const f of g.files ?? []) data[f] = readFileSync(join(dir, f), 'utf8');
    out.push({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: g.name }, data });
  }
  if (k.namespace) {
    for (const o of out) {
      if (!CLUSTER_SCOPED.has(o.kind ?? '') && o.metadata) o.metadata.namespace = k.namespace;
      for (const s of (o.subjects as { kind: string; namespace?: string }[] | undefined) ?? []) {
        if (s.kind === 'ServiceAccount') s.namespace = k.namespace;
      }
    }
  }
  return out;
}

const objects = build(join(CONFIG, 'default'));
const find = (kind: string, name?: string) =>
  objects.filter((o) => o.kind === kind && (name === undefined || o.metadata?.name === name));
const one = (kind: string, name?: string): Obj => {
  const found = find(kind, name);
  if (found.length !== 1) throw new Error(`expected one ${kind} ${name ?? ''}, found ${found.length}`);
  return found[0] as Obj;
};

interface Container {
  name: string;
  image: string;
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: Record<string, Record<string, unknown>> }[];
  ports?: { name: string; containerPort: number }[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  securityContext?: Record<string, unknown>;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  livenessProbe?: { httpGet?: { path: string; port: string | number } };
  readinessProbe?: { httpGet?: { path: string; port: string | number } };
}
interface PodSpec {
  serviceAccountName?: string;
  securityContext?: Record<string, unknown>;
  containers: Container[];
  volumes?: {
    name: string;
    configMap?: { name: string };
    secret?: { secretName: string; optional?: boolean };
    emptyDir?: { sizeLimit?: string; medium?: string };
  }[];
}
const deployment = one('Deployment', 'egress-proxies-operator') as Obj & {
  spec: {
    selector: { matchLabels: Record<string, string> };
    template: { metadata: Obj['metadata']; spec: PodSpec };
  };
};
const pod = deployment.spec.template.spec;
const manager = pod.containers[0] as Container;

describe('config/ tree', () => {
  it('every YAML file parses, and every kustomization reference exists', () => {
    const files = walk(CONFIG);
    expect(files.length).toBeGreaterThan(10);
    for (const f of files) expect(() => parseFile(f), relative(ROOT, f)).not.toThrow();
    for (const f of files.filter((x) => x.endsWith('kustomization.yaml'))) {
      const k = parseFile(f)[0] as Kustomization;
      for (const r of k.resources ?? []) {
        const p = join(dirname(f), r);
        expect(existsSync(p), `${relative(ROOT, f)} → ${r}`).toBe(true);
        if (statSync(p).isDirectory()) expect(existsSync(join(p, 'kustomization.yaml'))).toBe(true);
      }
      for (const g of k.configMapGenerator ?? []) {
        for (const file of g.files ?? []) expect(existsSync(join(dirname(f), file)), file).toBe(true);
      }
    }
  });

  it('the default overlay installs CRDs, RBAC and the manager in one namespace', () => {
    expect(find('CustomResourceDefinition').map((o) => o.metadata?.name)).toEqual(
      expect.arrayContaining(['proxies.crawl.example.com', 'providerhealths.crawl.example.com']),
    );
    const ns = one('Namespace').metadata?.name;
    for (const o of objects.filter((x) => !CLUSTER_SCOPED.has(x.kind ?? ''))) {
      expect(o.metadata?.namespace, `${o.kind} ${o.metadata?.name}`).toBe(ns);
    }
    // Samples are optional (commented out), never half-installed.
    expect(find('Proxy')).toEqual([]);
  });

  it('the Deployment references objects that exist, and the Services select its Pods', () => {
    expect(one('ServiceAccount', pod.serviceAccountName).metadata?.name).toBe('egress-proxies-operator');
    for (const v of pod.volumes ?? []) {
      if (v.configMap) expect(find('ConfigMap', v.configMap.name), v.name).toHaveLength(1);
      // Secrets are created by the user; each must be optional so the manager starts without.
      if (v.secret) expect(v.secret.optional, v.name).toBe(true);
    }
    for (const m of manager.volumeMounts ?? []) {
      expect(
        pod.volumes?.some((v) => v.name === m.name),
        m.name,
      ).toBe(true);
    }
    const podLabels = deployment.spec.template.metadata?.labels ?? {};
    expect(podLabels).toMatchObject(deployment.spec.selector.matchLabels);
    const portNames = new Set((manager.ports ?? []).map((p) => p.name));
    const services = find('Service') as (Obj & {
      spec: { selector: Record<string, string>; ports: { port: number; targetPort: string }[] };
    })[];
    // The gateway Service comes with its component (config/components/gateway), which also serves it.
    expect(services.map((s) => s.spec.ports[0]?.port).sort()).toEqual([8080, 8090]);
    for (const s of services) {
      expect(podLabels).toMatchObject(s.spec.selector);
      for (const p of s.spec.ports) expect(portNames.has(p.targetPort), p.targetPort).toBe(true);
    }
  });

  it('the manager args are accepted by the real CLI parser and match the mounts', () => {
    const parsed = parseCommandLine(manager.args ?? []);
    expect(parsed.command).toBe('operator');
    if (parsed.command !== 'operator') return;
    expect(parsed.flags.providersConfig).toBe('/etc/egress-proxies-operator/providers.yaml');
    expect(parsed.flags.leaderElect).toBe(true);
    expect(parsed.flags.metricsBindAddress).toBe(':8080');
    expect(parsed.flags.discoveryBindAddress).toBe(':8090');
    expect(parsed.flags.healthProbeBindAddress).toBe(':8081');
    const mount = manager.volumeMounts?.find((m) =>
      parsed.flags.providersConfig.startsWith(`${m.mountPath}/`),
    );
    const volume = pod.volumes?.find((v) => v.name === mount?.name);
    const cm = one('ConfigMap', volume?.configMap?.name) as Obj & { data: Record<string, string> };
    expect(Object.keys(cm.data)).toContain('providers.yaml');
    expect(manager.ports?.find((p) => p.name === 'discovery')?.containerPort).toBe(8090);
    expect(manager.ports?.find((p) => p.name === 'metrics')?.containerPort).toBe(8080);
    expect(manager.ports?.find((p) => p.name === 'probes')?.containerPort).toBe(8081);
  });

  it('the shipped providers config passes the real validator', async () => {
    await expect(loadProvidersConfig(join(CONFIG, 'manager/providers.yaml'))).resolves.toMatchObject({
      providers: [expect.objectContaining({ type: 'kubernetes' })],
    });
  });

  it('the manager runs non-root on a read-only root filesystem with a small /tmp', () => {
    expect(pod.securityContext).toMatchObject({
      runAsNonRoot: true,
      seccompProfile: { type: 'RuntimeDefault' },
    });
    expect(Number(pod.securityContext?.runAsUser)).toBeGreaterThan(0);
    expect(manager.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'] },
    });
    expect(manager.securityContext?.privileged ?? false).toBe(false);
    const tmp = manager.volumeMounts?.find((m) => m.mountPath === '/tmp');
    const tmpVol = pod.volumes?.find((v) => v.name === tmp?.name);
    expect(tmpVol?.emptyDir?.sizeLimit).toMatch(/^\d+Mi$/);
    for (const m of manager.volumeMounts ?? []) {
      if (m.mountPath !== '/tmp') expect(m.readOnly, m.mountPath).toBe(true);
    }
    expect(manager.resources?.requests?.cpu).toBeDefined();
    expect(manager.resources?.requests?.memory).toBeDefined();
    expect(manager.resources?.limits?.memory).toBeDefined();
    expect(manager.livenessProbe?.httpGet).toEqual({ path: '/healthz', port: 'probes' });
    expect(manager.readinessProbe?.httpGet).toEqual({ path: '/readyz', port: 'probes' });
    const env = new Map((manager.env ?? []).map((e) => [e.name, e]));
    expect(env.get('POD_NAMESPACE')?.valueFrom?.fieldRef?.fieldPath).toBe('metadata.namespace');
    expect(env.get('DISCOVERY_TOKEN')?.valueFrom?.secretKeyRef).toMatchObject({ optional: true });
  });
});

/**
 * Every Kubernetes API call the code makes, and the permission it needs. `calls` are client-node
 * method names that must appear in `source` (so a renamed or removed call fails here); `needs` is
 * empty for calls the code has but cluster mode never exercises on that resource.
 */
interface ApiCall {
  source: string;
  calls: string[];
  needs: { group: string; resource: string; verbs: string[]; scope: 'cluster' | 'namespace' }[];
  why: string;
}

const PROXY = { group: 'crawl.example.com', scope: 'cluster' } as const;
const CORE = { group: '', scope: 'cluster' } as const;
const STORE = 'src/runtime/kube/rest.ts';
const REFLECTOR = 'src/runtime/kube/reflector.ts';

const API_CALLS: ApiCall[] = [
  {
    source: STORE,
    calls: ['listNamespacedCustomObject', 'listClusterCustomObject'],
    needs: [
      { ...PROXY, resource: 'proxies', verbs: ['list', 'watch'] },
      { ...PROXY, resource: 'proxypools', verbs: ['list', 'watch'] },
      { ...PROXY, resource: 'providerhealths', verbs: ['list'] },
    ],
    why: 'reflector caches (list, then watch from the resourceVersion); one uncached list of ProviderHealths at start',
  },
  {
    source: STORE,
    calls: ['getNamespacedCustomObject', 'getClusterCustomObject'],
    needs: [
      { ...PROXY, resource: 'proxies', verbs: ['get'] },
      { ...PROXY, resource: 'providerhealths', verbs: ['get'] },
    ],
    why: 'fresh reads: reconciler after a conflict, health engine, provider health monitor',
  },
  {
    source: STORE,
    calls: ['createClusterCustomObject', 'createNamespacedCustomObject'],
    needs: [
      { ...PROXY, resource: 'providerhealths', verbs: ['create'] },
      { ...PROXY, resource: 'proxies', verbs: ['create'] },
    ],
    why: 'one ProviderHealth per provider; a pool creates its Proxies',
  },
  {
    source: STORE,
    calls: ['replaceNamespacedCustomObject', 'replaceClusterCustomObject'],
    needs: [{ ...PROXY, resource: 'proxies', verbs: ['update'] }],
    why: 'reconciler writes finalizer + spec-hash annotation in one update',
  },
  {
    source: STORE,
    calls: ['patchNamespacedCustomObject', 'patchClusterCustomObject'],
    needs: [{ ...PROXY, resource: 'proxies', verbs: ['patch'] }],
    why: 'finalizer removal as a resourceVersion-guarded merge patch',
  },
  {
    source: STORE,
    calls: ['patchNamespacedCustomObjectStatus', 'patchClusterCustomObjectStatus'],
    needs: [
      { ...PROXY, resource: 'proxies/status', verbs: ['patch'] },
      { ...PROXY, resource: 'proxypools/status', verbs: ['patch'] },
      { ...PROXY, resource: 'providerhealths/status', verbs: ['patch'] },
    ],
    why: 'status writes (reconciler, health engine, provider health monitor)',
  },
  {
    source: STORE,
    calls: ['deleteClusterCustomObject', 'deleteNamespacedCustomObject'],
    needs: [
      { ...PROXY, resource: 'providerhealths', verbs: ['delete'] },
      { ...PROXY, resource: 'proxies', verbs: ['delete'] },
    ],
    why: 'ProviderHealth of a provider no longer configured; a pool deletes its drained Proxies',
  },
  {
    source: 'src/controller/inputs.ts',
    calls: ['blockOwnerDeletion: true'],
    needs: [{ ...PROXY, resource: 'proxies/finalizers', verbs: ['update'] }],
    why: 'the generated <proxy>-auth Secret is owned by its Proxy with blockOwnerDeletion',
  },
  {
    source: 'src/pool/template.ts',
    calls: ['blockOwnerDeletion: true'],
    needs: [{ ...PROXY, resource: 'proxypools/finalizers', verbs: ['update'] }],
    why: "a pool's Proxies are owned by the pool with blockOwnerDeletion",
  },
  {
    source: STORE,
    calls: ['listNamespacedSecret', 'listSecretForAllNamespaces', 'readNamespacedSecret'],
    needs: [{ ...CORE, resource: 'secrets', verbs: ['list', 'watch', 'get'] }],
    why: 'label-selected Secret caches and fresh reads',
  },
  {
    source: STORE,
    calls: ['createNamespacedSecret', 'deleteNamespacedSecret'],
    needs: [{ ...CORE, resource: 'secrets', verbs: ['create', 'delete'] }],
    why: 'generated <proxy>-auth credentials',
  },
  {
    source: STORE,
    calls: ['patchNamespacedSecret'],
    needs: [{ ...CORE, resource: 'secrets', verbs: ['patch'] }],
    why: 'the credentials-for label on a Secret named by credentialsSecretRef, so it is watched',
  },
  {
    source: 'src/runtime/kube/installation.ts',
    calls: ['readNamespace'],
    needs: [{ ...CORE, resource: 'namespaces', verbs: ['get'] }],
    why: 'the installation id: the kube-system namespace UID',
  },
  {
    source: 'src/provider/kubernetes/index.ts',
    calls: ['createNamespacedSecret', 'deleteNamespacedSecret'],
    needs: [{ ...CORE, resource: 'secrets', verbs: ['create', 'delete'] }],
    why: "each proxy Pod's Squid config Secret",
  },
  {
    source: 'src/provider/kubernetes/index.ts',
    calls: ['createNamespacedPod', 'readNamespacedPod', 'deleteNamespacedPod', 'listPodForAllNamespaces'],
    needs: [{ ...CORE, resource: 'pods', verbs: ['create', 'get', 'delete', 'list'] }],
    why: 'kubernetes provider instances; cluster-wide list for orphan sweep and the provider check',
  },
  {
    source: 'src/provider/kubernetes/node-location.ts',
    calls: ['readNode'],
    needs: [{ ...CORE, resource: 'nodes', verbs: ['get'] }],
    why: "a proxy Pod's region and zone: its Node's topology labels",
  },
  {
    source: 'src/provider/kubernetes/index.ts',
    calls: ['patchNamespacedPod'],
    needs: [{ ...CORE, resource: 'pods', verbs: ['patch'] }],
    why: 'adoption: the installation label on Pods created before installations existed',
  },
  {
    source: 'src/runtime/leader/lease.ts',
    calls: ['readNamespacedLease', 'createNamespacedLease', 'replaceNamespacedLease'],
    needs: [
      {
        group: 'coordination.k8s.io',
        resource: 'leases',
        verbs: ['get', 'create', 'update'],
        scope: 'namespace',
      },
    ],
    why: '--leader-elect',
  },
  {
    source: 'src/runtime/leader/checkpoint-configmaps.ts',
    calls: ['readNamespacedConfigMap', 'createNamespacedConfigMap', 'replaceNamespacedConfigMap'],
    needs: [{ ...CORE, resource: 'configmaps', verbs: ['get', 'create', 'update'], scope: 'namespace' }],
    why: 'the lease checkpoint (one lease authority, durable leases and cooldowns)',
  },
  {
    source: 'src/metrics/authorize.ts',
    calls: ['createTokenReview', 'createSubjectAccessReview'],
    needs: [
      { group: 'authentication.k8s.io', resource: 'tokenreviews', verbs: ['create'], scope: 'cluster' },
      {
        group: 'authorization.k8s.io',
        resource: 'subjectaccessreviews',
        verbs: ['create'],
        scope: 'cluster',
      },
    ],
    why: '--metrics-secure',
  },
];

interface Rule {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
  nonResourceURLs?: string[];
}
type RoleObj = Obj & { rules: Rule[] };
type BindingObj = Obj & {
  roleRef: { kind: string; name: string };
  subjects: { kind: string; name: string; namespace?: string }[];
};

const sa = one('ServiceAccount', 'egress-proxies-operator');
const boundTo = (b: BindingObj) =>
  b.subjects.some(
    (s) =>
      s.kind === 'ServiceAccount' && s.name === sa.metadata?.name && s.namespace === sa.metadata?.namespace,
  );
const clusterRules = (find('ClusterRoleBinding') as BindingObj[])
  .filter(boundTo)
  .flatMap((b) => (one('ClusterRole', b.roleRef.name) as RoleObj).rules);
const namespaceRules = (find('RoleBinding') as BindingObj[])
  .filter(boundTo)
  .flatMap((b) => (one(b.roleRef.kind, b.roleRef.name) as RoleObj).rules);

function grants(rules: Rule[], group: string, resource: string, verb: string): boolean {
  return rules.some(
    (r) =>
      (r.apiGroups ?? []).includes(group) && (r.resources ?? []).includes(resource) && r.verbs.includes(verb),
  );
}

describe('RBAC', () => {
  it('the API-call table matches the source', () => {
    for (const c of API_CALLS) {
      const text = readFileSync(join(ROOT, c.source), 'utf8');
      for (const call of c.calls) expect(text.includes(call), `${call} in ${c.source}`).toBe(true);
    }
    // The other direction: every client-node call in src/ is in the table.
    const known = new Set(API_CALLS.flatMap((c) => c.calls));
    const re = /\.((?:create|read|replace|patch|delete|list|get)(?:Namespaced|Cluster)?[A-Z]\w*)\(/g;
    const clientFiles = walkTs(join(ROOT, 'src')).filter((f) => {
      const t = readFileSync(f, 'utf8');
      return t.includes('@kubernetes/client-node') || t.includes("from '../kube/client.ts'");
    });
    const found = new Set<string>();
    for (const f of clientFiles) {
      for (const m of readFileSync(f, 'utf8').matchAll(re)) {
        const name = m[1] as string;
        if (/(Namespaced|ForAllNamespaces|CustomObject|TokenReview|SubjectAccessReview)/.test(name))
          found.add(name);
      }
    }
    expect([...found].filter((n) => !known.has(n))).toEqual([]);
    // Watches go through the reflector's raw Watch on the same collections it lists.
    expect(readFileSync(join(ROOT, REFLECTOR), 'utf8')).toContain('watch');
  });

  it('grants every permission the code needs, cluster-wide or in the operator namespace', () => {
    for (const c of API_CALLS) {
      for (const n of c.needs) {
        const rules = n.scope === 'cluster' ? clusterRules : [...clusterRules, ...namespaceRules];
        for (const v of n.verbs) {
          expect(grants(rules, n.group, n.resource, v), `${v} ${n.resource} (${c.why})`).toBe(true);
        }
      }
    }
    // The leader Lease is namespaced: a Role in the operator namespace, not a ClusterRole.
    expect(grants(clusterRules, 'coordination.k8s.io', 'leases', 'update')).toBe(false);
    // So are the lease checkpoint ConfigMaps: no cluster-wide ConfigMap access.
    expect(grants(clusterRules, '', 'configmaps', 'get')).toBe(false);
    const leaderRole = one('Role');
    expect(leaderRole.metadata?.namespace).toBe(sa.metadata?.namespace);
  });

  it('grants nothing else: no wildcards, no verb the code does not use', () => {
    const needed = new Set(
      API_CALLS.flatMap((c) => c.needs.flatMap((n) => n.verbs.map((v) => `${n.group}/${n.resource}:${v}`))),
    );
    for (const r of [...clusterRules, ...namespaceRules]) {
      expect(r.verbs).not.toContain('*');
      expect(r.apiGroups ?? []).not.toContain('*');
      expect(r.resources ?? []).not.toContain('*');
      for (const g of r.apiGroups ?? []) {
        for (const res of r.resources ?? []) {
          for (const v of r.verbs) expect(needed.has(`${g}/${res}:${v}`), `${v} ${g}/${res}`).toBe(true);
        }
      }
    }
    expect(clusterRules.some((r) => r.resources?.includes('events'))).toBe(false);
  });

  it('ships a metrics-reader role for scrapers, bound to nobody by default', () => {
    const reader = one('ClusterRole', 'egress-proxies-operator-metrics-reader') as RoleObj;
    expect(reader.rules).toEqual([{ nonResourceURLs: ['/metrics'], verbs: ['get'] }]);
    expect(
      (find('ClusterRoleBinding') as BindingObj[]).some((b) => b.roleRef.name === reader.metadata?.name),
    ).toBe(false);
  });

  it('ships a read-only providerhealth-viewer role, bound to nobody by default', () => {
    const viewer = one('ClusterRole', 'egress-proxies-operator-providerhealth-viewer') as RoleObj;
    expect(viewer.rules).toEqual([
      {
        apiGroups: ['crawl.example.com'],
        resources: ['providerhealths', 'providerhealths/status'],
        verbs: ['get', 'list', 'watch'],
      },
    ]);
    expect(
      (find('ClusterRoleBinding') as BindingObj[]).some((b) => b.roleRef.name === viewer.metadata?.name),
    ).toBe(false);
  });
});

function walkTs(dir: string, out: string[] = []): string[] {
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) walkTs(p, out);
    else if (e.endsWith('.ts')) out.push(p);
  }
  return out;
}

describe('container image', () => {
  const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');

  it('builds dist/ with the build tsconfig and runs the compiled CLI as non-root', () => {
    const build = JSON.parse(readFileSync(join(ROOT, 'tsconfig.build.json'), 'utf8')) as {
      compilerOptions: { rootDir: string; outDir: string };
    };
    // src/cmd/main.ts compiles to <outDir>/cmd/main.js: the path the image runs, and one level
    // below the package root like src/, so main.ts finds ../../package.json from either.
    const entry = `${build.compilerOptions.outDir}/${relative(build.compilerOptions.rootDir, 'src/cmd/main.js')}`;
    expect(entry).toBe('dist/cmd/main.js');
    expect(dockerfile).toMatch(/RUN npm run build/);
    expect(dockerfile).toContain(`"/app/${entry}"`);
    expect(dockerfile).toMatch(/COPY --from=build \/app\/package\.json/);
    const user = /^USER\s+(\d+)/m.exec(dockerfile)?.[1];
    expect(Number(user)).toBe(Number(pod.securityContext?.runAsUser));
    expect(dockerfile).toMatch(/^FROM node:24-slim\s*$/m);
  });

  it('every launcher passes the V8 flags that only work on the command line', () => {
    const entrypoint = JSON.parse(/^ENTRYPOINT\s+(\[.*\])\s*$/m.exec(dockerfile)?.[1] ?? '[]') as string[];
    expect(entrypoint.slice(0, 1 + NODE_LAUNCH_FLAGS.length)).toEqual(['node', ...NODE_LAUNCH_FLAGS]);
    const shebang = readFileSync(join(ROOT, 'bin/egress-proxies-operator.js'), 'utf8').split('\n')[0];
    expect(shebang).toBe(`#!/usr/bin/env -S node ${NODE_LAUNCH_FLAGS.join(' ')}`);
  });

  it('the Deployment image is the one the kustomization sets', () => {
    const k = parseFile(join(CONFIG, 'manager/kustomization.yaml'))[0] as Kustomization;
    expect(k.images?.map((i) => i.name)).toContain(manager.image);
  });
});
