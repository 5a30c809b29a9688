/**
 * provider/kubernetes/pod — pure translation between our contract and Kubernetes objects: the
 * Squid Pod and its companion Secret for a CreateRequest, the providerID format, and the
 * Instance a Pod amounts to. No I/O here, so every rule is testable as a plain function.
 */
import type { V1Pod, V1ResourceRequirements, V1Secret } from '@kubernetes/client-node';
import {
  GROUP,
  INSTANCE_LABEL_INSTALLATION,
  INSTANCE_LABEL_MANAGED,
  INSTANCE_LABEL_NAMESPACE,
  INSTANCE_LABEL_UID,
  LABEL_MANAGED_BY,
  MANAGED_BY_VALUE,
} from '../../api/constants.ts';
import { type EgressPolicy, type OperatorEndpoints, resolveEgressPolicy } from '../../config/egress.ts';
import type { KubernetesProviderConfig } from '../../config/schema.ts';
import type { CreateRequest, Instance, InstanceState } from '../contract.ts';
import { permanent } from '../errors.ts';
import {
  DEFAULT_MAX_FILE_DESCRIPTORS,
  HTPASSWD_KEY,
  SQUID_CONFIG_DIR,
  SQUID_CONFIG_KEY,
  squidConfig,
} from '../squid/config.ts';
import { htpasswdLine, htpasswdProblem } from '../squid/htpasswd.ts';

/** A pinned tag of the ubuntu/squid image: a moving `latest` would change proxies under us. */
export const DEFAULT_SQUID_IMAGE = 'ubuntu/squid:6.6-24.04_edge';
export const DEFAULT_ZONE_LABEL = 'topology.kubernetes.io/zone';
/** The `proxy` user of the Ubuntu/Debian Squid packages. */
export const SQUID_UID = 13;
export const CONTAINER_NAME = 'squid';
/** Which Proxy a Pod serves, for people running kubectl (`<namespace>/<name>`). */
export const ANNOTATION_PROXY = `${GROUP}/proxy`;

const SCRATCH_DIRS = [
  ['tmp', '/tmp'],
  ['spool', '/var/spool/squid'],
  ['logs', '/var/log/squid'],
  ['run', '/run/squid'],
] as const;

/** The provider config with every default applied. */
export interface PodSettings {
  namespace: string;
  image: string;
  imagePullPolicy?: 'Always' | 'IfNotPresent' | 'Never';
  maxFileDescriptors: number;
  zoneLabel: string;
  resourceProfiles: NonNullable<KubernetesProviderConfig['resourceProfiles']>;
  /** What lease holders may reach through the Pods' Squid. */
  egress: EgressPolicy;
  /** The operator's own listeners, closed to lease holders whatever `egress` allows. */
  operator?: OperatorEndpoints;
}

export function podSettings(
  cfg: KubernetesProviderConfig,
  namespace: string,
  operator?: OperatorEndpoints,
): PodSettings {
  return {
    ...(operator ? { operator } : {}),
    namespace: cfg.namespace ?? namespace,
    image: cfg.image ?? DEFAULT_SQUID_IMAGE,
    ...(cfg.imagePullPolicy ? { imagePullPolicy: cfg.imagePullPolicy } : {}),
    maxFileDescriptors: cfg.maxFileDescriptors ?? DEFAULT_MAX_FILE_DESCRIPTORS,
    zoneLabel: cfg.zoneLabel ?? DEFAULT_ZONE_LABEL,
    resourceProfiles: cfg.resourceProfiles ?? {},
    egress: resolveEgressPolicy(cfg.egressPolicy),
  };
}

// ---- providerID -----------------------------------------------------------------------------

