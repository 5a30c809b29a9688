"""egress_proxies.scrapy_middleware — a Scrapy downloader middleware that sends every request
through a proxy leased from egress-proxies-operator (settings and behaviour: docs/scrapy.md).

One lease per download slot (per site by default), taken and renewed under a per-slot lock so
concurrent requests share it; the lease each request used travels in `request.meta`, so a
report always names the proxy that carried it. Every lease is counted in use by the requests
in flight through it: a `blocked` or `failed` report (or a 407) retires it from its slot, and
it is released once the last request using it has finished — never while a sibling still
uses it, never left to expire; a slot's lease unused for EGRESS_LEASE_IDLE is released too.
Lease API calls are blocking calls of LeaseClient run on a small thread pool of our own, and
every wait (backoff, `retryAt`) is a reactor timer: the reactor never blocks.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlparse

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider, IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.settings import BaseSettings
from twisted.internet import defer, task, threads
from twisted.internet import reactor as _reactor
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from .client import ApiUnreachable, DiscoveryError, Lease, LeaseClient, LeaseNotFound, NoneLeasable, wait_for_retry
from .outcome import (
    DENIED,
    LEASE_ENDED,
    ORIGIN_FAULT,
    PROXY_ERROR_HEADER,
    PROXY_FAULT,
    backoff_delays,
    classify_exception,
    header_getter,
    retry_after_seconds,
    status_fault,
)

logger = logging.getLogger(__name__)

# The installed reactor (Scrapy picks it at start-up; Twisted's stubs type the module attribute loosely).
reactor: Any = _reactor
_T = TypeVar("_T")
# What a request carries about its lease in request.meta[META_LEASE]: id, namespace, name,
# target, slot, and done once its use of the lease ended.
LeaseInfo = dict[str, Any]
# The generators of inlineCallbacks: they yield Deferreds and get back what those fire with.
Flow = Generator["defer.Deferred[Any]", Any, _T]

META_LEASE = "egress_lease"
META_SKIP = "egress_skip"
META_BLOCKED = "egress_blocked_times"
META_FAILED = "egress_failed_times"


class NoProxyAvailable(IgnoreRequest):
    """No proxy could be leased for the request within EGRESS_MAX_WAIT (or the API stayed away)."""


@dataclass
class EgressSettings:
    api_url: str
    token: str | None
    selector: str | None
    namespace: str | None
    ttl: int
    blocked_statuses: frozenset[int]
    blocked_cooldown: int | None
    blocked_retries: int
    rate_limit_statuses: frozenset[int]
    rate_limit_cooldown: int
    rate_limit_max_cooldown: int
    failed_cooldown: int | None
    failed_retries: int
    max_wait: float
    poll_interval: float
    api_timeout: float
    api_retry_for: float
    api_threads: int
    lease_idle: float | None

    @classmethod
    def from_settings(cls, s: BaseSettings) -> EgressSettings:
        url = s.get("EGRESS_API_URL")
        if not url:
            raise NotConfigured("EGRESS_API_URL is not set")

        def unset(name: str) -> bool:
            # Scrapy's get() falls back to the default for a None value: ask whether it was set to None.
            return name in s and s[name] is None

        def opt_int(name: str, default: int | None) -> int | None:
            if unset(name) or (default is None and s.get(name) is None):
                return None
            return s.getint(name, default or 0)

        return cls(
            api_url=url,
            token=s.get("EGRESS_API_TOKEN"),
            selector=s.get("EGRESS_SELECTOR"),
            namespace=s.get("EGRESS_NAMESPACE"),
            ttl=s.getint("EGRESS_LEASE_TTL", 300),
            blocked_statuses=frozenset(int(x) for x in s.getlist("EGRESS_BLOCKED_STATUSES", [403])),
            blocked_cooldown=opt_int("EGRESS_BLOCKED_COOLDOWN", 120),
            blocked_retries=s.getint("EGRESS_BLOCKED_RETRIES", 3),
            rate_limit_statuses=frozenset(int(x) for x in s.getlist("EGRESS_RATE_LIMIT_STATUSES", [429])),
            rate_limit_cooldown=s.getint("EGRESS_RATE_LIMIT_COOLDOWN", 30),
            rate_limit_max_cooldown=s.getint("EGRESS_RATE_LIMIT_MAX_COOLDOWN", 300),
            failed_cooldown=opt_int("EGRESS_FAILED_COOLDOWN", None),
            failed_retries=s.getint("EGRESS_FAILED_RETRIES", 5),
            max_wait=s.getfloat("EGRESS_MAX_WAIT", 600.0),
            poll_interval=s.getfloat("EGRESS_POLL_INTERVAL", 5.0),
            api_timeout=s.getfloat("EGRESS_API_TIMEOUT", 10.0),
            api_retry_for=s.getfloat("EGRESS_API_RETRY_FOR", 120.0),
            api_threads=s.getint("EGRESS_API_THREADS", 4),
            lease_idle=None if unset("EGRESS_LEASE_IDLE") else s.getfloat("EGRESS_LEASE_IDLE", 30.0),
        )


@dataclass
class _Held:
    """A lease we hold: handed out by its slot until retired, released once retired and unused."""

    lease: Lease
    renew_at: float
    slot: str = ""
    # Requests in flight through this lease (process_request done, response or exception not yet).
    users: int = 0
    # No longer handed out by its slot (blocked, failed, ended); released when `users` drops to 0.
    retired: bool = False
    # When `users` last dropped to 0 (time.time()); a slot's lease idle for EGRESS_LEASE_IDLE goes.
    idle_since: float | None = None


def slot_key(request: Request) -> str:
    """The download slot Scrapy puts the request in (its `download_slot`, else the host)."""
    return request.meta.get("download_slot") or (urlparse(request.url).hostname or "")


def _sleep(seconds: float) -> defer.Deferred[None]:
    return task.deferLater(reactor, max(0.0, seconds), lambda: None)


class LeasedProxyMiddleware:
    """The downloader middleware (behaviour: this module's docstring). Its methods' `spider`
    arguments are optional: Scrapy 2.8 passes them, newer releases stop doing so."""

    def __init__(self, crawler: Crawler, cfg: EgressSettings, client: LeaseClient | None = None):
        self.crawler = crawler
        self.cfg = cfg
        self.stats = crawler.stats
        # One attempt per call: retries and their waits happen on the reactor (_api).
        self.client = client or LeaseClient(cfg.api_url, token=cfg.token, timeout=cfg.api_timeout, retry_for=0)
        # The lease each slot hands out now.
        self.held: dict[str, _Held] = {}
        # Every lease not yet released, by id: the slots' and retired ones still in use.
        self.leases: dict[str, _Held] = {}
        # Releases under way, waited for at close.
        self.releasing: dict[str, defer.Deferred[Any]] = {}
        self.locks: dict[str, defer.DeferredLock] = {}
        self.waiting = 0
        self.pool = ThreadPool(minthreads=0, maxthreads=cfg.api_threads, name="egress-lease-api")
        # Reactor timers (replaced in unit tests).
        self.call_later: Callable[..., Any] = reactor.callLater

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeasedProxyMiddleware:
        mw = cls(crawler, EgressSettings.from_settings(crawler.settings))
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # ---- signals ----

    def spider_opened(self, spider: Spider) -> None:
        self.pool.start()
        reactor.addSystemEventTrigger("during", "shutdown", self._stop_pool)

    def spider_idle(self, spider: Spider) -> None:
        # Requests waiting for a proxy sit in the downloader, but say so explicitly: the crawl
        # is not over while any of them waits.
        if self.waiting > 0:
            raise DontCloseSpider("requests are waiting for a leasable proxy")

    def spider_closed(self, spider: Spider) -> defer.Deferred[None]:
        """Releases every lease still held (the slots' and any still in use); the crawl ends once that is done."""
        return self._release_all()

    @defer.inlineCallbacks
    def _release_all(self) -> Flow[None]:
        held, self.held = list(self.leases.values()), {}
        for h in held:
            h.retired = True
            h.users = 0
            self._release(h)
        yield defer.DeferredList(list(self.releasing.values()), consumeErrors=True)
        self._stop_pool()

    def _stop_pool(self) -> None:
        if self.pool.started and not self.pool.joined:
            self.pool.stop()

    # ---- the lease API, off the reactor thread ----

    @defer.inlineCallbacks
    def _api(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> Flow[_T]:
        """fn(*args) on our thread pool; retried with backoff on the reactor while the API is unreachable."""
        deadline = time.monotonic() + self.cfg.api_retry_for
        delays = backoff_delays()
        while True:
            try:
                result: _T = yield threads.deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)
                return result
            except ApiUnreachable as err:
                delay = max(next(delays), err.retry_after or 0.0)
                if time.monotonic() + delay > deadline:
                    raise
                self.stats.inc_value("egress/api_retry")
                yield _sleep(delay)

    # ---- requests ----

    @defer.inlineCallbacks
    def process_request(self, request: Request, spider: Spider | None = None) -> Flow[None]:
        if request.meta.get(META_SKIP):
            return None
        previous = request.meta.get(META_LEASE)
        if previous:
            # The request comes back without its download having ended here (a later middleware
            # returned a new request): its old use ends now.
            self._finish(previous)
        slot = slot_key(request)
        lease = yield self._slot_lease(slot, request, time.time())
        request.meta["proxy"] = lease.proxy_url
        request.meta[META_LEASE] = {
            "id": lease.id,
            "namespace": lease.namespace,
            "name": lease.name,
            "target": lease.target,
            "slot": slot,
        }
        return None

    @defer.inlineCallbacks
    def _slot_lease(self, slot: str, request: Request, since: float) -> Flow[Lease]:
        """The slot's lease, counted in use by the request before the slot lock is let go."""
        lock = self.locks.setdefault(slot, defer.DeferredLock())
        yield lock.acquire()
        try:
            held = self.held.get(slot)
            if held and time.time() >= held.renew_at:
                held = yield self._renew(slot, held)
            if not held:
                held = yield self._take(slot, request, since)
            held.users += 1
            held.idle_since = None
            return held.lease
        finally:
            lock.release()

    @defer.inlineCallbacks
    def _renew(self, slot: str, held: _Held) -> Flow[_Held | None]:
        try:
            yield self._api(self.client.renew, held.lease.id, self.cfg.ttl)
        except LeaseNotFound:
            # Gone on the server (expired): nothing to release once its last user is done.
            self.held.pop(slot, None)
            held.retired = True
            if held.users <= 0:
                self.leases.pop(held.lease.id, None)
            self.stats.inc_value("egress/lease_expired")
            return None
        held.renew_at = time.time() + self.cfg.ttl * 2 / 3
        self.stats.inc_value("egress/renew")
        return held

    @defer.inlineCallbacks
    def _take(self, slot: str, request: Request, since: float) -> Flow[_Held]:
        """A new lease for the slot; waits (as timers) while none is leasable, up to EGRESS_MAX_WAIT."""
        target = urlparse(request.url).hostname or None
        while True:
            try:
                lease = yield self._api(self.client.lease, target, self.cfg.selector, self.cfg.namespace, self.cfg.ttl)
            except NoneLeasable as refused:
                delay = wait_for_retry(refused, time.time())
                if delay is None:
                    # Nothing would become leasable by itself; proxies may still come (health, a restart).
                    delay = self.cfg.poll_interval
                waited = time.time() - since
                if waited + delay > self.cfg.max_wait:
                    self.stats.inc_value("egress/no_proxy")
                    logger.error(
                        "egress: no proxy leasable for %s after %.0f s, dropping %s: %s", slot, waited, request, refused
                    )
                    raise NoProxyAvailable(
                        f"no proxy leasable for {slot} within {self.cfg.max_wait:.0f} s: {refused}"
                    ) from refused
                self.stats.inc_value("egress/wait")
                self.waiting += 1
                try:
                    yield _sleep(delay)
                finally:
                    self.waiting -= 1
                continue
            except ApiUnreachable as err:
                self.stats.inc_value("egress/no_proxy")
                logger.error(
                    "egress: lease API unreachable for %.0f s, dropping %s: %s", self.cfg.api_retry_for, request, err
                )
                raise NoProxyAvailable(f"lease API unreachable: {err}") from err
            held = _Held(lease, time.time() + self.cfg.ttl * 2 / 3, slot)
            self.held[slot] = held
            self.leases[lease.id] = held
            self.stats.inc_value("egress/lease")
            return held

    # ---- outcomes ----

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response | Request | defer.Deferred[Any]:
        info = request.meta.get(META_LEASE)
        if not info:
            return response
        get = header_getter(response.headers)
        fault = status_fault(response.status, get(PROXY_ERROR_HEADER))
        if fault == LEASE_ENDED:
            return self._lease_ended(request, info)
        if fault in (ORIGIN_FAULT, DENIED):
            self.stats.inc_value("egress/origin_error" if fault == ORIGIN_FAULT else "egress/denied")
            self._finish(info)
            return response
        if response.status in self.cfg.rate_limit_statuses:
            wanted = retry_after_seconds(get("Retry-After"))
            cooldown = self.cfg.rate_limit_cooldown if wanted is None else wanted
            cooldown = int(min(max(math.ceil(cooldown), 1), self.cfg.rate_limit_max_cooldown))
            self.stats.inc_value("egress/rate_limited")
            return self._blocked(request, response, info, cooldown)
        if response.status in self.cfg.blocked_statuses:
            return self._blocked(request, response, info, self.cfg.blocked_cooldown)
        self.stats.inc_value("egress/response")
        self._finish(info)
        return response

    def process_exception(
        self, request: Request, exception: BaseException, spider: Spider | None = None
    ) -> Request | defer.Deferred[Any] | None:
        info = request.meta.get(META_LEASE)
        if not info:
            return None
        kind = classify_exception(exception)
        if kind == PROXY_FAULT:
            return self._proxy_failed(request, info, exception)
        if kind == LEASE_ENDED:
            return self._lease_ended(request, info)
        self.stats.inc_value({ORIGIN_FAULT: "egress/origin_error", DENIED: "egress/denied"}.get(kind, "egress/error"))
        self._finish(info)
        return None  # not the proxy's doing: Scrapy's RetryMiddleware and errbacks decide

    @defer.inlineCallbacks
    def _blocked(
        self, request: Request, response: Response, info: LeaseInfo, cooldown: int | None
    ) -> Flow[Response | Request]:
        self.stats.inc_value("egress/blocked")
        self.stats.inc_value(f"egress/blocked/{response.status}")
        self._forget(info)
        try:
            yield self._report(request, info, "blocked", cooldown)
        finally:
            self._finish(info)
        times = request.meta.get(META_BLOCKED, 0)
        if times >= self.cfg.blocked_retries:
            self.stats.inc_value("egress/blocked_gave_up")
            logger.warning("egress: %s blocked %d times (%d), giving up", request.url, times + 1, response.status)
            return response
        return self._again(request, META_BLOCKED)

    @defer.inlineCallbacks
    def _proxy_failed(self, request: Request, info: LeaseInfo, exception: BaseException) -> Flow[Request | None]:
        self.stats.inc_value("egress/failed")
        self._forget(info)
        try:
            yield self._report(request, info, "failed", self.cfg.failed_cooldown)
        finally:
            self._finish(info)
        times = request.meta.get(META_FAILED, 0)
        if times >= self.cfg.failed_retries:
            self.stats.inc_value("egress/failed_gave_up")
            logger.error(
                "egress: %s failed through %d proxies, last %s: %s", request.url, times + 1, _name(info), exception
            )
            return None
        yield _sleep(min(10.0, 0.5 * 2**times))
        return self._again(request, META_FAILED)

    def _lease_ended(self, request: Request, info: LeaseInfo) -> Request:
        self.stats.inc_value("egress/lease_ended")
        self._forget(info)
        self._finish(info)
        return self._again(request, META_FAILED)

    def _forget(self, info: LeaseInfo) -> None:
        """Retires the lease the request used: its slot stops handing it out (a sibling may have
        replaced it already)."""
        held = self.held.get(info["slot"])
        if held and held.lease.id == info["id"]:
            del self.held[info["slot"]]
        use = self.leases.get(info["id"])
        if use:
            use.retired = True

    def _finish(self, info: LeaseInfo) -> None:
        """The request's use of its lease ends (once): a retired lease goes when its last user is done,
        a slot's lease once it stayed unused for EGRESS_LEASE_IDLE."""
        if info.get("done"):
            return
        info["done"] = True
        use = self.leases.get(info["id"])
        if not use:
            return
        use.users = max(0, use.users - 1)
        if use.users > 0:
            return
        if use.retired:
            self._release(use)
            return
        idle = self.cfg.lease_idle
        if idle is None:
            return  # kept for the slot until it is blocked, expires or the spider closes
        use.idle_since = time.time()
        if idle <= 0:
            self._release_idle(use)
        else:
            self.call_later(idle, self._release_idle, use)

    def _release_idle(self, use: _Held) -> None:
        """Releases a slot's lease nobody used for EGRESS_LEASE_IDLE; the slot's next request takes a new one."""
        if use.users > 0 or use.idle_since is None or self.leases.get(use.lease.id) is not use:
            return
        wait = (self.cfg.lease_idle or 0) - (time.time() - use.idle_since)
        lock = self.locks.get(use.slot)
        if wait > 0.001 or (lock is not None and lock.locked):
            # Used again and let go since (a later timer handles it), or the slot is busy renewing.
            self.call_later(max(wait, 0.1), self._release_idle, use)
            return
        if self.held.get(use.slot) is use:
            del self.held[use.slot]
        use.retired = True
        self.stats.inc_value("egress/idle_release")
        self._release(use)

    def _release(self, use: _Held) -> None:
        """Releases a lease we no longer use (idempotent on the server); close waits for it."""
        lease_id = use.lease.id
        if self.leases.pop(lease_id, None) is None or lease_id in self.releasing:
            return

        def done(_: object) -> None:
            self.releasing.pop(lease_id, None)
            self.stats.inc_value("egress/release")

        def failed(f: Failure) -> None:
            self.releasing.pop(lease_id, None)
            self.stats.inc_value("egress/release_error")
            logger.warning("egress: could not release lease of %s: %s", use.lease.proxy, f.getErrorMessage())

        d = self._api(self.client.release, lease_id)
        self.releasing[lease_id] = d
        d.addCallbacks(done, failed)

    @defer.inlineCallbacks
    def _report(self, request: Request, info: LeaseInfo, result: str, cooldown: int | None) -> Flow[None]:
        host = urlparse(request.url).hostname
        try:
            if info["target"] is None or (host or "").lower() == info["target"]:
                # Never released by the report: siblings may still use the lease (_finish releases it).
                yield self._api(self.client.report, info["id"], result, cooldown, False)
            else:
                # The slot's lease was taken for another host of the slot: report this host.
                yield self._api(self.client.report_proxy, info["namespace"], info["name"], result, host, cooldown)
        except DiscoveryError as err:
            self.stats.inc_value("egress/report_error")
            logger.error("egress: could not report %s for %s via %s: %s", result, host, _name(info), err)

    def _again(self, request: Request, counter: str) -> Request:
        retry = request.replace(dont_filter=True)
        retry.meta[counter] = request.meta.get(counter, 0) + 1
        for key in (META_LEASE, "proxy", "_auth_proxy"):
            retry.meta.pop(key, None)
        retry.headers.pop(b"Proxy-Authorization", None)
        return retry


def _name(info: LeaseInfo) -> str:
    return f"{info['namespace']}/{info['name']}"
