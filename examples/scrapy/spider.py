"""A complete Scrapy spider that fetches every page through a proxy leased from the operator.

It starts at one URL, follows the links that stay on that site (at most ``max_pages`` pages)
and yields one item per page: its URL, HTTP status, title and the proxy that carried it. All
the proxy work is the middleware's (docs/scrapy.md): one lease per site, ``blocked`` reports
on 403 and 429 with a retry through another proxy, every lease released when the crawl ends.

Run it from the repository root while the standalone operator runs (``npm start``: the lease
API on 127.0.0.1:8090), with the package on PYTHONPATH or installed (clients/python/README.md):

    PYTHONPATH=clients/python scrapy runspider examples/scrapy/spider.py \\
        -a url=https://example.com/ -O /tmp/pages.jsonl

Options (``-a`` are the spider's, ``-s`` override the settings below):

    -a url=URL                  where to start (default https://example.com/)
    -a max_pages=N              pages to fetch at most (default 20)
    -s EGRESS_API_URL=URL       another lease API, e.g. http://discovery.crawl:8090
    -s EGRESS_SELECTOR=pool=eu  lease from some proxies only

A lease API that wants a token reads it from the DISCOVERY_TOKEN environment variable.
"""

from urllib.parse import urlsplit

import scrapy


class EgressExampleSpider(scrapy.Spider):
    name = "egress-example"

    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {
            # Below HttpProxyMiddleware (750), which turns the lease's credentials into
            # Proxy-Authorization.
            "egress_proxies.scrapy_middleware.LeasedProxyMiddleware": 740,
        },
        "EGRESS_API_URL": "http://127.0.0.1:8090",
        # "EGRESS_API_TOKEN": "...",         # default: $DISCOVERY_TOKEN, none if unset
        # "EGRESS_SELECTOR": "pool=eu",      # default: any proxy
        "EGRESS_BLOCKED_COOLDOWN": 120,  # seconds a proxy rests for a site that refused it
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,  # these share the site's lease
        "DOWNLOAD_TIMEOUT": 30,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        # Scrapy 2.7 to 2.11 warn at start without it; later releases need no such setting.
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
    }

    def __init__(self, url="https://example.com/", max_pages="20", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]
        self.site = urlsplit(url).netloc
        self.max_pages = int(max_pages)
        self.seen = {url}

    def parse(self, response):
        lease = response.meta.get("egress_lease") or {}
        yield {
            "url": response.url,
            "status": response.status,
            "title": (response.css("title::text").get() or "").strip(),
            "proxy": f"{lease.get('namespace')}/{lease.get('name')}" if lease else None,
        }
        for link in response.css("a::attr(href)").getall():
            url = response.urljoin(link).split("#", 1)[0]
            if urlsplit(url).netloc != self.site or url in self.seen or len(self.seen) >= self.max_pages:
                continue
            self.seen.add(url)
            yield scrapy.Request(url, callback=self.parse)
