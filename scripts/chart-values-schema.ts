/**
 * scripts/chart-values-schema — the JSON Schema of the Helm chart's values
 * (charts/egress-proxies-operator/values.schema.json), written by `npm run generate`. The
 * `providersConfig` value is the providers config file itself, so its schema is the one the
 * manager validates that file with (src/config/schema.ts): `helm install` and `helm lint` refuse
 * what the manager would refuse at start, naming the field. test/unit/deploy/chart.test.ts fails
 * when the checked-in file drifts.
 */
import { ProvidersConfigSchema } from '../src/config/schema.ts';

export const CHART_DIR = 'charts/egress-proxies-operator';
export const CHART_VALUES_SCHEMA = `${CHART_DIR}/values.schema.json`;

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const str = { type: 'string', minLength: 1 };
const obj = (properties: Record<string, Json>, required: string[] = []): Json => ({
  type: 'object',
  additionalProperties: false,
  properties,
  ...(required.length ? { required } : {}),
});
const secretRef = (what: string): Json => ({
  ...(obj({ existingSecret: str, key: str }, ['existingSecret', 'key']) as Record<string, Json>),
  description: `${what}: the name of a Secret you create in the release namespace, and its key.`,
});
const anyObject = { type: 'object' };
const labelSelector = obj({
  matchLabels: { type: 'object', additionalProperties: { type: 'string' } },
  matchExpressions: { type: 'array', items: anyObject },
});

export function chartValuesSchema(): Json {
  return {
    $schema: 'http://json-schema.org/draft-07/schema#',
    title: 'Values of the egress-proxies-operator chart',
    ...(obj(
      {
        image: obj(
          {
            repository: str,
            tag: str,
            pullPolicy: { enum: ['Always', 'IfNotPresent', 'Never'] },
          },
          ['repository', 'tag'],
        ),
        imagePullSecrets: { type: 'array', items: obj({ name: str }, ['name']) },
        replicas: { type: 'integer', minimum: 1 },
        // Plain JSON: the TypeBox schema without its symbol keys.
        providersConfig: JSON.parse(JSON.stringify(ProvidersConfigSchema)) as Json,
        discoveryToken: secretRef('The discovery API bearer token (DISCOVERY_TOKEN)'),
        gateway: obj(
          {
            enabled: { type: 'boolean' },
            token: secretRef('The gateway clients’ password (GATEWAY_TOKEN, optional Secret)'),
            service: obj({
              type: { enum: ['ClusterIP', 'NodePort', 'LoadBalancer'] },
              loadBalancerSourceRanges: { type: 'array', items: str },
              externalTrafficPolicy: { enum: ['', 'Cluster', 'Local'] },
            }),
          },
          ['enabled'],
        ),
        kvmSshSecret: str,
        gcpSecret: str,
        extraArgs: { type: 'array', items: { type: 'string' } },
        resources: anyObject,
        nodeSelector: { type: 'object', additionalProperties: { type: 'string' } },
        tolerations: { type: 'array', items: anyObject },
        affinity: anyObject,
        serviceMonitor: obj({
          enabled: { type: 'boolean' },
          interval: str,
          labels: { type: 'object', additionalProperties: { type: 'string' } },
        }),
        podDisruptionBudget: obj({
          enabled: { type: 'boolean' },
          maxUnavailable: { anyOf: [{ type: 'integer', minimum: 0 }, str] },
        }),
        networkPolicy: obj({
          enabled: { type: 'boolean' },
          clientNamespaceSelector: labelSelector,
          clientCIDRs: { type: 'array', items: str },
          metricsNamespaceSelector: labelSelector,
        }),
      },
      ['image', 'replicas', 'providersConfig', 'discoveryToken', 'gateway'],
    ) as Record<string, Json>),
  };
}

export function renderChartValuesSchema(): string {
  return `${JSON.stringify(chartValuesSchema(), null, 2)}\n`;
}
