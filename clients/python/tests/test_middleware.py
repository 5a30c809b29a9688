"""LeasedProxyMiddleware's lease bookkeeping with a fake lease client: requests of one slot share
one lease, reports name the lease each request used and release nothing, a lease a report
retired is released exactly once, when the last request using it has finished — not before,
and not left to expire — and a slot's lease nobody used for EGRESS_LEASE_IDLE is released too.
Lease API calls and waits are made synchronous and the clock and timers are fakes, so no
reactor runs.
"""

import unittest
from unittest import mock

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

    def __init__(self):
        self.calls = []
        self.granted = 0
        self.active = set()

    def lease(self, target=None, selector=None, namespace=None, ttl=None):
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
            client=self,
        )

    def renew(self, lease_id, ttl=None):
        self.calls.append(("renew", lease_id))
        return 0.0

    def release(self, lease_id):
        self.calls.append(("release", lease_id))
        self.active.discard(lease_id)

    def report(self, lease_id, result, cooldown=None, release=True):
        self.calls.append(("report", lease_id, result, release))
        if release:
            self.active.discard(lease_id)

    def report_proxy(self, namespace, name, result, target=None, cooldown=None):
        self.calls.append(("report_proxy", f"{namespace}/{name}", result, target))

    def of(self, kind):
        return [c[1:] for c in self.calls if c[0] == kind]


class Stats:
    def __init__(self):
        self.values = {}

    def inc_value(self, key, count=1, start=0):
        self.values[key] = self.values.get(key, start) + count

    def get_value(self, key, default=None):
        return self.values.get(key, default)


class FakeTime:
    """time.time()/monotonic() under the test's control."""

    def __init__(self):
        self.now = 1_800_000_000.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now


class Timers:
    """call_later that records (delay, fn, args); `fire_due()` runs those due at the fake time."""

    def __init__(self, clock):
        self.clock = clock
        self.pending = []

    def __call__(self, delay, fn, *args):
        self.pending.append((self.clock.now + delay, fn, args))

    def fire_due(self):
        due = [t for t in self.pending if t[0] <= self.clock.now]
        self.pending = [t for t in self.pending if t[0] > self.clock.now]
        for _, fn, args in due:
            fn(*args)


class Crawler:
    def __init__(self):
        self.stats = Stats()


def resolved(value):
    """The result of a Deferred that has fired (everything here is synchronous), else the value."""
    if not isinstance(value, defer.Deferred):
        return value
    out = []
    value.addBoth(out.append)
    if not out:
        raise AssertionError("the Deferred did not fire")
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


