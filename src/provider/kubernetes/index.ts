/**
 * provider/kubernetes — the `kubernetes` provider: each instance is a Squid Pod in this cluster
 * with a companion Secret (squid.conf + htpasswd) of the same name. Talks to the API server
 * through the shared client-node CoreV1Api from runtime/kube/client (one pooled agent).
 */
import { readFileSync } from 'node:fs';
import type { CoreV1Api, V1Pod } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { INSTANCE_LABEL_INSTALLATION, INSTANCE_LABEL_UID } from '../../api/constants.ts';
import type { TargetCheck } from '../../api/providerhealth.ts';
import type { OperatorEndpoints } from '../../config/egress.ts';
import type { KubernetesProviderConfig } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import { callOptions } from '../../runtime/kube/client.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, permanent } from '../errors.ts';
import { apiCode, checkMessage, checkReason, toProviderError } from './errors.ts';
import { NodeLocations } from './node-location.ts';
import {
  buildPod,
  buildSecret,
  instanceFromPod,
  MANAGED_SELECTOR,
  type PodSettings,
  parseProviderID,
  podSettings,
  providerIDOf,
  sanitizeLabelValue,
  validateRequest,
} from './pod.ts';

export const KUBERNETES_PROVIDER_TYPE = 'kubernetes';
const LIST_PAGE_SIZE = 500;
const SERVICE_ACCOUNT_NAMESPACE_FILE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

export interface KubernetesProviderOptions {
  name: string;
  config?: KubernetesProviderConfig;
  /** From createKubeClients; owned by the caller (the provider does not close it). */
  core: CoreV1Api;
  /** API server URL, shown as the check target's address. */
  apiHost?: string;
  /** Namespace for Pods when the config names none; default operatorNamespace(). */
  defaultNamespace?: string;
  log?: Logger;
  /** Pods per list page in listByTag (default 500). */
  listPageSize?: number;
  /** The operator's own listeners, denied in every Pod's squid.conf (cmd/modes operatorEndpoints). */
  operator?: OperatorEndpoints;
  /** How long a Node's topology labels are reused (default node-location NODE_CACHE_MS). */
  nodeCacheMs?: number;
}

export type KubernetesProvider = Provider & Checker & { adopt: NonNullable<Provider['adopt']> };

export function createKubernetesProvider(opts: KubernetesProviderOptions): KubernetesProvider {
  return new PodProvider(opts);
}

/** The namespace the operator runs in: POD_NAMESPACE, the service account's, else `default`. */
export function operatorNamespace(env: NodeJS.ProcessEnv = process.env): string {
  if (env.POD_NAMESPACE) return env.POD_NAMESPACE;
  try {
    const ns = readFileSync(SERVICE_ACCOUNT_NAMESPACE_FILE, 'utf8').trim();
    if (ns) return ns;
  } catch {
    // Not running in a Pod.
  }
  return 'default';
}

class PodProvider implements Provider, Checker {
  readonly name: string;
  readonly type = KUBERNETES_PROVIDER_TYPE;
  private readonly core: CoreV1Api;
  private readonly settings: PodSettings;
  private readonly apiHost: string | undefined;
  private readonly log: Logger;
  private readonly pageSize: number;
  private readonly nodes: NodeLocations;

  constructor(opts: KubernetesProviderOptions) {
    this.pageSize = opts.listPageSize ?? LIST_PAGE_SIZE;
    this.name = opts.name;
    this.core = opts.core;
    this.apiHost = opts.apiHost;
    // buildProviders hands every provider a logger already bound to its name.
    this.log = opts.log ?? silentLogger();
    this.settings = podSettings(
      opts.config ?? {},
      opts.defaultNamespace ?? operatorNamespace(),
      opts.operator,
    );
    this.nodes = new NodeLocations(this.core, this.log, {
      zoneLabel: this.settings.zoneLabel,
      ...(opts.nodeCacheMs === undefined ? {} : { cacheMs: opts.nodeCacheMs }),
    });
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    validateRequest(req, this.settings, this.name);
    const { namespace } = this.settings;
    const id = providerIDOf(namespace, req.name);
    if (req.cloudInit !== undefined) {
      ctx.log.debug(
        { instance: req.name },
        'kubernetes provider ignores cloud-init; Squid is configured directly',
      );
    }
    let pod: V1Pod;
    try {
      pod = await this.core.createNamespacedPod(
        { namespace, body: buildPod(req, this.settings) },
        this.opts(ctx),
      );
      this.log.info(
        { instance: req.name, namespace, proxy: `${req.namespace}/${req.proxyName}` },
        'proxy pod created',
      );
    } catch (err) {
      // Already there (a retry after a crash or a lost answer): create is idempotent by name.
      if (apiCode(err) !== 409) throw toProviderError(err, this.where('create', id), ctx.signal);
      pod = await this.readPod(ctx, namespace, req.name, 'create');
      const owner = pod.metadata?.labels?.[INSTANCE_LABEL_UID];
      if (owner !== sanitizeLabelValue(req.uid)) {
        throw permanent(
          `${this.name} create ${id}: a Pod of that name exists and does not belong to this Proxy`,
          {
            ...this.where('create', id),
          },
        );
      }
    }
    await this.ensureSecret(ctx, req, pod, id);
    return this.located(ctx, pod);
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const { namespace, name } = parseProviderID(providerID, this.name);
    return this.located(ctx, await this.readPod(ctx, namespace, name, 'get'));
  }

