"""LeaseClient against a scripted lease API on loopback: auth, errors, retries, the context manager,
and keep-alive connections (the server counts the TCP connections it accepted)."""

import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import pytest

from egress_proxies import ApiUnreachable, LeaseClient, LeaseNotFound, NoneLeasable

GRANT: dict[str, Any] = {
    "id": "lease-1",
    "proxy": {
        "namespace": "crawl",
        "name": "eu-1",
        "url": "http://u:p@127.0.0.1:3128",
        "host": "127.0.0.1",
        "port": 3128,
    },
    "target": "shop.example",
    "expiresAt": "2026-12-02T10:05:00.000Z",
}
REFUSAL: dict[str, Any] = {
    "error": {"code": "none_leasable", "message": "no proxy is leasable: ..."},
    "matching": 3,
    "ready": 3,
    "healthy": 3,
    "draining": 0,
    "coolingDown": 0,
    "coolingDownForTarget": 3,
    "atCapacity": 0,
    "retryAt": "2026-12-02T10:00:30.000Z",
}


class ScriptedApi:
    """Answers each request with the next scripted (status, headers, body); records what came in."""

    def __init__(self) -> None:
        self.script: list[tuple[int | str, dict[str, str], Any]] = []
        self.seen: list[tuple[str, str, dict[str, str], Any]] = []
        # TCP connections accepted, and whether to drop each one silently after its answer (as
        # a server does with an idle keep-alive connection).
        self.connections = 0
        self.drop_after_answer = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                api.connections += 1
                super().setup()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                api.seen.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = api.script.pop(0) if api.script else (204, {}, None)
                if not isinstance(status, int):  # "hang": no answer within the client's timeout
                    time.sleep(2)
                    return
                raw = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                if api.drop_after_answer:
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


class FakeTime:
    """sleep() advances clock() at once, so retry schedules run without waiting."""

    def __init__(self) -> None:
        self.now = 1796205600.0  # 2026-12-02T10:00:00Z
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def api() -> Iterator[ScriptedApi]:
    server = ScriptedApi()
    yield server
    server.close()


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def client(api: ScriptedApi, fake_time: FakeTime) -> Iterator[Callable[..., LeaseClient]]:
    """A LeaseClient factory for the scripted API whose waits take no time."""

    def make(**kw: Any) -> LeaseClient:
        kw.setdefault("token", "")
        made = LeaseClient(api.url, sleep=fake_time.sleep, clock=fake_time.clock, **kw)
        clients.append(made)
        return made

    clients: list[LeaseClient] = []
    yield make
    for c in clients:
        c.close()


