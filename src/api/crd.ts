/**
 * api/crd — renders the CustomResourceDefinitions from the TypeBox schemas, so the cluster's
 * validation and the standalone validator have one source. The JSON Schema is converted into a
 * *structural* schema (what apiextensions.k8s.io/v1 accepts) and every map is emitted with
 * sorted keys, so the output is byte-for-byte reproducible and checked for drift in tests.
 */
import { stringify } from 'yaml';
import {
  GROUP,
  PROVIDER_HEALTH_KIND,
  PROVIDER_HEALTH_PLURAL,
  PROXY_KIND,
  PROXY_PLURAL,
  PROXY_POOL_KIND,
  PROXY_POOL_PLURAL,
  VERSION,
} from './constants.ts';
import { POOL_NAME_RULES } from './pool-rules.ts';
import { ProviderHealthSchema } from './providerhealth.ts';
import { ProxySchema } from './proxy.ts';
import { POOL_SCALE_PATHS, ProxyPoolSchema } from './proxypool.ts';
import { celValidations, type XValidation } from './rules.ts';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type JsonObject = { [k: string]: Json };

/** Keywords that pass through unchanged (values already plain JSON). */
const PASS_THROUGH = new Set([
  'type',
  'format',
  'description',
  'default',
  'enum',
  'minimum',
  'maximum',
  'exclusiveMinimum',
  'exclusiveMaximum',
  'minLength',
  'maxLength',
  'pattern',
  'minItems',
  'maxItems',
  'minProperties',
  'maxProperties',
  'nullable',
  'x-kubernetes-list-type',
  'x-kubernetes-list-map-keys',
  'x-kubernetes-map-type',
  'x-kubernetes-preserve-unknown-fields',
  'x-kubernetes-int-or-string',
]);

const VALIDATION_KEYS = ['rule', 'message', 'messageExpression', 'fieldPath', 'reason', 'optionalOldSelf'];

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function enumType(values: readonly unknown[], at: string): string {
  const kinds = new Set(
    values.map((v) => (typeof v === 'number' && Number.isInteger(v) ? 'integer' : typeof v)),
  );
  if (kinds.size !== 1) throw new Error(`${at}: enum mixes value types`);
  return [...kinds][0] as string;
}

/**
 * Converts one TypeBox/JSON Schema node into a structural schema node. Anything the converter
 * does not understand is an error, so a schema change that Kubernetes would reject fails
 * `npm run generate` and the drift test instead of a cluster apply.
 */
export function toStructural(schema: unknown, at = '#'): JsonObject {
  if (!isObject(schema)) throw new Error(`${at}: schema must be an object`);
  const out: JsonObject = {};
  for (const [key, value] of Object.entries(schema)) {
    if (key === '$id' || key === '$schema' || key.startsWith('~')) continue;
    if (PASS_THROUGH.has(key)) {
      out[key] = structuredClone(value) as Json;
    } else if (key === 'properties') {
      if (!isObject(value)) throw new Error(`${at}: properties must be an object`);
      const props: JsonObject = {};
      for (const [name, child] of Object.entries(value)) props[name] = toStructural(child, `${at}/${name}`);
      out.properties = props;
    } else if (key === 'required') {
      if (Array.isArray(value) && value.length > 0) out.required = [...value].map(String).sort();
    } else if (key === 'items') {
      out.items = toStructural(value, `${at}/items`);
    } else if (key === 'patternProperties') {
      // TypeBox encodes Record<string, T> this way; Kubernetes spells it additionalProperties.
      const entries = isObject(value) ? Object.values(value) : [];
      if (entries.length !== 1)
        throw new Error(`${at}: only a single catch-all patternProperties is supported`);
      out.additionalProperties = toStructural(entries[0], `${at}/*`);
    } else if (key === 'additionalProperties') {
      // Structural schemas forbid additionalProperties beside properties; unknown fields are
      // pruned by the API server instead (and rejected by kubectl's strict field validation).
      if (isObject(value)) out.additionalProperties = toStructural(value, `${at}/*`);
    } else if (key === 'anyOf') {
      const branches = Array.isArray(value) ? value : [];
      if (!branches.every((b) => isObject(b) && 'const' in b)) {
        throw new Error(`${at}: anyOf is only supported as a union of literals`);
      }
      out.enum = branches.map((b) => (b as Record<string, Json>).const ?? null);
    } else if (key === 'x-kubernetes-validations') {
      if (!Array.isArray(value)) throw new Error(`${at}: x-kubernetes-validations must be a list`);
      out[key] = value.map((v) => {
        const entry: JsonObject = {};
        for (const k of VALIDATION_KEYS) {
          if (isObject(v) && v[k] !== undefined) entry[k] = v[k] as Json;
        }
        return entry;
      });
    } else {
      throw new Error(`${at}: unsupported schema keyword ${key}`);
    }
  }
  if (out.type === undefined && Array.isArray(out.enum)) out.type = enumType(out.enum, at);
  if (out.type === undefined) throw new Error(`${at}: structural schemas need a type`);
  return out;
}