  /**
   * The instance with its node's region and zone, once the Pod is scheduled. Only create and
   * get carry a location (what status is written from); listByTag, for the orphan sweep, does
   * not read Nodes.
   */
  private async located(ctx: CallContext, pod: V1Pod): Promise<Instance> {
    const inst = instanceFromPod(pod);
    const node = pod.spec?.nodeName;
    if (!node) return inst;
    let location: Instance['location'];
    try {
      location = await this.nodes.of(node, ctx.signal);
    } catch (err) {
      throw toProviderError(err, this.where('get', inst.id), ctx.signal);
    }
    if (location) inst.location = location;
    return inst;
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const { namespace, name } = parseProviderID(providerID, this.name);
    try {
      await this.core.deleteNamespacedPod({ name, namespace }, this.opts(ctx));
      this.log.info({ instance: name, namespace }, 'proxy pod deleted');
    } catch (err) {
      if (apiCode(err) !== 404) throw toProviderError(err, this.where('delete', providerID), ctx.signal);
    }
    try {
      await this.core.deleteNamespacedSecret({ name, namespace }, this.opts(ctx));
    } catch (err) {
      if (apiCode(err) !== 404) {
        throw toProviderError(err, { ...this.where('delete', providerID), statusMessage: false }, ctx.signal);
      }
    }
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    const out: Instance[] = [];
    let cont: string | undefined;
    do {
      let page: Awaited<ReturnType<CoreV1Api['listPodForAllNamespaces']>>;
      try {
        page = await this.core.listPodForAllNamespaces(
          { labelSelector: MANAGED_SELECTOR, limit: this.pageSize, ...(cont ? { _continue: cont } : {}) },
          this.opts(ctx),
        );
      } catch (err) {
        throw toProviderError(err, this.where('listByTag'), ctx.signal);
      }
      for (const pod of page.items) out.push(instanceFromPod(pod));
      cont = page.metadata?._continue || undefined;
    } while (cont);
    return out;
  }

  /** Adds the installation label to a Pod created before installations existed (a merge patch). */
  async adopt(ctx: CallContext, providerID: string, installation: string): Promise<void> {
    const { namespace, name } = parseProviderID(providerID, this.name);
    const body = {
      metadata: { labels: { [INSTANCE_LABEL_INSTALLATION]: sanitizeLabelValue(installation) } },
    };
    try {
      await this.core.patchNamespacedPod(
        { name, namespace, body },
        callOptions({ signal: ctx.signal, patch: 'merge' }),
      );
    } catch (err) {
      if (apiCode(err) === 404) {
        throw notFound(`${this.name} adopt ${providerID}: pod not found`, this.where('adopt', providerID));
      }
      throw toProviderError(err, this.where('adopt', providerID), ctx.signal);
    }
  }

  /**
   * Lists at most one managed Pod cluster-wide: the same call, scope and RBAC that listByTag and
   * orphan sweep depend on. It proves the API server answers and we may list; not create/delete rights.
   */
  async check(ctx: CallContext): Promise<TargetCheck[]> {
    const start = Date.now();
    const target: TargetCheck = { name: 'apiserver', ready: false, reason: 'Unreachable' };
    if (this.apiHost) target.address = this.apiHost;
    try {
      await this.core.listPodForAllNamespaces({ labelSelector: MANAGED_SELECTOR, limit: 1 }, this.opts(ctx));
      target.ready = true;
      target.reason = 'Reachable';
    } catch (err) {
      target.reason = checkReason(err, ctx.signal);
      target.message = checkMessage(err);
    }
    target.latencyMillis = Math.max(0, Date.now() - start);
    return [target];
  }

  private async readPod(ctx: CallContext, namespace: string, name: string, op: string): Promise<V1Pod> {
    const id = providerIDOf(namespace, name);
    try {
      return await this.core.readNamespacedPod({ name, namespace }, this.opts(ctx));
    } catch (err) {
      if (apiCode(err) === 404) throw notFound(`${this.name} ${op} ${id}: pod not found`, this.where(op, id));
      throw toProviderError(err, this.where(op, id), ctx.signal);
    }
  }

  /** The Secret the Pod mounts; present already (an earlier attempt) is fine. */
  private async ensureSecret(ctx: CallContext, req: CreateRequest, pod: V1Pod, id: string): Promise<void> {
    const uid = pod.metadata?.uid;
    const body = buildSecret(req, this.settings, uid ? { name: req.name, uid } : undefined);
    try {
      await this.core.createNamespacedSecret({ namespace: this.settings.namespace, body }, this.opts(ctx));
    } catch (err) {
      if (apiCode(err) === 409) return;
      throw toProviderError(err, { ...this.where('create', id), statusMessage: false }, ctx.signal);
    }
  }

  private opts(ctx: CallContext) {
    return callOptions({ signal: ctx.signal });
  }

  private where(op: string, providerID?: string) {
    return providerID === undefined ? { op, provider: this.name } : { op, provider: this.name, providerID };
  }
}
