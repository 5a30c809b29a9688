/**
 * test/support/fake-gce — a small stateful Compute Engine REST server on 127.0.0.1 for the gcp
 * provider's tests. It serves exactly the paths @google-cloud/compute's REST transport calls
 * (instances insert/get/delete/stop/start, aggregated instances list, firewalls get/insert; the
 * power operations in test/support/fake-gce-power), answers like
 * GCE (Operation objects for writes, `{error:{code,message,errors:[{reason}]}}` for failures,
 * NO_RESULTS_ON_PAGE warnings for empty scopes), and offers fault injection and a request log.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { error, fingerprint, type Json, json, newInstance, parseFilter } from './fake-gce-json.ts';
import { boot, loopbackNatIPs, powerTransition } from './fake-gce-power.ts';

export type { Json } from './fake-gce-json.ts';

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: Record<string, string | string[] | undefined>;
  /** Raw body text (may contain secrets: tests only inspect it, never print it). */
  body: string;
}

export interface Fault {
  /** Matched against `METHOD path`, e.g. /^GET .*\/instances\// */
  match: RegExp;
  status: number;
  /** errors[0].reason, e.g. QUOTA_EXCEEDED, rateLimitExceeded. */
  reason?: string;
  message?: string;
  /** How many requests it answers (default: forever). */
  times?: number;
  /** Delay before answering (ms). */
  delayMs?: number;
  /** Destroy the socket instead of answering (a network failure). */
  drop?: boolean;
  /** Answer with this raw body instead of a GCE error (e.g. HTML from a proxy). */
  rawBody?: string;
}

/**
 * An operation that fails after it was accepted, the way GCE reports capacity and quota
 * problems: the insert/delete call answers a RUNNING operation; `afterMs` later the operation
 * is DONE with `error.errors[{code, message}]`.
 */
export interface OperationFault {
  /** operationType it applies to. */
  type: 'insert' | 'delete' | 'stop' | 'start';
  /** e.g. ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED, PERMISSIONS_ERROR. */
  code: string;
  message?: string;
  /** `httpErrorStatusCode` of the failed operation, when GCE sets one. */
  httpStatus?: number;
  /** Time from the call to the operation's end (default: the fake's operationDelayMs). */
  afterMs?: number;
  /**
   * insert only: the instance never appears ('never', default), or appears PROVISIONING and
   * disappears when the operation fails ('vanishes').
   */
  instance?: 'never' | 'vanishes';
  /** How many operations it fails (default 1). */
  times?: number;
}

export interface FakeGce {
  host: '127.0.0.1';
  port: number;
  requests: RecordedRequest[];
  /** Stored instances by `project/zone/name`, GCE JSON shape. */
  instances: Map<string, Json>;
  firewalls: Map<string, Json>;
  /** Zones reported as (empty) scopes in aggregated lists. */
  zones: string[];
  /**
   * Zones whose backend does not answer: an aggregated list fails with 503 unless it asks for
   * `returnPartialSuccess`, which lists the others and names these in `unreachables`.
   */
  unreachableZones: string[];
  /** Page size used when the request has no maxResults (GCE: 500). */
  defaultPageSize: number;
  /** Access tokens handed out at POST /token (STS exchange). */
  tokensIssued: number;
  /** Time from a write to its operation's end (default 0: DONE on the first look). */
  operationDelayMs: number;
  /** Longest an operations.wait call blocks before answering a still RUNNING operation. */
  waitMaxMs: number;
  /** Stored operations by `project/zone/name`, GCE JSON shape. */
  operations: Map<string, Json>;
  /**
   * Inserted instances boot by themselves: RUNNING with a natIP from `nextNatIP` when their insert
   * operation ends (default false: they stay PROVISIONING until `setStatus`).
   */
  boot: boolean;
  /** The external IP a booted or started instance gets (default: loopback, 127.1.0.x). */
  nextNatIP: () => string;
  inject(fault: Fault): void;
  /** The next matching operation(s) end in this error. */
  failOperation(fault: OperationFault): void;
  clearFaults(): void;
  /** Adds or replaces an instance (defaults: RUNNING, created now). */
  put(project: string, zone: string, name: string, fields?: Json): Json;
  /** Sets status and (optionally) the external IP of a stored instance. */
  setStatus(project: string, zone: string, name: string, status: string, natIP?: string): void;
  close(): Promise<void>;
}