export function providerIDOf(namespace: string, name: string): string {
  return `namespaces/${namespace}/pods/${name}`;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** `namespaces/<ns>/pods/<name>` → parts; anything else can never resolve, so Permanent. */
export function parseProviderID(id: string, provider = 'kubernetes'): { namespace: string; name: string } {
  const m = /^namespaces\/([^/]+)\/pods\/([^/]+)$/.exec(id);
  if (!m || !DNS_LABEL.test(m[1] as string) || !DNS_LABEL.test(m[2] as string)) {
    throw permanent(
      `${provider}: malformed providerID ${JSON.stringify(id)}, want namespaces/<ns>/pods/<name>`,
      {
        provider,
        providerID: id,
      },
    );
  }
  return { namespace: m[1] as string, name: m[2] as string };
}

// ---- labels ---------------------------------------------------------------------------------

/**
 * Any string as a valid label value: at most 63 characters of [A-Za-z0-9._-], starting and
 * ending alphanumeric (empty when nothing usable is left).
 */
export function sanitizeLabelValue(v: string): string {
  return v
    .replace(/[^A-Za-z0-9._-]/g, '-')
    .slice(0, 63)
    .replace(/^[^A-Za-z0-9]+/, '')
    .replace(/[^A-Za-z0-9]+$/, '');
}

export function instanceLabels(
  req: Pick<CreateRequest, 'uid' | 'namespace' | 'installation'>,
): Record<string, string> {
  return {
    [INSTANCE_LABEL_MANAGED]: 'true',
    [INSTANCE_LABEL_UID]: sanitizeLabelValue(req.uid),
    [INSTANCE_LABEL_NAMESPACE]: sanitizeLabelValue(req.namespace),
    ...(req.installation ? { [INSTANCE_LABEL_INSTALLATION]: sanitizeLabelValue(req.installation) } : {}),
    [LABEL_MANAGED_BY]: MANAGED_BY_VALUE,
    'app.kubernetes.io/name': 'squid',
  };
}

export const MANAGED_SELECTOR = `${INSTANCE_LABEL_MANAGED}=true`;

// ---- builders -------------------------------------------------------------------------------

/** Everything about a request that would produce an invalid Pod, as one Permanent error. */
export function validateRequest(req: CreateRequest, s: PodSettings, provider = 'kubernetes'): void {
  const problems: string[] = [];
  if (!DNS_LABEL.test(req.name)) problems.push(`name ${JSON.stringify(req.name)} is not a DNS label`);
  if (!Number.isInteger(req.port) || req.port < 1 || req.port > 65535)
    problems.push(`port ${req.port} is not a port`);
  if (req.machineType !== undefined && !(req.machineType in s.resourceProfiles)) {
    const known = Object.keys(s.resourceProfiles).sort().join(', ') || 'none configured';
    problems.push(
      `placement.machineType ${JSON.stringify(req.machineType)} is not a resource profile (have: ${known})`,
    );
  }
  if (req.image !== undefined && req.image.trim() === '') problems.push('placement.image is empty');
  const cred = htpasswdProblem(req.credentials);
  if (cred) problems.push(cred);
  if (problems.length > 0) {
    throw permanent(`${provider} create ${req.name}: ${problems.join('; ')}`, { provider, op: 'create' });
  }
}

export function buildPod(req: CreateRequest, s: PodSettings): V1Pod {
  validateRequest(req, s);
  const profile = req.machineType === undefined ? undefined : s.resourceProfiles[req.machineType];
  const resources: V1ResourceRequirements = {};
  if (profile?.cpu || profile?.memory) {
    resources.requests = {
      ...(profile.cpu && { cpu: profile.cpu }),
      ...(profile.memory && { memory: profile.memory }),
    };
    // Memory is capped (Squid's footprint is bounded by max_filedescriptors); CPU is not, so a
    // busy proxy is never throttled below its request.
    if (profile.memory) resources.limits = { memory: profile.memory };
  }
  const probe = { tcpSocket: { port: req.port } };
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: req.name,
      namespace: s.namespace,
      labels: instanceLabels(req),
      annotations: { [ANNOTATION_PROXY]: `${req.namespace}/${req.proxyName}` },
    },
    spec: {
      restartPolicy: 'Always',
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      terminationGracePeriodSeconds: 10,
      securityContext: {
        runAsNonRoot: true,
        runAsUser: SQUID_UID,
        runAsGroup: SQUID_UID,
        fsGroup: SQUID_UID,
        seccompProfile: { type: 'RuntimeDefault' },
      },
      ...(req.zone
        ? {
            affinity: {
              nodeAffinity: {
                requiredDuringSchedulingIgnoredDuringExecution: {
                  nodeSelectorTerms: [
                    { matchExpressions: [{ key: s.zoneLabel, operator: 'In', values: [req.zone] }] },
                  ],
                },
              },
            },
          }
        : {}),
      containers: [
        {
          name: CONTAINER_NAME,
          image: req.image ?? s.image,
          ...(s.imagePullPolicy ? { imagePullPolicy: s.imagePullPolicy } : {}),
          // Bypass the image entrypoint (it prepares root-owned cache dirs we do not use).
          command: ['squid', '-N', '-f', `${SQUID_CONFIG_DIR}/${SQUID_CONFIG_KEY}`],
          ports: [{ name: 'proxy', containerPort: req.port, protocol: 'TCP' }],
          readinessProbe: { ...probe, initialDelaySeconds: 1, periodSeconds: 2, failureThreshold: 3 },
          livenessProbe: { ...probe, initialDelaySeconds: 10, periodSeconds: 10, failureThreshold: 6 },
          resources,
          securityContext: {
            allowPrivilegeEscalation: false,
            readOnlyRootFilesystem: true,
            capabilities: { drop: ['ALL'] },
          },
          volumeMounts: [
            { name: 'config', mountPath: SQUID_CONFIG_DIR, readOnly: true },
            // The root filesystem is read-only; Squid may still touch these with no cache and no
            // pid file (core dumps, helper state), so they get small writable scratch dirs.
            ...SCRATCH_DIRS.map(([name, mountPath]) => ({ name, mountPath })),
          ],
        },
      ],
      volumes: [
        { name: 'config', secret: { secretName: req.name, defaultMode: 0o440 } },
        ...SCRATCH_DIRS.map(([name]) => ({ name, emptyDir: { sizeLimit: '64Mi' } })),
      ],
    },
  };
}

