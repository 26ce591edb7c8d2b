"""The report's compiled kernels (llmlb_bench/metrics/report_kernels.c) against the NumPy code they stand
for, bit for bit: the streams' layout, the deadline walks (lanes, first-token deadlines, quiet and
gathered positions), the fluid deadlines, the slowest-10% gap mean, ITL's sample and the sorts behind
it, on random token streams. The NumPy path is the reference and runs in every process (the kernels are
switched off with ``kernels.native = None``); the kernels run where the compiled core is built, which CI
requires (tests/test_compiled_core.py).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench import compiled_core
from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.distribution import Sample, pairs_sorted, sample_of_parts, sample_of_split
from llmlb_bench.metrics.latency import itl_gaps, itl_sample
from llmlb_bench.metrics.pacing import (Segments, Streams, deadline_walk, fluid_deadlines, pacing_of, slowest_gap_mean,
                                        subset)
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.schema import TOKEN_SEGMENT

NATIVE = kernels.native


def _require_kernels() -> None:
    """Skip where the kernels are not built (they come with the optional compiled core), fail where CI is set."""
    if NATIVE is None:
        why = compiled_core.current(warn=False).why
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the report's compiled kernels: {why}")
        pytest.skip(f"no compiled kernels: {why}")


def both(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` on the NumPy path, then with the kernels."""
    monkeypatch.setattr(kernels, "native", None)
    reference = fn()
    monkeypatch.setattr(kernels, "native", NATIVE)
    return reference, fn()


