/**
 * lease/input — checks on what a lease client sends besides the target (lease/target): the
 * seconds fields, the namespace and the label selector text, each refused as a LeaseInputError naming its field.
 */
import { parseSelector, type Selector, SelectorError } from '../runtime/selector.ts';
import { LeaseInputError } from './errors.ts';
import { MAX_COOLDOWN_SECONDS, type ReportRequest } from './types.ts';

export function checkSeconds(field: string, value: number | undefined, max: number): void {
  if (value === undefined) return;
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new LeaseInputError(field, `${field} must be an integer from 1 to ${max}`);
  }
}

/** The fields of a report every kind of report checks the same way. */
export function checkReport(req: ReportRequest): void {
  checkSeconds('cooldownSeconds', req.cooldownSeconds, MAX_COOLDOWN_SECONDS);
  if (req.result === 'success' && req.cooldownSeconds !== undefined) {
    throw new LeaseInputError('cooldownSeconds', 'cooldownSeconds applies only to blocked and failed');
  }
}

/** A namespace name as Kubernetes allows it: a DNS-1123 label (the empty string means any namespace). */
export const NAMESPACE_PATTERN = '^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$';
export const NAMESPACE_RULE =
  "must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit";
const NAMESPACE = new RegExp(NAMESPACE_PATTERN);

/** Refuses a namespace no Proxy can live in (a typo would otherwise just match nothing). */
export function checkNamespace(value: string | undefined, field = 'namespace'): void {
  if (value === undefined || NAMESPACE.test(value)) return;
  throw new LeaseInputError(field, `${field} ${NAMESPACE_RULE}`);
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
