/**
 * test/unit/cmd/operator-endpoints — what the operator tells its Squid proxies to keep closed:
 * its listener ports, on every non-loopback address of this process (interfaces, then the
 * downward API's POD_IP/POD_IPS), canonical, sorted and without duplicates.
 */
import type { NetworkInterfaceInfo } from 'node:os';
import { describe, expect, it } from 'vitest';
import { operatorEndpoints } from '../../../src/cmd/modes.ts';

const flags = {
  discoveryBindAddress: ':8090',
  metricsBindAddress: '127.0.0.1:8080',
  healthProbeBindAddress: ':8081',
};

function nic(address: string, internal = false): NetworkInterfaceInfo {
  const v6 = address.includes(':');
  return {
    address,
    netmask: v6 ? 'ffff:ffff:ffff:ffff::' : '255.255.255.0',
    family: v6 ? 'IPv6' : 'IPv4',
    mac: '00:00:00:00:00:00',
    internal,
    cidr: null,
    ...(v6 ? { scopeid: 0 } : {}),
  } as NetworkInterfaceInfo;
}

describe('operatorEndpoints', () => {
  it('every non-loopback interface address and the Pod IPs, with the listener ports and the probe port', () => {
    const got = operatorEndpoints(
      { ...flags, gateway: { bindAddress: ':3129' } } as Parameters<typeof operatorEndpoints>[0],
      { POD_IP: '10.244.1.7', POD_IPS: '10.244.1.7, fd00:10:244::7' },
      {
        lo: [nic('127.0.0.1', true), nic('::1', true)],
        eth0: [nic('10.244.1.7'), nic('fe80::1%eth0'), nic('FD00:10:244:0::7')],
      },
    );
    expect(got).toEqual({
      addresses: ['10.244.1.7', 'fd00:10:244::7', 'fe80::1'],
      ports: [3129, 8080, 8081, 8090],
      probePort: 8090,
    });
  });

  it('no address known: nothing for Squid to render; ephemeral ports are not listed', () => {
    const got = operatorEndpoints(
      { ...flags, discoveryBindAddress: ':0' },
      { POD_IP: '' },
      { lo: [nic('127.0.0.1', true)] },
    );
    expect(got).toEqual({ addresses: [], ports: [8080, 8081] });
  });
});
