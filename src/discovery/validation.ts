/**
 * discovery/validation — turns malformed requests into precise 400s: a JSON-only body parser and
 * a TypeBox validator whose errors name the one field at fault (see docs/lease-api.md).
 */
import type { FastifyInstance, FastifySchemaCompiler, FastifySchemaValidationError } from 'fastify';
import type { TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { Value } from 'typebox/value';
import { childPath, formatPath, pointerSegments } from '../api/schema-errors.ts';
import { UPSTREAM_KEY_PATTERN } from '../gateway/share.ts';
import { NAMESPACE_PATTERN, NAMESPACE_RULE } from '../lease/input.ts';

/** Human wording for the patterns the schemas use, instead of the regular expression. */
const PATTERN_RULES: Record<string, string> = {
  [NAMESPACE_PATTERN]: NAMESPACE_RULE,
  [UPSTREAM_KEY_PATTERN]: 'must name an upstream as namespace/name',
};

/** A 400 that names the request field at fault. */
export class FieldError extends Error {
  readonly field: string;
  readonly statusCode = 400;
  constructor(field: string, message: string) {
    super(message);
    this.name = 'FieldError';
    this.field = field;
  }
}

/** A client-chosen name as messages quote it: never more than a short prefix. */
function shorten(name: string): string {
  return name.length > 64 ? `${name.slice(0, 63)}…` : name;
}

/**
 * The field a JSON pointer into `root` names, as a user writes it (`proxy.name`, `reports[0].target`,
 * `want["crawl/x"]`: api/schema-errors), or the request part itself for the whole value.
 */
function fieldOf(part: string, root: unknown, pointer: string): string {
  return pointer === '' ? part : formatPath(pointerSegments(root, pointer));
}

/** Turns TypeBox's error list for `value` into one message about one field, the most specific first. */
export function toFieldError(
  part: string,
  errors: FastifySchemaValidationError[],
  value?: unknown,
): FieldError {
  type E = FastifySchemaValidationError & { keyword: string; params: Record<string, unknown> };
  const list = errors as E[];
  const within = (pointer: string, name: string): string =>
    pointer === '' ? name : childPath(fieldOf(part, value, pointer), name);
  const extra = list.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const names = (extra.params.additionalProperties as string[] | undefined) ?? [];
    const field = within(extra.instancePath, shorten(names[0] ?? '?'));
    return new FieldError(field, `unknown field "${field}" in ${part}`);
  }
  const required = list.find((e) => e.keyword === 'required');
  if (required) {
    const name = ((required.params.requiredProperties as string[] | undefined) ?? [])[0] ?? '?';
    const field = within(required.instancePath, name);
    return new FieldError(field, `${field} is required`);
  }
  const anyOf = list.find((e) => e.keyword === 'anyOf');
  if (anyOf) {
    const allowed = list
      .filter((e) => e.keyword === 'const' && e.instancePath === anyOf.instancePath)
      .map((e) => String(e.params.allowedValue));
    const field = fieldOf(part, value, anyOf.instancePath);
    if (allowed.length > 0) return new FieldError(field, `${field} must be one of ${allowed.join(', ')}`);
    return new FieldError(field, `${field} has an invalid value`);
  }
  const first = list[0];
  if (!first) return new FieldError(part, `${part} is invalid`);
  const field = fieldOf(part, value, first.instancePath);
  const rule = first.keyword === 'pattern' ? PATTERN_RULES[String(first.params.pattern)] : undefined;
  if (rule) return new FieldError(field, `${field} ${rule}`);
  return new FieldError(field, `${field} ${first.message}`);
}

/**
 * Whether values of a path or query schema need converting from the strings a URL carries: only
 * when some property is not a string. Converting clones the value, on every request.
 */
function needsConversion(schema: TSchema): boolean {
  const properties = (schema as { properties?: Record<string, { type?: unknown }> }).properties;
  if (!properties) return true;
  return Object.values(properties).some((p) => p.type !== 'string');
}

/** A checked value, or the 400 that names the field at fault. */
export type Checked = { value: unknown; error?: undefined } | { error: FieldError };

/** The check of one request part against its schema, as every route runs it. */
export function requestValidator(schema: TSchema, httpPart: string | undefined): (value: unknown) => Checked {
  const check = Compile(schema);
  const part = httpPart === 'querystring' ? 'query' : (httpPart ?? 'request');
  const convert = httpPart !== 'body' && needsConversion(schema);
  return (value: unknown) => {
    // A POST without a body means "all defaults", not "body must be object" (a JSON `null`
    // never gets here: the body parser refuses it).
    let input = httpPart === 'body' && (value === null || value === undefined) ? {} : value;
    if (convert) input = Value.Convert(schema, input);
    if (check.Check(input)) return { value: input };
    const errors = [...check.Errors(input)] as unknown as FastifySchemaValidationError[];
    return { error: toFieldError(part, errors, input) };
  };
}

const validatorCompiler: FastifySchemaCompiler<TSchema> = (route) =>
  requestValidator(route.schema, route.httpPart);

/**
 * A request body as the API reads it: JSON only, blank text is no body (undefined), and `null`
 * is refused — it is a value the client wrote, not an absent body.
 */
export function parseJsonBody(text: string): Checked {
  if (text.trim() === '') return { value: undefined };
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    return { error: new FieldError('body', `body is not valid JSON: ${(err as Error).message}`) };
  }
  if (parsed === null) return { error: new FieldError('body', 'body must be a JSON object, not null') };
  return { value: parsed };
}

/** Installs the validator and the body parser: only JSON bodies (else 415), empty JSON = no body. */
export function installValidation(app: FastifyInstance): void {
  app.setValidatorCompiler(validatorCompiler);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
    const parsed = parseJsonBody(body as string);
    if (parsed.error) done(parsed.error, undefined);
    else done(null, parsed.value);
  });
}
