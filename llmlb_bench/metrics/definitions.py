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
from typing import TYPE_CHECKING, get_args

from llmlb_bench.metrics.run_figures import AnswerName, LatencyName

if TYPE_CHECKING:       # a type only: importing distribution (numpy) here would slow `llmlb report --help`
    from llmlb_bench.metrics.distribution import Method

#: Latency figures every report shows, in display order.
LATENCY_FIGURES: tuple[LatencyName, ...] = get_args(LatencyName)
#: The answer's figures, shown for runs with reasoning (llmlb_bench.metrics.sql): time to first answer
#: token and the answer's TPOT, judged as vLLM's TPOT is under both definitions
ANSWER_FIGURES: tuple[AnswerName, ...] = get_args(AnswerName)
#: sent - scheduled: the router wait, or a replay's client lag (llmlb_bench.metrics.origin)
WAIT = "wait"


class Definitions(str, Enum):
    vllm = "vllm"
    guidellm = "guidellm"


@dataclass(frozen=True)
class Figure:
    """One latency figure: a per-request value and weight (SQL over ``request_metrics``), or the token gaps.

    ``value`` None means the figure is every gap between consecutive tokens
    (:data:`llmlb_bench.metrics.sql.ITL_GAPS`), not one value per request.
    """

    value: str | None
    weight: str
    method: Method


#: the wait's figure, the same under both definitions
WAIT_FIGURE = Figure("wait_s", "1", "linear")


def figures(defs: Definitions) -> dict[str, Figure]:
    """Each latency figure under ``defs``."""
    if defs is Definitions.guidellm:
        m: Method = "inverse_cdf"
        return {
            "ttfa": Figure("ttfa_s", "1", m),
            "answer_tpot": Figure("answer_tpot_s", "1", m),
            "ttft": Figure("ttft_s", "1", m),
            "tpot": Figure("norm_latency_s", "output_tokens", m),
            "itl": Figure("tpot_s", "output_tokens - 1", m),
            "e2e": Figure("e2e_s", "1", m),
            "norm_latency": Figure("norm_latency_s", "1", m),
        }
    return {
        "ttfa": Figure("ttfa_s", "1", "linear"),
        "answer_tpot": Figure("answer_tpot_s", "1", "linear"),
        "ttft": Figure("ttft_s", "1", "linear"),
        "tpot": Figure("tpot_s", "1", "linear"),
        "itl": Figure(None, "1", "linear"),
        "e2e": Figure("e2e_s", "1", "linear"),
        "norm_latency": Figure("norm_latency_s", "1", "linear"),
    }
