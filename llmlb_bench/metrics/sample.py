"""Which requests token-level figures read: all of them, or evenly spaced blocks on very large runs.

Token-level figures (vLLM's ITL, the pacing figures) read every request's
``token_times``, by far the largest column. Up to ``sample`` ok requests a
run is read whole; beyond, ``BLOCKS`` equal blocks of consecutive request
ids, evenly spaced from the first id to the last, about ``sample``
requests in all. Blocks rather than a scattered sample because request ids
rise through a run, so the Parquet reader skips every row group outside the
blocks: sampling ten million rows costs what reading the sample costs.
Reports say when a run was sampled; the SQL to reproduce a sampled figure
adds the same ``request_id BETWEEN`` ranges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmlb_bench.metrics.sql import quote

if TYPE_CHECKING:  # `llmlb report --help` imports DEFAULT_SAMPLE, and must not load pyarrow
    import pyarrow as pa

    from llmlb_bench.store.views import Catalog

#: 10,000 requests hold millions of token gaps: on a 100k-request chat run, against 50,000 it moved ITL p99
#: by 0.002%, the fluid token rate by 1.6% and the slowest-10% gap mean by 1.2%, in a fifth of the time
DEFAULT_SAMPLE = 10_000
BLOCKS = 20


def blocks(sample: int, id_min: int, id_max: int) -> list[tuple[int, int]]:
    """The request id ranges of a block sample of about ``sample`` ids in [id_min, id_max]."""
    size = max(sample // BLOCKS, 1)
    span = id_max - id_min + 1 - size
    starts = sorted({id_min + round(span * k / (BLOCKS - 1)) for k in range(BLOCKS)})
    return [(a, a + size - 1) for a in starts]


def is_sampled(ok: int, id_min: int, id_max: int, sample: int) -> bool:
    return ok > sample and id_max - id_min + 1 > sample


def run_filter(run_id: str, ok: int, id_min: int, id_max: int, sample: int) -> str:
    """SQL selecting one run's requests for token-level figures."""
    cond = f"run_id = {quote(run_id)}"
    if is_sampled(ok, id_min, id_max, sample):
        cond += " AND (" + " OR ".join(f"request_id BETWEEN {a} AND {b}"
                                       for a, b in blocks(sample, id_min, id_max)) + ")"
    return cond


def token_rows(cat: Catalog, run_id: str, ok: int, id_min: int, id_max: int, sample: int) -> pa.Table:
    """The requests of one run that token-level figures read (ITL and pacing), read once for both:
    its ok requests with token times (all, or the block sample), by request id, with their SLO
    class and TTFT. One SELECT per run keeps its filter simple enough for the Parquet reader to skip
    the row groups outside the sample's blocks; reading the token lists is most of its cost (a
    block sample of a simulated run touches every row group)."""
    return cat.query(f"SELECT request_id, slo_class, ttft_s AS ttft, token_times FROM request_metrics "
                     f"WHERE {run_filter(run_id, ok, id_min, id_max, sample)} AND status = 'ok' "
                     f"AND len(token_times) > 0 ORDER BY request_id")
