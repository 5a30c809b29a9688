import { describe, expect, it } from 'vitest';
import {
  classify,
  notFound,
  ProviderError,
  permanent,
  quotaExceeded,
  wrap,
} from '../../../src/provider/errors.ts';

describe('provider error classes', () => {
  it('treats unclassified errors as transient', () => {
    expect(classify(new Error('socket hang up'))).toBe('Transient');
    expect(classify('weird')).toBe('Transient');
  });

  it('finds the class through cause chains and keeps the cause', () => {
    const root = new Error('HTTP 404');
    const wrapped = wrap('NotFound', root, { op: 'get', provider: 'gcp-main', providerID: 'x' });
    const outer = new Error('reconcile failed', { cause: wrapped });
    expect(classify(outer)).toBe('NotFound');
    expect(wrapped.cause).toBe(root);
    expect(wrapped.message).toBe('gcp-main get x: HTTP 404');
    expect(wrapped).toBeInstanceOf(ProviderError);
  });

  it('lets the most severe class win in aggregated errors', () => {
    expect(classify(new AggregateError([notFound('a'), permanent('b')]))).toBe('Permanent');
    expect(classify(new AggregateError([notFound('a'), quotaExceeded('b')]))).toBe('QuotaExceeded');
    expect(classify(new AggregateError([notFound('a'), notFound('b')]))).toBe('NotFound');
  });
});
