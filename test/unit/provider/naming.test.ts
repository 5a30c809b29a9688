import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { instanceName } from '../../../src/provider/naming.ts';
import { TEST_SEED } from '../../support/random.ts';

const GCP = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const LIBVIRT = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

describe('instanceName', () => {
  it('is valid for GCP, libvirt and Pods for any UID and hash', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1 }), fc.string({ minLength: 1 }), (uid, hash) => {
        const n = instanceName(uid, hash);
        expect(n).toMatch(GCP);
        expect(n).toMatch(LIBVIRT);
        expect(n).toMatch(DNS1123_LABEL);
        expect(n.length).toBeLessThanOrEqual(63);
        expect(n.startsWith('px-')).toBe(true);
      }),
      { numRuns: 2000, seed: TEST_SEED },
    );
  });

  it('is deterministic and separates different UIDs and different hashes', () => {
    fc.assert(
      fc.property(
        fc.uuid(),
        fc.uuid(),
        fc.string({ unit: fc.constantFrom(...'0123456789abcdef'), minLength: 64, maxLength: 64 }),
        (a, b, h) => {
          expect(instanceName(a, h)).toBe(instanceName(a, h));
          if (a.replaceAll('-', '').slice(0, 16) !== b.replaceAll('-', '').slice(0, 16)) {
            expect(instanceName(a, h)).not.toBe(instanceName(b, h));
          }
        },
      ),
      { seed: TEST_SEED },
    );
    const uid = '6f1c2a9e-3b7d-4e21-9a55-0c8d2f4b7e10';
    const h1 = 'a'.repeat(64);
    const h2 = `b${'a'.repeat(63)}`;
    expect(instanceName(uid, h1)).not.toBe(instanceName(uid, h2));
  });

  it('reads like the UID and the hash for a Kubernetes UID and a sha256 hex', () => {
    const name = instanceName('6F1C2A9E-3b7d-4e21-9a55-0c8d2f4b7e10', `0123456789${'f'.repeat(54)}`);
    expect(name).toBe('px-6f1c2a9e3b7d4e21-0123456789');
  });

  it('refuses an empty UID or hash with a message naming it', () => {
    expect(() => instanceName('', 'abc')).toThrow(/uid/);
    expect(() => instanceName('u', '')).toThrow(/spec-hash/);
  });
});
