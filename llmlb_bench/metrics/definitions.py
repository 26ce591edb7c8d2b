"""Which latency definitions a report uses: vLLM's (default) or GuideLLM's.

The two tools agree on TTFT and E2E and disagree on the other two names:

=========  ==========================================  =====================================================
figure     vLLM ``bench serve``                        GuideLLM (``GenerativeRequestStats``)
=========  ==========================================  =====================================================
TPOT       (last - first) / (n - 1) per request,       (last - start) / n per request, including the first
           one value per request                       token (= Etalon's normalized latency), weight n
ITL        every gap between consecutive tokens        (last - first) / (n - 1) per request (= vLLM's TPOT),
           (stream chunks), pooled over requests       weight n - 1
pctile     linear interpolation (``numpy.percentile``)  weighted inverse CDF: first value whose cumulative
                                                       probability reaches p (no interpolation)
=========  ==========================================  =====================================================

(n = output tokens, start = sent time.) Weights mean a request counts once
per token, as in GuideLLM's distributions. SLO goodput is judged with the
vLLM per-request definitions whichever set the report shows, so switching
definitions changes how latency is described, never which requests are good.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from llmlb_bench.metrics.distribution import Method
from llmlb_bench.metrics.sql import ITL_GAPS, per_request

#: Latency figures every report shows, in display order.
LATENCY_FIGURES = ("ttft", "tpot", "itl", "e2e", "norm_latency")


class Definitions(str, Enum):
    vllm = "vllm"
    guidellm = "guidellm"


@dataclass(frozen=True)
class Figure:
    """One latency figure: the SQL of its values and weights, and its percentile method."""

    source: str
    method: Method


def figures(defs: Definitions) -> dict[str, Figure]:
    """The SQL source of each latency figure under ``defs``."""
    if defs is Definitions.guidellm:
        m: Method = "inverse_cdf"
        return {
            "ttft": Figure(per_request("ttft_s"), m),
            "tpot": Figure(per_request("norm_latency_s", "output_tokens"), m),
            "itl": Figure(per_request("tpot_s", "output_tokens - 1"), m),
            "e2e": Figure(per_request("e2e_s"), m),
            "norm_latency": Figure(per_request("norm_latency_s"), m),
        }
    return {
        "ttft": Figure(per_request("ttft_s"), "linear"),
        "tpot": Figure(per_request("tpot_s"), "linear"),
        "itl": Figure(ITL_GAPS, "linear"),
        "e2e": Figure(per_request("e2e_s"), "linear"),
        "norm_latency": Figure(per_request("norm_latency_s"), "linear"),
    }
