/**
 * The REST test server stays honest: each scenario — a sequence of requests a client of the API
 * makes — runs once against the real kube-apiserver and once against the in-process test server
 * (test/support/kube-server), and the two recordings must be equal: status codes, Status reasons,
 * causes' fields, and every returned field. Values that legitimately differ between two servers
 * (uids, resourceVersions, timestamps, continue tokens) are replaced by what they show — which
 * earlier value they repeat, a well-formed time — so their behaviour is still compared.
 */

import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { until } from '../../support/wait.ts';
import { kubectl } from './support/control-plane.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');

const CRAWL = '/apis/crawl.example.com/v1alpha1';
const CORE = '/api/v1';
const COORD = '/apis/coordination.k8s.io/v1';

// biome-ignore lint/suspicious/noExplicitAny: JSON bodies of any shape, read by the scenarios.
type Json = any;

interface Target {
  /** The real API server (else the test server). */
  real: boolean;
  url: string;
  token: string;
  dispatcher: Agent;
  /** Makes every resourceVersion so far too old to watch from. */
  compact(): Promise<void>;
}

interface Reply {
  status: number;
  body: Json;
}

const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/;

/** Replaces uids, resourceVersions and server times by what they show; drops what only one server has. */
class Normalizer {
  private readonly seen = new Map<string, string>();
  private readonly counts = new Map<string, number>();

  /** `rv#3`: the third distinct resourceVersion of the scenario, wherever it shows up again. */
  token(kind: string, value: string): string {
    const key = `${kind}:${value}`;
    let t = this.seen.get(key);
    if (!t) {
      const n = (this.counts.get(kind) ?? 0) + 1;
      this.counts.set(kind, n);
      t = `${kind}#${n}`;
      this.seen.set(key, t);
    }
    return t;
  }

  value(v: Json, key = ''): Json {
    if (Array.isArray(v)) return v.map((x) => this.value(x));
    if (v === null || typeof v !== 'object') {
      if (typeof v !== 'string') return v;
      if (key === 'uid') return this.token('uid', v);
      if (key === 'resourceVersion') return /^\d+$/.test(v) ? this.token('rv', v) : `bad rv ${v}`;
      if (key === 'creationTimestamp' || key === 'deletionTimestamp')
        return RFC3339.test(v) ? '<time>' : `bad time ${v}`;
      return v;
    }
    const out: Record<string, Json> = {};
    // Sorted, so tokens are handed out in the same order whatever order a server writes keys in.
    for (const k of Object.keys(v).sort()) {
      if (k === 'managedFields') continue; // server-side apply bookkeeping: not modelled
      out[k] = this.value(v[k], k);
    }
    return out;
  }

  /** A Status: code, reason, details and causes' fields and reasons (messages are prose). */
  status(b: Json): Json {
    const { message: _m, details, ...rest } = b;
    const out: Json = this.value(rest);
    if (details) {
      const { causes, ...d } = details;
      out.details = this.value(d);
      if (causes) out.details.causes = causes.map((c: Json) => ({ field: c.field, reason: c.reason }));
    }
    return out;
  }

  /** A list: its version must be at least every item's; the continue token is opaque. */
  list(b: Json): Json {
    const { metadata, items, ...rest } = b;
    const listRv = Number(metadata.resourceVersion);
    for (const i of items) expect(listRv).toBeGreaterThanOrEqual(Number(i.metadata.resourceVersion));
    const { resourceVersion: _rv, continue: cont, ...meta } = metadata;
    return {
      ...this.value(rest),
      metadata: { ...this.value(meta), ...(cont ? { continue: '<continue>' } : {}) },
      items: this.value(items),
    };
  }

  body(b: Json): Json {
    if (b === null || typeof b !== 'object') return b;
    if (b.kind === 'Status') return this.status(b);
    if (typeof b.kind === 'string' && b.kind.endsWith('List') && Array.isArray(b.items)) return this.list(b);
    return this.value(b);
  }
}

interface WatchStream {
  status: number;
  /** Every event so far (BOOKMARKs included). */
  events: Json[];
  readonly ended: boolean;
  close(): void;
}

/** Runs requests against one server and records what a client sees, normalized. */
class Driver {
  readonly trace: { step: string; seen: Json }[] = [];
  readonly norm = new Normalizer();
  readonly target: Target;
  readonly ns: string;
  constructor(target: Target, ns: string) {
    this.target = target;
    this.ns = ns;
  }

