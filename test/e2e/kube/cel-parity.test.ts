/**
 * Admission parity on the real API server: every case of the tables the TypeScript validator and
 * the CEL rule twins are judged on (test/support/api/manifests, test/support/api/pool-manifests) is sent to
 * kube-apiserver with the generated CRDs — a create as a dry-run POST, an update (transition
 * rules) as a dry-run PUT over an object stored for real. The server accepts exactly what the
 * table accepts, refuses naming exactly the table's fields, skips the CEL rules exactly when the
 * validator does, reports each rule's message with its reason, and no rule ever fails to
 * evaluate.
 *
 * Objects are sent with strict field validation, as kubectl sends them: without it the server
 * prunes unknown fields where standalone mode refuses them (shown below).
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { POOL_RULE_LOCATIONS } from '../../../src/api/pool-rules.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import type { ProxyPool } from '../../../src/api/proxypool.ts';
import { type CelRule, PROXY_RULE_LOCATIONS } from '../../../src/api/rules.ts';
import { type ValidationResult, validateProxy, validateProxyPool } from '../../../src/api/validate.ts';
import { managed, PROXY_CASES } from '../../support/api/manifests.ts';
import { POOL_CASES, POOL_SCHEMA_CASES } from '../../support/api/pool-manifests.ts';
import { kubectl } from './support/control-plane.ts';
import { type RestReply, rest } from './support/rest.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');
const api = rest(cp.server, cp.adminToken, cp.caFile);
/** Stands in for the tables' namespace `crawl`, which other files may use. */
const NS = 'cel-parity';
const GROUP_PATH = '/apis/crawl.example.com/v1alpha1';
const STRICT = 'fieldValidation=Strict';

type Obj = Record<string, unknown> & { metadata?: Record<string, unknown> };

/** Every rule of both CRDs by message: what the server must say, with which reason. */
const RULES = new Map<string, CelRule<never>>();
for (const list of [...Object.values(PROXY_RULE_LOCATIONS), ...Object.values(POOL_RULE_LOCATIONS)])
  for (const r of list as readonly CelRule<never>[]) RULES.set(r.message, r);

const NOT_CHECKED = 'some validation rules were not checked because the object was invalid';

interface Verdict {
  /** The fields the server blamed, deduplicated and sorted. */
  fields: string[];
  /** The server reported that it skipped the CEL rules. */
  rulesSkipped: boolean;
  causes: { field: string; reason: string; message: string }[];
}

/**
 * What the server's answer says about the object, in the table's terms. Where the server refuses
 * before validating, the refusal names no field, and the field is read from what it refused:
 * - 400 "strict decoding error: unknown field X": strict field validation decodes before
 *   validating, so unknown fields come as one message, not as causes.
 * - 400 "the API version in the data … does not match": the body's apiVersion, refused while
 *   decoding.
 * - 404 for the namespace: a namespace the validator calls invalid cannot exist (see the test
 *   below), so the request names a namespace that is not there.
 * In a 422, a cause with field `<nil>` is the server's note that it skipped the CEL rules, and
 * the scale subresource's own replicas check names its field as a JSON path (`.spec.replicas`).
 */
function verdict(reply: RestReply, namespace: string): Verdict {
  const { status, body } = reply;
  if (status === 200 || status === 201) return { fields: [], rulesSkipped: false, causes: [] };
  const message = String(body?.message ?? '');
  if (status === 400 && body?.reason === 'BadRequest' && message.includes('strict decoding error')) {
    const fields = [...message.matchAll(/unknown field "([^"]+)"/g)].map((m) => m[1] as string);
    expect(fields.length, message).toBeGreaterThan(0);
    return { fields: [...new Set(fields)].sort(), rulesSkipped: false, causes: [] };
  }
  if (
    status === 400 &&
    /the API version in the data \(.*\) does not match the expected API version/.test(message)
  )
    return { fields: ['apiVersion'], rulesSkipped: false, causes: [] };
  if (status === 404 && body?.details?.kind === 'namespaces' && body?.details?.name === namespace)
    return { fields: ['metadata.namespace'], rulesSkipped: false, causes: [] };
  expect(status, JSON.stringify(body)).toBe(422);
  expect(body.reason).toBe('Invalid');
  const causes = (body.details?.causes ?? []) as Verdict['causes'];
  let rulesSkipped = false;
  const fields = new Set<string>();
  for (const c of causes) {
    // A rule that cannot be evaluated (a CEL runtime error) is a bug in the rule, never a verdict.
    expect(c.message, c.field).not.toMatch(/evaluating rule|no such key|no such overload/);
    if (c.field === '<nil>') {
      expect(c.message).toContain(NOT_CHECKED);
      rulesSkipped = true;
    } else fields.add(c.field.replace(/^\./, ''));
  }
  return { fields: [...fields].sort(), rulesSkipped, causes };
}

