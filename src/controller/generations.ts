/**
 * controller/generations — the served-credentials generations of a Managed Proxy: each instance
 * serves one immutable `<proxy>-served-credentials-<generation>` Secret (docs/health.md,
 * "Replacements"); a generation is created when new credentials are first served and deleted
 * once no instance serves it.
 */

import type { Credentials } from '../api/credentials.ts';
import { credentialsFromSecret } from '../api/credentials.ts';
import type { Secret } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { generationsInUse, ownsServedSecret, servedCredentialsKey } from '../api/served-credentials.ts';
import { isAlreadyExists, isNotFound } from '../runtime/store.ts';
import type { ReconcileContext } from './context.ts';
import { ownedCredentialsSecret } from './inputs.ts';

async function readGeneration(ctx: ReconcileContext, p: ProxyObject, g: number): Promise<Secret | undefined> {
  const key = servedCredentialsKey(p, g);
  const cached = ctx.store.secrets.get(key);
  if (cached) return cached;
  try {
    return await ctx.store.secrets.read(key, { signal: ctx.signal });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

const same = (a: Credentials | undefined, b: Credentials) =>
  a !== undefined && a.username === b.username && a.password === b.password;

function generationSecret(p: ProxyObject, g: number, creds: Credentials): Secret {
  return ownedCredentialsSecret(p, servedCredentialsKey(p, g), creds);
}

/**
 * The generation of `creds`: one status already names whose Secret holds the same
 * credentials, else the next number, whose Secret is created now. A Secret of that name that
 * is not this Proxy's, or holds other credentials (a crash before status named it), is
 * replaced.
 */
export async function ensureGeneration(
  ctx: ReconcileContext,
  p: ProxyObject,
  creds: Credentials,
): Promise<number> {
  const inUse = generationsInUse(p);
  for (const g of [...inUse].sort((a, b) => b - a)) {
    const s = await readGeneration(ctx, p, g);
    if (s && ownsServedSecret(p, s) && same(credentialsFromSecret(s), creds)) return g;
  }
  const next = Math.max(0, ...inUse) + 1;
  const want = generationSecret(p, next, creds);
  try {
    await ctx.store.secrets.create(want, { signal: ctx.signal });
    return next;
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
  }
  const found = await readGeneration(ctx, p, next);
  if (found && ownsServedSecret(p, found) && same(credentialsFromSecret(found), creds)) return next;
  await dropSecret(ctx, p, next, true);
  await ctx.store.secrets.create(want, { signal: ctx.signal });
  return next;
}

async function dropSecret(ctx: ReconcileContext, p: ProxyObject, g: number, anyOwner = false): Promise<void> {
  const key = servedCredentialsKey(p, g);
  try {
    if (!anyOwner) {
      const s = await readGeneration(ctx, p, g);
      if (!s || !ownsServedSecret(p, s)) return;
    }
    await ctx.store.secrets.delete(key, { signal: ctx.signal });
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
}

/** Deletes the Secrets of `gens` that `p`'s status no longer refers to. */
export async function dropUnusedGenerations(
  ctx: ReconcileContext,
  p: ProxyObject,
  gens: Iterable<number | undefined>,
): Promise<void> {
  const inUse = generationsInUse(p);
  for (const g of new Set(gens)) if (g && !inUse.has(g)) await dropSecret(ctx, p, g);
}

/** Every generation Secret `p`'s status names, for a Proxy going away. */
export async function deleteServedCredentials(ctx: ReconcileContext, p: ProxyObject): Promise<void> {
  for (const g of generationsInUse(p)) await dropSecret(ctx, p, g);
}
