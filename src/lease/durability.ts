/**
 * lease/durability — takes the lease store's durable state out of its parts and puts it back:
 * live leases (per-lease credentials as digests), global and per-target cooldowns, drain start
 * times and still-reportable ended leases, as the document of lease/durable, so they survive a
 * restart or a change of leader (lease/checkpoint saves and loads it).
 */
import type { ChangeCounter } from './changes.ts';
import type { Cooldowns } from './cooldowns.ts';
import { LEASE_STATE_VERSION, type LeaseState, type ProxyRecord } from './durable.ts';
import type { Entry } from './entry.ts';
import type { Fleet } from './fleet.ts';
import type { LeaseTable } from './lease-table.ts';

export class Durability {
  private readonly fleet: Fleet;
  private readonly cooldowns: Cooldowns;
  private readonly table: LeaseTable;
  private readonly changes: ChangeCounter;

  constructor(fleet: Fleet, cooldowns: Cooldowns, table: LeaseTable, changes: ChangeCounter) {
    this.fleet = fleet;
    this.cooldowns = cooldowns;
    this.table = table;
    this.changes = changes;
  }

  /** Everything a restart or a new leader must not forget, as of `now`. */
  exportState(now: number): LeaseState {
    const proxies: ProxyRecord[] = [];
    const seen = new Set<Entry>();
    const record = (e: Entry) => {
      if (seen.has(e)) return;
      seen.add(e);
      const targets: [string, number][] = [];
      for (const c of e.targetUntil.values()) if (c.at > now) targets.push([c.target, c.at]);
      const global = e.globalUntil > now ? e.globalUntil : 0;
      if (global === 0 && targets.length === 0 && e.drainingSince === 0) return;
      proxies.push([e.key, e.uid, global, e.drainingSince, targets]);
    };
    for (const e of this.fleet.all()) record(e);
    for (const e of this.fleet.held()) record(e);
    const leases: LeaseState['leases'] = [];
    for (const l of this.table.live()) {
      const r: LeaseState['leases'][number] = [
        l.id,
        l.entry.key,
        l.entry.uid,
        l.target ?? null,
        l.expiresAt,
        l.instance,
      ];
      if (l.secret) r.push(l.secret);
      leases.push(r);
    }
    const ended: LeaseState['ended'] = [];
    for (const [id, x] of this.table.reportable(now)) {
      ended.push([id, x.entry.key, x.entry.uid, x.target ?? null, x.endedAt]);
    }
    return { v: LEASE_STATE_VERSION, at: now, leases, proxies, ended };
  }

  /**
   * Merges a checkpoint in (normally into an empty store, before serving): what has ended by
   * `now` is skipped; cooldowns only ever lengthen; a proxy recreated under the same name
   * (another uid) does not inherit the old one's state. Proxies the feed has not delivered yet
   * are held aside and adopted when it does.
   */
  restoreState(state: LeaseState, now: number): { leases: number; proxies: number } {
    let restoredProxies = 0;
    for (const [key, uid, global, drainingSince, targets] of state.proxies) {
      const e = this.fleet.entryForRecord(key, uid);
      if (!e) continue;
      restoredProxies++;
      if (global > now) this.cooldowns.coolDown(e, global);
      for (const [t, until] of targets) if (until > now) this.cooldowns.coolDownForTarget(e, t, until);
      if (drainingSince > 0 && (e.drainingSince === 0 || drainingSince < e.drainingSince)) {
        e.drainingSince = drainingSince;
      }
    }
    let restoredLeases = 0;
    for (const [id, key, uid, target, expiresAt, instance, secret] of state.leases) {
      if (expiresAt <= now || this.table.get(id)) continue;
      const e = this.fleet.entryForRecord(key, uid);
      if (!e) continue;
      this.table.restore({
        id,
        entry: e,
        target: target ?? undefined,
        instance: instance ?? e.instance,
        expiresAt,
        secret,
      });
      restoredLeases++;
    }
    for (const [id, key, uid, target, endedAt] of state.ended) {
      if (this.table.get(id)) continue;
      const e = this.fleet.entryForRecord(key, uid);
      if (e) this.table.restoreEnded(id, { entry: e, target: target ?? undefined, endedAt });
    }
    // Ended leases past their retention by now are forgotten at once.
    this.table.expire(now);
    this.changes.decided();
    return { leases: restoredLeases, proxies: restoredProxies };
  }
}
