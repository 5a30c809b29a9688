/**
 * controller/inputs — what a Managed Proxy's instance is made from, resolved from its Secrets:
 * the cloud-init user-data and the Basic-auth credentials (generated into `<proxy>-auth` when
 * the Proxy names none), and from those the desired spec-hash, instance name and create
 * request. A failure here is the user's to fix, so it is a message, not an exception.
 */
import { randomBytes } from 'node:crypto';
import {
  API_VERSION,
  CREDENTIALS_FOR_REFERENCED,
  CREDENTIALS_PASSWORD_KEY,
  CREDENTIALS_USERNAME_KEY,
  DEFAULT_PROXY_PORT,
  LABEL_CLOUD_INIT_SECRET,
  LABEL_CREDENTIALS_FOR,
  PROVISIONED_REASONS,
  PROXY_KIND,
} from '../api/constants.ts';
import type { Credentials } from '../api/credentials.ts';
import { credentialsFromSecret, credentialsSecretKey } from '../api/credentials.ts';
import type { ObjectKey, Secret } from '../api/meta.ts';
import { type ProxyObject, proxyType } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import type { CreateRequest } from '../provider/contract.ts';
import { instanceName } from '../provider/naming.ts';
import { legacySpecHash, type SpecHashInput, specHash } from '../provider/spechash.ts';
import { isAlreadyExists, isNotFound } from '../runtime/store.ts';
import { type ReconcileContext, ReconcileError } from './context.ts';

export type Resolved<T> = { ok: T } | { error: string };

/** The instance a Proxy should run now. */
export interface Desired {
  hash: string;
  request: CreateRequest;
}

/** A failure to resolve the inputs: the Provisioned reason and the message for the user. */
export interface InputError {
  reason: string;
  message: string;
}

/** cloud-init inline, from a labelled Secret, or none. */
export function resolveCloudInit(ctx: ReconcileContext, p: ProxyObject): Resolved<string | undefined> {
  const ci = p.spec.cloudInit;
  if (!ci) return { ok: undefined };
  if (ci.inline !== undefined) return { ok: ci.inline };
  const ref = ci.secretRef;
  if (!ref) return { ok: undefined };
  const s = ctx.store.secrets.get({ namespace: p.metadata.namespace, name: ref.name });
  if (s?.metadata.labels?.[LABEL_CLOUD_INIT_SECRET] !== 'true') {
    return {
      error: `cloud-init Secret "${ref.name}" not found, or not labelled ${LABEL_CLOUD_INIT_SECRET}: "true"`,
    };
  }
  const b64 = s.data?.[ref.key];
  if (b64 === undefined) return { error: `cloud-init Secret "${ref.name}" has no key "${ref.key}"` };
  return { ok: Buffer.from(b64, 'base64').toString('utf8') };
}

function ownedByAnotherProxy(secret: Secret, p: ProxyObject): boolean {
  const owner = secret.metadata.ownerReferences?.find((o) => o.kind === PROXY_KIND && o.controller);
  return owner !== undefined && owner.uid !== p.metadata.uid;
}

/** The Proxy's credentials: from its referenced Secret, else from `<proxy>-auth`, generated if missing. */
export async function ensureCredentials(
  ctx: ReconcileContext,
  p: ProxyObject,
): Promise<Resolved<Credentials>> {
  const key = credentialsSecretKey(p);
  const ref = p.spec.credentialsSecretRef;
  let secret = await ctx.credentials.secretFor(p, ctx.signal);
  if (!secret && ref)
    return { error: `credentials Secret "${key.name}" (spec.credentialsSecretRef) not found` };
  if (secret && ref) await labelReferencedSecret(ctx, secret);
  if (secret && !ref && ownedByAnotherProxy(secret, p)) {
    // Left by an earlier Proxy of the same name; garbage collection would delete it under
    // us later and force a replacement, so start this Proxy with its own credentials now.
    await ctx.store.secrets.delete(key, { signal: ctx.signal }).catch((err: unknown) => {
      if (!isNotFound(err)) throw err;
    });
    secret = undefined;
  }
  if (!secret) secret = await generateCredentials(ctx, p, key);
  const creds = credentialsFromSecret(secret);
  if (!creds) {
    return {
      error: `credentials Secret "${key.name}" needs non-empty keys "${CREDENTIALS_USERNAME_KEY}" and "${CREDENTIALS_PASSWORD_KEY}"`,
    };
  }
  return { ok: creds };
}

/**
 * A Secret named by `credentialsSecretRef` gets our credentials label (value `referenced`), so
 * the store caches and watches it like our own: a rotation reconciles at once instead of being
 * noticed never, and every reader stops fetching it uncached. A Secret carrying the label
 * already is left as it is. Failing to label is not fatal: the Secret is still read uncached.
 */
