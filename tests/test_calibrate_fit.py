"""The calibration fit's decode observations when the server bundles tokens into chunks.

A server falling behind its engine (a loaded machine) sends several steps' tokens in one chunk.
Plain differences of arrival times then read as zeros and one long gap, and a window whose median
gap was zero made the fit divide by zero (``ValueError: array must not contain infs or NaNs`` from
the fit under load). Each chunk's wait is now shared by its tokens."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.calibrate.fit import observations, step_gaps
from llmlb_bench.calibrate.probes import ProbeRun


def test_one_token_per_chunk_gives_the_plain_differences():
    t = np.array([0.1, 0.13, 0.2, 0.21, 0.4])
    assert np.array_equal(step_gaps(t), np.diff(t))


def test_a_chunk_shares_its_wait_among_its_tokens():
    # first arrival alone, then a chunk of 3 after 0.3 s, then one token 0.1 s later
    gaps = step_gaps(np.array([1.0, 1.3, 1.3, 1.3, 1.4]))
    assert gaps == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # tokens sharing the window's first arrival have no earlier arrival: no gap
    assert step_gaps(np.array([2.0, 2.0, 2.5])) == pytest.approx([0.5])


def _bundled_row(request_id: int, step_s: float, tokens: int, per_chunk: int) -> dict:
    """A streamed request whose tokens came ``per_chunk`` at a time, one chunk every
    ``per_chunk`` steps of ``step_s``."""
    chunks = [{"start_s": 0.5 + step_s * per_chunk * j, "gap_s": 0.0, "count": per_chunk}
              for j in range(tokens // per_chunk)]
    return {"request_id": request_id, "status": "ok", "error": None, "sent_s": 0.0,
            "first_token_s": chunks[0]["start_s"], "last_token_s": chunks[-1]["start_s"],
            "token_times": chunks, "input_tokens": 64, "server_input_tokens": 64,
            "output_tokens": tokens}


def test_a_decode_window_delivered_in_chunks_reads_as_its_steps():
    step = 0.01
    rows = [_bundled_row(i, step, tokens=48, per_chunk=3) for i in range(2)]
    # the plain differences would be two zeros per chunk: median 0
    t = np.sort(np.concatenate([c["start_s"] + np.zeros(c["count"]) for c in rows[0]["token_times"]]))
    assert np.median(np.diff(t)) == 0
    obs, notes, windows = observations([ProbeRun("decode", {"batch": 2, "context": 64}, rows)], budget=256)
    (decode,) = [o for o in obs if o.probe == "decode"]
    assert decode.measured_s == pytest.approx(step)
    assert all(np.all(w > 0) for w in windows)


def _stream_row(request_id: int, times: np.ndarray, tokens: int) -> dict:
    """A streamed request whose visible tokens arrived at ``times`` (one per read) of ``tokens`` made."""
    return {"request_id": request_id, "status": "ok", "error": None, "sent_s": 0.0,
            "first_token_s": float(times[0]), "last_token_s": float(times[-1]),
            "token_times": [{"start_s": float(t), "gap_s": 0.0, "count": 1} for t in times],
            "input_tokens": 16, "server_input_tokens": 16, "output_tokens": tokens}


def test_tokens_that_stream_no_text_are_not_read_as_slow_steps():
    """Issue 28: a random model's partial UTF-8 bytes stream no text (13% of the decode probes'
    tokens on vLLM CPU), so one request's next gap spans two steps and read as a slow step at 2x.
    The window's steps are read from all its requests together: only the planted slow steps
    remain, at their factor."""
    from llmlb_bench.calibrate.dispersion import dispersion
    from llmlb_bench.calibrate.fit import engine_steps

    rng = np.random.default_rng(5)
    step, n, slow = 0.005, 80, {12: 1.6, 40: 1.6, 41: 1.6, 66: 1.8}
    ends = 0.5 + np.cumsum([step * slow.get(k, 1.0) for k in range(n)])
    rows = []
    for i in range(4):
        shown = rng.random(n) > 0.13
        shown[[0, n - 1]] = True                # the window's bounds stay where they are
        reads = ends + rng.uniform(0.0, 0.0003, n)      # each stream's reads a little apart
        rows.append(_stream_row(i, reads[shown], n))
    obs, notes, windows = observations([ProbeRun("decode", {"batch": 4, "context": 16}, rows)], budget=256)
    (w,) = windows
    assert w.size == n - 1                      # every step after the window's first read, none twice
    got = dispersion(windows)
    assert got["slow_phases"] == 3
    assert got["slow_factor"] == pytest.approx((1.6 * 3 + 1.8) / 4, rel=0.03)
    # one request alone (what the spread read before) has the hidden tokens' 2x gaps as slow steps too
    one = [step_gaps(np.array([c["start_s"] for c in r["token_times"]])) for r in rows]
    assert dispersion([max(one, key=len)])["slow_phases"] > 3
    # with one request the steps are that request's own gaps
    t = np.array([c["start_s"] for c in rows[0]["token_times"]])
    assert np.allclose(engine_steps(rows[:1], t[0], t[-1]), step_gaps(t))


def test_a_request_that_did_not_stream_neither_bounds_nor_leaves_the_window():
    """Transformers serve, sixteen requests sent at once: one request showed its first token and then 47
    that decode to no text, another got all 48 in one read at the end. Bounded by every request, the
    window came out negative and the group was lost. Bounded by the requests that streamed (the group's
    others, one read a step), it holds their steps; the two still count in the batch, at the streamed
    requests' median place in their output, and the window is the one without them."""
    from llmlb_bench.calibrate.fit import decode_window

    step, n = 0.02, 48
    ends = 0.5 + step * np.arange(n)
    rows = [_stream_row(i, ends + 0.001 * i, n) for i in range(4)]
    early = _stream_row(4, ends[:1], n)                    # its only visible token: the first
    late = {**_stream_row(5, ends[-1:] + 0.3, n), "token_times": [{"start_s": float(ends[-1] + 0.3),
                                                                   "gap_s": 0.0, "count": n}]}
    alone = decode_window(rows)
    assert alone is not None
    gaps, context, t0, t1 = alone
    got = decode_window(rows + [early, late])
    assert got is not None
    assert (got[2], got[3]) == (t0, t1) and t1 - t0 > 0.5
    assert all(np.array_equal(a, b) for a, b in zip(got[0], gaps)) and len(got[0]) == 4
    assert got[1] == pytest.approx(context * 6 / 4)       # same prompts, same place: six alike
    # bounded by all six, as before: the early one's last visible token precedes the others' first ones
    assert min(r["last_token_s"] for r in rows + [early, late]) < max(r["first_token_s"] for r in rows + [early, late])
    obs, _, _ = observations([ProbeRun("decode", {"batch": 6, "context": 16}, rows + [early, late])], budget=256)
    (decode,) = obs
    assert decode.measured_s == pytest.approx(step, rel=0.01) and decode.features[1] == 6
