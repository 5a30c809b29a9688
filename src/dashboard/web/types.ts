/**
 * dashboard/web/types — the JSON the dashboard's data routes answer (see docs/dashboard.md), as
 * the page reads it: derived from the routes' schemas (dashboard/schemas). Types only: nothing
 * here reaches the browser after type stripping.
 */
import type { Static } from 'typebox';
import type {
  DashboardStateBody,
  EventKindBody,
  FleetEventBody,
  FleetRowBody,
  FleetTotalsBody,
  LatencyHistoryBody as LatencyHistorySchema,
  LeaseHolderBody,
  LeaseHoldersBody,
  PoolSummaryBody,
  ProviderSummaryBody,
} from '../schemas.ts';

export type FleetRow = Static<typeof FleetRowBody>;
export type PoolSummary = Static<typeof PoolSummaryBody>;
export type PoolCondition = PoolSummary['conditions'][number];
export type ProviderSummary = Static<typeof ProviderSummaryBody>;
export type ProviderTargetSummary = ProviderSummary['targets'][number];
export type EventKind = Static<typeof EventKindBody>;
export type FleetEvent = Static<typeof FleetEventBody>;
export type FleetTotals = Static<typeof FleetTotalsBody>;
export type TargetCooldownRow = FleetRow['targetCooldowns'][number];
export type LeaseHolder = Static<typeof LeaseHolderBody>;
export type LeaseHolders = Static<typeof LeaseHoldersBody>;
/** `GET /v1/dashboard/state`. */
export type DashboardState = Static<typeof DashboardStateBody>;
/** `GET /v1/dashboard/history`. */
export type LatencyHistoryBody = Static<typeof LatencyHistorySchema>;
