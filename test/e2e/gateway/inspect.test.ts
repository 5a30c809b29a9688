/**
 * HTTPS inspection end to end: the real `standalone` CLI with `--gateway-inspect`, a local fleet
 * of 12 proxies each leaving from its own loopback address, and loopback TLS sites
 * (support/gateway/sites.ts) that refuse a page the first time it is asked — 403, 429 with
 * Retry-After, or a 200 captcha page that only a body rule recognises. Real clients trust the
 * operator's CA as docs/gateway.md says (support/gateway/inspect-clients.ts). A Scrapy crawl
 * through the gateway alone — no client retries, no reports to the API — gets every page, and
 * the sites' logs show the refusals spread per site over several egress addresses; curl,
 * requests, Node and Chromium get every page too. A host in --gateway-inspect-exclude and the
 * user-name option `inspect-off` are tunnelled untouched (the client sees the origin's own
 * certificate). Chromium's WebSockets work through it, `wss://` switched inside the inspected
 * connection and `ws://` (a CONNECT that does not open TLS) tunnelled. A rule in `mode: observe` lets the refusal through to the client and counts it;
 * without `gateway.rules` the defaults block and retry a 403 and rate-limit and retry a 429.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it, onTestFailed, vi } from 'vitest';
import {
  CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  freePort,
  standaloneArgs,
  type Workspace,
  waitForReady,
} from '../../support/cli.ts';
import {
  type Answer,
  CLIENTS,
  chromiumWebSockets,
  curlFetch,
  fetchWith,
} from '../../support/gateway/inspect-clients.ts';
import {
  CAPTCHA_TEXT,
  PAGE_MARK,
  refusedPages,
  type Sites,
  startSites,
} from '../../support/gateway/sites.ts';
import { requirePython } from '../../support/python.ts';

vi.setConfig({ testTimeout: 180_000, hookTimeout: 120_000 });

const TOKEN = 'inspect-test-token';
const PROXIES = 12;
/** The proxies' egress addresses; the sites are on 127.0.0.31-35, inside the same /26. */
const EGRESS = Array.from({ length: PROXIES }, (_, i) => `127.0.0.${40 + i}`);
const LOOPBACK_SITES = '127.0.0.0/26';
const EXCLUDED = '127.0.0.35';

const ENFORCE_RULES = `
  rules:
    - {name: forbidden, status: [403], actions: [block, retry]}
    - {name: too-many, status: [429], actions: [rateLimit, retry], rateLimit: {minSeconds: 1, maxSeconds: 5}}
    - {name: captcha, hosts: ["127.0.0.33"], body: "verify you are a human", actions: [block, retry]}
`;

interface Operator {
  ws: Workspace;
  proc: CliProcess;
  /** `http://<user>:TOKEN@127.0.0.1:<gateway port>` */
  url(user?: string): string;
  /** The CA file the clients trust, as served at GET /v1/gateway/ca.pem. */
  caFile: string;
  metrics(): Promise<string>;
}

