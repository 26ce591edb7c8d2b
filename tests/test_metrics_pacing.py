"""Fluidity index, fluid token generation rate and the slowest-10% gap mean."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.metrics.pacing import (Segments, Streams, _pivots, deadline_walk, fluid_deadlines, largest_gaps,
                                        pacing, pacing_of, slowest_gap_mean, subset)
from llmlb_bench.metrics.run_figures import PacingFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sample import blocks, is_sampled, token_rows
from llmlb_bench.metrics.sql import request_metrics_sql
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg, store_run
from shape_check import mismatches


def etalon_walk(gaps, ttft_deadline, tbt_deadline, ignore_first=False):
    """A line-by-line transcription of Etalon's ``get_request_level_deadline_miss_rate``."""
    total = missed = 0
    slack = 0.0
    for i, t in enumerate(gaps):
        if i == 0:
            if ignore_first:
                continue
            if t <= ttft_deadline + slack:
                slack += ttft_deadline - t
                total += 1
                continue
            late = 1 + (t - slack - ttft_deadline) // tbt_deadline
        else:
            if t <= tbt_deadline + slack:
                slack += tbt_deadline - t
                total += 1
                continue
            late = (t - slack) // tbt_deadline
        missed += int(late)
        total += int(late)
        slack = 0.0
    return missed, total


def streams(rows: Sequence[tuple[float, Sequence[dict[str, Any]]]]) -> Streams:
    """Streams from (ttft, segments) pairs."""
    return Streams.from_arrow(pa.table({
        "request_id": list(range(len(rows))), "slo_class": [None] * len(rows),
        "ttft": [r[0] for r in rows], "token_times": pa.array([r[1] for r in rows], pa.list_(TOKEN_SEGMENT))}))


#: ttft 0.5, three gaps of 0.125, a stall of 0.9375, two gaps of 0.0625 (exact binary fractions)
HAND = (0.5, [seg(0.5, 0.125, 4), seg(1.8125, 0.0625, 3)])


def test_fluidity_of_the_hand_request():
    # D_p = 1, D_d = 0.125: first token met (slack 0.5); 3 met (slack stays 0.5);
    # the 0.9375 stall misses floor((0.9375 - 0.5) / 0.125) = 3 deadlines (slack -> 0); 2 met.
    missed, total = deadline_walk(streams([HAND]), np.array([0.125]), np.array([1.0]))
    assert (missed[0], total[0]) == (3, 9)


def test_fluid_deadline_of_the_hand_request():
    # no miss allowed (10% of ~6 deadlines < 1): 0.9375 <= D + 3 (D - 0.125)  <=>  D >= 0.328125
    [d] = fluid_deadlines(streams([HAND]))
    assert d == pytest.approx(0.328125, abs=0.9375 * 2 ** -12)


def test_walk_matches_etalon_on_random_streams():
    rng = np.random.default_rng(5)
    rows, gaps = [], []
    for _ in range(200):
        t = ttft = float(rng.uniform(0.05, 1.0))
        segs, g = [], [ttft]
        for k in range(rng.integers(1, 8)):
            gap, count = float(rng.choice([0.0, rng.uniform(0.01, 0.2)])), int(rng.integers(1, 12))
            if k:   # the gap from the previous segment's last token, computed as the walk does
                g.append(t - (segs[-1]["start_s"] + segs[-1]["gap_s"] * (segs[-1]["count"] - 1)))
            segs.append(seg(t, gap, count))
            g += [gap] * (count - 1)
            t = t + gap * (count - 1) + float(rng.exponential(0.1))
        rows.append((ttft, segs))
        gaps.append(g)
    s = streams(rows)
    for ignore in (False, True):
        missed, total = deadline_walk(s, np.full(200, 0.05), None if ignore else np.full(200, 0.4))
        want = np.array([etalon_walk(g, 0.4, 0.05, ignore) for g in gaps])
        assert (missed == want[:, 0]).all() and (total == want[:, 1]).all()
    # the K-ary search lands where Etalon's miss rate first drops to 10%
    found = fluid_deadlines(s)
    for g, d in zip(gaps[:40], found[:40]):
        hi_m, hi_t = etalon_walk([0] + g[1:], 0, d, True)
        assert hi_m <= 0.1 * hi_t
        lo_m, lo_t = etalon_walk([0] + g[1:], 0, d - max(g[1:], default=0) * 2 ** -11, True)
        assert d == 0 or lo_m > 0.1 * lo_t