/**
 * The companion Secret (same name as the Pod): squid.conf and the htpasswd file. Owned by the
 * Pod when its UID is known, so Kubernetes removes it even if our own delete never runs.
 */
export function buildSecret(
  req: CreateRequest,
  s: PodSettings,
  owner?: { name: string; uid: string },
  salt?: string,
): V1Secret {
  validateRequest(req, s);
  const conf = squidConfig({
    profile: 'pod',
    port: req.port,
    maxFileDescriptors: s.maxFileDescriptors,
    egress: s.egress,
    ...(s.operator ? { operator: s.operator } : {}),
  });
  const b64 = (x: string) => Buffer.from(x, 'utf8').toString('base64');
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'Opaque',
    metadata: {
      name: req.name,
      namespace: s.namespace,
      labels: instanceLabels(req),
      annotations: { [ANNOTATION_PROXY]: `${req.namespace}/${req.proxyName}` },
      ...(owner
        ? {
            ownerReferences: [
              { apiVersion: 'v1', kind: 'Pod', name: owner.name, uid: owner.uid, controller: false },
            ],
          }
        : {}),
    },
    data: {
      [SQUID_CONFIG_KEY]: b64(conf),
      [HTPASSWD_KEY]: b64(htpasswdLine(req.credentials, salt)),
    },
  };
}

// ---- reading back ---------------------------------------------------------------------------

/**
 * Phase + conditions → our state. A Running Pod counts as Running only once it is Ready and has
 * an IP: before that, clients could not use it.
 */
export function stateFromPod(pod: V1Pod): InstanceState {
  if (pod.metadata?.deletionTimestamp) return 'Stopping';
  const phase = pod.status?.phase;
  switch (phase) {
    case undefined:
    case 'Pending':
      return 'Pending';
    case 'Running': {
      const ready = pod.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True');
      return ready && pod.status?.podIP ? 'Running' : 'Pending';
    }
    case 'Succeeded':
    case 'Failed':
      return 'Terminated';
    default:
      return 'Unknown';
  }
}

export function instanceFromPod(pod: V1Pod): Instance {
  const name = pod.metadata?.name ?? '';
  const namespace = pod.metadata?.namespace ?? '';
  const labels = pod.metadata?.labels ?? {};
  const state = stateFromPod(pod);
  const container = pod.spec?.containers?.find((c) => c.name === CONTAINER_NAME) ?? pod.spec?.containers?.[0];
  const port = container?.ports?.[0]?.containerPort;
  const created = pod.metadata?.creationTimestamp;
  const createdAt = created === undefined ? undefined : new Date(created);
  const inst: Instance = { id: providerIDOf(namespace, name), name, state };
  if (pod.status?.podIP) inst.address = pod.status.podIP;
  if (port !== undefined) inst.port = port;
  if (labels[INSTANCE_LABEL_UID]) inst.uid = labels[INSTANCE_LABEL_UID];
  if (labels[INSTANCE_LABEL_NAMESPACE]) inst.namespace = labels[INSTANCE_LABEL_NAMESPACE];
  if (labels[INSTANCE_LABEL_INSTALLATION]) inst.installation = labels[INSTANCE_LABEL_INSTALLATION];
  if (createdAt && !Number.isNaN(createdAt.getTime())) inst.createdAt = createdAt;
  return inst;
}
