"""A replica's timeline (sim/timeline.py) keeps its runs as typed columns: what ``arrays`` returns
after runs were added, cut and dropped must be exactly the runs as they were appended, and a step's
end time the same from the scalar and the vectorised look-up."""

from __future__ import annotations

import numpy as np

from llmlb_bench.sim.timeline import Timeline, step_end_times


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
