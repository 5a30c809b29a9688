"""egress_proxies — lease proxies from egress-proxies-operator (docs/lease-api.md, docs/scrapy.md).

`LeaseClient` is a blocking, standard-library client; `egress_proxies.scrapy_middleware` holds
the Scrapy downloader middleware (imported on its own, so this package needs no Scrapy).
"""

from .client import (
    ApiUnreachable,
    DiscoveryError,
    Lease,
    LeaseClient,
    LeaseNotFound,
    NoneLeasable,
)
from .outcome import (
    DENIED,
    LEASE_ENDED,
    ORIGIN_FAULT,
    PROXY_ERROR_HEADER,
    PROXY_FAULT,
    UNKNOWN,
    classify_exception,
    status_fault,
)

# The package's one version source (pyproject.toml reads it).
__version__ = "0.1.0"

__all__ = [
    "DENIED",
    "LEASE_ENDED",
    "ORIGIN_FAULT",
    "PROXY_ERROR_HEADER",
    "PROXY_FAULT",
    "UNKNOWN",
    "ApiUnreachable",
    "DiscoveryError",
    "Lease",
    "LeaseClient",
    "LeaseNotFound",
    "NoneLeasable",
    "__version__",
    "classify_exception",
    "status_fault",
]
