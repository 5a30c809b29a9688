import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../../src/api/constants.ts';
import { createCredentialsResolver } from '../../../src/runtime/credentials.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';

const NS = 'crawl';
const names = (ps: { metadata: { name: string } }[]) => ps.map((p) => p.metadata.name);

function setup() {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const resolver = createCredentialsResolver(store, { clock });
  return { clock, store, resolver };
}

describe('credentials resolver', () => {
  it('knows which Proxies read a Secret, kept in step with the Proxies', async () => {
    const { store, resolver } = setup();
    store.seedProxy({
      metadata: { name: 'a', namespace: NS },
      spec: { provider: 'fake', cloudInit: { secretRef: { name: 'init', key: 'user-data' } } },
    });
    store.seedProxy({
      metadata: { name: 'b', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'shared' } },
    });
    store.seedProxy({
      metadata: { name: 'ext', namespace: NS },
      spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 } },
    });
    expect(names(resolver.proxiesUsingSecret({ namespace: NS, name: 'init' }))).toEqual(['a']);
    expect(names(resolver.proxiesUsingSecret(`${NS}/a-auth`))).toEqual(['a']);
    expect(names(resolver.proxiesUsingSecret(`${NS}/shared`))).toEqual(['b']);
    expect(names(resolver.proxiesUsingSecret(`${NS}/b-auth`))).toEqual([]);
    // An External proxy without credentialsSecretRef reads no Secret.
    expect(names(resolver.proxiesUsingSecret(`${NS}/ext-auth`))).toEqual([]);

    const c = store.seedProxy({
      metadata: { name: 'c', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'shared' } },
    });
    expect(names(resolver.proxiesUsingSecret(`${NS}/shared`))).toEqual(['b', 'c']);
    await store.proxies.update({ ...c, spec: { provider: 'fake' } });
    expect(names(resolver.proxiesUsingSecret(`${NS}/shared`))).toEqual(['b']);
    expect(names(resolver.proxiesUsingSecret(`${NS}/c-auth`))).toEqual(['c']);
    await store.proxies.delete({ namespace: NS, name: 'b' });
    expect(names(resolver.proxiesUsingSecret(`${NS}/shared`))).toEqual([]);
    // A second resolver on the same store shares the one index.
    expect(names(createCredentialsResolver(store).proxiesUsingSecret(`${NS}/c-auth`))).toEqual(['c']);
  });

  it('reads credentials from the cache, or from the store for an unlabelled Secret', async () => {
    const { store, resolver } = setup();
    const p = store.seedProxy({ metadata: { name: 'p', namespace: NS }, spec: { provider: 'fake' } });
    expect(await resolver.credentialsFor(p)).toBeUndefined();
    store.seedSecret({
      metadata: { name: 'p-auth', namespace: NS, labels: { [LABEL_CREDENTIALS_FOR]: 'p' } },
      stringData: { username: 'u', password: 'pw' },
    });
    expect(await resolver.credentialsFor(p)).toEqual({ username: 'u', password: 'pw' });
    const ref = store.seedProxy({
      metadata: { name: 'r', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'plain' } },
    });
    store.seedSecret({
      metadata: { name: 'plain', namespace: NS },
      stringData: { username: 'x', password: 'y' },
    });
    expect(store.secrets.get({ namespace: NS, name: 'plain' })).toBeUndefined();
    expect(await resolver.credentialsFor(ref)).toEqual({ username: 'x', password: 'y' });
    const ext = store.seedProxy({
      metadata: { name: 'ext', namespace: NS },
      spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 } },
    });
    expect(await resolver.credentialsFor(ext)).toBeUndefined();
  });

  it('remembers an uncached read only as long as the caller allows, and forgets on request', async () => {
    const { clock, store, resolver } = setup();
    const p = store.seedProxy({
      metadata: { name: 'r', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'plain' } },
    });
    const key = { namespace: NS, name: 'plain' };
    store.seedSecret({ metadata: key, stringData: { username: 'x', password: 'one' } });
    expect(await resolver.credentialsFor(p, { maxAgeMs: 60_000 })).toMatchObject({ password: 'one' });
    await store.secrets.delete(key);
    store.seedSecret({ metadata: key, stringData: { username: 'x', password: 'two' } });
    expect(await resolver.credentialsFor(p, { maxAgeMs: 60_000 })).toMatchObject({ password: 'one' });
    // A caller that accepts no age always reads.
    expect(await resolver.credentialsFor(p)).toMatchObject({ password: 'two' });
    clock.advance(60_000);
    expect(await resolver.credentialsFor(p, { maxAgeMs: 60_000 })).toMatchObject({ password: 'two' });
    await store.secrets.delete(key);
    store.seedSecret({ metadata: key, stringData: { username: 'x', password: 'three' } });
    resolver.invalidate(p);
    expect(await resolver.credentialsFor(p, { maxAgeMs: 60_000 })).toMatchObject({ password: 'three' });
    resolver.close();
  });

  it('forgets a remembered read when an event for that Secret arrives', async () => {
    const { store, resolver } = setup();
    const p = store.seedProxy({
      metadata: { name: 'r', namespace: NS },
      spec: { provider: 'fake', credentialsSecretRef: { name: 'plain' } },
    });
    const key = { namespace: NS, name: 'plain' };
    store.seedSecret({ metadata: key, stringData: { username: 'x', password: 'one' } });
    expect(await resolver.credentialsFor(p, { maxAgeMs: 60_000 })).toMatchObject({ password: 'one' });
    await store.secrets.delete(key);
    // Labelled for a while, so the cache's watch sees it come and go.
    store.seedSecret({
      metadata: { ...key, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      stringData: { username: 'x', password: 'two' },
    });
    await store.secrets.delete(key);
    store.seedSecret({ metadata: key, stringData: { username: 'x', password: 'three' } });
    expect(store.secrets.get(key)).toBeUndefined();
    await expect
      .poll(() => resolver.credentialsFor(p, { maxAgeMs: 60_000 }))
      .toMatchObject({ password: 'three' });
    resolver.close();
  });
});
