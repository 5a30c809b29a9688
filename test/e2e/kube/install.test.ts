/**
 * Installing as a user does, on the real API server: `kubectl apply --server-side -k
 * config/default` creates the CRDs (structural schemas, CEL rules within the cost budget), RBAC,
 * the namespace, ConfigMap, Service and Deployment; `kubectl get px,pxp,ph` prints the CRDs'
 * columns; `kubectl scale pxp/NAME` goes through the scale subresource; applying it a second time
 * changes nothing. Then config/default alone, client-side: the optional Secrets, a Proxy from
 * config/samples, and `kubectl delete -k` once no Proxy is left. docs/deployment.md itself (an
 * overlay with the gateway, the operator running, scripts/uninstall.sh) is run as written by
 * deployment-doc.test.ts.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { until } from '../../support/wait.ts';
import { kubectl } from './support/control-plane.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');
const k = (...args: string[]) => kubectl(cp, args);

function headers(table: string): string[] {
  const first = table.split('\n')[0] ?? '';
  return first.trim().split(/\s{2,}/);
}

describe('config/default on the real API server', () => {
  it('installs with kubectl apply --server-side -k, idempotently', () => {
    const out = k(
      'apply',
      '--server-side',
      '--field-manager=e2e-install',
      '-k',
      resolve(ROOT, 'config/default'),
    );
    for (const name of [
      'customresourcedefinition.apiextensions.k8s.io/proxies.crawl.example.com serverside-applied',
      'customresourcedefinition.apiextensions.k8s.io/proxypools.crawl.example.com serverside-applied',
      'customresourcedefinition.apiextensions.k8s.io/providerhealths.crawl.example.com serverside-applied',
      'clusterrole.rbac.authorization.k8s.io/egress-proxies-operator-manager serverside-applied',
      'serviceaccount/egress-proxies-operator serverside-applied',
      'deployment.apps/egress-proxies-operator serverside-applied',
    ])
      expect(out).toContain(name);
    for (const crd of ['proxies', 'proxypools', 'providerhealths'])
      k('wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`);
    // A second apply of the same manifests is a no-op for every object.
    const again = k(
      'apply',
      '--server-side',
      '--field-manager=e2e-install',
      '-k',
      resolve(ROOT, 'config/default'),
    );
    expect(again.split('\n').filter((l) => l && !l.endsWith('serverside-applied'))).toEqual([]);
    const rvBefore = k('get', 'crd/proxies.crawl.example.com', '-o', 'jsonpath={.metadata.resourceVersion}');
    k('apply', '--server-side', '--field-manager=e2e-install', '-k', resolve(ROOT, 'config/default'));
    expect(k('get', 'crd/proxies.crawl.example.com', '-o', 'jsonpath={.metadata.resourceVersion}')).toBe(
      rvBefore,
    );
  });

  it('the CRDs are accepted as written: structural, no pruned or rejected CEL rule', () => {
    for (const crd of ['proxies', 'proxypools', 'providerhealths']) {
      const obj = JSON.parse(k('get', `crd/${crd}.crawl.example.com`, '-o', 'json')) as {
        status: { conditions: { type: string; status: string; reason: string; message: string }[] };
      };
      const byType = Object.fromEntries(obj.status.conditions.map((c) => [c.type, c]));
      expect(byType.Established?.status, crd).toBe('True');
      expect(byType.NamesAccepted?.status, crd).toBe('True');
      expect(byType.NonStructuralSchema, crd).toBeUndefined();
    }
  });

  it('kubectl get px,pxp,ph prints the printer columns', () => {
    k('create', 'namespace', 'install-check');
    kubectl(
      cp,
      ['apply', '--server-side', '--field-manager=e2e-install', '-n', 'install-check', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: [
          {
            apiVersion: 'crawl.example.com/v1alpha1',
            kind: 'Proxy',
            metadata: { name: 'columns', namespace: 'install-check' },
            spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 } },
          },
          {
            apiVersion: 'crawl.example.com/v1alpha1',
            kind: 'ProxyPool',
            metadata: { name: 'columns', namespace: 'install-check' },
            spec: { replicas: 2, template: { spec: { provider: 'kubernetes' } } },
          },
        ],
      }),
    );
    expect(headers(k('get', 'px', '-n', 'install-check'))).toEqual([
      'NAME',
      'TYPE',
      'PROVIDER',
      'PHASE',
      'ADDRESS',
      'HEALTHY',
      'AGE',
    ]);
    expect(headers(k('get', 'pxp', '-n', 'install-check'))).toEqual([
      'NAME',
      'DESIRED',
      'READY',
      'HEALTHY',
      'LEASABLE',
      'AGE',
    ]);
    // ProviderHealths are written by the operator; one written here shows the columns.
    kubectl(
      cp,
      ['create', '-f', '-'],
      JSON.stringify({
        apiVersion: 'crawl.example.com/v1alpha1',
        kind: 'ProviderHealth',
        metadata: { name: 'columns-check' },
      }),
    );
    expect(headers(k('get', 'ph'))).toEqual(['NAME', 'TYPE', 'READY', 'TARGETS', 'LAST CHECK', 'AGE']);
    k('delete', 'ph', 'columns-check');
    const row = k('get', 'px', 'columns', '-n', 'install-check', '--no-headers').trim().split(/\s+/);
    expect(row.slice(0, 2)).toEqual(['columns', 'External']);
    expect(k('get', 'px,pxp', '-n', 'install-check', '-o', 'name').trim().split('\n').sort()).toEqual([
      'proxy.crawl.example.com/columns',
      'proxypool.crawl.example.com/columns',
    ]);
  });

  it('kubectl scale pxp/NAME sets spec.replicas through the scale subresource', async () => {
    expect(k('scale', 'pxp/columns', '-n', 'install-check', '--replicas=5')).toContain('scaled');
    expect(k('get', 'pxp', 'columns', '-n', 'install-check', '-o', 'jsonpath={.spec.replicas}')).toBe('5');
    const scale = JSON.parse(
      k('get', '--raw', '/apis/crawl.example.com/v1alpha1/namespaces/install-check/proxypools/columns/scale'),
    ) as { kind: string; spec: { replicas: number } };
    expect(scale).toMatchObject({ kind: 'Scale', spec: { replicas: 5 } });
    // Bad input changes nothing: a negative count is refused by the schema.
    expect(() => k('scale', 'pxp/columns', '-n', 'install-check', '--replicas=-1')).toThrow();
    expect(k('get', 'pxp', 'columns', '-n', 'install-check', '-o', 'jsonpath={.spec.replicas}')).toBe('5');
    k('delete', 'namespace', 'install-check', '--wait=false');
    await until(
      'namespace install-check gone (namespace controller)',
      () => {
        try {
          k('get', 'namespace', 'install-check');
          return false;
        } catch {
          return true;
        }
      },
      { timeoutMs: 60_000, intervalMs: 500 },
    );
  });

  it('config/default client-side: Secrets, a sample Proxy, delete -k once no Proxy is left', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'e2e-kube-docs-'));
    try {
      writeFileSync(join(dir, 'id_ed25519'), 'not a real key\n');
      writeFileSync(join(dir, 'known_hosts'), 'nas1 ssh-ed25519 AAAA\n');
      writeFileSync(join(dir, 'gcp-key.json'), '{}\n');
      const run = (args: string[]) => kubectl(cp, args);
      run(['apply', '-k', resolve(ROOT, 'config/default')]);
      run([
        '-n',
        'egress-proxies-system',
        'create',
        'secret',
        'generic',
        'egress-proxies-operator-discovery-token',
        '--from-literal=token=0123456789abcdef',
      ]);
      run([
        '-n',
        'egress-proxies-system',
        'create',
        'secret',
        'generic',
        'egress-proxies-operator-kvm-ssh',
        `--from-file=id_ed25519=${join(dir, 'id_ed25519')}`,
        `--from-file=known_hosts=${join(dir, 'known_hosts')}`,
      ]);
      run([
        '-n',
        'egress-proxies-system',
        'create',
        'secret',
        'generic',
        'egress-proxies-operator-gcp',
        `--from-file=key.json=${join(dir, 'gcp-key.json')}`,
      ]);
      run(['create', 'namespace', 'crawl-docs']);
      const sample = readFileSync(resolve(ROOT, 'config/samples/proxy_external.yaml'), 'utf8').replace(
        'namespace: crawl',
        'namespace: crawl-docs',
      );
      kubectl(cp, ['apply', '-f', '-'], sample);
      expect(run(['get', 'px', '-A'])).toMatch(/crawl-docs\s+partner-1\s+External/);
      run(['get', 'ph']); // none until an operator runs: answered, empty
      // No operator runs here, so the External sample carries no finalizer yet; nothing is left.
      run(['delete', 'px', '--all', '-A', '--wait']);
      run(['delete', '-k', resolve(ROOT, 'config/default'), '--wait']);
      run(['delete', 'namespace', 'crawl-docs', '--wait']);
      expect(run(['get', 'crd', '-o', 'name'])).not.toContain('crawl.example.com');
      expect(() => run(['get', 'namespace', 'egress-proxies-system'])).toThrow(/NotFound/);
      expect(run(['get', 'clusterrole', '-o', 'name'])).not.toContain('egress-proxies-operator');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
