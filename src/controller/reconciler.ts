/**
 * controller/reconciler — the Proxy state machine (SPEC §3): fetch → resolve provider,
 * cloud-init and credentials → desired spec-hash and instance name → act on the provider →
 * patch status only on diff. One call handles one key; the work queue supplies retries
 * (throw = backoff; an error with `retryAfterMs` = fixed delay) and `requeueAfter` polls.
 *
 * Crash safety rests on three things: the finalizer and the spec-hash annotation are written
 * before anything is created; the instance name is a function of (UID, spec-hash) and create
 * is idempotent by name, so a lost status write re-finds the same instance; and a replaced
 * instance is recorded in status.retiring before it is deleted.
 */
import { randomBytes } from 'node:crypto';
import { type Span, SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import { Counter, Histogram, Registry } from 'prom-client';
import {
  ANNOTATION_SKIP_CLEANUP,
  ANNOTATION_SPEC_HASH,
  API_VERSION,
  CREDENTIALS_PASSWORD_KEY,
  CREDENTIALS_USERNAME_KEY,
  DEFAULT_PROXY_PORT,
  FINALIZER,
  LABEL_CLOUD_INIT_SECRET,
  LABEL_CREDENTIALS_FOR,
  PROXY_KIND,
} from '../api/constants.ts';
import { keyOf, type ObjectKey, parseKey, type Secret } from '../api/meta.ts';
import { type ProxyObject, type ProxyStatus, proxyType } from '../api/proxy.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import type { CallContext, CreateRequest, Credentials, Instance, Provider } from '../provider/contract.ts';
import { classify, errorMessage } from '../provider/errors.ts';
import { instanceName } from '../provider/naming.ts';
import { specHash } from '../provider/spechash.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { deepEqual } from '../runtime/patch.ts';
import {
  isAlreadyExists,
  isConflict,
  isNotFound,
  type ObjectStore,
  StoreError,
  type Unsubscribe,
  type WatchEvent,
} from '../runtime/store.ts';
import { credentialsFromSecret, credentialsSecretKey, proxyUrl } from './credentials.ts';
import {
  applyIntent,
  notProvisioned,
  phaseChange,
  provisionedCondition,
  type StatusIntent,
  statusPatch,
} from './status.ts';

export interface ProviderLookup {
  get(name: string): Provider | undefined;
}

export interface ReconcilerOptions {
  /** Poll interval while an instance is starting (default 10 s). */
  provisionPollMs?: number;
  /** Poll interval while an instance is being deleted (default 5 s). */
  deletionPollMs?: number;
  /** Fixed retry delay after QuotaExceeded (default 5 min). */
  quotaBackoffMs?: number;
  /** Re-check of a Ready instance, to notice one lost behind our back (default 10 min; 0 = never). */
  readyResyncMs?: number;
  /** Attempts of a status write that keeps hitting Conflict (default 5). */
  conflictRetries?: number;
}

export interface ProxyReconcilerDeps {
  store: ObjectStore;
  providers: ProviderLookup;
  log?: Logger;
  registry?: Registry;
  clock?: Clock;
  /** Default: the global tracer provider's `egress-proxies-operator/controller` tracer. */
  tracer?: Tracer;
  options?: ReconcilerOptions;
}

export interface ReconcileResult {
  requeueAfter?: number;
}

export interface ProxyReconciler {
  /** Reconcile one `namespace/name`. Throws to ask for a retry with backoff. */
  reconcile(key: string, signal: AbortSignal): Promise<ReconcileResult>;
  /** Subscribe to everything that should trigger a reconcile; returns the unsubscribe. */
  watchSources(enqueue: (key: string) => void): Unsubscribe;
}

/** A failed reconcile; `retryAfterMs` asks the work queue for a fixed delay instead of backoff. */
export class ReconcileError extends Error {
  readonly retryAfterMs: number | undefined;
  constructor(message: string, opts: { cause?: unknown; retryAfterMs?: number } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'ReconcileError';
    this.retryAfterMs = opts.retryAfterMs;
  }
}

/** Provisioned condition reasons written by the reconciler. */
export const REASONS = {
  running: 'InstanceRunning',
  provisioning: 'Provisioning',
  lost: 'InstanceLost',
  external: 'ExternalEndpoint',
  providerNotConfigured: 'ProviderNotConfigured',
  cloudInit: 'CloudInitError',
  credentials: 'CredentialsError',
  quota: 'QuotaExceeded',
  permanent: 'ProvisioningFailed',
  transient: 'ProviderError',
  invalid: 'InvalidSpec',
} as const;

/** How the reconciler reads an instance the provider returned. */
export type InstanceVerdict = 'ready' | 'pending' | 'lost';

/** Running with an address serves; Stopping/Stopped/Terminated never will again; the rest may. */
export function instanceVerdict(inst: Instance): InstanceVerdict {
  if (inst.state === 'Running' && inst.address) return 'ready';
  if (inst.state === 'Stopping' || inst.state === 'Stopped' || inst.state === 'Terminated') return 'lost';
  return 'pending';
}

/** True when a watch event carries something the reconciler acts on (not a status-only write). */
export function needsReconcile(event: WatchEvent<ProxyObject>): boolean {
  if (event.type !== 'MODIFIED' || !event.old) return true;
  const a = event.old;
  const b = event.object;
  return (
    a.metadata.uid !== b.metadata.uid ||
    a.metadata.generation !== b.metadata.generation ||
    a.metadata.deletionTimestamp !== b.metadata.deletionTimestamp ||
    !deepEqual(a.metadata.annotations ?? {}, b.metadata.annotations ?? {}) ||
    !deepEqual(a.metadata.finalizers ?? [], b.metadata.finalizers ?? []) ||
    !deepEqual(a.spec, b.spec)
  );
}

/** Secrets a Proxy depends on (cloud-init and credentials), as `namespace/name` keys. */
export function secretRefsOf(p: ProxyObject): string[] {
  const ns = p.metadata.namespace;
  const k = (name: string) => (ns ? `${ns}/${name}` : name);
  const refs: string[] = [];
  const ci = p.spec.cloudInit?.secretRef?.name;
  if (ci) refs.push(k(ci));
  if (proxyType(p.spec) === 'Managed' || p.spec.credentialsSecretRef)
    refs.push(k(credentialsSecretKey(p).name));
  return refs;
}

function ownedByAnotherProxy(secret: Secret, p: ProxyObject): boolean {
  const owner = secret.metadata.ownerReferences?.find((o) => o.kind === PROXY_KIND && o.controller);
  return owner !== undefined && owner.uid !== p.metadata.uid;
}

interface Metrics {
  total: Counter<'result'>;
  duration: Histogram;
  lost: Counter<'provider'>;
}

function metrics(registry: Registry): Metrics {
  const reuse = <T>(name: string): T | undefined => registry.getSingleMetric(name) as T | undefined;
  return {
    total:
      reuse<Counter<'result'>>('proxy_operator_reconcile_total') ??
      new Counter({
        name: 'proxy_operator_reconcile_total',
        help: 'Proxy reconciles by result (success, requeue, error).',
        labelNames: ['result'],
        registers: [registry],
      }),
    duration:
      reuse<Histogram>('proxy_operator_reconcile_duration_seconds') ??
      new Histogram({
        name: 'proxy_operator_reconcile_duration_seconds',
        help: 'Time one Proxy reconcile took.',
        buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60],
        registers: [registry],
      }),
    lost:
      reuse<Counter<'provider'>>('proxy_operator_instances_lost_total') ??
      new Counter({
        name: 'proxy_operator_instances_lost_total',
        help: 'Instances that vanished or terminated while their Proxy expected them; each is recreated.',
        labelNames: ['provider'],
        registers: [registry],
      }),
  };
}

