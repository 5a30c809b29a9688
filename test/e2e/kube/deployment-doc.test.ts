/**
 * docs/deployment.md, run as written on the real API server. Every fenced block of that page is
 * preceded by a marker, `<!-- tier: MODE ID -->`:
 *   run       the block runs here, with bash -e, in order, in a fresh copy of the repository
 *             (config/, src/, scripts/uninstall.sh and package.json copied; node_modules linked), with
 *             the tier's kubectl first on PATH and KUBECONFIG set to the cluster admin;
 *   operator  not run (it waits for the Deployment's rollout, and no kubelet runs the image
 *             here): the tier starts the operator in its place, as a local process with the
 *             Deployment's flags and its ServiceAccount's token, and the node agent runs the
 *             kubernetes provider's Squid Pods;
 *   skip      not run (Docker, kind, a registry), and the page says so in the block.
 * Around the blocks: the overlay renders the gateway component; the validation command tells a
 * valid providers file from an invalid one; the page's inventory names every installed object;
 * the uninstall script refuses while no operator leads; the documented uninstall with the
 * operator leading leaves no Proxy on a finalizer, and the operator deleted every instance Pod
 * before the Deployment was deleted (the API server's audit log).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import YAML from 'yaml';
import { INSTANCE_LABEL_INSTALLATION } from '../../../src/api/constants.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { kubectl } from './support/control-plane.ts';
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
  sh as shIn,
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

let clone: string;
let scratch: string;
let agent: NodeAgent | undefined;
let operator: RunningOperator | undefined;
let operatorKubeconfig: string;

const sh = (code: string) => shIn(cp, clone, code);

const runBlock = (b: Block) => runDocBlock(cp, clone, b);

const exists = (...args: string[]) => existsIn(cp, ...args);

async function startTheOperator(): Promise<RunningOperator> {
  const started = await startDocOperator(cp, {
    name: 'doc',
    dir: scratch,
    kubeconfig: operatorKubeconfig,
    // What the ConfigMap of the overlay holds.
    providersConfig: join(clone, 'my-install/providers.yaml'),
  });
  operator = started;
  return started;
}

async function stopTheOperator(): Promise<void> {
  await operator?.stop();
  operator = undefined;
}

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), 'e2e-kube-deploydoc-'));
  clone = userClone(scratch);
  // A clean cluster: what an earlier file installed goes (its Proxies' finalizers released).
  releaseEveryFinalizer(cp);
  k('delete', '-k', resolve(ROOT, 'config/default'), '--ignore-not-found', '--wait');
  k('delete', 'namespace', 'crawl', '--ignore-not-found', '--wait');
});

afterAll(async () => {
  await stopTheOperator();
  await agent?.stop();
  // Whatever a failed test left: no finalizer may outlive the tier's operator.
  try {
    releaseEveryFinalizer(cp);
  } catch {
    // nothing left to release
  }
  // The tier's other files share this API server: whatever the page installed goes, even when a
  // block failed halfway (a client-side applied Deployment would conflict with their server-side
  // apply, a leftover binding with their `create`).
  for (const args of [
    ['delete', '-k', join(clone, 'my-install'), '--ignore-not-found', '--wait'],
    ['delete', 'clusterrolebinding', 'prometheus-egress-proxies-metrics', '--ignore-not-found'],
    ['delete', 'namespace', 'crawl', '--ignore-not-found', '--wait'],
  ]) {
    try {
      k(...args);
    } catch {
      // already gone, or never made
    }
  }
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('docs/deployment.md, every command as written', () => {
  const blocks = docBlocks(readFileSync(DOC, 'utf8'));

  it('marks every block, and runs all but the few that need Docker, kind or a kubelet', () => {
    expect(new Set(blocks.map((b) => b.id)).size).toBe(blocks.length);
    // The Helm path's blocks are helm.test.ts's.
    const kustomizePath = blocks.filter((b) => !b.mode.startsWith('helm'));
    expect(kustomizePath.filter((b) => b.mode !== 'run').map((b) => `${b.mode} ${b.id}`)).toEqual([
      'skip build',
      'operator rollout',
      'skip kind',
    ]);
    for (const b of kustomizePath.filter((x) => x.mode !== 'run'))
      expect(b.code, b.id).toMatch(/^# not run by the tests: /);
    // Every block that runs is in order of the page: the overlay before the install before the uninstall.
    const ids = kustomizePath.map((b) => b.id);
    expect(ids.indexOf('overlay')).toBeLessThan(ids.indexOf('install'));
    expect(ids.at(-2)).toBe('uninstall');
  });

  it('installs, runs a Proxy and a pool, exposes, upgrades and uninstalls without leaking an instance', async () => {
    let instancePods: string[] = [];
    const started = Date.now();
    for (const b of blocks) {
      if (b.mode === 'skip' || b.mode.startsWith('helm')) continue;
      if (b.mode === 'operator') {
        operatorKubeconfig = serviceAccountKubeconfig(
          cp,
          OPERATOR_NS,
          OPERATOR_SA,
          join(scratch, 'operator.kubeconfig'),
        ).file;
        agent = await startNodeAgent(cp);
        await startTheOperator();
        continue;
      }
      if (b.id === 'uninstall') {
        instancePods = await beforeUninstall();
      }
      const out = await runBlock(b);
      await after(b.id, out);
    }

    // The uninstall: no Proxy on a finalizer, nothing of the installation left.
    expect(exists('crd', 'proxies.crawl.example.com')).toBe(false);
    expect(exists('namespace', OPERATOR_NS)).toBe(false);
    expect(k('get', 'clusterrole', '-o', 'name')).not.toContain('egress-proxies-operator');
    // Every instance Pod was deleted by the operator (its finalizer), before the Deployment went.
    expect(instancePods.length).toBe(3);
    expect(
      instancesDeletedBeforeOperator(auditSince(cp, started), instancePods, OPERATOR_NS, OPERATOR_USER),
    ).toEqual([]);
    expect(agent?.running().size).toBe(0);
    expect(agent?.problems()).toEqual([]);
    k('delete', 'namespace', 'crawl', '--wait');
  });
});

/** What the tier checks after a block ran. */
async function after(id: string, out: string): Promise<void> {
  switch (id) {
    case 'overlay': {
      // The overlay serves the gateway: its flag, its Service, a required token.
      const objs = YAML.parseAllDocuments(k('kustomize', join(clone, 'my-install'))).map(
        (d) => d.toJS() as { kind: string; metadata: { name: string }; spec?: Record<string, unknown> },
      );
      const deploy = objs.find((o) => o.kind === 'Deployment') as unknown as {
        spec: {
          template: {
            spec: {
              containers: {
                image: string;
                args: string[];
                env: { name: string; valueFrom?: { secretKeyRef?: { name: string; optional?: boolean } } }[];
              }[];
            };
          };
        };
      };
      const manager = deploy.spec.template.spec.containers[0];
      expect(manager?.image).toBe('registry.example.com/crawl/egress-proxies-operator:0.1.0');
      const parsed = parseCommandLine(manager?.args ?? []);
      expect(parsed.command).toBe('operator');
      if (parsed.command === 'operator') expect(parsed.flags.gateway.bindAddress).toBe(':8888');
      const envOf = (n: string) => manager?.env.find((e) => e.name === n)?.valueFrom?.secretKeyRef;
      expect(envOf('DISCOVERY_TOKEN')).toMatchObject({
        name: 'egress-proxies-operator-discovery-token',
        optional: false,
      });
      expect(envOf('GATEWAY_TOKEN')).toMatchObject({
        name: 'egress-proxies-operator-gateway-token',
        optional: true,
      });
      expect(objs.filter((o) => o.kind === 'Service').map((o) => o.metadata.name)).toContain(
        'egress-proxies-operator-gateway',
      );
      expect(objs.filter((o) => o.kind === 'ConfigMap')).toHaveLength(1);
      // The page's inventory names every object the overlay installs.
      const doc = readFileSync(DOC, 'utf8');
      for (const o of objs) {
        const name = o.kind === 'ConfigMap' ? o.metadata.name.replace(/-[a-z0-9]{10}$/, '') : o.metadata.name;
        expect(doc, `${o.kind} ${name} in "What gets installed"`).toContain(name);
      }
      return;
    }
    case 'validate': {
      expect(out.trim()).toBe('providers config OK');
      // The same command tells an invalid file apart (and never dies of the system Node).
      writeFileSync(join(scratch, 'bad.yaml'), 'providers:\n  - name: x\n    type: nope\n');
      const bad = await sh(
        `npm exec -- node src/cmd/main.ts check-config --providers-config ${join(scratch, 'bad.yaml')}`,
      );
      expect(bad.code).toBe(2);
      expect(bad.out).toContain('invalid providers config');
      expect(bad.out).not.toContain('providers config OK');
      expect(bad.out).not.toContain('ERR_UNKNOWN_FILE_EXTENSION');
      return;
    }
    case 'install': {
      const objs = YAML.parseAllDocuments(k('kustomize', join(clone, 'my-install'))).map(
        (d) => d.toJS() as { kind: string; metadata: { name: string; namespace?: string } },
      );
      expect(missingObjects(cp, objs)).toEqual([]);
      return;
    }
    case 'first-proxies': {
      expect(out).toMatch(/crawl\s+squid-1\s+Managed\s+kubernetes/);
      // The operator runs them: the Proxy and both pool members get a Pod, a Squid and the finalizer.
      await proxiesReady(cp, 'crawl', 3);
      expect(agent?.running().size).toBe(3);
      return;
    }
    case 'expose-gateway':
      expect(
        k('-n', OPERATOR_NS, 'get', 'svc', 'egress-proxies-operator-gateway', '-o', 'jsonpath={.spec.type}'),
      ).toBe('LoadBalancer');
      return;
    case 'leader':
      expect(out.split(/\s+/)[0]).toBe(operator?.identity());
      return;
    default:
      return;
  }
}

/**
 * Before the documented uninstall: the script refuses while no operator leads (and deletes
 * nothing); then the operator runs again. Returns the instance Pods that must go.
 */
async function beforeUninstall(): Promise<string[]> {
  await stopTheOperator();
  const refused = await sh('scripts/uninstall.sh my-install');
  expect(refused.code).toBe(1);
  expect(refused.out).toContain('no operator is leading');
  expect(k('get', 'pxp', '-n', 'crawl', '-o', 'name').trim()).toBe('proxypool.crawl.example.com/fleet');
  expect(k('get', 'px', '-n', 'crawl', '-o', 'name').trim().split('\n')).toHaveLength(3);
  expect(exists('deployment', 'egress-proxies-operator', '-n', OPERATOR_NS)).toBe(true);
  await startTheOperator();
  const pods = k(
    'get',
    'pods',
    '-n',
    OPERATOR_NS,
    '-l',
    INSTANCE_LABEL_INSTALLATION,
    '-o',
    'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}',
  );
  return pods.split('\n').filter(Boolean);
}
