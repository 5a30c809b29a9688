/**
 * runtime/v8-flags — the V8 settings the process applies before anything else loads. Allocation-site
 * pretenuring off. With it on, V8 learns from objects that live long at startup (listener
 * arrays on long-lived emitters, for one) to allocate later objects from the same code sites
 * straight into the old generation; Node's HTTP internals reuse those sites for every request,
 * and those old-space, short-lived objects then keep each request's young objects alive through
 * every minor collection. Under lease traffic that doubled CPU per request and made 15–25 ms
 * minor-GC pauses the p99 (docs/benchmarks.md, "Lease API"). Imported first by every
 * entry point that serves requests (cmd/main, the benches).
 *
 * External memory (the backing stores of Buffers: every socket read, every TLS record decrypted,
 * every HTTP body chunk) counted in V8's global limit instead of as old-generation growth. With
 * V8's historic accounting every ~24 MB of Buffers allocated since the last full collection
 * starts another one, even when each Buffer died young and a scavenge already freed it: under
 * inspected bulk traffic that was a mark-compact every 80–100 ms and 40 % of the gateway's CPU
 * in V8's marking and sweeping threads (docs/benchmarks.md, "Inspected HTTPS"). External memory
 * stays bounded: by the global limit, through the same heap-growing heuristics as the heap.
 *
 * NODE_LAUNCH_FLAGS are the V8 settings that only take effect on the command line, before the
 * heap exists; every launcher passes them (the image's ENTRYPOINT, bin/egress-proxies-operator.js,
 * the memory benches). A young generation capped at 16 MiB per semi-space: V8 otherwise grows it
 * to 32 MiB per semi-space under a bulk load and keeps those pages committed, 30 MB of resident
 * memory that the lease path does not need (docs/benchmarks.md, "Memory").
 */
import { setFlagsFromString } from 'node:v8';

export const GC_FLAGS = [
  '--no-allocation-site-pretenuring',
  '--external-memory-accounted-in-global-limit',
] as const;

export const NODE_LAUNCH_FLAGS = ['--max-semi-space-size=16'] as const;

for (const flag of GC_FLAGS) setFlagsFromString(flag);