/** Per-call state handed to the steps of one reconcile. */
interface Run {
  key: ObjectKey;
  signal: AbortSignal;
  log: Logger;
  ctx: CallContext;
}

type Resolved<T> = { ok: T } | { error: string };

export function createProxyReconciler(deps: ProxyReconcilerDeps): ProxyReconciler {
  const { store, providers } = deps;
  const log = deps.log ?? silentLogger();
  const clock = deps.clock ?? systemClock;
  const m = metrics(deps.registry ?? new Registry());
  const tracer = deps.tracer ?? trace.getTracer('egress-proxies-operator/controller');
  const opt = {
    provisionPollMs: deps.options?.provisionPollMs ?? 10_000,
    deletionPollMs: deps.options?.deletionPollMs ?? 5_000,
    quotaBackoffMs: deps.options?.quotaBackoffMs ?? 300_000,
    readyResyncMs: deps.options?.readyResyncMs ?? 600_000,
    conflictRetries: deps.options?.conflictRetries ?? 5,
  };

  const nowIso = () => new Date(clock.now()).toISOString();
  const readyRequeue = (): ReconcileResult =>
    opt.readyResyncMs > 0 ? { requeueAfter: opt.readyResyncMs } : {};

  /** Patch status with the intent merged into the freshest object; re-read and retry on Conflict. */
  async function writeStatus(run: Run, p: ProxyObject, intent: StatusIntent): Promise<ProxyObject> {
    let base = p;
    for (let attempt = 0; ; attempt++) {
      const next = applyIntent(base.status, intent, nowIso(), base.metadata.generation);
      const patch = statusPatch(base.status, next);
      if (!patch) return base;
      try {
        const written = await store.proxies.patchStatus(run.key, patch, {
          signal: run.signal,
          ...(base.metadata.resourceVersion ? { resourceVersion: base.metadata.resourceVersion } : {}),
        });
        logPhaseChange(run, base.status, written.status);
        return written;
      } catch (err) {
        if (!isConflict(err) || attempt + 1 >= opt.conflictRetries) throw err;
        base = await store.proxies.read(run.key, { signal: run.signal });
        if (base.metadata.uid !== p.metadata.uid) throw err;
      }
    }
  }

  /** One line per phase change: how a person follows a proxy through its life in the log. */
  function logPhaseChange(run: Run, before: ProxyStatus | undefined, after: ProxyStatus | undefined): void {
    const change = phaseChange(before, after);
    if (change?.to === 'Failed') run.log.warn(change, 'proxy phase changed');
    else if (change) run.log.info(change, 'proxy phase changed');
    else if (before?.providerID && after?.providerID && before.providerID !== after.providerID) {
      // A replacement that was Running at once never passes through Replacing.
      run.log.info(
        {
          phase: after.phase,
          providerID: after.providerID,
          previousProviderID: before.providerID,
          address: after.address,
        },
        'proxy switched to a new instance',
      );
    }
  }

  async function releaseFinalizer(run: Run, p: ProxyObject): Promise<ReconcileResult> {
    // Secret first: once the finalizer is gone nothing comes back for it, and standalone mode
    // has no owner-reference GC — a crash in between would leave it behind for good.
    await deleteGeneratedCredentials(run, p);
    await store.proxies.removeFinalizer(p, FINALIZER, { signal: run.signal });
    run.log.info({ from: p.status?.phase ?? 'Pending' }, 'proxy deleted');
    return {};
  }

  /**
   * The generated `<proxy>-auth` Secret goes with its Proxy (ownerReferences do it in a cluster).
   * A failure other than NotFound keeps the finalizer, so the retry deletes it.
   */
  async function deleteGeneratedCredentials(run: Run, p: ProxyObject): Promise<void> {
    if (p.spec.credentialsSecretRef || proxyType(p.spec) !== 'Managed') return;
    const key = credentialsSecretKey(p);
    try {
      const s = await store.secrets.read(key, { signal: run.signal });
      if (!s.metadata.ownerReferences?.some((o) => o.uid === p.metadata.uid)) return;
      await store.secrets.delete(key, { signal: run.signal });
    } catch (err) {
      if (isNotFound(err)) return;
      throw new ReconcileError(
        `could not delete generated credentials Secret "${key.name}": ${errorMessage(err)}`,
        { cause: err },
      );
    }
  }

  function resolveCloudInit(p: ProxyObject): Resolved<string | undefined> {
    const ci = p.spec.cloudInit;
    if (!ci) return { ok: undefined };
    if (ci.inline !== undefined) return { ok: ci.inline };
    const ref = ci.secretRef;
    if (!ref) return { ok: undefined };
    const s = store.secrets.get({ namespace: p.metadata.namespace, name: ref.name });
    if (s?.metadata.labels?.[LABEL_CLOUD_INIT_SECRET] !== 'true') {
      return {
        error: `cloud-init Secret "${ref.name}" not found, or not labelled ${LABEL_CLOUD_INIT_SECRET}: "true"`,
      };
    }
    const b64 = s.data?.[ref.key];
    if (b64 === undefined) return { error: `cloud-init Secret "${ref.name}" has no key "${ref.key}"` };
    return { ok: Buffer.from(b64, 'base64').toString('utf8') };
  }

  async function resolveCredentials(run: Run, p: ProxyObject): Promise<Resolved<Credentials>> {
    const key = credentialsSecretKey(p);
    const ref = p.spec.credentialsSecretRef;
    let secret = store.secrets.get(key);
    if (!secret) {
      try {
        secret = await store.secrets.read(key, { signal: run.signal });
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    }
    if (!secret && ref)
      return { error: `credentials Secret "${key.name}" (spec.credentialsSecretRef) not found` };
    if (secret && !ref && ownedByAnotherProxy(secret, p)) {
      // Left by an earlier Proxy of the same name; garbage collection would delete it under
      // us later and force a replacement, so start this Proxy with its own credentials now.
      await store.secrets.delete(key, { signal: run.signal }).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
      secret = undefined;
    }
    if (!secret) secret = await createCredentials(run, p, key);
    const creds = credentialsFromSecret(secret);
    if (!creds) {
      return {
        error: `credentials Secret "${key.name}" needs non-empty keys "${CREDENTIALS_USERNAME_KEY}" and "${CREDENTIALS_PASSWORD_KEY}"`,
      };
    }
    return { ok: creds };
  }

  async function createCredentials(run: Run, p: ProxyObject, key: ObjectKey): Promise<Secret> {
    const username = `px-${randomBytes(6).toString('hex')}`;
    const password = randomBytes(24).toString('base64url');
    const secret: Secret = {
      apiVersion: 'v1',
      kind: 'Secret',
      type: 'Opaque',
      metadata: {
        name: key.name,
        ...(key.namespace ? { namespace: key.namespace } : {}),
        labels: { [LABEL_CREDENTIALS_FOR]: p.metadata.name },
        ownerReferences: [
          {
            apiVersion: API_VERSION,
            kind: PROXY_KIND,
            name: p.metadata.name,
            uid: p.metadata.uid ?? '',
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
      },
      data: {
        [CREDENTIALS_USERNAME_KEY]: Buffer.from(username).toString('base64'),
        [CREDENTIALS_PASSWORD_KEY]: Buffer.from(password).toString('base64'),
      },
    };
    try {
      const out = await store.secrets.create(secret, { signal: run.signal });
      run.log.info({ secret: key.name }, 'generated proxy credentials');
      return out;
    } catch (err) {
      if (!isAlreadyExists(err)) throw err;
      return store.secrets.read(key, { signal: run.signal });
    }
  }

  /**
   * A provider error → status + what the queue should do (SPEC §3.9). Quota: fixed slow retry.
   * Permanent: Failed until the generation changes. Anything else: backoff, and a Ready status
   * stays Ready (one flaky call must not pull a serving proxy out of rotation).
   */
  async function onProviderError(run: Run, p: ProxyObject, err: unknown): Promise<ReconcileResult> {
    const cls = classify(err);
    const msg = errorMessage(err);
    // A phase in progress stays; a proxy with none yet, or a Failed one now retrying, is Pending.
    const retryPhase = p.status?.phase && p.status.phase !== 'Failed' ? undefined : 'Pending';
    if (cls === 'QuotaExceeded') {
      await writeStatus(run, p, notProvisioned(REASONS.quota, msg, retryPhase));
      throw new ReconcileError(msg, { cause: err, retryAfterMs: opt.quotaBackoffMs });
    }
    if (cls === 'Permanent') {
      await writeStatus(run, p, notProvisioned(REASONS.permanent, msg, 'Failed'));
      return {};
    }
    if (p.status?.phase !== 'Ready') {
      await writeStatus(run, p, notProvisioned(REASONS.transient, msg, retryPhase));
    }
    throw new ReconcileError(msg, { cause: err });
  }

  /** One ID: 'gone' when the provider confirms it, 'pending' after asking for its deletion. */
  async function cleanupOne(run: Run, provider: Provider, id: string): Promise<'gone' | 'pending'> {
    try {
      await provider.get(run.ctx, id);
    } catch (err) {
      const cls = classify(err);
      if (cls === 'NotFound') return 'gone';
      if (cls !== 'Permanent') throw err;
      // Get cannot answer for this ID (a retired host, an unresolvable ID); delete is
      // idempotent and may still finish, so its success is the release signal.
      try {
        await provider.delete(run.ctx, id);
      } catch (delErr) {
        throw new AggregateError([err, delErr], `${errorMessage(err)}; delete: ${errorMessage(delErr)}`);
      }
      run.log.info({ providerID: id, err: errorMessage(err) }, 'instance unreachable but delete succeeded');
      return 'gone';
    }
    await provider.delete(run.ctx, id);
    return 'pending';
  }

  /** Delete every retiring ID; drop the confirmed-gone ones from status. */
  async function cleanupRetiring(
    run: Run,
    provider: Provider,
    p: ProxyObject,
  ): Promise<{ proxy: ProxyObject; pending: boolean; error?: unknown }> {
    const retiring = p.status?.retiring ?? [];
    if (retiring.length === 0) return { proxy: p, pending: false };
    const keep: string[] = [];
    const errors: unknown[] = [];
    for (const id of retiring) {
      try {
        if ((await cleanupOne(run, provider, id)) === 'pending') keep.push(id);
      } catch (err) {
        keep.push(id);
        errors.push(err);
      }
    }
    const proxy = keep.length === retiring.length ? p : await writeStatus(run, p, { retiring: keep });
    const error =
      errors.length === 0
        ? undefined
        : new AggregateError(errors, `deleting retired instances: ${errors.map(errorMessage).join('; ')}`);
    return { proxy, pending: keep.length > 0, ...(error ? { error } : {}) };
  }

  async function reconcileDelete(run: Run, p: ProxyObject): Promise<ReconcileResult> {
    if (!p.metadata.finalizers?.includes(FINALIZER)) return {};
    const providerID = p.status?.providerID;
    const retiring = p.status?.retiring ?? [];
    if (proxyType(p.spec) === 'External' || (!providerID && retiring.length === 0)) {
      // Nothing was recorded as created; orphan GC reaps what a crashed create left behind.
      return releaseFinalizer(run, p);
    }
    if (p.metadata.annotations?.[ANNOTATION_SKIP_CLEANUP] === 'true') {
      // Before the provider lookup, so it also frees a Proxy whose provider left the config.
      run.log.info(
        { providerID, retiring, provider: p.spec.provider },
        `${ANNOTATION_SKIP_CLEANUP} is set; abandoning the instance`,
      );
      return releaseFinalizer(run, p);
    }
    const provider = providers.get(p.spec.provider ?? '');
    if (!provider) {
      const msg = `provider "${p.spec.provider}" is not configured; cannot clean up instance ${providerID ?? retiring.join(', ')} (annotate the Proxy ${ANNOTATION_SKIP_CLEANUP}: "true" to abandon it)`;
      await writeStatus(run, p, { phase: 'Deleting', message: msg });
      throw new ReconcileError(msg);
    }
    const pending: string[] = [];
    const errors: unknown[] = [];
    for (const id of [...(providerID ? [providerID] : []), ...retiring]) {
      try {
        if ((await cleanupOne(run, provider, id)) === 'pending') pending.push(id);
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length > 0) {
      // The finalizer stays: dropping it on a failure would leak a running instance.
      const msg = `cleanup failed: ${errors.map(errorMessage).join('; ')}`;
      await writeStatus(run, p, { phase: 'Deleting', message: msg });
      throw new ReconcileError(msg, { cause: errors.length === 1 ? errors[0] : new AggregateError(errors) });
    }
    if (pending.length === 0) return releaseFinalizer(run, p);
    await writeStatus(run, p, { phase: 'Deleting', message: `waiting for ${pending.join(', ')} to go away` });
    return { requeueAfter: opt.deletionPollMs };
  }

  async function reconcileExternal(run: Run, p: ProxyObject): Promise<ReconcileResult> {
    if (p.metadata.deletionTimestamp) {
      if (p.metadata.finalizers?.includes(FINALIZER)) await releaseFinalizer(run, p);
      return {};
    }
    const ep = p.spec.endpoint;
    if (!ep) {
      // The schema forbids this; a hand-edited standalone file may not have been validated.
      const msg = 'spec.endpoint is required for External proxies';
      await writeStatus(run, p, notProvisioned(REASONS.invalid, msg, 'Failed'));
      return {};
    }
    await writeStatus(run, p, {
      phase: 'Ready',
      providerID: null,
      instanceName: null,
      address: ep.host,
      port: ep.port,
      url: proxyUrl(ep.host, ep.port),
      message: null,
      provisioned: {
        status: 'True',
        reason: REASONS.external,
        message: 'external endpoint, nothing provisioned',
      },
    });
    return {};
  }

  /**
   * Instances of this Proxy the status does not know about: after a crash between create and
   * the status write, followed by a spec change, the old name is never asked for again.
   */
  async function findStrays(
    run: Run,
    provider: Provider,
    p: ProxyObject,
    keepName: string,
  ): Promise<string[]> {
    const known = new Set([p.status?.providerID, ...(p.status?.retiring ?? [])]);
    const all = await provider.listByTag(run.ctx);
    return all
      .filter((i) => i.uid === p.metadata.uid && !known.has(i.id) && i.name !== keepName)
      .map((i) => i.id);
  }

  function readyIntent(p: ProxyObject, inst: Instance, name: string): StatusIntent {
    const port = inst.port ?? p.spec.port ?? DEFAULT_PROXY_PORT;
    const address = inst.address ?? '';
    return {
      phase: 'Ready',
      providerID: inst.id,
      instanceName: name,
      address,
      port,
      url: proxyUrl(address, port),
      message: null,
      provisioned: { status: 'True', reason: REASONS.running, message: `instance ${name} is running` },
    };
  }

  function provisioningIntent(inst: Instance, name: string): StatusIntent {
    return {
      phase: 'Provisioning',
      providerID: inst.id,
      instanceName: name,
      address: null,
      port: null,
      url: null,
      message: null,
      provisioned: {
        status: 'False',
        reason: REASONS.provisioning,
        message: `waiting for instance ${name} (${inst.state})`,
      },
    };
  }

  async function createAndRecord(
    run: Run,
    provider: Provider,
    p: ProxyObject,
    req: CreateRequest,
  ): Promise<{ proxy: ProxyObject; result: ReconcileResult }> {
    const inst = await provider.create(run.ctx, req);
    if (instanceVerdict(inst) === 'ready') {
      return { proxy: await writeStatus(run, p, readyIntent(p, inst, req.name)), result: readyRequeue() };
    }
    return {
      proxy: await writeStatus(run, p, provisioningIntent(inst, req.name)),
      result: { requeueAfter: opt.provisionPollMs },
    };
  }

  async function reconcileManaged(run: Run, p0: ProxyObject): Promise<ReconcileResult> {
    let p = p0;
    const providerName = p.spec.provider ?? '';
    const provider = providers.get(providerName);
    if (!provider) {
      const msg = `provider "${providerName}" is not configured`;
      await writeStatus(run, p, notProvisioned(REASONS.providerNotConfigured, msg, 'Failed'));
      return {};
    }
    const uid = p.metadata.uid;
    if (!uid) throw new ReconcileError('Proxy has no metadata.uid');

    const hasInstance = Boolean(p.status?.providerID);
    const resolveFailed = async (reason: string, msg: string): Promise<never> => {
      await writeStatus(run, p, notProvisioned(reason, msg, hasInstance ? undefined : 'Pending'));
      throw new ReconcileError(msg);
    };
    const cloudInit = resolveCloudInit(p);
    if ('error' in cloudInit) return resolveFailed(REASONS.cloudInit, cloudInit.error);
    const creds = await resolveCredentials(run, p);
    if ('error' in creds) return resolveFailed(REASONS.credentials, creds.error);

    const port = p.spec.port ?? DEFAULT_PROXY_PORT;
    const hash = specHash({
      provider: providerName,
      ...(p.spec.placement ? { placement: p.spec.placement } : {}),
      port,
      ...(cloudInit.ok === undefined ? {} : { cloudInit: cloudInit.ok }),
      credentials: creds.ok,
    });
    const name = instanceName(uid, hash);
    const annotations = p.metadata.annotations ?? {};

    const cond = provisionedCondition(p.status);
    if (
      p.status?.phase === 'Failed' &&
      cond?.reason === REASONS.permanent &&
      cond.observedGeneration === p.metadata.generation &&
      annotations[ANNOTATION_SPEC_HASH] === hash
    ) {
      return {}; // a permanent failure waits for the spec (or a referenced Secret) to change
    }

    if (!p.metadata.finalizers?.includes(FINALIZER) || annotations[ANNOTATION_SPEC_HASH] !== hash) {
      const prev = annotations[ANNOTATION_SPEC_HASH];
      if (prev && prev !== hash && instanceName(uid, prev) !== p.status?.instanceName) {
        // The previous desired instance may exist without being recorded: retire it now,
        // before the annotation that names it is overwritten.
        let strays: string[];
        try {
          strays = await findStrays(run, provider, p, name);
        } catch (err) {
          if (err instanceof StoreError || run.signal.aborted) throw err;
          return onProviderError(run, p, err);
        }
        if (strays.length > 0) {
          run.log.info({ strays }, 'retiring unrecorded instances of an earlier spec');
          p = await writeStatus(run, p, { retiring: [...(p.status?.retiring ?? []), ...strays] });
        }
      }
      // Finalizer and hash in one write, both before anything is created.
      p = await store.proxies.update(
        {
          ...p,
          metadata: {
            ...p.metadata,
            finalizers: [...new Set([...(p.metadata.finalizers ?? []), FINALIZER])],
            annotations: { ...annotations, [ANNOTATION_SPEC_HASH]: hash },
          },
        },
        { signal: run.signal },
      );
    }

    const req: CreateRequest = {
      name,
      uid,
      namespace: p.metadata.namespace ?? '',
      proxyName: p.metadata.name,
      port,
      credentials: creds.ok,
      ...(p.spec.placement?.zone ? { zone: p.spec.placement.zone } : {}),
      ...(p.spec.placement?.machineType ? { machineType: p.spec.placement.machineType } : {}),
      ...(p.spec.placement?.image ? { image: p.spec.placement.image } : {}),
      ...(cloudInit.ok === undefined ? {} : { cloudInit: cloudInit.ok }),
    };

    let result: ReconcileResult;
    try {
      ({ proxy: p, result } = await actOnInstance(run, provider, p, req));
    } catch (err) {
      // Store errors and cancellation are not the provider's verdict on the instance.
      if (err instanceof ReconcileError || err instanceof StoreError || run.signal.aborted) throw err;
      return onProviderError(run, p, err);
    }

    const retired = await cleanupRetiring(run, provider, p);
    if (retired.error) throw new ReconcileError(errorMessage(retired.error), { cause: retired.error });
    if (retired.pending) {
      const poll = opt.deletionPollMs;
      result = { requeueAfter: Math.min(result.requeueAfter ?? poll, poll) };
    }
    return result;
  }

  async function actOnInstance(
    run: Run,
    provider: Provider,
    p: ProxyObject,
    req: CreateRequest,
  ): Promise<{ proxy: ProxyObject; result: ReconcileResult }> {
    const current = p.status?.providerID;
    if (!current) return createAndRecord(run, provider, p, req);

    if (p.status?.instanceName !== req.name) {
      // Spec changed: bring the new instance up first, then switch, then retire the old one.
      const inst = await provider.create(run.ctx, req);
      const verdict = instanceVerdict(inst);
      if (verdict === 'lost') {
        // A dead instance already holds the new name: clear it so the next create starts fresh.
        run.log.warn({ providerID: inst.id, state: inst.state }, 'replacement instance is dead; deleting it');
        await provider.delete(run.ctx, inst.id);
      }
      if (verdict !== 'ready') {
        const proxy = await writeStatus(run, p, {
          phase: 'Replacing',
          message: `replacing ${p.status?.instanceName ?? current} with ${req.name} (${inst.state})`,
        });
        return { proxy, result: { requeueAfter: opt.provisionPollMs } };
      }
      const retiring = [...(p.status?.retiring ?? []), ...(current === inst.id ? [] : [current])];
      const proxy = await writeStatus(run, p, { ...readyIntent(p, inst, req.name), retiring });
      return { proxy, result: readyRequeue() };
    }

    let inst: Instance;
    try {
      inst = await provider.get(run.ctx, current);
    } catch (err) {
      if (classify(err) !== 'NotFound') throw err;
      m.lost.inc({ provider: provider.name });
      run.log.warn({ providerID: current }, 'instance lost; creating a new one');
      return createAndRecord(run, provider, p, req);
    }
    const verdict = instanceVerdict(inst);
    if (verdict === 'ready') {
      return { proxy: await writeStatus(run, p, readyIntent(p, inst, req.name)), result: readyRequeue() };
    }
    if (verdict === 'pending') {
      const proxy = await writeStatus(run, p, provisioningIntent(inst, req.name));
      return { proxy, result: { requeueAfter: opt.provisionPollMs } };
    }
    // Stopped or terminated for good: delete it; once get says NotFound the lost path recreates
    // it under the same name (creating first would just re-find the dead one).
    run.log.warn({ providerID: current, state: inst.state }, 'instance terminated; deleting it to recreate');
    await provider.delete(run.ctx, current);
    const proxy = await writeStatus(run, p, {
      phase: 'Provisioning',
      address: null,
      port: null,
      url: null,
      provisioned: {
        status: 'False',
        reason: REASONS.lost,
        message: `instance ${inst.name} is ${inst.state}`,
      },
    });
    return { proxy, result: { requeueAfter: opt.provisionPollMs } };
  }

  async function reconcileOnce(run: Run): Promise<ReconcileResult> {
    let p: ProxyObject;
    try {
      p = await store.proxies.read(run.key, { signal: run.signal });
    } catch (err) {
      if (isNotFound(err)) return {};
      throw err;
    }
    if (proxyType(p.spec) === 'External') return reconcileExternal(run, p);
    if (p.metadata.deletionTimestamp) return reconcileDelete(run, p);
    return reconcileManaged(run, p);
  }

  async function reconcile(key: string, signal: AbortSignal): Promise<ReconcileResult> {
    const started = clock.now();
    const k = parseKey(key);
    const runLog = log.child({ proxy: key });
    const run: Run = { key: k, signal, log: runLog, ctx: { signal, log: runLog } };
    return tracer.startActiveSpan(
      'reconcile',
      { attributes: { 'proxy.namespace': k.namespace ?? '', 'proxy.name': k.name } },
      async (span: Span) => {
        try {
          for (let attempt = 1; ; attempt++) {
            try {
              const res = await reconcileOnce(run);
              // The periodic re-check of a Ready instance is not a pending poll.
              const polling = res.requeueAfter !== undefined && res.requeueAfter !== opt.readyResyncMs;
              m.total.inc({ result: polling ? 'requeue' : 'success' });
              return res;
            } catch (err) {
              // A metadata write raced another writer: start over from a fresh read.
              if (!isConflict(err) || attempt >= opt.conflictRetries || signal.aborted) throw err;
            }
          }
        } catch (err) {
          m.total.inc({ result: 'error' });
          span.setStatus({ code: SpanStatusCode.ERROR, message: errorMessage(err) });
          runLog.debug({ err: errorMessage(err) }, 'reconcile failed');
          throw err;
        } finally {
          m.duration.observe((clock.now() - started) / 1000);
          span.end();
        }
      },
    );
  }

  function watchSources(enqueue: (key: string) => void): Unsubscribe {
    // Secret key → Proxies that read it; maintained from the Proxy events.
    const bySecret = new Map<string, Set<string>>();
    const refsByProxy = new Map<string, string[]>();
    const index = (p: ProxyObject) => {
      const pk = keyOf(p);
      unindex(pk);
      const refs = secretRefsOf(p);
      refsByProxy.set(pk, refs);
      for (const r of refs) {
        const set = bySecret.get(r) ?? new Set<string>();
        bySecret.set(r, set);
        set.add(pk);
      }
    };
    const unindex = (pk: string) => {
      for (const r of refsByProxy.get(pk) ?? []) {
        const set = bySecret.get(r);
        set?.delete(pk);
        if (set?.size === 0) bySecret.delete(r);
      }
      refsByProxy.delete(pk);
    };
    for (const p of store.proxies.list()) index(p);
    const offProxies = store.proxies.watch((ev) => {
      const pk = keyOf(ev.object);
      if (ev.type === 'DELETED') {
        unindex(pk);
        return;
      }
      index(ev.object);
      if (needsReconcile(ev)) enqueue(pk);
    });
    const offSecrets = store.secrets.watch((ev) => {
      for (const pk of bySecret.get(keyOf(ev.object)) ?? []) enqueue(pk);
    });
    return () => {
      offProxies();
      offSecrets();
    };
  }

  return { reconcile, watchSources };
}
