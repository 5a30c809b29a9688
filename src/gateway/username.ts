/**
 * gateway/username — the routing options a crawler writes into the gateway's proxy user name
 * (docs/gateway.md, "User name grammar"): `crawler` followed by `-option-value` pairs, e.g.
 * `crawler-pool-eu-session-a1b2` = label selector `pool=eu`, sticky session `a1b2`. Pure: a
 * user name in, routing options or one message saying what is wrong out.
 */
import { isLocationValue, LABEL_REGION, LABEL_ZONE } from '../api/location.ts';

export const USERNAME_PREFIX = 'crawler';
/** Sticky sessions idle longer than this are forgotten unless the user name says otherwise. */
export const DEFAULT_SESSION_TTL_SECONDS = 600;
export const MAX_SESSION_TTL_SECONDS = 86_400;

export interface RoutingOptions {
  /** Label selector text (Kubernetes syntax) built from `pool-…`, `label-…`, `region-…` and `zone-…`. */
  selector?: string;
  namespace?: string;
  session?: string;
  sessionTtlSeconds: number;
  /** `inspect-off`: this client's CONNECTs are tunnelled untouched even with inspection on. */
  inspect?: false;
}

const VALUE = /^[A-Za-z0-9_.]{1,63}$/;
const LABEL_KEY = /^[A-Za-z0-9_.]{1,63}$/;
const KNOWN = ['pool', 'label', 'ns', 'session', 'ttl', 'region', 'zone', 'inspect'] as const;
type Option = (typeof KNOWN)[number];
/**
 * Options whose values are region and zone names, which have dashes (`europe-west1-b`): their
 * value runs over the following parts up to the next part that is an option name.
 */
const DASHED: ReadonlySet<string> = new Set<Option>(['region', 'zone']);
const LOCATION_KEYS: Readonly<Record<string, string>> = { region: LABEL_REGION, zone: LABEL_ZONE };

export type ParsedUsername = { ok: true; options: RoutingOptions } | { ok: false; message: string };

function fail(message: string): ParsedUsername {
  return { ok: false, message: `gateway user name: ${message} (see docs/gateway.md)` };
}

/** Shows a client's text in a message without echoing a long input back. */
function shown(text: string): string {
  return JSON.stringify(text.length > 40 ? `${text.slice(0, 39)}…` : text);
}

/**
 * Parses `crawler[-option-value]…`. Options: `pool-<v>` (label pool=v), `label-<key>_<v>`
 * (label key=v; the first `_` splits), `ns-<namespace>`, `session-<id>`, `ttl-<seconds>`
 * (session idle TTL), `region-<r>` and `zone-<z>` (where the proxy runs; dashes allowed, see
 * DASHED), `inspect-off` (HTTPS tunnelled untouched). Values are letters, digits, `_` and `.`; each option at most once.
 */
export function parseUsername(username: string): ParsedUsername {
  const parts = username.split('-');
  if (parts[0] !== USERNAME_PREFIX) {
    return fail(`must start with "${USERNAME_PREFIX}", e.g. crawler-session-1; got ${shown(username)}`);
  }
  const seen = new Set<Option>();
  const labels: string[] = [];
  const out: RoutingOptions = { sessionTtlSeconds: DEFAULT_SESSION_TTL_SECONDS };
  for (let i = 1; i < parts.length; ) {
    const name = parts[i] as string;
    if (!isOption(name)) {
      return fail(`unknown option ${shown(name)}; known options: ${KNOWN.join(', ')}`);
    }
    const option = name;
    let end = i + 2;
    if (DASHED.has(option)) while (end < parts.length && !isOption(parts[end] as string)) end++;
    const valueParts = parts.slice(i + 1, end);
    i = end;
    if (valueParts.length === 0 || !valueParts.every((v) => VALUE.test(v))) {
      return fail(
        DASHED.has(option)
          ? `option "${option}" needs a name of letters, digits, "_", "." and single dashes (1-63 characters), e.g. ${option}-europe-west1${option === 'zone' ? '-b' : ''}`
          : `option "${option}" needs a value of letters, digits, "_" or "." (1-63 characters)`,
      );
    }
    const value = valueParts.join('-');
    if (seen.has(option) && option !== 'label') return fail(`option "${option}" is given twice`);
    seen.add(option);
    const problem = apply(out, labels, option, value);
    if (problem) return fail(problem);
  }
  if (labels.length > 0) out.selector = labels.join(',');
  return { ok: true, options: out };
}

function isOption(part: string): part is Option {
  return (KNOWN as readonly string[]).includes(part);
}

function apply(out: RoutingOptions, labels: string[], option: Option, value: string): string | undefined {
  switch (option) {
    case 'region':
    case 'zone':
      if (!isLocationValue(value)) {
        return `option "${option}" is a label value: at most 63 characters, starting and ending with a letter or digit`;
      }
      labels.push(`${LOCATION_KEYS[option]}=${value}`);
      return undefined;
    case 'pool':
      labels.push(`pool=${value}`);
      return undefined;
    case 'label': {
      const cut = value.indexOf('_');
      const key = value.slice(0, cut);
      if (cut <= 0 || cut === value.length - 1 || !LABEL_KEY.test(key)) {
        return 'option "label" takes <key>_<value>, e.g. label-zone_eu1';
      }
      labels.push(`${key}=${value.slice(cut + 1)}`);
      return undefined;
    }
    case 'ns':
      out.namespace = value;
      return undefined;
    case 'inspect':
      if (value === 'off') out.inspect = false;
      else if (value !== 'on') return 'option "inspect" is on or off, e.g. crawler-inspect-off';
      return undefined;
    case 'session':
      out.session = value;
      return undefined;
    case 'ttl': {
      const n = /^\d{1,6}$/.test(value) ? Number(value) : Number.NaN;
      if (!(n >= 1 && n <= MAX_SESSION_TTL_SECONDS)) {
        return `option "ttl" is a session idle time in seconds, 1-${MAX_SESSION_TTL_SECONDS}`;
      }
      out.sessionTtlSeconds = n;
      return undefined;
    }
  }
}
