/**
 * Cluster mode without DISCOVERY_TOKEN: the discovery API's DNS-rebinding guard serves a request
 * whose Host is one of the Pod's own IPs (POD_IP, POD_IPS from the downward API), the address
 * the other replicas reach the leader at for the gateway's sync, as it serves loopback and
 * --discovery-allowed-hosts names; any other Host is still refused with 403. The requests go to
 * 127.0.0.1 and only say another Host, as a standby's request to the leader's Pod IP would.
 */
import http from 'node:http';
import { describe, expect, it } from 'vitest';
import { discoveryPortOf, startOperator, useOperatorEnv } from '../../support/operator-env.ts';

useOperatorEnv();

/** GET `path` from 127.0.0.1:`port` with `host` as the Host header: the status. */
function statusWithHost(port: number, path: string, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, headers: { Host: host } }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.once('error', reject);
  });
}

describe('the discovery API without a token, in a cluster', () => {
  it('serves a Host naming one of the Pod’s own IPs, and still refuses any other', async () => {
    const op = await startOperator({
      name: 'pod-ip',
      env: { POD_IP: '10.20.30.40', POD_IPS: '10.20.30.40,fd00:20::40' },
    });
    const port = discoveryPortOf(op);
    expect(await statusWithHost(port, '/v1/proxies', `10.20.30.40:${port}`)).toBe(200);
    expect(await statusWithHost(port, '/v1/proxies', `[fd00:20::40]:${port}`)).toBe(200);
    expect(await statusWithHost(port, '/v1/proxies', `10.20.30.41:${port}`)).toBe(403);
    expect(await statusWithHost(port, '/v1/proxies', `rebound.example:${port}`)).toBe(403);
    expect(await statusWithHost(port, '/v1/proxies', `127.0.0.1:${port}`)).toBe(200);
  }, 60_000);
});
