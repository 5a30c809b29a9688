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

export const TargetStatusSchema = Type.Object({
  name: Type.String(),
  address: Type.Optional(Type.String()),
  ready: Type.Boolean(),
  reason: Type.String(),
  message: Type.Optional(Type.String({ maxLength: 1024 })),
  latencyMillis: Type.Optional(Type.Integer({ minimum: 0 })),
  lastTransitionTime: Type.Optional(Type.String({ format: 'date-time' })),
  details: Type.Optional(Type.Record(Type.String(), Type.String())),
});
export type TargetStatus = Type.Static<typeof TargetStatusSchema>;

export const ProviderHealthStatusSchema = Type.Object({
  type: Type.Optional(Type.String({ description: 'Provider type: kubernetes, gcp, kvm or local.' })),
  conditions: Type.Optional(
    Type.Array(ConditionSchema, { 'x-kubernetes-list-type': 'map', 'x-kubernetes-list-map-keys': ['type'] }),
  ),
  targets: Type.Optional(
    Type.Array(TargetStatusSchema, {
      'x-kubernetes-list-type': 'map',
      'x-kubernetes-list-map-keys': ['name'],
    }),
  ),
  targetsReady: Type.Optional(Type.String({ description: 'Ready targets over all targets, e.g. "1/2".' })),
  lastCheckTime: Type.Optional(Type.String({ format: 'date-time' })),
});
export type ProviderHealthStatus = Type.Static<typeof ProviderHealthStatusSchema>;

export const ProviderHealthSchema = Type.Object({
  apiVersion: Type.String(),
  kind: Type.String(),
  metadata: ObjectMetaSchema,
  status: Type.Optional(ProviderHealthStatusSchema),
});
export type ProviderHealth = Type.Static<typeof ProviderHealthSchema>;
