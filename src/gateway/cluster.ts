/**
 * gateway/cluster — the gateway in cluster mode (docs/architecture.md, "Gateway scale-out"):
 * every replica serves it with a ReplicaChooser kept in step by a GatewayLink, and the leader's
 * GatewayHub answers the links on `POST /v1/internal/gateway/sync`, a route of the discovery
 * API's table behind its bearer token (a standby forwards it to the leader like any `/v1/*`
 * request).
 */
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { forwardingAgent, type LeaseAuthority } from '../discovery/authority.ts';
import { errorBody } from '../discovery/errors.ts';
import type { Handlers } from '../discovery/schemas.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { TlsFiles } from '../metrics/listener.ts';
import { collectedGauge, counter } from '../metrics/register.ts';
import type { Clock } from '../runtime/clock.ts';
import { GatewayHub } from './hub.ts';
import { GatewayLink, leaderTransport } from './link.ts';
import { ReplicaChooser } from './replica.ts';
import { syncRequestProblem } from './share.ts';

/** The hub's handler of the sync route; the authority in front of it lets only the leader answer. */
export function gatewaySyncHandler(hub: GatewayHub): Handlers['gatewaySync'] {
  return async (req, reply) => {
    const problem = syncRequestProblem(req.body);
    if (problem) return reply.code(400).send(errorBody('bad_request', problem.message, problem.field));
    const answer = await hub.sync(req.body);
    return reply.header('cache-control', 'no-store').send(answer);
  };
}

export interface ClusterGateway {
  hub: GatewayHub;
  replica: ReplicaChooser;
  link: GatewayLink;
  close(): Promise<void>;
}

/** The hub, this replica's chooser and its link to whoever leads. */
export function clusterGateway(o: {
  leases: LeaseStore;
  authority: LeaseAuthority;
  clock: Clock;
  log: Logger;
  token: string | undefined;
  tls: TlsFiles | undefined;
  registry: Registry;
}): ClusterGateway {
  const hub = new GatewayHub({
    leases: o.leases,
    clock: o.clock,
    log: o.log,
    isServing: () => o.authority.isServing,
  });
  const replica = new ReplicaChooser(o.clock);
  const agent = forwardingAgent(o.tls);
  collectedGauge(o.registry, {
    name: 'proxy_operator_gateway_share_slots',
    help: "Slot leases this replica's gateway holds per upstream (its share of the upstream's capacity)",
    labelNames: ['upstream'],
    collect() {
      this.reset();
      for (const s of replica.shares()) if (s.slots > 0) this.set({ upstream: s.upstream }, s.slots);
    },
  });
  collectedGauge(o.registry, {
    name: 'proxy_operator_gateway_share_in_use',
    help: "Connections open on each upstream through this replica's gateway, counted against its share",
    labelNames: ['upstream'],
    collect() {
      this.reset();
      for (const s of replica.shares()) if (s.inUse > 0) this.set({ upstream: s.upstream }, s.inUse);
    },
  });
  const syncFailures = counter(o.registry, {
    name: 'proxy_operator_gateway_sync_failures_total',
    help: "Gateway syncs with the leader's hub that failed (no leader, unreachable, refused)",
  });
  const link = new GatewayLink({
    replica,
    transport: leaderTransport({ hub, authority: o.authority, token: o.token, agent }),
    clock: o.clock,
    log: o.log,
    onFailure: () => syncFailures.inc(),
  });
  return {
    hub,
    replica,
    link,
    close: async () => {
      hub.close();
      replica.close();
      await agent.close();
    },
  };
}
