/**
 * api/proxy — the Proxy resource, defined once: the TypeScript types, the runtime validator
 * (api/validate) and the CRD's openAPIV3Schema (api/crd) all come from these schemas.
 * Cross-field rules are attached as `x-kubernetes-validations` CEL; api/rules holds the same
 * rules as TypeScript for standalone mode, and the tests evaluate both against one table.
 */
import Type from 'typebox';
import { ConditionSchema, ObjectMetaSchema } from './meta.ts';

const Port = (description: string) => Type.Integer({ minimum: 1, maximum: 65535, description });
const Name = (description: string) => Type.String({ minLength: 1, maxLength: 253, description });

export const PROXY_TYPES = ['Managed', 'External'] as const;
export type ProxyType = (typeof PROXY_TYPES)[number];

export const SecretKeyRefSchema = Type.Object(
  {
    name: Name('Name of a Secret in the Proxy namespace.'),
    key: Type.String({ minLength: 1, maxLength: 253, description: 'Key inside the Secret.' }),
  },
  { additionalProperties: false },
);

export const CloudInitSchema = Type.Object(
  {
    inline: Type.Optional(Type.String({ description: 'cloud-init user-data, verbatim.' })),
    secretRef: Type.Optional(SecretKeyRefSchema),
  },
  {
    additionalProperties: false,
    description:
      'cloud-init user-data for the instance; exactly one of inline or secretRef. A referenced Secret must carry the label crawl.example.com/cloud-init: "true".',
    'x-kubernetes-validations': [
      {
        rule: 'has(self.inline) != has(self.secretRef)',
        message: 'exactly one of inline or secretRef must be set',
      },
    ],
  },
);

export const PlacementSchema = Type.Object(
  {
    zone: Type.Optional(Type.String({ maxLength: 253, description: 'Zone or host, per provider.' })),
    machineType: Type.Optional(
      Type.String({ maxLength: 253, description: 'Machine type or resource profile.' }),
    ),
    image: Type.Optional(Type.String({ maxLength: 2048, description: 'Image key or URL, per provider.' })),
  },
  { additionalProperties: false },
);

export const EndpointSchema = Type.Object(
  {
    host: Type.String({
      minLength: 1,
      maxLength: 253,
      description: 'Host name or IP of the external proxy.',
    }),
    port: Port('Port of the external proxy.'),
  },
  { additionalProperties: false },
);

export const HealthCheckSchema = Type.Object(
  {
    url: Type.Optional(
      Type.String({ pattern: '^https?://[^\\s/]+', maxLength: 2048, description: 'http(s) URL to fetch.' }),
    ),
    expectStatus: Type.Optional(Type.Integer({ minimum: 100, maximum: 599 })),
    intervalSeconds: Type.Optional(Type.Integer({ minimum: 1, maximum: 3600 })),
    timeoutSeconds: Type.Optional(Type.Integer({ minimum: 1, maximum: 3600 })),
    failureThreshold: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
    successThreshold: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
  },
  {
    additionalProperties: false,
    'x-kubernetes-validations': [
      {
        rule: '!has(self.timeoutSeconds) || self.timeoutSeconds < (has(self.intervalSeconds) ? self.intervalSeconds : 1) * (has(self.failureThreshold) ? self.failureThreshold : 3)',
        message: 'timeoutSeconds must be less than intervalSeconds × failureThreshold',
      },
    ],
  },
);

export const ProxySpecSchema = Type.Object(
  {
    type: Type.Optional(
      Type.Union([Type.Literal('Managed'), Type.Literal('External')], {
        default: 'Managed',
        description: 'Managed: provisioned by a provider. External: an existing proxy at spec.endpoint.',
      }),
    ),
    provider: Type.Optional(Name('Managed only: a provider name from the providers config.')),
    placement: Type.Optional(PlacementSchema),
    cloudInit: Type.Optional(CloudInitSchema),
    port: Type.Optional(Port('Port the proxy listens on. Default 3128.')),
    endpoint: Type.Optional(EndpointSchema),
    credentialsSecretRef: Type.Optional(
      Type.Object({ name: Name('Secret with keys username and password.') }, { additionalProperties: false }),
    ),
    maxLeases: Type.Optional(Type.Integer({ minimum: 0, description: 'Concurrent leases; 0 = unlimited.' })),
    drain: Type.Optional(Type.Boolean({ description: 'true: keep running, stop handing out.' })),
    healthCheck: Type.Optional(HealthCheckSchema),
  },
  {
    additionalProperties: false,
    'x-kubernetes-validations': [
      {
        rule: "(has(self.type) && self.type == 'External') == has(self.endpoint)",
        message: 'endpoint is required for External proxies and forbidden for Managed ones',
      },
      {
        rule: "(has(self.type) && self.type == 'External') != has(self.provider)",
        message: 'provider is required for Managed proxies and forbidden for External ones',
      },
      {
        rule: "!(has(self.type) && self.type == 'External') || (!has(self.placement) && !has(self.cloudInit))",
        message: 'placement and cloudInit are only allowed for Managed proxies',
      },
    ],
  },
);
export type ProxySpec = Type.Static<typeof ProxySpecSchema>;

export const PROXY_PHASES = ['Pending', 'Provisioning', 'Ready', 'Replacing', 'Failed', 'Deleting'] as const;
export type ProxyPhase = (typeof PROXY_PHASES)[number];

export const ProxyHealthSchema = Type.Object({
  latencyMillis: Type.Optional(Type.Integer({ minimum: 0 })),
  lastProbeTime: Type.Optional(Type.String({ format: 'date-time' })),
  consecutiveFailures: Type.Optional(Type.Integer({ minimum: 0 })),
  lastError: Type.Optional(Type.String()),
});
export type ProxyHealth = Type.Static<typeof ProxyHealthSchema>;

export const ProxyStatusSchema = Type.Object({
  phase: Type.Optional(Type.Union(PROXY_PHASES.map((p) => Type.Literal(p)))),
  providerID: Type.Optional(Type.String()),
  instanceName: Type.Optional(Type.String()),
  address: Type.Optional(Type.String()),
  port: Type.Optional(Type.Integer()),
  url: Type.Optional(Type.String()),
  retiring: Type.Optional(Type.Array(Type.String(), { 'x-kubernetes-list-type': 'set' })),
  conditions: Type.Optional(
    Type.Array(ConditionSchema, { 'x-kubernetes-list-type': 'map', 'x-kubernetes-list-map-keys': ['type'] }),
  ),
  health: Type.Optional(ProxyHealthSchema),
  egressIP: Type.Optional(Type.String()),
  observedGeneration: Type.Optional(Type.Integer()),
  message: Type.Optional(Type.String()),
});
export type ProxyStatus = Type.Static<typeof ProxyStatusSchema>;

export const ProxySchema = Type.Object({
  apiVersion: Type.String(),
  kind: Type.String(),
  metadata: ObjectMetaSchema,
  spec: ProxySpecSchema,
  status: Type.Optional(ProxyStatusSchema),
});
/** Named ProxyObject so it never shadows the global `Proxy`. */
export type ProxyObject = Type.Static<typeof ProxySchema>;

/** Spec with defaults applied: what the controller and health engine reason about. */
export function proxyType(spec: ProxySpec): ProxyType {
  return spec.type ?? 'Managed';
}
