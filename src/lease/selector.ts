/**
 * lease/selector — label selectors as the lease store uses them: parsed by the shared parser
 * (runtime/selector), plus a canonical text so that equal selectors written differently share
 * one candidate index in the store.
 */
import {
  matchesSelector as matchRequirements,
  parseSelector as parseRequirements,
  type Requirement,
  SelectorError,
} from '../runtime/selector.ts';

export { SelectorError } from '../runtime/selector.ts';

export interface Selector {
  requirements: readonly Requirement[];
  /** Sorted, normalised text: equal selectors have equal canonical strings. */
  canonical: string;
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

/** Parses a selector; the empty string selects everything. Throws SelectorError. */
export function parseSelector(text: string): Selector {
  if (text.length > 4096) throw new SelectorError('selector is longer than 4096 characters');
  const requirements = parseRequirements(text);
  const canonical = [...new Set(requirements.map(render))].sort().join(',');
  return { requirements, canonical };
}

export function matchesSelector(sel: Selector, labels: Record<string, string>): boolean {
  return matchRequirements(sel.requirements, labels);
}
