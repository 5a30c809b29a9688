/**
 * test/gateway/in-process — gateway scale-out without sockets for the in-process tests: a hub
 * over a lease store on the fake clock, and replicas whose links reach it through a transport
 * that round-trips each answer through JSON as the wire would.
 */
import { GatewayHub } from '../../../src/gateway/hub.ts';
import { GatewayLink, type SyncTransport } from '../../../src/gateway/link.ts';
import { ReplicaChooser, SHARE_WAIT_MS } from '../../../src/gateway/replica.ts';
import type { AcquireOutcome } from '../../../src/gateway/upstreams.ts';
import { DEFAULT_SESSION_TTL_SECONDS, type RoutingOptions } from '../../../src/gateway/username.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { silentLogger } from '../../../src/log/index.ts';
import type { FakeClock } from '../clock.ts';

export interface Leader {
  store: LeaseStore;
  hub: GatewayHub;
  serving: boolean;
}

/** A leader: its store holding `fleet` (and `state`, a checkpoint of the previous leader's), and its hub. */
export function newLeader(
  clock: FakeClock,
  fleet: ProxyInfo[],
  state?: ReturnType<LeaseStore['exportState']>,
): Leader {
  const store = new LeaseStore({ clock });
  for (const p of fleet) store.upsertProxy(p);
  if (state) store.restoreState(state);
  const leader: Leader = { store, serving: true } as Leader;
  leader.hub = new GatewayHub({ leases: store, clock, log: silentLogger(), isServing: () => leader.serving });
  return leader;
}

/** Steps down: the hub forgets every share, the store stops; returns the lease state a new leader restores. */
export function stepDown(leader: Leader): ReturnType<LeaseStore['exportState']> {
  leader.serving = false;
  leader.hub.close();
  const state = leader.store.exportState();
  leader.store.close();
  return state;
}

export interface InProcessReplica {
  chooser: ReplicaChooser;
  link: GatewayLink;
}

/** A replica whose link reaches whoever `leader()` is now (undefined: nobody leads). */
export function newReplica(clock: FakeClock, leader: () => Leader | undefined): InProcessReplica {
  const chooser = new ReplicaChooser(clock);
  const transport: SyncTransport = async (req) => {
    const l = leader();
    if (!l) return undefined;
    return JSON.parse(JSON.stringify(await l.hub.sync(req))) as unknown;
  };
  const link = new GatewayLink({ replica: chooser, transport, clock, log: silentLogger() });
  return { chooser, link };
}

const never = new AbortController().signal;

/** One share sync of `r`; false when it failed. */
export function sync(r: InProcessReplica): Promise<boolean> {
  return r.link.syncOnce(never);
}

function settled(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * An acquire as a connection makes it, driven on the fake clock: a replica waiting for its share
 * to grow gets one sync, then the rest of its wait.
 */
export async function acquire(
  r: InProcessReplica,
  clock: FakeClock,
  target: string,
  routing: Partial<RoutingOptions> = {},
): Promise<AcquireOutcome> {
  const got = r.chooser.acquire(target, { sessionTtlSeconds: DEFAULT_SESSION_TTL_SECONDS, ...routing });
  if (!(got instanceof Promise)) return got;
  let out: AcquireOutcome | undefined;
  void got.then((o) => {
    out = o;
  });
  await sync(r);
  await settled();
  if (out === undefined) {
    clock.advance(SHARE_WAIT_MS);
    await settled();
  }
  return out ?? (await got);
}
