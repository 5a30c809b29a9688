/**
 * gateway/share — the protocol between the leader's gateway hub (gateway/hub) and every
 * replica's gateway (gateway/replica, gateway/link) on `POST /v1/internal/gateway/sync`
 * (docs/architecture.md, "Gateway scale-out"): a replica asks for a share of each upstream's
 * capacity (slot leases the leader holds for it), hands back what it no longer needs, reports
 * blocks and failures, and receives every upstream's state plus the per-target cooldowns it has
 * not seen yet. A sync with `waitMs` > 0 and nothing to change is a long poll: the leader answers
 * as soon as a cooldown begins, so a block reaches every replica without polling. Both sides
 * check what they receive: the hub each request field by field, a replica each answer against
 * a TypeBox schema before it changes anything.
 */
import Type, { type Static } from 'typebox';
import { Compile } from 'typebox/compile';
import { schemaErrors } from '../api/schema-errors.ts';
import type { GatewayUpstream } from '../lease/store.ts';
import { LeaseInputError, normalizeTarget } from '../lease/target.ts';
import type { ReportResult } from '../lease/types.ts';

export const SYNC_PATH = '/v1/internal/gateway/sync';
/** The longest a watch may wait for news. */
export const MAX_WAIT_MS = 25_000;
const MAX_REPORTS = 1000;
const MAX_SLOTS_PER_UPSTREAM = 100_000;
const MAX_UPSTREAMS = 100_000;
const REPLICA_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export interface SyncReport {
  /** `namespace/name` of the upstream. */
  upstream: string;
  /** The target host that blocked it (required for `blocked`). */
  target?: string;
  result: 'blocked' | 'failed';
}

export interface SyncRequest {
  /** This process's id, unique per process run. */
  replica: string;
  /** The hub epoch the replica's cursor belongs to ('' = none yet): another epoch means a full answer. */
  epoch: string;
  /** The last cooldown change the replica has seen. */
  cursor: number;
  /** How long the leader may hold the answer for news (0 = answer now). */
  waitMs: number;
  /** Slot lease ids the replica holds per upstream: a new leader adopts them instead of granting anew. */
  held?: Record<string, string[]>;
  /** Slot leases wanted per upstream (the hub grows a share up to it, capacity permitting). */
  want?: Record<string, number>;
  /** Slot leases handed back (the replica no longer counts them). */
  release?: string[];
  reports?: SyncReport[];
  /** The newest session ask (`SessionAsk.n`) the replica has seen in this epoch. */
  askCursor?: number;
  /** Session reports this replica applied for the leader (answers to `sessionAsks`). */
  sessionAnswers?: SessionAnswer[];
}

/** A `POST /v1/sessions/{id}/report` the leader could not apply itself: whoever knows the session does. */
export interface SessionAsk {
  ask: string;
  /** Its number in the hub's epoch: a watch sent with `askCursor` below the newest one is answered at once. */
  n: number;
  session: string;
  result: ReportResult;
  target?: string;
}

export interface SessionAnswer {
  ask: string;
  upstream: string;
  target: string;
}

/** An upstream as a replica keeps it: the leader's view of the proxy, without its cooldowns. */
export interface UpstreamState extends Omit<GatewayUpstream, 'cooldowns'> {
  /** A replica was refused a larger share lately: idle shares should go back (gateway/replica). */
  contended?: boolean;
}

export interface Slot {
  id: string;
  /** The upstream's URL with the credentials this slot lease carries. */
  url: string;
}

export interface SyncAnswer {
  epoch: string;
  cursor: number;
  /** `cooldowns` replaces what the replica knows (true) or adds to it (false). */
  full: boolean;
  /** [upstream, target, milliseconds left]: left rather than an end time, so clocks need not agree. */
  cooldowns: [string, string, number][];
  upstreams: UpstreamState[];
  /** The replica's whole share, when the request was a mutating one (not a pure watch). */
  slots?: Record<string, Slot[]>;
  /** Session reports waiting for the replica that knows the session. */
  sessionAsks?: SessionAsk[];
  /** Gateway replicas holding or asking for a share now (for a replica's fair share). */
  replicas?: number;
}

const UpstreamKey = Type.String({ minLength: 3, maxLength: 512, pattern: '^[^/]+/[^/]+$' });

