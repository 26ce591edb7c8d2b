"""Which requests token-level figures read: all of them, or evenly spaced blocks on very large runs.

Token-level figures (vLLM's ITL, the pacing figures) read every request's
``token_times``, by far the largest column. Up to ``sample`` ok requests a
run is read whole; beyond, ``BLOCKS`` equal blocks of consecutive request
ids, evenly spaced from the first id to the last, about ``sample``
requests in all. Blocks rather than a scattered sample because request ids
rise through a run, so the Parquet reader skips every row group outside the
blocks: sampling ten million rows costs what reading the sample costs. A
simulated run writes rows as requests finish, so there every row group
spans all ids; the store keeps the default sample's token times apart
(:mod:`llmlb_bench.store.token_sample`) and the sample reads them there.
Reports say when a run was sampled; the SQL to reproduce a sampled figure
adds the same ``request_id BETWEEN`` ranges.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping

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


def sample_ranges(request_ids: pa.ChunkedArray | pa.Array, sample: int = DEFAULT_SAMPLE) -> list[tuple[int, int]]:
    """The blocks a report of a run of these request ids (a trace's) samples at ``sample``, or none when
    it reads them all: the ranges a trace-driven backend asks the store to keep apart
    (:mod:`llmlb_bench.store.token_sample`)."""
    import pyarrow.compute as pc  # here: this module's importers that only name DEFAULT_SAMPLE never load pyarrow

    if len(request_ids) <= sample:
        return []
    bounds = pc.min_max(request_ids)
    id_min, id_max = bounds["min"].as_py(), bounds["max"].as_py()
    return blocks(sample, id_min, id_max) if id_max - id_min + 1 > sample else []


def is_sampled(ok: int, id_min: int, id_max: int, sample: int) -> bool:
    return ok > sample and id_max - id_min + 1 > sample


def run_filter(run_id: str, ok: int, id_min: int, id_max: int, sample: int) -> str:
    """SQL selecting one run's requests for token-level figures."""
    cond = f"run_id = {quote(run_id)}"
    if is_sampled(ok, id_min, id_max, sample):
        cond += " AND (" + " OR ".join(f"request_id BETWEEN {a} AND {b}"
                                       for a, b in blocks(sample, id_min, id_max)) + ")"
    return cond


def token_rows(cat: Catalog, run_id: str, ok: int, id_min: int, id_max: int, sample: int,
               kept: Mapping[str, object] | None = None, run_dir: str | None = None) -> pa.Table:
    """The requests of one run that token-level figures read (ITL and pacing), read once for both:
    its ok requests with token times (all, or the block sample), with their request id, SLO class
    and TTFT; by request id, but for those taken whole from the kept sample, which come in its
    order. One SELECT per run keeps its filter simple enough for the Parquet reader to skip
    the row groups outside the sample's blocks; reading the token lists is most of its cost (a
    block sample of a simulated run touches every row group), so a block sample takes them from
    the run's ``token_sample.arrow`` where the store kept the same blocks apart (``kept``: run.json's
    ``token_sample``; ``run_dir`` the run's folder): the same rows and values, a tenth of the lists."""
    cond = run_filter(run_id, ok, id_min, id_max, sample)
    files = _kept_files(kept, run_dir, blocks(sample, id_min, id_max)) \
        if is_sampled(ok, id_min, id_max, sample) and not cat.confined else None
    if files:
        table = _from_kept(cat, cond, files, kept)
        if table is not None:
            return table
    return cat.query(f"SELECT request_id, slo_class, ttft_s AS ttft, token_times FROM request_metrics "
                     f"WHERE {cond} AND status = 'ok' AND len(token_times) > 0 ORDER BY request_id")


def _kept_files(kept: Mapping[str, object] | None, run_dir: str | None, ranges: list[tuple[int, int]]) -> list[str]:
    """The files of the run's kept token sample when it holds exactly these blocks, else none: its Arrow
    file, or the part files of the Parquet folder that runs written before kept."""
    if kept is None or run_dir is None or kept.get("ranges") != [[a, b] for a, b in ranges] \
            or not isinstance(kept.get("file"), str):
        return []
    path = Path(run_dir) / str(kept["file"])
    if path.suffix == ".arrow":
        return [str(path)] if path.is_file() else []
    from llmlb_bench.store.parts import table_files   # pyarrow's reader: see the module's imports

    return [str(f) for f in table_files(path)]


def _from_kept(cat: Catalog, cond: str, files: list[str], kept: Mapping[str, object] | None) -> pa.Table | None:
    """The token rows with their lists from the kept sample, or None where it is not whole: its rows are
    not the ones run.json counted, once each, or a sampled ok request of the requests is missing there.
    The two are matched by request id in NumPy: a join in DuckDB copied every list once more (and
    sorted them), which cost as much as reading them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from llmlb_bench.store.token_sample import read_kept

    rows = cat.query(f"SELECT request_id, slo_class, ttft_s AS ttft FROM request_metrics WHERE {cond} "
                     f"AND status = 'ok' ORDER BY request_id")
    # Arrow's readers, not DuckDB's: the same lists, without DuckDB's copy of them into Arrow (on the 100k
    # run's 1.4M segments, from Parquet 0.024 CPU-s against 0.03; from the Arrow file 0.003)
    try:
        lists = pa.concat_tables([read_kept(f, ("request_id", "token_times")) for f in files])
    except (OSError, pa.ArrowException):
        return None     # a damaged file: the requests are read
    ids = lists.column("request_id").to_numpy()
    order = np.argsort(ids, kind="stable")
    by_id = ids[order]
    if kept is None or len(ids) != kept.get("rows") or bool((by_id[1:] == by_id[:-1]).any()):
        return None
    wanted = rows.column("request_id").to_numpy()
    at = np.minimum(np.searchsorted(by_id, wanted), max(len(by_id) - 1, 0))
    if len(wanted) and (not len(by_id) or bool((by_id[at] != wanted).any())):
        return None
    if len(wanted) == len(ids):
        # the kept rows are the sampled ones: the rows come in the file's order, with its lists as
        # they were read, where taking the lists into id order copied all of them (28 MB on the 100k
        # run); the figures do not depend on the rows' order (pacing.Streams ranks and sums by id)
        back = np.empty(len(order), dtype=np.int64)
        back[order] = np.arange(len(order))      # each file row's place in id order, that of its row
        table = rows.take(pa.array(back)).append_column("token_times", lists.column("token_times"))
    else:
        table = rows.append_column("token_times", lists.column("token_times").take(pa.array(order[at])))
    token_times = table.column("token_times")
    has = pc.fill_null(pc.greater(pc.list_value_length(token_times), 0), False)
    return table if pc.all(has).as_py() else table.filter(has)
