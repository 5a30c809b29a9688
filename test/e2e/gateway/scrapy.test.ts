/**
 * The gateway under Debian's python3-scrapy, configured with nothing but the gateway URL in
 * HTTP_PROXY / HTTPS_PROXY (Scrapy's stock HttpProxyMiddleware turns its user name and password
 * into Proxy-Authorization): a crawl of the local TLS and plain origins through the gateway's
 * Squid upstreams succeeds, plain responses name their upstream, and a sticky session in the user
 * name keeps every request of the crawl on one upstream.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PYTHON, run, startWorld, type World } from '../../support/gateway/world.ts';
import { requirePython } from '../../support/python.ts';

const SPIDER = `
import sys, scrapy
from scrapy.crawler import CrawlerProcess
count = int(sys.argv[1])
urls = sys.argv[2:]
class GatewaySpider(scrapy.Spider):
    name = "gateway"
    def start_requests(self):
        for u in urls:
            for _ in range(count):
                yield scrapy.Request(u, dont_filter=True)
    def parse(self, response):
        h = response.headers
        print(response.status, response.url.split(":")[0],
              (h.get("X-Peer") or b"-").decode(), (h.get("X-Egress-Proxy") or b"-").decode(), flush=True)
process = CrawlerProcess({
    "LOG_LEVEL": "ERROR", "ROBOTSTXT_OBEY": False, "RETRY_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False, "HTTPERROR_ALLOW_ALL": True, "CONCURRENT_REQUESTS": 8,
})
process.crawl(GatewaySpider)
process.start()
`;

let w: World;
beforeAll(async () => {
  requirePython(['scrapy']);
  w = await startWorld();
}, 60_000);
afterAll(() => w?.close());

function crawl(user: string, count: number, urls: string[]) {
  const proxy = w.url(user);
  return run(PYTHON, ['-c', SPIDER, String(count), ...urls], {
    HTTP_PROXY: proxy,
    HTTPS_PROXY: proxy,
    http_proxy: proxy,
    https_proxy: proxy,
  });
}

interface Line {
  status: number;
  scheme: string;
  peer: string;
  upstream: string;
}

function lines(stdout: string): Line[] {
  return stdout
    .trim()
    .split('\n')
    .filter((l) => /^\d{3} /.test(l))
    .map((l) => {
      const [status, scheme, peer, upstream] = l.split(' ');
      return { status: Number(status), scheme: scheme ?? '', peer: peer ?? '', upstream: upstream ?? '' };
    });
}

describe('python3-scrapy through the gateway', () => {
  it('crawls TLS and plain origins through the Squid upstreams', async () => {
    const r = await crawl('crawler', 15, [`${w.tls.baseUrl}/`, `${w.http.baseUrl}/`]);
    expect(r.code, r.stderr).toBe(0);
    const got = lines(r.stdout);
    expect(got).toHaveLength(30);
    const sources = new Set(w.sourceOf.values());
    for (const l of got) {
      expect(l.status).toBe(204);
      expect(sources.has(l.peer), l.peer).toBe(true);
    }
    expect(got.filter((l) => l.scheme === 'https')).toHaveLength(15);
    // Plain HTTP is forwarded by the gateway, which names the upstream on the response.
    for (const l of got.filter((x) => x.scheme === 'http')) {
      expect(l.upstream).toMatch(/^crawl\/sq\d$/);
      expect(w.sourceOf.get(l.upstream)).toBe(l.peer);
    }
    // Without a session, connections rotate over more than one upstream.
    expect(new Set(got.map((l) => l.peer)).size).toBeGreaterThan(1);
  }, 120_000);

  it('a sticky session in the user name keeps the whole crawl on one upstream', async () => {
    const r = await crawl('crawler-session-scrapy1', 20, [`${w.tls.baseUrl}/`, `${w.http.baseUrl}/`]);
    expect(r.code, r.stderr).toBe(0);
    const got = lines(r.stdout);
    expect(got).toHaveLength(40);
    expect(got.every((l) => l.status === 204)).toBe(true);
    expect(new Set(got.map((l) => l.peer)).size).toBe(1);
  }, 120_000);
});
