/**
 * provider/kubernetes/node-location — where a Pod runs: the `topology.kubernetes.io/region` label
 * and the zone label (the provider's `zoneLabel`, the one `placement.zone` selects Nodes by,
 * default `topology.kubernetes.io/zone`) of the Node it is scheduled on (spec.nodeName). Node labels hardly ever change,
 * so each Node is read once per cache period, not on every reconcile. A location is a nicety:
 * a Node that cannot be read (gone, not permitted by a narrowed RBAC, a flaky call) gives no
 * location, never a failed `get`.
 */
import type { CoreV1Api, V1Node } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { LABEL_REGION, LABEL_ZONE, type Location, locationOf } from '../../api/location.ts';
import { callOptions } from '../../runtime/kube/client.ts';
import { apiCode } from './errors.ts';

/** How long a Node's location is reused before it is read again. */
export const NODE_CACHE_MS = 10 * 60_000;
/** Nodes remembered at most (oldest dropped first): bounded whatever the cluster size. */
const MAX_NODES = 4096;

/** The location a Node's labels give: its region label, and its zone by `zoneLabel`. */
export function locationOfNode(node: V1Node, zoneLabel: string = LABEL_ZONE): Location | undefined {
  const labels = node.metadata?.labels ?? {};
  return locationOf(labels[LABEL_REGION], labels[zoneLabel]);
}

export class NodeLocations {
  private readonly core: CoreV1Api;
  private readonly log: Logger;
  private readonly cacheMs: number;
  private readonly zoneLabel: string;
  private readonly now: () => number;
  /** Per node name: its location (undefined: no topology labels, or unreadable) and when read. */
  private readonly cache = new Map<string, { location: Location | undefined; at: number }>();
  /** Until when node reads are not tried at all (after a 403: RBAC without `get nodes`). */
  private refusedUntil = 0;
  private warnedRefused = false;

  constructor(
    core: CoreV1Api,
    log: Logger,
    opts: { zoneLabel?: string; cacheMs?: number; now?: () => number } = {},
  ) {
    this.core = core;
    this.log = log;
    this.zoneLabel = opts.zoneLabel ?? LABEL_ZONE;
    this.cacheMs = opts.cacheMs ?? NODE_CACHE_MS;
    this.now = opts.now ?? Date.now;
  }

  /** The location of node `name`, from the cache or one read; undefined when unknown. */
  async of(name: string, signal: AbortSignal): Promise<Location | undefined> {
    const now = this.now();
    const hit = this.cache.get(name);
    if (hit && now - hit.at < this.cacheMs) return hit.location;
    if (now < this.refusedUntil) return hit?.location;
    let location: Location | undefined;
    try {
      location = locationOfNode(await this.core.readNode({ name }, callOptions({ signal })), this.zoneLabel);
    } catch (err) {
      if (signal.aborted) throw err;
      const code = apiCode(err);
      if (code === 403) {
        this.refusedUntil = now + this.cacheMs;
        if (!this.warnedRefused) {
          this.warnedRefused = true;
          this.log.warn(
            { node: name },
            'reading Nodes is not permitted (RBAC: get nodes): proxy Pods get no region or zone in status',
          );
        }
        return hit?.location;
      }
      if (code !== 404) {
        // Flaky: keep what was known and read again next time.
        this.log.debug({ node: name, err }, 'reading the node of a proxy pod failed');
        return hit?.location;
      }
    }
    this.cache.delete(name);
    this.cache.set(name, { location, at: now });
    if (this.cache.size > MAX_NODES) this.cache.delete(this.cache.keys().next().value as string);
    return location;
  }
}
