/**
 * test/support/api/pool-manifests — one table of ProxyPool manifests, valid and invalid, shared by the
 * validator and CEL tests (test/unit/api/proxypool) and the real-API-server parity tests, so every
 * implementation of a pool rule is judged on the same inputs. `errors` lists the exact field
 * paths admission must report (empty = valid).
 */

type Node = Record<string, unknown>;

export interface PoolCase {
  name: string;
  obj: { apiVersion: string; kind: string; metadata: Node; spec: Node };
  /** The stored pool, for updates (the template's transition rules). */
  old?: { apiVersion: string; kind: string; metadata: Node; spec: Node };
  errors: string[];
}

export function basePool() {
  return {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'ProxyPool',
    metadata: { name: 'eu', namespace: 'crawl' } as Node,
    spec: {
      replicas: 3,
      template: { metadata: { labels: { tier: 'a' } }, spec: { provider: 'local' } },
    } as Node,
  };
}

/** The base pool with `edit` applied to its spec and metadata. */
function pool(edit: (spec: Node, meta: Node) => void): PoolCase['obj'] {
  const obj = basePool();
  edit(obj.spec, obj.metadata);
  return obj;
}

/** Pools the cross-field rules judge (each schema-valid, or failing only where the table says). */
export const POOL_CASES: PoolCase[] = [
  { name: 'a minimal pool', obj: pool(() => {}), errors: [] },
  {
    name: 'a name too long for the pool label',
    obj: pool((_s, m) => {
      m.name = 'p'.repeat(64);
    }),
    errors: ['metadata.name'],
  },
  {
    name: 'rolling limits and rotation',
    obj: pool((s) => {
      s.rollingUpdate = { maxSurge: 2, maxUnavailable: 1 };
      s.rotation = { maxAge: '1h30m', jitter: 0.2, strategy: 'Replace' };
    }),
    errors: [],
  },
  {
    name: 'an External template',
    obj: pool((s) => {
      s.template = { spec: { type: 'External', endpoint: { host: 'p.example', port: 3128 } } };
    }),
    errors: ['spec.template.spec.type'],
  },
  {
    name: 'a template without provider',
    obj: pool((s) => {
      s.template = { spec: {} };
    }),
    errors: ['spec.template.spec.provider'],
  },
  {
    name: 'maxSurge and maxUnavailable both 0',
    obj: pool((s) => {
      s.rollingUpdate = { maxSurge: 0, maxUnavailable: 0 };
    }),
    errors: ['spec.rollingUpdate.maxSurge'],
  },
  {
    name: 'rotation strategy Restart without maxUnavailable',
    obj: pool((s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
    }),
    errors: ['spec.rollingUpdate.maxUnavailable'],
  },
  {
    name: 'rotation strategy Restart with maxUnavailable 0',
    obj: pool((s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
      s.rollingUpdate = { maxSurge: 1, maxUnavailable: 0 };
    }),
    errors: ['spec.rollingUpdate.maxUnavailable'],
  },
  {
    name: 'rotation strategy Restart with maxUnavailable 1',
    obj: pool((s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
      s.rollingUpdate = { maxUnavailable: 1 };
    }),
    errors: [],
  },
  {
    name: 'maxAge under 10s',
    obj: pool((s) => {
      s.rotation = { maxAge: '5s' };
    }),
    errors: ['spec.rotation.maxAge'],
  },
  // The template carries the Proxy's rules, transition rules included.
  {
    name: 'an update of the replicas',
    obj: pool((s) => {
      s.replicas = 5;
    }),
    old: pool(() => {}),
    errors: [],
  },
  {
    name: "an update switching the template's provider",
    obj: pool((s) => {
      s.template = { spec: { provider: 'gcp-main' } };
    }),
    old: pool(() => {}),
    errors: ['spec.template.spec.provider'],
  },
];

/** Pools the schema refuses (shapes, ranges, patterns, unknown fields). */
export const POOL_SCHEMA_CASES: PoolCase[] = [
  {
    name: 'negative replicas',
    obj: pool((s) => {
      s.replicas = -1;
    }),
    errors: ['spec.replicas'],
  },
  {
    name: 'a maxAge that is no duration',
    obj: pool((s) => {
      s.rotation = { maxAge: '1 day' };
    }),
    errors: ['spec.rotation.maxAge'],
  },
  {
    name: 'a maxAge longer than a duration holds',
    obj: pool((s) => {
      s.rotation = { maxAge: '9999999h' };
    }),
    errors: ['spec.rotation.maxAge'],
  },
  {
    name: 'an empty maxAge',
    obj: pool((s) => {
      s.rotation = { maxAge: '' };
    }),
    errors: ['spec.rotation.maxAge'],
  },
  {
    name: 'an unknown strategy',
    obj: pool((s) => {
      s.rotation = { maxAge: '1h', strategy: 'Reboot' };
    }),
    errors: ['spec.rotation.strategy'],
  },
  {
    name: 'jitter of 1',
    obj: pool((s) => {
      s.rotation = { maxAge: '1h', jitter: 1 };
    }),
    errors: ['spec.rotation.jitter'],
  },
  {
    name: 'an unknown field',
    obj: pool((s) => {
      s.replica = 3;
    }),
    errors: ['spec.replica'],
  },
];
