/**
 * kube-server/server — a stateful Kubernetes REST server for tests, over real HTTP on 127.0.0.1,
 * built on the same object engine as the standalone store. It answers as kube-apiserver does
 * where @kubernetes/client-node 2.0.1 and the operator can tell: JSON Status errors with the
 * apiserver's reasons and details (causes' fields; a Status for a DELETE that removed the
 * object), list with selectors and paging, watch streams from a resourceVersion with 410 and
 * bookmarks, status subresource, merge / JSON / apply patches, finalizers, preconditions,
 * unconditional updates of the types that allow them, the decoding and validation rules of
 * Secrets, ConfigMaps and Leases (MicroTime), bearer auth, the scale subresource (scale.ts),
 * ownerReference garbage collection (background propagation, runtime/objects/owners) and fault
 * injection. test/e2e/kube/fidelity.test.ts holds it to a real kube-apiserver, request by request.
 *
 * Deliberately not modelled (cover with the e2e suite on a real cluster): server-side apply
 * field ownership and its conflicts (apply is a merge that needs a fieldManager) and
 * managedFields, strategic merge patch semantics (a built-in type takes it as a merge patch),
 * CRD schema validation/defaulting/pruning (CEL included), validation of built-in types beyond
 * names, data keys and Lease fields, admission, RBAC, foreground deletion, deletecollection,
 * namespace existence (every namespace reads as Active), dryRun, resourceVersionMatch /
 * sendInitialEvents, the watch cache's own timing (bookmarks come every bookmarkIntervalMs,
 * default a minute, 2 s before a watch's timeoutSeconds once it got an event, and after the
 * initial ADDED events; the garbage collector acts at once), and consistent snapshots across
 * list pages (later pages show current state; a page token older than compaction gets 410).
 */
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import YAML from 'yaml';
import type { Clock } from '../../../src/runtime/clock.ts';
import { type Collection, ObjectEngine, type PatchType } from '../../../src/runtime/objects/engine.ts';
import { collectOwnedObjects, type OwnerCollector } from '../../../src/runtime/objects/owners.ts';
import {
  apiVersionOf,
  dataKeyErrors,
  type EngineEvent,
  invalidField,
  isBase64,
  isBuiltIn,
  LEASE_RESOURCE,
  omitEmpty,
  POD_RESOURCE,
  PROVIDER_HEALTH_RESOURCE,
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  type ResourceType,
  SECRET_RESOURCE,
  type StoredObject,
} from '../../../src/runtime/objects/types.ts';
import { isPlainObject } from '../../../src/runtime/patch.ts';
import { StoreError } from '../../../src/runtime/store.ts';
import { handleScale } from './scale.ts';
import { deletedStatus, HttpError, InternalError, type StatusBody, statusOf, toStatus } from './status.ts';

export const EVENT_RESOURCE: ResourceType = {
  group: '',
  version: 'v1',
  kind: 'Event',
  plural: 'events',
  namespaced: true,
  statusSubresource: false,
  generation: false,
  unconditionalUpdate: true,
};

/** Where the leader keeps its lease checkpoint (runtime/leader/checkpoint-configmaps). */
export const CONFIGMAP_RESOURCE: ResourceType = {
  group: '',
  version: 'v1',
  kind: 'ConfigMap',
  plural: 'configmaps',
  namespaced: true,
  statusSubresource: false,
  generation: false,
  unconditionalUpdate: true,
  normalize: (obj) => omitEmpty(obj, ['data', 'binaryData']),
  validate: validateConfigMap,
};

/** Like the apiserver: data holds strings and binaryData base64 (else no decode), keys are file names. */
function validateConfigMap(obj: StoredObject): StoreError | undefined {
  const undecodable = (why: string) =>
    new StoreError('BadRequest', 400, `ConfigMap in version "v1" cannot be handled as a ConfigMap: ${why}`);
  for (const [field, ok, why] of [
    [
      'data',
      (v: unknown) => typeof v === 'string',
      'json: cannot unmarshal into Go struct field ConfigMap.data of type string',
    ],
    ['binaryData', isBase64, 'illegal base64 data'],
  ] as const) {
    const m = obj[field];
    if (m === undefined || m === null) continue;
    if (!isPlainObject(m) || !Object.values(m).every(ok)) return undecodable(why);
  }
  const causes = dataKeyErrors(obj, ['data', 'binaryData']);
  return causes.length > 0 ? invalidField(obj, 'ConfigMap', 'ConfigMap', '', causes) : undefined;
}

