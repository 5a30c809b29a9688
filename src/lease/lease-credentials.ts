/**
 * lease/lease-credentials — credentials that belong to one lease, for proxies whose server asks
 * the lease store before it lets a client through (the local provider): the user name names the
 * lease, the password is random, and only its digest is kept, so a checkpoint never holds a
 * usable password.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

/** Every per-lease user name starts with this, followed by the lease id. */
export const LEASE_USER_PREFIX = 'lease-';

export interface IssuedLeaseCredentials {
  username: string;
  password: string;
  /** base64url SHA-256 of the password: what the store keeps and checkpoints. */
  digest: string;
}

export function issueLeaseCredentials(leaseId: string): IssuedLeaseCredentials {
  // 24 random bytes: a digest of it in a checkpoint cannot be turned back into the password.
  const password = randomBytes(24).toString('base64url');
  return { username: `${LEASE_USER_PREFIX}${leaseId}`, password, digest: passwordDigest(password) };
}

export function passwordDigest(password: string): string {
  return createHash('sha256').update(password, 'utf8').digest('base64url');
}

/** The lease id a per-lease user name names, or undefined when it is not one. */
export function leaseIdOfUser(username: string): string | undefined {
  return username.startsWith(LEASE_USER_PREFIX) ? username.slice(LEASE_USER_PREFIX.length) : undefined;
}

/** Constant-time comparison of a presented password with a kept digest. */
export function passwordMatches(password: string, digest: string): boolean {
  const a = Buffer.from(passwordDigest(password), 'base64url');
  const b = Buffer.from(digest, 'base64url');
  return a.length === b.length && timingSafeEqual(a, b);
}