def test_sends_the_token_when_there_is_one_and_no_header_otherwise(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    api.script = [(201, {}, GRANT), (201, {}, GRANT)]
    client(token=" s3cret\n").lease(target="https://shop.example/x")
    with mock.patch.dict(os.environ, {}, clear=True):
        client(token=None).lease()
    assert api.seen[0][2].get("Authorization") == "Bearer s3cret"
    assert "Authorization" not in api.seen[1][2]
    assert api.seen[0][3] == {"target": "https://shop.example/x"}


def test_a_grant_becomes_a_lease(api: ScriptedApi, client: Callable[..., LeaseClient]) -> None:
    api.script = [(201, {}, GRANT)]
    lease = client().lease(target="shop.example", selector="pool=eu", ttl=120)
    assert (lease.id, lease.proxy, lease.target) == ("lease-1", "crawl/eu-1", "shop.example")
    assert lease.proxies == {"http": GRANT["proxy"]["url"], "https": GRANT["proxy"]["url"]}
    assert lease.expires_at == 1796205900.0
    assert api.seen[0][3] == {"target": "shop.example", "selector": "pool=eu", "ttlSeconds": 120}


def test_a_409_says_why_and_when_to_come_back(api: ScriptedApi, client: Callable[..., LeaseClient]) -> None:
    api.script = [(409, {"Retry-After": "30"}, REFUSAL)]
    with pytest.raises(NoneLeasable) as caught:
        client().lease(target="shop.example")
    assert caught.value.counts["coolingDownForTarget"] == 3
    assert caught.value.retry_at == 1796205630.0
    assert caught.value.retry_after == 30.0


def test_lease_waiting_sleeps_until_retry_at_then_leases(
    api: ScriptedApi, client: Callable[..., LeaseClient], fake_time: FakeTime
) -> None:
    api.script = [(409, {"Retry-After": "30"}, REFUSAL), (201, {}, GRANT)]
    lease = client().lease_waiting(target="shop.example", wait=60)
    assert lease.id == "lease-1"
    assert fake_time.slept == [30.0]


def test_lease_waiting_gives_up_when_retry_at_is_beyond_the_wait_or_absent(
    api: ScriptedApi, client: Callable[..., LeaseClient], fake_time: FakeTime
) -> None:
    api.script = [(409, {}, REFUSAL), (409, {}, {**REFUSAL, "retryAt": None})]
    with pytest.raises(NoneLeasable):
        client().lease_waiting(wait=10)
    with pytest.raises(NoneLeasable):
        client().lease_waiting(wait=600)
    assert fake_time.slept == []


def test_retries_while_the_api_has_no_leader_honouring_retry_after(
    api: ScriptedApi, client: Callable[..., LeaseClient], fake_time: FakeTime
) -> None:
    no_leader = (503, {"Retry-After": "1"}, {"error": {"code": "no_leader", "message": "retry shortly"}})
    api.script = [no_leader, no_leader, (201, {}, GRANT)]
    assert client().lease().id == "lease-1"
    assert len(api.seen) == 3
    assert all(s >= 1.0 for s in fake_time.slept), fake_time.slept


def test_retries_an_unreachable_api_with_backoff_then_gives_up(fake_time: FakeTime) -> None:
    client = LeaseClient(
        f"http://127.0.0.1:{closed_port()}", token="", retry_for=10, sleep=fake_time.sleep, clock=fake_time.clock
    )
    with pytest.raises(ApiUnreachable):
        client.release("lease-1")
    assert fake_time.slept[:4] == [0.25, 0.5, 1.0, 2.0]
    assert sum(fake_time.slept) <= 10


def test_every_call_has_a_timeout(api: ScriptedApi) -> None:
    api.script = [("hang", {}, None)]
    started = time.monotonic()
    with pytest.raises(ApiUnreachable):
        LeaseClient(api.url, token="", timeout=0.3, retry_for=0).lease()
    assert time.monotonic() - started < 1.5


def test_renew_and_report_of_an_ended_lease_raise_lease_not_found(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    gone: tuple[int, dict[str, str], Any] = (
        404,
        {},
        {"error": {"code": "not_found", "message": "lease not found or expired"}},
    )
    api.script = [gone, gone]
    with pytest.raises(LeaseNotFound):
        client().renew("lease-1")
    with pytest.raises(LeaseNotFound):
        client().report("lease-1", "blocked")


def test_leased_releases_when_the_block_raises(api: ScriptedApi, client: Callable[..., LeaseClient]) -> None:
    api.script = [(201, {}, GRANT), (204, {}, None)]
    with pytest.raises(RuntimeError), client().leased(target="shop.example"):
        raise RuntimeError("the fetch failed")
    assert [(m, p) for m, p, _, _ in api.seen] == [("POST", "/v1/leases"), ("DELETE", "/v1/leases/lease-1")]


def test_leased_does_not_release_twice_after_a_releasing_report(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    api.script = [(201, {}, GRANT), (200, {}, {"id": "lease-1", "released": True})]
    with client().leased(target="shop.example") as lease:
        lease.report("blocked", cooldown=60)
    assert [p for _, p, _, _ in api.seen] == ["/v1/leases", "/v1/leases/lease-1/report"]
    assert api.seen[1][3] == {"result": "blocked", "cooldownSeconds": 60, "release": True}


def test_report_by_proxy_and_target(api: ScriptedApi, client: Callable[..., LeaseClient]) -> None:
    api.script = [
        (200, {}, {"proxy": {"namespace": "crawl", "name": "eu-1"}, "target": "shop.example", "result": "blocked"})
    ]
    client().report_proxy("crawl", "eu-1", "blocked", target="shop.example")
    assert api.seen[0][1:4:2] == (
        "/v1/reports",
        {"proxy": {"namespace": "crawl", "name": "eu-1"}, "target": "shop.example", "result": "blocked"},
    )
    with pytest.raises(ValueError):
        client().report("lease-1", "banned")


def test_calls_one_after_another_share_one_keep_alive_connection(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    renewed = {"id": "lease-1", "expiresAt": "2026-12-02T10:10:00.000Z"}
    api.script = [(201, {}, GRANT), (200, {}, renewed), (200, {}, {"result": "blocked"}), (204, {}, None)]
    c = client()
    lease = c.lease(target="shop.example")
    c.renew(lease.id, ttl=600)
    lease.report("blocked", release=False)
    lease.release()
    assert [m for m, _, _, _ in api.seen] == ["POST", "POST", "POST", "DELETE"]
    assert api.connections == 1


def test_a_keep_alive_connection_the_server_dropped_is_replaced_without_sending_twice(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    # The server closes each connection after answering, without saying so (an idle timeout).
    api.drop_after_answer = True
    api.script = [(201, {}, GRANT), (204, {}, None)]
    c = client(retry_for=0)
    lease = c.lease()
    lease.release()
    assert [(m, p) for m, p, _, _ in api.seen] == [("POST", "/v1/leases"), ("DELETE", "/v1/leases/lease-1")]
    assert api.connections == 2


def test_calls_at_once_use_one_connection_each_and_reuse_them(
    api: ScriptedApi, client: Callable[..., LeaseClient]
) -> None:
    c = client()
    start = threading.Barrier(4)

    def releases() -> None:
        start.wait()
        for n in range(10):
            c.release(f"lease-{n}")

    workers = [threading.Thread(target=releases) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(api.seen) == 40
    assert 1 <= api.connections <= 4


def test_proxies_reads_every_page_with_the_same_filters(api: ScriptedApi, client: Callable[..., LeaseClient]) -> None:
    first = [{"namespace": "crawl", "name": f"eu-{i}"} for i in range(2)]
    api.script = [
        (200, {}, {"proxies": first, "continue": "crawl/eu-1"}),
        (200, {}, {"proxies": [{"namespace": "crawl", "name": "eu-2"}]}),
    ]
    listed = client().proxies(target="shop.example", selector="pool=eu")
    assert [p["name"] for p in listed] == ["eu-0", "eu-1", "eu-2"]
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query) for _, path, _, _ in api.seen]
    assert [q.get("continue") for q in queries] == [None, ["crawl/eu-1"]]
    for q in queries:
        assert q["target"] == ["shop.example"] and q["selector"] == ["pool=eu"] and q["limit"] == ["1000"]
