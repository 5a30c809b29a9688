/**
 * runtime/leader/checkpoint-configmaps — where the leader keeps its lease checkpoint in a
 * cluster: ConfigMaps in the operator namespace, which the operator owns outright (RBAC:
 * configmaps get/create/update there). A checkpoint larger than one object (the API caps an
 * object near 1 MiB) is cut into shards. Two sets of shards, `-a-N` and `-b-N`, are written in
 * turn, each shard stamped with the checkpoint's generation: a crash halfway through writing one
 * set leaves the other whole, and loading takes the newest set whose shards all agree. Sets
 * that exist but of which none is whole, or a first shard without its annotations, are a damaged
 * checkpoint (LeaseStateError); kept aside, their shards are copied to
 * `<name>-damaged-<stamp>-{a,b}-N` and the originals emptied (generation 0, no text), which loads
 * as no checkpoint.
 */
import type { CoreV1Api, V1ConfigMap } from '@kubernetes/client-node';
import { asideStamp, type CheckpointStorage } from '../../lease/checkpoint.ts';
import { LeaseStateError } from '../../lease/errors.ts';
import { callOptions } from '../kube/client.ts';
import { statusCodeOf, toStoreError } from '../kube/errors.ts';

export const CHECKPOINT_NAME = 'egress-proxies-operator-leases';
const GENERATION = 'crawl.example.com/checkpoint-generation';
const SHARDS = 'crawl.example.com/checkpoint-shards';
const KEY = 'chunk';
/** The generation of a set emptied after it was kept aside: older than any saved one. */
const DISCARDED_GENERATION = 0;
/** Characters per shard: the checkpoint is ASCII (normalised targets, keys, UIDs), so bytes too. */
export const DEFAULT_SHARD_CHARS = 900_000;

type SetName = 'a' | 'b';

export interface ConfigMapCheckpointOptions {
  core: CoreV1Api;
  namespace: string;
  name?: string;
  shardChars?: number;
}

export class ConfigMapCheckpoint implements CheckpointStorage {
  readonly where: string;
  private readonly core: CoreV1Api;
  private readonly namespace: string;
  private readonly name: string;
  private readonly shardChars: number;
  private generation = 0;
  /** resourceVersions of the shards we wrote or read, so a save needs no read first. */
  private readonly rv = new Map<string, string>();

  constructor(o: ConfigMapCheckpointOptions) {
    this.core = o.core;
    this.namespace = o.namespace;
    this.name = o.name ?? CHECKPOINT_NAME;
    this.shardChars = Math.max(1, o.shardChars ?? DEFAULT_SHARD_CHARS);
    this.where = `configmaps ${this.namespace}/${this.name}-{a,b}-N`;
  }

  private shardName(set: SetName, i: number): string {
    return `${this.name}-${set}-${i}`;
  }

  async load(signal: AbortSignal): Promise<string | undefined> {
    const sets = await Promise.all((['a', 'b'] as const).map((s) => this.readSet(s, signal)));
    for (const s of sets) if (s) this.generation = Math.max(this.generation, s.generation);
    const best = sets
      .filter((s): s is { generation: number; text: string } => s !== undefined && s.text !== undefined)
      .sort((x, y) => y.generation - x.generation)[0];
    // One torn set beside a whole one is a save a crash interrupted; none whole is damage.
    if (!best && sets.some((s) => s !== undefined)) {
      throw new LeaseStateError(`no set of shards is whole in ${this.where}`);
    }
    // Only an emptied (set-aside) checkpoint is empty: a saved one always holds a document.
    return best?.text || undefined;
  }

  async setAside(at: number, signal: AbortSignal): Promise<string> {
    const prefix = `${this.name}-damaged-${asideStamp(at)}`;
    for (const set of ['a', 'b'] as const) {
      const shards: V1ConfigMap[] = [];
      for (let i = 0; ; i++) {
        const cm = await this.read(this.shardName(set, i), signal);
        if (!cm) break;
        shards.push(cm);
      }
      for (const [i, cm] of shards.entries()) {
        await this.core.createNamespacedConfigMap(
          {
            namespace: this.namespace,
            body: {
              apiVersion: 'v1',
              kind: 'ConfigMap',
              metadata: {
                name: `${prefix}-${set}-${i}`,
                namespace: this.namespace,
                labels: { 'app.kubernetes.io/managed-by': 'egress-proxies-operator' },
                annotations: cm.metadata?.annotations ?? {},
              },
              data: cm.data ?? {},
            },
          },
          callOptions({ signal }),
        );
      }
      // Only once copied: a failure above leaves the originals for the retry. The originals are
      // emptied rather than deleted (the operator's Role has no delete): a set of empty shards
      // is whole and loads as no checkpoint at all, and the next save overwrites it.
      for (let i = 0; i < shards.length; i++) {
        await this.write(this.shardName(set, i), '', DISCARDED_GENERATION, shards.length, signal);
      }
    }
    return `configmaps ${this.namespace}/${prefix}-{a,b}-N`;
  }

