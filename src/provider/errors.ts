/**
 * provider/errors — the four error classes the reconciler acts on. Providers wrap backend
 * errors in ProviderError with a class; anything unclassified is treated as transient. Being
 * a ProviderError also says where a failure came from: only those are the provider's verdict.
 */
import { errorMessage } from '../log/errors.ts';

export const ERROR_CLASSES = ['NotFound', 'QuotaExceeded', 'Permanent', 'Transient'] as const;
export type ErrorClass = (typeof ERROR_CLASSES)[number];

export class ProviderError extends Error {
  readonly errorClass: ErrorClass;
  readonly op: string | undefined;
  readonly provider: string | undefined;
  readonly providerID: string | undefined;

  constructor(
    errorClass: ErrorClass,
    message: string,
    opts: { cause?: unknown; op?: string; provider?: string; providerID?: string } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = `${errorClass}Error`;
    this.errorClass = errorClass;
    this.op = opts.op;
    this.provider = opts.provider;
    this.providerID = opts.providerID;
  }
}

export const notFound = (message: string, opts?: ConstructorParameters<typeof ProviderError>[2]) =>
  new ProviderError('NotFound', message, opts);
export const quotaExceeded = (message: string, opts?: ConstructorParameters<typeof ProviderError>[2]) =>
  new ProviderError('QuotaExceeded', message, opts);
export const permanent = (message: string, opts?: ConstructorParameters<typeof ProviderError>[2]) =>
  new ProviderError('Permanent', message, opts);
export const transient = (message: string, opts?: ConstructorParameters<typeof ProviderError>[2]) =>
  new ProviderError('Transient', message, opts);

/**
 * The class of an error, looking through `cause` chains and AggregateErrors (the most severe
 * class wins: Permanent > QuotaExceeded > Transient > NotFound only if all are NotFound).
 */
export function classify(err: unknown): ErrorClass {
  const seen = new Set<unknown>();
  const found: ErrorClass[] = [];
  const walk = (e: unknown): void => {
    if (e === null || e === undefined || seen.has(e)) return;
    seen.add(e);
    if (e instanceof ProviderError) {
      found.push(e.errorClass);
      return;
    }
    if (e instanceof AggregateError) {
      for (const inner of e.errors) walk(inner);
      return;
    }
    if (e instanceof Error && e.cause !== undefined) walk(e.cause);
  };
  walk(err);
  if (found.length === 0) return 'Transient';
  for (const c of ['Permanent', 'QuotaExceeded', 'Transient'] as const) if (found.includes(c)) return c;
  return 'NotFound';
}

/** Wrap any error with a class and call site, keeping the original as `cause`. */
export function wrap(
  errorClass: ErrorClass,
  err: unknown,
  where: { op: string; provider: string; providerID?: string },
): ProviderError {
  const detail = err instanceof Error ? err.message : String(err);
  const target = where.providerID ? ` ${where.providerID}` : '';
  return new ProviderError(errorClass, `${where.provider} ${where.op}${target}: ${detail}`, {
    cause: err,
    ...where,
  });
}

/**
 * `err` as a ProviderError: one already is passes unchanged; anything else keeps its message,
 * gets the class `classify` finds in it (Transient when none) and becomes the cause.
 */
export function asProviderError(
  err: unknown,
  where: { op: string; provider: string; providerID?: string | undefined },
): ProviderError {
  if (err instanceof ProviderError) return err;
  return new ProviderError(classify(err), errorMessage(err), { cause: err, ...callSite(where).opts });
}

/** Message prefix and ProviderError options for a failed call at `where`. */
export function callSite(where: { op: string; provider: string; providerID?: string | undefined }): {
  prefix: string;
  opts: { op: string; provider: string; providerID?: string };
} {
  const target = where.providerID ? ` ${where.providerID}` : '';
  return {
    prefix: `${where.provider} ${where.op}${target}`,
    opts: {
      op: where.op,
      provider: where.provider,
      ...(where.providerID === undefined ? {} : { providerID: where.providerID }),
    },
  };
}

/** Replaces every occurrence of each secret (longer than 3 characters) with `[redacted]`. */
export function redact(text: string, secrets: readonly string[] = []): string {
  let out = text;
  for (const s of secrets) if (s.length > 3) out = out.split(s).join('[redacted]');
  return out;
}
