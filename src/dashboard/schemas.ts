/**
 * dashboard/schemas — the JSON the dashboard's data routes answer (see docs/dashboard.md), as
 * TypeBox schemas: the route table lists them in the OpenAPI document, and the page's types
 * (web/types) are derived from them.
 */
import Type, { type TSchema } from 'typebox';

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Time = (description?: string) =>
  Type.String({ format: 'date-time', ...(description ? { description } : {}) });

export const FleetRowBody = Type.Object(
  {
    key: Type.String({ description: '"namespace/name".' }),
    namespace: Type.String(),
    name: Type.String(),
    pool: Nullable(Type.String({ description: 'The `crawl.example.com/pool` label, or null.' })),
    provider: Nullable(Type.String({ description: 'spec.provider; "external" for an External proxy.' })),
    phase: Type.String(),
    healthy: Type.Boolean(),
    draining: Type.Boolean(),
    deleting: Type.Boolean(),
    leasable: Type.Boolean(),
    reason: Nullable(Type.String({ description: "Why not leasable now (the lease store's reason)." })),
    latencyMillis: Nullable(Type.Number()),
    activeLeases: Type.Integer(),
    maxLeases: Type.Integer({ description: '0 = unlimited.' }),
    cooldownUntil: Nullable(Time('End of a global cooldown (a `failed` report).')),
    targetCooldowns: Type.Array(Type.Object({ target: Type.String(), until: Time() }), {
      description: 'Per-target cooldowns (`blocked` reports), soonest end first.',
    }),
    egressIP: Nullable(
      Type.String({ description: 'status.egressIP, when the egress-IP check published one.' }),
    ),
    address: Nullable(Type.String({ description: 'host:port clients connect to, null while unaddressed.' })),
    problem: Nullable(Type.String({ description: 'A problem only a person can fix (reason: message).' })),
  },
  { description: 'One proxy as the dashboard shows it; never a credential.' },
);

const PoolConditionBody = Type.Object({
  type: Type.String(),
  status: Type.String({ description: '"True", "False" or "Unknown".' }),
  reason: Nullable(Type.String()),
  message: Nullable(Type.String()),
});

const count = (description?: string) => Nullable(Type.Integer(description ? { description } : {}));

export const PoolSummaryBody = Type.Object(
  {
    key: Type.String({ description: '"namespace/name".' }),
    namespace: Type.String(),
    name: Type.String(),
    object: Type.Boolean({
      description: 'Whether a ProxyPool object exists; false for a label on proxies only.',
    }),
    desired: count('spec.replicas (with its default); null without a ProxyPool.'),
    replicas: count("status.replicas: the pool's proxies not draining away."),
    ready: count(),
    healthy: count(),
    leasable: count(),
    updated: count('Proxies from the current template and within maxAge.'),
    draining: count(),
    activeLeases: Type.Integer(),
    conditions: Type.Array(PoolConditionBody),
    deleting: Type.Boolean(),
    stale: Type.Boolean({ description: 'The status is older than the spec (or missing).' }),
  },
  {
    description:
      'A ProxyPool object, or a pool label some proxies carry with no ProxyPool of that name (`object: false`).',
  },
);

const ProviderTargetSummaryBody = Type.Object({
  name: Type.String(),
  ready: Type.Boolean(),
  reason: Type.String(),
  message: Nullable(Type.String()),
  latencyMillis: Nullable(Type.Number()),
});

export const ProviderSummaryBody = Type.Object({
  name: Type.String(),
  type: Nullable(Type.String()),
  ready: Nullable(Type.Boolean()),
  reason: Nullable(Type.String()),
  targetsReady: Nullable(Type.String()),
  lastCheckTime: Nullable(Time()),
  targets: Type.Array(ProviderTargetSummaryBody),
});

export const EventKindBody = Type.Union([
  Type.Literal('added'),
  Type.Literal('deleted'),
  Type.Literal('phase'),
  Type.Literal('healthy'),
  Type.Literal('unhealthy'),
  Type.Literal('blocked'),
  Type.Literal('failed'),
  Type.Literal('replacing'),
  Type.Literal('replaced'),
  Type.Literal('egress-ip'),
  Type.Literal('pool'),
]);

export const FleetEventBody = Type.Object({
  seq: Type.Integer({
    description: 'Increasing number; the page asks for events after the last one it has.',
  }),
  at: Time(),
  kind: EventKindBody,
  proxy: Nullable(Type.String({ description: '"namespace/name", or null for an event about no one proxy.' })),
  message: Type.String(),
});

export const FleetTotalsBody = Type.Object({
  proxies: Type.Integer(),
  ready: Type.Integer(),
  healthy: Type.Integer(),
  leasable: Type.Integer(),
  activeLeases: Type.Integer(),
  coolingDown: Type.Integer(),
});

export const DashboardStateBody = Type.Object(
  {
    now: Time("The server's clock: time left is counted against it."),
    totals: FleetTotalsBody,
    proxies: Type.Array(FleetRowBody),
    pools: Type.Array(PoolSummaryBody),
    providers: Type.Array(ProviderSummaryBody),
    events: Type.Array(FleetEventBody, { description: 'The events after `?after=`.' }),
    lastEvent: Type.Integer({ description: 'seq of the newest event (0 when none yet).' }),
  },
  { description: 'The fleet now, plus the events after `?after=`.' },
);

export const DashboardStateQuery = Type.Object(
  {
    after: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: Number.MAX_SAFE_INTEGER,
        description: 'Only events with a larger seq (default 0: every event kept).',
      }),
    ),
  },
  { additionalProperties: false },
);

export const LatencyHistoryBody = Type.Object(
  {
    stepSeconds: Type.Integer(),
    end: Time('Start of the newest step; the last value of every series belongs to it.'),
    series: Type.Record(Type.String(), Type.Array(Nullable(Type.Number())), {
      description: 'By proxy; same length for every proxy, null where it was unhealthy or unknown.',
    }),
  },
  { description: 'Mean probe latency per proxy per step, oldest first.' },
);

export const DashboardFileParams = Type.Object({
  file: Type.String({ maxLength: 128, description: 'A file of the page (its scripts and stylesheet).' }),
});
