/**
 * controller/status — pure functions turning what the reconciler decided into a status patch.
 * The reconciler owns some status fields; the health engine owns `Healthy` and `health`.
 * Intents are applied to the FRESHEST object (conditions merged by type, never replaced), and
 * only fields that actually changed go into the merge patch, so an unchanged status costs no
 * write and the other writer's fields are never part of our patch.
 */
import { setCondition } from '../api/conditions.ts';
import { CONDITION_PROVISIONED, DEFAULT_PROXY_PORT, PROVISIONED_REASONS } from '../api/constants.ts';
import type { Location } from '../api/location.ts';
import type { Condition } from '../api/meta.ts';
import type {
  DrainingInstance,
  PendingInstance,
  ProxyObject,
  ProxyPhase,
  ProxyStatus,
  RestartStatus,
} from '../api/proxy.ts';
import { proxyUrl } from '../api/url.ts';
import type { Instance } from '../provider/contract.ts';
import { deepEqual, isPlainObject } from '../runtime/patch.ts';

export interface ConditionIntent {
  status: Condition['status'];
  reason: string;
  message?: string;
}

/** What one reconcile wants the status to say. `null` removes a field; absent leaves it alone. */
export interface StatusIntent {
  phase?: ProxyPhase;
  providerID?: string | null;
  instanceName?: string | null;
  address?: string | null;
  port?: number | null;
  url?: string | null;
  /** The source address the provider assigned (local `egressAddresses`); left alone otherwise. */
  egressIP?: string | null;
  /** Where the current instance runs (the provider's `Instance.location`). */
  location?: Location | null;
  retiring?: string[];
  credentialsGeneration?: number | null;
  /** When the generated credentials were last rotated (spec.credentialsRotation), RFC 3339. */
  credentialsRotatedAt?: string | null;
  pending?: PendingInstance | null;
  /** The in-place restart for a new IP (controller/restart). */
  restart?: RestartStatus | null;
  draining?: DrainingInstance[];
  message?: string | null;
  provisioned?: ConditionIntent;
}

/**
 * Not provisioned, for `reason`: the message goes both to status.message and to the Provisioned
 * condition. With `phase` (e.g. Failed) the phase moves too; without it, it stays.
 */
export function notProvisioned(reason: string, message: string, phase?: ProxyPhase): StatusIntent {
  return {
    ...(phase ? { phase } : {}),
    message,
    provisioned: { status: 'False', reason, message },
  };
}

/** Serving from instance `inst` (named `name`): Ready, with its address, port and URL. */
export function readyIntent(p: ProxyObject, inst: Instance, name: string, generation?: number): StatusIntent {
  const port = inst.port ?? p.spec.port ?? DEFAULT_PROXY_PORT;
  const address = inst.address ?? '';
  return {
    phase: 'Ready',
    providerID: inst.id,
    instanceName: name,
    ...(generation ? { credentialsGeneration: generation } : {}),
    address,
    port,
    url: proxyUrl(address, port),
    // Only a provider that assigns the source address says so; the egress-IP check owns the rest.
    ...(inst.egressIP ? { egressIP: inst.egressIP } : {}),
    location: locationIntent(inst),
    message: null,
    provisioned: {
      status: 'True',
      reason: PROVISIONED_REASONS.running,
      message: `instance ${name} is running`,
    },
  };
}

/** Instance `inst` exists but does not serve yet: Provisioning, no address. */
export function provisioningIntent(inst: Instance, name: string, generation?: number): StatusIntent {
  return {
    phase: 'Provisioning',
    providerID: inst.id,
    instanceName: name,
    ...(generation ? { credentialsGeneration: generation } : {}),
    address: null,
    port: null,
    url: null,
    location: locationIntent(inst),
    message: null,
    provisioned: {
      status: 'False',
      reason: PROVISIONED_REASONS.provisioning,
      message: `waiting for instance ${name} (${inst.state})`,
    },
  };
}

/**
 * The location of the instance now recorded: what its provider says, and nothing when it says
 * nothing — a location left over from an earlier instance would place this one wrongly.
 */
function locationIntent(inst: Instance): Location | null {
  return inst.location ? { ...inst.location } : null;
}

/** The recorded instance died for good and is being deleted to be recreated. */
export function lostIntent(message: string): StatusIntent {
  return {
    phase: 'Provisioning',
    address: null,
    port: null,
    url: null,
    location: null,
    provisioned: { status: 'False', reason: PROVISIONED_REASONS.lost, message },
  };
}

/** The status fields the reconciler writes; everything else belongs to someone else. */
export const RECONCILER_FIELDS = [
  'phase',
  'providerID',
  'instanceName',
  'address',
  'port',
  'url',
  'egressIP',
  'location',
  'retiring',
  'credentialsGeneration',
  'credentialsRotatedAt',
  'pending',
  'restart',
  'draining',
  'message',
  'observedGeneration',
  'conditions',
] as const;

