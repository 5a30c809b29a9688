/**
 * runtime/selector — Kubernetes label selectors (`a=b,c!=d,e in (x,y),f notin (z),g,!h`):
 * parse once, match many. The one selector module: both store backends, the Kubernetes test
 * server and the lease store use it, so a selector means the same thing everywhere. A parsed
 * selector carries a canonical text so that equal selectors written differently compare equal
 * (the lease store shares one candidate view between them).
 */

export type Requirement =
  | { key: string; op: 'eq' | 'neq'; value: string }
  | { key: string; op: 'in' | 'notin'; values: string[] }
  | { key: string; op: 'exists' | 'notexists' };

export interface Selector {
  requirements: readonly Requirement[];
  /** Sorted, normalised text: equal selectors have equal canonical strings. */
  canonical: string;
}

export class SelectorError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SelectorError';
  }
}

const KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;

function checkKey(key: string, sel: string): string {
  if (!KEY.test(key)) throw new SelectorError(`invalid label key "${key}" in selector "${sel}"`);
  return key;
}

function checkValue(value: string, sel: string): string {
  if (value.length > 63 || !VALUE.test(value)) {
    throw new SelectorError(`invalid label value "${value}" in selector "${sel}"`);
  }
  return value;
}

/** Split on commas that are not inside parentheses. */
function splitTerms(sel: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < sel.length; i++) {
    const c = sel[i];
    if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (c === ',' && depth === 0) {
      terms.push(sel.slice(start, i));
      start = i + 1;
    }
    if (depth < 0) throw new SelectorError(`unbalanced parentheses in selector "${sel}"`);
  }
  if (depth !== 0) throw new SelectorError(`unbalanced parentheses in selector "${sel}"`);
  terms.push(sel.slice(start));
  return terms.map((t) => t.trim());
}

function parseTerm(term: string, sel: string): Requirement {
  if (term === '') throw new SelectorError(`empty requirement in selector "${sel}"`);
  const set = /^(\S+)\s+(in|notin)\s*\((.*)\)$/.exec(term);
  if (set) {
    const values = (set[3] ?? '').split(',').map((v) => v.trim());
    if (values.some((v) => v === '')) throw new SelectorError(`empty value in set in selector "${sel}"`);
    return {
      key: checkKey(set[1] ?? '', sel),
      op: set[2] === 'in' ? 'in' : 'notin',
      values: values.map((v) => checkValue(v, sel)),
    };
  }
  const eq = /^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/.exec(term);
  if (eq) {
    return {
      key: checkKey(eq[1] ?? '', sel),
      op: eq[2] === '!=' ? 'neq' : 'eq',
      value: checkValue(eq[3] ?? '', sel),
    };
  }
  if (term.startsWith('!')) return { key: checkKey(term.slice(1).trim(), sel), op: 'notexists' };
  return { key: checkKey(term, sel), op: 'exists' };
}

function render(r: Requirement): string {
  switch (r.op) {
    case 'eq':
      return `${r.key}=${r.value}`;
    case 'neq':
      return `${r.key}!=${r.value}`;
    case 'in':
    case 'notin':
      return `${r.key} ${r.op} (${[...new Set(r.values)].sort().join(',')})`;
    case 'exists':
      return r.key;
    case 'notexists':
      return `!${r.key}`;
  }
}

/** Parses a label selector; empty or undefined selects everything. Throws SelectorError. */
export function parseSelector(sel: string | undefined): Selector {
  if (sel === undefined || sel.trim() === '') return { requirements: [], canonical: '' };
  const requirements = splitTerms(sel).map((t) => parseTerm(t, sel));
  const canonical = [...new Set(requirements.map(render))].sort().join(',');
  return { requirements, canonical };
}

export function matchesSelector(selector: Selector, labels: Record<string, string> | undefined): boolean {
  const l = labels ?? {};
  for (const r of selector.requirements) {
    const has = Object.hasOwn(l, r.key);
    const v = l[r.key];
    switch (r.op) {
      case 'eq':
        if (!has || v !== r.value) return false;
        break;
      case 'neq':
        if (has && v === r.value) return false;
        break;
      case 'in':
        if (!has || !r.values.includes(v as string)) return false;
        break;
      case 'notin':
        if (has && r.values.includes(v as string)) return false;
        break;
      case 'exists':
        if (!has) return false;
        break;
      case 'notexists':
        if (has) return false;
        break;
    }
  }
  return true;
}

/** Convenience: parse and match in one go (parse errors throw). */
export function labelsMatch(sel: string | undefined, labels: Record<string, string> | undefined): boolean {
  return matchesSelector(parseSelector(sel), labels);
}

export type FieldPredicate = (obj: { metadata: { name: string; namespace?: string } }) => boolean;

const FIELDS: Record<string, (obj: { metadata: { name: string; namespace?: string } }) => string> = {
  'metadata.name': (o) => o.metadata.name,
  'metadata.namespace': (o) => o.metadata.namespace ?? '',
};

/** Field selectors as the apiserver supports them for every type: metadata.name and metadata.namespace. */
export function parseFieldSelector(sel: string | undefined): FieldPredicate {
  if (sel === undefined || sel.trim() === '') return () => true;
  const reqs = sel.split(',').map((term) => {
    const m = /^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$/.exec(term);
    const get = m ? FIELDS[m[1] ?? ''] : undefined;
    if (!m || !get) throw new SelectorError(`field label not supported: "${term.trim()}"`);
    return { get, neq: m[2] === '!=', value: m[3] ?? '' };
  });
  return (obj) => reqs.every((r) => (r.get(obj) === r.value) !== r.neq);
}
