/**
 * runtime/embedded/manifests — reads Proxy, ProxyPool and Secret manifests (one YAML file, or a directory
 * of multi-document YAML/JSON files) and validates every document. A file with any bad
 * document is rejected whole, with errors naming the file, the document (1-based) and the
 * field, so the store can keep that file's previous good version in effect.
 */
import { readdir, readFile, readlink, stat } from 'node:fs/promises';
import { join } from 'node:path';
import YAML from 'yaml';
import type { ProxyObject } from '../../api/proxy.ts';
import type { ProxyPool } from '../../api/proxypool.ts';
import type { FieldError, ValidationResult } from '../../api/validate.ts';
import { isDnsLabel, isDnsSubdomain, validateProxyPool } from '../../api/validate.ts';
import {
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  qualifiedName,
  type ResourceType,
  SECRET_RESOURCE,
  type StoredObject,
} from '../objects/types.ts';
import { isPlainObject } from '../patch.ts';

export type ProxyValidator = (obj: unknown, opts?: { old?: ProxyObject }) => ValidationResult<ProxyObject>;

const DEFAULT_NAMESPACE = 'default';

/** Which object a manifest document defines: identity across files and restarts. */
export interface ManifestRef {
  /** The resource's qualified name, as the engine's collections are named. */
  resource: string;
  namespace: string;
  name: string;
}

export interface ManifestDoc {
  file: string;
  /** 1-based position of the document in its file. */
  index: number;
  type: ResourceType;
  ref: ManifestRef;
  /** `manifestKey(ref)`. */
  key: string;
  /** Only what a manifest may set: name, namespace, labels, annotations, spec (or Secret data/type). */
  obj: StoredObject;
}

export interface ManifestError {
  file: string;
  /** 1-based document index; absent for whole-file errors (unreadable, not YAML). */
  document?: number;
  /** Field path inside the document, e.g. `spec.healthCheck.timeoutSeconds`. */
  path?: string;
  message: string;
}

export function formatManifestError(e: ManifestError): string {
  const where = [e.file, e.document !== undefined ? `document ${e.document}` : undefined, e.path || undefined]
    .filter(Boolean)
    .join(': ');
  return `${where}: ${e.message}`;
}

function manifestRef(type: ResourceType, namespace: string, name: string): ManifestRef {
  return { resource: qualifiedName(type), namespace, name };
}

/**
 * `<resource>|<namespace>/<name>`: the ref as a map key, and as the state file stores the
 * manifest bookkeeping (so the format must not change).
 */
export function manifestKey(ref: ManifestRef): string {
  return `${ref.resource}|${ref.namespace}/${ref.name}`;
}

/** The inverse of manifestKey, for bookkeeping read back from the state file. */
export function parseManifestKey(key: string): ManifestRef {
  const bar = key.indexOf('|');
  const slash = key.indexOf('/', bar + 1);
  return { resource: key.slice(0, bar), namespace: key.slice(bar + 1, slash), name: key.slice(slash + 1) };
}

/** `<namespace>/<name>`, for messages. */
export const refName = (ref: ManifestRef): string => `${ref.namespace}/${ref.name}`;

/** Looks up the stored object a manifest defines (for transition rules on update). */
export type StoredLookup = (ref: ManifestRef) => StoredObject | undefined;

const MANIFEST_FILE = /\.(ya?ml|json)$/i;

/**
 * The manifest files under `path` (a file, or a directory read non-recursively), sorted.
 * Symlinks are followed: a link to a file is a manifest like any other (a ConfigMap mount is
 * all links), a link to a directory is skipped like a subdirectory, and a link that cannot be
 * resolved (dangling, or a loop) is listed so that reading it reports the error for that file.
 */
export async function listManifestFiles(path: string): Promise<string[]> {
  const st = await stat(path);
  if (!st.isDirectory()) return [path];
  const entries = await readdir(path, { withFileTypes: true });
  const files: string[] = [];
  for (const e of entries) {
    if (e.name.startsWith('.') || !MANIFEST_FILE.test(e.name)) continue;
    const file = join(path, e.name);
    if (e.isFile()) files.push(file);
    else if (e.isSymbolicLink()) {
      const target = await stat(file).catch(() => undefined);
      if (!target || target.isFile()) files.push(file);
    }
  }
  return files.sort();
}