  /** One set: its generation, and its text when every shard carries that generation. */
  private async readSet(
    set: SetName,
    signal: AbortSignal,
  ): Promise<{ generation: number; text: string | undefined } | undefined> {
    const head = await this.read(this.shardName(set, 0), signal);
    if (!head) return undefined;
    const generation = Number(head.metadata?.annotations?.[GENERATION]);
    const count = Number(head.metadata?.annotations?.[SHARDS]);
    if (!Number.isSafeInteger(generation) || !Number.isSafeInteger(count) || count < 1) {
      throw new LeaseStateError(
        `configmap ${this.namespace}/${this.shardName(set, 0)} has no valid ${GENERATION} and ${SHARDS} annotations`,
      );
    }
    const parts = [head.data?.[KEY] ?? ''];
    for (let i = 1; i < count; i++) {
      const shard = await this.read(this.shardName(set, i), signal);
      if (Number(shard?.metadata?.annotations?.[GENERATION]) !== generation) {
        return { generation, text: undefined };
      }
      parts.push(shard?.data?.[KEY] ?? '');
    }
    return { generation, text: parts.join('') };
  }

  private async read(name: string, signal: AbortSignal): Promise<V1ConfigMap | undefined> {
    try {
      const cm = await this.core.readNamespacedConfigMap(
        { name, namespace: this.namespace },
        callOptions({ signal }),
      );
      if (cm.metadata?.resourceVersion) this.rv.set(name, cm.metadata.resourceVersion);
      return cm;
    } catch (e) {
      if (statusCodeOf(e) === 404) {
        this.rv.delete(name);
        return undefined;
      }
      throw toStoreError(e, 'configmap');
    }
  }

  async save(text: string, signal: AbortSignal): Promise<void> {
    const generation = this.generation + 1;
    const set: SetName = generation % 2 === 1 ? 'a' : 'b';
    const count = Math.max(1, Math.ceil(text.length / this.shardChars));
    // Shard 0 last: it names how many shards there are.
    for (let i = count - 1; i >= 0; i--) {
      const chunk = text.slice(i * this.shardChars, (i + 1) * this.shardChars);
      await this.write(this.shardName(set, i), chunk, generation, count, signal);
    }
    this.generation = generation;
  }

  private async write(
    name: string,
    chunk: string,
    generation: number,
    count: number,
    signal: AbortSignal,
  ): Promise<void> {
    const body = (resourceVersion?: string): V1ConfigMap => ({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: {
        name,
        namespace: this.namespace,
        ...(resourceVersion ? { resourceVersion } : {}),
        labels: { 'app.kubernetes.io/managed-by': 'egress-proxies-operator' },
        annotations: { [GENERATION]: String(generation), [SHARDS]: String(count) },
      },
      data: { [KEY]: chunk },
    });
    let rv = this.rv.get(name);
    if (rv === undefined) {
      await this.read(name, signal);
      rv = this.rv.get(name);
    }
    try {
      const out =
        rv === undefined
          ? await this.core.createNamespacedConfigMap(
              { namespace: this.namespace, body: body() },
              callOptions({ signal }),
            )
          : await this.core.replaceNamespacedConfigMap(
              { name, namespace: this.namespace, body: body(rv) },
              callOptions({ signal }),
            );
      if (out.metadata?.resourceVersion) this.rv.set(name, out.metadata.resourceVersion);
    } catch (e) {
      // A conflict means another writer — a leader that took over while this one lost its
      // lease. This save fails rather than overwrite it; the next one starts from a fresh read.
      this.rv.delete(name);
      throw toStoreError(e, 'configmap');
    }
  }
}
