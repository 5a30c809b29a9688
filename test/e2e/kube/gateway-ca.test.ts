/**
 * The gateway's inspection CA in cluster mode (docs/gateway.md, "HTTPS inspection"), on the real
 * API server with the operator's own ServiceAccount and RBAC: replicas starting at the same
 * moment end up with one CA, kept in one Secret of the operator namespace, and a replica that
 * starts later reads the same one.
 */
import { X509Certificate } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { GATEWAY_CA_SECRET } from '../../../src/cmd/modes.ts';
import { CA_COMMON_NAME, GatewayCa, SecretCaStore } from '../../../src/gateway/ca.ts';
import { createKubeStore, type KubeStore } from '../../../src/runtime/kube/store.ts';
import { kubectl } from './support/control-plane.ts';
import { OPERATOR_NS, OPERATOR_SA, serviceAccountKubeconfig } from './support/operator.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');
const k = (...args: string[]) => kubectl(cp, args);
const stores: KubeStore[] = [];

/** A replica's view of the cluster: its own client, as the operator's ServiceAccount. */
async function replica(kubeconfig: string): Promise<KubeStore> {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfig);
  const store = await createKubeStore({ kubeConfig: kc });
  stores.push(store);
  return store;
}

let kubeconfig: string;

beforeAll(() => {
  k('apply', '--server-side', '--field-manager=e2e-install', '-k', resolve(ROOT, 'config/default'));
  const dir = mkdtempSync(join(tmpdir(), 'e2e-kube-gateway-ca-'));
  kubeconfig = serviceAccountKubeconfig(cp, OPERATOR_NS, OPERATOR_SA, join(dir, 'operator.kubeconfig')).file;
  try {
    k('delete', 'secret', GATEWAY_CA_SECRET, '-n', OPERATOR_NS);
  } catch {
    // Not there: the usual case.
  }
});

afterAll(async () => {
  for (const s of stores) await s.stop();
  k('delete', 'secret', GATEWAY_CA_SECRET, '-n', OPERATOR_NS, '--ignore-not-found');
});

describe('gateway CA in cluster mode', () => {
  it('gives every replica the one CA of one Secret, whichever created it', async () => {
    const open = async () =>
      GatewayCa.open(
        new SecretCaStore((await replica(kubeconfig)).secrets, OPERATOR_NS, GATEWAY_CA_SECRET),
        Date.now,
      );
    const [a, b] = await Promise.all([open(), open()]);
    expect(b.certPem).toBe(a.certPem);
    expect(new X509Certificate(a.certPem).subject).toBe(`CN=${CA_COMMON_NAME}`);
    const later = await open();
    expect(later.certPem).toBe(a.certPem);
    const secret = JSON.parse(k('get', 'secret', GATEWAY_CA_SECRET, '-n', OPERATOR_NS, '-o', 'json')) as {
      data: Record<string, string>;
    };
    expect(Object.keys(secret.data).sort()).toEqual(['ca.key', 'ca.pem']);
    expect(Buffer.from(secret.data['ca.pem'] ?? '', 'base64').toString()).toBe(a.certPem);
  });
});
