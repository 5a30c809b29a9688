/**
 * discovery/validation — turns malformed requests into precise 400s: a JSON-only body parser and
 * a TypeBox validator whose errors name the one field at fault (see docs/api.md).
 */
import type { FastifyInstance, FastifySchemaCompiler, FastifySchemaValidationError } from 'fastify';
import type { TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { Value } from 'typebox/value';
import { NAMESPACE_PATTERN, NAMESPACE_RULE } from '../lease/input.ts';

/** Human wording for the patterns the schemas use, instead of the regular expression. */
const PATTERN_RULES: Record<string, string> = { [NAMESPACE_PATTERN]: NAMESPACE_RULE };

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

function fieldOf(part: string, path: string): string {
  return path === '' ? part : path.slice(1).replaceAll('/', '.');
}

/** Turns TypeBox's error list into one message about one field, the most specific first. */
export function toFieldError(part: string, errors: FastifySchemaValidationError[]): FieldError {
  type E = FastifySchemaValidationError & { keyword: string; params: Record<string, unknown> };
  const list = errors as E[];
  const extra = list.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const names = (extra.params.additionalProperties as string[] | undefined) ?? [];
    const name = shorten(names[0] ?? '?');
    const at = fieldOf(part, extra.instancePath);
    const field = at === part ? name : `${at}.${name}`;
    return new FieldError(field, `unknown field "${field}" in ${part}`);
  }
  const required = list.find((e) => e.keyword === 'required');
  if (required) {
    const name = ((required.params.requiredProperties as string[] | undefined) ?? [])[0] ?? '?';
    return new FieldError(name, `${name} is required`);
  }
  const anyOf = list.find((e) => e.keyword === 'anyOf');
  if (anyOf) {
    const allowed = list
      .filter((e) => e.keyword === 'const' && e.instancePath === anyOf.instancePath)
      .map((e) => String(e.params.allowedValue));
    const field = fieldOf(part, anyOf.instancePath);
    if (allowed.length > 0) return new FieldError(field, `${field} must be one of ${allowed.join(', ')}`);
    return new FieldError(field, `${field} has an invalid value`);
  }
  const first = list[0];
  if (!first) return new FieldError(part, `${part} is invalid`);
  const field = fieldOf(part, first.instancePath);
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

const validatorCompiler: FastifySchemaCompiler<TSchema> = (route) => {
  const check = Compile(route.schema);
  const part = route.httpPart === 'querystring' ? 'query' : (route.httpPart ?? 'request');
  const convert = route.httpPart !== 'body' && needsConversion(route.schema);
  return (value: unknown) => {
    // A POST without a body means "all defaults", not "body must be object" (a JSON `null`
    // never gets here: the body parser refuses it).
    let input = route.httpPart === 'body' && (value === null || value === undefined) ? {} : value;
    if (convert) input = Value.Convert(route.schema, input);
    if (check.Check(input)) return { value: input };
    const errors = [...check.Errors(input)] as unknown as FastifySchemaValidationError[];
    return { error: toFieldError(part, errors) };
  };
};

/** Installs the validator and the body parser: only JSON bodies (else 415), empty JSON = no body. */
export function installValidation(app: FastifyInstance): void {
  app.setValidatorCompiler(validatorCompiler);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
    const text = body as string;
    if (text.trim() === '') return done(null, undefined);
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      done(new FieldError('body', `body is not valid JSON: ${(err as Error).message}`), undefined);
      return;
    }
    // `null` is a value the client wrote, not an absent body: no defaults for it.
    if (parsed === null) done(new FieldError('body', 'body must be a JSON object, not null'), undefined);
    else done(null, parsed);
  });
}