/**
 * A sync answer as a replica accepts it. Unknown fields are ignored rather than refused, so a
 * newer leader may add some during a rolling upgrade.
 */
const SyncAnswerSchema = Type.Object({
  epoch: Type.String({ maxLength: 64 }),
  cursor: Type.Integer({ minimum: 0 }),
  full: Type.Boolean(),
  cooldowns: Type.Array(
    Type.Tuple([UpstreamKey, Type.String({ minLength: 1, maxLength: 253 }), Type.Number()]),
  ),
  upstreams: Type.Array(
    Type.Object({
      key: UpstreamKey,
      namespace: Type.String({ maxLength: 253 }),
      labels: Type.Record(Type.String(), Type.String()),
      maxLeases: Type.Integer({ minimum: 0 }),
      reason: Type.Union([
        Type.Literal('NotReady'),
        Type.Literal('Deleting'),
        Type.Literal('Unhealthy'),
        Type.Literal('Draining'),
        Type.Literal('CoolingDown'),
        Type.Literal('CoolingDownForTarget'),
        Type.Literal('AtCapacity'),
        Type.Null(),
      ]),
      latencyMillis: Type.Union([Type.Number({ minimum: 0 }), Type.Null()]),
      contended: Type.Optional(Type.Boolean()),
    }),
    { maxItems: MAX_UPSTREAMS },
  ),
  slots: Type.Optional(
    Type.Record(
      Type.String(),
      Type.Array(
        Type.Object({
          id: Type.String({ minLength: 1, maxLength: 128 }),
          url: Type.String({ maxLength: 2048 }),
        }),
        {
          maxItems: MAX_SLOTS_PER_UPSTREAM,
        },
      ),
    ),
  ),
  sessionAsks: Type.Optional(
    Type.Array(
      Type.Object({
        ask: Type.String({ maxLength: 128 }),
        n: Type.Integer({ minimum: 0 }),
        session: Type.String({ maxLength: 512 }),
        result: Type.Union([Type.Literal('success'), Type.Literal('blocked'), Type.Literal('failed')]),
        target: Type.Optional(Type.String({ maxLength: 2048 })),
      }),
    ),
  ),
  replicas: Type.Optional(Type.Integer({ minimum: 0 })),
});

/** The schema describes exactly what SyncAnswer says (a compile error if they drift apart). */
const _sameShape: (a: Static<typeof SyncAnswerSchema>) => SyncAnswer = (a) => a;
void _sameShape;

const answerCheck = Compile(SyncAnswerSchema);

/**
 * A hub's answer checked before a replica applies any of it: the schema, then what a schema
 * cannot say (a slot's URL parses, a cooldown's target is a host). SyncInputError names the
 * first bad field.
 */
export function parseSyncAnswer(body: unknown): SyncAnswer {
  if (!answerCheck.Check(body)) {
    const first = schemaErrors(body, [...answerCheck.Errors(body)])[0];
    throw new SyncInputError(first?.path || 'answer', first?.message ?? 'is not a sync answer');
  }
  const a = body as SyncAnswer;
  for (const [key, slots] of Object.entries(a.slots ?? {})) {
    slots.forEach((s, i) => {
      if (s.url !== '' && !URL.canParse(s.url))
        throw new SyncInputError(`slots.${key}[${i}].url`, 'is not a URL');
    });
  }
  a.cooldowns.forEach(([, target], i) => {
    try {
      if (normalizeTarget(target) !== target) throw new LeaseInputError('target', 'is not a normalised host');
    } catch (err) {
      if (err instanceof LeaseInputError) throw new SyncInputError(`cooldowns[${i}][1]`, err.message);
      throw err;
    }
  });
  return a;
}