def same(a: Any, b: Any) -> bool:
    """Equal to the last bit (arrays by dtype, shape and bytes; floats by their bits, NaN included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, Sample):
        return isinstance(b, Sample) and same(a.v, b.v) and same(a.cw, b.cw) and a.n == b.n and same(a.mean, b.mean)
    if isinstance(a, (tuple, list)):
        return isinstance(b, type(a)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return bool(a == b) and type(a) is type(b)


def token_table(rng: np.random.Generator, n: int, segments: int, tokens: int, *, shuffle: bool = False,
                chunks: float = 0.3) -> pa.Table:
    """``n`` token rows of 1 to ``segments`` - 1 segments of 1 to ``tokens`` - 1 tokens: gaps of 0 (a
    chunk at once, share ``chunks``) or 3-150 ms, waits between segments (some of 0: a gap of 0
    between segments), unround times; two SLO classes; request ids rising, or shuffled."""
    rows, ttft = [], []
    for _ in range(n):
        t = float(rng.uniform(0.05, 1.0))
        ttft.append(t)
        segs = []
        for _ in range(int(rng.integers(1, segments))):
            gap = 0.0 if rng.random() < chunks else float(rng.uniform(0.003, 0.15))
            count = int(rng.integers(1, tokens))
            segs.append({"start_s": t, "gap_s": gap, "count": count})
            t = t + gap * (count - 1) + (0.0 if rng.random() < 0.05 else float(rng.exponential(0.08)))
        rows.append(segs)
    ids = np.arange(n) * 3 + 7
    table = pa.table({"request_id": ids, "slo_class": rng.choice(["interactive", "batch"], n).tolist(),
                      "ttft": ttft, "token_times": pa.array(rows, pa.list_(TOKEN_SEGMENT))})
    return table.take(pa.array(rng.permutation(n))) if shuffle else table


SLOS = [Slo.parse("ttft=400ms,tpot=40ms"), Slo.parse("ttft=100ms,tpot=7ms;batch:tpot=90ms"), Slo.parse("tpot=30ms"),
        Slo.parse("e2e=5s")]
#: (requests, most segments, most tokens): few long streams, many short ones (busy positions), a mix
SHAPES = [(40, 30, 300), (1500, 6, 12), (400, 12, 60)]


@pytest.mark.parametrize("seed", range(6))
def test_pacing_with_the_kernels_is_the_numpy_code_bit_for_bit(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    _require_kernels()
    rng = np.random.default_rng(seed)
    n, most_segments, most_tokens = SHAPES[seed % len(SHAPES)]
    table = token_table(rng, n, most_segments, most_tokens, shuffle=seed % 2 == 1, chunks=0.6 if seed == 5 else 0.3)
    ref, got = both(monkeypatch, lambda: Streams.of(Segments.of(table)))
    for f in ("value", "mult", "offsets", "rank_of", "ttft"):
        assert same(getattr(ref, f), getattr(got, f)), f
    assert same(ref.by_id, got.by_id) if ref.by_id is not None else got.by_id is None
    s = got
    d = np.column_stack([rng.uniform(0.004, 0.12, s.n), np.full(s.n, 0.03)])
    dp = np.column_stack([rng.uniform(0.05, 0.9, s.n), np.full(s.n, np.nan)])
    dp[: s.n // 5, 0] = np.inf                                      # no first-token limit: infinite slack
    for args in ((d, dp), (d[:, 0], dp[:, 0]), (d[:, 1], None), (np.full((s.n, 5), 0.02), None)):
        ref_walk, got_walk = both(monkeypatch, lambda a=args: deadline_walk(s, *a))
        assert same(ref_walk, got_walk)
    assert (ref_walk[0] > 0).any()
    # every position entry by entry, and every position gathered: the kernel follows NumPy's choice
    import llmlb_bench.metrics.pacing as pacing_module
    for gather_from in (1 << 62, 1):
        monkeypatch.setattr(pacing_module, "_GATHER_FROM", gather_from)
        assert same(*both(monkeypatch, lambda: deadline_walk(s, d, dp)))
    monkeypatch.undo()
    keep = rng.random(s.n) < 0.3
    assert same(*both(monkeypatch, lambda: deadline_walk(subset(s, keep), d[keep], dp[keep])))
    for q in (None, 0.5, 0.99):
        assert same(*both(monkeypatch, lambda q=q: fluid_deadlines(s, q)))
    for share in (0.1, 0.5, 1.0):
        assert same(*both(monkeypatch, lambda share=share: slowest_gap_mean(s, share)))
    for slo in [None, *SLOS]:
        assert same(*both(monkeypatch, lambda slo=slo: pacing_of(Streams.of(Segments.of(table)), slo)))


@pytest.mark.parametrize("seed", range(6))
def test_itl_sample_with_the_kernels_is_the_numpy_code_bit_for_bit(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """ITL's sample from the kernel's split (its fast path, and each way back to NumPy: a gap of 0
    between segments, no gap of multiplicity 1 or none larger) equals sample_of_parts(itl_gaps)."""
    _require_kernels()
    rng = np.random.default_rng(100 + seed)
    n, most_segments, most_tokens = SHAPES[seed % len(SHAPES)]
    table = token_table(rng, n, most_segments, most_tokens, chunks=0.3)
    if seed >= 3:   # no gap of 0 between segments: the kernel's own path all the way
        rows = [[{**x, "start_s": x["start_s"] + 1e-3 * i} for i, x in enumerate(r)] for r in table["token_times"].to_pylist()]
        table = table.set_column(3, "token_times", pa.array(rows, pa.list_(TOKEN_SEGMENT)))
    ref = sample_of_parts(*itl_gaps(Segments.of(table)))
    monkeypatch.setattr(kernels, "native", None)
    assert same(ref, itl_sample(Segments.of(table)))
    monkeypatch.setattr(kernels, "native", NATIVE)
    assert same(ref, itl_sample(Segments.of(table)))
    for count in (2, 5):      # every segment's own gaps of multiplicity 1, or none
        rows = [[{**x, "count": count} for x in r] for r in table["token_times"].to_pylist()]
        other = table.set_column(3, "token_times", pa.array(rows, pa.list_(TOKEN_SEGMENT)))
        monkeypatch.setattr(kernels, "native", None)
        ref = itl_sample(Segments.of(other))
        monkeypatch.setattr(kernels, "native", NATIVE)
        assert same(ref, itl_sample(Segments.of(other)))


@pytest.mark.parametrize("seed", range(5))
def test_the_merge_over_the_weight_1_values_is_the_merge_into_fresh_arrays(monkeypatch: pytest.MonkeyPatch,
                                                                            seed: int) -> None:
    """sample_of_split with ``room`` (the merge written over the sorted weight-1 values from the last entry
    back, the mean's terms made in place and the values put back) gives the arrays and mean of the merge
    into fresh arrays and of the NumPy path: ties between the two parts and within each, pairs of weight 1
    among the larger (the kernels put them back in order), a room just long enough and a longer one."""
    _require_kernels()
    rng = np.random.default_rng(200 + seed)
    a, r = [(1, 1), (5, 3), (1000, 40), (50_000, 9000), (3, 700)][seed]
    pool = rng.lognormal(-3, 1, max((a + r) // 4, 2))
    ones, rest_v = rng.choice(pool, a), rng.choice(pool, r)
    rest_w = rng.integers(2 if seed % 2 else 1, 40, r)
    for extra in (0, 17):
        runs = []
        for native, room in ((None, False), (NATIVE, False), (NATIVE, True)):
            monkeypatch.setattr(kernels, "native", native)
            buf = np.full(a + r + extra, np.nan)
            buf[:a] = ones
            runs.append(sample_of_split(buf[:a], rest_v.copy(), rest_w.copy(), room=buf if room else None))
        assert same(runs[0], runs[1]) and same(runs[0], runs[2])
        assert runs[2].v.base is not None


def test_a_null_list_or_other_counts_go_the_numpy_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments the kernels cannot read as Arrow gives them (a row whose list is null; counts that are
    not int32) take the NumPy path, with the same figures."""
    rng = np.random.default_rng(4)
    table = token_table(rng, 50, 5, 20)
    lists = table["token_times"].to_pylist()
    lists[7] = None
    nulled = table.set_column(3, "token_times", pa.array(lists, pa.list_(TOKEN_SEGMENT)))
    assert Segments.of(nulled).native_ranges() is None
    assert Segments.of(table).native_ranges() is not None
    wide = pa.list_(pa.struct([("start_s", pa.float64()), ("gap_s", pa.float64()), ("count", pa.int64())]))
    widened = table.set_column(3, "token_times", table["token_times"].cast(wide))
    assert Segments.of(widened).native_ranges() is None
    for t in (nulled, widened):
        for slo in SLOS[:2]:
            ref, got = both(monkeypatch, lambda t=t, slo=slo: (pacing_of(Streams.of(Segments.of(t)), slo),
                                                               itl_sample(Segments.of(t))))
            assert same(ref, got)


@pytest.mark.parametrize("seed", range(4))
def test_pairs_sorted_in_c_is_lexsorts_order(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """The radix sort of (value, weight) pairs gives numpy.lexsort((w, v))'s arrays: ties of value by
    weight, weights in order already (positions: a stable argsort) or not, negative and positive values,
    few and many distinct values; a NaN, a 0 or a negative weight leave it to NumPy's code."""
    _require_kernels()
    rng = np.random.default_rng(seed)
    n = [1, 7, 5000, 300_000][seed]
    for v in (rng.choice(rng.normal(0, 1, max(n // 50, 1)), n), rng.lognormal(-3, 1, n)):
        for w in (rng.integers(1, 300, n), np.arange(n), rng.integers(1, 2 ** 40, n)):
            order = np.lexsort((w, v))
            ref, got = both(monkeypatch, lambda v=v, w=w: pairs_sorted(v, w))
            assert same(got, (v[order], w[order])) and same(ref, got)
            # sorted where they lie, the scratch lent (as ITL's sample sorts its pairs)
            assert NATIVE is not None
            v_in, w_in = v.copy(), w.astype(np.int64)
            assert NATIVE.pairs_sorted_in(v_in, w_in, np.empty(3 * n + 5, dtype=np.int64)) is True
            assert same((v_in, w_in), (v[order], w[order].astype(np.int64)))
    v = rng.lognormal(-3, 1, 100)
    for bad in ("nan", "zero"):
        x = v.copy()
        x[3] = np.nan if bad == "nan" else 0.0
        w = rng.integers(1, 5, 100)
        assert NATIVE is not None
        out_v, out_w = np.empty(100), np.empty(100, dtype=np.int64)
        if bad == "nan":
            assert NATIVE.pairs_sorted(x, w, out_v, out_w) is False
            x_in = x.copy()
            assert NATIVE.pairs_sorted_in(x_in, w.astype(np.int64), np.empty(300, dtype=np.int64)) is False
            assert same(x_in, x)
        ref, got = both(monkeypatch, lambda x=x, w=w: pairs_sorted(x, w))
        assert same(ref, got)
    assert NATIVE.pairs_sorted(v, -np.ones(100, dtype=np.int64), np.empty(100), np.empty(100, dtype=np.int64)) is False


def test_kernels_come_with_the_compiled_core() -> None:
    """Where the compiled core runs, so do the kernels; where it does not (LLMLB_CORE=python, stale, not
    built), none is loaded and the NumPy paths run."""
    core = compiled_core.current(warn=False)
    assert (NATIVE is not None) == core.compiled or (core.compiled and os.environ.get("CI") is None)
    if core.compiled:
        _require_kernels()
        assert NATIVE is not None and NATIVE.__file__.startswith(os.path.join(compiled_core.package_dir(), "_compiled"))
    import subprocess
    import sys

    code = "from llmlb_bench.metrics import kernels; print(kernels.native is None)"
    forced = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LLMLB_CORE": "python"},
                            capture_output=True, text=True, timeout=120, check=True)
    assert forced.stdout.strip() == "True"


@pytest.mark.filterwarnings("ignore:All-NaN slice")      # a stream's NaN last token: NaN service, as in NumPy
@pytest.mark.parametrize("seed", range(6))
def test_fairness_windows_with_the_kernels_are_the_numpy_code_bit_for_bit(monkeypatch: pytest.MonkeyPatch,
                                                                          seed: int) -> None:
    """The windows' service and backlog cells (``fair_service``, ``fair_walk``, ``fair_backlog``) against their NumPy
    paths: rows never started, never sent, without output, streams within one window and over many,
    NaN times, 1-4 tenants, windows of 0.25-10 s; the cells, the rows' windows and the figures alike."""
    _require_kernels()
    from llmlb_bench.metrics.columns import Scratch
    from llmlb_bench.metrics.fairness import INPUT_WEIGHT, OUTPUT_WEIGHT, _backlog, _service, _walk, _windows_of

    rng = np.random.default_rng(seed)
    n, tenants, w = int(rng.integers(1, 3000)), int(rng.integers(1, 5)), float(rng.choice([0.25, 1.0, 10.0]))
    s = rng.uniform(0, 60, n)
    f = s + rng.exponential(0.5, n)
    l = f + rng.exponential(3.0, n) * rng.integers(0, 2, n)          # half the streams within their first token
    n_in, n_out = rng.integers(0, 500, n).astype(float), rng.integers(0, 300, n).astype(float)
    for col, share in ((s, 0.05), (f, 0.1), (l, 0.05)):
        col[rng.random(n) < share] = np.nan
    tn = rng.integers(0, tenants, n)
    nwin = int(max(np.fmax.reduce(x) for x in (s, f, l)) // w) + 1
    cells = tenants * nwin
    scratch = [np.empty(n) for _ in range(2)] + [np.empty(n, np.int64) for _ in range(3)] + \
        [np.empty(n, bool) for _ in range(3)]
    svc = _service(tn, f, l, n_in, n_out, nwin, w, cells, *scratch)
    jf, jl, many = scratch[2].copy(), scratch[3].copy(), scratch[7].copy()
    got = np.zeros(cells)
    got_jf, got_jl, got_many = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, bool)
    assert NATIVE.fair_service(tn, f, l, n_in, n_out, nwin, w, float(INPUT_WEIGHT), float(OUTPUT_WEIGHT), got,
                               got_jf, got_jl, got_many)
    assert same(svc, got) and same(jf, got_jf) and same(jl, got_jl) and same(many, got_many)
    _walk(svc, many, f, l, n_out, jf, jl, tn, nwin, w, Scratch())
    assert NATIVE.fair_walk(tn, f, l, n_out, jf, jl, many, nwin, w, float(OUTPUT_WEIGHT), got)
    assert same(svc, got) and np.count_nonzero(many) > 0
    backlog = np.zeros(cells + 1, dtype=bool)
    assert NATIVE.fair_backlog(tn, s, f, l, nwin, w, backlog)
    assert same(_backlog(tn, s, f, l, nwin, w, cells, *scratch[:1], *scratch[2:5], *scratch[5:]), backlog)
    # a cell outside the array: the kernel declines, the NumPy path decides
    assert not NATIVE.fair_service(tn, f, l, n_in, n_out, 1, w, 1.0, 2.0, np.zeros(1), got_jf, got_jl, got_many) \
        or (nwin == 1 and tenants == 1)
    reference, fast = both(monkeypatch, lambda: _windows_of(tn, s.copy(), f.copy(), l.copy(), n_in, n_out, tenants, w,
                                                              Scratch()))
    assert same(reference, fast)