  async raw(
    method: string,
    path: string,
    body?: unknown,
    opts: { contentType?: string; token?: string } = {},
  ): Promise<Reply> {
    const res = await undiciFetch(`${this.target.url}${path}`, {
      method,
      dispatcher: this.target.dispatcher,
      headers: {
        authorization: `Bearer ${opts.token ?? this.target.token}`,
        accept: 'application/json',
        ...(body === undefined ? {} : { 'content-type': opts.contentType ?? 'application/json' }),
      },
      ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      // not JSON: kept as text
    }
    return { status: res.status, body: parsed };
  }

  /**
   * A request whose status and body are part of the recording. `schemaCauses`: fields the real
   * server also blames through the CRD's schema, which the test server does not run; they must
   * be there, and are left out of the comparison.
   */
  async call(
    step: string,
    method: string,
    path: string,
    body?: unknown,
    opts: { contentType?: string; token?: string; schemaCauses?: string[] } = {},
  ): Promise<Reply> {
    const reply = await this.raw(method, path, body, opts);
    let seen = reply.body;
    if (opts.schemaCauses && this.target.real) {
      const causes: { field: string }[] = seen?.details?.causes ?? [];
      for (const f of opts.schemaCauses) expect(causes.map((c) => c.field)).toContain(f);
      seen = {
        ...seen,
        details: { ...seen.details, causes: causes.filter((c) => !opts.schemaCauses?.includes(c.field)) },
      };
    }
    this.trace.push({ step, seen: { status: reply.status, body: this.norm.body(seen) } });
    return reply;
  }

  /** A derived observation (e.g. "the resourceVersion did not change"). */
  note(step: string, seen: Json): void {
    this.trace.push({ step, seen });
  }

  async watch(path: string): Promise<WatchStream> {
    const ac = new AbortController();
    const res = await undiciFetch(`${this.target.url}${path}`, {
      dispatcher: this.target.dispatcher,
      headers: { authorization: `Bearer ${this.target.token}`, accept: 'application/json' },
      signal: ac.signal,
    });
    const stream: WatchStream = {
      status: res.status,
      events: [],
      ended: false,
      close: () => ac.abort(),
    };
    const body = res.body;
    void (async () => {
      let buf = '';
      const decoder = new TextDecoder();
      try {
        for await (const chunk of body ?? []) {
          buf += decoder.decode(chunk as Uint8Array, { stream: true });
          for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
            const line = buf.slice(0, i).trim();
            buf = buf.slice(i + 1);
            if (line) stream.events.push(JSON.parse(line));
          }
        }
        if (buf.trim()) stream.events.push(JSON.parse(buf));
      } catch {
        // aborted by close()
      } finally {
        (stream as { ended: boolean }).ended = true;
      }
    })();
    return stream;
  }

  /** Records the events of `w` (bookmarks left out: when they come is the server's choice). */
  events(step: string, w: WatchStream): void {
    this.note(
      step,
      w.events
        .filter((e) => e.type !== 'BOOKMARK')
        .map((e) => ({ type: e.type, object: this.norm.body(e.object) })),
    );
  }
}

const proxy = (name: string, extra: Json = {}) => ({
  apiVersion: 'crawl.example.com/v1alpha1',
  kind: 'Proxy',
  metadata: { name, ...(extra.metadata ?? {}) },
  // Written with the schema's defaults: the test server does not default (or prune) CRD fields.
  spec: {
    type: 'External',
    endpoint: { host: '203.0.113.7', port: 8080 },
    port: 3128,
    ...(extra.spec ?? {}),
  },
  ...(extra.status ? { status: extra.status } : {}),
});

const pool = (name: string) => ({
  apiVersion: 'crawl.example.com/v1alpha1',
  kind: 'ProxyPool',
  metadata: { name },
  spec: { replicas: 2, template: { spec: { type: 'Managed', provider: 'kubernetes', port: 3128 } } },
});

const mergeType = { contentType: 'application/merge-patch+json' };
const jsonPatchType = { contentType: 'application/json-patch+json' };

type Scenario = (d: Driver) => Promise<void>;

