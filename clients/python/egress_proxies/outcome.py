"""egress_proxies.outcome — whose fault a fetch through a leased proxy was, and what to report.

Pure functions, shared by the lease client's users and the Scrapy middleware. The rules are the
table "What to report" in docs/lease-api.md: only a proxy that cannot be reached or talked to is
`failed`; an answer from the proxy about the origin (marked `X-Proxy-Error`, or a 5xx to a
CONNECT) is the origin's fault; a 407 means the lease ended; the site's own refusals are
`blocked`. The cases both this module and its TypeScript twin (src/crawler/outcome.ts) must
pass are one table, clients/outcome-cases.json in the repository.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Callable, Iterator

PROXY_ERROR_HEADER = "X-Proxy-Error"

# What an answer means for the proxy and the lease.
PROXY_FAULT = "proxy"  # report `failed`: the proxy could not be reached or broke the protocol
ORIGIN_FAULT = "origin"  # report nothing: the proxy works, the site did not answer
LEASE_ENDED = "lease"  # 407: the lease (or the proxy's credentials) ended; take a new lease
DENIED = "denied"  # the egress policy refused the destination; no proxy will reach it
UNKNOWN = "unknown"  # a timeout or cut after the proxy accepted: cannot tell, report nothing

# Exceptions raised when the TCP connection *to the proxy* fails (Twisted's and the standard
# library's names): through a proxy, every connection a client opens goes to the proxy.
_PROXY_CONNECT_ERRORS = {
    "ConnectionRefusedError",
    "ConnectError",
    "TCPTimedOutError",
    "NoRouteError",
    "DNSLookupError",
    "ConnectBindError",
    "UnknownHostError",
    "ConnectTimeoutError",
    "NewConnectionError",
}
# A CONNECT the proxy refused: Scrapy's TunnelError carries "{'status': 502, ...}", requests'
# ProxyError "Tunnel connection failed: 502 Bad Gateway", undici's "Proxy response (502) !== 200".
_TUNNEL_STATUS = re.compile(r"'status': (\d{3})|Tunnel connection failed: (\d{3})|Proxy response \((\d{3})\)")


def tunnel_status(message: str) -> int | None:
    """The status a proxy answered a CONNECT with, read from a client's error message."""
    m = _TUNNEL_STATUS.search(message)
    if not m:
        return None
    return int(m.group(1) or m.group(2) or m.group(3))


def status_fault(status: int, proxy_error: str | None = None, connect: bool = False) -> str | None:
    """
    What an HTTP status from the proxy's side means, or None when it is the origin's own answer.
    `proxy_error` is the X-Proxy-Error header (plain HTTP through the proxy); a CONNECT refusal
    shows no headers to most clients, so `connect=True` reads the status alone.
    """
    if status == 407:
        return LEASE_ENDED
    if proxy_error:
        return DENIED if proxy_error == "egress-denied" else ORIGIN_FAULT
    if connect:
        if status == 403:
            return DENIED
        if 500 <= status <= 599:
            return ORIGIN_FAULT
        return PROXY_FAULT
    return None


def classify_exception(exc: BaseException) -> str:
    """PROXY_FAULT, ORIGIN_FAULT, LEASE_ENDED, DENIED or UNKNOWN for an exception of a fetch."""
    status = tunnel_status(str(exc))
    if status is not None:
        return status_fault(status, connect=True) or UNKNOWN
    for cause in _causes(exc):
        if {c.__name__ for c in type(cause).__mro__} & _PROXY_CONNECT_ERRORS:
            return PROXY_FAULT
    return UNKNOWN


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps (requests wraps urllib3's error, which wraps the socket's)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        wrapped = [cur.__cause__, cur.__context__, getattr(cur, "reason", None), *cur.args]
        todo.extend(w for w in wrapped if isinstance(w, BaseException))


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (delta-seconds or an HTTP date) as seconds from now, or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delays(first: float = 0.25, cap: float = 5.0, factor: float = 2.0) -> Iterator[float]:
    """first, first*factor, … capped at `cap`, forever: the waits between retries of the API."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * factor)


def header_getter(headers: object) -> Callable[[str], str | None]:
    """A case-insensitive `get` over a dict, an http.client message or Scrapy's Headers."""

    def get(name: str) -> str | None:
        getter = getattr(headers, "get", None)
        if getter is None:
            return None
        for key in (name, name.lower(), name.encode("latin-1"), name.lower().encode("latin-1")):
            try:
                v = getter(key)
            except (TypeError, KeyError):
                continue
            if v is not None:
                return v.decode("latin-1") if isinstance(v, bytes) else str(v)
        return None

    return get
