/**
 * lease/input — checks on what a lease client sends besides the target (lease/target): the
 * seconds fields and the label selector text, each refused as a LeaseInputError naming its field.
 */
import { parseSelector, type Selector, SelectorError } from '../runtime/selector.ts';
import { LeaseInputError } from './target.ts';

export function checkSeconds(field: string, value: number | undefined, max: number): void {
  if (value === undefined) return;
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new LeaseInputError(field, `${field} must be an integer from 1 to ${max}`);
  }
}

const MAX_SELECTOR_CHARS = 4096;

/** Clients repeat the same few selectors; parse each text once. */
const parsedSelectors = new Map<string, Selector | undefined>();

/** The selector to filter by, or undefined when it selects everything. */
export function toSelector(sel: string | Selector | undefined, field = 'selector'): Selector | undefined {
  if (sel === undefined) return undefined;
  if (typeof sel !== 'string') return sel.requirements.length === 0 ? undefined : sel;
  if (parsedSelectors.has(sel)) return parsedSelectors.get(sel);
  try {
    // The lease API bounds what a client may make every grant match against.
    if (sel.length > MAX_SELECTOR_CHARS) {
      throw new SelectorError(`selector is longer than ${MAX_SELECTOR_CHARS} characters`);
    }
    const parsed = parseSelector(sel);
    const out = parsed.requirements.length === 0 ? undefined : parsed;
    if (parsedSelectors.size >= 1024) parsedSelectors.clear();
    parsedSelectors.set(sel, out);
    return out;
  } catch (err) {
    if (err instanceof SelectorError) throw new LeaseInputError(field, `${field}: ${err.message}`);
    throw err;
  }
}
