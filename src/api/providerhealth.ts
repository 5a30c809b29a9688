/**
 * api/providerhealth — the cluster-scoped, status-only ProviderHealth resource: one object per
 * configured provider, reporting whether each of its backend targets is reachable.
 */
import Type from 'typebox';
import { ConditionSchema, ObjectMetaSchema } from './meta.ts';

export const PROVIDER_HEALTH_READY_REASONS = [
  'AllTargetsReady',
  'TargetsNotReady',
  'ChecksNotImplemented',
  'NoTargets',
] as const;

export const TargetStatusSchema = Type.Object(
  {
    name: Type.String({
      minLength: 1,
      description: 'The target within its provider: a KVM host name, "apiserver", or the GCP project.',
    }),
    address: Type.Optional(Type.String({ description: 'Where the check connected to.' })),
    ready: Type.Boolean({ description: 'true when the last check succeeded.' }),
    reason: Type.String({ description: 'CamelCase verdict, e.g. Reachable, Unreachable, PoolNotActive.' }),
    message: Type.Optional(
      Type.String({ maxLength: 1024, description: 'Detail of the last check, usually its error.' }),
    ),
    latencyMillis: Type.Optional(Type.Integer({ minimum: 0, description: 'Duration of the last check.' })),
    lastTransitionTime: Type.String({ format: 'date-time', description: 'When ready last changed.' }),
    details: Type.Optional(
      Type.Record(Type.String(), Type.String(), {
        description: 'Provider-specific facts, e.g. libvirt version and free pool space of a KVM host.',
      }),
    ),
  },
  { description: 'The latest verdict for one thing the provider depends on.' },
);
export type TargetStatus = Type.Static<typeof TargetStatusSchema>;
/** One target's verdict as a Checker returns it; the monitor adds when `ready` last changed. */
export type TargetCheck = Omit<TargetStatus, 'lastTransitionTime'>;

export const ProviderHealthStatusSchema = Type.Object({
  type: Type.Optional(Type.String({ description: 'Provider type: kubernetes, gcp, aws, kvm or local.' })),
  conditions: Type.Optional(
    Type.Array(ConditionSchema, {
      'x-kubernetes-list-type': 'map',
      'x-kubernetes-list-map-keys': ['type'],
      description: 'Ready summarizes the targets.',
    }),
  ),
  targets: Type.Optional(
    Type.Array(TargetStatusSchema, {
      'x-kubernetes-list-type': 'map',
      'x-kubernetes-list-map-keys': ['name'],
      description: 'One verdict per checked target.',
    }),
  ),
  targetsReady: Type.Optional(Type.String({ description: 'Ready targets over all targets, e.g. "1/2".' })),
  lastCheckTime: Type.Optional(Type.String({ format: 'date-time' })),
});
export type ProviderHealthStatus = Type.Static<typeof ProviderHealthStatusSchema>;

export const ProviderHealthSchema = Type.Object(
  {
    apiVersion: Type.String(),
    kind: Type.String(),
    metadata: ObjectMetaSchema,
    status: Type.Optional(ProviderHealthStatusSchema),
  },
  {
    description:
      'The periodic health check of one configured provider, named after it. Written only by the operator; there is no spec.',
  },
);
export type ProviderHealth = Type.Static<typeof ProviderHealthSchema>;