const SCENARIOS: Record<string, Scenario> = {
  'create, get, not found, already exists, unauthorized': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    await d.call('the namespace', 'GET', `${CORE}/namespaces/${d.ns}`);
    await d.call('create', 'POST', px, proxy('a', { metadata: { labels: { tier: 'x' } } }));
    await d.call('get', 'GET', `${px}/a`);
    await d.call('get missing', 'GET', `${px}/missing`);
    await d.call('create again', 'POST', px, proxy('a'));
    await d.call('bad name', 'POST', px, proxy('Not_A_Name'));
    await d.call('empty metadata maps are not stored', 'POST', px, {
      ...proxy('empty'),
      metadata: { name: 'empty', labels: {}, annotations: {}, finalizers: [], ownerReferences: [] },
    });
    await d.call('server-owned metadata is replaced', 'POST', px, {
      ...proxy('owned'),
      metadata: {
        name: 'owned',
        uid: 'd6b3a0a4-0000-4000-8000-000000000000',
        generation: 7,
        creationTimestamp: '2020-01-01T00:00:00Z',
        deletionTimestamp: '2020-01-01T00:00:00Z',
      },
    });
    await d.call('a resourceVersion on create', 'POST', px, {
      ...proxy('x'),
      metadata: { name: 'x', resourceVersion: '5' },
    });
    await d.call('namespace mismatch', 'POST', px, proxy('b', { metadata: { namespace: 'elsewhere' } }));
    await d.call('not JSON', 'POST', px, '{');
    await d.call('wrong token', 'GET', `${px}/a`, undefined, { token: 'not-the-token' });
    await d.call('unknown resource', 'GET', `${CRAWL}/namespaces/${d.ns}/proxiez`);
    await d.call('unknown subresource', 'GET', `${px}/a/bogus`);
    await d.call('no scale subresource', 'GET', `${px}/a/scale`);
    const cm = `${CORE}/namespaces/${d.ns}/configmaps`;
    await d.call('no name', 'POST', cm, { apiVersion: 'v1', kind: 'ConfigMap', metadata: {} });
    const generated = await d.raw('POST', cm, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { generateName: 'gen-' },
    });
    d.note("a generated name: the prefix and five of the apiserver's letters", [
      generated.status,
      /^gen-[bcdfghjklmnpqrstvwxz2456789]{5}$/.test(generated.body.metadata.name),
      generated.body.metadata.generateName,
    ]);
  },

  'update: resourceVersion preconditions, no-op writes, name mismatch': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const created = (await d.call('create', 'POST', px, proxy('a'))).body;
    const changed = structuredClone(created);
    changed.spec.endpoint.port = 8081;
    const v2 = (await d.call('update spec', 'PUT', `${px}/a`, changed)).body;
    await d.call('update with the stale version', 'PUT', `${px}/a`, { ...changed, spec: created.spec });
    const { resourceVersion: _rv, ...noRv } = v2.metadata;
    await d.call('update without a version', 'PUT', `${px}/a`, { ...v2, metadata: noRv });
    await d.call('update changing nothing', 'PUT', `${px}/a`, v2);
    await d.call('update naming another object', 'PUT', `${px}/a`, {
      ...v2,
      metadata: { ...v2.metadata, name: 'b' },
    });
    await d.call('update a missing object', 'PUT', `${px}/missing`, {
      ...v2,
      metadata: { ...v2.metadata, name: 'missing' },
    });
    await d.call('update changing the uid', 'PUT', `${px}/a`, {
      ...v2,
      metadata: { ...v2.metadata, uid: 'd6b3a0a4-0000-4000-8000-000000000000' },
    });
    await d.call('update changing server-owned fields', 'PUT', `${px}/a`, {
      ...v2,
      metadata: { ...v2.metadata, generation: 9, creationTimestamp: '2020-01-01T00:00:00Z' },
    });
  },

  'generation: spec changes bump it, metadata and status changes do not': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    await d.call('create (status dropped)', 'POST', px, proxy('a', { status: { phase: 'Ready' } }));
    await d.call('label', 'PATCH', `${px}/a`, { metadata: { labels: { a: 'b' } } }, mergeType);
    await d.call('annotation', 'PATCH', `${px}/a`, { metadata: { annotations: { n: 'v' } } }, mergeType);
    await d.call('status', 'PATCH', `${px}/a/status`, { status: { phase: 'Ready' } }, mergeType);
    await d.call('spec', 'PATCH', `${px}/a`, { spec: { endpoint: { port: 9000 } } }, mergeType);
    await d.call('spec unchanged', 'PATCH', `${px}/a`, { spec: { endpoint: { port: 9000 } } }, mergeType);
  },

  'status subresource: each endpoint keeps to its half': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    await d.call('create', 'POST', px, proxy('a'));
    const st = (
      await d.call('status put', 'PUT', `${px}/a/status`, {
        ...(
          await d.raw('GET', `${px}/a`)
        ).body,
        status: { phase: 'Ready', address: '203.0.113.7' },
      })
    ).body;
    await d.call('status put changing spec too', 'PUT', `${px}/a/status`, {
      ...st,
      spec: { ...st.spec, port: 4000 },
      status: { phase: 'Failed' },
    });
    const cur = (await d.raw('GET', `${px}/a`)).body;
    await d.call('main put changing status too', 'PUT', `${px}/a`, {
      ...cur,
      spec: { ...cur.spec, port: 4001 },
      status: { phase: 'Pending' },
    });
    await d.call(
      'main patch of status only',
      'PATCH',
      `${px}/a`,
      { status: { phase: 'Pending' } },
      mergeType,
    );
    await d.call('status patch of spec only', 'PATCH', `${px}/a/status`, { spec: { port: 1 } }, mergeType);
    await d.call('status of a missing object', 'GET', `${px}/missing/status`);
    await d.call('status get', 'GET', `${px}/a/status`);
    await d.call('status patch removing it', 'PATCH', `${px}/a/status`, { status: null }, mergeType);
  },

  'merge and JSON patches, and how they fail': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const created = (await d.call('create', 'POST', px, proxy('a'))).body;
    const rv = created.metadata.resourceVersion;
    await d.call(
      'merge: set and remove',
      'PATCH',
      `${px}/a`,
      {
        metadata: { labels: { a: '1', b: '2' } },
      },
      mergeType,
    );
    await d.call('merge: null removes', 'PATCH', `${px}/a`, { metadata: { labels: { a: null } } }, mergeType);
    await d.call(
      'merge: stale resourceVersion',
      'PATCH',
      `${px}/a`,
      { metadata: { resourceVersion: rv, labels: { c: '3' } } },
      mergeType,
    );
    await d.call('merge: not an object', 'PATCH', `${px}/a`, '[1]', mergeType);
    await d.call('merge: not JSON', 'PATCH', `${px}/a`, '{', mergeType);
    await d.call(
      'json: add, replace, test',
      'PATCH',
      `${px}/a`,
      [
        { op: 'add', path: '/metadata/finalizers', value: ['example.com/f'] },
        { op: 'replace', path: '/spec/endpoint/port', value: 8082 },
        { op: 'test', path: '/spec/endpoint/host', value: '203.0.113.7' },
      ],
      jsonPatchType,
    );
    await d.call(
      'json: failing test',
      'PATCH',
      `${px}/a`,
      [{ op: 'test', path: '/spec/endpoint/port', value: 1 }],
      jsonPatchType,
    );
    await d.call(
      'json: remove a missing path',
      'PATCH',
      `${px}/a`,
      [{ op: 'remove', path: '/spec/nothing' }],
      jsonPatchType,
    );
    await d.call('json: not a list', 'PATCH', `${px}/a`, { op: 'add' }, jsonPatchType);
    await d.call(
      'json: unknown op',
      'PATCH',
      `${px}/a`,
      [{ op: 'frobnicate', path: '/spec' }],
      jsonPatchType,
    );
    await d.call(
      'json: test on the resourceVersion',
      'PATCH',
      `${px}/a`,
      [{ op: 'test', path: '/metadata/resourceVersion', value: rv }],
      jsonPatchType,
    );
    await d.call(
      'strategic merge on a custom resource',
      'PATCH',
      `${px}/a`,
      { metadata: {} },
      {
        contentType: 'application/strategic-merge-patch+json',
      },
    );
    await d.call('patch a missing object', 'PATCH', `${px}/missing`, { metadata: {} }, mergeType);
    await d.call('finalizer off', 'PATCH', `${px}/a`, { metadata: { finalizers: null } }, mergeType);
    await d.call(
      'merge: empty resourceVersion is no precondition',
      'PATCH',
      `${px}/a`,
      {
        metadata: { resourceVersion: '', labels: { e: '1' } },
      },
      mergeType,
    );
    await d.call('merge: renaming', 'PATCH', `${px}/a`, { metadata: { name: 'b' } }, mergeType);
    await d.call(
      'merge: another uid',
      'PATCH',
      `${px}/a`,
      {
        metadata: { uid: 'd6b3a0a4-0000-4000-8000-000000000000' },
      },
      mergeType,
    );
    await d.call(
      "merge: generation is the server's",
      'PATCH',
      `${px}/a`,
      { metadata: { generation: 40 } },
      mergeType,
    );
    // Built-in types, whose fields the test server keeps exactly as the apiserver (no schema).
    const cm = `${CORE}/namespaces/${d.ns}/configmaps`;
    await d.call('configmap', 'POST', cm, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'c' },
      data: { a: '1' },
    });
    await d.call(
      'json: replace a missing key',
      'PATCH',
      `${cm}/c`,
      [{ op: 'replace', path: '/data/z', value: '2' }],
      jsonPatchType,
    );
    await d.call(
      'json: remove a missing key',
      'PATCH',
      `${cm}/c`,
      [{ op: 'remove', path: '/data/none' }],
      jsonPatchType,
    );
    await d.call(
      'json: add under a missing parent',
      'PATCH',
      `${cm}/c`,
      [{ op: 'add', path: '/binaryData/x', value: 'eA==' }],
      jsonPatchType,
    );
    await d.call(
      'json: move and copy',
      'PATCH',
      `${cm}/c`,
      [
        { op: 'move', from: '/data/a', path: '/data/b' },
        { op: 'copy', from: '/data/b', path: '/data/c' },
      ],
      jsonPatchType,
    );
    await d.call(
      'json: atomic (a failing op undoes the rest)',
      'PATCH',
      `${cm}/c`,
      [
        { op: 'add', path: '/data/t', value: 'x' },
        { op: 'test', path: '/data/b', value: 'no' },
      ],
      jsonPatchType,
    );
    await d.call(
      'json: append to a list',
      'PATCH',
      `${cm}/c`,
      [
        { op: 'add', path: '/metadata/finalizers', value: [] },
        { op: 'add', path: '/metadata/finalizers/-', value: 'example.com/f' },
      ],
      jsonPatchType,
    );
    await d.call(
      'json: index out of range',
      'PATCH',
      `${cm}/c`,
      [{ op: 'add', path: '/metadata/finalizers/5', value: 'x.io/y' }],
      jsonPatchType,
    );
    await d.call(
      'json: a stale resourceVersion written',
      'PATCH',
      `${cm}/c`,
      [{ op: 'replace', path: '/metadata/resourceVersion', value: rv }],
      jsonPatchType,
    );
    await d.call('json: a list of non-objects', 'PATCH', `${cm}/c`, '[1]', jsonPatchType);
    await d.call('json: no operations', 'PATCH', `${cm}/c`, [], jsonPatchType);
    await d.call(
      'merge: emptying labels and data',
      'PATCH',
      `${cm}/c`,
      {
        metadata: { finalizers: null, labels: {} },
        data: null,
      },
      mergeType,
    );
  },

  'finalizers, deletionTimestamp and delete preconditions': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const a = (
      await d.call(
        'create with a finalizer',
        'POST',
        px,
        proxy('a', { metadata: { finalizers: ['example.com/f'] } }),
      )
    ).body;
    const w = await d.watch(`${px}?watch=true&resourceVersion=${a.metadata.resourceVersion}`);
    await d.call('delete with a wrong uid', 'DELETE', `${px}/a`, {
      apiVersion: 'v1',
      kind: 'DeleteOptions',
      preconditions: { uid: 'd6b3a0a4-0000-4000-8000-000000000000' },
    });
    await d.call('delete with a stale resourceVersion', 'DELETE', `${px}/a`, {
      apiVersion: 'v1',
      kind: 'DeleteOptions',
      preconditions: { resourceVersion: '1' },
    });
    await d.call('delete with the right uid', 'DELETE', `${px}/a`, {
      apiVersion: 'v1',
      kind: 'DeleteOptions',
      preconditions: { uid: a.metadata.uid },
    });
    await d.call('get while terminating', 'GET', `${px}/a`);
    await d.call('delete again', 'DELETE', `${px}/a`);
    await d.call(
      'add a finalizer while terminating',
      'PATCH',
      `${px}/a`,
      { metadata: { finalizers: ['example.com/f', 'example.com/g'] } },
      mergeType,
    );
    await d.call('spec change while terminating', 'PATCH', `${px}/a`, { spec: { port: 3000 } }, mergeType);
    await d.call('remove the finalizer', 'PATCH', `${px}/a`, { metadata: { finalizers: null } }, mergeType);
    await d.call('gone', 'GET', `${px}/a`);
    await until('the watch saw the deletion', () => w.events.some((e) => e.type === 'DELETED'), {
      timeoutMs: 30_000,
    });
    w.close();
    d.events('what a watcher saw', w);
    await d.call('create without finalizer', 'POST', px, proxy('b'));
    await d.call('delete it', 'DELETE', `${px}/b`);
    await d.call('delete it again', 'DELETE', `${px}/b`);
  },

  'list: label and field selectors, limit and continue': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    for (const [name, tier] of [
      ['p1', 'a'],
      ['p2', 'b'],
      ['p3', 'a'],
      ['p4', 'a'],
      ['p5', 'b'],
    ] as const)
      await d.call(`create ${name}`, 'POST', px, proxy(name, { metadata: { labels: { tier } } }));
    await d.call('all', 'GET', px);
    await d.call('tier=a', 'GET', `${px}?labelSelector=tier%3Da`);
    await d.call('tier in (b)', 'GET', `${px}?labelSelector=${encodeURIComponent('tier in (b)')}`);
    await d.call('!tier', 'GET', `${px}?labelSelector=${encodeURIComponent('!tier')}`);
    await d.call('bad selector', 'GET', `${px}?labelSelector=${encodeURIComponent('tier in (')}`);
    await d.call('by name', 'GET', `${px}?fieldSelector=${encodeURIComponent('metadata.name=p2')}`);
    let page = await d.call('page 1', 'GET', `${px}?limit=2`);
    for (let n = 2; page.body.metadata.continue; n++) {
      page = await d.call(
        `page ${n}`,
        'GET',
        `${px}?limit=2&continue=${encodeURIComponent(page.body.metadata.continue)}`,
      );
    }
    const first = await d.raw('GET', `${px}?limit=2&labelSelector=tier%3Da`);
    await d.call('selector page 1', 'GET', `${px}?limit=2&labelSelector=tier%3Da`);
    await d.call(
      'selector page 2',
      'GET',
      `${px}?limit=2&labelSelector=tier%3Da&continue=${encodeURIComponent(first.body.metadata.continue)}`,
    );
    await d.call('bad continue', 'GET', `${px}?limit=2&continue=bm90LWEtdG9rZW4`);
  },

  'watch from a resourceVersion: ADDED, MODIFIED, DELETED; selectors': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const a = (await d.call('create a', 'POST', px, proxy('a', { metadata: { labels: { w: 'yes' } } }))).body;
    const all = await d.watch(`${px}?watch=true&resourceVersion=${a.metadata.resourceVersion}`);
    const sel = await d.watch(
      `${px}?watch=true&resourceVersion=${a.metadata.resourceVersion}&labelSelector=w%3Dyes`,
    );
    d.note('watch status', [all.status, sel.status]);
    await d.call('create b', 'POST', px, proxy('b'));
    await d.call('label b in', 'PATCH', `${px}/b`, { metadata: { labels: { w: 'yes' } } }, mergeType);
    await d.call('label a out', 'PATCH', `${px}/a`, { metadata: { labels: { w: 'no' } } }, mergeType);
    await d.call('status of b', 'PATCH', `${px}/b/status`, { status: { phase: 'Ready' } }, mergeType);
    await d.call('delete b', 'DELETE', `${px}/b`);
    const done = (w: WatchStream) =>
      w.events.some((e) => e.type === 'DELETED' && e.object.metadata.name === 'b');
    await until('the watches saw b deleted', () => done(all) && done(sel), { timeoutMs: 30_000 });
    all.close();
    sel.close();
    d.events('all events', all);
    d.events('events through the selector', sel);
    // Without a version: the current state first, as ADDED.
    const fresh = await d.watch(`${px}?watch=true`);
    await until('the initial ADDED of a', () => fresh.events.length >= 1, { timeoutMs: 30_000 });
    fresh.close();
    d.events('watch without a version', fresh);
  },

  'watch: bookmarks, timeout, and a version too old': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const a = (await d.call('create', 'POST', px, proxy('a'))).body;
    const from = `watch=true&allowWatchBookmarks=true&resourceVersion=${a.metadata.resourceVersion}`;
    // A watcher that got an event is bookmarked before its timeout; a quiet one is not (only by
    // the heartbeat, a minute apart).
    const busy = await d.watch(`${px}?${from}&timeoutSeconds=5`);
    const quiet = await d.watch(`${CRAWL}/namespaces/${d.ns}/proxypools?${from}&timeoutSeconds=4`);
    const b = (await d.call('create b', 'POST', px, proxy('b'))).body;
    await until('the watches end at their timeouts', () => busy.ended && quiet.ended, { timeoutMs: 30_000 });
    d.events('events', busy);
    const marks = busy.events.filter((e) => e.type === 'BOOKMARK');
    d.note(
      'bookmarked after the event, before the timeout',
      marks.length > 0 && busy.events[0]?.type === 'ADDED',
    );
    d.note(
      'at the version of the event or later',
      marks.every((m) => Number(m.object.metadata.resourceVersion) >= Number(b.metadata.resourceVersion)),
    );
    d.note(
      'what a bookmark holds',
      marks.map((m) => ({ ...m, object: { ...m.object, metadata: Object.keys(m.object.metadata) } }))[0],
    );
    d.note('the quiet watch', quiet.events);
    // From the current state: ADDED for each object, then a bookmark marking their end.
    const fresh = await d.watch(`${px}?watch=true&allowWatchBookmarks=true&timeoutSeconds=1`);
    await until('the fresh watch ends', () => fresh.ended, { timeoutMs: 30_000 });
    d.note(
      'from the current state',
      fresh.events.map((e) =>
        e.type === 'BOOKMARK'
          ? { type: e.type, annotations: e.object.metadata.annotations }
          : { type: e.type, object: d.norm.body(e.object) },
      ),
    );
    await d.target.compact();
    const old = await d.watch(`${px}?watch=true&resourceVersion=1`);
    await until('the too-old watch ends', () => old.ended, { timeoutMs: 30_000 });
    d.note('too old: HTTP status', old.status);
    d.note(
      'too old: events',
      old.events.map((e) => ({ type: e.type, object: d.norm.status(e.object) })),
    );
    await d.call('watch from a malformed version', 'GET', `${px}?watch=true&resourceVersion=abc`);
    await d.call('list at a malformed version', 'GET', `${px}?resourceVersion=abc`);
  },

  'secrets: create, get, labels by merge and strategic merge patch, update without version': async (d) => {
    const s = `${CORE}/namespaces/${d.ns}/secrets`;
    await d.call('create', 'POST', s, {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'auth', labels: { a: '1' } },
      data: { username: Buffer.from('u').toString('base64') },
      stringData: { password: 'p' },
    });
    await d.call('get', 'GET', `${s}/auth`);
    await d.call('merge labels', 'PATCH', `${s}/auth`, { metadata: { labels: { b: '2' } } }, mergeType);
    await d.call(
      'strategic labels',
      'PATCH',
      `${s}/auth`,
      { metadata: { labels: { c: '3' } } },
      {
        contentType: 'application/strategic-merge-patch+json',
      },
    );
    const cur = (await d.raw('GET', `${s}/auth`)).body;
    const { resourceVersion: _rv, ...noRv } = cur.metadata;
    await d.call('update without a version', 'PUT', `${s}/auth`, {
      ...cur,
      metadata: noRv,
      data: { ...cur.data, extra: 'eA==' },
    });
    await d.call('bad base64', 'POST', s, {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'bad' },
      data: { k: 'not base64!' },
    });
    await d.call('list by label', 'GET', `${s}?labelSelector=a%3D1`);
    await d.call('delete', 'DELETE', `${s}/auth`);
    await d.call('gone', 'GET', `${s}/auth`);
  },

  'configmaps: create, update, patch, delete': async (d) => {
    const c = `${CORE}/namespaces/${d.ns}/configmaps`;
    const start = await d.raw('GET', c);
    // Events of a built-in type carry its kind, though its list items do not.
    const w = await d.watch(`${c}?watch=true&resourceVersion=${start.body.metadata.resourceVersion}`);
    const created = (
      await d.call('create', 'POST', c, {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'cm' },
        data: { a: '1' },
      })
    ).body;
    await d.call('update', 'PUT', `${c}/cm`, { ...created, data: { a: '2' } });
    await d.call('stale update', 'PUT', `${c}/cm`, { ...created, data: { a: '3' } });
    await d.call('merge patch', 'PATCH', `${c}/cm`, { data: { b: '2' } }, mergeType);
    await d.call('json patch', 'PATCH', `${c}/cm`, [{ op: 'remove', path: '/data/a' }], jsonPatchType);
    await d.call('not a string', 'POST', c, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'bad' },
      data: { n: 1 },
    });
    await d.call('binary data that is no base64', 'POST', c, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'bad' },
      binaryData: { b: '!!' },
    });
    await d.call('a key that is no file name', 'POST', c, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'bad' },
      data: { 'a b': 'x', ok: 'y' },
    });
    await d.call('a secret key that is no file name', 'POST', `${CORE}/namespaces/${d.ns}/secrets`, {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'bad' },
      stringData: { 'a/b': 'x' },
    });
    await d.call('list', 'GET', c);
    await d.call('delete', 'DELETE', `${c}/cm`);
    await until('the watch saw the deletion', () => w.events.some((e) => e.type === 'DELETED'), {
      timeoutMs: 30_000,
    });
    w.close();
    d.events('what a watcher saw', w);
  },

  'cluster-scoped ProviderHealths, and lists across namespaces': async (d) => {
    const ph = `${CRAWL}/providerhealths`;
    const name = `ph-${d.ns}`;
    await d.call('create (status dropped)', 'POST', ph, {
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProviderHealth',
      metadata: { name, labels: { run: d.ns } },
      status: { type: 'kvm' },
    });
    await d.call(
      'status',
      'PATCH',
      `${ph}/${name}/status`,
      { status: { type: 'kvm', targetsReady: '1/1' } },
      mergeType,
    );
    await d.call('get', 'GET', `${ph}/${name}`);
    await d.call('by label', 'GET', `${ph}?labelSelector=run%3D${d.ns}`);
    await d.call('through a namespace', 'GET', `${CRAWL}/namespaces/${d.ns}/providerhealths/${name}`);
    await d.call('delete', 'DELETE', `${ph}/${name}`);
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    await d.call('a proxy', 'POST', px, proxy('a', { metadata: { labels: { run: d.ns } } }));
    await d.call(
      'proxies of every namespace, by label',
      'GET',
      `${CRAWL}/proxies?labelSelector=run%3D${d.ns}`,
    );
    await d.call(
      'secrets of every namespace, by label',
      'GET',
      `${CORE}/secrets?labelSelector=run%3D${d.ns}`,
    );
  },

  'leases: MicroTime, optimistic concurrency': async (d) => {
    const l = `${COORD}/namespaces/${d.ns}/leases`;
    const lease = (renewTime: string, name = 'leader') => ({
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name },
      spec: {
        holderIdentity: 'a',
        leaseDurationSeconds: 15,
        acquireTime: '2030-01-02T03:04:05.123456Z',
        renewTime,
        leaseTransitions: 0,
      },
    });
    await d.call('three fractional digits', 'POST', l, lease('2030-01-02T03:04:05.123Z'));
    await d.call('no fraction', 'POST', l, lease('2030-01-02T03:04:05Z'));
    await d.call('not a time', 'POST', l, lease('soon'));
    await d.call('nine fractional digits', 'POST', l, lease('2030-01-02T03:04:05.123456789Z'));
    await d.call('an offset', 'POST', l, lease('2030-01-02T03:04:05.123456+02:00', 'offset'));
    await d.call('a lower-case z', 'POST', l, lease('2030-01-02T03:04:05.123456z', 'lower'));
    await d.call('no duration', 'POST', l, {
      ...lease('2030-01-02T03:04:05.123456Z', 'zero'),
      spec: { leaseDurationSeconds: 0 },
    });
    const created = (await d.call('six fractional digits', 'POST', l, lease('2030-01-02T03:04:05.123456Z')))
      .body;
    const renewed = (
      await d.call('renew', 'PUT', `${l}/leader`, {
        ...created,
        spec: { ...created.spec, renewTime: '2030-01-02T03:04:15.000000Z' },
      })
    ).body;
    await d.call('renew with the stale version', 'PUT', `${l}/leader`, created);
    await d.call('bad time by patch', 'PATCH', `${l}/leader`, { spec: { renewTime: '2030' } }, mergeType);
    await d.call(
      'take over',
      'PATCH',
      `${l}/leader`,
      {
        metadata: { resourceVersion: renewed.metadata.resourceVersion },
        spec: { holderIdentity: 'b', leaseTransitions: 1 },
      },
      mergeType,
    );
    const cur = (await d.raw('GET', `${l}/leader`)).body;
    const { resourceVersion: _rv, ...noRv } = cur.metadata;
    await d.call('update without a version', 'PUT', `${l}/leader`, {
      ...cur,
      metadata: noRv,
      spec: { ...cur.spec, holderIdentity: 'c' },
    });
    await d.call('list', 'GET', l);
  },

  'ProxyPool scale subresource': async (d) => {
    const pp = `${CRAWL}/namespaces/${d.ns}/proxypools`;
    await d.call('create', 'POST', pp, pool('p'));
    await d.call('get scale (no status yet)', 'GET', `${pp}/p/scale`);
    await d.call(
      'status with selector',
      'PATCH',
      `${pp}/p/status`,
      {
        status: { replicas: 1, selector: 'crawl.example.com/pool=p' },
      },
      mergeType,
    );
    const scale = (await d.call('get scale', 'GET', `${pp}/p/scale`)).body;
    await d.call('put scale', 'PUT', `${pp}/p/scale`, { ...scale, spec: { replicas: 5 } });
    await d.call('put scale with the stale version', 'PUT', `${pp}/p/scale`, {
      ...scale,
      spec: { replicas: 6 },
    });
    await d.call('merge patch scale', 'PATCH', `${pp}/p/scale`, { spec: { replicas: 3 } }, mergeType);
    await d.call(
      'json patch scale',
      'PATCH',
      `${pp}/p/scale`,
      [{ op: 'replace', path: '/spec/replicas', value: 4 }],
      jsonPatchType,
    );
    await d.call(
      'negative replicas',
      'PATCH',
      `${pp}/p/scale`,
      { spec: { replicas: -1 } },
      {
        ...mergeType,
        schemaCauses: ['spec.replicas'],
      },
    );
    await d.call(
      'negative replicas on the pool',
      'PATCH',
      `${pp}/p`,
      { spec: { replicas: -2 } },
      {
        ...mergeType,
        schemaCauses: ['spec.replicas'],
      },
    );
    await d.call('the pool', 'GET', `${pp}/p`);
    await d.call('scale of a missing pool', 'GET', `${pp}/missing/scale`);
    await d.call('delete', 'DELETE', `${pp}/p`);
  },

  'ownerReference garbage collection in the background': async (d) => {
    const px = `${CRAWL}/namespaces/${d.ns}/proxies`;
    const c = `${CORE}/namespaces/${d.ns}/configmaps`;
    const owner = (
      await d.call('owner', 'POST', px, proxy('owner', { metadata: { finalizers: ['example.com/f'] } }))
    ).body;
    const ref = (uid: string) => ({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'Proxy',
      name: 'owner',
      uid,
      controller: true,
      blockOwnerDeletion: true,
    });
    const dependent = (name: string, refs: Json[]) => ({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name, ownerReferences: refs },
      data: {},
    });
    await d.call('dependent', 'POST', c, dependent('dep', [ref(owner.metadata.uid)]));
    const other = (await d.call('second owner', 'POST', px, proxy('other'))).body;
    await d.call(
      'dependent of both',
      'POST',
      c,
      dependent('both', [
        ref(owner.metadata.uid),
        { ...ref(other.metadata.uid), name: 'other', controller: false },
      ]),
    );
    await d.call(
      'dependent of an owner that never was',
      'POST',
      c,
      dependent('never', [{ ...ref('d6b3a0a4-0000-4000-8000-000000000000'), name: 'other' }]),
    );
    await d.call('delete the owner (a finalizer holds it)', 'DELETE', `${px}/owner`);
    // Background propagation starts once the owner is gone, not while it terminates.
    await d.call('dependent while the owner terminates', 'GET', `${c}/dep`);
    await d.call('release the owner', 'PATCH', `${px}/owner`, { metadata: { finalizers: null } }, mergeType);
    const gone = async (path: string) => (await d.raw('GET', path)).status === 404;
    await until('the garbage collector deletes the dependent', () => gone(`${c}/dep`), {
      timeoutMs: 120_000,
      intervalMs: 200,
    });
    await d.call('dependent collected', 'GET', `${c}/dep`);
    await until('the garbage collector deletes the dependent of no owner', () => gone(`${c}/never`), {
      timeoutMs: 120_000,
      intervalMs: 200,
    });
    await d.call('dependent of no owner collected', 'GET', `${c}/never`);
    await until(
      'the garbage collector drops the gone owner from a dependent of two',
      async () => (await d.raw('GET', `${c}/both`)).body.metadata.ownerReferences.length === 1,
      { timeoutMs: 120_000, intervalMs: 200 },
    );
    await d.call('a dependent with another owner left stays, without the gone one', 'GET', `${c}/both`);
  },
};

