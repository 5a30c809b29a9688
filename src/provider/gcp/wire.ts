/**
 * provider/gcp/wire — optional full wire logging (`--gcp-wire-full-payloads`): every Compute
 * Engine request and response as one debug line each, bodies included, secrets redacted.
 *
 * google-gax's REST transport sends every call through `authClient.fetch(url, init)`
 * (fallbackServiceStub), so wrapping that one method of the provider's own auth client sees
 * all traffic of its InstancesClient and FirewallsClient — and nothing else of the process.
 */
import type { googleAuthLibrary } from 'google-gax';
import type { Logger } from 'pino';

type AuthClient = googleAuthLibrary.AuthClient;

/** Field names whose values never reach a log, whatever the object they sit in. */
const SECRET_FIELD = /pass(word|wd)?$|token|secret|private_?key|credential|authorization|api_?key/i;
/** Metadata keys whose values are cloud-init (credentials inside). */
const SECRET_METADATA_KEYS = new Set(['user-data', 'startup-script']);
/** Longest body logged; bigger ones (a full aggregatedList page) are cut. */
const MAX_BODY_CHARS = 64 * 1024;

const bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/**
 * A copy of a parsed JSON body with secrets replaced: values of secret-like field names, and
 * the `value` of `{key: "user-data", value}` metadata items (as `[redacted N bytes]`).
 */
export function redactJson(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(redactJson);
  if (value === null || typeof value !== 'object') return value;
  const obj = value as Record<string, unknown>;
  const cloudInit = typeof obj.key === 'string' && SECRET_METADATA_KEYS.has(obj.key);
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (cloudInit && k === 'value') {
      out[k] = typeof v === 'string' ? `[redacted ${bytes(v)} bytes]` : '[redacted]';
    } else if (SECRET_FIELD.test(k)) {
      out[k] = '[redacted]';
    } else {
      out[k] = redactJson(v);
    }
  }
  return out;
}

/** A body as it may be logged: redacted JSON, or a size note for anything else. */
export function redactBody(text: string | undefined): unknown {
  if (text === undefined || text === '') return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    // Not JSON: no way to know what is secret in it.
    return `[non-JSON body, ${bytes(text)} bytes]`;
  }
  const redacted = redactJson(parsed);
  const json = JSON.stringify(redacted);
  return json.length > MAX_BODY_CHARS
    ? `${json.slice(0, MAX_BODY_CHARS)}… [truncated, ${json.length} chars]`
    : redacted;
}

/**
 * The URL with secret-like query parameters (access_token, key) redacted and the rest kept: a
 * wire log is read to see what was asked (filter, pageToken), so it cannot use api/url's
 * redactUrl, which drops the whole query.
 */
export function redactSecretQuery(raw: string): string {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return raw;
  }
  for (const k of [...u.searchParams.keys()]) {
    if (SECRET_FIELD.test(k) || k === 'key') u.searchParams.set(k, '[redacted]');
  }
  return u.toString();
}

/** Request headers as a record, credentials redacted. */
export function redactHeaders(h: ConstructorParameters<typeof Headers>[0]): Record<string, string> {
  const out: Record<string, string> = {};
  if (!h) return out;
  for (const [k, v] of new Headers(h)) {
    out[k] = SECRET_FIELD.test(k) || k === 'cookie' ? '[redacted]' : v;
  }
  return out;
}

function urlOf(input: unknown): string {
  if (typeof input === 'string') return input;
  if (input instanceof URL) return input.toString();
  if (input && typeof input === 'object' && 'url' in input) return String(input.url);
  return '';
}

function bodyText(body: unknown): string | undefined {
  if (typeof body === 'string') return body;
  if (body instanceof Uint8Array) return Buffer.from(body).toString('utf8');
  return undefined;
}

/** The JSON error body of a rejected request, if any. */
function rejectionBody(data: unknown, message: unknown): string | undefined {
  for (const c of [data, message]) {
    if (typeof c !== 'string') continue;
    try {
      JSON.parse(c);
      return c;
    } catch {
      // not the body
    }
  }
  return undefined;
}

/** Response-ish shape seen on success (a fetch Response) and on a rejection (GaxiosError.response). */
interface WireResponse {
  status?: number;
  clone?: () => { text(): Promise<string> };
  data?: unknown;
}

/**
 * Wraps `auth.fetch` so each call logs a request line and a response (or failure) line at
 * debug level. Idempotent per client. The response body is read from a clone, so the client
 * still reads the original.
 */
export function enableWireLog(auth: AuthClient, log: Logger, now: () => number = Date.now): AuthClient {
  if (wrapped.has(auth)) return auth;
  wrapped.add(auth);
  const inner = auth.fetch.bind(auth);
  const fetch = async (...args: Parameters<AuthClient['fetch']>) => {
    const [input, init] = args as [unknown, (RequestInit & { method?: string }) | undefined];
    const method = (init?.method ?? 'GET').toUpperCase();
    const url = redactSecretQuery(urlOf(input));
    const start = now();
    log.debug(
      {
        wire: 'request',
        method,
        url,
        headers: redactHeaders(init?.headers),
        body: redactBody(bodyText(init?.body)),
      },
      'gcp wire request',
    );
    try {
      const res = await inner(...args);
      const r = res as unknown as WireResponse;
      let text: string | undefined;
      try {
        text = r.clone ? await r.clone().text() : undefined;
      } catch {
        text = undefined;
      }
      log.debug(
        {
          wire: 'response',
          method,
          url,
          status: r.status,
          durationMs: now() - start,
          body: redactBody(text),
        },
        'gcp wire response',
      );
      return res;
    } catch (err) {
      // 401/403 and transport errors reject. A GaxiosError carries the error body as its
      // response data or, once read off the stream, as its message (where gax decodes it too).
      const r = (err as { response?: WireResponse }).response;
      log.debug(
        {
          wire: 'response',
          method,
          url,
          status: r?.status,
          durationMs: now() - start,
          body: r ? redactBody(rejectionBody(r.data, (err as Error).message)) : undefined,
          // Only the error's code: a transport message may quote more than we want logged.
          error: r ? undefined : ((err as { code?: string }).code ?? (err as Error).name),
        },
        'gcp wire response',
      );
      throw err;
    }
  };
  auth.fetch = fetch as AuthClient['fetch'];
  return auth;
}

const wrapped = new WeakSet<AuthClient>();
