/**
 * api/health-defaults — the health check a Proxy gets for every spec.healthCheck field it leaves
 * unset. Defined once: the CRD's timeout rule (api/rules) reasons with these values, and the
 * health engine (health/policy) probes with them unless its own flags override them.
 */

/** Fetched through each proxy; answers 204 with an empty body, cheaply, from everywhere. */
export const DEFAULT_HEALTH_URL = 'https://www.gstatic.com/generate_204';
export const DEFAULT_EXPECT_STATUS = 204;

/**
 * The host that stands for "the operator's own discovery API" in a health-check URL:
 * `http://operator.invalid/generate_204` is probed at wherever `--discovery-bind-address` put
 * the API, so manifests need not repeat its port. `.invalid` never resolves (RFC 6761), so the
 * placeholder cannot name a real site, and it is a valid URL for the CRD schema and every parser.
 */
export const OPERATOR_PROBE_HOST = 'operator.invalid';
export const OPERATOR_PROBE_URL = `http://${OPERATOR_PROBE_HOST}/generate_204`;
export const DEFAULT_INTERVAL_SECONDS = 1;
export const DEFAULT_FAILURE_THRESHOLD = 3;
export const DEFAULT_SUCCESS_THRESHOLD = 1;
