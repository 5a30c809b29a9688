/**
 * lease/options — how a lease store is configured: timings, cooldown defaults, the bounds on
 * memory.
 */
import type { Logger } from 'pino';
import type { Clock } from '../runtime/clock.ts';

export const DEFAULT_MAX_ACTIVE_LEASES = 100_000;
export const DEFAULT_DRAIN_TIMEOUT_MS = 10 * 60_000;

export interface LeaseStoreOptions {
  clock?: Clock;
  log?: Logger;
  /** Called with the proxy key when a lease reports `failed`: re-probe it now. */
  requestProbe?: (key: string) => void;
  defaultTtlSeconds?: number;
  maxTtlSeconds?: number;
  blockedCooldownSeconds?: number;
  failedCooldownSeconds?: number;
  /** How often expired leases are released without traffic. Default 1000 ms. */
  sweepIntervalMs?: number;
  /** Bound on cached (namespace, selector) views. Default 64. */
  maxViews?: number;
  /**
   * Proxies a grant may skip for cooldowns of its target before the view keeps a per-target
   * view for it (tests set it low to exercise that path). Default 32.
   */
  hotTargetSkips?: number;
  /** Live leases at most; a grant beyond answers TooManyLeasesError. Default 100,000. */
  maxActiveLeases?: number;
  /** Per-target cooldown entries at most, fleet-wide; the soonest-ending is evicted first. Default 200,000. */
  maxTargetCooldowns?: number;
  /** Called once per per-target cooldown evicted by the cap (a metric counts them). */
  onCooldownEvicted?: () => void;
  /** A draining proxy's leases are not renewed past drain start + this. Default 10 min. */
  drainTimeoutMs?: number;
  /** How long a released or expired lease id stays reportable. Default 15 min. */
  reportableAfterEndMs?: number;
  /**
   * Bytes at most for the ended leases API clients may still report (lease/ended); past it the
   * oldest is forgotten before its time and `onEndedLeaseEvicted` says so. Default 64 MiB.
   */
  endedLeaseBytes?: number;
  /** The same for gateway connection leases a sticky session may still report. Default 16 MiB. */
  endedConnectionBytes?: number;
  /** Called once per ended lease forgotten early for want of budget, with who held it. */
  onEndedLeaseEvicted?: (holder: 'client' | 'session') => void;
  /**
   * Whether the instance (providerID) a proxy serves from checks credentials per lease (the
   * local provider, through LeaseStore.acceptsLeaseCredentials): grants on it then carry
   * credentials of their own instead of the proxy's. Default: none does.
   */
  perLeaseCredentials?: (instance: string) => boolean;
}
