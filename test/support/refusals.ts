/**
 * test/support/refusals — the egress refusals every proxy we run in-process must explain, one
 * table shared by the local-proxy and gateway tests (the same explanation function serves both),
 * and a raw client that reads a whole answer, headers and body, of a CONNECT or a plain request.
 */
import { once } from 'node:events';
import net from 'node:net';

export interface Answer {
  status: number;
  /** Lower-cased names. */
  headers: Record<string, string>;
  body: string;
}

/** Sends one request head (`CONNECT h:p HTTP/1.1` or `GET http://… HTTP/1.1`) and reads to close. */
export async function rawAnswer(
  port: number,
  requestLine: string,
  host: string,
  auth: string,
): Promise<Answer> {
  const s = net.connect({ host: '127.0.0.1', port });
  await once(s, 'connect');
  s.write(`${requestLine}\r\nHost: ${host}\r\nProxy-Authorization: ${auth}\r\n\r\n`);
  let buf = '';
  s.on('data', (d: Buffer) => {
    buf += d.toString('latin1');
  });
  await once(s, 'close');
  const [head = '', body = ''] = [
    buf.slice(0, buf.indexOf('\r\n\r\n')),
    buf.slice(buf.indexOf('\r\n\r\n') + 4),
  ];
  const [statusLine = '', ...lines] = head.split('\r\n');
  const headers: Record<string, string> = {};
  for (const l of lines) {
    const colon = l.indexOf(':');
    headers[l.slice(0, colon).toLowerCase()] = l.slice(colon + 1).trim();
  }
  return {
    status: Number(statusLine.split(' ')[1]),
    headers,
    body: headers['transfer-encoding'] === 'chunked' ? unchunk(body) : body,
  };
}

function unchunk(text: string): string {
  let out = '';
  let rest = text;
  for (;;) {
    const eol = rest.indexOf('\r\n');
    const size = Number.parseInt(rest.slice(0, eol), 16);
    if (!(size > 0)) return out;
    out += rest.slice(eol + 2, eol + 2 + size);
    rest = rest.slice(eol + 2 + size + 2);
  }
}

export interface RefusalCase {
  name: string;
  /** `CONNECT …` or `GET http://…` */
  requestLine: string;
  host: string;
  /** The explanation, exactly. */
  rule: string;
  /** The `reason` of the log line. */
  reason: 'address' | 'port' | 'operator-port';
}

/** The operator's discovery API port in these worlds; never connected to. */
export const OWN_PORT = 8090;

/** One policy under which every case below is refused by its own rule. */
export const REFUSAL_POLICY = {
  allowCIDRs: ['127.0.0.0/8'],
  denyCIDRs: ['203.0.113.0/24'],
  connectPorts: [443, OWN_PORT],
};

/** Every rule kind, over CONNECT and plain HTTP, for a proxy applying REFUSAL_POLICY as `field`. */
export function refusalCases(field: string): RefusalCase[] {
  const allow = `to allow it, add a range covering 10.0.0.5 to ${field}.allowCIDRs`;
  const own = `port ${OWN_PORT} on this host is the operator's discovery API (--discovery-bind-address); no egress setting opens the operator's own listeners; only GET or HEAD /generate_204 passes there`;
  const both = (
    name: string,
    authority: string,
    url: string,
    rule: string,
    reason: RefusalCase['reason'],
  ) => [
    {
      name: `${name} (CONNECT)`,
      requestLine: `CONNECT ${authority} HTTP/1.1`,
      host: authority,
      rule,
      reason,
    },
    { name: `${name} (http)`, requestLine: `GET ${url} HTTP/1.1`, host: new URL(url).host, rule, reason },
  ];
  return [
    ...both(
      'default range',
      '10.0.0.5:443',
      'http://10.0.0.5/',
      `10.0.0.5 is in 10.0.0.0/8 (private), denied by default; ${allow}`,
      'address',
    ),
    ...both(
      'denyCIDRs',
      '203.0.113.7:443',
      'http://203.0.113.7/',
      `203.0.113.7 is in 203.0.113.0/24 (denyCIDRs); to allow it, remove 203.0.113.0/24 from ${field}.denyCIDRs`,
      'address',
    ),
    ...both(
      'NAT64 image',
      '[64:ff9b::a00:5]:443',
      'http://[64:ff9b::a00:5]/',
      `64:ff9b::a00:5 embeds 10.0.0.5 (NAT64), which is in 10.0.0.0/8 (private), denied by default; ${allow}`,
      'address',
    ),
    ...both(
      '6to4 image',
      '[2002:a00:5::1]:443',
      'http://[2002:a00:5::1]/',
      `2002:a00:5::1 embeds 10.0.0.5 (6to4), which is in 10.0.0.0/8 (private), denied by default; ${allow}`,
      'address',
    ),
    ...both(
      'operator port',
      `127.0.0.1:${OWN_PORT}`,
      `http://127.0.0.1:${OWN_PORT}/v1/proxies`,
      own,
      'operator-port',
    ),
    {
      name: 'port (CONNECT)',
      requestLine: 'CONNECT 198.51.100.1:8443 HTTP/1.1',
      host: '198.51.100.1:8443',
      rule: `port 8443 is not in connectPorts (443, ${OWN_PORT}); to allow it, add it to ${field}.connectPorts`,
      reason: 'port',
    },
    {
      name: 'port (http)',
      requestLine: 'GET http://198.51.100.1:8080/ HTTP/1.1',
      host: '198.51.100.1:8080',
      rule: `port 8080 is not one plain http:// may use (80 and connectPorts: 443, ${OWN_PORT}); to allow it, add it to ${field}.connectPorts`,
      reason: 'port',
    },
  ];
}
