/**
 * The reconciler as one installation among several: every instance it creates carries its
 * installation id, the spec-hash is an HMAC keyed by that id (different across installations,
 * stable within one), and an upgrade from the unkeyed hash of earlier versions replaces no
 * running instance.
 */
import { describe, expect, it } from 'vitest';
import { ANNOTATION_SPEC_HASH, FINALIZER } from '../../../src/api/constants.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { instanceName } from '../../../src/provider/naming.ts';
import { legacySpecHash, type SpecHashInput, specHash } from '../../../src/provider/spechash.ts';
import {
  createHarness,
  type Harness,
  NS,
  TEST_INSTALLATION,
  untilQuiet,
} from '../../support/controller/harness.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');

async function withCredentials(h: Harness, password: string): Promise<void> {
  await h.seedSecret({
    metadata: { name: 'creds', namespace: NS },
    data: { username: b64('crawler'), password: b64(password) },
  });
}

/** The inputs the harness's default Proxy spec hashes (see harness `seed`). */
const inputs = (password: string): SpecHashInput => ({
  provider: 'fake',
  placement: { zone: 'z1', machineType: 'small' },
  port: 3128,
  credentials: { username: 'crawler', password },
});

describe('reconciler: installation identity', () => {
  it('labels every instance it creates with its installation id', async () => {
    const h = await createHarness();
    await h.seed('eu-1');
    await untilQuiet(h, 'eu-1');
    const [inst] = h.fake.instances.values();
    expect(inst?.installation).toBe(TEST_INSTALLATION);
    expect(inst?.request.installation).toBe(TEST_INSTALLATION);
  });

  it('keys the spec-hash per installation: same spec, different hash; stable across passes', async () => {
    const hashes: string[] = [];
    for (const installation of ['installation-a', 'installation-b']) {
      const h = await createHarness({ deps: { installation } });
      await withCredentials(h, 'same-password');
      await h.seed('eu-1', { credentialsSecretRef: { name: 'creds' } });
      await untilQuiet(h, 'eu-1');
      const hash = h.proxy('eu-1')?.metadata.annotations?.[ANNOTATION_SPEC_HASH] as string;
      expect(hash).toBe(specHash(inputs('same-password'), installation));
      expect(hash).not.toBe(legacySpecHash(inputs('same-password')));
      // Another pass computes the same hash: nothing is replaced.
      await untilQuiet(h, 'eu-1');
      expect(h.proxy('eu-1')?.metadata.annotations?.[ANNOTATION_SPEC_HASH]).toBe(hash);
      expect(h.fake.created).toBe(1);
      hashes.push(hash);
    }
    expect(hashes[0]).not.toBe(hashes[1]);
  });

  it('an upgrade from the unkeyed hash replaces nothing and rewrites the annotation once', async () => {
    const h = await createHarness();
    await withCredentials(h, 'old-password');
    // What 0.2 left behind: unkeyed hash in the annotation and in the running instance's name,
    // no installation label on the instance.
    const seeded = await h.seed('eu-1', { credentialsSecretRef: { name: 'creds' } });
    const uid = seeded.metadata.uid as string;
    const legacy = legacySpecHash(inputs('old-password'));
    const legacyName = instanceName(uid, legacy);
    const running = await h.fake.create(
      { signal: new AbortController().signal, log: silentLogger() },
      {
        name: legacyName,
        uid,
        namespace: NS,
        proxyName: 'eu-1',
        port: 3128,
        credentials: inputs('old-password').credentials,
      },
    );
    await h.store.proxies.update({
      ...seeded,
      metadata: {
        ...seeded.metadata,
        finalizers: [FINALIZER],
        annotations: { [ANNOTATION_SPEC_HASH]: legacy },
      },
    });
    await h.store.proxies.patchStatus(
      { namespace: NS, name: 'eu-1' },
      {
        phase: 'Ready',
        providerID: running.id,
        instanceName: legacyName,
        address: running.address,
        port: 3128,
      },
    );
    const createdBefore = h.fake.created;

    await untilQuiet(h, 'eu-1');
    let p = h.proxy('eu-1');
    expect(h.fake.created).toBe(createdBefore);
    expect(h.fake.calls.delete).toBe(0);
    expect(p?.status?.phase).toBe('Ready');
    expect(p?.status?.providerID).toBe(running.id);
    expect(p?.status?.instanceName).toBe(legacyName);
    expect(p?.status?.retiring ?? []).toEqual([]);
    const keyed = specHash(inputs('old-password'), TEST_INSTALLATION);
    expect(p?.metadata.annotations?.[ANNOTATION_SPEC_HASH]).toBe(keyed);

    // Stable afterwards.
    await untilQuiet(h, 'eu-1');
    expect(h.fake.created).toBe(createdBefore);
    expect(h.proxy('eu-1')?.metadata.annotations?.[ANNOTATION_SPEC_HASH]).toBe(keyed);

    // The first real change moves to a keyed name and retires the legacy instance.
    const secret = await h.store.secrets.read({ namespace: NS, name: 'creds' });
    await h.store.secrets.delete({ namespace: NS, name: 'creds' });
    await h.seedSecret({
      metadata: { name: 'creds', namespace: NS, labels: secret.metadata.labels },
      data: { username: b64('crawler'), password: b64('new-password') },
    });
    await untilQuiet(h, 'eu-1');
    p = h.proxy('eu-1');
    const newName = instanceName(uid, specHash(inputs('new-password'), TEST_INSTALLATION));
    expect(p?.status?.instanceName).toBe(newName);
    expect(h.fake.instances.has(running.id)).toBe(false);
    expect(h.fake.byName(newName)?.installation).toBe(TEST_INSTALLATION);
  });
});
