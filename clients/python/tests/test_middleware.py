"""LeasedProxyMiddleware's lease bookkeeping with a fake lease client: requests of one slot share
one lease, reports name the lease each request used and release nothing, a lease a report
retired is released exactly once, when the last request using it has finished — not before,
and not left to expire — and a slot's lease nobody used for EGRESS_LEASE_IDLE is released too.
Lease API calls and waits are made synchronous and the clock and timers are fakes, so no
reactor runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from scrapy import Spider
from scrapy.http import Request, Response
from scrapy.settings import Settings
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.python.failure import Failure

from egress_proxies import scrapy_middleware
from egress_proxies.client import Lease
from egress_proxies.scrapy_middleware import META_LEASE, EgressSettings, LeasedProxyMiddleware


class FakeClient:
    """Grants leases L1, L2, … on proxies px-1, px-2, …; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.granted = 0
        self.active: set[str] = set()

    def lease(
        self,
        target: str | None = None,
        selector: str | None = None,
        namespace: str | None = None,
        ttl: int | None = None,
    ) -> Lease:
        self.granted += 1
        n = self.granted
        self.calls.append(("lease", target))
        self.active.add(f"L{n}")
        return Lease(
            id=f"L{n}",
            proxy_url=f"http://lease-L{n}:pw@127.0.0.1:{3000 + n}",
            namespace="crawl",
            name=f"px-{n}",
            host="127.0.0.1",
            port=3000 + n,
            target=target,
            expires_at=0.0,
            client=cast(Any, self),
        )

    def renew(self, lease_id: str, ttl: int | None = None) -> float:
        self.calls.append(("renew", lease_id))
        return 0.0

    def release(self, lease_id: str) -> None:
        self.calls.append(("release", lease_id))
        self.active.discard(lease_id)

    def report(self, lease_id: str, result: str, cooldown: int | None = None, release: bool = True) -> None:
        self.calls.append(("report", lease_id, result, release))
        if release:
            self.active.discard(lease_id)

    def report_proxy(
        self, namespace: str, name: str, result: str, target: str | None = None, cooldown: int | None = None
    ) -> None:
        self.calls.append(("report_proxy", f"{namespace}/{name}", result, target))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == kind]


class Stats:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc_value(self, key: str, count: int = 1, start: int = 0) -> None:
        self.values[key] = self.values.get(key, start) + count

    def get_value(self, key: str, default: int | None = None) -> int | None:
        return self.values.get(key, default)