/**
 * The root of a resource schema: metadata is left to the API server, but for CEL rules on
 * `metadata.name` (the only metadata field a CRD schema may constrain).
 */
function resourceSchema(schema: unknown, nameRules: XValidation[] = []): JsonObject {
  const root = toStructural(schema);
  const props = root.properties as JsonObject;
  props.apiVersion = {
    type: 'string',
    description: 'APIVersion defines the versioned schema of this representation of an object.',
  };
  props.kind = { type: 'string', description: 'Kind is the type of resource this object represents.' };
  props.metadata =
    nameRules.length > 0
      ? {
          type: 'object',
          properties: { name: { type: 'string', 'x-kubernetes-validations': nameRules as unknown as Json } },
        }
      : { type: 'object' };
  // The API server fills apiVersion, kind and metadata itself.
  const required = (root.required as string[] | undefined)?.filter(
    (r) => !['apiVersion', 'kind', 'metadata'].includes(r),
  );
  if (required && required.length > 0) root.required = required;
  else delete root.required;
  return root;
}

interface PrinterColumn {
  name: string;
  type: 'string' | 'date' | 'integer' | 'boolean';
  jsonPath: string;
  priority?: number;
  description?: string;
}

interface CrdInput {
  kind: string;
  plural: string;
  shortName: string;
  scope: 'Namespaced' | 'Cluster';
  schema: JsonObject;
  columns: PrinterColumn[];
  /** The scale subresource (`kubectl scale`, HPA), where the resource has one. */
  scale?: { specReplicasPath: string; statusReplicasPath: string; labelSelectorPath: string };
}

export const CRD_CATEGORIES = ['crawl'];

function crd(input: CrdInput): JsonObject {
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: {
      name: `${input.plural}.${GROUP}`,
      // The label config/default puts on every object, here already so that the chart's copy in
      // crds/ (which Helm applies untemplated) is the same object.
      labels: { 'app.kubernetes.io/part-of': 'egress-proxies-operator' },
    },
    spec: {
      group: GROUP,
      names: {
        kind: input.kind,
        listKind: `${input.kind}List`,
        plural: input.plural,
        singular: input.kind.toLowerCase(),
        shortNames: [input.shortName],
        categories: CRD_CATEGORIES,
      },
      scope: input.scope,
      versions: [
        {
          name: VERSION,
          served: true,
          storage: true,
          schema: { openAPIV3Schema: input.schema },
          subresources: input.scale ? { status: {}, scale: { ...input.scale } } : { status: {} },
          additionalPrinterColumns: input.columns.map((c) => ({ ...c }) as JsonObject),
        },
      ],
    },
  };
}

