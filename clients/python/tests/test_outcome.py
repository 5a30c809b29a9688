"""What a crawler reports for each way a fetch through a leased proxy can end (docs/lease-api.md)."""

import socket
import unittest
import urllib.error

from egress_proxies.outcome import (
    DENIED,
    LEASE_ENDED,
    ORIGIN_FAULT,
    PROXY_FAULT,
    UNKNOWN,
    backoff_delays,
    classify_exception,
    header_getter,
    retry_after_seconds,
    status_fault,
    tunnel_status,
)


class TunnelError(Exception):
    """Named like Scrapy's: the classification goes by names, so no Scrapy is needed here."""


class ConnectionLost(Exception):
    pass


class ProxyError(Exception):
    """Named like requests' ProxyError."""


class StatusFaultTest(unittest.TestCase):
    def test_the_origins_own_answers_are_not_the_proxys(self):
        for status in (200, 403, 429, 500, 502, 503):
            self.assertIsNone(status_fault(status))

    def test_marked_answers_are_the_origins_fault_or_a_denial(self):
        self.assertEqual(status_fault(502, "origin-unreachable"), ORIGIN_FAULT)
        self.assertEqual(status_fault(504, "origin-timeout"), ORIGIN_FAULT)
        self.assertEqual(status_fault(403, "egress-denied"), DENIED)

    def test_407_means_the_lease_ended(self):
        self.assertEqual(status_fault(407), LEASE_ENDED)
        self.assertEqual(status_fault(407, connect=True), LEASE_ENDED)

    def test_a_refused_connect_reads_the_status_alone(self):
        self.assertEqual(status_fault(502, connect=True), ORIGIN_FAULT)
        self.assertEqual(status_fault(503, connect=True), ORIGIN_FAULT)
        self.assertEqual(status_fault(403, connect=True), DENIED)
        self.assertEqual(status_fault(400, connect=True), PROXY_FAULT)


class ClassifyExceptionTest(unittest.TestCase):
    def test_scrapy_tunnel_errors_by_status(self):
        msg = "Could not open CONNECT tunnel with proxy 127.0.0.1:3128 [{'status': %d, 'reason': b'x'}]"
        self.assertEqual(tunnel_status(msg % 502), 502)
        self.assertEqual(classify_exception(TunnelError(msg % 502)), ORIGIN_FAULT)
        self.assertEqual(classify_exception(TunnelError(msg % 407)), LEASE_ENDED)
        self.assertEqual(classify_exception(TunnelError(msg % 403)), DENIED)

    def test_requests_tunnel_errors_by_status(self):
        err = ProxyError("Cannot connect to proxy.", OSError("Tunnel connection failed: 504 Gateway Timeout"))
        self.assertEqual(classify_exception(err), ORIGIN_FAULT)

    def test_a_connection_to_the_proxy_that_fails_is_the_proxys_fault(self):
        self.assertEqual(classify_exception(ConnectionRefusedError(111, "refused")), PROXY_FAULT)
        wrapped = ProxyError("Cannot connect to proxy.", ConnectionRefusedError(111, "refused"))
        self.assertEqual(classify_exception(wrapped), PROXY_FAULT)
        url_error = urllib.error.URLError(ConnectionRefusedError(111, "refused"))
        self.assertEqual(classify_exception(url_error), PROXY_FAULT)

    def test_a_cut_or_timeout_after_the_proxy_accepted_is_not_blamed_on_it(self):
        self.assertEqual(classify_exception(ConnectionLost("lost")), UNKNOWN)
        self.assertEqual(classify_exception(socket.timeout("read timed out")), UNKNOWN)


class HelpersTest(unittest.TestCase):
    def test_retry_after_in_seconds_or_as_a_date(self):
        self.assertEqual(retry_after_seconds("7"), 7.0)
        self.assertEqual(retry_after_seconds("Wed, 02 Dec 2026 10:00:30 GMT", now=1796205600.0), 30.0)
        self.assertIsNone(retry_after_seconds("soon"))
        self.assertIsNone(retry_after_seconds(None))

    def test_backoff_doubles_up_to_the_cap(self):
        it = backoff_delays(first=0.5, cap=3.0)
        self.assertEqual([next(it) for _ in range(5)], [0.5, 1.0, 2.0, 3.0, 3.0])

    def test_headers_are_read_case_insensitively_from_bytes_too(self):
        class ScrapyLikeHeaders(dict):
            def get(self, key):
                return super().get(key.lower() if isinstance(key, bytes) else None)

        get = header_getter(ScrapyLikeHeaders({b"x-proxy-error": b"origin-timeout"}))
        self.assertEqual(get("X-Proxy-Error"), "origin-timeout")
        self.assertIsNone(header_getter({})("Retry-After"))


if __name__ == "__main__":
    unittest.main()
