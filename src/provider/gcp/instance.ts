/**
 * provider/gcp/instance — pure translations between our contract and Compute Engine's JSON:
 * provider IDs, the insert body, GCP labels, image and machine type resolution, and the
 * mapping of the nine GCE statuses to our instance states.
 */
import {
  INSTANCE_LABEL_INSTALLATION,
  INSTANCE_LABEL_MANAGED,
  INSTANCE_LABEL_NAMESPACE,
  INSTANCE_LABEL_UID,
  MANAGED_BY_VALUE,
} from '../../api/constants.ts';
import { locationOf } from '../../api/location.ts';
import { GCP_DEFAULTS } from '../../config/defaults.ts';
import type { GcpProviderConfig } from '../../config/schema.ts';
import type { CreateRequest, Instance, InstanceState } from '../contract.ts';
import { permanent } from '../errors.ts';
import { htpasswdProblem } from '../squid/htpasswd.ts';

export const DEFAULT_MACHINE_TYPE = 'e2-micro';
/** Ubuntu: its GCE images run cloud-init, which reads the `user-data` metadata key. */
export const DEFAULT_IMAGE = 'projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64';
export const USER_DATA_KEY = 'user-data';
export const MANAGED_FILTER = `labels.${INSTANCE_LABEL_MANAGED} = true`;
/** Scopes of the VM's own service account, when one is configured: logs and metrics only. */
export const VM_SCOPES = [
  'https://www.googleapis.com/auth/logging.write',
  'https://www.googleapis.com/auth/monitoring.write',
];