@pytest.mark.parametrize("dictionary", [False, True])
def test_each_request_walks_at_its_own_class_deadlines(dictionary):
    """Per-class limits reach each request (the column plain or dictionary-encoded, as Parquet may
    hand it): a class without a TPOT limit is not judged, a request without a class takes the
    default limits."""
    classes = pa.array(["tight", None, "batch", "tight"])
    if dictionary:
        classes = classes.dictionary_encode()
    s = Streams.from_arrow(pa.table({
        "request_id": range(4), "slo_class": classes, "ttft": [HAND[0]] * 4,
        "token_times": pa.array([HAND[1]] * 4, pa.list_(TOKEN_SEGMENT))}))
    fl = pacing_of(s, Slo.parse("ttft=1s,tpot=125ms;tight:ttft=1s,tpot=62.5ms;batch:e2e=60s"))["fluidity"]
    # default (D_d = 0.125): 3 of 9 deadlines missed (test_fluidity_of_the_hand_request)
    tight = etalon_walk([0.5, 0.125, 0.125, 0.125, 0.9375, 0.0625, 0.0625], 1.0, 0.0625)
    assert fl["requests"] == 3
    assert fl["mean"] == pytest.approx((2 * (1 - tight[0] / tight[1]) + 6 / 9) / 3)


def test_slowest_ten_percent_mean():
    # gaps: 0.125 x3, 0.9375, 0.0625 x2 and 0.5 x13, 0.75 -> N = 20, top 2: 0.9375 and 0.75
    s = streams([HAND, (0.1, [seg(0.1, 0.5, 14), seg(7.35, 0.0, 1)])])
    assert slowest_gap_mean(s) == pytest.approx((0.9375 + 0.75) / 2)
    # a fractional boundary: N = 6, ceil(0.6) = 1 gap
    assert slowest_gap_mean(streams([HAND])) == pytest.approx(0.9375)


def test_pacing_of_a_stored_run(tmp_path):
    store_run(tmp_path, "p", {
        "request_id": [0, 1], "sent_s": [0.0, 0.0], "scheduled_s": [0.0, 0.0], "status": ["ok", "ok"],
        "first_token_s": [0.5, 0.1], "last_token_s": [1.9375, 0.1],
        "token_times": [HAND[1], [seg(0.1, 0.0, 1)]], "output_tokens": [7, 1], "slo_class": ["chat", "chat"]})
    cat = Catalog([tmp_path])
    cat.con.execute(request_metrics_sql())
    out = pacing({"p": Segments.of(token_rows(cat, "p", 2, 0, 1, sample=10))}, {"p": False}, Slo.parse("ttft=1s,tpot=125ms"))["p"]
    fl = out["fluidity"]
    assert fl["requests"] == 2 and fl["mean"] == pytest.approx((6 / 9 + 1.0) / 2)
    assert fl["share_ge_0.9"] == 0.5
    # p99 of the fluid deadlines {0.328125, 0} -> 0.99 * 0.328125
    assert out["fluid_token_rate"] == pytest.approx(1 / (0.99 * 0.328125), rel=1e-3)
    assert out["sampled"] is False
    # the fluidity share's key names FLUIDITY_LEVEL, and the section has the shape run_figures.py declares
    assert mismatches(out, PacingFigures, "pacing") == []


def test_block_sample_of_a_large_run():
    """20 evenly spaced blocks of consecutive ids, about the sample's size in all, first and last ids included."""
    ranges = blocks(1000, 0, 999_999)
    assert len(ranges) == 20 and all(b - a + 1 == 50 for a, b in ranges)
    assert ranges[0][0] == 0 and ranges[-1][1] == 999_999
    assert is_sampled(2000, 0, 1999, 1000) and not is_sampled(500, 0, 499, 1000)


def test_slowest_ten_percent_mean_matches_the_expanded_gaps_with_ties():
    """The partial selection gives the brute-force mean of the largest 10% of all gaps, ties included."""
    rng = np.random.default_rng(5)
    for n in (1, 7, 5000):
        value = np.round(rng.exponential(0.05, n), 3)             # rounded: many equal gaps
        mult = rng.integers(1, 6, n)
        s = Streams(ttft=np.zeros(1), slo_class=np.zeros(1, np.intp), classes=[None], rank_of=np.zeros(1, np.int64), value=value, mult=mult,
                    offsets=np.array([0, n]))
        gaps = np.sort(np.repeat(value, mult))[::-1]
        assert slowest_gap_mean(s) == pytest.approx(gaps[:math.ceil(0.1 * len(gaps))].mean(), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 57, 400])
