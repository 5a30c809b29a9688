/**
 * api/meta — the Kubernetes object envelope shared by our resources and the Secrets we read.
 */
import Type from 'typebox';

export const ObjectMetaSchema = Type.Object(
  {
    name: Type.String(),
    namespace: Type.Optional(Type.String()),
    uid: Type.Optional(Type.String()),
    resourceVersion: Type.Optional(Type.String()),
    generation: Type.Optional(Type.Integer()),
    creationTimestamp: Type.Optional(Type.String()),
    deletionTimestamp: Type.Optional(Type.String()),
    labels: Type.Optional(Type.Record(Type.String(), Type.String())),
    annotations: Type.Optional(Type.Record(Type.String(), Type.String())),
    finalizers: Type.Optional(Type.Array(Type.String())),
    ownerReferences: Type.Optional(
      Type.Array(
        Type.Object({
          apiVersion: Type.String(),
          kind: Type.String(),
          name: Type.String(),
          uid: Type.String(),
          controller: Type.Optional(Type.Boolean()),
          blockOwnerDeletion: Type.Optional(Type.Boolean()),
        }),
      ),
    ),
  },
  { additionalProperties: true },
);
export type ObjectMeta = Type.Static<typeof ObjectMetaSchema>;

export const ConditionSchema = Type.Object({
  type: Type.String({ description: 'Condition type, e.g. Provisioned or Healthy.' }),
  status: Type.Union([Type.Literal('True'), Type.Literal('False'), Type.Literal('Unknown')]),
  reason: Type.String({ description: 'CamelCase reason.' }),
  message: Type.Optional(Type.String()),
  lastTransitionTime: Type.String({ format: 'date-time' }),
  observedGeneration: Type.Optional(Type.Integer()),
});
export type Condition = Type.Static<typeof ConditionSchema>;

/** Anything with Kubernetes metadata. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

/** A core/v1 Secret, as both backends return it (data base64, like the API). */
export interface Secret extends KubeObject {
  type?: string;
  data?: Record<string, string>;
}

export interface ObjectKey {
  namespace?: string;
  name: string;
}

export function keyOf(obj: KubeObject): string {
  return obj.metadata.namespace ? `${obj.metadata.namespace}/${obj.metadata.name}` : obj.metadata.name;
}

export function parseKey(key: string): ObjectKey {
  const slash = key.indexOf('/');
  return slash < 0 ? { name: key } : { namespace: key.slice(0, slash), name: key.slice(slash + 1) };
}
