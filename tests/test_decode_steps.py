"""The decode steps by batch that `llmlb validate` reads from both sides' streamed tokens
(llmlb_bench/decode_steps.py), against runs built from a known step series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmlb_bench.decode_steps import MIN_STEPS, by_batch, decode_steps


def engine(starts: list[int], tokens: list[int], step_of: object = lambda batch: 0.010 + 0.002 * batch,
           bundle: int = 1) -> tuple[list[dict], list[tuple[float, int]]]:
    """Rows of a made-up engine: request k is admitted at step ``starts[k]`` (its prefill ends that step
    with its first token) and gets one token at the end of every step after, ``tokens[k]`` in all. A step's
    length is ``step_of(requests in it)``. With ``bundle`` > 1 every request reads its tokens that many at a
    time (a server behind its engine). Returns the rows and, per pure decode step (no first token in it,
    someone decoding through it), its length and the requests decoding through it."""
    n_steps = max(s + t for s, t in zip(starts, tokens)) + 1
    t, ends = 0.0, []
    active = [[k for k, (s, n) in enumerate(zip(starts, tokens)) if s <= j < s + n] for j in range(n_steps)]
    for j in range(n_steps):
        t += step_of(len(active[j])) if active[j] else 0.001     # an idle engine polls
        ends.append(t)
    rows, truth = [], []
    for k, (s, n) in enumerate(zip(starts, tokens)):
        times = [ends[j] for j in range(s, s + n)]
        segs = [{"start_s": times[i + bundle - 1] if i + bundle - 1 < len(times) else times[-1],
                 "gap_s": 0.0, "count": len(times[i:i + bundle])} for i in range(0, len(times), bundle)]
        rows.append({"request_id": k, "status": "ok", "sent_s": 0.0, "first_token_s": times[0],
                     "last_token_s": times[-1], "output_tokens": n, "token_times": segs})
    for j in range(1, n_steps):
        first_here = any(s == j for s in starts)
        through = [k for k, (s, n) in enumerate(zip(starts, tokens)) if s < j < s + n]
        if through and not first_here:
            truth.append((ends[j] - ends[j - 1], len(through)))
    return rows, truth


def test_each_decode_step_is_read_with_its_length_and_batch():
    """Staggered admissions and ends (batches 1-6): every pure decode step comes back, in order, with its
    length and the requests decoding through it; the steps that carry a first token are left out."""
    rng = np.random.default_rng(3)
    starts = sorted(rng.integers(0, 60, 14).tolist())
    rows, truth = engine(starts, rng.integers(3, 30, 14).tolist())
    gaps, batch = decode_steps(rows)
    assert len(truth) > 40 and batch.max() >= 4
    assert batch.tolist() == [b for _, b in truth]
    assert gaps == pytest.approx([g for g, _ in truth], rel=1e-9)
    assert gaps == pytest.approx(0.010 + 0.002 * batch, rel=1e-9)     # the engine's step at that batch


def test_bundled_reads_count_as_the_steps_they_carry():
    """A server that delivers two steps per read: each read spans two steps, and the per-token length is
    half of it (the lockstep batch of 3, so every step is 3 wide)."""
    rows, _ = engine([0, 0, 0], [21, 21, 21], step_of=lambda b: 0.020, bundle=2)
    gaps, batch = decode_steps(rows)
    assert gaps.size >= 8 and set(batch.tolist()) == {3}
    assert gaps == pytest.approx(np.full(gaps.size, 0.020), rel=1e-9)


def test_a_run_without_streamed_steps_reads_as_empty():
    rows, _ = engine([0], [1])
    assert decode_steps(rows)[0].size == 0
    assert decode_steps([dict(rows[0], status="error")])[0].size == 0
    assert by_batch([rows], [rows]) == []


def test_the_sides_are_compared_per_batch_bucket():
    """The simulated engine 10% slower at every step: every bucket with steps on both sides reads +10%;
    a bucket only one side reaches is listed with n/a on the other."""
    starts, tokens = [0, 0, 2, 5, 5, 9, 30], [25, 12, 20, 18, 6, 14, 20]
    real, truth = engine(starts, tokens)
    sim, _ = engine(starts, tokens, step_of=lambda b: 1.1 * (0.010 + 0.002 * b))
    lone, _ = engine([0], [40])
    out = by_batch([real, real], [sim, lone])
    by_name = {b.batch: b for b in out}
    per_batch = np.bincount([b for _, b in truth])
    assert set(by_name) == {"1", "3-4", "5-8"} and per_batch[2] < MIN_STEPS / 2 <= per_batch[1]
    assert by_name["3-4"].real_steps == 2 * sum(per_batch[3:5])     # both real runs, pooled
    for b in out:
        if b.real_steps >= MIN_STEPS and b.sim_steps >= MIN_STEPS and b.batch != "1":
            assert b.ratio == pytest.approx(0.1, rel=1e-9), b
    # batch 1: the simulated side pools the lone run's 39 steps at 12 ms with the 10%-slower ones
    assert by_name["1"].sim_steps > by_name["1"].real_steps
    only_real = by_batch([real], [lone])
    assert all(math.isnan(b.sim_s) and math.isnan(b.ratio) for b in only_real if b.batch != "1")


def test_a_long_run_is_read_over_its_first_reads_only(monkeypatch):
    """More streamed reads than READ_LIMIT (lowered here to 500): the steps come from the run's first
    READ_LIMIT reads, each still with its exact length and batch."""
    import llmlb_bench.decode_steps as ds

    monkeypatch.setattr(ds, "READ_LIMIT", 500)
    rows, truth = engine(list(range(0, 40, 2)), [60] * 20, step_of=lambda b: 0.010)
    gaps, batch = decode_steps(rows)
    assert sum(r["output_tokens"] for r in rows) > 500 and 0 < gaps.size < len(truth)
    assert batch.tolist() == [b for _, b in truth][:gaps.size]
    assert gaps == pytest.approx(0.010, rel=1e-9)


def test_the_counting_matches_the_definition_on_ragged_reads():
    """Reads of one step that arrive a little apart (each request's own delay), one-token requests that
    start and end inside one step's read group, and a few bundled reads: the batch of every step equals
    the definition, counted request by request (first token at or before the step's start, last at or
    after its end), and the steps that sample a first token are the ones left out."""
    from llmlb_bench.calibrate.fit import step_reads
    from llmlb_bench.calibrate.probes import token_times

    rng = np.random.default_rng(11)
    starts = sorted(rng.integers(0, 80, 40).tolist())
    tokens = [1 if k % 5 == 0 else int(rng.integers(2, 30)) for k in range(40)]
    rows, _ = engine(starts, tokens)
    for k, row in enumerate(rows):          # request k reads 0-3 ms late, the same at every read
        late = 1e-4 * (k % 31)
        row["token_times"] = [dict(seg, start_s=seg["start_s"] + late) for seg in row["token_times"]]
        row["first_token_s"] += late
        row["last_token_s"] += late
    gaps, batch = decode_steps(rows)
    at, counts = step_reads(rows, -math.inf, math.inf)
    spans = [token_times(r) for r in rows]
    want_gaps, want_batch = [], []
    for j in range(at.size - 1):
        through = sum(t[0] <= at[j] and t[-1] >= at[j + 1] for t in spans)
        sampled = any(at[j + 1] <= t[0] and (j + 2 == at.size or t[0] < at[j + 2]) for t in spans)
        if through and not sampled:
            want_gaps.append((at[j + 1] - at[j]) / counts[j + 1])
            want_batch.append(through)
    assert any(t.size == 1 for t in spans) and len(want_batch) > 30
    assert batch.tolist() == want_batch
    assert gaps == pytest.approx(want_gaps, rel=1e-12)
