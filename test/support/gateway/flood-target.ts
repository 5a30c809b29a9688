/**
 * test/support/gateway/flood-target — a gateway alone in its own process, for tests that measure
 * the process (its RSS under a connection flood) rather than the test runner. Built as
 * gateway/service builds it, over an empty lease store, with the gateway's default limits except
 * `GATEWAY_UNAUTHENTICATED_TIMEOUT_MS`; prints `{"port":N}` once listening, then serves until
 * killed.
 */
import '../../../src/runtime/v8-flags.ts';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { Gateway } from '../../../src/gateway/server.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { systemClock } from '../../../src/runtime/clock.ts';

const timeout = Number(process.env.GATEWAY_UNAUTHENTICATED_TIMEOUT_MS ?? '10000');
const leases = new LeaseStore({ clock: systemClock });
const gateway = new Gateway({
  bind: { host: '127.0.0.1', port: 0 },
  token: 'flood-target-token',
  chooser: new LeaseStoreChooser(leases, systemClock),
  egress: new EgressGuard(resolveEgressPolicy(undefined)),
  clock: systemClock,
  log: silentLogger(),
  registry: new Registry(),
  tracer: trace.getTracer('flood-target'),
  limits: { unauthenticatedTimeoutMs: timeout },
});
await gateway.listen();
process.stdout.write(`${JSON.stringify({ port: gateway.port })}\n`);
// Keeps the process alive: the gateway's own timers are unref'd.
setInterval(() => undefined, 60_000);