/** Why a manifest could not be read, in words a user acts on (symlinks named as such). */
async function unreadable(file: string, e: unknown): Promise<string> {
  const code = (e as NodeJS.ErrnoException).code;
  const link = await readlink(file).catch(() => undefined);
  if (link !== undefined && code === 'ELOOP') return `symlink loop (${file} -> ${link} leads back to itself)`;
  if (link !== undefined && code === 'ENOENT') return `dangling symlink (${file} -> ${link}: no such file)`;
  return `cannot read: ${(e as Error).message}`;
}

function stringMap(v: unknown, path: string, errors: FieldError[]): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isPlainObject(v)) {
    errors.push({ path, message: 'must be a map of strings' });
    return undefined;
  }
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string')
      errors.push({ path: `${path}[${JSON.stringify(k)}]`, message: 'must be a string' });
  }
  return v as Record<string, string>;
}

function baseMeta(doc: Record<string, unknown>, errors: FieldError[]): StoredObject['metadata'] {
  const m = isPlainObject(doc.metadata) ? doc.metadata : {};
  const namespace = typeof m.namespace === 'string' && m.namespace !== '' ? m.namespace : DEFAULT_NAMESPACE;
  const labels = stringMap(m.labels, 'metadata.labels', errors);
  const annotations = stringMap(m.annotations, 'metadata.annotations', errors);
  return {
    name: String(m.name ?? ''),
    namespace,
    ...(labels && Object.keys(labels).length ? { labels } : {}),
    ...(annotations && Object.keys(annotations).length ? { annotations } : {}),
  };
}

function validateSecretDoc(doc: Record<string, unknown>): { obj?: StoredObject; errors: FieldError[] } {
  const errors: FieldError[] = [];
  if (doc.apiVersion !== 'v1') errors.push({ path: 'apiVersion', message: 'must be v1 for a Secret' });
  const meta = baseMeta(doc, errors);
  if (!meta.name) errors.push({ path: 'metadata.name', message: 'is required' });
  else if (!isDnsSubdomain(meta.name))
    errors.push({ path: 'metadata.name', message: 'must be a DNS subdomain' });
  if (!isDnsLabel(meta.namespace as string))
    errors.push({ path: 'metadata.namespace', message: 'must be a DNS label' });
  const data: Record<string, string> = {};
  const raw = stringMap(doc.data, 'data', errors) ?? {};
  for (const [k, v] of Object.entries(raw)) {
    if (typeof v === 'string' && (!/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0)) {
      errors.push({
        path: `data[${JSON.stringify(k)}]`,
        message: 'must be base64 (use stringData for plain text)',
      });
    } else {
      data[k] = v;
    }
  }
  for (const [k, v] of Object.entries(stringMap(doc.stringData, 'stringData', errors) ?? {})) {
    if (typeof v === 'string') data[k] = Buffer.from(v, 'utf8').toString('base64');
  }
  if (doc.type !== undefined && typeof doc.type !== 'string')
    errors.push({ path: 'type', message: 'must be a string' });
  if (errors.length) return { errors };
  return {
    errors,
    obj: {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: meta,
      ...(doc.type ? { type: doc.type } : {}),
      data,
    },
  };
}

function validateProxyDoc(
  doc: Record<string, unknown>,
  validate: ProxyValidator,
  old: StoredLookup,
): { obj?: StoredObject; errors: FieldError[] } {
  const errors: FieldError[] = [];
  const meta = baseMeta(doc, errors);
  if (errors.length) return { errors };
  // Only user-settable fields take part: server-set metadata and status in a manifest are ignored.
  const candidate = { apiVersion: doc.apiVersion, kind: doc.kind, metadata: meta, spec: doc.spec };
  const prev = meta.name ? old(manifestRef(PROXY_RESOURCE, meta.namespace as string, meta.name)) : undefined;
  const res = validate(candidate, prev ? { old: prev as unknown as ProxyObject } : {});
  if (!res.ok) return { errors: res.errors };
  return {
    errors,
    obj: { apiVersion: res.value.apiVersion, kind: 'Proxy', metadata: meta, spec: res.value.spec },
  };
}

