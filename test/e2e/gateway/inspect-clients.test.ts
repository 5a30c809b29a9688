/**
 * The client side of HTTPS inspection, against mitmproxy (mitmdump from its private venv): curl,
 * Debian's python3-requests and python3-scrapy, and headless Chromium (playwright-core), each
 * trusting the inspecting proxy's CA exactly as docs/gateway.md ("Trusting the gateway's CA")
 * says, fetch loopback TLS sites through it; the same client trusting another CA is refused, so
 * every recipe really verifies. The recipes in the docs are the fixtures these clients run.
 * The gateway's own inspection is tested with the same clients in inspect.test.ts.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../../support/cli.ts';
import { CLIENTS, fetchWith, INSPECT_FIXTURES } from '../../support/gateway/inspect-clients.ts';
import { type Mitmproxy, startMitmproxy } from '../../support/gateway/mitmproxy.ts';
import { PAGE_MARK, type Sites, startSites } from '../../support/gateway/sites.ts';
import { requirePython } from '../../support/python.ts';

let sites: Sites;
let mitm: Mitmproxy;
beforeAll(async () => {
  requirePython(['scrapy', 'requests']);
  sites = await startSites();
  mitm = await startMitmproxy({ originCaFile: sites.originCaFile });
}, 60_000);
afterAll(async () => {
  await mitm?.close();
  await sites?.close();
});

describe('clients trusting an inspecting proxy’s CA (mitmproxy)', () => {
  for (const client of CLIENTS) {
    it(`${client}: fetches through the proxy trusting its CA, and is refused trusting another`, async () => {
      const urls = sites.byName('plain').pages(3, `mitm-${client}`);
      const got = await fetchWith(client, mitm.url, mitm.caFile, urls);
      expect(got.map((a) => a.url).sort()).toEqual([...urls].sort());
      for (const a of got) {
        expect(a.error, a.url).toBeUndefined();
        expect(a.status).toBe(200);
        expect(a.body).toContain(PAGE_MARK);
      }
      // The origin's own CA does not identify the proxy's certificates: no page, an error.
      const wrong = await fetchWith(client, mitm.url, sites.originCaFile, urls.slice(0, 1));
      expect(wrong).toHaveLength(1);
      expect(wrong[0]?.status, JSON.stringify(wrong)).toBeUndefined();
      expect(wrong[0]?.error).toBeTruthy();
    }, 90_000);
  }
});

describe('docs/gateway.md', () => {
  it('shows the trust recipes these clients run, verbatim', () => {
    const doc = readFileSync(join(REPO_ROOT, 'docs/gateway.md'), 'utf8');
    const factory = readFileSync(join(INSPECT_FIXTURES, 'trust_ca.py'), 'utf8');
    const body = factory.slice(factory.indexOf('from twisted'));
    expect(doc).toContain(body.trim());
    expect(doc).toContain('"DOWNLOADER_CLIENTCONTEXTFACTORY": "trust_ca.GatewayCAContextFactory"');
    expect(doc).toContain('session.get(url, verify=ca_file, timeout=30)');
    expect(doc).toContain("certutil -d sql:$HOME/.pki/nssdb -A -t 'C,,' -n egress-gateway-ca -i ca.pem");
    expect(doc).toContain('curl --cacert ca.pem');
    expect(doc).toContain('NODE_USE_ENV_PROXY=1 HTTPS_PROXY="$GATEWAY" NODE_EXTRA_CA_CERTS=ca.pem');
  });
});