export function applyIntent(
  base: ProxyStatus | undefined,
  intent: StatusIntent,
  now: string,
  generation: number | undefined,
): ProxyStatus {
  const next: ProxyStatus = structuredClone(base ?? {});
  const set = <K extends keyof ProxyStatus>(k: K, v: ProxyStatus[K] | null | undefined) => {
    if (v === undefined) return;
    if (v === null) delete next[k];
    else next[k] = v;
  };
  set('phase', intent.phase);
  set('providerID', intent.providerID);
  set('instanceName', intent.instanceName);
  set('address', intent.address);
  set('port', intent.port);
  set('url', intent.url);
  set('egressIP', intent.egressIP);
  set('location', intent.location);
  set('message', intent.message);
  set('credentialsGeneration', intent.credentialsGeneration);
  set('credentialsRotatedAt', intent.credentialsRotatedAt);
  set('pending', intent.pending);
  set('restart', intent.restart);
  if (intent.draining !== undefined) {
    if (intent.draining.length === 0) delete next.draining;
    else next.draining = intent.draining;
  }
  if (intent.retiring !== undefined) {
    if (intent.retiring.length === 0) delete next.retiring;
    else next.retiring = [...new Set(intent.retiring)];
  }
  if (intent.provisioned) {
    const { status, reason, message } = intent.provisioned;
    next.conditions = setCondition(
      next.conditions,
      {
        type: CONDITION_PROVISIONED,
        status,
        reason,
        ...(message ? { message } : {}),
        ...(generation !== undefined ? { observedGeneration: generation } : {}),
      },
      now,
    );
  }
  if (generation !== undefined) next.observedGeneration = generation;
  return next;
}

/**
 * The merge patch taking `base` to `next` over the reconciler's fields only, or undefined when
 * nothing changed. `conditions` goes whole (merge patch replaces arrays), built from `base`.
 */
export function statusPatch(
  base: ProxyStatus | undefined,
  next: ProxyStatus,
): Record<string, unknown> | undefined {
  const patch: Record<string, unknown> = {};
  for (const k of RECONCILER_FIELDS) {
    const a = base?.[k];
    const b = next[k];
    if (!sameJson(a, b)) patch[k] = b === undefined ? null : objectPatch(a, b);
  }
  return Object.keys(patch).length > 0 ? patch : undefined;
}

/**
 * The merge patch (RFC 7386) taking `a` to `b`: a sub-object is merged on the server, so a key
 * `b` no longer has must be sent as null (a replacement without an address would otherwise keep
 * the old one). Arrays and scalars go whole.
 */
function objectPatch(a: unknown, b: unknown): unknown {
  if (!isPlainObject(a) || !isPlainObject(b)) return b;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(a)) if (!(k in b) || b[k] === undefined) out[k] = null;
  for (const [k, v] of Object.entries(b)) {
    if (v === undefined || sameJson(a[k], v)) continue;
    out[k] = objectPatch(a[k], v);
  }
  return out;
}

function sameJson(a: unknown, b: unknown): boolean {
  if (a === undefined || b === undefined) return a === b;
  return deepEqual(a, b);
}

export function provisionedCondition(status: ProxyStatus | undefined): Condition | undefined {
  return status?.conditions?.find((c) => c.type === CONDITION_PROVISIONED);
}

/** The facts of one phase change, for the log line a person follows a proxy by. */
export interface PhaseChange {
  from: string;
  to: string;
  address?: string;
  providerID?: string;
  /** The instance the proxy served from before, when this change switched instances. */
  previousProviderID?: string;
  /** Reason of the Provisioned condition after the change. */
  reason?: string;
  message?: string;
}

/**
 * The phase change from `before` to `after`, or undefined when the phase stayed. An unset phase
 * reads as Pending, as everywhere else. Only status fields go in, and status never carries
 * credentials (status.url has none).
 */
export function phaseChange(
  before: ProxyStatus | undefined,
  after: ProxyStatus | undefined,
): PhaseChange | undefined {
  const from = before?.phase ?? 'Pending';
  const to = after?.phase ?? 'Pending';
  if (from === to) return undefined;
  const out: PhaseChange = { from, to };
  if (after?.address) out.address = after.address;
  if (after?.providerID) out.providerID = after.providerID;
  if (before?.providerID && before.providerID !== after?.providerID)
    out.previousProviderID = before.providerID;
  const reason = provisionedCondition(after)?.reason;
  if (reason) out.reason = reason;
  if (after?.message) out.message = after.message;
  return out;
}
