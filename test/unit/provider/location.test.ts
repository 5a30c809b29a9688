/**
 * Where each provider says an instance runs (Instance.location): gcp the zone and its region,
 * kvm the host as zone, local the machine as zone; only values a selector can name are kept.
 * The kubernetes provider's Node labels are in kubernetes-location.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { locationOf, selectableLabels } from '../../../src/api/location.ts';
import { gcpLocation, instanceFromGce } from '../../../src/provider/gcp/instance.ts';
import { kvmLocation } from '../../../src/provider/kvm/index.ts';
import { createLocalProvider, localLocation } from '../../../src/provider/local/index.ts';
import { callContext, createRequest } from '../../support/provider-calls.ts';

describe('provider locations', () => {
  it('gcp: the zone, and the region derived from it', () => {
    expect(gcpLocation('europe-west1-b')).toEqual({ region: 'europe-west1', zone: 'europe-west1-b' });
    expect(gcpLocation('us-central1-a')).toEqual({ region: 'us-central1', zone: 'us-central1-a' });
    expect(gcpLocation('')).toBeUndefined();
    const inst = instanceFromGce(
      { name: 'px-1', zone: 'https://www.googleapis.com/compute/v1/projects/p/zones/asia-east1-c' },
      'p',
    );
    expect(inst.location).toEqual({ region: 'asia-east1', zone: 'asia-east1-c' });
  });

  it('kvm: the host is the zone, no region', () => {
    expect(kvmLocation('nas1')).toEqual({ zone: 'nas1' });
    expect(kvmLocation('rack-2.lan')).toEqual({ zone: 'rack-2.lan' });
    // A kvm host name may start with a dash or underscore; such a name is no label value.
    expect(kvmLocation('_odd')).toBeUndefined();
  });

  it('local: the machine (its host name’s first label) is the zone, no region', async () => {
    expect(localLocation('build-7.example.org')).toEqual({ zone: 'build-7' });
    expect(localLocation('')).toBeUndefined();
    const p = createLocalProvider({ name: 'local', hostname: 'workstation.lan' });
    try {
      const inst = await p.create(callContext(), createRequest('px-local'));
      expect(inst.location).toEqual({ zone: 'workstation' });
      expect((await p.get(callContext(), inst.id)).location).toEqual({ zone: 'workstation' });
    } finally {
      await p.close();
    }
  });

  it('keeps only label values: 1-63 characters, letters or digits at both ends', () => {
    expect(locationOf('eu', 'eu-1')).toEqual({ region: 'eu', zone: 'eu-1' });
    expect(locationOf(undefined, 'x'.repeat(64))).toBeUndefined();
    expect(locationOf('-eu', 'eu_1')).toEqual({ zone: 'eu_1' });
    expect(locationOf('', '')).toBeUndefined();
  });

  it('selectable labels: the topology keys beside the own labels; a known location wins', () => {
    const own = { pool: 'eu', 'topology.kubernetes.io/zone': 'mislabelled' };
    expect(selectableLabels(own, undefined)).toBe(own);
    expect(selectableLabels(own, { region: 'r', zone: 'z' })).toEqual({
      pool: 'eu',
      'topology.kubernetes.io/region': 'r',
      'topology.kubernetes.io/zone': 'z',
    });
    expect(selectableLabels({}, { zone: 'z' })).toEqual({ 'topology.kubernetes.io/zone': 'z' });
  });
});