export const DEFAULT_RESOURCES: ResourceType[] = [
  PROXY_RESOURCE,
  PROXY_POOL_RESOURCE,
  PROVIDER_HEALTH_RESOURCE,
  SECRET_RESOURCE,
  POD_RESOURCE,
  EVENT_RESOURCE,
  LEASE_RESOURCE,
  CONFIGMAP_RESOURCE,
];

export interface KubeServerOptions {
  /** Bearer token every request must carry; `null` turns auth off. Default `test-token`. */
  token?: string | null;
  clock?: Clock;
  /** Watch history retained per resource (older resourceVersions get 410). */
  historyLimit?: number;
  /** Period of BOOKMARK events on watches that ask for them (default 60 s, as the apiserver). */
  bookmarkIntervalMs?: number;
  /** Resource types served (default: Proxy, ProxyPool, ProviderHealth, Secret, Pod, Event, Lease, ConfigMap). */
  resources?: ResourceType[];
  /** Share an engine with other code (e.g. a memory store). */
  engine?: ObjectEngine;
}

export interface FaultSpec {
  method?: string;
  /** Matched against the path without the query string. */
  path?: RegExp;
  /** Only watch requests (true) or only non-watch requests (false). */
  watch?: boolean;
  /** HTTP status to answer with, or 'reset' to destroy the connection; omit for delay-only faults. */
  status?: number | 'reset';
  /** How many matching requests it applies to (default 1; Infinity for all). */
  times?: number;
  message?: string;
  /** The Status reason; by default the one the API server uses for `status`. */
  reason?: string;
  /** Sent as Retry-After with 429/503. */
  retryAfterSeconds?: number;
  /** Wait before answering (or before handling normally when `status` is omitted). */
  delayMs?: number;
  /** Runs before the request is handled (e.g. a concurrent writer bumping the object). */
  before?: () => void;
}

export interface FaultHandle {
  readonly hits: number;
  cancel(): void;
}

export interface RequestLogEntry {
  method: string;
  path: string;
  query: Record<string, string>;
  contentType?: string;
  authorization?: string;
  body?: unknown;
  status?: number;
  watch: boolean;
}

export interface KubeServer {
  readonly url: string;
  readonly port: number;
  readonly engine: ObjectEngine;
  /** Collection by plural (`proxies`, `secrets`, `leases`, …) or type, for seeding and assertions. */
  resource(typeOrPlural: ResourceType | string): Collection;
  /** A KubeConfig pointing at this server (plain HTTP, so skipTLSVerify is on). */
  kubeConfig(opts?: { token?: string; namespace?: string }): KubeConfig;
  readonly requests: RequestLogEntry[];
  injectFault(f: FaultSpec): FaultHandle;
  clearFaults(): void;
  /** Ends every open watch stream (an apiserver restart); `abrupt` destroys the sockets instead. */
  closeWatches(opts?: { abrupt?: boolean }): void;
  /** Number of open watch streams. */
  openWatches(): number;
  /** Drops watch history: resuming from an older resourceVersion gets 410 Expired. */
  compact(): void;
  /** The ownerReference garbage collector: `settled()` waits for the deletions it started. */
  readonly garbageCollector: OwnerCollector;
  stop(): Promise<void>;
}

interface Route {
  type: ResourceType;
  namespace?: string;
  name?: string;
  subresource?: string;
}

interface ActiveFault {
  spec: FaultSpec;
  remaining: number;
  hits: number;
}

interface OpenWatch {
  res: ServerResponse;
  close(abrupt: boolean): void;
}

const JSON_TYPE = 'application/json';

