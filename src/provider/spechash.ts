/**
 * provider/spechash — the spec-hash: a digest of everything that, when it changes,
 * needs a new instance — provider, placement, port, the resolved cloud-init bytes (inline or a
 * referenced Secret's content) and the credentials. Canonical JSON (sorted keys, no undefined)
 * → HMAC-SHA256 hex keyed with the installation id, so field order and absent-vs-undefined
 * never cause a spurious replacement, and the published annotation (and the 10 hex of it in
 * the instance name) cannot be compared across installations or looked up in a table
 * precomputed for guessed passwords. Installations before 0.3 published an unkeyed SHA-256
 * (`legacySpecHash`); the reconciler still recognises it so an upgrade replaces nothing.
 */
import { createHash, createHmac } from 'node:crypto';
import type { Credentials } from '../api/credentials.ts';

export interface SpecHashInput {
  provider: string;
  placement?: { zone?: string; machineType?: string; image?: string };
  /** Port with the default applied (3128), so an explicit default does not replace. */
  port: number;
  /** The cloud-init content itself, not its reference; undefined when none. */
  cloudInit?: string;
  credentials: Credentials;
}

/** Bump when the input shape changes meaning; changing it replaces every instance once. */
const HASH_VERSION = 1;

type Json = string | number | boolean | null | Json[] | { [k: string]: Json };

/** JSON with object keys sorted recursively and undefined members dropped. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(normalize(value));
}

function normalize(value: unknown): Json {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return value;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new Error(`canonicalJson: non-finite number ${value}`);
    return value;
  }
  if (Array.isArray(value)) return value.map((v) => (v === undefined ? null : normalize(v)));
  if (typeof value === 'object') {
    const out: { [k: string]: Json } = {};
    for (const k of Object.keys(value as object).sort()) {
      const v = (value as Record<string, unknown>)[k];
      if (v !== undefined) out[k] = normalize(v);
    }
    return out;
  }
  throw new Error(`canonicalJson: unsupported value of type ${typeof value}`);
}

/** The canonical document both hash versions digest. */
function hashDocument(input: SpecHashInput): string {
  const placement = input.placement ?? {};
  return canonicalJson({
    v: HASH_VERSION,
    provider: input.provider,
    placement: {
      zone: placement.zone || undefined,
      machineType: placement.machineType || undefined,
      image: placement.image || undefined,
    },
    port: input.port,
    cloudInit: input.cloudInit,
    credentials: { username: input.credentials.username, password: input.credentials.password },
  });
}

/** The spec-hash of `input` for installation `installation` (the HMAC key); 64 hex characters. */
export function specHash(input: SpecHashInput, installation: string): string {
  if (!installation) throw new Error('specHash: the installation id is empty');
  return createHmac('sha256', installation).update(hashDocument(input), 'utf8').digest('hex');
}

/**
 * The unkeyed SHA-256 earlier versions wrote. Used only to recognise an instance created
 * before the upgrade from the same inputs; never published again.
 */
export function legacySpecHash(input: SpecHashInput): string {
  return createHash('sha256').update(hashDocument(input), 'utf8').digest('hex');
}
