/**
 * runtime/v8-flags — one V8 setting the process applies before anything else loads: allocation-site
 * pretenuring off. With it on, V8 learns from objects that live long at startup (listener
 * arrays on long-lived emitters, for one) to allocate later objects from the same code sites
 * straight into the old generation; Node's HTTP internals reuse those sites for every request,
 * and those old-space, short-lived objects then keep each request's young objects alive through
 * every minor collection. Under lease traffic that doubled CPU per request and made 15–25 ms
 * minor-GC pauses the p99 (docs/benchmarks.md, "Lease API"). Imported first by every
 * entry point that serves requests (cmd/main, the benches).
 *
 * NODE_LAUNCH_FLAGS are the V8 settings that only take effect on the command line, before the
 * heap exists; every launcher passes them (the image's ENTRYPOINT, bin/egress-proxies-operator.js,
 * the memory benches). A young generation capped at 16 MiB per semi-space: V8 otherwise grows it
 * to 32 MiB per semi-space under a bulk load and keeps those pages committed, 30 MB of resident
 * memory that the lease path does not need (docs/benchmarks.md, "Memory").
 */
import { setFlagsFromString } from 'node:v8';

export const GC_FLAGS = ['--no-allocation-site-pretenuring'] as const;

export const NODE_LAUNCH_FLAGS = ['--max-semi-space-size=16'] as const;

for (const flag of GC_FLAGS) setFlagsFromString(flag);