function sendJson(
  res: ServerResponse,
  code: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(code, { 'content-type': JSON_TYPE, 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new HttpError(400, 'BadRequest', `error decoding request body: ${(e as Error).message}`);
  }
}

function encodeContinue(rv: number, key: string): string {
  return Buffer.from(JSON.stringify({ rv, key })).toString('base64url');
}

function decodeContinue(token: string): { rv: number; key: string } {
  try {
    const v = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { rv: unknown; key: unknown };
    if (typeof v.rv === 'number' && typeof v.key === 'string') return { rv: v.rv, key: v.key };
  } catch {
    // fall through
  }
  throw new HttpError(400, 'BadRequest', 'continue key is not valid');
}

const keyOfObj = (o: StoredObject) =>
  o.metadata.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata.name;

/** Starts the server on 127.0.0.1 with a free port. */
export async function startKubeServer(opts: KubeServerOptions = {}): Promise<KubeServer> {
  const engine =
    opts.engine ??
    new ObjectEngine({
      ...(opts.clock ? { clock: opts.clock } : {}),
      ...(opts.historyLimit ? { historyLimit: opts.historyLimit } : {}),
    });
  const types = opts.resources ?? DEFAULT_RESOURCES;
  const byPath = new Map<string, ResourceType>();
  for (const t of types) {
    engine.register(t);
    byPath.set(`${apiVersionOf(t)}/${t.plural}`, t);
  }
  const token = opts.token === undefined ? 'test-token' : opts.token;
  const bookmarkMs = opts.bookmarkIntervalMs ?? 60_000;
  const requests: RequestLogEntry[] = [];
  /** Namespaces as first read: every name exists (existence is not modelled), each stays the same. */
  const namespaces = new Map<string, StoredObject>();
  const faults = new Set<ActiveFault>();
  const watches = new Set<OpenWatch>();
  const sockets = new Set<Socket>();
  const garbageCollector = collectOwnedObjects(engine, { danglingWrites: true });

  const groups = () => {
    const m = new Map<string, Set<string>>();
    for (const t of types) {
      if (!m.has(t.group)) m.set(t.group, new Set());
      m.get(t.group)?.add(t.version);
    }
    return m;
  };

  function resourceList(apiVersion: string): unknown {
    const resources = types
      .filter((t) => apiVersionOf(t) === apiVersion)
      .flatMap((t) => {
        const main = {
          name: t.plural,
          singularName: t.kind.toLowerCase(),
          namespaced: t.namespaced,
          kind: t.kind,
          verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
          ...(t.shortNames ? { shortNames: t.shortNames } : {}),
        };
        const status = {
          name: `${t.plural}/status`,
          singularName: '',
          namespaced: t.namespaced,
          kind: t.kind,
          verbs: ['get', 'patch', 'update'],
        };
        const scale = {
          name: `${t.plural}/scale`,
          singularName: '',
          namespaced: t.namespaced,
          group: 'autoscaling',
          version: 'v1',
          kind: 'Scale',
          verbs: ['get', 'patch', 'update'],
        };
        return [main, ...(t.statusSubresource ? [status] : []), ...(t.scale ? [scale] : [])];
      });
    if (resources.length === 0) return undefined;
    return { kind: 'APIResourceList', apiVersion: 'v1', groupVersion: apiVersion, resources };
  }

  function discovery(segs: string[]): unknown {
    if (segs.length === 1 && segs[0] === 'api') {
      return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [] };
    }
    if (segs.length === 1 && segs[0] === 'apis') {
      const list = [...groups().entries()]
        .filter(([g]) => g !== '')
        .map(([name, versions]) => {
          const vs = [...versions].map((version) => ({ groupVersion: `${name}/${version}`, version }));
          return { name, versions: vs, preferredVersion: vs[0] };
        });
      return { kind: 'APIGroupList', apiVersion: 'v1', groups: list };
    }
    if (segs.length === 2 && segs[0] === 'api') return resourceList(segs[1] as string);
    if (segs.length === 3 && segs[0] === 'apis') return resourceList(`${segs[1]}/${segs[2]}`);
    return undefined;
  }

  function route(segs: string[]): Route | undefined {
    let apiVersion: string;
    let rest: string[];
    if (segs[0] === 'api' && segs.length > 2) {
      apiVersion = segs[1] as string;
      rest = segs.slice(2);
    } else if (segs[0] === 'apis' && segs.length > 3) {
      apiVersion = `${segs[1]}/${segs[2]}`;
      rest = segs.slice(3);
    } else {
      return undefined;
    }
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      const type = byPath.get(`${apiVersion}/${rest[2]}`);
      if (!type?.namespaced || rest.length > 5) return undefined;
      return {
        type,
        namespace: rest[1] as string,
        ...(rest[3] ? { name: rest[3] } : {}),
        ...(rest[4] ? { subresource: rest[4] } : {}),
      };
    }
    const type = byPath.get(`${apiVersion}/${rest[0]}`);
    if (!type || rest.length > 3) return undefined;
    // Namespaced types are reachable here only as cluster-wide list/watch.
    if (type.namespaced && rest.length > 1) return undefined;
    return { type, ...(rest[1] ? { name: rest[1] } : {}), ...(rest[2] ? { subresource: rest[2] } : {}) };
  }

  function matchFault(req: IncomingMessage, path: string, isWatch: boolean): ActiveFault | undefined {
    for (const f of faults) {
      const s = f.spec;
      if (s.method && s.method.toUpperCase() !== req.method) continue;
      if (s.path && !s.path.test(path)) continue;
      if (s.watch !== undefined && s.watch !== isWatch) continue;
      f.remaining -= 1;
      f.hits += 1;
      if (f.remaining <= 0) faults.delete(f);
      return f;
    }
    return undefined;
  }

  function list(r: Route, q: URLSearchParams): unknown {
    const c = engine.collection(r.type);
    const at = q.get('resourceVersion');
    if (at && !/^\d+$/.test(at)) {
      throw new StoreError(
        'BadRequest',
        400,
        `invalid resource version: resourceVersion: Invalid value: ${JSON.stringify(at)}: strconv.ParseUint: parsing ${JSON.stringify(at)}: invalid syntax`,
      );
    }
    const query = {
      ...(r.namespace ? { namespace: r.namespace } : {}),
      ...(q.get('labelSelector') ? { labelSelector: q.get('labelSelector') as string } : {}),
      ...(q.get('fieldSelector') ? { fieldSelector: q.get('fieldSelector') as string } : {}),
    };
    let { items, resourceVersion } = c.list(query);
    const cont = q.get('continue');
    if (cont) {
      const tok = decodeContinue(cont);
      if (tok.rv < c.compactedResourceVersion) {
        throw new HttpError(
          410,
          'Expired',
          'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
        );
      }
      items = items.filter((o) => keyOfObj(o) > tok.key);
      resourceVersion = String(tok.rv);
    }
    const metadata: Record<string, unknown> = { resourceVersion };
    const limit = Number(q.get('limit') ?? 0);
    if (limit > 0 && items.length > limit) {
      // With a selector the server cannot know how many of the rest match, so it does not say.
      if (!query.labelSelector && !query.fieldSelector) metadata.remainingItemCount = items.length - limit;
      items = items.slice(0, limit);
      metadata.continue = encodeContinue(
        Number(resourceVersion),
        keyOfObj(items[items.length - 1] as StoredObject),
      );
    }
    // Items of a built-in type's list carry no kind (the list says it); custom resources' do.
    if (isBuiltIn(r.type)) items = items.map(({ apiVersion: _a, kind: _k, ...rest }) => rest as StoredObject);
    return { kind: `${r.type.kind}List`, apiVersion: apiVersionOf(r.type), metadata, items };
  }

  function watch(r: Route, q: URLSearchParams, res: ServerResponse): void {
    const c = engine.collection(r.type);
    const query = {
      ...(r.namespace ? { namespace: r.namespace } : {}),
      ...(q.get('labelSelector') ? { labelSelector: q.get('labelSelector') as string } : {}),
      ...(q.get('fieldSelector') ? { fieldSelector: q.get('fieldSelector') as string } : {}),
    };
    c.matcher(query); // reject bad selectors with a 400 before the stream starts
    const rv = q.get('resourceVersion') ?? undefined;
    if (rv !== undefined && rv !== '' && !/^\d+$/.test(rv)) {
      // The apiserver fails this deep in the watch cache: an internal error, not a bad request.
      throw new InternalError(
        `resourceVersion: Invalid value: ${JSON.stringify(rv)}: strconv.ParseUint: parsing ${JSON.stringify(rv)}: invalid syntax`,
      );
    }
    res.writeHead(200, { 'content-type': JSON_TYPE, 'cache-control': 'no-cache, private' });
    res.flushHeaders();
    const write = (o: unknown) => {
      if (!res.writableEnded && !res.destroyed) res.write(`${JSON.stringify(o)}\n`);
    };
    const bookmarks = q.get('allowWatchBookmarks') === 'true';
    const bookmark = (annotations?: Record<string, string>) =>
      write({
        type: 'BOOKMARK',
        object: {
          kind: r.type.kind,
          apiVersion: apiVersionOf(r.type),
          metadata: {
            ...(annotations ? { annotations } : {}),
            resourceVersion: String(engine.resourceVersion),
          },
        },
      });
    /** Whether the watcher got an event: only then does the apiserver bookmark before the timeout. */
    let delivered = false;
    const timers: NodeJS.Timeout[] = [];
    let stop = () => {};
    const entry: OpenWatch = {
      res,
      close(abrupt) {
        if (abrupt) res.socket?.destroy();
        else res.end();
      },
    };
    const cleanup = () => {
      stop();
      for (const t of timers) clearTimeout(t);
      watches.delete(entry);
    };
    res.on('close', cleanup);
    try {
      const w = c.watch(rv === undefined ? query : { ...query, resourceVersion: rv }, (ev: EngineEvent) => {
        delivered = true;
        write({ type: ev.type, object: ev.object });
      });
      stop = () => w.stop();
      // Started from the current state (no version, or 0): the apiserver marks where the
      // synthetic ADDED events end.
      if (bookmarks && (rv === undefined || rv === '' || rv === '0'))
        bookmark({ 'k8s.io/initial-events-end': 'true' });
    } catch (e) {
      if (e instanceof StoreError && e.reason === 'Gone') {
        write({ type: 'ERROR', object: statusOf(410, 'Expired', e.message) });
        res.end();
        return;
      }
      write({ type: 'ERROR', object: toStatus(e) });
      res.end();
      return;
    }
    watches.add(entry);
    if (bookmarks) {
      // The apiserver's heartbeat (once a minute); tests shorten it with bookmarkIntervalMs.
      const t = setInterval(() => bookmark(), bookmarkMs);
      t.unref();
      timers.push(t);
    }
    const timeout = Number(q.get('timeoutSeconds') ?? 0);
    if (timeout > 0) {
      const t = setTimeout(() => res.end(), timeout * 1000);
      t.unref();
      timers.push(t);
      // Like the apiserver: a bookmark 2 s before the watch times out, so the client resumes
      // from a recent version.
      if (bookmarks && timeout > 2) {
        const b = setTimeout(() => delivered && bookmark(), (timeout - 2) * 1000);
        b.unref();
        timers.push(b);
      }
    }
  }

  function patchType(contentType: string | undefined, r: Route): PatchType | 'apply' {
    const ct = (contentType ?? '').split(';')[0]?.trim().toLowerCase();
    switch (ct) {
      case 'application/merge-patch+json':
        return 'merge';
      case 'application/json-patch+json':
        return 'json';
      case 'application/apply-patch+yaml':
        return 'apply';
      case 'application/strategic-merge-patch+json':
        // Built-in types accept it (approximated as a merge patch); custom resources never do.
        if (isBuiltIn(r.type)) return 'merge';
        throw new HttpError(
          415,
          'UnsupportedMediaType',
          `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml`,
        );
      default:
        throw new HttpError(
          415,
          'UnsupportedMediaType',
          `the body of the request was in an unknown format: ${ct}`,
        );
    }
  }

  async function handleResource(
    req: IncomingMessage,
    res: ServerResponse,
    r: Route,
    q: URLSearchParams,
    bodyText: string,
  ): Promise<void> {
    const c = engine.collection(r.type);
    const method = req.method ?? 'GET';
    const target = {
      ...(r.namespace ? { namespace: r.namespace } : {}),
      ...(r.name ? { name: r.name } : {}),
      ...(r.subresource === 'status' ? { subresource: 'status' as const } : {}),
    };
    if (r.subresource === 'scale' && r.type.scale && r.name) {
      const name = r.name;
      return sendJson(
        res,
        200,
        handleScale(
          c,
          method,
          { ...(r.namespace ? { namespace: r.namespace } : {}), name },
          () => parseJson(bodyText),
          () => patchType(req.headers['content-type'], r),
        ),
      );
    }
    if (r.subresource && (r.subresource !== 'status' || !r.type.statusSubresource)) {
      // The apiserver answers a subresource it does not serve as if the object were missing.
      throw c.notFound(r.name ?? '');
    }
    if (!r.name) {
      if (method === 'GET') {
        if (q.get('watch') === 'true' || q.get('watch') === '1') return watch(r, q, res);
        return sendJson(res, 200, list(r, q));
      }
      if (method === 'POST') {
        const body = parseJson(bodyText);
        if (!isPlainObject(body)) throw new HttpError(400, 'BadRequest', 'request body must be an object');
        const rv = isPlainObject(body.metadata) ? body.metadata.resourceVersion : undefined;
        if (rv !== undefined && rv !== '')
          throw new InternalError('resourceVersion should not be set on objects to be created');
        return sendJson(res, 201, c.create(body as StoredObject, target));
      }
      throw new HttpError(
        405,
        'MethodNotAllowed',
        `the server does not allow this method on the requested resource`,
      );
    }
    switch (method) {
      case 'GET':
        return sendJson(res, 200, c.read(r.namespace, r.name));
      case 'PUT': {
        const body = parseJson(bodyText);
        if (!isPlainObject(body)) throw new HttpError(400, 'BadRequest', 'request body must be an object');
        return sendJson(res, 200, c.update(body as StoredObject, target));
      }
      case 'PATCH': {
        const kind = patchType(req.headers['content-type'], r);
        if (kind === 'apply') {
          if (!q.get('fieldManager')) {
            throw new StoreError(
              'Invalid',
              422,
              'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            );
          }
          let body: unknown;
          try {
            body = YAML.parse(bodyText);
          } catch (e) {
            throw new HttpError(400, 'BadRequest', `error decoding YAML: ${(e as Error).message}`);
          }
          if (!isPlainObject(body))
            throw new HttpError(400, 'BadRequest', 'apply patch body must be an object');
          if (!c.get(r.namespace, r.name)) {
            const created = c.create({ ...(body as StoredObject) }, target);
            if (r.subresource === 'status' && isPlainObject(body) && body.status !== undefined) {
              return sendJson(
                res,
                201,
                c.patch('merge', { status: body.status }, { ...target, name: r.name }),
              );
            }
            return sendJson(res, 201, created);
          }
          return sendJson(res, 200, c.patch('merge', body, { ...target, name: r.name }));
        }
        const body = parseJson(bodyText);
        return sendJson(res, 200, c.patch(kind, body, { ...target, name: r.name }));
      }
      case 'DELETE': {
        let pre: { uid?: string; resourceVersion?: string } = {};
        if (bodyText.trim()) {
          const body = parseJson(bodyText);
          const p = isPlainObject(body) && isPlainObject(body.preconditions) ? body.preconditions : {};
          pre = {
            ...(typeof p.uid === 'string' ? { uid: p.uid } : {}),
            ...(typeof p.resourceVersion === 'string' ? { resourceVersion: p.resourceVersion } : {}),
          };
        }
        const out = c.delete(r.namespace, r.name, pre);
        // A finalizer keeps the object: it comes back marked. Gone at once: a Status says so.
        if (!out.deleted) return sendJson(res, 200, out.object);
        return sendJson(
          res,
          200,
          deletedStatus({
            name: r.name,
            ...(r.type.group ? { group: r.type.group } : {}),
            kind: r.type.plural,
            ...(out.object.metadata.uid ? { uid: out.object.metadata.uid } : {}),
          }),
        );
      }
      default:
        throw new HttpError(
          405,
          'MethodNotAllowed',
          `the server does not allow this method on the requested resource`,
        );
    }
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    const q = url.searchParams;
    const isWatch = q.get('watch') === 'true' || q.get('watch') === '1';
    const bodyText = await readBody(req);
    const entry: RequestLogEntry = {
      method: req.method ?? 'GET',
      path: url.pathname,
      query: Object.fromEntries(q.entries()),
      watch: isWatch,
      ...(req.headers['content-type'] ? { contentType: req.headers['content-type'] } : {}),
      ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}),
    };
    if (bodyText) {
      try {
        entry.body = JSON.parse(bodyText);
      } catch {
        entry.body = bodyText;
      }
    }
    requests.push(entry);
    res.on('finish', () => {
      entry.status = res.statusCode;
    });
    const segs = url.pathname.split('/').filter(Boolean);
    let details: StatusBody['details'];
    try {
      if (token !== null && req.headers.authorization !== `Bearer ${token}`) {
        throw new HttpError(401, 'Unauthorized', 'Unauthorized');
      }
      const fault = matchFault(req, url.pathname, isWatch);
      if (fault) {
        fault.spec.before?.();
        if (fault.spec.delayMs) await new Promise((r) => setTimeout(r, fault.spec.delayMs));
        if (fault.spec.status === 'reset') {
          req.socket.destroy();
          return;
        }
        if (typeof fault.spec.status === 'number') {
          const code = fault.spec.status;
          const reason =
            fault.spec.reason ??
            (code === 429
              ? 'TooManyRequests'
              : code === 503
                ? 'ServiceUnavailable'
                : code >= 500
                  ? 'InternalError'
                  : 'BadRequest');
          const headers: Record<string, string> = fault.spec.retryAfterSeconds
            ? { 'retry-after': String(fault.spec.retryAfterSeconds) }
            : {};
          return sendJson(
            res,
            code,
            statusOf(code, reason, fault.spec.message ?? `injected fault ${code}`),
            headers,
          );
        }
      }
      if (req.method === 'GET') {
        const doc = discovery(segs);
        if (doc) return sendJson(res, 200, doc);
      }
      const r = route(segs);
      if (!r) {
        if (req.method === 'GET' && segs[0] === 'api' && segs[2] === 'namespaces' && segs.length === 4) {
          // A UID per namespace per server, as a real cluster has (kube-system's is the
          // operator's installation id): two servers are two clusters.
          const name = segs[3] as string;
          let ns = namespaces.get(name);
          if (!ns) {
            ns = {
              apiVersion: 'v1',
              kind: 'Namespace',
              metadata: {
                name,
                uid: randomUUID(),
                resourceVersion: String(engine.resourceVersion),
                creationTimestamp: engine.now(),
                labels: { 'kubernetes.io/metadata.name': name },
              },
              spec: { finalizers: ['kubernetes'] },
              status: { phase: 'Active' },
            };
            namespaces.set(name, ns);
          }
          return sendJson(res, 200, ns);
        }
        if (segs[0] === 'api' && segs[2] === 'namespaces' && segs.length >= 5) {
          // Read as a subresource of the namespace, which the apiserver does not have.
          throw new HttpError(404, 'NotFound', 'the server could not find the requested resource', {});
        }
        res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
        res.end('404 page not found\n');
        return;
      }
      details = {
        ...(r.name ? { name: r.name } : {}),
        ...(r.type.group ? { group: r.type.group } : {}),
        kind: r.type.plural,
      };
      await handleResource(req, res, r, q, bodyText);
    } catch (e) {
      if (res.headersSent) {
        res.end();
        return;
      }
      const st = toStatus(e, details);
      sendJson(res, st.code ?? 500, st);
    }
  }

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((e) => {
      if (!res.headersSent) sendJson(res, 500, toStatus(e));
      else res.end();
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  const url = `http://127.0.0.1:${port}`;

  return {
    url,
    port,
    engine,
    requests,
    resource(t) {
      if (typeof t !== 'string') return engine.collection(t);
      const type = types.find((x) => x.plural === t);
      if (!type) throw new Error(`resource ${t} is not served`);
      return engine.collection(type);
    },
    kubeConfig(o = {}) {
      const kc = new KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'fake', server: url, skipTLSVerify: true }],
        users: [{ name: 'fake-user', token: o.token ?? token ?? 'none' }],
        contexts: [{ name: 'fake', cluster: 'fake', user: 'fake-user', namespace: o.namespace ?? 'default' }],
        currentContext: 'fake',
      });
      return kc;
    },
    injectFault(spec) {
      const f: ActiveFault = { spec, remaining: spec.times ?? 1, hits: 0 };
      faults.add(f);
      return {
        get hits() {
          return f.hits;
        },
        cancel: () => faults.delete(f),
      };
    },
    clearFaults: () => faults.clear(),
    closeWatches(o = {}) {
      for (const w of [...watches]) w.close(o.abrupt ?? false);
    },
    openWatches: () => watches.size,
    compact: () => engine.compact(),
    garbageCollector,
    async stop() {
      garbageCollector.stop();
      for (const w of [...watches]) w.close(true);
      const closed = once(server, 'close');
      server.close();
      server.closeAllConnections();
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
