"""A replica's timeline (sim/timeline.py) keeps its runs as typed columns: what ``arrays`` returns
after runs were added, cut and dropped must be exactly the runs as they were appended, and a step's
end time the same from the scalar and the vectorised look-up; several replicas' timelines joined for
a results batch must give each request what its own replica's timeline gives."""

from __future__ import annotations

import numpy as np

from llmlb_bench.sim.timeline import Timeline, decode_energy, joined, step_end_times, token_segments


def test_columns_follow_appends_cuts_and_drops() -> None:
    rng = np.random.default_rng(5)
    tl = Timeline()
    runs: list[tuple[int, float, float, int, float]] = []     # the reference: one tuple per run
    step, t = 1, 0.0
    for round_ in range(60):
        for _ in range(int(rng.integers(0, 6))):
            n = int(rng.integers(1, 9))
            gap, energy = float(rng.uniform(0.01, 0.05)), float(rng.uniform(0.1, 2.0))
            tl.add(step, t, gap, n, energy)
            runs.append((step, t, gap, n, energy))
            step, t = step + n, t + n * gap
        if runs and round_ % 3 == 0:      # the run in flight is cut (to 0 steps: dropped)
            first, start, gap, n, energy = runs[-1]
            keep = int(rng.integers(0, n))
            tl.truncate_last(keep)
            if keep:
                runs[-1] = (first, start, gap, keep, energy)
            else:
                runs.pop()
            step, t = first + keep, start + keep * gap
        if runs and round_ % 4 == 1:
            cut = int(rng.integers(runs[0][0], step + 1))
            tl.drop_before(cut)
            while len(runs) > 1 and runs[1][0] <= cut:
                runs.pop(0)
        got = tl.arrays()
        assert len(tl) == len(runs)
        assert [c.dtype for c in got] == [np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64),
                                          np.dtype(np.int64), np.dtype(np.float64)]
        for k, column in enumerate(got):
            assert column.tolist() == [r[k] for r in runs]
        if runs:
            steps = np.arange(runs[0][0], step)
            assert step_end_times(got, steps).tolist() == [tl.step_end(int(s)) for s in steps]
    assert len(runs) > 5


def test_an_empty_timeline_converts_to_empty_columns() -> None:
    assert [len(c) for c in Timeline().arrays()] == [0] * 5


def _random_timeline(rng: np.random.Generator, step: int) -> Timeline:
    """Runs from ``step`` on, with idle gaps between some of them (as a replica's timeline is after
    a results batch dropped its old runs)."""
    tl = Timeline()
    t = float(rng.uniform(0, 100))
    for _ in range(int(rng.integers(1, 30))):
        n, gap = int(rng.integers(1, 50)), float(rng.uniform(0.01, 0.05))
        tl.add(step, t, gap, n, float(rng.uniform(0.1, 2.0)))
        step, t = step + n, t + n * gap + float(rng.choice([0.0, rng.uniform(0, 3)]))
    return tl


def _random_spans(rng: np.random.Generator, tl: Timeline, requests: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token step ranges of ``requests`` requests (one to three spans each) within ``tl``."""
    lo, hi = tl.first[0], tl.first[-1] + tl.count[-1] - 1
    per = rng.integers(1, 4, size=requests)
    ends = np.sort(rng.integers(lo, hi + 1, size=(int(per.sum()), 2)), axis=1)
    return ends[:, 0].copy(), ends[:, 1].copy(), per


def test_joined_timelines_give_each_replicas_times_and_energy_bit_for_bit() -> None:
    """A results batch cuts all replicas' requests from their timelines joined (``joined``): every
    step end, decode energy share and token segment must be what the replica's own timeline gives."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        timelines = [_random_timeline(rng, int(rng.integers(1, 10_000))) for _ in range(int(rng.integers(1, 6)))]
        spans = [_random_spans(rng, tl, int(rng.integers(1, 40))) for tl in timelines]
        tl, shifts, before = joined(timelines)
        a = np.concatenate([s[0] + shift for s, shift in zip(spans, shifts)])
        b = np.concatenate([s[1] + shift for s, shift in zip(spans, shifts)])
        per = np.concatenate([s[2] for s in spans])
        lead = np.full(len(per), np.nan)
        own = [joined([t]) for t in timelines]
        assert shifts[0] == 0
        assert step_end_times(tl, a).tolist() == np.concatenate(
            [step_end_times(o[0], s[0]) for o, s in zip(own, spans)]).tolist()
        assert decode_energy(tl, before, a, b, per).tolist() == np.concatenate(
            [decode_energy(o[0], o[2], *s) for o, s in zip(own, spans)]).tolist()
        assert token_segments(tl, a, b, per, lead).to_pylist() == [
            row for o, s in zip(own, spans) for row in token_segments(o[0], *s, np.full(len(s[2]), np.nan)).to_pylist()]
