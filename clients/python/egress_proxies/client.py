"""egress_proxies.client — a blocking client for the lease API (docs/lease-api.md), standard library only.

Every call has a timeout; while the API cannot be reached (an operator restart, a leader
election answering 503 `no_leader`) calls are retried with capped exponential backoff for up to
`retry_for` seconds. `leased()` is a context manager that always releases its lease, and can
wait for a proxy until the `retryAt` the API announces. Calls reuse keep-alive connections
(`_Connections`): a crawler's lease, report and release cost no TCP handshake each.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from .outcome import backoff_delays, retry_after_seconds

RESULTS = ("success", "blocked", "failed")
# Proxies per GET /v1/proxies page when listing (the API allows 1-10,000).
PAGE_SIZE = 1000


class DiscoveryError(Exception):
    """Any non-success answer of the API (status 0: no answer at all)."""

    def __init__(self, status: int, code: str, message: str, field_name: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field_name


class ApiUnreachable(DiscoveryError):
    """No answer, or one that says to come back (503, 502, 504); `retry_after` in seconds if given."""

    def __init__(self, message: str, status: int = 0, retry_after: float | None = None):
        super().__init__(status, "unreachable", message)
        self.retry_after = retry_after


class NoneLeasable(DiscoveryError):
    """409: nothing leasable now. `retry_at` (epoch seconds) is when something may be; None: nothing will."""

    def __init__(self, message: str, counts: dict[str, int], retry_at: float | None, retry_after: float | None):
        super().__init__(409, "none_leasable", message)
        self.counts = counts
        self.retry_at = retry_at
        self.retry_after = retry_after


class LeaseNotFound(DiscoveryError):
    """404 on renew or report: the lease ended too long ago, or never existed. Take a new one."""


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 time from the API as epoch seconds."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class Lease:
    id: str
    proxy_url: str
    namespace: str
    name: str
    host: str
    port: int
    target: str | None
    expires_at: float
    client: LeaseClient = field(repr=False, compare=False)
    ended: bool = field(default=False, compare=False)

    @property
    def proxy(self) -> str:
        """`namespace/name` of the proxy."""
        return f"{self.namespace}/{self.name}"

    @property
    def proxies(self) -> dict[str, str]:
        """The `proxies=` mapping of requests / urllib for this lease."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def report(self, result: str, cooldown: int | None = None, release: bool = True) -> None:
        self.client.report(self.id, result, cooldown=cooldown, release=release)
        if release:
            self.ended = True

    def release(self) -> None:
        if not self.ended:
            self.client.release(self.id)
            self.ended = True


# A connection that failed at once when reused was most likely closed by the server while idle
# (before it read the request): the call is sent again once on a new connection.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
# Idle connections kept per client: as many as callers run at once (the middleware's threads).
_MAX_IDLE = 8


