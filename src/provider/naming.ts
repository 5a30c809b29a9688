/**
 * provider/naming — the deterministic instance name of a Proxy's instance: `px-<uid>-<hash>`.
 * The same Proxy UID and spec-hash always give the same name, so a reconciler that crashed
 * between `create` and the status write re-finds its instance through idempotent create.
 * One name must be valid everywhere at once: GCP (RFC 1035, ≤ 63), libvirt domain names and
 * Pod names (DNS-1123 label), so it uses only lowercase letters, digits and single dashes.
 */
import { createHash } from 'node:crypto';

/** Hex characters taken from the UID (48+ random bits of a v4 UUID: no practical collisions). */
export const UID_PART_LENGTH = 16;
/** Hex characters taken from the spec-hash: distinguishes successive specs of one Proxy. */
export const HASH_PART_LENGTH = 10;

export const INSTANCE_NAME_PREFIX = 'px-';

/**
 * `n` lowercase hex characters identifying `input`: its own hex digits when it is hex-like
 * (a Kubernetes UID, a sha256 spec-hash — readable, matches what `kubectl` shows), otherwise a
 * sha256 of it, so arbitrary strings still give a valid, stable, well-spread part.
 */
function hexPart(input: string, n: number): string {
  const digits = input.toLowerCase().replaceAll('-', '');
  if (digits.length >= n && /^[0-9a-f]+$/.test(digits)) return digits.slice(0, n);
  return createHash('sha256').update(input, 'utf8').digest('hex').slice(0, n);
}

export function instanceName(uid: string, specHash: string): string {
  if (!uid) throw new Error('instanceName: the Proxy has no metadata.uid');
  if (!specHash) throw new Error('instanceName: spec-hash is empty');
  return `${INSTANCE_NAME_PREFIX}${hexPart(uid, UID_PART_LENGTH)}-${hexPart(specHash, HASH_PART_LENGTH)}`;
}

/** The UID part of an instance name, for matching instances found by listByTag. */
export function uidPartOf(uid: string): string {
  return hexPart(uid, UID_PART_LENGTH);
}
