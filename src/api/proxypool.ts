/**
 * api/proxypool — the ProxyPool resource, defined once like the Proxy: N Proxies from one
 * template, kept at `spec.replicas` like a ReplicaSet, rolled out under surge limits and
 * recycled by age for fresh IPs (see docs/configuration.md, "ProxyPool"). The TypeScript types,
 * the standalone validator and the CRD schema all come from these schemas; the cross-field rules
 * are in api/pool-rules.
 */
import Type from 'typebox';
import { ConditionSchema, ObjectMetaSchema } from './meta.ts';
import {
  DURATION_PATTERN,
  durationSeconds,
  POOL_ROLLING_RULES,
  POOL_ROTATION_RULES,
  POOL_SPEC_RULES,
} from './pool-rules.ts';
import { ProxySpecSchema } from './proxy.ts';
import { celValidations } from './rules.ts';

export const ROTATION_STRATEGIES = ['Replace', 'Restart'] as const;
export type RotationStrategy = (typeof ROTATION_STRATEGIES)[number];

export const DEFAULT_MAX_SURGE = 1;
export const DEFAULT_MAX_UNAVAILABLE = 0;
export const DEFAULT_ROTATION_JITTER = 0.1;
export { DURATION_PATTERN } from './pool-rules.ts';

export const PoolTemplateSchema = Type.Object(
  {
    metadata: Type.Optional(
      Type.Object(
        {
          labels: Type.Optional(Type.Record(Type.String(), Type.String())),
          annotations: Type.Optional(Type.Record(Type.String(), Type.String())),
        },
        { additionalProperties: false, description: 'Labels and annotations every Proxy of the pool gets.' },
      ),
    ),
    spec: ProxySpecSchema,
  },
  {
    additionalProperties: false,
    description: 'What each Proxy of the pool is made from: a Managed Proxy spec plus labels.',
  },
);
export type PoolTemplate = Type.Static<typeof PoolTemplateSchema>;

export const RollingUpdateSchema = Type.Object(
  {
    maxSurge: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 10_000,
        default: DEFAULT_MAX_SURGE,
        description: `Proxies created beyond spec.replicas while replacing outdated ones. Default ${DEFAULT_MAX_SURGE}.`,
      }),
    ),
    maxUnavailable: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 10_000,
        default: DEFAULT_MAX_UNAVAILABLE,
        description: `How far leasable Proxies may drop below spec.replicas while replacing outdated ones. Default ${DEFAULT_MAX_UNAVAILABLE}.`,
      }),
    ),
  },
  {
    additionalProperties: false,
    description: 'Limits of template roll-outs and age rotation.',
    'x-kubernetes-validations': celValidations(POOL_ROLLING_RULES),
  },
);

export const RotationSchema = Type.Object(
  {
    maxAge: Type.String({
      pattern: DURATION_PATTERN,
      minLength: 2,
      maxLength: 32,
      description: 'Replace a Proxy once it is older than this (e.g. 30m, 6h), for a fresh IP. At least 10s.',
    }),
    jitter: Type.Optional(
      Type.Number({
        minimum: 0,
        maximum: 0.9,
        default: DEFAULT_ROTATION_JITTER,
        description: `Each Proxy is recycled at maxAge × (1 − jitter × r), r fixed per Proxy in [0, 1), so the pool does not recycle at once. Default ${DEFAULT_ROTATION_JITTER}.`,
      }),
    ),
    strategy: Type.Optional(
      Type.Enum(ROTATION_STRATEGIES, {
        default: 'Replace',
        description:
          'Replace: a new Proxy comes up, the old one drains and goes. Restart: the same instance is drained, stopped and started for a new IP (providers that can: gcp, and aws on demand); needs rollingUpdate.maxUnavailable ≥ 1.',
      }),
    ),
  },
  {
    additionalProperties: false,
    description: 'Age rotation: recycle Proxies for fresh IPs, under the rollingUpdate limits.',
    'x-kubernetes-validations': celValidations(POOL_ROTATION_RULES),
  },
);
export type Rotation = Type.Static<typeof RotationSchema>;

export const ProxyPoolSpecSchema = Type.Object(
  {
    replicas: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 100_000,
        default: 1,
        description: 'How many Proxies the pool keeps (the scale subresource sets it). Default 1.',
      }),
    ),
    template: PoolTemplateSchema,
    rollingUpdate: Type.Optional(RollingUpdateSchema),
    rotation: Type.Optional(RotationSchema),
  },
  {
    additionalProperties: false,
    description: 'Desired state of the pool.',
    'x-kubernetes-validations': celValidations(POOL_SPEC_RULES),
  },
);
export type ProxyPoolSpec = Type.Static<typeof ProxyPoolSpecSchema>;

export const ProxyPoolStatusSchema = Type.Object(
  {
    replicas: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Proxies of the pool, not counting those draining away.' }),
    ),
    readyReplicas: Type.Optional(Type.Integer({ minimum: 0, description: 'Proxies whose instance serves.' })),
    healthyReplicas: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Serving Proxies the health engine passed.' }),
    ),
    leasableReplicas: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Healthy Proxies not draining: what crawlers can lease.' }),
    ),
    updatedReplicas: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Proxies from the current template and within maxAge.' }),
    ),
    drainingReplicas: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Proxies getting no new leases, deleted once drained.' }),
    ),
    restartingReplicas: Type.Optional(
      Type.Integer({
        minimum: 0,
        description:
          'Proxies in an in-place restart for a new IP (rotation strategy Restart), back once healthy.',
      }),
    ),
    selector: Type.Optional(
      Type.String({ description: 'Label selector of the pool Proxies (for the scale subresource and HPA).' }),
    ),
    observedGeneration: Type.Optional(Type.Integer()),
    conditions: Type.Optional(
      Type.Array(ConditionSchema, {
        'x-kubernetes-list-type': 'map',
        'x-kubernetes-list-map-keys': ['type'],
        description:
          'Available (leasable ≥ replicas − maxUnavailable) and Progressing (a roll-out or scaling runs).',
      }),
    ),
  },
  { description: 'Observed state, written by the pool controller.' },
);
export type ProxyPoolStatus = Type.Static<typeof ProxyPoolStatusSchema>;

export const ProxyPoolSchema = Type.Object(
  {
    apiVersion: Type.String(),
    kind: Type.String(),
    metadata: ObjectMetaSchema,
    spec: ProxyPoolSpecSchema,
    status: Type.Optional(ProxyPoolStatusSchema),
  },
  { description: 'A set of identical Managed Proxies kept at a count, rolled out and recycled safely.' },
);
export type ProxyPool = Type.Static<typeof ProxyPoolSchema>;

/** The scale subresource of the ProxyPool: what `kubectl scale` and an HPA read and write. */
export const POOL_SCALE_PATHS = {
  specReplicasPath: '.spec.replicas',
  statusReplicasPath: '.status.replicas',
  labelSelectorPath: '.status.selector',
};

/** spec.replicas with its default. */
export function desiredReplicas(spec: ProxyPoolSpec): number {
  return spec.replicas ?? 1;
}

/** The limits with defaults applied. */
export function rollingLimits(spec: ProxyPoolSpec): { maxSurge: number; maxUnavailable: number } {
  return {
    maxSurge: spec.rollingUpdate?.maxSurge ?? DEFAULT_MAX_SURGE,
    maxUnavailable: spec.rollingUpdate?.maxUnavailable ?? DEFAULT_MAX_UNAVAILABLE,
  };
}

/** Milliseconds of a duration matching DURATION_PATTERN; NaN for anything else. */
export function parseDurationMs(text: string): number {
  return durationSeconds(text) * 1000;
}
