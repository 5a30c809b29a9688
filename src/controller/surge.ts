/**
 * controller/surge — the per-provider limit on replacements in flight (--max-concurrent-replacements,
 * docs/operations.md): a Proxy takes a slot before it creates a replacement and gives it back at
 * the switch, when the replacement is abandoned, or when the Proxy goes away. The rest wait in
 * arrival order and are requeued as slots free up. Slots live in the leader's memory; after a
 * restart or a leader change they are rebuilt from the Proxies that have a pending replacement.
 */

import { keyOf, parseKey } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { ResourceClient } from '../runtime/store.ts';

/** `N` replacements per provider, or `P%` of its Proxies (rounded down, at least 1). */
export type SurgeLimit = { count: number } | { percent: number };

export const DEFAULT_SURGE_LIMIT: SurgeLimit = { percent: 10 };

/** Parses `--max-concurrent-replacements`: a positive integer or a percentage in (0, 100]. */
export function parseSurgeLimit(text: string): SurgeLimit {
  const t = text.trim();
  const pct = /^([0-9]+(?:\.[0-9]+)?)%$/.exec(t);
  if (pct) {
    const percent = Number(pct[1]);
    if (percent > 0 && percent <= 100) return { percent };
  } else if (/^[0-9]+$/.test(t) && Number(t) >= 1) {
    return { count: Number(t) };
  }
  throw new Error(`must be a positive integer or a percentage in (0, 100] such as "10%", got "${text}"`);
}

const PROVIDER_INDEX = 'spec-provider';
/** One function object, so every limiter on a store shares the index. */
const providerOf = (p: ProxyObject): string[] => (p.spec.provider ? [p.spec.provider] : []);

export interface SlotAnswer {
  granted: boolean;
  inUse: number;
  limit: number;
}

export class SurgeLimiter {
  private readonly holders = new Map<string, Set<string>>();
  private readonly waiting = new Map<string, Set<string>>();
  private readonly seeded = new Set<string>();
  private enqueue: ((key: string) => void) | undefined;
  private readonly proxies: ResourceClient<ProxyObject>;
  private readonly limit: SurgeLimit;

  constructor(proxies: ResourceClient<ProxyObject>, limit: SurgeLimit = DEFAULT_SURGE_LIMIT) {
    this.proxies = proxies;
    this.limit = limit;
    proxies.addIndex(PROVIDER_INDEX, providerOf);
  }

  /** Where waiting Proxies are requeued when a slot frees up (the reconciler's watch sources). */
  setEnqueue(enqueue: ((key: string) => void) | undefined): void {
    this.enqueue = enqueue;
  }

  /** The limit for `provider` now. */
  limitFor(provider: string): number {
    if ('count' in this.limit) return this.limit.count;
    const n = this.proxies.byIndex(PROVIDER_INDEX, provider).length;
    return Math.max(1, Math.floor((n * this.limit.percent) / 100));
  }

  /** Takes a slot for `key` (a holder keeps its slot); otherwise `key` waits its turn. */
  tryAcquire(provider: string, key: string): SlotAnswer {
    const held = this.holdersOf(provider);
    const limit = this.limitFor(provider);
    const queue = this.waitingOf(provider);
    if (!held.has(key)) {
      this.prune(provider, held);
      // First come, first served: a slot goes to the longest waiter.
      const ahead = [...queue].indexOf(key);
      const turn = ahead === -1 ? queue.size : ahead;
      if (held.size + turn >= limit) {
        queue.add(key);
        return { granted: false, inUse: held.size, limit };
      }
      held.add(key);
      queue.delete(key);
    }
    return { granted: true, inUse: held.size, limit };
  }

  /** Counts `key` as replacing whatever the limit (its replacement is already recorded). */
  hold(provider: string, key: string): void {
    this.waitingOf(provider).delete(key);
    this.holdersOf(provider).add(key);
  }

  /** Gives the slot back (if held) and forgets a wait; requeues the next waiter. */
  release(provider: string, key: string): void {
    this.waitingOf(provider).delete(key);
    const held = this.holdersOf(provider);
    if (!held.delete(key)) return;
    this.wake(provider);
  }

  /** Forgets `key` everywhere (the Proxy is gone). */
  forget(key: string): void {
    for (const provider of new Set([...this.holders.keys(), ...this.waiting.keys()])) {
      this.release(provider, key);
    }
  }

  private wake(provider: string): void {
    const next = this.waitingOf(provider).values().next();
    if (!next.done) this.enqueue?.(next.value);
  }

  private waitingOf(provider: string): Set<string> {
    let q = this.waiting.get(provider);
    if (!q) {
      q = new Set();
      this.waiting.set(provider, q);
    }
    return q;
  }

  /** Holders of `provider`; seeded once from the Proxies that have a replacement pending. */
  private holdersOf(provider: string): Set<string> {
    let held = this.holders.get(provider);
    if (!held) {
      held = new Set();
      this.holders.set(provider, held);
    }
    if (!this.seeded.has(provider)) {
      this.seeded.add(provider);
      for (const p of this.proxies.byIndex(PROVIDER_INDEX, provider)) {
        if (p.status?.pending && !p.metadata.deletionTimestamp) held.add(keyOf(p));
      }
    }
    return held;
  }

  /** Drops holders and waiters whose Proxy is gone or being deleted (their reconcile may never come). */
  private prune(provider: string, held: Set<string>): void {
    for (const set of [held, this.waitingOf(provider)]) {
      for (const key of set) {
        const p = this.proxies.get(parseKey(key));
        if (!p || p.metadata.deletionTimestamp || p.spec.provider !== provider) set.delete(key);
      }
    }
  }
}