const NAME = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const ZONE = /^[a-z][a-z0-9]*(-[a-z0-9]+)+$/;
/** Project IDs, including the legacy domain-scoped form `example.com:my-project`. */
const PROJECT = /^([a-z0-9][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$/;
const ID_PATTERN = /^projects\/([^/]+)\/zones\/([^/]+)\/instances\/([^/]+)$/;

export interface GcpRef {
  project: string;
  zone: string;
  name: string;
}

export function providerIDOf(ref: GcpRef): string {
  return `projects/${ref.project}/zones/${ref.zone}/instances/${ref.name}`;
}

/** `projects/<p>/zones/<z>/instances/<name>`, strictly; anything else can never become valid. */
export function parseProviderID(id: string, provider = 'gcp'): GcpRef {
  const m = ID_PATTERN.exec(id);
  const [, project = '', zone = '', name = ''] = m ?? [];
  if (!m || !PROJECT.test(project) || !ZONE.test(zone) || !NAME.test(name)) {
    throw permanent(
      `${provider}: malformed providerID ${JSON.stringify(id)}, want projects/<project>/zones/<zone>/instances/<name>`,
      { provider, providerID: id },
    );
  }
  return { project, zone, name };
}

/** The last path segment of a GCE URL (`…/zones/us-central1-a` → `us-central1-a`). */
export function lastSegment(url: string | null | undefined): string {
  return (url ?? '').split('/').pop() ?? '';
}

/**
 * A GCP label value: lowercase letters, digits, `_` and `-`, at most 63 characters. Kubernetes
 * UIDs and namespaces already fit; anything else is folded so it still reads back the same.
 */
export function sanitizeGcpLabelValue(v: string): string {
  return v
    .toLowerCase()
    .replace(/[^a-z0-9_-]/g, '_')
    .slice(0, 63);
}

export function instanceLabels(
  req: Pick<CreateRequest, 'uid' | 'namespace' | 'installation'>,
): Record<string, string> {
  return {
    [INSTANCE_LABEL_MANAGED]: 'true',
    [INSTANCE_LABEL_UID]: sanitizeGcpLabelValue(req.uid),
    [INSTANCE_LABEL_NAMESPACE]: sanitizeGcpLabelValue(req.namespace),
    ...(req.installation ? { [INSTANCE_LABEL_INSTALLATION]: sanitizeGcpLabelValue(req.installation) } : {}),
    'managed-by': MANAGED_BY_VALUE,
  };
}

/**
 * The nine GCE statuses as our states. RUNNING counts only with an external address (the
 * proxy is unusable without one, and GCE assigns it while starting). SUSPENDED/STOPPED and
 * TERMINATED (GCE's word for a stopped VM) will not serve again by themselves; REPAIRING may.
 */
export function stateFromStatus(status: string | null | undefined, hasAddress: boolean): InstanceState {
  switch (status) {
    case 'PROVISIONING':
    case 'STAGING':
      return 'Pending';
    case 'RUNNING':
      return hasAddress ? 'Running' : 'Pending';
    case 'STOPPING':
    case 'SUSPENDING':
      return 'Stopping';
    case 'STOPPED':
    case 'SUSPENDED':
      return 'Stopped';
    case 'TERMINATED':
      return 'Terminated';
    default:
      return 'Unknown'; // REPAIRING, and anything GCE adds later
  }
}

/** The fields of a GCE instance we read (a structural subset of compute's IInstance). */
export interface GceInstance {
  name?: string | null;
  status?: string | null;
  zone?: string | null;
  labels?: Record<string, string> | null;
  creationTimestamp?: string | null;
  /** When it was last started / stopped (RFC 3339, GCE's clock): a restart's progress. */
  lastStartTimestamp?: string | null;
  lastStopTimestamp?: string | null;
  networkInterfaces?: Array<{ accessConfigs?: Array<{ natIP?: string | null }> | null }> | null;
}

export function externalIP(inst: GceInstance): string | undefined {
  for (const nic of inst.networkInterfaces ?? []) {
    for (const ac of nic.accessConfigs ?? []) if (ac.natIP) return ac.natIP;
  }
  return undefined;
}

export function instanceFromGce(inst: GceInstance, project: string, zoneHint?: string): Instance {
  const name = inst.name ?? '';
  const zone = lastSegment(inst.zone) || zoneHint || '';
  const address = externalIP(inst);
  const out: Instance = {
    id: providerIDOf({ project, zone, name }),
    name,
    state: stateFromStatus(inst.status, address !== undefined),
  };
  if (address) out.address = address;
  const location = gcpLocation(zone);
  if (location) out.location = location;
  const uid = inst.labels?.[INSTANCE_LABEL_UID];
  if (uid) out.uid = uid;
  const ns = inst.labels?.[INSTANCE_LABEL_NAMESPACE];
  if (ns) out.namespace = ns;
  const installation = inst.labels?.[INSTANCE_LABEL_INSTALLATION];
  if (installation) out.installation = installation;
  const created = inst.creationTimestamp ? new Date(inst.creationTimestamp) : undefined;
  if (created && !Number.isNaN(created.getTime())) out.createdAt = created;
  return out;
}

// ---- insert ---------------------------------------------------------------------------------

/** The provider config with defaults filled in. */
export interface GcpSettings {
  project: string;
  network: string;
  subnetwork: string | undefined;
  serviceAccountEmail: string | undefined;
  diskSizeGb: number;
  spot: boolean;
  images: Record<string, string>;
  /** Network tag put on every instance (the managed firewall rule targets it). */
  targetTag: string;
  /** Managed firewall rule: on when a `firewall` block is configured and not disabled. */
  firewall: { sourceRanges: string[] } | undefined;
}

export function gcpSettings(c: GcpProviderConfig): GcpSettings {
  const fwOn = c.firewall !== undefined && (c.firewall.enabled ?? GCP_DEFAULTS.firewallEnabled);
  return {
    project: c.project,
    network: c.network ?? GCP_DEFAULTS.network,
    subnetwork: c.subnetwork,
    serviceAccountEmail: c.serviceAccountEmail,
    diskSizeGb: c.diskSizeGb ?? GCP_DEFAULTS.diskSizeGb,
    spot: c.spot ?? GCP_DEFAULTS.spot,
    images: c.images ?? {},
    targetTag: c.firewall?.targetTag ?? GCP_DEFAULTS.firewallTargetTag,
    firewall: fwOn && c.firewall ? { sourceRanges: [...c.firewall.sourceRanges] } : undefined,
  };
}

/** placement.image: a key of `images`, else a source-image URL or `projects/…/global/images/…`. */
export function resolveImage(image: string | undefined, images: Record<string, string>): string {
  if (image === undefined) return images.default ?? DEFAULT_IMAGE;
  const mapped = images[image];
  if (mapped !== undefined) return mapped;
  if (
    /^https:\/\/\S+\/global\/images\/\S+$/.test(image) ||
    /^projects\/[^/\s]+\/global\/images\/\S+$/.test(image)
  ) {
    return image;
  }
  const known = Object.keys(images).sort().join(', ') || 'none configured';
  throw new Error(
    `placement.image ${JSON.stringify(image)} is neither a key of gcp.images (have: ${known}) nor a source image (projects/<p>/global/images/<name> or an image URL)`,
  );
}

/** A machine type name, or a zone-relative / full URL of one. */
export function machineTypeURL(zone: string, machineType: string | undefined): string {
  const mt = machineType ?? DEFAULT_MACHINE_TYPE;
  if (mt.includes('/')) {
    if (!/(^|\/)zones\/[^/]+\/machineTypes\/[^/\s]+$/.test(mt)) {
      throw new Error(`placement.machineType ${JSON.stringify(mt)} is not a machine type (e.g. e2-small)`);
    }
    return mt;
  }
  if (!/^[a-z0-9][a-z0-9-]*$/.test(mt)) {
    throw new Error(`placement.machineType ${JSON.stringify(mt)} is not a machine type (e.g. e2-small)`);
  }
  return `zones/${zone}/machineTypes/${mt}`;
}

/** Region of a zone: `europe-west1-b` → `europe-west1`. */
export function regionOf(zone: string): string {
  return zone.replace(/-[a-z0-9]+$/, '');
}

/** Where an instance of `zone` runs: that zone and its region (none for an unknown zone). */
export function gcpLocation(zone: string): Instance['location'] {
  if (!ZONE.test(zone)) return undefined;
  return locationOf(regionOf(zone), zone);
}

/** Everything about a request that would produce an invalid instance, as one list. */
export function requestProblems(req: CreateRequest): string[] {
  const problems: string[] = [];
  if (req.zone === undefined || req.zone === '') {
    problems.push('placement.zone is required for gcp (e.g. europe-west1-b)');
  } else if (!ZONE.test(req.zone)) {
    problems.push(`placement.zone ${JSON.stringify(req.zone)} is not a GCE zone (e.g. europe-west1-b)`);
  }
  if (!NAME.test(req.name)) {
    problems.push(`name ${JSON.stringify(req.name)} is not a valid GCE instance name (RFC 1035, ≤ 63)`);
  }
  if (!Number.isInteger(req.port) || req.port < 1 || req.port > 65535) {
    problems.push(`port ${req.port} is not a port (1-65535)`);
  }
  const cred = htpasswdProblem(req.credentials);
  if (cred) problems.push(cred);
  return problems;
}

/** The `instanceResource` of instances.insert. `userData` is secret: never log the result. */
export function buildInsertResource(req: CreateRequest & { zone: string }, s: GcpSettings, userData: string) {
  const zone = req.zone;
  const network = s.network.includes('/') ? s.network : `global/networks/${s.network}`;
  const nic: {
    network: string;
    subnetwork?: string;
    accessConfigs: Array<{ name: string; type: string }>;
  } = {
    network,
    accessConfigs: [{ name: 'External NAT', type: 'ONE_TO_ONE_NAT' }],
  };
  if (s.subnetwork) {
    nic.subnetwork = s.subnetwork.includes('/')
      ? s.subnetwork
      : `regions/${regionOf(zone)}/subnetworks/${s.subnetwork}`;
  }
  return {
    name: req.name,
    description: `Egress proxy for ${req.namespace}/${req.proxyName}, managed by ${MANAGED_BY_VALUE}`,
    machineType: machineTypeURL(zone, req.machineType),
    labels: instanceLabels(req),
    tags: { items: [s.targetTag] },
    disks: [
      {
        boot: true,
        autoDelete: true,
        type: 'PERSISTENT',
        initializeParams: {
          sourceImage: resolveImage(req.image, s.images),
          diskSizeGb: String(s.diskSizeGb),
        },
      },
    ],
    networkInterfaces: [nic],
    metadata: { items: [{ key: USER_DATA_KEY, value: userData }] },
    ...(s.serviceAccountEmail
      ? { serviceAccounts: [{ email: s.serviceAccountEmail, scopes: VM_SCOPES }] }
      : {}),
    ...(s.spot
      ? {
          // A preempted spot VM is deleted, not stopped: get answers NotFound and the
          // reconciler's lost-instance path creates a replacement.
          scheduling: {
            provisioningModel: 'SPOT',
            instanceTerminationAction: 'DELETE',
            automaticRestart: false,
            onHostMaintenance: 'TERMINATE',
          },
        }
      : {}),
  };
}
