"""The response headers that name the backend which served a request (a router's decision, in-band).

``llmlb serve`` names itself in ``X-Llmlb-Backend``; smg adds ``x-smg-routed-worker-id``. The
server (:mod:`llmlb_bench.serve.api`), the proxy (:mod:`llmlb_bench.proxy`) and the replayer
(:mod:`llmlb_bench.replay.flight`) all need the names, and the router benchmarks
(:mod:`llmlb_bench.pypi_routers.identity`) explain how each router under test passes them through; the
names live here, below all of them, so no layer imports upwards for them.
"""

from __future__ import annotations

from typing import Mapping

#: the response header ``llmlb serve`` sets on every completion
BACKEND_HEADER = "X-Llmlb-Backend"
#: response headers that name the serving backend, most specific first (lower case, as parsed)
_HEADERS = ("x-llmlb-backend", "x-smg-routed-worker-id")


def backend_from_headers(headers: Mapping[str, str]) -> str | None:
    """The backend a response names (headers keyed in lower case), or None when none does."""
    for name in _HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None
