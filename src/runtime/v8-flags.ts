/**
 * runtime/v8-flags — one V8 setting the process applies before anything else loads: allocation-site
 * pretenuring off. With it on, V8 learns from objects that live long at startup (listener
 * arrays on long-lived emitters, for one) to allocate later objects from the same code sites
 * straight into the old generation; Node's HTTP internals reuse those sites for every request,
 * and those old-space, short-lived objects then keep each request's young objects alive through
 * every minor collection. Under lease traffic that doubled CPU per request and made 15–25 ms
 * minor-GC pauses the p99 (docs/benchmarks.md, "Lease API"). Imported first by every
 * entry point that serves requests (cmd/main, the benches).
 */
import { setFlagsFromString } from 'node:v8';

export const GC_FLAGS = ['--no-allocation-site-pretenuring'] as const;

for (const flag of GC_FLAGS) setFlagsFromString(flag);
