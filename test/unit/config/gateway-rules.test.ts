/**
 * The providers config's `gateway.rules` (docs/gateway.md, "Rules"): every problem names the
 * rule's field and what to write instead; unknown fields get the nearest known one.
 */
import { describe, expect, it } from 'vitest';
import { validateProvidersConfig } from '../../../src/config/validate.ts';

type Obj = Record<string, unknown>;

function errorsOf(rules: Obj[]): string[] {
  const r = validateProvidersConfig({ providers: [], gateway: { rules } });
  return r.ok ? [] : r.errors.map((e) => e.message);
}

const ok = { name: 'captcha', status: [200], body: '(?i)captcha', actions: ['block', 'retry'] };

describe('gateway.rules', () => {
  it('accepts the documented example and the observe mode', () => {
    expect(
      errorsOf([
        {
          name: 'captcha',
          hosts: ['*.shop.test', '[2001:db8::1]'],
          status: [200],
          header: { name: 'x-blocked', pattern: '^yes$' },
          body: '(?i)captcha',
          timeToFirstByteMs: 10000,
          actions: ['block', 'retry'],
          retries: 2,
          retryUnsafe: false,
          rateLimit: { defaultSeconds: 60, minSeconds: 1, maxSeconds: 3600 },
          mode: 'enforce',
        },
        { name: 'rate-limited', status: [429], actions: ['rateLimit', 'retry'], mode: 'observe' },
      ]),
    ).toEqual([]);
  });

  it('names the field of a bad regular expression, glob, status and name', () => {
    expect(errorsOf([ok, ok, { ...ok, name: 'other', body: '(?i)capt(cha' }])).toEqual([
      'gateway.rules[1].name duplicate rule name "captcha" (also gateway.rules[0])',
      expect.stringMatching(/^gateway\.rules\[2\]\.body invalid regular expression "\(\?i\)capt\(cha": .*/),
    ]);
    expect(
      errorsOf([
        {
          name: 'Bad_Name',
          hosts: ['shop test'],
          status: [99],
          header: { name: 'x blocked', pattern: '[' },
          actions: ['block'],
        },
      ]),
    ).toEqual([
      'gateway.rules[0].name "Bad_Name" is not a rule name: lowercase letters, digits and "-", 1-63 characters',
      'gateway.rules[0].hosts[0] "shop test" is not a host glob: letters, digits, ".", "-", ":" and "*"',
      'gateway.rules[0].status[0] 99 is not an HTTP status (100-599)',
      'gateway.rules[0].header.name "x blocked" is not an HTTP header name',
      expect.stringMatching(/^gateway\.rules\[0\]\.header\.pattern invalid regular expression "\[": /),
    ]);
  });

  it('wants a condition, known actions, and settings that belong to them', () => {
    expect(errorsOf([{ name: 'all', hosts: ['*'], actions: ['block'] }])).toEqual([
      'gateway.rules[0] needs at least one condition: status, header, body or timeToFirstByteMs',
    ]);
    expect(
      errorsOf([
        {
          name: 'x',
          status: [403],
          actions: ['block', 'block'],
          retries: 20,
          rateLimit: { minSeconds: 60, maxSeconds: 10 },
        },
      ]),
    ).toEqual([
      'gateway.rules[0].actions names block twice',
      'gateway.rules[0].retries 20 is out of range: 1-10',
      'gateway.rules[0].rateLimit.minSeconds 60 is above maxSeconds 10',
    ]);
    // Settings of an action the rule does not take are warned about, not refused.
    const r = validateProvidersConfig({
      providers: [],
      gateway: { rules: [{ name: 'x', status: [403], actions: ['block'], retries: 3 }] },
    });
    expect(r.ok).toBe(true);
    expect(r.warnings.map((w) => w.message)).toContain(
      'gateway.rules[0].retries is set but actions has no retry, so it does nothing',
    );
  });

  it('suggests the nearest field or action for a typo', () => {
    const msgs = errorsOf([{ name: 'x', staus: [403], actions: ['retry'] }]);
    expect(msgs.join('\n')).toContain('staus is not a known field; did you mean "status"?');
    const actions = errorsOf([{ name: 'x', status: [403], actions: ['retyr'] }]);
    expect(actions.join('\n')).toMatch(/gateway\.rules\[0\]\.actions\[0\]/);
  });
});