const AGE: PrinterColumn = { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' };

/** The Proxy CRD as a plain object. */
export function proxyCrd(): JsonObject {
  return crd({
    kind: PROXY_KIND,
    plural: PROXY_PLURAL,
    shortName: 'px',
    scope: 'Namespaced',
    schema: resourceSchema(ProxySchema),
    columns: [
      { name: 'Type', type: 'string', jsonPath: '.spec.type' },
      { name: 'Provider', type: 'string', jsonPath: '.spec.provider' },
      { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
      { name: 'Address', type: 'string', jsonPath: '.status.address' },
      { name: 'Healthy', type: 'string', jsonPath: '.status.conditions[?(@.type=="Healthy")].status' },
      // Wide output only (-o wide): the default view stays as narrow as before.
      { name: 'Zone', type: 'string', jsonPath: '.status.location.zone', priority: 1 },
      AGE,
    ],
  });
}

/** The ProviderHealth CRD as a plain object. */
export function providerHealthCrd(): JsonObject {
  return crd({
    kind: PROVIDER_HEALTH_KIND,
    plural: PROVIDER_HEALTH_PLURAL,
    shortName: 'ph',
    scope: 'Cluster',
    schema: resourceSchema(ProviderHealthSchema),
    columns: [
      { name: 'Type', type: 'string', jsonPath: '.status.type' },
      { name: 'Ready', type: 'string', jsonPath: '.status.conditions[?(@.type=="Ready")].status' },
      { name: 'Targets', type: 'string', jsonPath: '.status.targetsReady' },
      { name: 'Last Check', type: 'date', jsonPath: '.status.lastCheckTime' },
      AGE,
    ],
  });
}

/** The ProxyPool CRD as a plain object. */
export function proxyPoolCrd(): JsonObject {
  return crd({
    kind: PROXY_POOL_KIND,
    plural: PROXY_POOL_PLURAL,
    shortName: 'pxp',
    scope: 'Namespaced',
    schema: resourceSchema(ProxyPoolSchema, celValidations(POOL_NAME_RULES)),
    scale: POOL_SCALE_PATHS,
    columns: [
      { name: 'Desired', type: 'integer', jsonPath: '.spec.replicas' },
      { name: 'Ready', type: 'integer', jsonPath: '.status.readyReplicas' },
      { name: 'Healthy', type: 'integer', jsonPath: '.status.healthyReplicas' },
      { name: 'Leasable', type: 'integer', jsonPath: '.status.leasableReplicas' },
      AGE,
    ],
  });
}

/** Recursively sorts object keys; list order is meaningful and kept. */
export function sortKeys(value: Json): Json {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === 'object') {
    const out: JsonObject = {};
    for (const k of Object.keys(value).sort()) out[k] = sortKeys(value[k] as Json);
    return out;
  }
  return value;
}

const HEADER = '# Generated by `npm run generate` from src/api. Do not edit; change the schemas instead.\n';

function toYaml(doc: JsonObject): string {
  return `${HEADER}---\n${stringify(sortKeys(doc), { lineWidth: 0, indentSeq: false })}`;
}

export const CRD_BASES_DIR = 'config/crd/bases';
/** The Helm chart installs the same CRDs from its crds/ directory (Helm never templates them). */
export const CHART_CRDS_DIR = 'charts/egress-proxies-operator/crds';

/** Every generated file, keyed by its path relative to the repository root. */
export function renderCrdFiles(): Record<string, string> {
  const proxies = `${CRD_BASES_DIR}/${GROUP}_${PROXY_PLURAL}.yaml`;
  const providerHealths = `${CRD_BASES_DIR}/${GROUP}_${PROVIDER_HEALTH_PLURAL}.yaml`;
  const pools = `${CRD_BASES_DIR}/${GROUP}_${PROXY_POOL_PLURAL}.yaml`;
  const kustomization = {
    apiVersion: 'kustomize.config.k8s.io/v1beta1',
    kind: 'Kustomization',
    resources: [proxies, providerHealths, pools].map((p) => p.slice('config/crd/'.length)),
  };
  const bases = {
    [proxies]: toYaml(proxyCrd()),
    [providerHealths]: toYaml(providerHealthCrd()),
    [pools]: toYaml(proxyPoolCrd()),
  };
  const chartCopies = Object.entries(bases).map(([path, content]) => [
    `${CHART_CRDS_DIR}/${path.slice(CRD_BASES_DIR.length + 1)}`,
    content,
  ]);
  return {
    ...bases,
    'config/crd/kustomization.yaml': `${HEADER}${stringify(kustomization, { lineWidth: 0, indentSeq: false })}`,
    ...Object.fromEntries(chartCopies),
  };
}
