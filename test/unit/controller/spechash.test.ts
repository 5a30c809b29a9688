import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  canonicalJson,
  specHash as keyedSpecHash,
  legacySpecHash,
  type SpecHashInput,
} from '../../../src/provider/spechash.ts';
import { TEST_SEED } from '../../support/random.ts';

const KEY = 'installation-a';
const specHash = (input: SpecHashInput) => keyedSpecHash(input, KEY);

const base: SpecHashInput = {
  provider: 'gcp-main',
  placement: { zone: 'europe-west1-b', machineType: 'e2-micro', image: 'debian-13' },
  port: 3128,
  cloudInit: '#cloud-config\npackages: [squid]\n',
  credentials: { username: 'u', password: 'p' },
};

describe('specHash', () => {
  it('is an HMAC keyed per installation: different across installations, stable within one', () => {
    const a = keyedSpecHash(base, 'installation-a');
    const b = keyedSpecHash(base, 'installation-b');
    expect(a).toMatch(/^[0-9a-f]{64}$/);
    expect(b).toMatch(/^[0-9a-f]{64}$/);
    expect(a).not.toBe(b);
    expect(keyedSpecHash(structuredClone(base), 'installation-a')).toBe(a);
    // Neither is the unkeyed digest earlier versions published.
    expect([a, b]).not.toContain(legacySpecHash(base));
    expect(() => keyedSpecHash(base, '')).toThrow(/installation/);
  });

  it('recognises exactly the unkeyed hash earlier versions wrote (upgrades replace nothing)', () => {
    // Written by 0.2 for `base`: the legacy function must keep reproducing it bit for bit.
    expect(legacySpecHash(base)).toBe('493853ec9ea256590ffef6ec3a1b219569c280d8f554e5bfa40e5a893dd04cee');
  });

  it('is hex and stable across key order and undefined members', () => {
    const h = specHash(base);
    expect(h).toMatch(/^[0-9a-f]{64}$/);
    const reordered: SpecHashInput = {
      credentials: { password: 'p', username: 'u' },
      cloudInit: base.cloudInit,
      port: 3128,
      placement: { image: 'debian-13', machineType: 'e2-micro', zone: 'europe-west1-b' },
      provider: 'gcp-main',
    };
    expect(specHash(reordered)).toBe(h);
    const noPlacement = { ...base, placement: undefined };
    expect(specHash(noPlacement)).toBe(specHash({ ...base, placement: {} }));
  });

  it('changes with each input that needs a new instance', () => {
    const h = specHash(base);
    const variants: SpecHashInput[] = [
      { ...base, provider: 'gcp-other' },
      { ...base, placement: { ...base.placement, zone: 'europe-west1-c' } },
      { ...base, placement: { ...base.placement, machineType: 'e2-small' } },
      { ...base, placement: { ...base.placement, image: 'debian-12' } },
      { ...base, port: 3129 },
      { ...base, cloudInit: `${base.cloudInit} ` },
      { ...base, cloudInit: undefined },
      { ...base, credentials: { username: 'u2', password: 'p' } },
      { ...base, credentials: { username: 'u', password: 'p2' } },
    ];
    const seen = new Set([h]);
    for (const v of variants) {
      const hv = specHash(v);
      expect(hv).not.toBe(h);
      seen.add(hv);
    }
    expect(seen.size).toBe(variants.length + 1);
  });

  it('does not contain its inputs in the clear', () => {
    const h = specHash({ ...base, credentials: { username: 'alice', password: 'hunter2' } });
    expect(h).not.toContain('hunter2');
  });

  it('canonical JSON ignores key order for arbitrary objects', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.jsonValue()), (obj) => {
        const reversed = Object.fromEntries(Object.entries(obj).reverse());
        expect(canonicalJson(reversed)).toBe(canonicalJson(obj));
      }),
      { seed: TEST_SEED },
    );
  });
});
