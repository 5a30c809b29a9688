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
    pool: Nullable(
      Type.String({
        description:
          'The ProxyPool that owns it (its `crawl.example.com/pool` label), else its `pool` label; null without either.',
      }),
    ),
    poolLabel: Nullable(
      Type.String({ description: 'The label `pool` was read from: selecting on it picks the pool.' }),
    ),
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
    targetCooldowns: Type.Array(
      Type.Object({
        target: Type.String(),
        until: Time(),
        sharedFrom: Nullable(
          Type.Object(
            {
              proxy: Type.String({ description: '"namespace/name" of the proxy that was reported.' }),
              address: Type.String({ description: 'The egress address both leave from.' }),
            },
            {
              description:
                'Set when the cooldown is not its own: another proxy on its egress address was blocked there.',
            },
          ),
        ),
      }),
      { description: 'Per-target cooldowns (`blocked` reports), soonest end first.' },
    ),
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
    selectors: Type.Array(Type.String(), {
      description: 'The label selector that picks its proxies (one per label its members carry the name in).',
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

export const LeaseViaBody = Type.Union(
  [Type.Literal('api'), Type.Literal('gateway'), Type.Literal('gateway-share')],
  {
    description:
      "`api`: the lease API; `gateway`: a gateway connection; `gateway-share`: a gateway replica's share of the proxy.",
  },
);

export const LeaseHolderBody = Type.Object(
  {
    id: Type.String({
      description: 'The first 8 characters of the lease id: enough to recognise it, not to use it.',
    }),
    proxy: Type.String({ description: '"namespace/name".' }),
    target: Nullable(Type.String()),
    grantedAt: Nullable(Time('null for a lease restored after a restart (not kept).')),
    expiresAt: Time(),
    via: Nullable(LeaseViaBody),
  },
  { description: 'One live lease; never its full id.' },
);

export const LeaseHoldersBody = Type.Object(
  {
    total: Type.Integer({ description: 'Live leases.' }),
    api: Type.Integer(),
    gateway: Type.Integer(),
    gatewayShare: Type.Integer(),
    restored: Type.Integer({ description: 'Restored after a restart: origin and age not kept.' }),
    newest: Type.Array(LeaseHolderBody, { description: 'The newest ones, newest first, at most 50.' }),
    more: Type.Integer({ description: 'Live leases not listed.' }),
  },
  { description: 'Who holds which lease for which target.' },
);

export const EventKindBody = Type.Union([
  Type.Literal('added'),
  Type.Literal('deleted'),
  Type.Literal('phase'),
  Type.Literal('healthy'),
  Type.Literal('unhealthy'),
  Type.Literal('blocked'),
  Type.Literal('shared-block'),
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
    revision: Type.Integer({
      description:
        'The revision of the rows this answer is from: ask with `since` set to it to be sent only what changes after.',
    }),
    full: Type.Boolean({
      description:
        'true: `proxies` is the fleet in key order (from after `from`, at most `limit` rows), replacing what the viewer held; false: only the rows changed after `since`, and `removed`.',
    }),
    proxies: Type.Array(FleetRowBody),
    removed: Type.Array(Type.String(), {
      description: '"namespace/name" of the proxies gone after `since` (empty in a full answer).',
    }),
    next: Nullable(
      Type.String({ description: 'A full answer cut short by `limit`: ask again with `from` set to this.' }),
    ),
    pools: Type.Array(PoolSummaryBody),
    leases: LeaseHoldersBody,
    providers: Type.Array(ProviderSummaryBody),
    events: Type.Array(FleetEventBody, { description: 'The events after `?after=`.' }),
    lastEvent: Type.Integer({ description: 'seq of the newest event (0 when none yet).' }),
  },
  {
    description:
      'The totals and panels now, the proxies that changed after `?since=` (or the fleet, in pages), plus the events after `?after=`.',
  },
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
    since: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: Number.MAX_SAFE_INTEGER,
        description:
          'The `revision` the viewer holds: only the rows changed after it are sent. A revision the server no longer (or never) had gets a full answer.',
      }),
    ),
    from: Type.Optional(
      Type.String({
        maxLength: 512,
        description:
          'Continue a full load: the rows after this "namespace/name" (the `next` of the last page).',
      }),
    ),
    limit: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 100_000, description: 'At most this many rows in a full answer.' }),
    ),
  },
  { additionalProperties: false },
);

export const DashboardHistoryQuery = Type.Object(
  {
    proxies: Type.Optional(
      Type.String({
        maxLength: 8192,
        description:
          'Only these proxies\' series: "namespace/name" keys separated by commas (the rows a page shows). Default: every proxy.',
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
