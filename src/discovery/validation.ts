/**
 * discovery/validation — turns malformed requests into precise 400s: a JSON-only body parser
 * (UTF-8 only, every object key once) and a TypeBox validator whose errors name the one field at
 * fault (see docs/lease-api.md).
 */
import type { FastifyInstance, FastifySchemaCompiler, FastifySchemaValidationError } from 'fastify';
import type { TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import {
  childPath,
  didYouMean,
  formatPath,
  knownFields,
  type PathSegment,
  pointerSegments,
} from '../api/schema-errors.ts';
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

/** A 415: the body is JSON in a charset the API does not read (it reads UTF-8 only). */
export class MediaTypeError extends Error {
  readonly statusCode = 415;
  constructor(message: string) {
    super(message);
    this.name = 'MediaTypeError';
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

/**
 * Turns TypeBox's error list for `value` into one message about one field, the most specific first.
 * With the `schema` the errors came from, an unknown field names the nearest known one
 * (`unknown field "ttl" in body; did you mean "ttlSeconds"?`).
 */
export function toFieldError(
  part: string,
  errors: FastifySchemaValidationError[],
  value?: unknown,
  schema?: unknown,
): FieldError {
  type E = FastifySchemaValidationError & { keyword: string; params: Record<string, unknown> };
  const list = errors as E[];
  const within = (pointer: string, name: string): string =>
    pointer === '' ? name : childPath(fieldOf(part, value, pointer), name);
  const extra = list.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const names = (extra.params.additionalProperties as string[] | undefined) ?? [];
    const name = names[0] ?? '?';
    const field = within(extra.instancePath, shorten(name));
    const known = schema === undefined ? [] : knownFields(schema, extra.schemaPath);
    const hint = didYouMean(name, known, (near) => within(extra.instancePath, near));
    return new FieldError(field, `unknown field "${field}" in ${part}${hint}`);
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
 * when some property is not a string. Converting copies the value, on every request.
 */
function needsConversion(schema: TSchema): boolean {
  const properties = (schema as { properties?: Record<string, { type?: unknown }> }).properties;
  if (!properties) return true;
  return Object.values(properties).some((p) => p.type !== 'string');
}

const URL_INTEGER = /^-?(?:0|[1-9][0-9]*)$/;
const URL_NUMBER = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/;

/**
 * The strings of a query or path object converted to the types its schema declares — only those
 * written as such: `after=5` is 5, but `after=true`, `after=`, `after=0x10` and `after= 5` stay
 * strings and so fail the schema. (TypeBox's Value.Convert reads `true` as 1 and `""` as 0.)
 */
export function convertUrlValues(schema: TSchema, value: unknown): unknown {
  if (typeof value !== 'object' || value === null) return value;
  const properties = (schema as { properties?: Record<string, { type?: unknown }> }).properties ?? {};
  let out: Record<string, unknown> | undefined;
  for (const [key, v] of Object.entries(value)) {
    if (typeof v !== 'string') continue;
    const type = properties[key]?.type;
    let converted: unknown;
    if (type === 'integer' && URL_INTEGER.test(v)) converted = Number(v);
    else if (type === 'number' && URL_NUMBER.test(v)) converted = Number(v);
    else if (type === 'boolean' && (v === 'true' || v === 'false')) converted = v === 'true';
    else continue;
    out ??= { ...value };
    out[key] = converted;
  }
  return out ?? value;
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
    if (convert) input = convertUrlValues(schema, input);
    if (check.Check(input)) return { value: input };
    const errors = [...check.Errors(input)] as unknown as FastifySchemaValidationError[];
    return { error: toFieldError(part, errors, input, schema) };
  };
}

const validatorCompiler: FastifySchemaCompiler<TSchema> = (route) =>
  requestValidator(route.schema, route.httpPart);

/**
 * The path of the first object key that `text` (valid JSON) holds twice, or undefined. JSON.parse
 * keeps the last of them silently, so `{"ttlSeconds":60,"ttlSeconds":3600}` would mean whatever
 * the client's serialiser happened to put last. Keys compare as decoded (`"a"` = `"\u0061"`).
 */
export function duplicateKey(text: string): PathSegment[] | undefined {
  // One frame per open container: an object's keys so far (and the one being read), or an
  // array's current index; together they are the path to where the scan is.
  type Frame = { keys: Set<string>; key: string } | { index: number };
  const stack: Frame[] = [];
  let keyNext = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      let end = i + 1;
      while (text.charCodeAt(end) !== 0x22) end += text.charCodeAt(end) === 0x5c ? 2 : 1;
      const top = stack.at(-1);
      if (keyNext && top && 'keys' in top) {
        const raw = text.slice(i, end + 1);
        const key = raw.includes('\\') ? (JSON.parse(raw) as string) : raw.slice(1, -1);
        if (top.keys.has(key)) {
          const path = stack.slice(0, -1).map((f) => ('keys' in f ? f.key : f.index));
          return [...path, key];
        }
        top.keys.add(key);
        top.key = key;
        keyNext = false;
      }
      i = end;
    } else if (c === 0x7b) {
      stack.push({ keys: new Set(), key: '' });
      keyNext = true;
    } else if (c === 0x5b) {
      stack.push({ index: 0 });
    } else if (c === 0x7d || c === 0x5d) {
      stack.pop();
      keyNext = false;
    } else if (c === 0x2c) {
      const top = stack.at(-1);
      if (top && 'keys' in top) keyNext = true;
      else if (top) top.index++;
    }
  }
  return undefined;
}

/**
 * A request body as the API reads it: JSON only, blank text is no body (undefined), `null` is
 * refused — it is a value the client wrote, not an absent body — and so is a key given twice.
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
  // Only objects have keys to repeat.
  if (typeof parsed === 'object') {
    const dup = duplicateKey(text);
    if (dup) {
      const field = formatPath(dup.map((s) => (typeof s === 'string' ? shorten(s) : s)));
      return {
        error: new FieldError(field, `${field} appears more than once in body; each key may be given once`),
      };
    }
  }
  return { value: parsed };
}

/** The charset parameter of a Content-Type header, lowercased and unquoted; undefined without one. */
export function charsetOf(contentType: string | undefined): string | undefined {
  if (!contentType) return undefined;
  for (const param of contentType.split(';').slice(1)) {
    const eq = param.indexOf('=');
    if (eq < 0 || param.slice(0, eq).trim().toLowerCase() !== 'charset') continue;
    return param
      .slice(eq + 1)
      .trim()
      .replace(/^"(.*)"$/, '$1')
      .toLowerCase();
  }
  return undefined;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The body's bytes as JSON text: JSON is UTF-8 (RFC 8259), so a body in another charset is a 415
 * that names it (never read as UTF-8, which would turn UTF-16 into garbage that may still parse),
 * and bytes that are not UTF-8 are a 400. A leading byte-order mark is dropped.
 */
export function decodeJsonBody(
  bytes: Uint8Array,
  contentType: string | undefined,
): { text: string; error?: undefined } | { error: FieldError | MediaTypeError } {
  const charset = charsetOf(contentType);
  if (charset !== undefined && charset !== 'utf-8' && charset !== 'utf8') {
    return {
      error: new MediaTypeError(
        `charset "${shorten(charset)}" is not supported: send the body as UTF-8 (application/json, or application/json; charset=utf-8)`,
      ),
    };
  }
  try {
    return { text: UTF8.decode(bytes) };
  } catch {
    return { error: new FieldError('body', 'body is not valid UTF-8') };
  }
}

/**
 * Installs the validator and the body parser: only JSON bodies (else 415), in UTF-8 (else 415),
 * empty JSON = no body.
 */
export function installValidation(app: FastifyInstance): void {
  app.setValidatorCompiler(validatorCompiler);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body, done) => {
    const decoded = decodeJsonBody(body as Buffer, req.headers['content-type']);
    if (decoded.error) return done(decoded.error, undefined);
    const parsed = parseJsonBody(decoded.text);
    if (parsed.error) done(parsed.error, undefined);
    else done(null, parsed.value);
  });
}
