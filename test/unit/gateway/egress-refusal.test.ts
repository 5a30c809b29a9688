/**
 * test/unit/gateway/egress-refusal — a gateway in this process refuses what its egress policy
 * denies with the rule that refused and `gateway.egressPolicy` as the field that would open it:
 * as `X-Egress-Policy` (what curl -v shows of a refused CONNECT), in the 403 body and in a debug
 * log line, for every rule kind over CONNECT and plain HTTP. No upstream is ever asked.
 */
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { operatorPorts } from '../../../src/cmd/modes.ts';
import { Gateway } from '../../../src/gateway/server.ts';
import { gatewayEgressGuard } from '../../../src/gateway/service.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { EGRESS_REFUSAL } from '../../../src/provider/local/egress.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { captureLog } from '../../support/log.ts';
import { OWN_PORT, REFUSAL_POLICY, rawAnswer, refusalCases } from '../../support/refusals.ts';

const TOKEN = 'gw-refusal-token';
const AUTH = `Basic ${Buffer.from(`crawler:${TOKEN}`).toString('base64')}`;

describe('gateway: egress refusals name their rule', () => {
  const captured = captureLog('debug');
  let leases: LeaseStore;
  let gateway: Gateway;

  beforeAll(async () => {
    leases = new LeaseStore({ clock: systemClock });
    gateway = new Gateway({
      bind: { host: '127.0.0.1', port: 0 },
      token: TOKEN,
      chooser: new LeaseStoreChooser(leases, systemClock),
      egress: gatewayEgressGuard({
        egressPolicy: REFUSAL_POLICY,
        operatorPorts: operatorPorts({
          discoveryBindAddress: `127.0.0.1:${OWN_PORT}`,
          metricsBindAddress: '0',
          healthProbeBindAddress: '0',
        }),
      }),
      clock: systemClock,
      log: captured.log,
      registry: new Registry(),
      tracer: trace.getTracer('test'),
      limits: { upstreamTimeoutMs: 3000 },
    });
    await gateway.listen();
  });
  afterAll(async () => {
    await gateway?.close();
    leases?.close();
    expect(captured.raw.join('')).not.toContain(TOKEN);
  });

  for (const c of refusalCases('gateway.egressPolicy')) {
    it(c.name, async () => {
      const answer = await rawAnswer(gateway.port, c.requestLine, c.host, AUTH);
      expect(answer.status).toBe(403);
      expect(answer.headers['x-egress-policy']).toBe(c.rule);
      expect(answer.body).toBe(`${EGRESS_REFUSAL}: ${c.rule}\n`);
      expect(captured.lines).toContainEqual(
        expect.objectContaining({ level: 20, msg: 'egress denied by rule', reason: c.reason, rule: c.rule }),
      );
    });
  }
});
