"""egress_proxies.client — a blocking client for the lease API (docs/lease-api.md), standard library only.

Every call has a timeout; while the API cannot be reached (an operator restart, a leader
election answering 503 `no_leader`) calls are retried with capped exponential backoff for up to
`retry_for` seconds. `leased()` is a context manager that always releases its lease, and can
wait for a proxy until the `retryAt` the API announces.
"""

import contextlib
import datetime
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from .outcome import backoff_delays, retry_after_seconds

RESULTS = ("success", "blocked", "failed")


class DiscoveryError(Exception):
    """Any non-success answer of the API (status 0: no answer at all)."""

    def __init__(self, status: int, code: str, message: str, field_name: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field_name


class ApiUnreachable(DiscoveryError):
    """No answer, or one that says to come back (503, 502, 504); `retry_after` in seconds if given."""

    def __init__(self, message: str, status: int = 0, retry_after: Optional[float] = None):
        super().__init__(status, "unreachable", message)
        self.retry_after = retry_after


class NoneLeasable(DiscoveryError):
    """409: nothing leasable now. `retry_at` (epoch seconds) is when something may be; None: nothing will."""

    def __init__(self, message: str, counts: Dict[str, int], retry_at: Optional[float], retry_after: Optional[float]):
        super().__init__(409, "none_leasable", message)
        self.counts = counts
        self.retry_at = retry_at
        self.retry_after = retry_after


class LeaseNotFound(DiscoveryError):
    """404 on renew or report: the lease ended too long ago, or never existed. Take a new one."""


def parse_time(value: Optional[str]) -> Optional[float]:
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
    target: Optional[str]
    expires_at: float
    client: "LeaseClient" = field(repr=False, compare=False)
    ended: bool = field(default=False, compare=False)

    @property
    def proxy(self) -> str:
        """`namespace/name` of the proxy."""
        return f"{self.namespace}/{self.name}"

    @property
    def proxies(self) -> Dict[str, str]:
        """The `proxies=` mapping of requests / urllib for this lease."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def report(self, result: str, cooldown: Optional[int] = None, release: bool = True) -> None:
        self.client.report(self.id, result, cooldown=cooldown, release=release)
        if release:
            self.ended = True

    def release(self) -> None:
        if not self.ended:
            self.client.release(self.id)
            self.ended = True


Transport = Callable[[urllib.request.Request, float], Tuple[int, Dict[str, str], bytes]]


def _urllib_transport(req: urllib.request.Request, timeout: float) -> Tuple[int, Dict[str, str], bytes]:
    # The API is never reached through an HTTP proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as res:
            return res.status, dict(res.headers.items()), res.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers.items()), err.read()


class LeaseClient:
    """
    base_url: the discovery API, e.g. http://127.0.0.1:8090. token: the operator's
    DISCOVERY_TOKEN (default: that environment variable; None or empty = no auth header).
    timeout: seconds per HTTP call. retry_for: how long to keep retrying an unreachable API
    (0 = one attempt).
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        timeout: float = 10.0,
        retry_for: float = 60.0,
        transport: Optional[Transport] = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.base_url = base_url.rstrip("/")
        tok = token if token is not None else os.environ.get("DISCOVERY_TOKEN")
        self.token = tok.strip() if tok and tok.strip() else None
        self.timeout = timeout
        self.retry_for = retry_for
        self._transport = transport or _urllib_transport
        self._sleep = sleep
        self._clock = clock

    # ---- the API ----

    def lease(
        self,
        target: Optional[str] = None,
        selector: Optional[str] = None,
        namespace: Optional[str] = None,
        ttl: Optional[int] = None,
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

    def renew(self, lease_id: str, ttl: Optional[int] = None) -> float:
        """The new expiry (epoch seconds). Raises LeaseNotFound when the lease has ended."""
        body = _without_none({"ttlSeconds": ttl})
        return parse_time(self.call("POST", f"/v1/leases/{_quote(lease_id)}/renew", body)["expiresAt"]) or 0.0

    def release(self, lease_id: str) -> None:
        """Idempotent."""
        self.call("DELETE", f"/v1/leases/{_quote(lease_id)}")

    def report(self, lease_id: str, result: str, cooldown: Optional[int] = None, release: bool = True) -> None:
        """Also accepted up to 15 minutes after the lease ended (a late or shared report)."""
        _check_result(result)
        body = _without_none({"result": result, "cooldownSeconds": cooldown, "release": release})
        self.call("POST", f"/v1/leases/{_quote(lease_id)}/report", body)

    def report_proxy(
        self, namespace: str, name: str, result: str, target: Optional[str] = None, cooldown: Optional[int] = None
    ) -> None:
        """A report by proxy and target, without a lease; idempotent, releases nothing."""
        _check_result(result)
        body = _without_none(
            {"proxy": {"namespace": namespace, "name": name}, "target": target, "result": result, "cooldownSeconds": cooldown}
        )
        self.call("POST", "/v1/reports", body)

    def proxies(self, target: Optional[str] = None, selector: Optional[str] = None, namespace: Optional[str] = None) -> list:
        q = urllib.parse.urlencode(_without_none({"target": target, "selector": selector, "namespace": namespace}))
        return self.call("GET", "/v1/proxies" + (f"?{q}" if q else ""))["proxies"]

    @contextlib.contextmanager
    def leased(
        self,
        target: Optional[str] = None,
        selector: Optional[str] = None,
        namespace: Optional[str] = None,
        ttl: Optional[int] = None,
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

    def lease_waiting(self, target=None, selector=None, namespace=None, ttl=None, wait: float = 0.0) -> Lease:
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

    def call(self, method: str, path: str, body: Optional[dict] = None) -> Any:
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

    def call_once(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            status, res_headers, raw = self._transport(req, self.timeout)
        except (urllib.error.URLError, OSError, socket.timeout, ConnectionError) as err:
            raise ApiUnreachable(f"{method} {path}: {getattr(err, 'reason', err)}") from err
        return _answer(method, path, status, res_headers, raw)


def wait_for_retry(refused: NoneLeasable, now: float) -> Optional[float]:
    """Seconds to wait before leasing again after a 409, or None when nothing will become leasable."""
    if refused.retry_at is not None:
        return max(0.05, refused.retry_at - now)
    return None


def _answer(method: str, path: str, status: int, headers: Dict[str, str], raw: bytes) -> Any:
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
    if status == 409 and err.get("code") == "none_leasable":
        counts = {k: v for k, v in payload.items() if isinstance(v, int)}
        raise NoneLeasable(message, counts, parse_time(payload.get("retryAt")), retry_after)
    if status in (502, 503, 504):
        raise ApiUnreachable(message, status, retry_after)
    if status == 404 and path.startswith("/v1/leases/"):
        raise LeaseNotFound(404, "not_found", message)
    raise DiscoveryError(status, err.get("code") or "http_error", message, err.get("field"))


def _without_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def _quote(lease_id: str) -> str:
    return urllib.parse.quote(lease_id, safe="")


def _check_result(result: str) -> None:
    if result not in RESULTS:
        raise ValueError(f"result must be one of {', '.join(RESULTS)}, not {result!r}")
