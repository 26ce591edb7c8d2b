"""Latency samples of every run, SLO class and tenant: one DuckDB scan per run hands the columns to NumPy.

Per run, each per-request figure's value (and weight, for GuideLLM's weighted
figures) of its ok requests, with their SLO class and tenant when the run has
several: computed from the run's columns read once for this stage and the
fairness windows (:mod:`llmlb_bench.metrics.run_columns`), or, for figures
computed only in SQL, from one query over ``request_metrics``; token
gaps (vLLM's ITL) come from the token rows of
:mod:`llmlb_bench.metrics.sample` (:func:`itl_gaps`). Each figure becomes a sorted
:class:`~llmlb_bench.metrics.distribution.Sample`, and every percentile and
bootstrap interval is read from it exactly.

Groups (the per-class and per-tenant tables) get TTFT and E2E at p50 and
p99, under the same definitions as the run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping

import numpy as np

from llmlb_bench.metrics.columns import Scratch, read
from llmlb_bench.metrics.counts import GROUP_NULL
from llmlb_bench.metrics.definitions import Figure
from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.distribution import Sample, sample_of, sample_of_parts, sample_of_split
from llmlb_bench.metrics.pacing import Segments
from llmlb_bench.metrics import run_columns
from llmlb_bench.metrics.run_columns import RunColumns
from llmlb_bench.metrics.run_figures import GroupKey, GroupLatency
from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

GROUP_PERCENTILES = (50.0, 99.0)
#: each group figure's keys at GROUP_PERCENTILES
GROUP_KEYS: dict[str, tuple[GroupKey, GroupKey]] = {"ttft": ("ttft_p50", "ttft_p99"), "e2e": ("e2e_p50", "e2e_p99")}

@dataclass
class Latency:
    """Each run's sample of each figure, and each group's p50/p99 of the figures of :data:`GROUP_KEYS`."""

    samples: dict[tuple[str, str], Sample] = field(default_factory=dict)                # (run_id, figure)
    groups: dict[tuple[str, ...], GroupLatency] = field(default_factory=dict)  # (column, run_id, group)


def _cells(groups: Mapping[str, list[str]]) -> str:
    """SQL: each row's cell among the groups of ``groups``' columns as one number, the columns' group
    indices in mixed radix (the first column's most significant): small integers travel to NumPy far
    cheaper than strings, and one ordering of the cells serves every column (:func:`_by_group`)."""
    strides = np.cumprod([1, *(len(names) for names in list(groups.values())[::-1])])[-2::-1].tolist()
    return " + ".join(f"(CASE coalesce({col}, {quote(GROUP_NULL[col])}) "
                      + " ".join(f"WHEN {quote(g)} THEN {i}" for i, g in enumerate(names)) + f" END) * {stride}"
                      for (col, names), stride in zip(groups.items(), strides)) + " AS cell"


def several(groups: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The group columns of more than one group: the ones :func:`_cells` numbers (a column of one group
    needs no number: every row is in it)."""
    return {col: names for col, names in groups.items() if len(names) > 1}


def cell_column(groups: Mapping[str, list[str]]) -> tuple[str, type[np.unsignedinteger] | type[np.signedinteger]] | None:
    """The SQL of each row's cell among ``groups``' columns of several groups (:func:`_cells`) and the dtype
    it is read as; None where no column has several."""
    cols = several(groups)
    return (_cells(cols), _cell_dtype(int(np.prod([len(names) for names in cols.values()])))) if cols else None


def group_index(groups: Mapping[str, list[str]], col: str, cell: np.ndarray, names: list[str],
                out: np.ndarray) -> np.ndarray:
    """Each row's group in ``col`` (one of the columns :func:`cell_column` numbers), from its ``cell``,
    as its index in ``names`` (the column's groups in another order), into ``out`` (int64)."""
    cols = several(groups)
    stride = int(np.prod([len(g) for c, g in cols.items()][list(cols).index(col) + 1:]))
    index = [names.index(g) for g in cols[col]]
    if index == list(range(len(index))):
        # the two orders agree (both sorted, as a run's groups come): the digit is the index, computed
        # into ``out`` (over 5M rows, a lookup of each digit cost 0.045 CPU-s more)
        np.floor_divide(cell, stride, out=out)
        np.remainder(out, len(index), out=out)
        return out
    digit = cell // stride % len(cols[col])
    return np.take(np.array(index, dtype=np.int64), digit, out=out)


#: the report's percentile methods by NumPy's names
_NUMPY_METHOD: dict[str, Literal["linear", "inverted_cdf"]] = {"linear": "linear", "inverse_cdf": "inverted_cdf"}


def _group_percentiles(values: np.ndarray, method: str, nulls: bool, ordered: bool = False) -> list[float] | None:
    """p50 and p99 by NumPy's selection; "inverted_cdf" is GuideLLM's rule.

    ``values`` is a slice of the caller's own gathered copy, worked in place (:func:`_percentiles`)
    unless ``ordered`` says it is sorted already; ``nulls`` says whether the column holds NaN (a null)
    at all, so a column without them is not filtered group by group."""
    if nulls:
        values = values[~np.isnan(values)]
    if not len(values):
        return None
    return _percentiles(values, _NUMPY_METHOD[method], ordered)


def _select(values: np.ndarray, ranks: np.ndarray) -> None:
    """Put the order statistics of ``ranks`` (ascending, distinct) where a sort would, in place: a
    partition at one rank at a time, each over what lies above the last. NumPy's partition at one rank
    is vectorised (AVX-512's selection) and at several is not: on 2.5M values, two ranks at once took
    29 ms, one after the other 6 ms, a sort 16 ms."""
    start = 0
    for r in ranks.tolist():
        values[start:].partition(r - start)
        start = r + 1


def _percentiles(values: np.ndarray, method: Literal["linear", "inverted_cdf"], ordered: bool) -> list[float]:
    """``np.percentile(values, GROUP_PERCENTILES, method=method)`` of ``values`` without NaN, to the bit:
    the order statistics it reads, selected in place (:func:`_select`; read directly where ``ordered``),
    then NumPy's own index, weight and interpolation steps (its private functions, where this NumPy has
    them). Without NumPy's partition of the whole array first, which it makes sorted or not (0.11 CPU-s
    of the 10M report on sorted arrays), nor a sort of each group (0.15 CPU-s more). Where an order
    statistic read is zero, or where the private steps are missing, ``np.percentile`` decides over the
    values sorted (its partition may leave -0.0 or 0.0 there; where a group holds both at that rank, the
    selection may have put the other one first)."""
    impl = getattr(np.lib, "_function_base_impl", None)
    props = getattr(impl, "_QuantileMethods", {}).get(method)
    get_indexes, get_gamma, lerp = (getattr(impl, f, None) for f in ("_get_indexes", "_get_gamma", "_lerp"))
    if props is not None and get_indexes is not None and get_gamma is not None and lerp is not None:
        q = np.true_divide(GROUP_PERCENTILES, 100)
        n = len(values)
        virtual = np.asanyarray(props["get_virtual_index"](n, q))
        exact = props["fix_gamma"] is None or (method == "linear" and np.issubdtype(virtual.dtype, np.integer))
        before, after = (virtual, virtual) if exact else get_indexes(values, virtual, n)
        if not ordered:
            # NumPy names the last value -1 where an index reaches the end (a group of one): as a rank, n - 1
            _select(values, np.unique(np.concatenate([before, after]).astype(np.int64) % n))
        low, high = values[before], values[after]
        result = low if exact else lerp(low, high, get_gamma(virtual, before, props).reshape(virtual.shape))
        if low.all() and high.all():
            return [float(x) for x in result]
    if not ordered:
        values.sort()
    return [float(x) for x in np.percentile(values, GROUP_PERCENTILES, method=method, overwrite_input=True)]


def _keep_group(into: Latency, key: tuple[str, str, str], figure: str, qs: list[float] | None) -> None:
    """A group's p50 and p99 of ``figure`` (none where it has no values) into ``into.groups[key]``."""
    if qs is not None:
        group = into.groups.setdefault(key, {})
        for k, q in zip(GROUP_KEYS[figure], qs):
            group[k] = q


def _cell_dtype(cells: int) -> type[np.unsignedinteger] | type[np.signedinteger]:
    """The dtype the cells of :func:`_cells` are read as: two bytes where they fit, for :func:`_by_group`."""
    return np.uint16 if cells <= 1 << 16 else np.int64


#: up to this many cells, :func:`_by_group` orders the rows a cell at a time (:func:`_by_cell`)
FEW_CELLS = 16


def _by_cell(cell: np.ndarray, cells: int, scratch: Scratch) -> tuple[np.ndarray, np.ndarray]:
    """The rows ordered by cell, each cell's in their order (what a stable sort of ``cell`` gives), in
    ``scratch``'s memory, and where each cell's rows start (``cells`` + 1 bounds): a comparison and the
    indices of one cell at a time, where the radix sort of the numbers took two fresh arrays of 64-bit
    indices of every row (over ten million rows, 160 MB for the kernel to fault in)."""
    n = len(cell)
    order = scratch.array("group_order_0", n, np.intp)
    mask = scratch.array("group_mask", n, np.bool_)
    starts = np.zeros(cells + 1, dtype=np.int64)
    at = 0
    for c in range(cells):
        rows = np.flatnonzero(np.equal(cell, c, out=mask))
        order[at:at + len(rows)] = rows
        at += len(rows)
        starts[c + 1] = at
    return order, starts


def _by_group(cell: np.ndarray, sizes: list[int], scratch: Scratch) -> list[tuple[np.ndarray, list[int]]]:
    """For each column (of ``sizes[i]`` groups, numbered in ``cell`` as :func:`_cells` does), the rows of
    its groups together and where each group's rows start and end: one gather per figure then hands each
    group its values, where a mask per group cost a comparison and a gather of every row for each group.

    The rows are ordered once, by cell (a stable radix sort of the two-byte numbers): the first column's
    groups are then runs of consecutive cells, and each other column's order is the same cells' rows laid
    out again by that column's group (copied into scratch memory), where a sort per column cost
    another radix sort and its fresh memory."""
    cells = int(np.prod(sizes))
    if cells <= FEW_CELLS:
        order, starts = _by_cell(cell, cells, scratch)
    else:
        order = np.argsort(cell, kind="stable")
        # where each cell starts among the sorted numbers: a gather of the small numbers, where bincount
        # would first convert every number to a fresh 64-bit array
        starts = np.searchsorted(cell[order], np.arange(cells + 1))
    filled = np.flatnonzero(np.diff(starts))
    out: list[tuple[np.ndarray, list[int]]] = []
    stride = int(np.prod(sizes))
    for i, size in enumerate(sizes):
        stride //= size
        if i == 0:
            out.append((order, starts[::stride].tolist()))
            continue
        digit = filled // stride % size
        laid = scratch.array(f"group_order_{i}", len(order), order.dtype)
        at = 0
        for c in filled[np.argsort(digit, kind="stable")].tolist():    # the cells by this column's group
            m = int(starts[c + 1] - starts[c])
            laid[at:at + m] = order[starts[c]:starts[c + 1]]
            at += m
        rows = np.bincount(digit, weights=np.diff(starts)[filled], minlength=size)
        out.append((laid, [0, *np.cumsum(rows).astype(np.int64).tolist()]))
    return out


#: the scratch array each figure's values take turns in, from a run's columns read once
#: (:func:`run_latency`: each sample is handed over before the next figure's values are computed)
SAMPLE = "run_sample"


def spare_buffers() -> list[str]:
    """The names of large scratch arrays :func:`run_latency` is done with when it returns (the samples'
    turn array, the groups' gathered values and their orders), for a later stage of the same run."""
    return [SAMPLE, "by_group", "group_order_0", "group_order_1"]


def run_latency(cat: Catalog, run_id: str, rows: int, figs: Mapping[str, Figure], groups: Mapping[str, list[str]],
                tokens: Segments | None, scratch: Scratch, into: Latency, cols: RunColumns | None = None,
                hand: Callable[[str, Sample], None] | None = None) -> None:
    """One run's samples and group percentiles into ``into``: from its ok rows of ``cols`` where they are
    given (:mod:`llmlb_bench.metrics.run_columns`, read once for this stage and the fairness windows), else
    from a query of its own. With ``cols`` and ``hand``, each per-request figure's sample is handed to
    ``hand`` (figure name, sample) as soon as it is complete, not kept in ``into``: its values lie in
    scratch memory the next figure's overwrite (over ten million rows, one array of 40 MB where the
    samples kept were five)."""
    per_request = {n: f for n, f in figs.items() if f.value is not None}
    # a column of one group (the adapter column of a run without adapters, shown beside its several
    # tenants) needs no order: None, its rows are in place
    numbered = several(groups)
    sizes = [len(names) for names in numbered.values()]
    weighted: dict[str, np.ndarray] = {}
    if cols is not None:
        # the same columns as the query's below, computed from the run's columns, each figure's values
        # when its turn comes
        def column(n: str, f: Figure) -> np.ndarray:
            assert f.value is not None and cols is not None
            return run_columns.values(cols, f.value, scratch, SAMPLE if hand is not None else f"v_{n}")

        for n, f in per_request.items():
            w = run_columns.weights(cols, f.weight, scratch, f"w_{n}")
            if w is not None:
                weighted[n] = w
        cell = cols.ok_rows(cols.cell, scratch.array("run_ok_cell", len(cols.cell), cols.cell.dtype)) \
            if numbered and cols.cell is not None else None
        n_rows = cols.n_ok
    else:
        # nulls as NaN (values) and 0 (weights), which samples drop as they dropped nulls: :func:`columns.read`
        # copies each batch of a column as it is
        sql = [f"coalesce(({f.value})::DOUBLE, 'NaN') AS v_{n}" for n, f in per_request.items()]
        sql += [f"coalesce(({f.weight})::BIGINT, 0) AS w_{n}" for n, f in per_request.items() if f.weight != "1"]
        sql += [_cells(numbered)] if numbered else []
        dtypes = {**{f"v_{n}": np.float64 for n in per_request},
                  **{f"w_{n}": np.int64 for n, f in per_request.items() if f.weight != "1"},
                  **({"cell": _cell_dtype(int(np.prod(sizes)))} if numbered else {})}
        # the values become the samples (kept); the weights and cells are read again into the same memory
        # for the next run
        table = read(cat, f"SELECT {', '.join(sql)} FROM request_metrics WHERE run_id = {quote(run_id)} "
                          f"AND status = 'ok'", rows, dtypes, scratch, keep=[f"v_{n}" for n in per_request])

        def column(n: str, f: Figure) -> np.ndarray:
            return table[f"v_{n}"]

        weighted = {n: table[f"w_{n}"] for n, f in per_request.items() if f.weight != "1"}
        cell = table.get("cell")
        n_rows = len(next(iter(table.values()))) if table else 0
    laid_out = dict(zip(numbered, _by_group(cell, sizes, scratch))) if cell is not None else {}
    grouped: dict[str, tuple[np.ndarray | None, list[int]]] = {
        col: laid_out.get(col, (None, [0, n_rows])) for col in groups}
    # one array the group figures' values are gathered into, column after column and run after run
    # (on ten million rows a fresh one each time is 40 MB for the kernel to fault in and zero)
    by_group = scratch.array("by_group", n_rows if groups else 0, np.float64)
    for n, f in per_request.items():
        values = column(n, f)
        grouped_here = grouped if n in GROUP_KEYS else {}
        if grouped_here:
            nulls = bool(np.isnan(values).any())
        for col, (order, bounds) in grouped_here.items():
            if order is not None:       # (a column of one group reads the sorted sample, below)
                np.take(values, order, out=by_group, mode="clip")    # "clip": the indices are valid; unbuffered
                for i, name in enumerate(groups[col]):
                    _keep_group(into, (col, run_id, name), n, _group_percentiles(
                        by_group[bounds[i]:bounds[i + 1]], f.method, nulls))
        # the groups have read the column: the sample may sort it where it lies
        s = sample_of(values, weighted.get(n), scratch=True)
        for col, (order, _) in grouped_here.items():
            if order is None and s is not None:
                # the group is every ok request, and a group figure has weight 1 under both definitions
                # (definitions.py): its values are the sample's, already sorted, copied for NumPy to select in
                ordered = by_group[:len(s.v)]
                np.copyto(ordered, s.v)
                _keep_group(into, (col, run_id, groups[col][0]), n, _group_percentiles(ordered, f.method, False,
                                                                                        ordered=True))
        if s is not None:
            if cols is not None and hand is not None:
                hand(n, s)
            else:
                into.samples[(run_id, n)] = s
    for n, f in figs.items():
        if f.value is None and tokens is not None:
            s = itl_sample(tokens)
            if s is not None:
                into.samples[(run_id, n)] = s


def itl_gaps(tokens: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(v, w, between)``: the gaps between deliveries of these token rows' token times, with
    multiplicities, exactly as :func:`llmlb_bench.metrics.sql.itl_gaps_sql` (docs/metrics.md's ITL)
    gives them: a segment of ``count`` tokens spaced ``gap_s`` > 0 gives ``count - 1`` gaps of
    ``gap_s`` (``v``, ``w``), and each pair of consecutive segments of a request the gap from the
    last token of one to the first of the next (``between``, one gap each), computed in the SQL's
    order, ``(start - previous start) - previous gap_s x (previous count - 1)``, so the values are
    the SQL's to the last bit. In NumPy over the segments pacing reads too, rather than a second
    pass of DuckDB over the lists; the two kinds apart, as :func:`sample_of_parts` takes them."""
    start, gap, count = tokens.start, tokens.gap, tokens.count
    within = (count > 1) & (gap > 0)
    between = np.subtract(start[1:], start[:-1])
    between -= tokens.tail[:-1]                 # the previous gap_s x (previous count - 1), computed once
    return gap[within], count[within] - 1, between[tokens.after[1:]]


def itl_sample(tokens: Segments) -> Sample | None:
    """ITL's sample of these token rows: :func:`sample_of_parts` of :func:`itl_gaps`, with the gaps taken
    from the segments and split by weight in one pass of C where the report's kernels are built
    (:mod:`llmlb_bench.metrics.kernels`), the same sample to the last bit; where that split meets a gap
    of 0 or leaves a part empty, NumPy's way, as :func:`sample_of_parts` goes its general way then."""
    native = kernels.native
    ranges = tokens.native_ranges() if native is not None else None
    if native is not None and ranges is not None:
        ns = len(tokens.start)
        ones, rest_v, rest_w = np.empty(2 * ns), np.empty(ns), np.empty(ns, dtype=np.int64)
        a, r, _, zero = native.itl_split(ranges, np.ascontiguousarray(tokens.start), np.ascontiguousarray(tokens.gap),
                                         np.ascontiguousarray(tokens.counts), ones, rest_v, rest_w)
        if a and r and not zero:
            return sample_of_split(ones[:a], rest_v[:r], rest_w[:r], room=ones)
    return sample_of_parts(*itl_gaps(tokens))


def latency(cat: Catalog, runs: Mapping[str, Mapping[str, Figure]], rows: Mapping[str, int],
            groups: Mapping[str, Mapping[str, list[str]]], tokens: Mapping[str, Segments],
            scratch: Scratch | None = None) -> Latency:
    """The figures ``runs`` names for each run (run -> figure name -> figure), and the groups in
    ``groups`` (run -> column -> group names); ITL from each run's token rows in ``tokens``. ``rows``:
    each run's ok requests, as counted (the rows its figures read); ``scratch``: memory to reuse.

    Needs the ``request_metrics`` view.
    """
    out = Latency()
    for run_id, figs in runs.items():
        run_latency(cat, run_id, rows.get(run_id, 0), figs, groups.get(run_id, {}), tokens.get(run_id), scratch or Scratch(), out)
    return out