/** The table's objects live in `crawl`; here they live in NS. */
function here<T extends Obj>(obj: T): T {
  const copy = structuredClone(obj);
  if (copy.metadata?.namespace === 'crawl') copy.metadata.namespace = NS;
  return copy;
}

let stored = 0;

/** A create as a dry run; an update over `old`, stored for real under a name of its own. */
async function admit(plural: string, obj: Obj, old?: Obj): Promise<{ reply: RestReply; namespace: string }> {
  const body = here(obj);
  const namespace = String(body.metadata?.namespace ?? NS);
  const base = `${GROUP_PATH}/namespaces/${namespace}/${plural}`;
  if (!old) return { reply: await api.call('POST', `${base}?dryRun=All&${STRICT}`, body), namespace };
  const first = here(old);
  const name = `update-${++stored}`;
  (first.metadata as Record<string, unknown>).name = name;
  const created = await api.call('POST', `${base}?${STRICT}`, first);
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  body.metadata = { ...body.metadata, name, resourceVersion: created.body.metadata.resourceVersion };
  return { reply: await api.call('PUT', `${base}/${name}?dryRun=All&${STRICT}`, body), namespace };
}

/** The server's verdict against the table's errors and the validator's result. */
function judge(reply: RestReply, namespace: string, errors: string[], result: ValidationResult<unknown>) {
  const v = verdict(reply, namespace);
  expect(reply.status < 300, JSON.stringify(reply.body)).toBe(errors.length === 0);
  expect(v.fields).toEqual([...new Set(errors)].sort());
  // Both skip the rules after the same schema errors, or neither does.
  expect(v.rulesSkipped).toBe(!result.ok && result.rulesSkipped === true);
  // Each rule the validator says is broken is the server's too: its message, at its field, with its reason.
  for (const e of result.ok ? [] : result.errors) {
    const rule = RULES.get(e.message);
    if (!rule) continue;
    const cause = v.causes.find((c) => c.field === e.path && c.message.includes(rule.message));
    expect(cause, `${e.path}: ${e.message} in ${JSON.stringify(v.causes)}`).toBeDefined();
    expect(cause?.reason).toBe(rule.reason ?? 'FieldValueInvalid');
  }
}

beforeAll(async () => {
  kubectl(cp, ['apply', '--server-side', '--field-manager=e2e', '-k', resolve(ROOT, 'config/crd')]);
  for (const crd of ['proxies', 'proxypools'])
    kubectl(cp, ['wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`]);
  const ns = await api.call('POST', '/api/v1/namespaces', {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: { name: NS },
  });
  expect([201, 409]).toContain(ns.status);
});

afterAll(async () => {
  await api.call('DELETE', `/api/v1/namespaces/${NS}`);
  await api.close();
});

describe('Proxy admission on the real API server', () => {
  it.each(PROXY_CASES)('$name', async ({ obj, old, errors }) => {
    const { reply, namespace } = await admit('proxies', obj, old);
    judge(reply, namespace, errors, validateProxy(obj, old ? { old: old as ProxyObject } : {}));
  });
});

describe('ProxyPool admission on the real API server', () => {
  it.each([...POOL_CASES, ...POOL_SCHEMA_CASES])('$name', async ({ obj, old, errors }) => {
    const { reply, namespace } = await admit('proxypools', obj, old);
    judge(reply, namespace, errors, validateProxyPool(obj, old ? { old: old as unknown as ProxyPool } : {}));
  });
});

describe('where the server refuses before validating', () => {
  it('a namespace the validator refuses cannot exist, so an object in it is refused as not found', async () => {
    const reply = await api.call('POST', '/api/v1/namespaces?dryRun=All', {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: 'crawl.eu' },
    });
    expect(reply.status).toBe(422);
    expect(reply.body.details.causes.map((c: { field: string }) => c.field)).toEqual(['metadata.name']);
  });

  it('without strict field validation the server prunes unknown fields instead of refusing them', async () => {
    const body = here(managed({ replicas: 2 }));
    const reply = await api.call('POST', `${GROUP_PATH}/namespaces/${NS}/proxies?dryRun=All`, body);
    expect(reply.status).toBe(201);
    expect(reply.body.spec).toEqual({ type: 'Managed', provider: 'gcp-main', port: 3128 });
  });
});
