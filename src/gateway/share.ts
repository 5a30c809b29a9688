/**
 * gateway/share — the protocol between the leader's gateway hub (gateway/hub) and every
 * replica's gateway (gateway/replica, gateway/link) on `POST /v1/internal/gateway/sync`
 * (docs/architecture.md, "Gateway scale-out"): a replica asks for a share of each upstream's
 * capacity (slot leases the leader holds for it), hands back what it no longer needs, reports
 * blocks and failures, and receives the upstream states and per-target cooldowns it has not seen
 * yet (deltas against its cursors; the whole fleet when it has none) and the slots that differ
 * from what it holds. A sync with `waitMs` > 0 and nothing to change is a long poll: the leader
 * answers as soon as a cooldown begins or an upstream changes, so news reaches every replica
 * without polling. Both sides
 * check what they receive against the schemas below: the hub each request (the route table), a
 * replica each answer before it changes anything (`parseSyncAnswer`).
 */
import Type, { type Static, type TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { LocationSchema } from '../api/proxy.ts';
import { schemaErrors } from '../api/schema-errors.ts';
import { LeaseInputError } from '../lease/errors.ts';
import { normalizeTarget } from '../lease/target.ts';
import { MAX_COOLDOWN_SECONDS } from '../lease/types.ts';
import type { GatewayUpstream } from './lease-adapter.ts';

export const SYNC_PATH = '/v1/internal/gateway/sync';
/** The longest a watch may wait for news. */
export const MAX_WAIT_MS = 25_000;
const MAX_REPORTS = 1000;
const MAX_SLOTS_PER_UPSTREAM = 100_000;
const MAX_UPSTREAMS = 100_000;
/** How the map keys of a sync name an upstream. */
export const UPSTREAM_KEY_PATTERN = '^[^/]+/[^/]+$';
const Result = Type.Union([Type.Literal('blocked'), Type.Literal('failed')]);
const Upstream = Type.String({ maxLength: 512, description: '`namespace/name` of the upstream.' });
const Target = Type.String({ maxLength: 253 });
const counter = (description: string) =>
  Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER, description });
const leaseIds = (description: string) =>
  Type.Array(Type.String({ maxLength: 128 }), { maxItems: MAX_SLOTS_PER_UPSTREAM, description });

/** A map keyed by upstream (`namespace/name`). */
function byUpstream<T extends TSchema>(value: T, description: string) {
  return Type.Record(Type.String(), value, {
    propertyNames: { pattern: UPSTREAM_KEY_PATTERN },
    maxProperties: MAX_UPSTREAMS,
    description,
  });
}

export const SyncReportBody = Type.Object(
  {
    upstream: Type.String({ maxLength: 512, pattern: UPSTREAM_KEY_PATTERN }),
    target: Type.Optional(
      Type.String({
        maxLength: 253,
        description: 'The target host that blocked it (required for `blocked`).',
      }),
    ),
    result: Result,
    cooldownSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_COOLDOWN_SECONDS,
        description: "A cooldown instead of the store's default (a rate limit's Retry-After).",
      }),
    ),
  },
  { additionalProperties: false },
);

export const SessionAnswerBody = Type.Object(
  { ask: Type.String({ maxLength: 64 }), upstream: Upstream, target: Target },
  { additionalProperties: false },
);

/**
 * A replica's sync. Fields this version does not know are ignored rather than refused: during a
 * rolling upgrade replicas of two versions sync with one leader.
 */