class FakeTime:
    """time.time()/monotonic() under the test's control."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class Timers:
    """call_later that records (delay, fn, args); `fire_due()` runs those due at the fake time."""

    def __init__(self, clock: FakeTime) -> None:
        self.clock = clock
        self.pending: list[tuple[float, Callable[..., object], tuple[Any, ...]]] = []

    def __call__(self, delay: float, fn: Callable[..., object], *args: Any) -> None:
        self.pending.append((self.clock.now + delay, fn, args))

    def fire_due(self) -> None:
        due = [t for t in self.pending if t[0] <= self.clock.now]
        self.pending = [t for t in self.pending if t[0] > self.clock.now]
        for _, fn, args in due:
            fn(*args)


class Crawler:
    def __init__(self) -> None:
        self.stats = Stats()


def resolved(value: Any) -> Any:
    """The result of a Deferred that has fired (everything here is synchronous), else the value."""
    if not isinstance(value, defer.Deferred):
        return value
    out: list[Any] = []
    value.addBoth(out.append)
    if not out:
        raise AssertionError("the Deferred did not fire")
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


# Twisted's error for a connection to the proxy that was refused (its constructor is untyped).
REFUSED: BaseException = ConnectionRefusedError()  # type: ignore[no-untyped-call]
# The middleware never looks at the spider.
SPIDER = cast(Spider, None)


class Harness:
    """The middleware with a fake client, clock and timers; its lease API calls complete at once."""

    def __init__(self) -> None:
        self.clock = FakeTime()
        self.client = FakeClient()
        self.mw = self.middleware()

    def middleware(self, **settings: Any) -> LeasedProxyMiddleware:
        cfg = EgressSettings.from_settings(
            Settings(
                {
                    "EGRESS_API_URL": "http://127.0.0.1:1",
                    "EGRESS_BLOCKED_RETRIES": 2,
                    "EGRESS_LEASE_TTL": 300,
                    **settings,
                }
            )
        )
        mw = LeasedProxyMiddleware(cast(Any, Crawler()), cfg, client=cast(Any, self.client))
        # The lease API on the calling thread: every call completes at once; timers are ours.
        mw._api = lambda fn, *args, **kwargs: defer.maybeDeferred(fn, *args, **kwargs)  # type: ignore[method-assign]
        self.timers = Timers(self.clock)
        mw.call_later = self.timers
        self.stats: dict[str, int] = cast(Any, mw.stats).values
        return mw

    def send(self, url: str, **meta: Any) -> Request:
        request = Request(url, meta=dict(meta))
        assert resolved(self.mw.process_request(request, SPIDER)) is None
        return request

    def answer(self, request: Request, status: int, headers: dict[str, str] | None = None) -> Any:
        return resolved(
            self.mw.process_response(
                request, Response(request.url, status=status, headers=headers, request=request), SPIDER
            )
        )

    def fail_with(self, request: Request, exc: BaseException) -> Any:
        return resolved(self.mw.process_exception(request, exc, SPIDER))


@pytest.fixture
def h(monkeypatch: pytest.MonkeyPatch) -> Harness:
    monkeypatch.setattr(scrapy_middleware, "_sleep", lambda seconds: defer.succeed(None))
    harness = Harness()
    monkeypatch.setattr(scrapy_middleware, "time", harness.clock)
    return harness

    def test_requests_of_one_slot_share_one_lease_that_stays_after_success(h: Harness) -> None:
        a = h.send("https://shop.example/a")
        b = h.send("https://shop.example/b")
        assert h.client.of("lease") == [("shop.example",)]
        assert a.meta[META_LEASE]["id"] == "L1"
        assert b.meta[META_LEASE]["id"] == "L1"
        assert a.meta["proxy"] == "http://lease-L1:pw@127.0.0.1:3001"
        assert h.mw.leases["L1"].users == 2
        h.answer(a, 200)
        h.answer(b, 200)
        # Kept by the slot for the next request: not released, not retired.
        assert h.client.of("release") == []
        assert h.mw.leases["L1"].users == 0
        c = h.send("https://shop.example/c")
        assert c.meta[META_LEASE]["id"] == "L1"
        assert len(h.client.of("lease")) == 1


def test_a_block_retires_the_shared_lease_which_goes_when_the_last_sibling_finishes(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    b = h.send("https://shop.example/b")
    c = h.send("https://shop.example/c")
    retry = h.answer(a, 403)
    # The report names the lease `a` used, and releases nothing: b and c still use it.
    assert h.client.of("report") == [("L1", "blocked", False)]
    assert h.client.of("release") == []
    assert "L1" in h.client.active
    # The retry goes through a new lease; the slot no longer hands out L1.
    assert isinstance(retry, Request)
    retry_sent = resolved(h.mw.process_request(retry, SPIDER))
    assert retry_sent is None
    assert retry.meta[META_LEASE]["id"] == "L2"
    h.answer(b, 200)
    assert h.client.of("release") == []
    # A sibling blocked too: its report names L1 as well (the lease it used), still no release.
    h.answer(c, 403)
    assert h.client.of("report") == [("L1", "blocked", False), ("L1", "blocked", False)]
    # c was the last user of L1: released now, once.
    assert h.client.of("release") == [("L1",)]
    assert "L1" not in h.mw.leases
    h.answer(retry, 200)
    assert h.client.of("release") == [("L1",)]
    assert h.stats.get("egress/release") == 1


def test_a_lone_blocked_request_releases_its_lease_right_after_the_report(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    h.answer(a, 429, headers={"Retry-After": "5"})
    assert [c[0] for c in h.client.calls] == ["lease", "report", "release"]
    assert h.client.active == set()


def test_a_proxy_failure_reports_failed_and_releases_after_the_siblings(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    b = h.send("https://shop.example/b")
    retry = h.fail_with(a, REFUSED)
    assert isinstance(retry, Request)
    assert h.client.of("report") == [("L1", "failed", False)]
    assert h.client.of("release") == []
    h.fail_with(b, REFUSED)
    assert h.client.of("report") == [("L1", "failed", False), ("L1", "failed", False)]
    assert h.client.of("release") == [("L1",)]


def test_an_ended_lease_407_is_released_once_its_siblings_are_done(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    b = h.send("https://shop.example/b")
    assert isinstance(h.answer(a, 407), Request)
    assert h.client.of("report") == []
    assert h.client.of("release") == []
    h.answer(b, 200)
    assert h.client.of("release") == [("L1",)]


def test_origin_errors_and_timeouts_end_the_use_without_retiring_the_lease(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    b = h.send("https://shop.example/b")
    h.answer(a, 502, headers={"X-Proxy-Error": "origin-unreachable"})
    assert h.fail_with(b, TimeoutError("cut")) is None
    assert h.client.of("report") == []
    assert h.client.of("release") == []
    assert h.mw.leases["L1"].users == 0
    assert not h.mw.leases["L1"].retired


def test_a_request_that_comes_back_with_its_old_lease_counts_once(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    # Scrapy's RetryMiddleware retries a copy that still carries the old meta.
    h.answer(a, 500)
    again = a.copy()
    resolved(h.mw.process_request(again, SPIDER))
    assert h.mw.leases["L1"].users == 1
    # A request returned to the scheduler by a later middleware, never answered here.
    rescheduled = again.copy()
    resolved(h.mw.process_request(rescheduled, SPIDER))
    assert h.mw.leases["L1"].users == 1
    h.answer(rescheduled, 200)
    assert h.mw.leases["L1"].users == 0


def test_another_host_of_the_slot_reports_by_proxy_and_releases_nothing_early(h: Harness) -> None:
    a = h.send("https://a.shop.example/x", download_slot="shop")
    b = h.send("https://b.shop.example/y", download_slot="shop")
    assert b.meta[META_LEASE]["id"] == "L1"
    h.answer(b, 403)
    assert h.client.of("report_proxy") == [("crawl/px-1", "blocked", "b.shop.example")]
    assert h.client.of("release") == []
    h.answer(a, 200)
    assert h.client.of("release") == [("L1",)]


def test_a_slot_lease_unused_for_the_idle_time_is_released(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    h.answer(a, 200)
    h.clock.now += 29
    h.timers.fire_due()
    assert h.client.of("release") == []
    # Used again before the idle time ran out: the first timer finds it busy, nothing goes.
    b = h.send("https://shop.example/b")
    assert b.meta[META_LEASE]["id"] == "L1"
    h.clock.now += 2
    h.timers.fire_due()
    assert h.client.of("release") == []
    h.answer(b, 200)
    h.clock.now += 29
    h.timers.fire_due()
    assert h.client.of("release") == []
    h.clock.now += 1
    h.timers.fire_due()
    assert h.client.of("release") == [("L1",)]
    assert h.stats.get("egress/idle_release") == 1
    assert h.mw.leases == {}
    # The slot's next request takes a new lease.
    c = h.send("https://shop.example/c")
    assert c.meta[META_LEASE]["id"] == "L2"


def test_idle_release_waits_for_a_slot_busy_renewing(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    h.answer(a, 200)
    lock = h.mw.locks["shop.example"]
    resolved(lock.acquire())
    h.clock.now += 30
    h.timers.fire_due()
    assert h.client.of("release") == []
    lock.release()
    h.clock.now += 1
    h.timers.fire_due()
    assert h.client.of("release") == [("L1",)]


def test_none_settings_mean_the_servers_default_or_off(h: Harness) -> None:
    cfg = h.middleware(EGRESS_BLOCKED_COOLDOWN=None, EGRESS_LEASE_IDLE=None).cfg
    assert cfg.blocked_cooldown is None
    assert cfg.failed_cooldown is None
    assert cfg.lease_idle is None
    cfg = h.middleware(EGRESS_FAILED_COOLDOWN=30).cfg
    assert (cfg.blocked_cooldown, cfg.failed_cooldown, cfg.lease_idle) == (120, 30, 30.0)


def test_no_idle_release_when_switched_off(h: Harness) -> None:
    h.mw = h.middleware(EGRESS_LEASE_IDLE=None)
    a = h.send("https://shop.example/a")
    h.answer(a, 200)
    assert h.timers.pending == []
    h.clock.now += 3600
    assert h.client.of("release") == []


def test_close_releases_the_slots_leases_and_any_still_in_use(h: Harness) -> None:
    a = h.send("https://shop.example/a")
    h.send("https://shop.example/b")
    h.send("https://other.example/c")
    h.answer(a, 403)  # L1 retired, still used by b
    resolved(h.mw.spider_closed(SPIDER))
    assert sorted(h.client.of("release")) == [("L1",), ("L2",)]
    assert h.client.active == set()
    assert h.mw.leases == {}