const fakeToken = 'fidelity-token';
let fake: KubeServer;
let realAgent: Agent;
let fakeAgent: Agent;
let real: Target;
let fakeTarget: Target;

beforeAll(async () => {
  kubectl(cp, ['apply', '--server-side', '--field-manager=e2e', '-k', resolve(ROOT, 'config/crd')]);
  for (const crd of ['proxies', 'proxypools', 'providerhealths'])
    kubectl(cp, ['wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`]);
  realAgent = new Agent({ connect: { ca: readFileSync(cp.caFile) } });
  fakeAgent = new Agent();
  real = {
    real: true,
    url: cp.server,
    token: cp.adminToken,
    dispatcher: realAgent,
    // Its watch cache begins where the resource's first list was: far past the versions asked for.
    compact: async () => {},
  };
  // A watch cache that is still filling (a CRD just established) answers a watch with a 429
  // ERROR event: a transient the scenarios must not see.
  const probe = new Driver(real, 'default');
  for (const path of [
    `${CRAWL}/proxies`,
    `${CRAWL}/proxypools`,
    `${CRAWL}/providerhealths`,
    `${CORE}/secrets`,
    `${CORE}/configmaps`,
    `${COORD}/leases`,
  ]) {
    await until(
      `the watch cache of ${path}`,
      async () => {
        const rv = (await probe.raw('GET', `${path}?limit=1`)).body.metadata.resourceVersion;
        const w = await probe.watch(`${path}?watch=true&timeoutSeconds=1&resourceVersion=${rv}`);
        await until('the probe watch ends', () => w.ended, { timeoutMs: 30_000 });
        return w.status === 200 && !w.events.some((e) => e.type === 'ERROR');
      },
      { timeoutMs: 120_000, intervalMs: 500 },
    );
  }
  fake = await startKubeServer({ token: fakeToken });
  fakeTarget = {
    real: false,
    url: fake.url,
    token: fakeToken,
    dispatcher: fakeAgent,
    compact: async () => fake.compact(),
  };
});

afterAll(async () => {
  // Deleted in the background by the namespace controller; nothing here holds a finalizer.
  if (real) for (const ns of created) await new Driver(real, ns).raw('DELETE', `${CORE}/namespaces/${ns}`);
  await fake?.stop();
  await fakeAgent?.close();
  await realAgent?.close();
});

let counter = 0;
const created: string[] = [];
/** Namespaces of their own per run: a namespace is deleted in the background, slowly. */
const RUN = Date.now().toString(36).slice(-5);

async function run(target: Target, ns: string, scenario: Scenario): Promise<Driver['trace']> {
  const d = new Driver(target, ns);
  await scenario(d);
  return d.trace;
}

describe('the REST test server answers like kube-apiserver', () => {
  it.each(Object.keys(SCENARIOS))('%s', async (name) => {
    const scenario = SCENARIOS[name] as Scenario;
    const ns = `fidelity-${RUN}-${++counter}`;
    const made = await new Driver(real, ns).raw('POST', `${CORE}/namespaces`, {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: ns },
    });
    expect(made.status).toBe(201);
    created.push(ns);
    const fromReal = await run(real, ns, scenario);
    const fromFake = await run(fakeTarget, ns, scenario);
    expect(fromFake).toEqual(fromReal);
  });
});
