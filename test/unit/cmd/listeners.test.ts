/**
 * test/unit/cmd/listeners — the operator's listeners named by their flags: a listen failure
 * (also wrapped by the manager) becomes one line with the address and the flag to change; the
 * health-check placeholder `operator.invalid` follows the discovery bind address; `status`
 * takes `--discovery-url` as another name for `--server`.
 */
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { FlagError, parseCommandLine } from '../../../src/cmd/flags.ts';
import { listenFailureOf, operatorProbeAddress } from '../../../src/cmd/listeners.ts';
import { operatorPorts } from '../../../src/cmd/modes.ts';
import { withOperatorAddress } from '../../../src/health/policy.ts';

const flags = {
  discoveryBindAddress: '127.0.0.1:8090',
  metricsBindAddress: ':9100',
  healthProbeBindAddress: '127.0.0.1:8081',
  gateway: { bindAddress: '127.0.0.1:8888' },
};

/** The error Node gives for listening on a port that is already taken. */
async function realListenError(): Promise<NodeJS.ErrnoException> {
  const first = createServer();
  await new Promise<void>((r) => first.listen(0, '127.0.0.1', r));
  const port = (first.address() as { port: number }).port;
  const second = createServer();
  const err = await new Promise<NodeJS.ErrnoException>((r) => {
    second.once('error', r);
    second.listen(port, '127.0.0.1');
  });
  first.close();
  return err;
}

function listenError(code: string, address: string, port: number): NodeJS.ErrnoException {
  return Object.assign(new Error(`listen ${code}: ${address}:${port}`), {
    code,
    syscall: 'listen',
    address,
    port,
  });
}

describe('listen failures', () => {
  it('name the address and the flag of the listener on that port', () => {
    expect(listenFailureOf(listenError('EADDRINUSE', '127.0.0.1', 8081), flags)?.message).toBe(
      'health probe endpoint cannot listen: 127.0.0.1:8081 is already in use (another copy of the operator, or another program?); choose another address with --health-probe-bind-address',
    );
    expect(listenFailureOf(listenError('EACCES', '::', 9100), flags)?.message).toBe(
      'metrics endpoint cannot listen: [::]:9100 is not permitted (a port below 1024 needs privileges); choose another address with --metrics-bind-address',
    );
  });

  it('look through the manager wrapping a runnable failure', () => {
    const wrapped = new Error('runnable gateway failed: listen EADDRINUSE', {
      cause: listenError('EADDRINUSE', '127.0.0.1', 8888),
    });
    expect(listenFailureOf(wrapped, flags)?.message).toMatch(
      /^gateway cannot listen: 127\.0\.0\.1:8888 is already in use .*choose another address with --gateway-bind-address$/,
    );
    const discovery = new Error('runnable discovery failed', {
      cause: listenError('EADDRNOTAVAIL', '10.9.9.9', 8090),
    });
    expect(listenFailureOf(discovery, flags)?.message).toContain(
      '10.9.9.9:8090 is not an address of this machine; choose another address with --discovery-bind-address',
    );
  });

  it('read the port from a real Node listen error', async () => {
    const err = await realListenError();
    const f = { ...flags, discoveryBindAddress: `127.0.0.1:${(err as { port?: number }).port}` };
    expect(listenFailureOf(err, f)?.message).toContain('--discovery-bind-address');
  });

  it('name both flags when two listeners were given one port, and ignore errors of others', () => {
    const same = { ...flags, metricsBindAddress: '127.0.0.1:8090' };
    expect(listenFailureOf(listenError('EADDRINUSE', '127.0.0.1', 8090), same)?.message).toContain(
      '--discovery-bind-address and --metrics-bind-address name the same port: change one of them',
    );
    expect(listenFailureOf(listenError('EADDRINUSE', '127.0.0.1', 1234), flags)).toBeUndefined();
    expect(listenFailureOf(new Error('something else'), flags)).toBeUndefined();
  });
});

describe('the operator.invalid health-check placeholder', () => {
  it('points at the discovery bind address, loopback or the Pod IP on a wildcard', () => {
    expect(operatorProbeAddress('127.0.0.1:9090', {})).toBe('127.0.0.1:9090');
    expect(operatorProbeAddress(':8090', {})).toBe('127.0.0.1:8090');
    expect(operatorProbeAddress(':8090', { POD_IP: '10.1.2.3' })).toBe('10.1.2.3:8090');
    expect(operatorProbeAddress('[::]:8090', {})).toBe('[::1]:8090');
    expect(operatorProbeAddress('[::1]:8090', {})).toBe('[::1]:8090');
    expect(operatorProbeAddress('0', {})).toBeUndefined();
    expect(operatorProbeAddress('127.0.0.1:0', {})).toBeUndefined();
  });

  it('replaces only the placeholder host, keeping scheme and path', () => {
    expect(withOperatorAddress('http://operator.invalid/generate_204', '127.0.0.1:9090')).toBe(
      'http://127.0.0.1:9090/generate_204',
    );
    expect(withOperatorAddress('http://OPERATOR.invalid:1/generate_204?x=1', '[::1]:8090')).toBe(
      'http://[::1]:8090/generate_204?x=1',
    );
    expect(withOperatorAddress('https://www.gstatic.com/generate_204', '127.0.0.1:9090')).toBe(
      'https://www.gstatic.com/generate_204',
    );
    expect(withOperatorAddress('http://operator.invalid/generate_204', undefined)).toBe(
      'http://operator.invalid/generate_204',
    );
  });
});

describe('own ports named for refusals', () => {
  it('names each listener with its flag', () => {
    expect(operatorPorts(flags as Parameters<typeof operatorPorts>[0]).names).toEqual({
      8090: 'discovery API (--discovery-bind-address)',
      9100: 'metrics endpoint (--metrics-bind-address)',
      8081: 'health probe endpoint (--health-probe-bind-address)',
      8888: 'gateway (--gateway-bind-address)',
    });
  });
});

describe('status --discovery-url', () => {
  it('is another name for --server; both at once are refused', () => {
    const p = parseCommandLine(['status', '--discovery-url', 'http://127.0.0.1:9090']);
    expect(p.command === 'status' && p.flags.server).toBe('http://127.0.0.1:9090');
    expect(() => parseCommandLine(['status', '--discovery-url', 'x', '--server', 'http://a'])).toThrow(
      FlagError,
    );
    expect(() => parseCommandLine(['status', '--discovery-url', 'ftp://x'])).toThrow(
      '--discovery-url: "ftp://x" must be an http(s) URL',
    );
  });
});
