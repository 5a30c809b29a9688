/**
 * api/constants — every name the operator stamps on objects and instances, in one place.
 * Changing one of these is a breaking change for running fleets: finalizers and labels
 * already written to clusters and clouds must keep matching.
 */

export const GROUP = 'crawl.example.com';
export const VERSION = 'v1alpha1';
export const API_VERSION = `${GROUP}/${VERSION}`;

export const PROXY_KIND = 'Proxy';
export const PROXY_PLURAL = 'proxies';
export const PROVIDER_HEALTH_KIND = 'ProviderHealth';
export const PROVIDER_HEALTH_PLURAL = 'providerhealths';

/** Held on every Managed Proxy until its instances are gone. */
export const FINALIZER = `${GROUP}/instance-cleanup`;

/** Hash of everything that, when changed, needs a new instance. */
export const ANNOTATION_SPEC_HASH = `${GROUP}/spec-hash`;
/** "true": deletion abandons the instance instead of cleaning it up. */
export const ANNOTATION_SKIP_CLEANUP = `${GROUP}/skip-cleanup`;

/** Required on Secrets referenced by cloudInit.secretRef; only labelled Secrets are cached. */
export const LABEL_CLOUD_INIT_SECRET = `${GROUP}/cloud-init`;
/** On generated credential Secrets, naming the Proxy they belong to. */
export const LABEL_CREDENTIALS_FOR = `${GROUP}/credentials-for`;

/** Labels / tags on every backend instance. Dashes only: valid as GCP labels and libvirt metadata. */
export const INSTANCE_LABEL_MANAGED = 'proxy-operator-managed';
export const INSTANCE_LABEL_UID = 'proxy-operator-uid';
export const INSTANCE_LABEL_NAMESPACE = 'proxy-operator-namespace';

/** On ProviderHealth objects this operator owns. */
export const LABEL_MANAGED_BY = 'app.kubernetes.io/managed-by';
export const MANAGED_BY_VALUE = 'egress-proxies-operator';

/** Condition types. */
export const CONDITION_PROVISIONED = 'Provisioned';
export const CONDITION_HEALTHY = 'Healthy';
export const CONDITION_READY = 'Ready';

/** Suffix of the generated credentials Secret: `<proxy>-auth`. */
export const CREDENTIALS_SECRET_SUFFIX = '-auth';
export const CREDENTIALS_USERNAME_KEY = 'username';
export const CREDENTIALS_PASSWORD_KEY = 'password';

export const DEFAULT_PROXY_PORT = 3128;
