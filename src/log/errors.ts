/**
 * log/errors — the one way a thrown value becomes text or a log field. Errors from SDKs and
 * sockets carry more than a message (a request config with an Authorization header, a URL with
 * userinfo, a response body), so a logged error keeps only a fixed set of fields, and its text
 * goes through `redactSecrets` first. See docs/operations.md (Logs).
 */

/** The message of an Error, or the value as a string. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

const SECRET_PATTERNS: Array<[RegExp, string]> = [
  // scheme://user:password@host — keep the scheme and host, drop the userinfo.
  [/\b([a-z][a-z0-9+.-]*:\/\/)[^\s/@:]*:[^\s/@]*@/gi, '$1[redacted]@'],
  // Authorization / Proxy-Authorization values and bare bearer tokens.
  [/\b((?:proxy-)?authorization["']?\s*[:=]\s*["']?)(?:basic|bearer)?\s*[^\s"',;]+/gi, '$1[redacted]'],
  [/\b(bearer\s+)[a-z0-9._~+/=-]+/gi, '$1[redacted]'],
  // password=…, token=…, access_token=…, key=… in queries, forms and messages.
  [
    /\b((?:password|passwd|token|access_token|refresh_token|secret|api[_-]?key|key)=)[^\s&"',;]+/gi,
    '$1[redacted]',
  ],
];

/** `text` with credentials in URLs, auth headers and secret-like parameters replaced. */
export function redactSecrets(text: string): string {
  let out = text;
  for (const [re, by] of SECRET_PATTERNS) out = out.replace(re, by);
  return out;
}

export interface LoggedError {
  type: string;
  message: string;
  code?: string | number;
  reason?: string;
  errorClass?: string;
  cause?: LoggedError;
}

const MAX_CAUSES = 3;

/**
 * The fields of an error that go into a log line: its type, redacted message, and the short
 * classification fields our own errors carry (code, reason, errorClass), then its causes.
 * Anything else on the object — request configs, headers, bodies — is left out on purpose.
 */
export function serializeError(err: unknown, depth = 0): LoggedError | string {
  // A message already reduced to text stays text (redacted), as it was logged.
  if (!(err instanceof Error)) return redactSecrets(String(err));
  const out: LoggedError = {
    type: err.name || err.constructor?.name || 'Error',
    message: redactSecrets(err.message),
  };
  const fields = err as unknown as Record<string, unknown>;
  const code = fields.code;
  if (typeof code === 'string' || typeof code === 'number') out.code = code;
  if (typeof fields.reason === 'string') out.reason = fields.reason;
  if (typeof fields.errorClass === 'string') out.errorClass = fields.errorClass;
  if (err.cause !== undefined && depth < MAX_CAUSES) {
    const cause = serializeError(err.cause, depth + 1);
    out.cause = typeof cause === 'string' ? { type: typeof err.cause, message: cause } : cause;
  }
  return out;
}