export class SyncInputError extends Error {
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field}: ${message}`);
    this.field = field;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function int(v: unknown, field: string, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) {
    throw new SyncInputError(field, `must be an integer from 0 to ${max}`);
  }
  return v;
}

function str(v: unknown, field: string, max = 512): string {
  if (typeof v !== 'string' || v.length > max)
    throw new SyncInputError(field, `must be a string of at most ${max} characters`);
  return v;
}

function record<T>(v: unknown, field: string, each: (x: unknown, f: string) => T): Record<string, T> {
  if (!isObject(v)) throw new SyncInputError(field, 'must be an object keyed by upstream (namespace/name)');
  const keys = Object.keys(v);
  if (keys.length > MAX_UPSTREAMS) throw new SyncInputError(field, `at most ${MAX_UPSTREAMS} upstreams`);
  const out: Record<string, T> = {};
  for (const k of keys) {
    if (!k.includes('/')) throw new SyncInputError(`${field}.${k}`, 'keys are upstreams as namespace/name');
    out[k] = each(v[k], `${field}.${k}`);
  }
  return out;
}

function ids(v: unknown, field: string): string[] {
  if (!Array.isArray(v) || v.length > MAX_SLOTS_PER_UPSTREAM) {
    throw new SyncInputError(field, `must be an array of at most ${MAX_SLOTS_PER_UPSTREAM} lease ids`);
  }
  return v.map((x, i) => str(x, `${field}[${i}]`, 128));
}

/** The request body checked field by field; SyncInputError names the first bad field. */
export function parseSyncRequest(body: unknown): SyncRequest {
  if (!isObject(body)) throw new SyncInputError('body', 'must be a JSON object');
  const replica = str(body.replica, 'replica', 128);
  if (!REPLICA_ID.test(replica)) throw new SyncInputError('replica', 'must match [A-Za-z0-9._:-]{1,128}');
  const req: SyncRequest = {
    replica,
    epoch: str(body.epoch ?? '', 'epoch', 64),
    cursor: int(body.cursor ?? 0, 'cursor', Number.MAX_SAFE_INTEGER),
    waitMs: int(body.waitMs ?? 0, 'waitMs', MAX_WAIT_MS),
  };
  if (body.askCursor !== undefined) req.askCursor = int(body.askCursor, 'askCursor', Number.MAX_SAFE_INTEGER);
  if (body.held !== undefined) req.held = record(body.held, 'held', ids);
  if (body.want !== undefined)
    req.want = record(body.want, 'want', (x, f) => int(x, f, MAX_SLOTS_PER_UPSTREAM));
  if (body.release !== undefined) req.release = ids(body.release, 'release');
  if (body.reports !== undefined) {
    if (!Array.isArray(body.reports) || body.reports.length > MAX_REPORTS) {
      throw new SyncInputError('reports', `must be an array of at most ${MAX_REPORTS} reports`);
    }
    req.reports = body.reports.map((r, i) => {
      const f = `reports[${i}]`;
      if (!isObject(r)) throw new SyncInputError(f, 'must be an object');
      const upstream = str(r.upstream, `${f}.upstream`, 512);
      if (!upstream.includes('/')) throw new SyncInputError(`${f}.upstream`, 'must be namespace/name');
      if (r.result !== 'blocked' && r.result !== 'failed') {
        throw new SyncInputError(`${f}.result`, 'must be "blocked" or "failed"');
      }
      const out: SyncReport = { upstream, result: r.result };
      if (r.target !== undefined) out.target = str(r.target, `${f}.target`, 253);
      if (r.result === 'blocked' && out.target === undefined) {
        throw new SyncInputError(`${f}.target`, 'is required for result "blocked"');
      }
      return out;
    });
  }
  if (body.sessionAnswers !== undefined) {
    if (!Array.isArray(body.sessionAnswers) || body.sessionAnswers.length > MAX_REPORTS) {
      throw new SyncInputError('sessionAnswers', `must be an array of at most ${MAX_REPORTS} answers`);
    }
    req.sessionAnswers = body.sessionAnswers.map((x, i) => {
      const f = `sessionAnswers[${i}]`;
      if (!isObject(x)) throw new SyncInputError(f, 'must be an object');
      return {
        ask: str(x.ask, `${f}.ask`, 64),
        upstream: str(x.upstream, `${f}.upstream`, 512),
        target: str(x.target, `${f}.target`, 253),
      };
    });
  }
  return req;
}

/** Whether the request changes anything at the hub (otherwise it is a watch and may wait). */
export function isMutating(req: SyncRequest): boolean {
  return (
    req.held !== undefined ||
    req.want !== undefined ||
    (req.release?.length ?? 0) > 0 ||
    (req.reports?.length ?? 0) > 0 ||
    (req.sessionAnswers?.length ?? 0) > 0
  );
}
