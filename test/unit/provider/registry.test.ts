import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { ProviderEntry, ProvidersConfig } from '../../../src/config/schema.ts';
import { silentLogger } from '../../../src/log/index.ts';
import {
  buildProviders,
  isChecker,
  ProviderBuildError,
  type ProviderDeps,
  type ProviderFactory,
} from '../../../src/provider/index.ts';
import { createLocalProvider } from '../../../src/provider/local/index.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { captureLog } from '../../support/log.ts';
import { closedPort } from '../../support/origins.ts';
import { callContext, createRequest } from '../../support/provider-calls.ts';

const ctx = callContext;

const config = (...entries: Array<[string, string]>): ProvidersConfig =>
  ({ providers: entries.map(([name, type]) => ({ name, type })) }) as unknown as ProvidersConfig;

/** A FakeProvider that records close() into `closed`. */
function closable(entry: ProviderEntry, closed: string[]): FakeProvider & { close(): Promise<void> } {
  const p = new FakeProvider({ name: entry.name, type: (entry as { type: string }).type });
  return Object.assign(p, {
    async close() {
      closed.push(entry.name);
    },
  });
}

const deps = (registry = new Registry()): ProviderDeps => ({ log: silentLogger(), registry });

async function requests(reg: Registry): Promise<number> {
  const m = await reg.getSingleMetric('proxy_operator_provider_requests_total')!.get();
  return m.values.reduce((sum, v) => sum + v.value, 0);
}

describe('buildProviders', () => {
  it('builds every entry, in config order, and hands out decorated providers', async () => {
    const closed: string[] = [];
    const seen: Array<{ name: string; extra: unknown }> = [];
    const factory: ProviderFactory = (entry, d) => {
      seen.push({ name: entry.name, extra: d.operatorNamespace });
      return closable(entry, closed);
    };
    const reg = new Registry();
    const providers = await buildProviders(
      config(['gcp-main', 'gcp'], ['home', 'kvm'], ['dev', 'local']),
      { gcp: factory, kvm: factory, local: factory },
      { ...deps(reg), operatorNamespace: 'ops' },
    );
    expect(providers.names()).toEqual(['gcp-main', 'home', 'dev']);
    expect(providers.entries().map(([n]) => n)).toEqual(['gcp-main', 'home', 'dev']);
    expect(providers.type('home')).toBe('kvm');
    expect(providers.type('nope')).toBeUndefined();
    expect(providers.get('nope')).toBeUndefined();
    // Factories receive their entry and the shared deps, extra fields included.
    expect(seen).toEqual(
      expect.arrayContaining([
        { name: 'gcp-main', extra: 'ops' },
        { name: 'dev', extra: 'ops' },
      ]),
    );

    const home = providers.get('home')!;
    await home.create(ctx(), createRequest('px-1'));
    expect(await requests(reg)).toBe(1);
    expect(isChecker(home)).toBe(false);

    await providers.close();
    await providers.close();
    expect(closed.sort()).toEqual(['dev', 'gcp-main', 'home']);
  });

  it('collects checkers from the raw providers, so checks are not provider requests', async () => {
    const reg = new Registry();
    const raws: FakeProvider[] = [];
    const providers = await buildProviders(
      config(['a', 'local'], ['b', 'local']),
      {
        local: (entry) => {
          const p = new FakeProvider({ name: entry.name, type: 'local' });
          raws.push(p);
          return p;
        },
      },
      deps(reg),
    );
    const checkers = providers.checkers();
    expect([...checkers.keys()].sort()).toEqual(['a', 'b']);
    const verdicts = await checkers.get('a')!.check(ctx());
    expect(verdicts[0]!.ready).toBe(true);
    expect(raws.find((p) => p.name === 'a')!.calls.check).toBe(1);
    expect(await requests(reg)).toBe(0);
  });

  it('is all-or-nothing: names every failing entry and closes the ones built', async () => {
    const closed: string[] = [];
    const err = await buildProviders(
      config(['ok-1', 'local'], ['bad-1', 'gcp'], ['ok-2', 'local'], ['bad-2', 'kvm']),
      {
        local: (entry) => closable(entry, closed),
        gcp: () => {
          throw new Error('gcp.project: required');
        },
        kvm: async () => {
          throw new Error('kvm.sshKeyFile: not a private key');
        },
      },
      deps(),
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderBuildError);
    const msg = (err as Error).message;
    expect(msg).toContain('providers[1] (bad-1): gcp.project: required');
    expect(msg).toContain('providers[3] (bad-2): kvm.sshKeyFile: not a private key');
    expect(msg).not.toContain('ok-1');
    expect((err as ProviderBuildError).failures.map((f) => f.index)).toEqual([1, 3]);
    expect(closed.sort()).toEqual(['ok-1', 'ok-2']);
  });

  it('rejects a type without a factory and duplicate names, before building anything', async () => {
    const closed: string[] = [];
    await expect(
      buildProviders(
        config(['a', 'local'], ['k', 'kubernetes']),
        { local: (e) => closable(e, closed) },
        deps(),
      ),
    ).rejects.toThrow('providers[1] (k): provider type "kubernetes" is not available in this mode');
    expect(closed).toEqual(['a']);

    let built = 0;
    await expect(
      buildProviders(
        config(['a', 'local'], ['a', 'local']),
        {
          local: (e) => {
            built++;
            return closable(e, closed);
          },
        },
        deps(),
      ),
    ).rejects.toThrow('providers[1] (a): duplicate name (also providers[0])');
    expect(built).toBe(0);
  });

  it('refuses a factory that returns a provider under another name', async () => {
    await expect(
      buildProviders(
        config(['gcp-eu', 'gcp']),
        { gcp: () => new FakeProvider({ name: 'other', type: 'gcp' }) },
        deps(),
      ),
    ).rejects.toThrow('providers[0] (gcp-eu): factory returned provider other/gcp, want gcp-eu/gcp');
  });

  it('keeps closing the others when one close fails', async () => {
    const closed: string[] = [];
    const providers = await buildProviders(
      config(['a', 'local'], ['b', 'local']),
      {
        local: (entry) => {
          const p = closable(entry, closed);
          if (entry.name === 'a') p.close = () => Promise.reject(new Error('stuck'));
          return p;
        },
      },
      deps(),
    );
    await expect(providers.close()).resolves.toBeUndefined();
    expect(closed).toEqual(['b']);
  });
});

describe('provider log lines', () => {
  it('carry the provider name exactly once', async () => {
    const { log, raw: lines } = captureLog('debug');
    const port = await closedPort();
    const providers = await buildProviders(
      {
        providers: [{ name: 'dev', type: 'local', local: { portRange: { from: port, to: port } } }],
      } as unknown as ProvidersConfig,
      {
        local: (entry, d) =>
          createLocalProvider({
            name: entry.name,
            config: { portRange: { from: port, to: port } },
            log: d.log,
          }),
      },
      { log, registry: new Registry() },
    );
    const dev = providers.get('dev')!;
    await dev.create(ctx(), createRequest('px-a'));
    await providers.close();
    expect(lines.some((l) => l.includes('local proxy started'))).toBe(true);
    for (const line of lines) {
      expect(line.match(/"provider":/g) ?? [], line).toHaveLength(1);
      expect(JSON.parse(line).provider).toBe('dev');
    }
  });
});
