/**
 * api/schema-errors — turns TypeBox (JSON Schema) validation errors into field errors that name
 * the offending field the way a user writes it (`spec.healthCheck.timeoutSeconds`,
 * `providers[1].kvm.hosts[0].name`) with a plain-English message. Shared by the Proxy validator
 * and the providers-config validator so both speak the same language. An unknown field comes with
 * the nearest known one (`nearestField`), which the lease API's validator uses too.
 */
import type { TLocalizedValidationError } from 'typebox/error';

/** One problem with one field. `path` is dotted with `[i]` for list items. */
export interface FieldError {
  path: string;
  message: string;
}

export type PathSegment = string | number;

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** `['spec', 'x', 0, 'a-b']` → `spec.x[0]["a-b"]`. Map keys that are not identifiers are quoted. */
export function formatPath(segments: readonly PathSegment[]): string {
  let out = '';
  for (const seg of segments) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (IDENTIFIER.test(seg)) out += out === '' ? seg : `.${seg}`;
    else out += `[${JSON.stringify(seg)}]`;
  }
  return out;
}

/** Joins a parent path and a child segment. */
export function childPath(parent: string, seg: PathSegment): string {
  return parent === '' ? formatPath([seg]) : parent + formatPath(['_', seg]).slice(1);
}

/** JSON pointer → segments, with array indices as numbers (decided by the value being walked). */
export function pointerSegments(root: unknown, pointer: string): PathSegment[] {
  if (pointer === '') return [];
  const raw = pointer
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  const out: PathSegment[] = [];
  let cur: unknown = root;
  for (const seg of raw) {
    if (Array.isArray(cur) && /^\d+$/.test(seg)) {
      const i = Number(seg);
      out.push(i);
      cur = cur[i];
    } else {
      out.push(seg);
      cur = cur !== null && typeof cur === 'object' ? (cur as Record<string, unknown>)[seg] : undefined;
    }
  }
  return out;
}

/** Case, `-` and `_` aside: `TTL_seconds` and `ttlSeconds` are the same name to a reader. */
function normalized(name: string): string {
  return name.toLowerCase().replace(/[-_]/g, '');
}

/** Edit distance with adjacent transpositions (optimal string alignment): `namsepace` is 1 from `namespace`. */
export function editDistance(a: string, b: string): number {
  const rows: number[][] = [];
  for (let i = 0; i <= a.length; i++) rows.push([i]);
  for (let j = 1; j <= b.length; j++) rows[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    const row = rows[i]!;
    const prev = rows[i - 1]!;
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d = Math.min(d, rows[i - 2]![j - 2]! + 1);
      row[j] = d;
    }
  }
  return rows[a.length]![b.length]!;
}

/**
 * The known field a user most likely meant by `name`, or undefined when none is close. Compared
 * without case, `-` and `_`: the same name written differently first (`TTLSeconds`, `ttl_seconds`),
 * then a typo — an edit distance of at most a third of the name (at least 1; transpositions count
 * 1) — then a name one of the two starts (`ttl` → `ttlSeconds`, `cooldown` → `cooldownSeconds`;
 * three characters at least). Within each, the smallest edit distance, then the first known.
 */
export function nearestField(name: string, known: Iterable<string>): string | undefined {
  const n = normalized(name);
  if (n === '' || name.length > 64) return undefined;
  const limit = Math.max(1, Math.floor(n.length / 3));
  let best: string | undefined;
  let bestRank = Number.POSITIVE_INFINITY;
  for (const field of known) {
    if (field === name) continue;
    const k = normalized(field);
    const d = editDistance(n, k);
    const short = Math.min(n.length, k.length);
    let tier: number;
    if (d === 0) tier = 0;
    else if (d <= limit) tier = 1;
    else if (short >= 3 && (k.startsWith(n) || n.startsWith(k))) tier = 2;
    else continue;
    const rank = tier * 1000 + d;
    if (rank < bestRank) {
      best = field;
      bestRank = rank;
    }
  }
  return best;
}

/** `; did you mean "ttlSeconds"?` when a known field is near `name`, else nothing. `as` writes the suggestion (a full path). */
export function didYouMean(
  name: string,
  known: Iterable<string>,
  as: (field: string) => string = (f) => f,
): string {
  const near = nearestField(name, known);
  return near === undefined ? '' : `; did you mean ${JSON.stringify(as(near))}?`;
}

/**
 * The property names of the object schema at `schemaPath` (a JSON pointer into `schema` such as
 * TypeBox's errors carry: `#/properties/spec`), or none when the pointer leads to no object schema.
 */
export function knownFields(schema: unknown, schemaPath: string): string[] {
  let cur: unknown = schema;
  const segs = schemaPath.replace(/^#/, '').split('/').slice(1);
  for (const raw of segs) {
    const seg = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (cur === null || typeof cur !== 'object') return [];
    cur = (cur as Record<string, unknown>)[seg];
  }
  const properties =
    cur !== null && typeof cur === 'object' ? (cur as { properties?: unknown }).properties : undefined;
  return properties !== null && typeof properties === 'object' ? Object.keys(properties) : [];
}

function valueAt(root: unknown, segments: readonly PathSegment[]): unknown {
  let cur: unknown = root;
  for (const seg of segments) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string | number, unknown>)[seg];
  }
  return cur;
}