export const SyncRequestBody = Type.Object(
  {
    replica: Type.String({
      pattern: '^[A-Za-z0-9._:-]{1,128}$',
      description: "This process's id, unique per process run.",
    }),
    epoch: Type.String({
      maxLength: 64,
      description:
        "The hub epoch the replica's cursor belongs to ('' = none yet): another epoch means a full answer.",
    }),
    cursor: counter('The last cooldown change the replica has seen.'),
    waitMs: Type.Integer({
      minimum: 0,
      maximum: MAX_WAIT_MS,
      description: 'How long the leader may hold the answer for news (0 = answer now).',
    }),
    held: Type.Optional(
      byUpstream(
        leaseIds('Lease ids'),
        'Slot lease ids the replica holds: a new leader adopts them instead of granting anew.',
      ),
    ),
    want: Type.Optional(
      byUpstream(
        Type.Integer({ minimum: 0, maximum: MAX_SLOTS_PER_UPSTREAM }),
        'Slot leases wanted (the hub grows a share up to it, capacity permitting).',
      ),
    ),
    release: Type.Optional(leaseIds('Slot leases handed back.')),
    reports: Type.Optional(Type.Array(SyncReportBody, { maxItems: MAX_REPORTS })),
    askCursor: Type.Optional(
      counter('The newest session ask (`SessionAsk.n`) the replica has seen in this epoch.'),
    ),
    shareToken: Type.Optional(
      Type.String({
        maxLength: 64,
        description:
          "The hub's `shareToken` from the last answer: `want` then lists only the upstreams whose wanted share changed (0 = none) and `held` may be left out. Without it, `want` is the whole share wanted.",
      }),
    ),
    upstreamCursor: Type.Optional(
      counter(
        'The last upstream change the replica has seen in this epoch (0 = none). Sent, it asks for deltas: the upstreams changed since, the removed ones, and only the slots that differ from `held`.',
      ),
    ),
    sessionAnswers: Type.Optional(
      Type.Array(SessionAnswerBody, {
        maxItems: MAX_REPORTS,
        description: 'Session reports this replica applied for the leader (answers to `sessionAsks`).',
      }),
    ),
  },
  { description: "A gateway replica's sync with the leader's hub." },
);
export type SyncRequest = Static<typeof SyncRequestBody>;
export type SyncReport = Static<typeof SyncReportBody>;
export type SessionAnswer = Static<typeof SessionAnswerBody>;

const SessionAskBody = Type.Object({
  ask: Type.String({ maxLength: 128 }),
  n: Type.Integer({
    minimum: 0,
    description:
      "Its number in the hub's epoch: a watch sent with `askCursor` below the newest one is answered at once.",
  }),
  session: Type.String({ maxLength: 512 }),
  result: Type.Union([Type.Literal('success'), Type.Literal('blocked'), Type.Literal('failed')]),
  target: Type.Optional(Type.String({ maxLength: 2048 })),
});
/** A `POST /v1/sessions/{id}/report` the leader could not apply itself: whoever knows the session does. */
export type SessionAsk = Static<typeof SessionAskBody>;

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

const UpstreamKey = Type.String({ minLength: 3, maxLength: 512, pattern: UPSTREAM_KEY_PATTERN });

const UpstreamStateBody = Type.Object({
  key: UpstreamKey,
  namespace: Type.String({ maxLength: 253 }),
  labels: Type.Record(Type.String(), Type.String()),
  location: Type.Optional(LocationSchema),
  maxLeases: Type.Integer({ minimum: 0, description: '0 = unlimited.' }),
  reason: Nullable(
    Type.Union(
      [
        Type.Literal('NotReady'),
        Type.Literal('Deleting'),
        Type.Literal('Unhealthy'),
        Type.Literal('Draining'),
        Type.Literal('CoolingDown'),
        Type.Literal('CoolingDownForTarget'),
        Type.Literal('AtCapacity'),
      ],
      {
        description: 'Why no connection may use it now, capacity and target cooldowns aside; null = usable.',
      },
    ),
  ),
  latencyMillis: Nullable(Type.Number({ minimum: 0 })),
  contended: Type.Optional(
    Type.Boolean({ description: 'A replica was refused a larger share lately: idle shares should go back.' }),
  ),
});
/** An upstream as a replica keeps it: the leader's view of the proxy, without its cooldowns. */
export interface UpstreamState extends Omit<GatewayUpstream, 'cooldowns'> {
  /** A replica was refused a larger share lately: idle shares should go back (gateway/replica). */
  contended?: boolean;
}

const SlotBody = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 128 }),
  url: Type.String({
    maxLength: 2048,
    description: "The upstream's URL with the credentials this slot lease carries.",
  }),
});
export type Slot = Static<typeof SlotBody>;

/**
 * A hub's answer. Fields this version does not know are ignored by a replica rather than refused,
 * so a newer leader may add some during a rolling upgrade.
 */
