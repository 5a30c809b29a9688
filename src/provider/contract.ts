/**
 * provider/contract — what every compute backend implements. The reconciler, orphan sweep and provider
 * health monitor only ever see these types, never a backend SDK.
 */
import type { Logger } from 'pino';
import type { Credentials } from '../api/credentials.ts';
import type { Location } from '../api/location.ts';
import type { TargetCheck } from '../api/providerhealth.ts';

export const INSTANCE_STATES = [
  'Pending',
  'Running',
  'Stopping',
  'Stopped',
  'Terminated',
  'Unknown',
] as const;
export type InstanceState = (typeof INSTANCE_STATES)[number];

/** Per-call context: cancellation, logging and (implicitly, via OTel context) tracing. */
export interface CallContext {
  /** Every call stops promptly when this aborts. */
  signal: AbortSignal;
  log: Logger;
}

export interface CreateRequest {
  /** Deterministic instance name (see naming.ts); create is idempotent by it. */
  name: string;
  /** Proxy identity, stamped on the instance as labels/tags. */
  uid: string;
  /**
   * The installation (operator fleet) creating it, stamped beside the UID. The reconciler
   * always sets it; the orphan sweep and adoption of other installations leave such instances alone.
   */
  installation?: string;
  namespace: string;
  proxyName: string;
  zone?: string;
  machineType?: string;
  image?: string;
  /** Port the proxy listens on. */
  port: number;
  /**
   * The source address the Proxy's traffic left from before (`status.egressIP`): a provider
   * that assigns source addresses (local `egressAddresses`) keeps it when it can.
   */
  egressIP?: string;
  /** cloud-init user-data; never logged. */
  cloudInit?: string;
  /** Basic auth the proxy must require; never logged. */
  credentials: Credentials;
}

export interface Instance {
  /** Self-contained provider ID, e.g. `hosts/nas1/domains/px-…`. */
  id: string;
  name: string;
  state: InstanceState;
  address?: string;
  /** Port clients connect to, when the backend decides it (local provider). */
  port?: number;
  /** The source address its upstream connections use, when the backend assigns one (local). */
  egressIP?: string;
  /**
   * Where it runs, as far as the backend knows (api/location `locationOf` keeps only values a
   * selector can name). Absent when unknown, e.g. a Pod not scheduled yet.
   */
  location?: Location;
  /** Read back from the backend's labels: GC relies on them. */
  uid?: string;
  namespace?: string;
  /** The installation label read back; absent on instances created before installations existed. */
  installation?: string;
  createdAt?: Date;
}

export interface Provider {
  /** Provider name from the config (e.g. `gcp-main`). */
  readonly name: string;
  /** Provider type (kubernetes, gcp, kvm, local, aws). */
  readonly type: string;
  create(ctx: CallContext, req: CreateRequest): Promise<Instance>;
  /** Throws a NotFound-class error when the instance is gone. */
  get(ctx: CallContext, providerID: string): Promise<Instance>;
  /** Idempotent: an instance already gone is success. */
  delete(ctx: CallContext, providerID: string): Promise<void>;
  /** Every managed instance of every installation (each with its labels), for orphan sweep. */
  listByTag(ctx: CallContext): Promise<Instance[]>;
  /**
   * Stamps `installation` on an instance that has no installation label yet (adoption of
   * instances created before installations existed). Optional: a backend that cannot relabel
   * leaves the instance unlabelled, and its owner then recognises it by the Proxy UID alone.
   */
  adopt?(ctx: CallContext, providerID: string, installation: string): Promise<void>;
  /**
   * Gives a running instance a new external address in place (pool rotation `strategy: Restart`):
   * stops and starts it, following the backend's operations. Optional: only backends whose
   * instance gets a new IP from a stop/start implement it (gcp; see `canRestart`).
   *
   * Idempotent for one `since` (when the restart was decided, recorded by the caller before the
   * first call): an instance already stopped, or started again, at or after `since` is not
   * stopped again. Resolves to the instance Running with its new address once it runs again
   * after such a stop; while the stop or the start is still under way, to the instance as it is
   * (Stopping, Stopped, Pending), and the caller calls again. NotFound when it is gone.
   */
  restart?(ctx: CallContext, providerID: string, since: Date): Promise<Instance>;
  /** Release connections, listeners, timers. */
  close?(): Promise<void>;
}

export interface Checker {
  /** One verdict per backend target; never throws. */
  check(ctx: CallContext): Promise<TargetCheck[]>;
}

/** Whether `p` can give a running instance a new IP in place (it implements `restart`). */
export function canRestart(p: Provider): p is Provider & { restart: NonNullable<Provider['restart']> } {
  return typeof p.restart === 'function';
}

export function isChecker(p: unknown): p is Checker {
  return typeof (p as Partial<Checker> | null)?.check === 'function';
}