class _Connections:
    """
    Keep-alive HTTP connections to the API. A call borrows an idle connection (or opens one) and
    gives it back once the whole answer is read, so calls one after another share one TCP
    connection and calls at once (the Scrapy middleware's thread pool) one each. The API is
    never reached through a proxy from the environment.
    """

    def __init__(self, base_url: str):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        conn, reused = self._take(timeout)
        try:
            return self._exchange(conn, method, path, body, headers)
        except _STALE:
            if not reused:
                raise
        conn, _ = self._take(timeout, fresh=True)
        return self._exchange(conn, method, path, body, headers)

    def _exchange(
        self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            conn.request(method, self.prefix + path, body=body, headers=headers)
            res = conn.getresponse()
            raw = res.read()
        except BaseException:
            conn.close()
            raise
        if res.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return res.status, dict(res.getheaders()), raw

    def _take(self, timeout: float, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        if not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is not None:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                return conn, True
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class LeaseClient:
    """
    base_url: the discovery API, e.g. http://127.0.0.1:8090. token: the operator's
    DISCOVERY_TOKEN (default: that environment variable; None or empty = no auth header).
    timeout: seconds per HTTP call. retry_for: how long to keep retrying an unreachable API
    (0 = one attempt). Safe to share between threads; `close()` (or a `with` block) closes its
    idle connections.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 10.0,
        retry_for: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.base_url = base_url.rstrip("/")
        tok = token if token is not None else os.environ.get("DISCOVERY_TOKEN")
        self.token = tok.strip() if tok and tok.strip() else None
        self.timeout = timeout
        self.retry_for = retry_for
        self._connections = _Connections(self.base_url)
        self._sleep = sleep
        self._clock = clock

    def close(self) -> None:
        """Closes the idle connections; a later call opens a new one."""
        self._connections.close()

    def __enter__(self) -> LeaseClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ---- the API ----

    def lease(
        self,
        target: str | None = None,
        selector: str | None = None,
        namespace: str | None = None,
        ttl: int | None = None,
    ) -> Lease:
        """Raises NoneLeasable (409) when nothing is leasable now."""
        body = _without_none({"target": target, "selector": selector, "namespace": namespace, "ttlSeconds": ttl})
        g = self.call("POST", "/v1/leases", body)
        p = g["proxy"]
        return Lease(
            id=g["id"],
            proxy_url=p["url"],
            namespace=p["namespace"],
            name=p["name"],
            host=p["host"],
            port=p["port"],
            target=g.get("target"),
            expires_at=parse_time(g["expiresAt"]) or 0.0,
            client=self,
        )

    def renew(self, lease_id: str, ttl: int | None = None) -> float:
        """The new expiry (epoch seconds). Raises LeaseNotFound when the lease has ended."""
        body = _without_none({"ttlSeconds": ttl})
        return parse_time(self.call("POST", f"/v1/leases/{_quote(lease_id)}/renew", body)["expiresAt"]) or 0.0

    def release(self, lease_id: str) -> None:
        """Idempotent."""
        self.call("DELETE", f"/v1/leases/{_quote(lease_id)}")

    def report(self, lease_id: str, result: str, cooldown: int | None = None, release: bool = True) -> None:
        """Also accepted up to 15 minutes after the lease ended (a late or shared report)."""
        _check_result(result)
        body = _without_none({"result": result, "cooldownSeconds": cooldown, "release": release})
        self.call("POST", f"/v1/leases/{_quote(lease_id)}/report", body)

    def report_proxy(
        self, namespace: str, name: str, result: str, target: str | None = None, cooldown: int | None = None
    ) -> None:
        """A report by proxy and target, without a lease; idempotent, releases nothing."""
        _check_result(result)
        body = _without_none(
            {
                "proxy": {"namespace": namespace, "name": name},
                "target": target,
                "result": result,
                "cooldownSeconds": cooldown,
            }
        )
        self.call("POST", "/v1/reports", body)

    def proxies(
        self, target: str | None = None, selector: str | None = None, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Every proxy the filters select, read a page of PAGE_SIZE at a time (pages cut by name).

        An API without paging answers the whole fleet in the first page and no ``continue``.
        """
        filters = _without_none({"target": target, "selector": selector, "namespace": namespace})
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            q = urllib.parse.urlencode({**filters, "limit": PAGE_SIZE, **({"continue": cursor} if cursor else {})})
            page = self.call("GET", f"/v1/proxies?{q}")
            found.extend(page["proxies"])
            cursor = page.get("continue")
            if not cursor:
                return found

    @contextlib.contextmanager
    def leased(
        self,
        target: str | None = None,
        selector: str | None = None,
        namespace: str | None = None,
        ttl: int | None = None,
        wait: float = 0.0,
    ) -> Iterator[Lease]:
        """
        A lease for the `with` block, released when it ends however it ends (a report inside
        the block that released it is not released twice). `wait`: seconds to wait for a proxy
        when none is leasable, following the API's `retryAt`; NoneLeasable after that.
        """
        lease = self.lease_waiting(target, selector, namespace, ttl, wait)
        try:
            yield lease
        finally:
            lease.release()

    def lease_waiting(
        self,
        target: str | None = None,
        selector: str | None = None,
        namespace: str | None = None,
        ttl: int | None = None,
        wait: float = 0.0,
    ) -> Lease:
        """lease(), retried until `retryAt` while that is within `wait` seconds from the first try."""
        deadline = self._clock() + wait
        while True:
            try:
                return self.lease(target, selector, namespace, ttl)
            except NoneLeasable as refused:
                delay = wait_for_retry(refused, self._clock())
                if delay is None or self._clock() + delay > deadline:
                    raise
                self._sleep(delay)

    # ---- transport ----

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call, retried while the API is unreachable (up to `retry_for` seconds)."""
        deadline = self._clock() + self.retry_for
        delays = backoff_delays()
        while True:
            try:
                return self.call_once(method, path, body)
            except ApiUnreachable as err:
                delay = max(next(delays), err.retry_after or 0.0)
                if self._clock() + delay > deadline:
                    raise
                self._sleep(delay)

    def call_once(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            status, res_headers, raw = self._connections.request(method, path, data, headers, self.timeout)
        except (OSError, http.client.HTTPException) as err:
            raise ApiUnreachable(f"{method} {path}: {err or type(err).__name__}") from err
        return _answer(method, path, status, res_headers, raw)


def wait_for_retry(refused: NoneLeasable, now: float) -> float | None:
    """Seconds to wait before leasing again after a 409, or None when nothing will become leasable."""
    if refused.retry_at is not None:
        return max(0.05, refused.retry_at - now)
    return None


def _answer(method: str, path: str, status: int, headers: dict[str, str], raw: bytes) -> Any:
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        payload = None
    if 200 <= status < 300:
        return payload
    err = (payload.get("error") or {}) if isinstance(payload, dict) else {}
    message = err.get("message") or f"{method} {path}: HTTP {status}"
    retry_after = retry_after_seconds(lower.get("retry-after"))
    if status == 409 and err.get("code") == "none_leasable" and isinstance(payload, dict):
        counts = {k: v for k, v in payload.items() if isinstance(v, int)}
        raise NoneLeasable(message, counts, parse_time(payload.get("retryAt")), retry_after)
    if status in (502, 503, 504):
        raise ApiUnreachable(message, status, retry_after)
    if status == 404 and path.startswith("/v1/leases/"):
        raise LeaseNotFound(404, "not_found", message)
    raise DiscoveryError(status, err.get("code") or "http_error", message, err.get("field"))


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _quote(lease_id: str) -> str:
    return urllib.parse.quote(lease_id, safe="")


def _check_result(result: str) -> None:
    if result not in RESULTS:
        raise ValueError(f"result must be one of {', '.join(RESULTS)}, not {result!r}")