export const SyncAnswerBody = Type.Object({
  epoch: Type.String({ maxLength: 64 }),
  cursor: Type.Integer({ minimum: 0 }),
  full: Type.Boolean({
    description: '`cooldowns` replaces what the replica knows (true) or adds to it (false).',
  }),
  cooldowns: Type.Array(
    Type.Tuple([UpstreamKey, Type.String({ minLength: 1, maxLength: 253 }), Type.Number()]),
    {
      description:
        '[upstream, target, milliseconds left]: left rather than an end time, so clocks need not agree.',
    },
  ),
  upstreams: Type.Array(UpstreamStateBody, { maxItems: MAX_UPSTREAMS }),
  upstreamCursor: Type.Optional(
    Type.Integer({ minimum: 0, description: 'The last upstream change this answer includes.' }),
  ),
  upstreamsFull: Type.Optional(
    Type.Boolean({
      description:
        "`upstreams` is the whole fleet (true, or absent) or only the upstreams changed since the request's `upstreamCursor` (false).",
    }),
  ),
  removed: Type.Optional(
    Type.Array(UpstreamKey, {
      maxItems: MAX_UPSTREAMS,
      description: 'Upstreams gone from the fleet since `upstreamCursor` (with `upstreamsFull` false).',
    }),
  ),
  slots: Type.Optional(
    Type.Record(Type.String(), Type.Array(SlotBody, { maxItems: MAX_SLOTS_PER_UPSTREAM }), {
      description:
        "The replica's share, when the request was a mutating one (not a pure watch): all of it, or with `slotsPartial` only the upstreams whose slots differ from the request's `held`.",
    }),
  ),
  shareToken: Type.Optional(
    Type.String({
      maxLength: 64,
      description:
        "Names the hub's record of this replica's share: sent back, the next request may be a delta. An answer with a token other than the one sent had the request's share changes ignored: send the whole share.",
    }),
  ),
  slotsPartial: Type.Optional(
    Type.Boolean({ description: 'Upstreams missing from `slots` keep the slots the replica holds.' }),
  ),
  sessionAsks: Type.Optional(
    Type.Array(SessionAskBody, {
      description: 'Session reports waiting for the replica that knows the session.',
    }),
  ),
  replicas: Type.Optional(
    Type.Integer({
      minimum: 0,
      description: "Gateway replicas holding or asking for a share now (for a replica's fair share).",
    }),
  ),
});

export interface SyncAnswer {
  epoch: string;
  cursor: number;
  full: boolean;
  cooldowns: [string, string, number][];
  upstreams: UpstreamState[];
  upstreamCursor?: number;
  upstreamsFull?: boolean;
  removed?: string[];
  slots?: Record<string, Slot[]>;
  shareToken?: string;
  slotsPartial?: boolean;
  sessionAsks?: SessionAsk[];
  replicas?: number;
}

const answerCheck = Compile(SyncAnswerBody);

/**
 * A hub's answer checked before a replica applies any of it: the schema, then what a schema
 * cannot say (a slot's URL parses, a cooldown's target is a normalised host). SyncInputError
 * names the first bad field.
 */
export function parseSyncAnswer(body: unknown): SyncAnswer {
  if (!answerCheck.Check(body)) {
    const first = schemaErrors(body, [...answerCheck.Errors(body)], [], SyncAnswerBody)[0];
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

/** A sync answer a replica refused, naming the field. */
export class SyncInputError extends Error {
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field}: ${message}`);
    this.field = field;
  }
}

/** What the schema cannot say: a `blocked` report needs the target that blocked. */
export function syncRequestProblem(req: SyncRequest): { field: string; message: string } | undefined {
  const i = req.reports?.findIndex((r) => r.result === 'blocked' && r.target === undefined) ?? -1;
  if (i < 0) return undefined;
  return { field: `reports[${i}].target`, message: `reports[${i}].target is required for result "blocked"` };
}

/** Whether the request changes anything at the hub (otherwise it is a watch and may wait). */
export function isMutating(req: SyncRequest): boolean {
  return (
    req.shareToken !== undefined ||
    req.held !== undefined ||
    req.want !== undefined ||
    (req.release?.length ?? 0) > 0 ||
    (req.reports?.length ?? 0) > 0 ||
    (req.sessionAnswers?.length ?? 0) > 0
  );
}
