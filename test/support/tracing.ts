/**
 * test/support/tracing — real OpenTelemetry tracing into memory for tests: setupTracing with an
 * InMemorySpanExporter, so spans, parents and attributes can be asserted.
 */
import { InMemorySpanExporter, type ReadableSpan } from '@opentelemetry/sdk-trace';
import { setupTracing, type Tracing } from '../../src/tracing/index.ts';

export interface TestTracing extends Tracing {
  exporter: InMemorySpanExporter;
  /** Finished spans, in end order. */
  spans(): ReadableSpan[];
  /** The single finished span named `name` (throws when there is not exactly one). */
  span(name: string): ReadableSpan;
}

/** Installs global tracing that records into memory. Call `shutdown()` after the test. */
export function setupTestTracing(): TestTracing {
  const exporter = new InMemorySpanExporter();
  const tracing = setupTracing({ serviceName: 'test', exporter, env: {} });
  const spans = (): ReadableSpan[] => exporter.getFinishedSpans();
  return {
    ...tracing,
    exporter,
    spans,
    span(name) {
      const found = spans().filter((s) => s.name === name);
      if (found.length !== 1) throw new Error(`want one span ${name}, have ${found.length}`);
      return found[0]!;
    },
  };
}
