/**
 * gateway/auth — who may use the gateway (docs/gateway.md, "Authentication"): HTTP Basic with
 * the gateway token as the password (`GATEWAY_TOKEN`, else `DISCOVERY_TOKEN`), compared in
 * constant time; the user name carries the routing options (gateway/username). Without any
 * token the gateway serves loopback clients only.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { decodeBasic, PROXY_AUTHENTICATE } from '../provider/local/auth.ts';
import { parseUsername, type RoutingOptions } from './username.ts';

export { PROXY_AUTHENTICATE };

/**
 * The gateway token from the environment: GATEWAY_TOKEN when set, else DISCOVERY_TOKEN, else
 * undefined. A variable that is set but blank is an error naming it (never silently open).
 */
export function gatewayTokenFromEnv(env: NodeJS.ProcessEnv): string | undefined {
  for (const name of ['GATEWAY_TOKEN', 'DISCOVERY_TOKEN'] as const) {
    const raw = env[name];
    if (raw === undefined) continue;
    const token = raw.trim();
    if (token === '') {
      throw new Error(
        `${name} is set but ${raw === '' ? 'empty' : 'blank (whitespace only)'}: set a real token, or unset the variable`,
      );
    }
    return token;
  }
  return undefined;
}

export type AuthOutcome =
  | { ok: true; options: RoutingOptions }
  /** `message` is safe to send back: it never contains the password. */
  | { ok: false; message: string };

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/**
 * A checker for `Proxy-Authorization` values. With a token, the password must equal it; without
 * one, any password passes (the listener then serves loopback only) but the user name must
 * still parse, so routing options behave the same in both setups.
 */
export function gatewayAuthChecker(token: string | undefined): (header: string | undefined) => AuthOutcome {
  const expected = token === undefined ? undefined : digest(token);
  return (header) => {
    const presented = decodeBasic(header);
    if (presented === undefined) {
      return {
        ok: false,
        message: 'proxy authentication required: user name crawler[-options], password the gateway token',
      };
    }
    const colon = presented.indexOf(':');
    if (expected !== undefined && !timingSafeEqual(digest(presented.slice(colon + 1)), expected)) {
      return { ok: false, message: 'wrong gateway token' };
    }
    const parsed = parseUsername(presented.slice(0, colon));
    return parsed.ok ? { ok: true, options: parsed.options } : { ok: false, message: parsed.message };
  };
}

/** Whether a client address is this machine's loopback (the only clients a tokenless gateway serves). */
export function isLoopbackClient(address: string | undefined): boolean {
  if (address === undefined) return false;
  return address === '::1' || address.startsWith('127.') || address.startsWith('::ffff:127.');
}
