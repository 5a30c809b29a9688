import { describe, expect, it } from 'vitest';
import { buildStatus, truncate } from '../../../src/providerhealth/status.ts';

const t0 = new Date('2026-01-01T00:00:00Z');
const t1 = new Date('2026-01-01T00:01:00Z');

describe('ProviderHealth status builder', () => {
  it('reports all targets ready', () => {
    const s = buildStatus(undefined, {
      type: 'kvm',
      supported: true,
      checkedAt: t0,
      targets: [
        { name: 'nas1', ready: true, reason: 'Ready', latencyMillis: 12.4, details: { pool: 'default' } },
        { name: 'nas2', ready: true, reason: 'Ready' },
      ],
    });
    expect(s.targetsReady).toBe('2/2');
    expect(s.lastCheckTime).toBe(t0.toISOString());
    expect(s.conditions?.[0]).toMatchObject({ type: 'Ready', status: 'True', reason: 'AllTargetsReady' });
    expect(s.targets?.[0]).toMatchObject({ latencyMillis: 12, details: { pool: 'default' } });
  });

  it('names failing targets and keeps transition times while readiness holds', () => {
    const first = buildStatus(undefined, {
      type: 'kvm',
      supported: true,
      checkedAt: t0,
      targets: [
        { name: 'nas1', ready: true, reason: 'Ready' },
        { name: 'nas2', ready: false, reason: 'Unreachable', message: 'dial tcp: refused' },
      ],
    });
    const second = buildStatus(first, {
      type: 'kvm',
      supported: true,
      checkedAt: t1,
      targets: [
        { name: 'nas1', ready: false, reason: 'Timeout' },
        { name: 'nas2', ready: false, reason: 'SSHHandshakeFailed' },
      ],
    });
    expect(second.targetsReady).toBe('0/2');
    expect(second.conditions?.[0]).toMatchObject({
      status: 'False',
      reason: 'TargetsNotReady',
      message: 'nas1: Timeout; nas2: SSHHandshakeFailed',
      // The provider was already not ready at t0: the condition did not flip.
      lastTransitionTime: t0.toISOString(),
    });
    expect(second.targets?.find((t) => t.name === 'nas1')?.lastTransitionTime).toBe(t1.toISOString());
    expect(second.targets?.find((t) => t.name === 'nas2')?.lastTransitionTime).toBe(t0.toISOString());
  });

  it('says when checks are not implemented or there is nothing to check', () => {
    const none = buildStatus(undefined, { type: 'gcp', supported: false, checkedAt: t0, targets: [] });
    expect(none.conditions?.[0]).toMatchObject({ status: 'Unknown', reason: 'ChecksNotImplemented' });
    expect(none.targetsReady).toBeUndefined();
    const empty = buildStatus(undefined, { type: 'kvm', supported: true, checkedAt: t0, targets: [] });
    expect(empty.conditions?.[0]).toMatchObject({ status: 'Unknown', reason: 'NoTargets' });
    expect(empty.targetsReady).toBe('0/0');
  });

  it('truncates messages to the CRD limit in characters', () => {
    const s = buildStatus(undefined, {
      type: 'kvm',
      supported: true,
      checkedAt: t0,
      targets: [{ name: 'a', ready: false, reason: 'LibvirtError', message: 'é'.repeat(2000) }],
    });
    expect([...(s.targets?.[0]?.message ?? '')].length).toBe(1024);
    expect(truncate('abc', 3)).toBe('abc');
    expect(truncate('abcd', 3)).toBe('ab…');
  });
});