def test_pruned_search_gives_the_same_quantile_bit_for_bit(n):
    """Requests leave the search once they cannot be the quantile's order statistics; the quantile
    must come out exactly as from every request's own deadline (and it must prune something)."""
    rng = np.random.default_rng(n)
    rows = []
    for _ in range(n):
        t = ttft = float(rng.uniform(0.05, 1.0))
        segs = []
        for _ in range(rng.integers(1, 30)):
            gap, count = float(rng.choice([0.0, rng.lognormal(-3, 1)])), int(rng.integers(1, 20))
            segs.append(seg(t, gap, count))
            t = t + gap * (count - 1) + float(rng.exponential(0.1))
        rows.append((ttft, segs))
    s = streams(rows)
    every = fluid_deadlines(s)
    for q in (0.0, 0.5, 0.99, 1.0):
        pruned = fluid_deadlines(s, q)
        assert np.quantile(pruned, q) == np.quantile(every, q)
        if n >= 57:
            assert (pruned != every).any()    # some requests left the search early


@pytest.mark.parametrize("seed", [1, 2])
def test_requests_left_out_before_the_search_keep_the_quantile_bit_for_bit(seed):
    """The common-deadline walks (pacing._pivots) leave most requests out before the search; the
    quantiles come out exactly as from every request's own deadline, whether the first guess was
    too high (lowered), low (raised) or fine."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(1500):
        t = ttft = float(rng.uniform(0.05, 1.0))
        step = float(rng.lognormal(-3.5, 0.3))
        segs = []
        for _ in range(rng.integers(1, 12)):
            count = int(rng.integers(1, 40))
            segs.append(seg(t, step if rng.random() < 0.9 else 0.0, count))
            t = t + step * (count - 1) + float(rng.exponential(0.05)) * (rng.random() < 0.3)
        rows.append((ttft, segs))
    s = streams(rows)
    every = fluid_deadlines(s)
    for q in (0.5, 0.9, 0.99, 0.999):
        assert np.quantile(fluid_deadlines(s, q), q) == np.quantile(every, q)
    # at the 99th percentile most requests never enter the search, from any first guess: a largest gap
    # scaled up (the guess too high, lowered) or down (too low, raised)
    i = math.floor(0.99 * (s.n - 1))
    for scale in (0.3, 1.0, 3.0):
        live, walked = _pivots(s, scale * largest_gaps(s), np.full(s.n, 1e-9), i)
        assert 0 < live.sum() < s.n / 4 and walked.n == live.sum()
        assert (every[live].min() > np.sort(every)[i - 1] - 0.01) or live.sum() > s.n - i


def test_subset_walks_each_kept_request_as_the_whole_does():
    rng = np.random.default_rng(3)
    rows = [(0.2, [seg(0.2, float(rng.uniform(0.01, 0.1)), int(rng.integers(2, 9))),
                   seg(3.0, 0.05, int(rng.integers(1, 5)))][: int(rng.integers(1, 3))]) for _ in range(30)]
    s = streams(rows)
    keep = rng.random(30) < 0.4
    d = rng.uniform(0.01, 0.2, 30)
    whole, part = deadline_walk(s, d, None), deadline_walk(subset(s, keep), d[keep], None)
    assert (whole[0][keep] == part[0]).all() and (whole[1][keep] == part[1]).all()


def random_rows(rng: np.random.Generator, n: int, segments: int, tokens: int) -> list[tuple[float, list[dict[str, Any]]]]:
    """``n`` requests' (ttft, segments): 1 to ``segments`` - 1 segments each of 1 to ``tokens`` - 1
    tokens, spaced 0 (a chunk at once) or 5-120 ms, with waits between segments; unround times."""
    rows = []
    for _ in range(n):
        t = ttft = float(rng.uniform(0.05, 1.0))
        segs = []
        for _ in range(rng.integers(1, segments)):
            gap, count = float(rng.choice([0.0, rng.uniform(0.005, 0.12)])), int(rng.integers(1, tokens))
            segs.append(seg(t, gap, count))
            t = t + gap * (count - 1) + float(rng.exponential(0.08))
        rows.append((ttft, segs))
    return rows


def test_lanes_and_busy_positions_walk_each_request_as_one_lane_entry_by_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk of K lanes gives each lane, bit for bit, what walking it alone gives, a lane with a NaN
    first-token deadline what a walk without one gives (pacing_of fuses the fluidity walk with the
    fluid rate's first walk so), and a busy position's gathered walk of its stalls what the
    entry-by-entry arithmetic of the quiet positions gives: 1,500 random streams, so that early
    positions are busy, with stalls whose slack runs out and stalls it covers, and unround times."""
    import llmlb_bench.metrics.pacing as pacing_module

    rng = np.random.default_rng(11)
    s = streams(random_rows(rng, 1500, 9, 15))
    d = np.column_stack([rng.uniform(0.01, 0.1, s.n), np.full(s.n, 0.04)])
    dp = np.column_stack([rng.uniform(0.1, 0.8, s.n), np.full(s.n, np.nan)])
    fused = deadline_walk(s, d, dp)
    apart = deadline_walk(s, d[:, 0], dp[:, 0]), deadline_walk(s, d[:, 1], None)
    monkeypatch.setattr(pacing_module, "_GATHER_FROM", 1 << 62)     # every position entry by entry
    quiet = deadline_walk(s, d, dp)
    assert int((s.offsets[1:] - s.offsets[:-1] >= 1000).sum()) > 0
    for lane in range(2):
        for got in (fused, quiet):
            assert got[0][:, lane].tobytes() == apart[lane][0].tobytes()
            assert got[1][:, lane].tobytes() == apart[lane][1].tobytes()
    assert (fused[0] > 0).any() and (fused[0] == 0).any()