const BASE = '/compute/v1/projects/';
const SELF = 'https://www.googleapis.com/compute/v1/projects/';

export async function startFakeGce(opts: { zones?: string[] } = {}): Promise<FakeGce> {
  const requests: RecordedRequest[] = [];
  const instances = new Map<string, Json>();
  const firewalls = new Map<string, Json>();
  let faults: Array<Fault & { used: number }> = [];
  let opFaults: Array<OperationFault & { used: number }> = [];
  const operations = new Map<string, Json>();
  /** When each operation ends, and what happens to the world then. */
  const endings = new Map<string, { at: number; finish: () => void; timer: NodeJS.Timeout }>();
  let nextId = 1000;

  const fake: FakeGce = {
    host: '127.0.0.1',
    port: 0,
    requests,
    instances,
    firewalls,
    zones: opts.zones ?? ['us-central1-a', 'us-central1-b', 'europe-west1-b'],
    unreachableZones: [],
    defaultPageSize: 500,
    tokensIssued: 0,
    operationDelayMs: 0,
    waitMaxMs: 30_000,
    operations,
    boot: false,
    nextNatIP: loopbackNatIPs(),
    inject: (f) => {
      faults.push({ ...f, used: 0 });
    },
    failOperation: (f) => {
      opFaults.push({ ...f, used: 0 });
    },
    clearFaults: () => {
      faults = [];
      opFaults = [];
    },
    put: (project, zone, name, fields = {}) => {
      const inst = newInstance(project, zone, name, String(nextId++), {});
      Object.assign(inst, { status: 'RUNNING' }, fields);
      inst.labelFingerprint = fingerprint(inst.labels);
      instances.set(`${project}/${zone}/${name}`, inst);
      return inst;
    },
    setStatus: (project, zone, name, status, natIP) => {
      const inst = instances.get(`${project}/${zone}/${name}`);
      if (!inst) throw new Error(`fake-gce: no instance ${project}/${zone}/${name}`);
      inst.status = status;
      if (natIP !== undefined) {
        const nic = (inst.networkInterfaces as Json[] | undefined)?.[0];
        const ac = (nic?.accessConfigs as Json[] | undefined)?.[0];
        if (ac) ac.natIP = natIP;
      }
    },
    close: () => {
      for (const e of endings.values()) clearTimeout(e.timer);
      return new Promise((r) => server.close(() => r()));
    },
  };

  /** The fault the next operation of `type` takes, if any (counted as used). */
  const takeOpFault = (type: OperationFault['type']): OperationFault | undefined => {
    const f = opFaults.find((x) => x.type === type && (x.times ?? 1) > x.used);
    if (f) f.used++;
    return f;
  };

  /**
   * A RUNNING operation that ends `delayMs` from now: `finish` changes the world (the
   * instance appears, goes, or stays), `fault` makes it end in an error.
   */
  const startOperation = (
    project: string,
    zone: string | undefined,
    type: string,
    target: string,
    delayMs: number,
    finish: () => void,
    fault?: OperationFault,
  ): Json => {
    const op = operation(project, zone, type, target);
    const key = `${project}/${zone ?? 'global'}/${String(op.name)}`;
    operations.set(key, op);
    const end = () => {
      const e = endings.get(key);
      if (!e) return;
      clearTimeout(e.timer);
      endings.delete(key);
      finish();
      Object.assign(op, { status: 'DONE', progress: 100, endTime: new Date().toISOString() });
      if (fault) {
        const message = fault.message ?? `injected ${fault.code}`;
        op.error = { errors: [{ code: fault.code, message }] };
        if (fault.httpStatus !== undefined) {
          op.httpErrorStatusCode = fault.httpStatus;
          op.httpErrorMessage = fault.httpStatus === 403 ? 'FORBIDDEN' : 'SERVICE UNAVAILABLE';
        }
      }
    };
    const timer = setTimeout(end, delayMs);
    timer.unref();
    endings.set(key, { at: Date.now() + delayMs, finish, timer });
    // GCE answers every accepted write with the operation as it was then: RUNNING.
    const accepted = { ...op };
    if (delayMs <= 0) end();
    return accepted;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse, body: string): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    const path = url.pathname;
    const method = req.method ?? 'GET';
    requests.push({
      method,
      path,
      query: Object.fromEntries(url.searchParams),
      headers: { ...req.headers },
      body,
    });
    const fault = faults.find((f) => f.match.test(`${method} ${path}`) && (f.times ?? Infinity) > f.used);
    if (fault) {
      fault.used++;
      if (fault.delayMs) await new Promise((r) => setTimeout(r, fault.delayMs));
      if (fault.drop) {
        req.socket.destroy();
        return;
      }
      if (fault.rawBody !== undefined) {
        res.writeHead(fault.status, { 'content-type': 'text/html' }).end(fault.rawBody);
        return;
      }
      return error(
        res,
        fault.status,
        fault.reason ?? 'backendError',
        fault.message ?? `injected ${fault.status}`,
      );
    }
    if (path === '/token' && method === 'POST') {
      // STS token exchange for `external_account` credentials files pointing here.
      fake.tokensIssued++;
      return json(res, 200, {
        access_token: `fake-token-${fake.tokensIssued}`,
        issued_token_type: 'urn:ietf:params:oauth:token-type:access_token',
        token_type: 'Bearer',
        expires_in: 3600,
      });
    }
    if (!path.startsWith(BASE)) return error(res, 404, 'notFound', `no such path ${path}`);
    const parts = path.slice(BASE.length).split('/').map(decodeURIComponent);
    const project = parts[0] ?? '';

    // projects/{p}/zones/{z}/instances[/{name}]
    if (parts[1] === 'zones' && parts[3] === 'instances') {
      const zone = parts[2] ?? '';
      const name = parts[4];
      if (name === undefined && method === 'POST') {
        let resource: Json;
        try {
          resource = JSON.parse(body) as Json;
        } catch {
          return error(res, 400, 'parseError', 'Parse Error');
        }
        const iname = String(resource.name ?? '');
        if (!/^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/.test(iname)) {
          return error(res, 400, 'invalid', `Invalid value for field 'resource.name': '${iname}'.`);
        }
        const key = `${project}/${zone}/${iname}`;
        const target = `projects/${project}/zones/${zone}/instances/${iname}`;
        if (instances.has(key))
          return error(res, 409, 'alreadyExists', `The resource '${target}' already exists`);
        const fault = takeOpFault('insert');
        const inst = newInstance(project, zone, iname, String(nextId++), resource);
        if (!fault || fault.instance === 'vanishes') instances.set(key, inst);
        const finish = () => {
          if (fault && instances.get(key) === inst) instances.delete(key);
          else if (!fault && fake.boot && instances.get(key) === inst) boot(inst, () => fake.nextNatIP());
        };
        return json(res, 200, startOperation(project, zone, 'insert', target, delayOf(fault), finish, fault));
      }
      if (name !== undefined && parts.length === 5) {
        const key = `${project}/${zone}/${name}`;
        const target = `projects/${project}/zones/${zone}/instances/${name}`;
        const inst = instances.get(key);
        if (!inst) return error(res, 404, 'notFound', `The resource '${target}' was not found`);
        if (method === 'GET') return json(res, 200, inst);
        if (method === 'DELETE') {
          const fault = takeOpFault('delete');
          const before = inst.status;
          if (!fault) inst.status = 'STOPPING';
          const finish = () => {
            if (fault) inst.status = before;
            else if (instances.get(key) === inst) instances.delete(key);
          };
          return json(
            res,
            200,
            startOperation(project, zone, 'delete', target, delayOf(fault), finish, fault),
          );
        }
      }
      if (
        name !== undefined &&
        parts.length === 6 &&
        (parts[5] === 'stop' || parts[5] === 'start') &&
        method === 'POST'
      ) {
        const action = parts[5];
        const target = `projects/${project}/zones/${zone}/instances/${name}`;
        const inst = instances.get(`${project}/${zone}/${name}`);
        if (!inst) return error(res, 404, 'notFound', `The resource '${target}' was not found`);
        const fault = takeOpFault(action);
        const power = powerTransition(action, inst, () => fake.nextNatIP());
        power.begin();
        const finish = () => power.end(fault !== undefined);
        return json(res, 200, startOperation(project, zone, action, target, delayOf(fault), finish, fault));
      }
      if (name !== undefined && parts.length === 6 && parts[5] === 'setLabels' && method === 'POST') {
        const key = `${project}/${zone}/${name}`;
        const target = `projects/${project}/zones/${zone}/instances/${name}`;
        const inst = instances.get(key);
        if (!inst) return error(res, 404, 'notFound', `The resource '${target}' was not found`);
        const req = JSON.parse(body) as { labels?: Json; labelFingerprint?: string };
        if (req.labelFingerprint !== inst.labelFingerprint) {
          return error(
            res,
            412,
            'conditionNotMet',
            'Labels fingerprint either invalid or resource labels have changed',
          );
        }
        inst.labels = req.labels ?? {};
        inst.labelFingerprint = fingerprint(inst.labels);
        return json(res, 200, operation(project, zone, 'setLabels', target));
      }
      return error(res, 405, 'methodNotAllowed', `${method} ${path}`);
    }

    // projects/{p}/zones/{z}/operations/{name}[/wait]
    if (parts[1] === 'zones' && parts[3] === 'operations' && parts[4] !== undefined) {
      const key = `${project}/${parts[2] ?? ''}/${parts[4]}`;
      const op = operations.get(key);
      if (!op) {
        const target = `projects/${project}/zones/${parts[2]}/operations/${parts[4]}`;
        return error(res, 404, 'notFound', `The resource '${target}' was not found`);
      }
      if (parts.length === 5 && method === 'GET') return json(res, 200, op);
      if (parts.length === 6 && parts[5] === 'wait' && method === 'POST') {
        // Like GCE: block until the operation ends or a while has passed, then answer either way.
        const ending = endings.get(key);
        if (ending) {
          const ms = Math.max(0, Math.min(ending.at - Date.now(), fake.waitMaxMs));
          await new Promise<void>((r) => {
            const t = setTimeout(r, ms);
            res.once('close', () => {
              clearTimeout(t);
              r();
            });
          });
        }
        if (res.destroyed) return;
        return json(res, 200, op);
      }
      return error(res, 405, 'methodNotAllowed', `${method} ${path}`);
    }

    // projects/{p}/aggregated/instances
    if (parts[1] === 'aggregated' && parts[2] === 'instances' && parts.length === 3 && method === 'GET') {
      const pred = parseFilter(url.searchParams.get('filter'));
      if (pred === 'invalid') return error(res, 400, 'invalid', 'Invalid list filter expression.');
      const partial = url.searchParams.get('returnPartialSuccess') === 'true';
      const down = new Set(fake.unreachableZones.map((z) => `zones/${z}`));
      if (down.size > 0 && !partial) {
        return error(res, 503, 'backendError', `Scope ${[...down][0]} is unreachable.`);
      }
      const max = Number(url.searchParams.get('maxResults') ?? fake.defaultPageSize);
      const offset = Number(url.searchParams.get('pageToken') ?? 0);
      const all = [...instances.entries()]
        .filter(([k, v]) => k.startsWith(`${project}/`) && pred(v))
        .sort(([a], [b]) => a.localeCompare(b));
      const page = all.slice(offset, offset + max);
      const items: Record<string, Json> = {};
      const zones = new Set([...fake.zones, ...all.map(([k]) => k.split('/')[1] ?? '')]);
      for (const z of [...zones].sort()) {
        const here = page.filter(([k]) => k.split('/')[1] === z).map(([, v]) => v);
        const scope = `zones/${z}`;
        if (down.has(scope)) {
          items[scope] = {
            warning: {
              code: 'UNREACHABLE',
              message: `Scope ${scope} is unreachable.`,
              data: [{ key: 'scope', value: scope }],
            },
          };
          continue;
        }
        items[scope] = here.length
          ? { instances: here }
          : {
              warning: {
                code: 'NO_RESULTS_ON_PAGE',
                message: `There are no results for scope '${scope}' on this page.`,
                data: [{ key: 'scope', value: scope }],
              },
            };
      }
      const out: Json = {
        kind: 'compute#instanceAggregatedList',
        id: `projects/${project}/aggregated/instances`,
        items,
        selfLink: `${SELF}${project}/aggregated/instances`,
      };
      if (down.size > 0) out.unreachables = [...down].sort();
      if (offset + max < all.length) out.nextPageToken = String(offset + max);
      return json(res, 200, out);
    }

    // projects/{p}/global/firewalls[/{name}]
    if (parts[1] === 'global' && parts[2] === 'firewalls') {
      const name = parts[3];
      if (name === undefined && method === 'POST') {
        const resource = JSON.parse(body) as Json;
        const fname = String(resource.name ?? '');
        const target = `projects/${project}/global/firewalls/${fname}`;
        if (firewalls.has(`${project}/${fname}`))
          return error(res, 409, 'alreadyExists', `The resource '${target}' already exists`);
        firewalls.set(`${project}/${fname}`, {
          ...resource,
          kind: 'compute#firewall',
          id: String(nextId++),
          selfLink: `${SELF}${target.slice('projects/'.length)}`,
        });
        return json(res, 200, operation(project, undefined, 'insert', target));
      }
      if (name !== undefined && method === 'GET') {
        const fw = firewalls.get(`${project}/${name}`);
        if (!fw)
          return error(
            res,
            404,
            'notFound',
            `The resource 'projects/${project}/global/firewalls/${name}' was not found`,
          );
        return json(res, 200, fw);
      }
      return error(res, 405, 'methodNotAllowed', `${method} ${path}`);
    }
    return error(res, 404, 'notFound', `no such path ${path}`);
  };

  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      handle(req, res, Buffer.concat(chunks).toString('utf8')).catch((err: unknown) => {
        if (!res.headersSent) error(res, 500, 'backendError', String(err));
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  fake.port = (server.address() as AddressInfo).port;
  return fake;

  function delayOf(fault: OperationFault | undefined): number {
    return fault?.afterMs ?? fake.operationDelayMs;
  }

  function operation(project: string, zone: string | undefined, type: string, target: string): Json {
    const name = `operation-${Date.now()}-${randomUUID().slice(0, 8)}`;
    const where = zone ? `zones/${zone}` : 'global';
    return {
      kind: 'compute#operation',
      id: String(nextId++),
      name,
      operationType: type,
      targetLink: `${SELF}${target.slice('projects/'.length)}`,
      status: 'RUNNING',
      progress: 0,
      insertTime: new Date().toISOString(),
      startTime: new Date().toISOString(),
      ...(zone ? { zone: `${SELF}${project}/zones/${zone}` } : {}),
      selfLink: `${SELF}${project}/${where}/operations/${name}`,
    };
  }
}
