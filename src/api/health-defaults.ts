/**
 * api/health-defaults — the health check a Proxy gets for every spec.healthCheck field it leaves
 * unset. Defined once: the CRD's timeout rule (api/rules) reasons with these values, and the
 * health engine (health/policy) probes with them unless its own flags override them.
 */

/** Fetched through each proxy; answers 204 with an empty body, cheaply, from everywhere. */
export const DEFAULT_HEALTH_URL = 'https://www.gstatic.com/generate_204';
export const DEFAULT_EXPECT_STATUS = 204;
export const DEFAULT_INTERVAL_SECONDS = 1;
export const DEFAULT_FAILURE_THRESHOLD = 3;
export const DEFAULT_SUCCESS_THRESHOLD = 1;
