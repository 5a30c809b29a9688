/**
 * cmd/compose: a start-up failure after tracing, the kube clients and the store exist closes
 * them again (no leaked agent, tracer provider or state lock), in both modes.
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { StartupError } from '../../../src/cmd/startup.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import type { Tracing } from '../../../src/tracing/index.ts';
import { cleanupCli, createWorkspace, standaloneArgs } from '../../support/cli.ts';

afterEach(cleanupCli);

/** A tracing stand-in that records whether it was shut down. */
function fakeTracing(): Tracing & { shutdown: ReturnType<typeof vi.fn> } {
  return { tracer: trace.getTracer('test'), enabled: true, shutdown: vi.fn(async () => {}) };
}

// Accepted by the flag parser (an http URL by shape), refused when the egress checker is built,
// which happens after tracing, the store and (in cluster mode) the kube clients exist.
const BAD_EGRESS_URL = ['--egress-ip-url', 'http://[not-an-address'];

describe('buildApp start-up failures', () => {
  it('standalone: closes tracing and the state store (its lock) when a later step fails', async () => {
    const ws = await createWorkspace();
    const parsed = parseCommandLine(standaloneArgs(ws, BAD_EGRESS_URL));
    if (parsed.command !== 'standalone') throw new Error('not standalone');
    const tracing = fakeTracing();
    const err = await buildApp(parsed, { log: silentLogger(), deps: { setupTracing: () => tracing } }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toMatch(/--egress-ip-url/);
    expect(tracing.shutdown).toHaveBeenCalledTimes(1);
    expect(existsSync(`${ws.statePath}.lock`)).toBe(false);
    const reopened = await createEmbeddedStore({ statePath: ws.statePath, rescanIntervalMs: 0 });
    await reopened.stop();
  });

  it('operator: closes the kube clients and tracing when a later step fails', async () => {
    const ws = await createWorkspace();
    const kubeconfig = join(ws.dir, 'kubeconfig');
    writeFileSync(
      kubeconfig,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          { name: 'c', cluster: { server: 'https://127.0.0.1:9', 'insecure-skip-tls-verify': true } },
        ],
        users: [{ name: 'u', user: { token: 't' } }],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      }),
    );
    const parsed = parseCommandLine([
      'operator',
      '--providers-config',
      ws.providersFile,
      '--kubeconfig',
      kubeconfig,
      // The API server is unreachable: skip the kube-system read so a later step fails.
      '--installation-id',
      'compose-test',
      ...BAD_EGRESS_URL,
    ]);
    if (parsed.command !== 'operator') throw new Error('not operator');
    const tracing = fakeTracing();
    let clients: KubeClients | undefined;
    let closed = 0;
    const err = await buildApp(parsed, {
      log: silentLogger(),
      deps: {
        setupTracing: () => tracing,
        kubeClients: async (kc) => {
          clients = await createKubeClients(kc);
          const close = clients.close.bind(clients);
          clients.close = async () => {
            closed++;
            await close();
          };
          return clients;
        },
      },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toMatch(/--egress-ip-url/);
    expect(clients).toBeDefined();
    expect(closed).toBe(1);
    expect(tracing.shutdown).toHaveBeenCalledTimes(1);
  });
});
