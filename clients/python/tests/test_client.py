"""LeaseClient against a scripted lease API on loopback: auth, errors, retries, the context manager."""

import json
import os
import socket
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

from egress_proxies import ApiUnreachable, LeaseClient, LeaseNotFound, NoneLeasable

GRANT = {
    "id": "lease-1",
    "proxy": {"namespace": "crawl", "name": "eu-1", "url": "http://u:p@127.0.0.1:3128", "host": "127.0.0.1", "port": 3128},
    "target": "shop.example",
    "expiresAt": "2026-12-02T10:05:00.000Z",
}
REFUSAL = {
    "error": {"code": "none_leasable", "message": "no proxy is leasable: ..."},
    "matching": 3, "ready": 3, "healthy": 3, "draining": 0, "coolingDown": 0, "coolingDownForTarget": 3, "atCapacity": 0,
    "retryAt": "2026-12-02T10:00:30.000Z",
}


class ScriptedApi:
    """Answers each request with the next scripted (status, headers, body); records what came in."""

    def __init__(self):
        self.script = []
        self.seen = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                api.seen.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = api.script.pop(0) if api.script else (204, {}, None)
                if status == "hang":
                    time.sleep(2)
                    return
                raw = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FakeTime:
    """sleep() advances clock() at once, so retry schedules run without waiting."""

    def __init__(self):
        self.now = 1796205600.0  # 2026-12-02T10:00:00Z
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.api = ScriptedApi()
        self.addCleanup(self.api.close)
        self.time = FakeTime()

    def client(self, **kw):
        kw.setdefault("token", "")
        return LeaseClient(self.api.url, sleep=self.time.sleep, clock=self.time.clock, **kw)

    def test_sends_the_token_when_there_is_one_and_no_header_otherwise(self):
        self.api.script = [(201, {}, GRANT), (201, {}, GRANT)]
        self.client(token=" s3cret\n").lease(target="https://shop.example/x")
        with mock.patch.dict(os.environ, {}, clear=True):
            self.client(token=None).lease()
        self.assertEqual(self.api.seen[0][2].get("Authorization"), "Bearer s3cret")
        self.assertNotIn("Authorization", self.api.seen[1][2])
        self.assertEqual(self.api.seen[0][3], {"target": "https://shop.example/x"})

    def test_a_grant_becomes_a_lease(self):
        self.api.script = [(201, {}, GRANT)]
        lease = self.client().lease(target="shop.example", selector="pool=eu", ttl=120)
        self.assertEqual((lease.id, lease.proxy, lease.target), ("lease-1", "crawl/eu-1", "shop.example"))
        self.assertEqual(lease.proxies, {"http": GRANT["proxy"]["url"], "https": GRANT["proxy"]["url"]})
        self.assertEqual(lease.expires_at, 1796205900.0)
        self.assertEqual(self.api.seen[0][3], {"target": "shop.example", "selector": "pool=eu", "ttlSeconds": 120})

    def test_a_409_says_why_and_when_to_come_back(self):
        self.api.script = [(409, {"Retry-After": "30"}, REFUSAL)]
        with self.assertRaises(NoneLeasable) as caught:
            self.client().lease(target="shop.example")
        self.assertEqual(caught.exception.counts["coolingDownForTarget"], 3)
        self.assertEqual(caught.exception.retry_at, 1796205630.0)
        self.assertEqual(caught.exception.retry_after, 30.0)

    def test_lease_waiting_sleeps_until_retry_at_then_leases(self):
        self.api.script = [(409, {"Retry-After": "30"}, REFUSAL), (201, {}, GRANT)]
        lease = self.client().lease_waiting(target="shop.example", wait=60)
        self.assertEqual(lease.id, "lease-1")
        self.assertEqual(self.time.slept, [30.0])

    def test_lease_waiting_gives_up_when_retry_at_is_beyond_the_wait_or_absent(self):
        self.api.script = [(409, {}, REFUSAL), (409, {}, {**REFUSAL, "retryAt": None})]
        with self.assertRaises(NoneLeasable):
            self.client().lease_waiting(wait=10)
        with self.assertRaises(NoneLeasable):
            self.client().lease_waiting(wait=600)
        self.assertEqual(self.time.slept, [])

    def test_retries_while_the_api_has_no_leader_honouring_retry_after(self):
        no_leader = (503, {"Retry-After": "1"}, {"error": {"code": "no_leader", "message": "retry shortly"}})
        self.api.script = [no_leader, no_leader, (201, {}, GRANT)]
        self.assertEqual(self.client().lease().id, "lease-1")
        self.assertEqual(len(self.api.seen), 3)
        self.assertTrue(all(s >= 1.0 for s in self.time.slept), self.time.slept)

    def test_retries_an_unreachable_api_with_backoff_then_gives_up(self):
        client = LeaseClient(f"http://127.0.0.1:{closed_port()}", token="", retry_for=10, sleep=self.time.sleep, clock=self.time.clock)
        with self.assertRaises(ApiUnreachable):
            client.release("lease-1")
        self.assertEqual(self.time.slept[:4], [0.25, 0.5, 1.0, 2.0])
        self.assertLessEqual(sum(self.time.slept), 10)

    def test_every_call_has_a_timeout(self):
        self.api.script = [("hang", {}, None)]
        started = time.monotonic()
        with self.assertRaises(ApiUnreachable):
            LeaseClient(self.api.url, token="", timeout=0.3, retry_for=0).lease()
        self.assertLess(time.monotonic() - started, 1.5)

    def test_renew_and_report_of_an_ended_lease_raise_lease_not_found(self):
        gone = (404, {}, {"error": {"code": "not_found", "message": "lease not found or expired"}})
        self.api.script = [gone, gone]
        with self.assertRaises(LeaseNotFound):
            self.client().renew("lease-1")
        with self.assertRaises(LeaseNotFound):
            self.client().report("lease-1", "blocked")

    def test_leased_releases_when_the_block_raises(self):
        self.api.script = [(201, {}, GRANT), (204, {}, None)]
        with self.assertRaises(RuntimeError):
            with self.client().leased(target="shop.example"):
                raise RuntimeError("the fetch failed")
        self.assertEqual([(m, p) for m, p, _, _ in self.api.seen], [("POST", "/v1/leases"), ("DELETE", "/v1/leases/lease-1")])

    def test_leased_does_not_release_twice_after_a_releasing_report(self):
        self.api.script = [(201, {}, GRANT), (200, {}, {"id": "lease-1", "released": True})]
        with self.client().leased(target="shop.example") as lease:
            lease.report("blocked", cooldown=60)
        self.assertEqual([p for _, p, _, _ in self.api.seen], ["/v1/leases", "/v1/leases/lease-1/report"])
        self.assertEqual(self.api.seen[1][3], {"result": "blocked", "cooldownSeconds": 60, "release": True})

    def test_report_by_proxy_and_target(self):
        self.api.script = [(200, {}, {"proxy": {"namespace": "crawl", "name": "eu-1"}, "target": "shop.example", "result": "blocked"})]
        self.client().report_proxy("crawl", "eu-1", "blocked", target="shop.example")
        self.assertEqual(
            self.api.seen[0][1:4:2],
            ("/v1/reports", {"proxy": {"namespace": "crawl", "name": "eu-1"}, "target": "shop.example", "result": "blocked"}),
        )
        with self.assertRaises(ValueError):
            self.client().report("lease-1", "banned")


if __name__ == "__main__":
    unittest.main()
