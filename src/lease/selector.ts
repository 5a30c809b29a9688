/**
 * lease/selector — Kubernetes label-selector strings (`a=b,c!=d,e in (x,y),f notin (z),g,!h`)
 * parsed once into requirements, plus a canonical form so equal selectors share one index in
 * the lease store. Bad input throws SelectorError with a message a user can act on.
 */

export type Operator = 'eq' | 'neq' | 'in' | 'notin' | 'exists' | 'notexists';

export interface Requirement {
  key: string;
  op: Operator;
  values: string[];
}

export interface Selector {
  requirements: Requirement[];
  /** Sorted, normalised text: equal selectors have equal canonical strings. */
  canonical: string;
}

export class SelectorError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SelectorError';
  }
}

const NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function checkKey(key: string): void {
  const slash = key.indexOf('/');
  const name = slash < 0 ? key : key.slice(slash + 1);
  if (slash >= 0) {
    const prefix = key.slice(0, slash);
    if (prefix.length === 0 || prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix)) {
      throw new SelectorError(`invalid label key prefix in "${key}"`);
    }
  }
  if (name.length === 0 || name.length > 63 || !NAME.test(name)) {
    throw new SelectorError(`invalid label key "${key}"`);
  }
}

function checkValue(value: string): void {
  if (value.length > 63 || (value.length > 0 && !NAME.test(value))) {
    throw new SelectorError(`invalid label value "${value}"`);
  }
}

/** Splits on commas that are not inside parentheses. */
function splitTerms(text: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (c === ',' && depth === 0) {
      terms.push(text.slice(start, i));
      start = i + 1;
    }
    if (depth < 0 || depth > 1) throw new SelectorError('unbalanced parentheses');
  }
  if (depth !== 0) throw new SelectorError('unbalanced parentheses');
  terms.push(text.slice(start));
  return terms;
}

const SET_TERM = /^(\S+)\s+(in|notin)\s*\(([^()]*)\)$/;

function parseTerm(raw: string): Requirement {
  const term = raw.trim();
  if (term === '') throw new SelectorError('empty requirement');
  const set = SET_TERM.exec(term);
  if (set) {
    const [, key, op, list] = set as unknown as [string, string, 'in' | 'notin', string];
    checkKey(key);
    const values = list.split(',').map((v) => v.trim());
    if (values.length === 1 && values[0] === '') {
      throw new SelectorError(`"${key} ${op}" needs at least one value`);
    }
    values.forEach(checkValue);
    return { key, op, values: [...new Set(values)].sort() };
  }
  const eq = /^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/.exec(term);
  if (eq) {
    const [, key, opText, value] = eq as unknown as [string, string, string, string];
    checkKey(key);
    checkValue(value);
    return { key, op: opText === '!=' ? 'neq' : 'eq', values: [value] };
  }
  if (term.startsWith('!')) {
    const key = term.slice(1).trim();
    checkKey(key);
    return { key, op: 'notexists', values: [] };
  }
  if (/\s/.test(term) || /[=!()]/.test(term)) throw new SelectorError(`cannot parse "${term}"`);
  checkKey(term);
  return { key: term, op: 'exists', values: [] };
}

function render(r: Requirement): string {
  switch (r.op) {
    case 'eq':
      return `${r.key}=${r.values[0]}`;
    case 'neq':
      return `${r.key}!=${r.values[0]}`;
    case 'in':
      return `${r.key} in (${r.values.join(',')})`;
    case 'notin':
      return `${r.key} notin (${r.values.join(',')})`;
    case 'exists':
      return r.key;
    case 'notexists':
      return `!${r.key}`;
  }
}

/** Parses a selector; the empty string selects everything. Throws SelectorError. */
export function parseSelector(text: string): Selector {
  if (text.length > 4096) throw new SelectorError('selector longer than 4096 characters');
  if (text.trim() === '') return { requirements: [], canonical: '' };
  const requirements = splitTerms(text).map(parseTerm);
  const canonical = requirements
    .map(render)
    .sort()
    .filter((t, i, all) => i === 0 || all[i - 1] !== t)
    .join(',');
  return { requirements, canonical };
}

export function matchesSelector(sel: Selector, labels: Readonly<Record<string, string>>): boolean {
  for (const r of sel.requirements) {
    const v = Object.hasOwn(labels, r.key) ? labels[r.key] : undefined;
    switch (r.op) {
      case 'eq':
        if (v !== r.values[0]) return false;
        break;
      case 'neq':
        if (v === r.values[0]) return false;
        break;
      case 'in':
        if (v === undefined || !r.values.includes(v)) return false;
        break;
      case 'notin':
        if (v !== undefined && r.values.includes(v)) return false;
        break;
      case 'exists':
        if (v === undefined) return false;
        break;
      case 'notexists':
        if (v !== undefined) return false;
        break;
    }
  }
  return true;
}