export async function labelReferencedSecret(ctx: ReconcileContext, secret: Secret): Promise<void> {
  if (Object.hasOwn(secret.metadata.labels ?? {}, LABEL_CREDENTIALS_FOR)) return;
  const key = { namespace: secret.metadata.namespace, name: secret.metadata.name };
  try {
    await ctx.store.secrets.addLabels(
      key,
      { [LABEL_CREDENTIALS_FOR]: CREDENTIALS_FOR_REFERENCED },
      { signal: ctx.signal, resourceVersion: secret.metadata.resourceVersion },
    );
    ctx.log.info({ secret: key.name }, `labelled the referenced credentials Secret ${LABEL_CREDENTIALS_FOR}`);
  } catch (err) {
    if (ctx.signal.aborted) throw err;
    ctx.log.warn(
      { secret: key.name, err },
      'could not label the referenced credentials Secret; rotations are seen only on the next reconcile',
    );
  }
}

/**
 * A Secret holding `creds`, labelled for the Proxy and owned by it (deleted with it in a
 * cluster): the generated `<proxy>-auth` and each served-credentials generation.
 */
export function ownedCredentialsSecret(p: ProxyObject, key: ObjectKey, creds: Credentials): Secret {
  return {
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
      [CREDENTIALS_USERNAME_KEY]: Buffer.from(creds.username).toString('base64'),
      [CREDENTIALS_PASSWORD_KEY]: Buffer.from(creds.password).toString('base64'),
    },
  };
}

/** A fresh `<proxy>-auth` Secret owned by the Proxy (192-bit password); an existing one wins. */
async function generateCredentials(ctx: ReconcileContext, p: ProxyObject, key: ObjectKey): Promise<Secret> {
  const username = `px-${randomBytes(6).toString('hex')}`;
  const password = randomBytes(24).toString('base64url');
  const secret = ownedCredentialsSecret(p, key, { username, password });
  try {
    const out = await ctx.store.secrets.create(secret, { signal: ctx.signal });
    ctx.log.info({ secret: key.name }, 'generated proxy credentials');
    return out;
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    return ctx.store.secrets.read(key, { signal: ctx.signal });
  }
}

/**
 * The generated `<proxy>-auth` Secret goes with its Proxy (ownerReferences do it in a cluster).
 * A failure other than NotFound keeps the finalizer, so the retry deletes it.
 */
export async function deleteGeneratedCredentials(ctx: ReconcileContext, p: ProxyObject): Promise<void> {
  if (p.spec.credentialsSecretRef || proxyType(p.spec) !== 'Managed') return;
  const key = credentialsSecretKey(p);
  try {
    const s = await ctx.store.secrets.read(key, { signal: ctx.signal });
    if (!s.metadata.ownerReferences?.some((o) => o.uid === p.metadata.uid)) return;
    await ctx.store.secrets.delete(key, { signal: ctx.signal });
  } catch (err) {
    if (isNotFound(err)) return;
    throw new ReconcileError(
      `could not delete generated credentials Secret "${key.name}": ${errorMessage(err)}`,
      { cause: err },
    );
  }
}

/**
 * The instance name for these inputs: normally from the (keyed) spec-hash. An instance created
 * before the hash was keyed per installation carries the unkeyed hash in its name; while the
 * inputs are the ones it was made from (its name is still the name the legacy hash gives), it
 * stays the desired instance, so an upgrade replaces nothing. The first real change of the
 * inputs moves the Proxy to a keyed name.
 */
function desiredName(p: ProxyObject, uid: string, hash: string, input: SpecHashInput): string {
  const running = p.status?.instanceName;
  if (running) {
    const legacy = instanceName(uid, legacySpecHash(input));
    if (running === legacy) return legacy;
  }
  return instanceName(uid, hash);
}

/**
 * cloud-init and credentials → the desired spec-hash and create request (the instance name
 * is `px-<16 hex of UID>-<10 hex of spec-hash>`), or what the user has to fix.
 */
export async function resolveDesired(
  ctx: ReconcileContext,
  p: ProxyObject,
  uid: string,
): Promise<Desired | InputError> {
  const cloudInit = resolveCloudInit(ctx, p);
  if ('error' in cloudInit) return { reason: PROVISIONED_REASONS.cloudInit, message: cloudInit.error };
  const creds = await ensureCredentials(ctx, p);
  if ('error' in creds) return { reason: PROVISIONED_REASONS.credentials, message: creds.error };

  const port = p.spec.port ?? DEFAULT_PROXY_PORT;
  const placement = p.spec.placement;
  const input: SpecHashInput = {
    provider: p.spec.provider ?? '',
    ...(placement ? { placement } : {}),
    port,
    ...(cloudInit.ok === undefined ? {} : { cloudInit: cloudInit.ok }),
    credentials: creds.ok,
  };
  const hash = specHash(input, ctx.installation);
  const request: CreateRequest = {
    name: desiredName(p, uid, hash, input),
    uid,
    installation: ctx.installation,
    namespace: p.metadata.namespace ?? '',
    proxyName: p.metadata.name,
    port,
    credentials: creds.ok,
    ...(placement?.zone ? { zone: placement.zone } : {}),
    ...(placement?.machineType ? { machineType: placement.machineType } : {}),
    ...(placement?.image ? { image: placement.image } : {}),
    ...(cloudInit.ok === undefined ? {} : { cloudInit: cloudInit.ok }),
    // Not part of the spec-hash: where traffic leaves from is the provider's to keep stable.
    ...(p.status?.egressIP ? { egressIP: p.status.egressIP } : {}),
  };
  return { hash, request };
}
