/**
 * test/unit/api/validate — the standalone admission of Proxy objects: every manifest of the shared
 * table gets exactly the field errors the table names, defaults are applied, and messages are
 * readable lines.
 */
import { describe, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { formatFieldErrors, validateProviderHealth, validateProxy } from '../../../src/api/validate.ts';
import { external, managed, PROXY_CASES } from '../../support/api/manifests.ts';

describe('validateProxy — manifest table', () => {
  it.each(PROXY_CASES)('$name', ({ obj, old, errors }) => {
    const result = validateProxy(obj, old ? { old: old as ProxyObject } : {});
    if (errors.length === 0) {
      expect(result.ok ? [] : result.errors).toEqual([]);
    } else {
      expect(result.ok).toBe(false);
      const paths = result.ok ? [] : [...new Set(result.errors.map((e) => e.path))].sort();
      expect(paths).toEqual([...errors].sort());
    }
  });
});

describe('validateProxy — defaults and messages', () => {
  it('defaults type to Managed and port to 3128 without touching the input', () => {
    const input = { ...managed(), spec: { provider: 'kvm-home' } };
    const result = validateProxy(input);
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.value.spec.type).toBe('Managed');
    expect(result.value.spec.port).toBe(3128);
    expect(input.spec).toEqual({ provider: 'kvm-home' });
  });

  it('keeps an explicit port and does not invent an endpoint port', () => {
    const result = validateProxy(external({ port: 8081 }));
    expect(result.ok && result.value.spec.port).toBe(8081);
    expect(result.ok && result.value.spec.endpoint).toEqual({ host: '203.0.113.7', port: 8080 });
  });

  it('explains each problem on its own line, naming the field', () => {
    const result = validateProxy(managed({ port: 0, healthCheck: { failureThreshold: 0, bogus: 1 } }));
    expect(result.ok).toBe(false);
    if (result.ok) return;
    const text = formatFieldErrors(result.errors, 'Proxy crawl/eu-1');
    const lines = text.split('\n');
    expect(lines).toHaveLength(3);
    expect(lines).toContain('Proxy crawl/eu-1: spec.port: must be at least 1 (got 0)');
    expect(lines).toContain(
      'Proxy crawl/eu-1: spec.healthCheck.failureThreshold: must be at least 1 (got 0)',
    );
    expect(lines).toContain('Proxy crawl/eu-1: spec.healthCheck.bogus: unknown field');
  });

  it('says which values an enum allows', () => {
    const result = validateProxy(managed({ type: 'Hosted' }));
    expect(result.ok ? '' : formatFieldErrors(result.errors)).toBe(
      'spec.type: must be one of Managed, External (got "Hosted")',
    );
  });

  it('reports a rule violation with the rule message', () => {
    const result = validateProxy(managed({ healthCheck: { timeoutSeconds: 3 } }));
    expect(result.ok ? '' : formatFieldErrors(result.errors)).toMatch(
      /^spec\.healthCheck\.timeoutSeconds: timeoutSeconds must be less than intervalSeconds × failureThreshold/,
    );
  });

  it('never echoes cloud-init content in an error', () => {
    const secret = 'password: hunter2-very-secret';
    const result = validateProxy(external({ cloudInit: { inline: secret, extra: true } }));
    expect(result.ok).toBe(false);
    expect(JSON.stringify(result)).not.toContain('hunter2');
  });

  it('rejects non-objects', () => {
    expect(validateProxy('nope')).toEqual({
      ok: false,
      errors: [{ path: '', message: 'must be an object' }],
    });
    expect(validateProxy(null).ok).toBe(false);
  });
});

describe('validateProviderHealth', () => {
  const ph = {
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'ProviderHealth',
    metadata: { name: 'kvm-home' },
    status: {
      type: 'kvm',
      targetsReady: '1/1',
      targets: [
        {
          name: 'nas1',
          ready: true,
          reason: 'Reachable',
          lastTransitionTime: '2026-01-02T03:04:05Z',
          details: { pool: 'default' },
        },
      ],
    },
  };

  it('accepts a well-formed status', () => {
    expect(validateProviderHealth(ph)).toEqual({ ok: true, value: ph });
  });

  it('rejects a namespace, a bad name and an over-long target message', () => {
    const bad = {
      ...ph,
      metadata: { name: 'KVM_home', namespace: 'crawl' },
      status: {
        targets: [
          {
            name: 'nas1',
            ready: false,
            reason: 'Unreachable',
            lastTransitionTime: '2026-01-02T03:04:05Z',
            message: 'x'.repeat(1025),
          },
        ],
      },
    };
    const result = validateProviderHealth(bad);
    expect(result.ok ? [] : result.errors.map((e) => e.path).sort()).toEqual([
      'metadata.name',
      'metadata.namespace',
      'status.targets[0].message',
    ]);
  });

  it('requires when each target last changed, naming the field', () => {
    const { lastTransitionTime: _dropped, ...target } = ph.status.targets[0]!;
    const result = validateProviderHealth({ ...ph, status: { ...ph.status, targets: [target] } });
    expect(result.ok).toBe(false);
    expect(result.ok ? [] : result.errors.map((e) => e.path)).toEqual([
      'status.targets[0].lastTransitionTime',
    ]);
  });
});