class MiddlewareTest(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.object(scrapy_middleware, "_sleep", lambda seconds: defer.succeed(None))
        patcher.start()
        self.addCleanup(patcher.stop)
        self.clock = FakeTime()
        clock_patcher = mock.patch.object(scrapy_middleware, "time", self.clock)
        clock_patcher.start()
        self.addCleanup(clock_patcher.stop)
        self.client = FakeClient()
        self.mw = self.middleware()

    def middleware(self, **settings):
        cfg = EgressSettings.from_settings(
            Settings(
                {"EGRESS_API_URL": "http://127.0.0.1:1", "EGRESS_BLOCKED_RETRIES": 2, "EGRESS_LEASE_TTL": 300, **settings}
            )
        )
        mw = LeasedProxyMiddleware(Crawler(), cfg, client=self.client)
        # The lease API on the calling thread: every call completes at once; timers are ours.
        mw._api = lambda fn, *args, **kwargs: defer.maybeDeferred(fn, *args, **kwargs)
        self.timers = Timers(self.clock)
        mw.call_later = self.timers
        self.stats = mw.stats.values
        return mw

    def send(self, url, **meta):
        request = Request(url, meta=dict(meta))
        self.assertIsNone(resolved(self.mw.process_request(request, None)))
        return request

    def answer(self, request, status, headers=None):
        return resolved(self.mw.process_response(request, Response(request.url, status=status, headers=headers, request=request), None))

    def fail_with(self, request, exc):
        return resolved(self.mw.process_exception(request, exc, None))

    def test_requests_of_one_slot_share_one_lease_that_stays_after_success(self):
        a = self.send("https://shop.example/a")
        b = self.send("https://shop.example/b")
        self.assertEqual(self.client.of("lease"), [("shop.example",)])
        self.assertEqual(a.meta[META_LEASE]["id"], "L1")
        self.assertEqual(b.meta[META_LEASE]["id"], "L1")
        self.assertEqual(a.meta["proxy"], "http://lease-L1:pw@127.0.0.1:3001")
        self.assertEqual(self.mw.leases["L1"].users, 2)
        self.answer(a, 200)
        self.answer(b, 200)
        # Kept by the slot for the next request: not released, not retired.
        self.assertEqual(self.client.of("release"), [])
        self.assertEqual(self.mw.leases["L1"].users, 0)
        c = self.send("https://shop.example/c")
        self.assertEqual(c.meta[META_LEASE]["id"], "L1")
        self.assertEqual(len(self.client.of("lease")), 1)

    def test_a_block_retires_the_shared_lease_which_goes_when_the_last_sibling_finishes(self):
        a = self.send("https://shop.example/a")
        b = self.send("https://shop.example/b")
        c = self.send("https://shop.example/c")
        retry = self.answer(a, 403)
        # The report names the lease `a` used, and releases nothing: b and c still use it.
        self.assertEqual(self.client.of("report"), [("L1", "blocked", False)])
        self.assertEqual(self.client.of("release"), [])
        self.assertIn("L1", self.client.active)
        # The retry goes through a new lease; the slot no longer hands out L1.
        self.assertIsInstance(retry, Request)
        retry_sent = resolved(self.mw.process_request(retry, None))
        self.assertIsNone(retry_sent)
        self.assertEqual(retry.meta[META_LEASE]["id"], "L2")
        self.answer(b, 200)
        self.assertEqual(self.client.of("release"), [])
        # A sibling blocked too: its report names L1 as well (the lease it used), still no release.
        self.answer(c, 403)
        self.assertEqual(self.client.of("report"), [("L1", "blocked", False), ("L1", "blocked", False)])
        # c was the last user of L1: released now, once.
        self.assertEqual(self.client.of("release"), [("L1",)])
        self.assertNotIn("L1", self.mw.leases)
        self.answer(retry, 200)
        self.assertEqual(self.client.of("release"), [("L1",)])
        self.assertEqual(self.stats.get("egress/release"), 1)

    def test_a_lone_blocked_request_releases_its_lease_right_after_the_report(self):
        a = self.send("https://shop.example/a")
        self.answer(a, 429, headers={"Retry-After": "5"})
        self.assertEqual([c[0] for c in self.client.calls], ["lease", "report", "release"])
        self.assertEqual(self.client.active, set())

    def test_a_proxy_failure_reports_failed_and_releases_after_the_siblings(self):
        a = self.send("https://shop.example/a")
        b = self.send("https://shop.example/b")
        retry = self.fail_with(a, ConnectionRefusedError())
        self.assertIsInstance(retry, Request)
        self.assertEqual(self.client.of("report"), [("L1", "failed", False)])
        self.assertEqual(self.client.of("release"), [])
        self.fail_with(b, ConnectionRefusedError())
        self.assertEqual(self.client.of("report"), [("L1", "failed", False), ("L1", "failed", False)])
        self.assertEqual(self.client.of("release"), [("L1",)])

    def test_an_ended_lease_407_is_released_once_its_siblings_are_done(self):
        a = self.send("https://shop.example/a")
        b = self.send("https://shop.example/b")
        self.assertIsInstance(self.answer(a, 407), Request)
        self.assertEqual(self.client.of("report"), [])
        self.assertEqual(self.client.of("release"), [])
        self.answer(b, 200)
        self.assertEqual(self.client.of("release"), [("L1",)])

    def test_origin_errors_and_timeouts_end_the_use_without_retiring_the_lease(self):
        a = self.send("https://shop.example/a")
        b = self.send("https://shop.example/b")
        self.answer(a, 502, headers={"X-Proxy-Error": "origin-unreachable"})
        self.assertIsNone(self.fail_with(b, TimeoutError("cut")))
        self.assertEqual(self.client.of("report"), [])
        self.assertEqual(self.client.of("release"), [])
        self.assertEqual(self.mw.leases["L1"].users, 0)
        self.assertFalse(self.mw.leases["L1"].retired)

    def test_a_request_that_comes_back_with_its_old_lease_counts_once(self):
        a = self.send("https://shop.example/a")
        # Scrapy's RetryMiddleware retries a copy that still carries the old meta.
        self.answer(a, 500)
        again = a.copy()
        resolved(self.mw.process_request(again, None))
        self.assertEqual(self.mw.leases["L1"].users, 1)
        # A request returned to the scheduler by a later middleware, never answered here.
        rescheduled = again.copy()
        resolved(self.mw.process_request(rescheduled, None))
        self.assertEqual(self.mw.leases["L1"].users, 1)
        self.answer(rescheduled, 200)
        self.assertEqual(self.mw.leases["L1"].users, 0)

    def test_another_host_of_the_slot_reports_by_proxy_and_releases_nothing_early(self):
        a = self.send("https://a.shop.example/x", download_slot="shop")
        b = self.send("https://b.shop.example/y", download_slot="shop")
        self.assertEqual(b.meta[META_LEASE]["id"], "L1")
        self.answer(b, 403)
        self.assertEqual(self.client.of("report_proxy"), [("crawl/px-1", "blocked", "b.shop.example")])
        self.assertEqual(self.client.of("release"), [])
        self.answer(a, 200)
        self.assertEqual(self.client.of("release"), [("L1",)])

    def test_a_slot_lease_unused_for_the_idle_time_is_released(self):
        a = self.send("https://shop.example/a")
        self.answer(a, 200)
        self.clock.now += 29
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [])
        # Used again before the idle time ran out: the first timer finds it busy, nothing goes.
        b = self.send("https://shop.example/b")
        self.assertEqual(b.meta[META_LEASE]["id"], "L1")
        self.clock.now += 2
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [])
        self.answer(b, 200)
        self.clock.now += 29
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [])
        self.clock.now += 1
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [("L1",)])
        self.assertEqual(self.stats.get("egress/idle_release"), 1)
        self.assertEqual(self.mw.leases, {})
        # The slot's next request takes a new lease.
        c = self.send("https://shop.example/c")
        self.assertEqual(c.meta[META_LEASE]["id"], "L2")

    def test_idle_release_waits_for_a_slot_busy_renewing(self):
        a = self.send("https://shop.example/a")
        self.answer(a, 200)
        lock = self.mw.locks["shop.example"]
        resolved(lock.acquire())
        self.clock.now += 30
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [])
        lock.release()
        self.clock.now += 1
        self.timers.fire_due()
        self.assertEqual(self.client.of("release"), [("L1",)])

    def test_none_settings_mean_the_servers_default_or_off(self):
        cfg = self.middleware(EGRESS_BLOCKED_COOLDOWN=None, EGRESS_LEASE_IDLE=None).cfg
        self.assertIsNone(cfg.blocked_cooldown)
        self.assertIsNone(cfg.failed_cooldown)
        self.assertIsNone(cfg.lease_idle)
        cfg = self.middleware(EGRESS_FAILED_COOLDOWN=30).cfg
        self.assertEqual((cfg.blocked_cooldown, cfg.failed_cooldown, cfg.lease_idle), (120, 30, 30.0))

    def test_no_idle_release_when_switched_off(self):
        self.mw = self.middleware(EGRESS_LEASE_IDLE=None)
        a = self.send("https://shop.example/a")
        self.answer(a, 200)
        self.assertEqual(self.timers.pending, [])
        self.clock.now += 3600
        self.assertEqual(self.client.of("release"), [])

    def test_close_releases_the_slots_leases_and_any_still_in_use(self):
        a = self.send("https://shop.example/a")
        self.send("https://shop.example/b")
        self.send("https://other.example/c")
        self.answer(a, 403)  # L1 retired, still used by b
        resolved(self.mw.spider_closed(None))
        self.assertEqual(sorted(self.client.of("release")), [("L1",), ("L2",)])
        self.assertEqual(self.client.active, set())
        self.assertEqual(self.mw.leases, {})


if __name__ == "__main__":
    unittest.main()
