/**
 * test/support/api/manifests — one table of Proxy manifests, valid and invalid, shared by the runtime
 * validator tests and the CEL tests so the two implementations of every rule are judged on the
 * same inputs. `errors` lists the exact field paths validateProxy must report (empty = valid).
 */

export interface ProxyCase {
  name: string;
  obj: Record<string, unknown>;
  /** The stored object, for updates (transition rules). */
  old?: Record<string, unknown>;
  errors: string[];
}

const meta = { name: 'eu-1', namespace: 'crawl' };

export function managed(spec: Record<string, unknown> = {}, metadata: Record<string, unknown> = meta) {
  return {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata,
    spec: { type: 'Managed', provider: 'gcp-main', ...spec },
  };
}

export function external(spec: Record<string, unknown> = {}) {
  return {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: meta,
    spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 }, ...spec },
  };
}

function without(obj: Record<string, unknown>, key: string): Record<string, unknown> {
  const { [key]: _drop, ...rest } = obj;
  return rest;
}

const externalSpec = external().spec;
const managedSpec = managed().spec;

export const PROXY_CASES: ProxyCase[] = [
  // Defaults, and a spec that sets every field.
  {
    name: 'minimal managed (type defaulted)',
    obj: { ...managed(), spec: { provider: 'kvm-home' } },
    errors: [],
  },
  {
    name: 'full managed example',
    obj: managed({
      placement: { zone: 'europe-west1-b', machineType: 'e2-micro', image: 'debian-13' },
      cloudInit: { secretRef: { name: 'squid-init', key: 'user-data' } },
      port: 3128,
      credentialsSecretRef: { name: 'eu-1-auth' },
      maxLeases: 0,
      drain: false,
      healthCheck: {
        url: 'https://www.gstatic.com/generate_204',
        expectStatus: 204,
        intervalSeconds: 1,
        timeoutSeconds: 2,
        failureThreshold: 3,
        successThreshold: 1,
      },
    }),
    errors: [],
  },
  { name: 'minimal external', obj: external(), errors: [] },

  // endpoint: required for External, forbidden for Managed.
  {
    name: 'external without endpoint',
    obj: { ...external(), spec: without(externalSpec, 'endpoint') },
    errors: ['spec.endpoint'],
  },
  {
    name: 'managed with endpoint',
    obj: managed({ endpoint: { host: 'a.example', port: 1 } }),
    errors: ['spec.endpoint'],
  },
  {
    name: 'defaulted type with endpoint counts as Managed',
    obj: { ...managed(), spec: { provider: 'p', endpoint: { host: 'a', port: 1 } } },
    errors: ['spec.endpoint'],
  },

  // provider: required for Managed, forbidden for External.
  {
    name: 'managed without provider',
    obj: { ...managed(), spec: without(managedSpec, 'provider') },
    errors: ['spec.provider'],
  },
  { name: 'external with provider', obj: external({ provider: 'gcp-main' }), errors: ['spec.provider'] },
  { name: 'empty provider name', obj: managed({ provider: '' }), errors: ['spec.provider'] },

  // placement / cloudInit only for Managed.
  {
    name: 'external with placement',
    obj: external({ placement: { zone: 'z' } }),
    errors: ['spec.placement'],
  },
  {
    name: 'external with cloudInit',
    obj: external({ cloudInit: { inline: '#cloud-config\n' } }),
    errors: ['spec.cloudInit'],
  },
  { name: 'managed with placement', obj: managed({ placement: { zone: 'z' } }), errors: [] },

  // credentialsRotation: generated credentials of a Managed proxy only, 1 h to 365 days.
  {
    name: 'managed with credentialsRotation',
    obj: managed({ credentialsRotation: { intervalSeconds: 86_400 } }),
    errors: [],
  },
  {
    name: 'credentialsRotation with credentialsSecretRef',
    obj: managed({
      credentialsRotation: { intervalSeconds: 86_400 },
      credentialsSecretRef: { name: 'mine' },
    }),
    errors: ['spec.credentialsRotation'],
  },
  {
    name: 'external with credentialsRotation',
    obj: external({ credentialsRotation: { intervalSeconds: 86_400 } }),
    errors: ['spec.credentialsRotation'],
  },
  {
    name: 'credentialsRotation below an hour',
    obj: managed({ credentialsRotation: { intervalSeconds: 60 } }),
    errors: ['spec.credentialsRotation.intervalSeconds'],
  },
  {
    name: 'credentialsRotation without an interval',
    obj: managed({ credentialsRotation: {} }),
    errors: ['spec.credentialsRotation.intervalSeconds'],
  },

  // cloudInit: exactly one source.
  { name: 'cloudInit inline', obj: managed({ cloudInit: { inline: '#cloud-config\n' } }), errors: [] },
  {
    name: 'cloudInit secretRef',
    obj: managed({ cloudInit: { secretRef: { name: 's', key: 'k' } } }),
    errors: [],
  },
  { name: 'cloudInit with no source', obj: managed({ cloudInit: {} }), errors: ['spec.cloudInit'] },
  {
    name: 'cloudInit with both sources',
    obj: managed({ cloudInit: { inline: 'x', secretRef: { name: 's', key: 'k' } } }),
    errors: ['spec.cloudInit'],
  },
  {
    name: 'cloudInit secretRef without key',
    obj: managed({ cloudInit: { secretRef: { name: 's' } } }),
    errors: ['spec.cloudInit.secretRef.key'],
  },

  // Ports 1–65535.
  { name: 'port 1', obj: managed({ port: 1 }), errors: [] },
  { name: 'port 65535', obj: managed({ port: 65535 }), errors: [] },
  { name: 'port 0', obj: managed({ port: 0 }), errors: ['spec.port'] },
  { name: 'port 65536', obj: managed({ port: 65536 }), errors: ['spec.port'] },
  {
    name: 'endpoint port 0',
    obj: external({ endpoint: { host: 'h', port: 0 } }),
    errors: ['spec.endpoint.port'],
  },
  {
    name: 'endpoint port 70000',
    obj: external({ endpoint: { host: 'h', port: 70000 } }),
    errors: ['spec.endpoint.port'],
  },
  {
    name: 'endpoint without host',
    obj: external({ endpoint: { port: 80 } }),
    errors: ['spec.endpoint.host'],
  },

  // Thresholds ≥ 1, interval ≥ 1 s.
  {
    name: 'failureThreshold 0',
    obj: managed({ healthCheck: { failureThreshold: 0 } }),
    errors: ['spec.healthCheck.failureThreshold'],
  },
  {
    name: 'successThreshold 0',
    obj: managed({ healthCheck: { successThreshold: 0 } }),
    errors: ['spec.healthCheck.successThreshold'],
  },
  {
    name: 'thresholds 1',
    obj: managed({ healthCheck: { failureThreshold: 1, successThreshold: 1 } }),
    errors: [],
  },
  {
    name: 'intervalSeconds 0',
    obj: managed({ healthCheck: { intervalSeconds: 0 } }),
    errors: ['spec.healthCheck.intervalSeconds'],
  },
  { name: 'intervalSeconds 1', obj: managed({ healthCheck: { intervalSeconds: 1 } }), errors: [] },
  {
    name: 'fractional intervalSeconds',
    obj: managed({ healthCheck: { intervalSeconds: 1.5 } }),
    errors: ['spec.healthCheck.intervalSeconds'],
  },

  // timeout < interval × failureThreshold (defaults 1 and 3).
  { name: 'timeout 2 with defaults', obj: managed({ healthCheck: { timeoutSeconds: 2 } }), errors: [] },
  {
    name: 'timeout 3 with defaults',
    obj: managed({ healthCheck: { timeoutSeconds: 3 } }),
    errors: ['spec.healthCheck.timeoutSeconds'],
  },
  {
    name: 'timeout 5 with interval 2 and threshold 3',
    obj: managed({ healthCheck: { timeoutSeconds: 5, intervalSeconds: 2, failureThreshold: 3 } }),
    errors: [],
  },
  {
    name: 'timeout 6 with interval 2 and threshold 3',
    obj: managed({ healthCheck: { timeoutSeconds: 6, intervalSeconds: 2, failureThreshold: 3 } }),
    errors: ['spec.healthCheck.timeoutSeconds'],
  },
  {
    name: 'timeout 9 with interval 10 and default threshold',
    obj: managed({ healthCheck: { timeoutSeconds: 9, intervalSeconds: 10 } }),
    errors: [],
  },
  {
    name: 'timeout 1 with threshold 1 and default interval',
    obj: managed({ healthCheck: { timeoutSeconds: 1, failureThreshold: 1 } }),
    errors: ['spec.healthCheck.timeoutSeconds'],
  },

  // spec.type immutable.
  { name: 'update keeping type', obj: managed({ port: 8080 }), old: managed(), errors: [] },
  {
    name: 'update Managed → External',
    obj: external(),
    old: managed(),
    errors: ['spec.type'],
  },
  {
    name: 'update External → defaulted Managed',
    obj: { ...managed(), spec: { provider: 'p' } },
    old: external(),
    errors: ['spec.type'],
  },
  {
    name: 'update from a stored object without type (defaulted Managed)',
    obj: managed(),
    old: { ...managed(), spec: { provider: 'gcp-main' } },
    errors: [],
  },

  // spec.provider immutable: the old provider is the only one that can delete the old instance.
  {
    name: 'update keeping provider',
    obj: managed({ drain: true }),
    old: managed(),
    errors: [],
  },
  {
    name: 'update switching provider',
    obj: managed({ provider: 'kvm-home' }),
    old: managed(),
    errors: ['spec.provider'],
  },
  {
    name: 'update switching provider and changing placement',
    obj: managed({ provider: 'kvm-home', placement: { zone: 'home' } }),
    old: managed({ placement: { zone: 'europe-west1-b' } }),
    errors: ['spec.provider'],
  },

  // Shapes: enums, unknown fields, types.
  { name: 'unknown type', obj: managed({ type: 'Hosted' }), errors: ['spec.type'] },
  { name: 'unknown spec field', obj: managed({ replicas: 2 }), errors: ['spec.replicas'] },
  {
    name: 'unknown nested field',
    obj: managed({ healthCheck: { intervalSecond: 5 } }),
    errors: ['spec.healthCheck.intervalSecond'],
  },
  { name: 'negative maxLeases', obj: managed({ maxLeases: -1 }), errors: ['spec.maxLeases'] },
  { name: 'drain as string', obj: managed({ drain: 'yes' }), errors: ['spec.drain'] },
  {
    name: 'health check URL not http(s)',
    obj: managed({ healthCheck: { url: 'ftp://example.com/' } }),
    errors: ['spec.healthCheck.url'],
  },
  {
    name: 'expectStatus 99',
    obj: managed({ healthCheck: { expectStatus: 99 } }),
    errors: ['spec.healthCheck.expectStatus'],
  },
  { name: 'missing spec', obj: without(managed(), 'spec'), errors: ['spec'] },

  // Which schema errors stop the rules: a wrong type, a value outside an enum, a missing field or
  // an over-long string does; a range, a pattern or a bad name does not, and the rules' errors
  // come beside the schema's.
  {
    name: 'a range error and a rule error',
    obj: external({ provider: 'gcp-main', port: 0 }),
    errors: ['spec.port', 'spec.provider'],
  },
  {
    name: 'a pattern error and a rule error',
    obj: external({ provider: 'gcp-main', healthCheck: { url: 'ftp://example.com/' } }),
    errors: ['spec.healthCheck.url', 'spec.provider'],
  },
  {
    name: 'a bad name and a rule error',
    obj: managed({ endpoint: { host: 'a.example', port: 1 } }, { name: 'EU-1', namespace: 'crawl' }),
    errors: ['metadata.name', 'spec.endpoint'],
  },
  {
    name: 'a range error feeding a rule',
    obj: managed({ healthCheck: { timeoutSeconds: 3, intervalSeconds: 0 } }),
    errors: ['spec.healthCheck.intervalSeconds', 'spec.healthCheck.timeoutSeconds'],
  },
  {
    name: 'a type error hides a rule error',
    obj: external({ provider: 'gcp-main', drain: 'yes' }),
    errors: ['spec.drain'],
  },
  {
    name: 'an enum error hides a rule error',
    obj: managed({ type: 'Hosted', endpoint: { host: 'a.example', port: 1 } }),
    errors: ['spec.type'],
  },
  {
    name: 'an over-long value hides a rule error',
    obj: managed({ placement: { zone: 'z'.repeat(254) }, endpoint: { host: 'a.example', port: 1 } }),
    errors: ['spec.placement.zone'],
  },

  // Identity.
  {
    name: 'name with capitals',
    obj: managed({}, { name: 'EU-1', namespace: 'crawl' }),
    errors: ['metadata.name'],
  },
  { name: 'dotted name', obj: managed({}, { name: 'eu-1.pool', namespace: 'crawl' }), errors: [] },
  {
    name: 'name of 254 characters',
    obj: managed({}, { name: 'a'.repeat(254), namespace: 'crawl' }),
    errors: ['metadata.name'],
  },
  {
    name: 'namespace with a dot',
    obj: managed({}, { name: 'eu-1', namespace: 'crawl.eu' }),
    errors: ['metadata.namespace'],
  },
  { name: 'missing name', obj: managed({}, { namespace: 'crawl' }), errors: ['metadata.name'] },
  { name: 'wrong kind', obj: { ...managed(), kind: 'Pod' }, errors: ['kind'] },
  { name: 'wrong apiVersion', obj: { ...managed(), apiVersion: 'v1' }, errors: ['apiVersion'] },
];
