/**
 * provider/squid/htpasswd — the password file Squid's basic_ncsa_auth reads. Hashes with
 * Apache's APR1 variant of MD5-crypt, which basic_ncsa_auth verifies with its own code (so it
 * works whatever crypt(3) the Squid image's libc offers). The passwords are random and long;
 * the Secret holding the file is what protects them, not the hash's strength.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { Credentials } from '../../api/credentials.ts';

const ITOA64 = './0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';

/** MD5-crypt (`$1$`) or its APR1 variant (`$apr1$`): `<magic><salt>$<22 chars>`. */
export function md5crypt(password: string, salt: string, magic: '$1$' | '$apr1$' = '$apr1$'): string {
  const pw = Buffer.from(password, 'utf8');
  const s = Buffer.from(salt.slice(0, 8), 'utf8');
  const md5 = () => createHash('md5');

  const alt = md5().update(pw).update(s).update(pw).digest();
  const ctx = md5().update(pw).update(magic).update(s);
  for (let left = pw.length; left > 0; left -= 16) ctx.update(alt.subarray(0, Math.min(left, 16)));
  for (let i = pw.length; i > 0; i >>= 1) ctx.update(i & 1 ? Buffer.from([0]) : pw.subarray(0, 1));
  let final = ctx.digest();

  // 1000 rounds, fixed by the algorithm, to slow down brute force.
  for (let i = 0; i < 1000; i++) {
    const round = md5();
    round.update(i & 1 ? pw : final);
    if (i % 3) round.update(s);
    if (i % 7) round.update(pw);
    round.update(i & 1 ? final : pw);
    final = round.digest();
  }

  const b = (i: number) => final[i] as number;
  let out = '';
  const to64 = (v: number, n: number) => {
    for (let k = 0; k < n; k++, v >>= 6) out += ITOA64[v & 0x3f];
  };
  to64((b(0) << 16) | (b(6) << 8) | b(12), 4);
  to64((b(1) << 16) | (b(7) << 8) | b(13), 4);
  to64((b(2) << 16) | (b(8) << 8) | b(14), 4);
  to64((b(3) << 16) | (b(9) << 8) | b(15), 4);
  to64((b(4) << 16) | (b(10) << 8) | b(5), 4);
  to64(b(11), 2);
  return `${magic}${s.toString('utf8')}$${out}`;
}

/** A random 8-character salt from the crypt alphabet. */
export function randomSalt(): string {
  return [...randomBytes(8)].map((x) => ITOA64[x & 0x3f]).join('');
}

/**
 * Why credentials cannot go into an htpasswd line, or undefined when they can. The message
 * names the field, never the value.
 */
export function htpasswdProblem(creds: Credentials): string | undefined {
  if (creds.username === '') return 'credentials.username is empty';
  // ':' separates user from hash; whitespace and control characters break the line format.
  if (/[:\s\p{Cc}]/u.test(creds.username))
    return 'credentials.username contains ":", whitespace or a control character';
  if (creds.password === '') return 'credentials.password is empty';
  if (/[\r\n\0]/.test(creds.password)) return 'credentials.password contains a line break or NUL';
  return undefined;
}

/** One `user:$apr1$…` line (with trailing newline); salt random unless given (tests). */
export function htpasswdLine(creds: Credentials, salt: string = randomSalt()): string {
  const problem = htpasswdProblem(creds);
  if (problem) throw new Error(problem);
  return `${creds.username}:${md5crypt(creds.password, salt)}\n`;
}