def test_streams_and_pacing_do_not_depend_on_the_rows_order() -> None:
    """Token rows taken whole from the kept sample come in its file's order (metrics.sample): the
    layout ranks requests of equal length by request id, and the fluidity mean sums by request id,
    so the streams' entries and every pacing figure equal, bit for bit, those of the same rows by id
    (600 requests of few segments: many of equal length; unround times)."""
    rng = np.random.default_rng(8)
    rows = random_rows(rng, 600, 4, 6)
    table = pa.table({"request_id": np.arange(600) * 3 + 5, "slo_class": [None] * 600,
                      "ttft": [r[0] for r in rows], "token_times": pa.array([r[1] for r in rows], pa.list_(TOKEN_SEGMENT))})
    shuffled = table.take(pa.array(rng.permutation(600)))
    a, b = Streams.from_arrow(table), Streams.from_arrow(shuffled)
    assert a.by_id is None and b.by_id is not None
    for f in ("value", "mult", "offsets"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
    for slo in (Slo.parse("ttft=400ms,tpot=40ms"), Slo.parse("ttft=100ms,tpot=7ms")):
        assert pacing_of(a, slo) == pacing_of(b, slo)
    assert len(np.unique(np.diff(a.offsets))) < 600


def test_itl_gaps_are_the_sql_definitions_to_the_last_bit(tmp_path):
    """ITL's gaps in NumPy (metrics.latency.itl_gaps, from the token rows pacing reads too) against
    the SQL that defines them (metrics.sql.itl_gaps_sql, docs/metrics.md) on random token times:
    segments of one token, of gap 0 (a chunk of several tokens at once) and of many, one to five per
    request, unround times. The pairs (value, multiplicity) must be equal, bit for bit."""
    from llmlb_bench.metrics.latency import itl_gaps
    from llmlb_bench.metrics.sql import itl_gaps_sql

    rng = np.random.default_rng(7)
    rows = []
    for _ in range(300):
        t = float(rng.uniform(0, 10))
        segs = []
        for _ in range(int(rng.integers(1, 6))):
            gap = 0.0 if rng.random() < 0.2 else float(rng.lognormal(np.log(0.02), 0.5))
            count = int(rng.integers(1, 40))
            segs.append(seg(t, gap, count))
            t += gap * (count - 1) + float(rng.exponential(0.05))
        rows.append(segs)
    n = len(rows)
    store_run(tmp_path, "g", {"request_id": list(range(n)), "sent_s": [0.0] * n, "scheduled_s": [0.0] * n,
                              "status": ["ok"] * n, "first_token_s": [r[0]["start_s"] for r in rows],
                              "last_token_s": [t] * n, "token_times": rows, "output_tokens": [50] * n})
    cat = Catalog([tmp_path])
    cat.con.execute(request_metrics_sql())
    sql = cat.query(f"SELECT v, w FROM ({itl_gaps_sql()})")
    want = sorted(zip(sql.column("v").to_pylist(), sql.column("w").to_pylist()))
    v, w, between = itl_gaps(Segments.of(token_rows(cat, "g", n, 0, n - 1, sample=n)))
    got = list(zip(v.tolist(), w.tolist())) + [(b, 1) for b in between.tolist()]
    assert len(want) > 600 and len(between) > 100 and sorted(got) == want
