/**
 * Property: for any sequence of writes, a watcher that resumes from any retained
 * resourceVersion and applies the events to the state it had then ends with exactly the
 * engine's current state — what an informer relies on after a reconnect. Versions strictly
 * increase and no-op writes emit nothing.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ObjectEngine } from '../../../src/runtime/objects/engine.ts';
import type { EngineEvent } from '../../../src/runtime/objects/types.ts';
import { PROXY_RESOURCE, type StoredObject } from '../../../src/runtime/objects/types.ts';
import { StoreError } from '../../../src/runtime/store.ts';
import { TEST_SEED } from '../../support/random.ts';

type Op =
  | { k: 'create'; n: number; pool: string }
  | { k: 'spec'; n: number; port: number }
  | { k: 'status'; n: number; phase: string }
  | { k: 'finalize'; n: number }
  | { k: 'unfinalize'; n: number }
  | { k: 'delete'; n: number }
  | { k: 'relabel'; n: number; pool: string };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ k: fc.constant('create' as const), n: fc.nat(4), pool: fc.constantFrom('eu', 'us') }),
  fc.record({ k: fc.constant('spec' as const), n: fc.nat(4), port: fc.constantFrom(1, 2) }),
  fc.record({ k: fc.constant('status' as const), n: fc.nat(4), phase: fc.constantFrom('Ready', 'Failed') }),
  fc.record({ k: fc.constant('finalize' as const), n: fc.nat(4) }),
  fc.record({ k: fc.constant('unfinalize' as const), n: fc.nat(4) }),
  fc.record({ k: fc.constant('delete' as const), n: fc.nat(4) }),
  fc.record({ k: fc.constant('relabel' as const), n: fc.nat(4), pool: fc.constantFrom('eu', 'us') }),
);

function apply(engine: ObjectEngine, op: Op): void {
  const px = engine.collection(PROXY_RESOURCE);
  const name = `p${op.n}`;
  const cur = px.get('ns', name);
  try {
    switch (op.k) {
      case 'create':
        px.create({ metadata: { name, namespace: 'ns', labels: { pool: op.pool } }, spec: { port: 1 } });
        break;
      case 'spec':
        if (cur) px.update({ ...cur, spec: { port: op.port } });
        break;
      case 'status':
        px.patch('merge', { status: { phase: op.phase } }, { namespace: 'ns', name, subresource: 'status' });
        break;
      case 'finalize':
        if (cur) px.update({ ...cur, metadata: { ...cur.metadata, finalizers: ['f'] } });
        break;
      case 'unfinalize':
        if (cur) px.update({ ...cur, metadata: { ...cur.metadata, finalizers: [] } });
        break;
      case 'delete':
        px.delete('ns', name);
        break;
      case 'relabel':
        if (cur) px.update({ ...cur, metadata: { ...cur.metadata, labels: { pool: op.pool } } });
        break;
    }
  } catch (e) {
    if (!(e instanceof StoreError)) throw e;
  }
}

const byName = (objs: StoredObject[]) => Object.fromEntries(objs.map((o) => [o.metadata.name, o]));

describe('engine watch history (property)', () => {
  it('resuming from any retained version reconstructs the current state', () => {
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 40 }), fc.array(opArb, { maxLength: 40 }), (before, after) => {
        const engine = new ObjectEngine();
        const px = engine.register(PROXY_RESOURCE);
        for (const op of before) apply(engine, op);
        const resumeRv = String(engine.resourceVersion);
        const state = byName(px.list().items);
        const euState = byName(px.list({ labelSelector: 'pool=eu' }).items);
        const all: EngineEvent[] = [];
        engine.onCommit((e) => all.push(e));
        for (const op of after) apply(engine, op);
        for (let i = 1; i < all.length; i++) {
          expect((all[i] as EngineEvent).rv).toBeGreaterThan((all[i - 1] as EngineEvent).rv);
        }
        px.watch({ resourceVersion: resumeRv }, (e) => {
          if (e.type === 'DELETED') delete state[e.object.metadata.name];
          else state[e.object.metadata.name] = e.object;
        }).stop();
        expect(state).toEqual(byName(px.list().items));
        // A selector-filtered watcher sees objects enter and leave the set as ADDED / DELETED.
        const eu = euState;
        px.watch({ resourceVersion: resumeRv, labelSelector: 'pool=eu' }, (e) => {
          if (e.type === 'DELETED') delete eu[e.object.metadata.name];
          else eu[e.object.metadata.name] = e.object;
        }).stop();
        expect(eu).toEqual(byName(px.list({ labelSelector: 'pool=eu' }).items));
      }),
      { numRuns: 200, seed: TEST_SEED },
    );
  });
});
