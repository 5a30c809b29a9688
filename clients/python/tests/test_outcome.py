"""What a crawler reports for each way a fetch through a leased proxy can end (docs/lease-api.md).

The cases are the repository's one table, clients/outcome-cases.json, which the TypeScript
helpers' tests run too (test/unit/crawler/outcome-cases.test.ts): both implementations must
agree on every case.
"""

from __future__ import annotations

import datetime
import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from egress_proxies.outcome import (
    PROXY_FAULT,
    UNKNOWN,
    backoff_delays,
    classify_exception,
    header_getter,
    retry_after_seconds,
    status_fault,
    tunnel_status,
)

CASES: dict[str, Any] = json.loads((Path(__file__).resolve().parents[2] / "outcome-cases.json").read_text())


def _id(case: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in case.items() if k != "fault"}, separators=(",", ":"))


@pytest.mark.parametrize("case", CASES["status"], ids=_id)
def test_status(case: dict[str, Any]) -> None:
    assert status_fault(case["status"], case["proxyError"], connect=case["connect"]) == case["fault"]


@pytest.mark.parametrize("case", CASES["tunnel"], ids=_id)
def test_tunnel_refusal_read_from_the_clients_message(case: dict[str, Any]) -> None:
    assert tunnel_status(case["message"]) == case["status"]
    assert classify_exception(Exception(case["message"])) == case["fault"]


def _named(name: str) -> type[Exception]:
    """An exception class of that name: the classification goes by names (Twisted's, the standard
    library's), so neither Twisted nor a network is needed here."""
    return type(name, (Exception,), {})


@pytest.mark.parametrize("case", CASES["connectErrors"], ids=_id)
def test_connect_errors(case: dict[str, Any]) -> None:
    err: BaseException = _named(case["python"])("connecting to the proxy")
    if case["wrapped"]:
        outer = Exception("the client's own error")
        outer.__cause__ = err
        err = outer
    assert classify_exception(err) == case["fault"]


@pytest.mark.parametrize("case", CASES["retryAfter"], ids=_id)
def test_retry_after(case: dict[str, Any]) -> None:
    now = datetime.datetime.fromisoformat(case["now"].replace("Z", "+00:00")).timestamp()
    assert retry_after_seconds(case["value"], now=now) == case["seconds"]


def test_the_standard_librarys_own_errors() -> None:
    refused = ConnectionRefusedError(111, "refused")
    assert classify_exception(refused) == PROXY_FAULT
    assert classify_exception(urllib.error.URLError(refused)) == PROXY_FAULT
    assert classify_exception(TimeoutError("read timed out")) == UNKNOWN


def test_backoff_doubles_up_to_the_cap() -> None:
    it = backoff_delays(first=0.5, cap=3.0)
    assert [next(it) for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_headers_are_read_case_insensitively_from_bytes_too() -> None:
    class ScrapyLikeHeaders(dict[bytes, bytes]):
        def get(self, key: object, default: object = None) -> Any:
            return super().get(key.lower()) if isinstance(key, bytes) else None

    get = header_getter(ScrapyLikeHeaders({b"x-proxy-error": b"origin-timeout"}))
    assert get("X-Proxy-Error") == "origin-timeout"
    assert header_getter({})("Retry-After") is None
