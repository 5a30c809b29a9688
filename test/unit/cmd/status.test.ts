import { describe, expect, it } from 'vitest';
import { formatStatusTable } from '../../../src/cmd/status.ts';
import type { ProxySnapshot } from '../../../src/lease/types.ts';

const now = Date.parse('2026-12-02T10:00:00Z');
const row = (over: Partial<ProxySnapshot>): ProxySnapshot => ({
  namespace: 'crawl',
  name: 'eu-1',
  phase: 'Ready',
  healthy: true,
  draining: false,
  deleting: false,
  host: '203.0.113.7',
  port: 3128,
  egressIP: null,
  latencyMillis: 42,
  activeLeases: 1,
  maxLeases: 0,
  lastLeasedAt: null,
  cooldownUntil: null,
  targetCooldowns: [],
  leasable: true,
  reason: null,
  problem: null,
  ...over,
});

describe('status table', () => {
  it('shows phase, address, egress IP, health, latency, leases, leasability and cooldowns, aligned', () => {
    const text = formatStatusTable(
      [
        row({ egressIP: '203.0.113.9' }),
        row({
          name: 'eu-2',
          healthy: false,
          host: null,
          port: null,
          latencyMillis: null,
          activeLeases: 2,
          maxLeases: 2,
          leasable: false,
          reason: 'Unhealthy',
          cooldownUntil: '2026-12-02T10:01:00Z',
          targetCooldowns: [{ target: 'example.com', until: '2026-12-02T10:10:00Z' }],
        }),
      ],
      now,
    );
    const lines = text.split('\n');
    expect(lines[0]).toMatch(
      /^NAMESPACE\s+NAME\s+PHASE\s+ADDRESS\s+EGRESS IP\s+HEALTHY\s+LATENCY\s+LEASES\s+LEASABLE\s+COOLDOWNS$/,
    );
    expect(lines[1]).toMatch(
      /eu-1\s+Ready\s+203\.0\.113\.7:3128\s+203\.0\.113\.9\s+yes\s+42ms\s+1\s+yes\s+-$/,
    );
    expect(lines[2]).toMatch(
      /eu-2\s+Ready\s+-\s+-\s+no\s+-\s+2\/2\s+no \(Unhealthy\)\s+all 60s, example\.com 10m$/,
    );
    // Columns line up: every row has the NAME column at the same offset.
    const col = lines[0]?.search(/\bNAME\b/);
    expect(lines.every((l) => l.indexOf('eu-') === col || l.startsWith('NAMESPACE'))).toBe(true);
    expect(text).not.toMatch(/password|@/);
  });

  it('--target: leasability for that site, only its cooldowns, and a closing count', () => {
    const text = formatStatusTable(
      [
        row({
          targetCooldowns: [
            { target: 'other.example', until: '2026-12-02T10:05:00Z' },
            { target: 'shop.example', until: '2026-12-02T10:10:00Z' },
          ],
          leasable: false,
          reason: 'CoolingDownForTarget',
        }),
        row({ name: 'eu-2', targetCooldowns: [{ target: 'other.example', until: '2026-12-02T10:05:00Z' }] }),
      ],
      now,
      'shop.example',
    );
    const lines = text.split('\n');
    expect(lines[1]).toMatch(/no \(CoolingDownForTarget\)\s+shop\.example 10m$/);
    expect(lines[2]).toMatch(/eu-2\s+.*\s+yes\s+-$/);
    expect(text).not.toContain('other.example');
    expect(lines.at(-1)).toBe('TARGET shop.example: 1 of 2 leasable now, 1 cooling down for it');
  });
});
