import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { redactSecrets, serializeError } from '../../../src/log/errors.ts';
import { createLogger } from '../../../src/log/index.ts';
import { ProviderError } from '../../../src/provider/errors.ts';

function capture() {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      lines.push(chunk.toString());
      cb();
    },
  });
  return { log: createLogger({ pretty: false, destination }), lines };
}

describe('logging errors', () => {
  it('an SDK error logged as { err } keeps its message and loses its request config and headers', () => {
    const { log, lines } = capture();
    const sdkError = Object.assign(new Error('request to http://admin:hunter2@10.0.0.1:8080/x failed'), {
      code: 'ECONNRESET',
      config: { headers: { Authorization: 'Bearer sk-live-123' }, data: 'user-data: #cloud-config' },
      response: { body: 'password=hunter2' },
    });
    log.warn({ err: sdkError }, 'call failed');
    const out = lines.join('');
    expect(out).toContain('ECONNRESET');
    expect(out).toContain('request to http://[redacted]@10.0.0.1:8080/x failed');
    for (const secret of ['hunter2', 'sk-live-123', 'cloud-config', 'admin'])
      expect(out).not.toContain(secret);
  });

  it('keeps the classification of our own errors and follows causes', () => {
    const cause = new Error('socket hang up; Authorization: Basic dXNlcjpwYXNz');
    const err = new ProviderError('Transient', 'gcp insert px-1: unavailable', { cause });
    expect(serializeError(err)).toEqual({
      type: 'TransientError',
      message: 'gcp insert px-1: unavailable',
      errorClass: 'Transient',
      cause: { type: 'Error', message: 'socket hang up; Authorization: [redacted]' },
    });
  });

  it('redacts userinfo, bearer tokens and secret parameters in any text, and nothing else', () => {
    expect(redactSecrets('GET https://u:p@host/path?token=abc&page=2')).toBe(
      'GET https://[redacted]@host/path?token=[redacted]&page=2',
    );
    expect(redactSecrets('got Bearer eyJhbGciOi.x.y back')).toBe('got Bearer [redacted] back');
    expect(redactSecrets('proxy 10.1.2.3:3128 answered 407')).toBe('proxy 10.1.2.3:3128 answered 407');
    expect(serializeError('plain string with password=x')).toBe('plain string with password=[redacted]');
  });
});