async function startOperator(sites: Sites, rules: string): Promise<Operator> {
  const ws = await createWorkspace({ openPorts: sites.ports });
  const providers = readFileSync(ws.providersFile, 'utf8')
    .replace(/^(\s+egressPolicy: \{allowCIDRs: )\["127\.0\.0\.1\/32"\]/m, `$1["${LOOPBACK_SITES}"]`)
    .replace(/egressAddresses: \[[^\]]*\]/, `egressAddresses: [${EGRESS.join(', ')}]`);
  writeFileSync(
    ws.providersFile,
    `${providers}\ngateway:\n  egressPolicy: {allowCIDRs: ["${LOOPBACK_SITES}"], connectPorts: [${sites.ports.join(', ')}]}\n${rules}`,
  );
  const names = Array.from({ length: PROXIES }, (_, i) => `local-${i + 1}`);
  const template = readFileSync(join(ws.proxiesDir, 'local-1.yaml'), 'utf8');
  for (const name of names.slice(3)) {
    writeFileSync(join(ws.proxiesDir, `${name}.yaml`), template.replace('name: local-1', `name: ${name}`));
  }
  const [gatewayPort, metricsPort] = [await freePort(), await freePort()];
  const proc = new CliProcess(
    standaloneArgs(ws, [
      '--gateway-bind-address',
      `127.0.0.1:${gatewayPort}`,
      '--metrics-bind-address',
      `127.0.0.1:${metricsPort}`,
      '--gateway-inspect',
      '--gateway-inspect-exclude',
      EXCLUDED,
      '--gateway-origin-ca',
      sites.originCaFile,
    ]),
    ws.dir,
    { env: { GATEWAY_TOKEN: TOKEN } },
  );
  await waitForReady(ws, proc, names, 90_000);
  const res = await fetch(`${ws.discoveryUrl}/v1/gateway/ca.pem`);
  expect(res.status).toBe(200);
  const pem = await res.text();
  expect(pem).toMatch(/^-----BEGIN CERTIFICATE-----\n[\s\S]+-----END CERTIFICATE-----\n?$/);
  expect(pem).not.toContain('PRIVATE KEY');
  // Standalone keeps the same certificate in the state directory.
  expect(readFileSync(join(ws.dir, 'gateway-ca', 'ca.pem'), 'utf8')).toBe(pem);
  const caFile = join(ws.dir, 'client-ca.pem');
  writeFileSync(caFile, pem);
  return {
    ws,
    proc,
    url: (user = 'crawler') => `http://${user}:${TOKEN}@127.0.0.1:${gatewayPort}`,
    caFile,
    metrics: async () => (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text(),
  };
}

/** On a failure: what the operator refused or matched, to tell whose side it was on. */
function dumpOnFailure(op: () => Operator | undefined): void {
  beforeEach(() => {
    onTestFailed(() => {
      const logs = op()?.proc.logs.filter((l) =>
        /denied|refus|rule|inspect|certificate/i.test(String(l.msg)),
      );
      console.error(JSON.stringify(logs?.slice(0, 20), null, 1));
    });
  });
}

/** Every URL answered once, 200, with the page itself (not a refusal, not the captcha). */
function expectEveryPage(answers: Answer[], urls: string[]): void {
  expect(answers.map((a) => a.url).sort()).toEqual([...urls].sort());
  for (const a of answers) {
    expect(a.error, a.url).toBeUndefined();
    expect(a.status, a.url).toBe(200);
    expect(a.body, a.url).toContain(PAGE_MARK);
    expect(a.body, a.url).not.toContain(CAPTCHA_TEXT);
  }
}

/** Refusals a site logged for the pages under `prefix`: the source addresses, in order. */
function refusalsUnder(sites: Sites, site: string, prefix: string): string[] {
  return sites.log
    .filter((e) => e.site === site && e.refused && e.path.startsWith(`/${prefix}/`))
    .map((e) => e.source);
}

const REFUSING = ['forbid', 'ratelimit', 'captcha'] as const;

describe('the inspecting gateway, enforcing rules', () => {
  let sites: Sites;
  let op: Operator;
  beforeAll(async () => {
    requirePython(['scrapy', 'requests']);
    sites = await startSites();
    op = await startOperator(sites, ENFORCE_RULES);
  });
  dumpOnFailure(() => op);
  afterAll(async () => {
    await cleanupCli();
    await sites?.close();
  });

  it('Scrapy alone, no retries or reports of its own: every page, refusals spread per site over egress addresses', async () => {
    const PAGES = 12;
    const urls = [...REFUSING, 'plain'].flatMap((s) => sites.byName(s).pages(PAGES, 'scrapy'));
    const answers = await fetchWith('scrapy', op.url(), op.caFile, urls);
    expectEveryPage(answers, urls);
    for (const site of REFUSING) {
      const refused = refusalsUnder(sites, site, 'scrapy');
      // Each refused page was refused once, then answered from another upstream.
      expect(refused, site).toHaveLength(refusedPages(PAGES));
      expect(
        refused.every((a) => EGRESS.includes(a)),
        site,
      ).toBe(true);
      // Blocks are per site: the refusals went out through more than one egress address.
      expect(new Set(refused).size, `${site}: ${refused.join(' ')}`).toBeGreaterThan(1);
    }
    // The blocks are per site: the upstreams a 403 came through cool down for that site only.
    const client = clientFor(op.ws);
    const forbidden = new Set(refusalsUnder(sites, 'forbid', 'scrapy'));
    const forForbid = await client.listProxies({ target: sites.byName('forbid').address });
    const cooling = forForbid.filter((p) => p.reason === 'CoolingDownForTarget').map((p) => p.egressIP);
    expect(new Set(cooling)).toEqual(forbidden);
    const forPlain = await client.listProxies({ target: sites.byName('plain').address });
    expect(forPlain.filter((p) => p.reason === 'CoolingDownForTarget')).toEqual([]);
    const metrics = await op.metrics();
    for (const [rule, action] of [
      ['forbidden', 'block'],
      ['too-many', 'rateLimit'],
      ['captcha', 'block'],
    ]) {
      expect(metrics).toMatch(
        new RegExp(
          `proxy_operator_gateway_rule_matches_total\\{[^}]*rule="${rule}"[^}]*action="${action}"[^}]*\\} [1-9]`,
        ),
      );
    }
  });

  for (const client of CLIENTS.filter((c) => c !== 'scrapy')) {
    it(`${client}: trusting the operator CA, every page of every site, refusals hidden`, async () => {
      const urls = [...REFUSING, 'plain'].flatMap((s) => sites.byName(s).pages(4, client));
      const answers = await fetchWith(client, op.url(), op.caFile, urls);
      expectEveryPage(answers, urls);
      for (const site of REFUSING)
        expect(refusalsUnder(sites, site, client), site).toHaveLength(refusedPages(4));
    });
  }

  it('curl: an inspected site shows the operator CA’s certificate, not the origin’s', async () => {
    const [url] = sites.byName('plain').pages(1, 'cert-inspected');
    const own = await curlFetch(op.url(), sites.originCaFile, [url as string]);
    expect(own[0]?.status, JSON.stringify(own)).toBeUndefined();
    expect(own[0]?.error).toMatch(/certificate|issuer|SSL/i);
  });

  it('an excluded host is tunnelled untouched: the client sees the origin’s own certificate', async () => {
    const [url] = sites.byName('excluded').pages(1, 'cert-excluded');
    const own = await curlFetch(op.url(), sites.originCaFile, [url as string]);
    expect(own[0]?.status, JSON.stringify(own)).toBe(200);
    const ours = await curlFetch(op.url(), op.caFile, [url as string]);
    expect(ours[0]?.status, JSON.stringify(ours)).toBeUndefined();
  });

  it('Chromium opens WebSockets through it: wss:// switched inside the inspected connection, ws:// tunnelled', async () => {
    const plain = sites.byName('plain');
    const urls = [plain.wsUrl, sites.plainWsUrl];
    const page = sites.plainWsUrl.replace(/^ws:/, 'http:').replace(/\/ws$/, '/');
    const answers = await chromiumWebSockets(op.url(), op.caFile, page, urls, 'ping through the gateway');
    expect(answers).toEqual(urls.map((url) => ({ url, body: 'ping through the gateway' })));
    // Both left through the fleet's egress addresses, not from the gateway itself.
    const opened = sites.log.filter((e) => e.status === 101);
    expect(opened.map((e) => e.site).sort()).toEqual(['plain', 'plain-ws']);
    for (const e of opened) expect(EGRESS, e.site).toContain(e.source);
  });

  it('the user-name option inspect-off tunnels untouched', async () => {
    const [url] = sites.byName('plain').pages(1, 'cert-inspect-off');
    const own = await curlFetch(op.url('crawler-inspect-off'), sites.originCaFile, [url as string]);
    expect(own[0]?.status, JSON.stringify(own)).toBe(200);
  });
});

describe('the inspecting gateway, a rule in observe mode', () => {
  let sites: Sites;
  let op: Operator;
  beforeAll(async () => {
    sites = await startSites();
    op = await startOperator(
      sites,
      `  rules:\n    - {name: watch-forbidden, status: [403], actions: [block, retry], mode: observe}\n`,
    );
  });
  dumpOnFailure(() => op);
  afterAll(async () => {
    await cleanupCli();
    await sites?.close();
  });

  it('answers the refusal to the client and counts the match without acting', async () => {
    const urls = sites.byName('forbid').pages(2, 'observe'); // page 1 is refused once
    const answers = await curlFetch(op.url(), op.caFile, urls);
    expect(answers.map((a) => a.status)).toEqual([200, 403]);
    // Not retried: the origin saw page 1 once.
    expect(sites.log.filter((e) => e.path === '/observe/p/1')).toHaveLength(1);
    expect(await op.metrics()).toMatch(
      /proxy_operator_gateway_rule_matches_total\{[^}]*rule="watch-forbidden"[^}]*mode="observe"[^}]*\} 1\b/,
    );
  });
});

describe('the inspecting gateway, no rules configured', () => {
  let sites: Sites;
  let op: Operator;
  beforeAll(async () => {
    sites = await startSites();
    op = await startOperator(sites, '');
  });
  afterAll(async () => {
    await cleanupCli();
    await sites?.close();
  });
  dumpOnFailure(() => op);

  it('the defaults block and retry a 403, rate-limit and retry a 429', async () => {
    const urls = ['forbid', 'ratelimit'].flatMap((s) => sites.byName(s).pages(6, 'defaults'));
    expectEveryPage(await curlFetch(op.url(), op.caFile, urls), urls);
    for (const site of ['forbid', 'ratelimit']) {
      expect(refusalsUnder(sites, site, 'defaults'), site).toHaveLength(refusedPages(6));
    }
    const metrics = await op.metrics();
    for (const [rule, action] of [
      ['blocked', 'block'],
      ['rate-limited', 'rateLimit'],
    ]) {
      expect(metrics).toMatch(
        new RegExp(
          `proxy_operator_gateway_rule_matches_total\\{[^}]*rule="${rule}"[^}]*action="${action}"[^}]*\\} ${refusedPages(6)}\\b`,
        ),
      );
    }
  });
});