function validatePoolDoc(
  doc: Record<string, unknown>,
  old: StoredLookup,
): { obj?: StoredObject; errors: FieldError[] } {
  const errors: FieldError[] = [];
  const meta = baseMeta(doc, errors);
  if (errors.length) return { errors };
  const candidate = { apiVersion: doc.apiVersion, kind: doc.kind, metadata: meta, spec: doc.spec };
  const prev = meta.name
    ? old(manifestRef(PROXY_POOL_RESOURCE, meta.namespace as string, meta.name))
    : undefined;
  const res = validateProxyPool(candidate, prev ? { old: prev as unknown as ProxyPool } : {});
  if (!res.ok) return { errors: res.errors };
  return {
    errors,
    obj: { apiVersion: res.value.apiVersion, kind: 'ProxyPool', metadata: meta, spec: res.value.spec },
  };
}

/**
 * Parses and validates one file. `old` returns the stored object a document defines (for
 * transition rules such as spec.type immutability).
 */
function parseManifestText(
  file: string,
  text: string,
  validate: ProxyValidator,
  old: StoredLookup,
): { docs: ManifestDoc[]; errors: ManifestError[] } {
  const docs: ManifestDoc[] = [];
  const errors: ManifestError[] = [];
  let parsed: YAML.Document.Parsed[];
  try {
    parsed = YAML.parseAllDocuments(text) as YAML.Document.Parsed[];
  } catch (e) {
    return { docs, errors: [{ file, message: `cannot parse YAML: ${(e as Error).message}` }] };
  }
  if (!Array.isArray(parsed)) parsed = [parsed];
  parsed.forEach((d, i) => {
    const document = i + 1;
    if (d.errors.length > 0) {
      errors.push({ file, document, message: `invalid YAML: ${d.errors[0]?.message.split('\n')[0]}` });
      return;
    }
    const value: unknown = d.toJS();
    if (value === null || value === undefined) return; // empty document (e.g. a trailing ---)
    if (!isPlainObject(value)) {
      errors.push({ file, document, message: 'must be a mapping (a Kubernetes object)' });
      return;
    }
    let res: { obj?: StoredObject; errors: FieldError[] };
    let type: ResourceType;
    if (value.kind === 'Proxy') {
      type = PROXY_RESOURCE;
      res = validateProxyDoc(value, validate, old);
    } else if (value.kind === 'ProxyPool') {
      type = PROXY_POOL_RESOURCE;
      res = validatePoolDoc(value, old);
    } else if (value.kind === 'Secret') {
      type = SECRET_RESOURCE;
      res = validateSecretDoc(value);
    } else {
      errors.push({
        file,
        document,
        path: 'kind',
        message: `must be Proxy, ProxyPool or Secret, got ${JSON.stringify(value.kind)}`,
      });
      return;
    }
    if (!res.obj) {
      for (const fe of res.errors) errors.push({ file, document, path: fe.path, message: fe.message });
      return;
    }
    const meta = res.obj.metadata;
    const ref = manifestRef(type, meta.namespace as string, meta.name);
    docs.push({ file, index: document, type, ref, key: manifestKey(ref), obj: res.obj });
  });
  const seen = new Map<string, number>();
  for (const d of docs) {
    const first = seen.get(d.key);
    if (first !== undefined) {
      errors.push({
        file,
        document: d.index,
        path: 'metadata.name',
        message: `duplicates document ${first} (${refName(d.ref)})`,
      });
    } else {
      seen.set(d.key, d.index);
    }
  }
  return { docs, errors };
}

export interface FileScan {
  file: string;
  text?: string;
  docs: ManifestDoc[];
  errors: ManifestError[];
}

/** Reads one file; unreadable files are an error for that file. */
export async function readManifestFile(
  file: string,
  validate: ProxyValidator,
  old: StoredLookup,
): Promise<FileScan> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    return { file, docs: [], errors: [{ file, message: await unreadable(file, e) }] };
  }
  return { file, text, ...parseManifestText(file, text, validate, old) };
}
