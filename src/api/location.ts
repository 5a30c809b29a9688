/**
 * api/location — where an instance runs (`region`, `zone`), defined once: the value rule every provider's location goes through, and the one place a location becomes
 * selectable — as the Kubernetes well-known topology label keys, matched by lease selectors
 * and the gateway's `region-…`/`zone-…` user-name options alongside the proxy's own labels.
 */
/** The Kubernetes well-known keys: a selector written for Nodes means the same here. */
export const LABEL_REGION = 'topology.kubernetes.io/region';
export const LABEL_ZONE = 'topology.kubernetes.io/zone';

/** A label value (Kubernetes syntax), so a location can always be written in a selector. */
export const LOCATION_VALUE_PATTERN = '^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$';
const VALUE = new RegExp(LOCATION_VALUE_PATTERN);
export const MAX_LOCATION_VALUE = 63;

/** Where an instance runs. Plain (no schema library) so the crawler package's types stay light. */
export interface Location {
  region?: string;
  zone?: string;
}

/** Whether `v` can be a location value (a label value of 1-63 characters). */
export function isLocationValue(v: string | undefined): v is string {
  return v !== undefined && v.length <= MAX_LOCATION_VALUE && VALUE.test(v);
}

/**
 * The location a provider reports, keeping only values a selector can name (a backend name that
 * is not a label value, e.g. a host name over 63 characters, is left out rather than written
 * into a status the API server would refuse); undefined when nothing is left.
 */
export function locationOf(region: string | undefined, zone: string | undefined): Location | undefined {
  const out: Location = {};
  if (isLocationValue(region)) out.region = region;
  if (isLocationValue(zone)) out.zone = zone;
  return out.region === undefined && out.zone === undefined ? undefined : out;
}

/**
 * The labels selectors match for a proxy: its own labels plus its location under the topology
 * keys. A known location wins over a label of the same key (the provider knows where the
 * instance runs); an unknown one leaves such a label alone, so an External proxy can be placed
 * by its labels. Returns `labels` itself when there is nothing to add.
 */
export function selectableLabels(
  labels: Readonly<Record<string, string>>,
  location: Location | undefined,
): Readonly<Record<string, string>> {
  if (location?.region === undefined && location?.zone === undefined) return labels;
  const out: Record<string, string> = { ...labels };
  if (location.region !== undefined) out[LABEL_REGION] = location.region;
  if (location.zone !== undefined) out[LABEL_ZONE] = location.zone;
  return out;
}