function describeType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'a list';
  switch (typeof value) {
    case 'object':
      return 'an object';
    case 'string':
      return 'a string';
    case 'number':
      return Number.isInteger(value) ? 'an integer' : 'a number';
    case 'boolean':
      return 'a boolean';
    default:
      return typeof value;
  }
}

const TYPE_NAMES: Record<string, string> = {
  object: 'an object',
  array: 'a list',
  string: 'a string',
  integer: 'an integer',
  number: 'a number',
  boolean: 'a boolean',
  null: 'null',
};

/**
 * Shows a rejected value only when it is short and cannot be sensitive (numbers, booleans, short
 * enum-like strings). Free text such as cloud-init or URLs is never echoed.
 */
function shown(value: unknown): string {
  if (typeof value === 'number' || typeof value === 'boolean') return ` (got ${value})`;
  if (typeof value === 'string' && value.length <= 64 && /^[\w.:/@-]*$/.test(value)) {
    return ` (got ${JSON.stringify(value)})`;
  }
  return '';
}

function num(params: unknown, key: string): unknown {
  return params !== null && typeof params === 'object' ? (params as Record<string, unknown>)[key] : undefined;
}

/**
 * Converts TypeBox errors for `root` into field errors, prefixed with `base` segments. Duplicates
 * collapse; alternatives of one literal union become a single "must be one of" error. With the
 * `schema` the errors came from, an unknown field names the nearest known one
 * (`unknown field; did you mean "timeoutSeconds"?`).
 */
export function schemaErrors(
  root: unknown,
  errors: readonly TLocalizedValidationError[],
  base: readonly PathSegment[] = [],
  schema?: unknown,
): FieldError[] {
  const out: FieldError[] = [];
  const seen = new Set<string>();
  const consts = new Map<string, { segs: PathSegment[]; values: unknown[] }>();
  const push = (segs: readonly PathSegment[], message: string, same = message) => {
    const path = formatPath([...base, ...segs]);
    const key = `${path}\u0000${same}`;
    if (seen.has(key)) return;
    seen.add(key);
    out.push({ path, message });
  };
  for (const e of errors) {
    const segs = pointerSegments(root, e.instancePath);
    const value = valueAt(root, segs);
    const p = e.params;
    switch (e.keyword) {
      case 'boolean':
        // `additionalProperties: false` reports each extra key twice; the
        // additionalProperties error below names it.
        break;
      case 'additionalProperties': {
        const extra = num(p, 'additionalProperties');
        const known = schema === undefined ? [] : knownFields(schema, e.schemaPath);
        for (const name of Array.isArray(extra) ? extra : []) {
          // One error per field, whichever branch of a union reported it first.
          push([...segs, String(name)], `unknown field${didYouMean(String(name), known)}`, 'unknown field');
        }
        break;
      }
      case 'required': {
        const missing = num(p, 'requiredProperties');
        for (const name of Array.isArray(missing) ? missing : [])
          push([...segs, String(name)], 'is required');
        break;
      }
      case 'type': {
        const want = String(num(p, 'type'));
        push(segs, `must be ${TYPE_NAMES[want] ?? want}, not ${describeType(value)}`);
        break;
      }
      case 'enum': {
        const allowed = num(p, 'allowedValues');
        const list = Array.isArray(allowed) ? allowed.map(String).join(', ') : '';
        push(segs, `must be one of ${list}${shown(value)}`);
        break;
      }
      case 'const': {
        const key = formatPath(segs);
        const entry = consts.get(key) ?? { segs, values: [] };
        entry.values.push(num(p, 'allowedValue'));
        consts.set(key, entry);
        break;
      }
      case 'anyOf':
      case 'oneOf':
        if (!consts.has(formatPath(segs))) push(segs, 'does not match any allowed form');
        break;
      case 'minimum':
        push(segs, `must be at least ${num(p, 'limit')}${shown(value)}`);
        break;
      case 'maximum':
        push(segs, `must be at most ${num(p, 'limit')}${shown(value)}`);
        break;
      case 'exclusiveMinimum':
        push(segs, `must be greater than ${num(p, 'limit')}${shown(value)}`);
        break;
      case 'exclusiveMaximum':
        push(segs, `must be less than ${num(p, 'limit')}${shown(value)}`);
        break;
      case 'minLength': {
        const limit = Number(num(p, 'limit'));
        push(segs, limit === 1 ? 'must not be empty' : `must be at least ${limit} characters long`);
        break;
      }
      case 'maxLength':
        push(segs, `must be at most ${num(p, 'limit')} characters long`);
        break;
      case 'minItems':
        push(segs, `must have at least ${num(p, 'limit')} item(s)`);
        break;
      case 'maxItems':
        push(segs, `must have at most ${num(p, 'limit')} item(s)`);
        break;
      case 'pattern':
        push(segs, `must match the pattern ${num(p, 'pattern')}`);
        break;
      case 'format':
        push(segs, `must be a valid ${num(p, 'format')}`);
        break;
      default:
        push(segs, e.message);
    }
  }
  for (const { segs, values } of consts.values()) {
    const value = valueAt(root, segs);
    push(segs, `must be one of ${values.map(String).join(', ')}${shown(value)}`);
  }
  return out;
}

/** One readable line per error: `spec.port: must be at most 65535 (got 70000)`. */
export function formatFieldErrors(errors: readonly FieldError[], subject?: string): string {
  const lead = subject ? `${subject}: ` : '';
  return errors.map((e) => `${lead}${e.path === '' ? '' : `${e.path}: `}${e.message}`).join('\n');
}
