"""From probe results to the profile's step-time coefficients, and the residuals of the fit.

Every observation is a measured time that the model of :mod:`llmlb_bench.sim.profile`
writes as a sum of step times, so it is linear in the coefficients
(``base_s, per_token_s, per_sample_s, per_attn_s, per_kv_s, per_dense_s``) plus the request
overhead: a lone prefill of P prompt tokens of which c are cached runs
ceil((P - c) / budget) chunks, each of s new tokens after c_k computed ones
(attn = s (c_k + (s + 1) / 2), kv = c_k + s, dense = s (c_k + s), one sample at the last), exactly as
the simulator's replica plans them, plus the request overhead and its part per
prompt token (which only the cache probe, whose computed tokens are fewer than
its prompt's, tells apart from the per-token step term); a decode window of B requests at contexts
n_i is B tokens, B samples, sum n_i of attention and KV and B sum n_i of dense attention per step; the
mixed probe's arrival (a lone chunk of s tokens sent beside B decodes) is read over the steps from its
send to its chunk's step: decode steps as above, then one with the chunk's s tokens, one sample,
s (s + 1) / 2 of attention and s of KV added and (B + s) (sum n_i + s) of dense attention, plus its one
``frontend_cpu_s``, a known part (the pairs give it, below): the only observations in which a chunk
meets a batch's KV, so the ones that size ``per_dense_s`` on an engine whose chunks pay for it
(transformers without flash attention) and price the chunks of the replays' own mixed steps on the
others. The interference probe's window (B decoding while lone requests arrive) is the
same per step, plus each arrival's prefill chunks and decode step shared over
the window's steps, plus one ``frontend_cpu_s`` per arrival: the only
observation with that feature, so the only one that measures it (the lone
prefills' time to first token is the same whether the frontend's work runs
before the engine's queue or inside the admitting step; sim/profile.py). It is
not part of the least squares: each pair is read against its own control
window, sent just before it (the engine's speed at that moment), and the
term is the median of the pairs' readings (:func:`frontend_per_arrival`).

The fit minimises the sum of squared RELATIVE errors (each observation counts
the same whatever its size) under non-negativity (a cost cannot be negative),
with each column scaled to unit size first (the terms differ by six orders of
magnitude). The model is the engine's TYPICAL step, not its best: a decode
window's observation is the median of its per-step gaps (:func:`step_gaps`), and a probe
repeated with identical features (``--repeats``) counts once, at the median of
its repeats. (Until profile version 2 the fastest repeat counted, on the
argument that interference only adds time; but the engine a simulation stands
for is the one that is sometimes interfered with, and a profile of its best
moments made the simulator one-sidedly fast: -18 to -58% on E2E p50 against
vLLM, docs/fidelity.md.) How the steps scatter around the typical one is
measured from the same decode windows (calibrate/dispersion.py) and drawn by
the simulator (sim/jitter.py). Observations more than max(25%, 4 x the median)
off after a first fit are reported as outliers (a shared machine stalls now
and then) and the fit is repeated without them; the dense attention term
(``per_dense_s``, sim/profile.py) is kept only where an F-test says the probes
show it (:func:`dense_test`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, TypedDict

import numpy as np

from llmlb_bench.calibrate.dispersion import DriftSample, drift_sample
from llmlb_bench.calibrate.probes import ARRIVAL_EVERY_STEPS, ProbeRun, token_times
from llmlb_bench.errors import UserError
from llmlb_bench.schema import ArrowRow
from llmlb_bench.sim.profile import STEP_TERMS

#: the fitted unknowns: the step terms, then the request overhead and its part per prompt token
#: (time to first token only), then the frontend's CPU time per arrival (the interference probe only)
UNKNOWNS = (*STEP_TERMS, "request_overhead_s", "request_per_prompt_token_s", "frontend_cpu_s")
BASE, TOKEN, SAMPLE, ATTN, KV, DENSE, OVERHEAD, PER_PROMPT, FRONTEND = range(len(UNKNOWNS))
#: the dense attention term (sim/profile.py ``per_dense_s``) is kept when the F-test of the model with it
#: against the model without it rejects "no such term" at this level (:func:`fit`)
DENSE_P_VALUE = 0.01
#: a decode window's request counts as streamed when its tokens reached the client in at least this part of
#: the distinct reads its group's median request had (:func:`decode_window`): vLLM holds back about 13% of
#: a random model's tokens (partial UTF-8 bytes), far above it; transformers serve's requests that did not
#: stream had 1-11 reads of 48 where the others had 47-48
STREAMED_SHARE = 0.25
#: the fit and the interference pairs' frontend reading alternate (:func:`fit`) until the reading moves by
#: at most this much, or this many rounds
FRONTEND_TOLERANCE_S = 1e-9
FRONTEND_ROUNDS = 20
#: fewest decode steps a window must hold to count
MIN_WINDOW_STEPS = 4


@dataclass
class Observation:
    probe: str
    what: str
    features: np.ndarray        # one per UNKNOWNS
    measured_s: float
    predicted_s: float = float("nan")
    outlier: bool = False
    #: how many identical repeats this is the median of
    repeats: int = 1
    #: the interference probe's pair: its control window's median step and features per step (the
    #: batch's speed at the pair's time), and the features per step of the batch's own decodes in the
    #: loaded window (:func:`frontend_per_arrival`); None for other probes
    control: tuple[float, np.ndarray, np.ndarray] | None = None

    @property
    def in_fit(self) -> bool:
        """Whether the least-squares fit uses it (the interference pairs are read after it, one by one)."""
        return self.control is None

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


class ProbeErrors(TypedDict):
    """How well the fitted profile predicts one kind of probe (outliers left out), in %."""

    observations: int
    outliers: int
    mean_abs_error_pct: float | None
    max_abs_error_pct: float | None


class FrontendReading(TypedDict):
    """``frontend_cpu_s`` and what it rests on (the profile's ``fit.frontend_cpu``): each interference
    pair's reading and its engine speed over the step model's, their median (the profile's figure),
    and the reading without the pair's control (the estimate before 2026-12-02, for comparison)."""

    pairs_ms: list[float]
    speeds: list[float]
    median_ms: float | None
    without_control_ms: float | None


class DenseTest(TypedDict):
    """Whether the dense attention term (``per_dense_s``) was kept, and the test that says so (:func:`fit`):
    the mode asked for (auto: by the test), the squared relative errors of the fit without it and with
    it, the F statistic of the term, its p-value, and the degrees of freedom left with it."""

    mode: str
    kept: bool
    sse_without: float
    sse_with: float
    f: float | None
    p_value: float | None
    dof: int


@dataclass
class Fit:
    coefficients: dict[str, float]
    observations: list[Observation]
    notes: list[str]
    frontend: FrontendReading | None = None
    dense: DenseTest | None = None

    def summary(self) -> dict[str, ProbeErrors]:
        """Mean and largest absolute relative error per probe kind (outliers left out), in %."""
        out: dict[str, ProbeErrors] = {}
        for kind in sorted({o.probe for o in self.observations}):
            errs = np.array([abs(o.error) for o in self.observations if o.probe == kind and not o.outlier])
            out[kind] = {"observations": int(errs.size),
                         "outliers": sum(o.outlier for o in self.observations if o.probe == kind),
                         "mean_abs_error_pct": round(100 * float(errs.mean()), 2) if errs.size else None,
                         "max_abs_error_pct": round(100 * float(errs.max()), 2) if errs.size else None}
        return out


def prefill_features(prompt: int, cached: int, budget: int) -> np.ndarray:
    """The summed step features of a lone request's prefill (see the module docstring)."""
    f = np.zeros(len(UNKNOWNS))
    done = cached
    while done < prompt:
        s = min(budget, prompt - done)
        f[BASE] += 1
        f[TOKEN] += s
        f[ATTN] += s * (done + (s + 1) / 2)
        f[KV] += done + s
        f[DENSE] += s * (done + s)
        done += s
    f[SAMPLE] = 1.0
    f[OVERHEAD] = 1.0
    f[PER_PROMPT] = prompt
    return f


def decode_features(batch: int, context: float) -> np.ndarray:
    """One decode step's features: ``batch`` requests of ``context`` KV tokens in all."""
    f = np.zeros(len(UNKNOWNS))
    f[BASE] = 1.0
    f[TOKEN] = f[SAMPLE] = batch
    f[ATTN] = f[KV] = context
    f[DENSE] = batch * context
    return f


def step_gaps(t: np.ndarray) -> np.ndarray:
    """One gap per token after the first distinct arrival of sorted token times ``t``: a chunk of
    k tokens arriving together shares the time since the chunk before it evenly, (T - T0) / k each.

    Why: a server falling behind its engine (a loaded machine) sends several steps' tokens in one
    chunk; plain differences of arrival times then give k - 1 zeros and one k-fold gap, and a
    window whose median gap is zero made the fit divide by zero (a crash in the fit under load).
    Spread evenly, k steps in time T - T0 read as k steps of their mean; with one token per chunk
    this is exactly ``np.diff(t)``. Tokens that share the window's first arrival have no earlier
    arrival inside the window and count no gap."""
    times, counts = np.unique(t, return_counts=True)
    return np.repeat(np.diff(times) / counts[1:], counts[1:])


def engine_steps(rows: Sequence[ArrowRow], t0: float, t1: float) -> np.ndarray:
    """The engine's step gaps in a decode window [t0, t1] as ALL its requests saw them: one gap per step.

    Why not one request's gaps: a token whose text is empty (a random model's partial UTF-8 byte,
    which vLLM holds back until the character is whole) streams nothing, so that request's next
    gap spans two steps and read as a slow step at about 2x: on vLLM CPU 13% of the probes'
    random tokens, which made the spread's slow phases 1.85-2.11x where the steps are 1.60-1.65x
    (issue 28, docs/fidelity.md). Every request of the window gets a token in every step, so the
    step shows in the others' streams (:func:`step_reads`). A step's gap is the time since the
    step before; a server behind its engine bundles steps, and they share the gap evenly, as
    :func:`step_gaps`. With one request this is that request's :func:`step_gaps`."""
    at, counts = step_reads(rows, t0, t1)
    if not at.size:
        return np.zeros(0)
    return np.repeat(np.diff(at) / counts[1:], counts[1:])


def step_reads(rows: Sequence[ArrowRow], t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
    """The engine's steps in [t0, t1] from all ``rows``' streamed tokens: each step's time (its
    first read) and its token count (the most any request's read carried: a read of k tokens is k
    steps bundled by a server behind its engine).

    The requests' reads are pooled in time order and grouped: a read starts a new step when it
    comes more than half a typical step (the median of the requests' own gaps) after the step's
    first read, or when its request already has a read in the step. Empty when no request has
    two reads in the window."""
    reads: list[tuple[float, int, int]] = []
    own: list[np.ndarray] = []
    for k, r in enumerate(rows):
        t = token_times(r)
        t = t[(t >= t0) & (t <= t1)]
        times, counts = np.unique(t, return_counts=True)
        reads += [(float(a), int(c), k) for a, c in zip(times, counts)]
        own.append(step_gaps(t))
    mine = np.concatenate(own) if own else np.zeros(0)
    if not reads or not mine.size:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    tol = 0.5 * float(np.median(mine))
    reads.sort()
    step_t, step_n, seen = [reads[0][0]], [reads[0][1]], {reads[0][2]}
    for at, n, k in reads[1:]:
        if at - step_t[-1] > tol or k in seen:
            step_t.append(at)
            step_n.append(n)
            seen = {k}
        else:
            step_n[-1] = max(step_n[-1], n)
            seen.add(k)
    return np.array(step_t), np.array(step_n, dtype=np.int64)


def _prompt(row: ArrowRow) -> int:
    server = row.get("server_input_tokens")
    return int(server) if server is not None else int(row["input_tokens"])


def observations(runs: Sequence[ProbeRun], budget: int) -> tuple[list[Observation], list[str], list[np.ndarray]]:
    """Every usable observation of the probes, notes on what could not be used, and each decode
    window's step gaps as all its requests saw them (:func:`engine_steps`, for calibrate/dispersion.py)."""
    obs: list[Observation] = []
    windows: list[np.ndarray] = []
    notes: list[str] = []
    no_cached = False
    controls: dict[int, ProbeRun] = {}      # interference pairs' control runs, by pair
    for run in runs:
        ok = [r for r in run.rows if r["status"] == "ok" and r["first_token_s"] is not None]
        failed = [r for r in run.rows if r["status"] != "ok"]
        if failed:
            notes.append(f"{run.kind} {run.params}: {len(failed)} of {len(run.rows)} requests failed "
                         f"({failed[0]['error']})")
        silent = len(run.rows) - len(failed) - len(ok)
        if silent:
            notes.append(f"{run.kind} {run.params}: {silent} of {len(run.rows)} requests streamed no visible token "
                         "(text that decodes to nothing, e.g. a partial UTF-8 byte); left out")
        if run.kind in ("prefill", "cache"):
            for k, r in enumerate(ok):
                cached = r.get("cached_tokens")
                if cached is None:
                    if run.kind == "cache" and k == 1:
                        no_cached = True
                        continue
                    cached = 0
                p = _prompt(r)
                cached = min(int(cached), p - 1)
                what = f"prompt {p}" + (f", {cached} cached" if cached else "")
                obs.append(Observation(run.kind, what, prefill_features(p, cached, budget),
                                       r["first_token_s"] - r["sent_s"]))
        elif run.kind == "mixed":
            got = mixed_observations(run)
            obs += got
            if len(got) < run.params["arrivals"]:
                notes.append(f"mixed {run.params}: {run.params['arrivals'] - len(got)} of {run.params['arrivals']} "
                             "arrivals' steps not read (the batch was not all decoding from the arrival's send "
                             "to its first token, or a step's tokens were read bundled)")
        elif run.kind == "interference":
            if run.params["arrivals"] == 0:
                controls[run.params["pair"]] = run
            elif run.params["pair"] in controls:
                o = interference_observation(controls[run.params["pair"]], run, budget)
                if o is None:
                    notes.append(f"interference {run.params}: no decode window of {MIN_WINDOW_STEPS} steps or more "
                                 "with arrivals in it (raise --decode-tokens)")
                else:
                    obs.append(o)
        else:       # decode groups, and the drift reference (its windows count for the spread, not the fit)
            if len(ok) < run.params["batch"]:
                continue
            win = decode_window(ok)
            if win is None:
                notes.append(f"{run.kind} batch {run.params['batch']} at {run.params['context']} tokens: fewer than "
                             f"{MIN_WINDOW_STEPS} steps with the whole batch decoding (raise --decode-tokens)")
                continue
            gaps, context, t0, t1 = win
            b = len(ok)
            if run.kind == "decode":
                obs.append(Observation("decode", f"batch {b}, context {run.params['context']}", decode_features(b, context),
                                       float(np.median(np.concatenate(gaps)))))
            windows.append(engine_steps(ok, t0, t1))
    if no_cached:
        notes.append("the engine reports no prompt_tokens_details.cached_tokens (vLLM: "
                     "--enable-prompt-tokens-details): repeated prompts left out of the fit")
    return median_of_repeats(obs), notes, windows


def drift_samples(runs: Sequence[ProbeRun]) -> list[DriftSample]:
    """One drift sample (calibrate/dispersion.py) per decode group and drift reference window, in the
    group of the probe it repeats (kind, batch, context), at the window's middle on the calibration's
    clock, from the same steps as the spread's window (:func:`engine_steps`)."""
    out: list[DriftSample] = []
    for run in runs:
        if run.kind not in ("decode", "drift"):
            continue
        ok = [r for r in run.rows if r["status"] == "ok" and r["first_token_s"] is not None]
        win = decode_window(ok) if ok and len(ok) >= run.params["batch"] else None
        if win is None:
            continue
        _, _, t0, t1 = win
        at = run.at_s + (t0 + t1) / 2 - min(r["sent_s"] for r in ok)
        sample = drift_sample(f"{run.kind} {run.params['batch']}x{run.params['context']}", at, engine_steps(ok, t0, t1))
        if sample is not None:
            out.append(sample)
    return out


def decode_window(rows: Sequence[ArrowRow]) -> tuple[list[np.ndarray], float, float, float] | None:
    """The window in which every one of ``rows`` decodes (after the last first token, before the first
    last token, over the requests that streamed: at least :data:`STREAMED_SHARE` of the distinct token
    reads of the group's median request): each streamed request's inter-token gaps in it, the batch's
    summed context at its middle, and the window's bounds; None when no request streamed or a streamed
    one saw fewer than MIN_WINDOW_STEPS steps in it.

    Why only the streamed requests bound it: a request whose tokens mostly reached the client as no text
    or in one read, where its group's others came one read a step, says nothing about when its decoding
    began or ended. On transformers serve one request of sixteen showed its first token at 0.65 s and 47
    that decode to no text, another all 48 in one read at 5.85 s, and the window over all sixteen came
    out -5.2 s where the engine's own log had them decode together for over a second (15 of a
    calibration's 27 decode groups lost, docs/fidelity-runs.md). They were in the engine's batch all the same
    (same prompt, same output, sent together), so they count in its context, at the streamed requests'
    median place in their output. Against the group's median, not the output length: a server behind
    its engine bundles every request's steps alike, and all of them still bound the window. Where every
    request streams (vLLM's probes) this is the window over all of them, as before."""
    reads = [np.unique(token_times(r)).size for r in rows]
    line = STREAMED_SHARE * float(np.median(reads)) if reads else 0.0
    shown = [r for r, n in zip(rows, reads) if n >= line]
    if not shown:
        return None
    t0 = max(r["first_token_s"] for r in shown)
    t1 = min(r["last_token_s"] for r in shown)
    gaps: list[np.ndarray] = []
    middles: list[float] = []
    context = 0.0
    for r in shown:
        t = token_times(r)
        idx = np.nonzero((t >= t0) & (t <= t1))[0]
        window = step_gaps(t[idx[0]:idx[-1] + 1]) if idx.size >= 2 else np.zeros(0)
        if window.size < MIN_WINDOW_STEPS:
            return None
        gaps.append(window)
        middles.append((idx[0] + idx[-1]) / 2)
        context += _prompt(r) + middles[-1]
    context += sum(_prompt(r) + float(np.median(middles)) for r, n in zip(rows, reads) if n < line)
    return gaps, context, t0, t1


def mixed_observations(run: ProbeRun) -> list[Observation]:
    """The mixed probe's observations (calibrate/probes.py), read from the batch's streams
    (:func:`step_reads`): for each arrival, the steps from the one in progress when it was sent to the
    one that computed its chunk beside the decoding batch (the batch's step whose tokens came with the
    arrival's first token, within half a typical step), at the batch's context at each step (each
    decoding request's prompt and the tokens it had before it), the last with the arrival's prompt as
    one chunk (module docstring), and one ``frontend_cpu_s``: the arrival's frontend work runs between
    its send and its first step, and the simulator books it into one of these steps (sim/replica.py:
    the first step planned after the dispatch, which behind a decode run planned in one piece is the
    arrival's own). The fit takes that term from the interference pairs, not from these steps
    (:func:`fit`). An arrival counts only where at least the plan's batch decoded through these steps
    and none of their tokens were read bundled with another step's."""
    ok = [r for r in run.rows if r["status"] == "ok" and r["first_token_s"] is not None]
    batch = [r for r in ok if r["requested_output_tokens"] != 1]        # the arrivals ask for one token
    own = [step_gaps(token_times(r)) for r in batch]
    if not batch or not sum(g.size for g in own):
        return []
    tol = 0.5 * float(np.median(np.concatenate(own)))
    out: list[Observation] = []
    for a in (r for r in ok if r["requested_output_tokens"] == 1):
        t, sent = float(a["first_token_s"]), float(a["sent_s"])
        decoding = [r for r in batch if r["first_token_s"] < sent and r["last_token_s"] > t - tol]
        if len(decoding) < run.params["batch"]:
            continue
        at, counts = step_reads(decoding, max(r["first_token_s"] for r in decoding), t + tol)
        k = int(np.searchsorted(at, t + tol, side="right")) - 1
        first = int(np.searchsorted(at, sent, side="right"))      # the step in progress at the send ends here
        if not 1 <= first <= k or abs(at[k] - t) > tol or np.any(counts[first:k + 1] != 1):
            continue
        b, c = len(decoding), _prompt(a)
        times = [token_times(r) for r in decoding]
        prompts = sum(_prompt(r) for r in decoding)
        contexts = [float(prompts + sum(np.count_nonzero(x < at[j] - tol) for x in times)) for j in range(first, k + 1)]
        f = np.sum([decode_features(b, x) for x in contexts], axis=0)
        ctx = contexts[-1]
        f[TOKEN] += c
        f[SAMPLE] += 1
        f[ATTN] += c * (c + 1) / 2
        f[KV] += c
        # the chunk's step: all its tokens against all its KV (its decodes' b x ctx already counted)
        f[DENSE] += (b + c) * (ctx + c) - b * ctx
        f[FRONTEND] = 1.0
        out.append(Observation("mixed", f"{b} decoding at {run.params['context']} tokens beside a {c}-token chunk",
                               f, float(at[k] - at[first - 1])))
    return out


def interference_observation(control: ProbeRun, loaded: ProbeRun, budget: int) -> Observation | None:
    """The interference probe's observation (calibrate/probes.py): the mean step of the decoding
    requests' window while lone requests arrived, less the control window's mean step over its
    median (the jitter's share, which the model's median step leaves out and the simulator draws
    on top), against the window's summed features per step: B decodes every step, plus each
    arrival's prefill chunks and its one decode step (they ran inside the window's steps) and one
    ``frontend_cpu_s`` (docs/fidelity.md). Arrivals count when their first token came inside the
    window. None when either run has no usable window."""
    b, context, prompt = loaded.params["batch"], loaded.params["context"], loaded.params["prompt"]
    split = (context + prompt) / 2

    def decoding(run: ProbeRun) -> list[ArrowRow]:
        return [r for r in run.rows if r["status"] == "ok" and r["first_token_s"] is not None and _prompt(r) < split]

    ctl, bg = decoding(control), decoding(loaded)
    if len(ctl) < b or len(bg) < b:
        return None
    ctl_win, win = decode_window(ctl), decode_window(bg)
    if ctl_win is None or win is None:
        return None
    ctl_gaps = np.concatenate(ctl_win[0])
    jitter_s = float(ctl_gaps.mean() - np.median(ctl_gaps))
    gaps, ctx, t0, t1 = win
    steps = float(np.mean([g.size for g in gaps]))
    came = [_prompt(r) for r in loaded.rows if r["status"] == "ok" and r["first_token_s"] is not None
            and _prompt(r) >= split and t0 < r["first_token_s"] <= t1]
    if not came:
        return None
    f = decode_features(b, ctx)
    ctl_step = (float(np.median(ctl_gaps)), decode_features(b, ctl_win[1]), f.copy())
    for p in came:      # its prefill chunks beside the decodes, then one decode step of its own
        a = prefill_features(p, 0, max(1, budget - b))
        f[TOKEN] += (a[TOKEN] + 1) / steps
        f[SAMPLE] += 2.0 / steps
        f[ATTN] += (a[ATTN] + p + 1) / steps
        f[KV] += (a[KV] + p + 1) / steps
        # dense attention: each of its chunk steps (b + s tokens against the batch's ctx plus its own
        # done + s) and its decode step (b + 1 against ctx + p + 1), less the batch's own b x ctx
        f[DENSE] += (b * a[KV] + ctx * a[TOKEN] + a[DENSE] + b * (p + 1) + ctx + p + 1) / steps
        f[FRONTEND] += 1.0 / steps
    measured = float(np.mean([g.sum() / g.size for g in gaps])) - jitter_s
    if not measured > 0:
        return None
    return Observation("interference", f"batch {b}, arrivals of {prompt} tokens every {ARRIVAL_EVERY_STEPS} steps",
                       f, measured, control=ctl_step)


def median_of_repeats(obs: Sequence[Observation]) -> list[Observation]:
    """One observation per distinct probe (its kind and what it probed: a prompt length and cached
    part, a decode batch and context): the median of its repeats' times, at the mean of their
    features (a decode window's measured context varies a little), in first-seen order (see the
    module docstring). The interference pairs stay one by one: each is read against its own control
    (:func:`frontend_per_arrival`)."""
    groups: dict[tuple[str, str] | int, list[Observation]] = {}
    for n, o in enumerate(obs):
        groups.setdefault((o.probe, o.what) if o.in_fit else n, []).append(o)
    return [Observation(g[0].probe, g[0].what, np.mean([o.features for o in g], axis=0),
                        float(np.median([o.measured_s for o in g])), repeats=len(g)) if g[0].in_fit else g[0]
            for g in groups.values()]


def solve(obs: Sequence[Observation], dense: bool = True, frontend_s: float = 0.0) -> np.ndarray:
    """The least-squares coefficients over ``obs`` (module docstring); without the dense attention
    term when ``dense`` is false (its coefficient 0). ``frontend_cpu_s`` is not fitted here (the
    interference pairs give it, :func:`fit`): it is ``frontend_s``, a known part of the observations
    that carry it (the mixed steps the model books an arrival's frontend time into)."""
    from scipy.optimize import nnls

    x = np.array([o.features for o in obs])
    if not dense:
        x[:, DENSE] = 0.0
    y = np.array([o.measured_s for o in obs])
    known = frontend_s * x[:, FRONTEND]
    x[:, FRONTEND] = 0.0
    a = x / y[:, None]
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    theta, _ = nnls(a / scale, 1.0 - known / y)
    coeffs: np.ndarray = theta / scale
    coeffs[FRONTEND] = frontend_s
    return coeffs


def _sse(obs: Sequence[Observation], theta: np.ndarray) -> float:
    """The fit's objective: the sum of squared relative errors."""
    return float(sum((o.features @ theta / o.measured_s - 1.0) ** 2 for o in obs))


def dense_test(obs: Sequence[Observation], mode: str = "auto", frontend_s: float = 0.0) -> tuple[np.ndarray, DenseTest]:
    """The coefficients over ``obs`` with the dense attention term where the probes show it (``mode``
    auto; on: always, off: never, the test reported either way), and the test.

    WHY a test and not simply the term free in the least squares: the probes of an engine that attends
    per request (vLLM, SGLang) can still lend the term a little of their noise, and a small false
    ``per_dense_s`` grows with the batch squared, so at batches beyond the probes' it would be a large
    false cost. The nested models' F-test (one added regressor, ``n - k`` degrees of freedom left with
    it, ``k`` the terms the probes can see) keeps it only when it lowers the squared errors by more than
    chance would at the 1% level (:data:`DENSE_P_VALUE`); on the logged steps of transformers' paged SDPA
    it lowered them by 40% (docs/fidelity-runs.md, "The dense attention term"). ``frontend_s``: as :func:`solve`."""
    from scipy.stats import f as f_dist

    without, with_dense = solve(obs, dense=False, frontend_s=frontend_s), solve(obs, frontend_s=frontend_s)
    sse0, sse1 = _sse(obs, without), _sse(obs, with_dense)
    seen = int(np.count_nonzero(np.abs(np.array([o.features for o in obs])).sum(axis=0)))
    dof = len(obs) - seen
    stat = p_value = None
    if dof > 0 and with_dense[DENSE] > 0 and sse1 < sse0:
        stat = (sse0 - sse1) / (sse1 / dof) if sse1 > 0 else math.inf
        p_value = float(f_dist.sf(stat, 1, dof))
    kept = mode == "on" or (mode == "auto" and p_value is not None and p_value < DENSE_P_VALUE)
    return (with_dense if kept else without), {
        "mode": mode, "kept": kept, "sse_without": round(sse0, 6), "sse_with": round(sse1, 6),
        "f": round(stat, 3) if stat is not None else None,
        "p_value": float(f"{p_value:.3g}") if p_value is not None else None, "dof": dof}


def frontend_per_arrival(o: Observation, theta: np.ndarray) -> tuple[float, float]:
    """One interference pair's ``frontend_cpu_s`` and the engine's speed during it (module docstring).

    The pair's control window, sent just before, says how fast the batch decoded at the pair's time:
    its median step over what the step model ``theta`` predicts for it (``speed``, > 1 slower). The
    loaded window's mean step, less the batch's decodes at that speed (the model's decode steps for
    the loaded window x ``speed``) and the arrivals' own prefill and decode steps (the model's), per
    arrival, is the frontend's time; over ``speed``, in the step model's time like the other terms.
    WHY the control: the engine's speed drifts within a calibration (log sd 0.1-0.5 over half a minute
    on vLLM CPU), and read against the step model alone a pair sent in a slower spell than the decode
    probes put the batch's whole slowdown into this one term (8 steps per arrival: about 8% of a step
    per arrival per 1% of speed; the term scattered 12-32 ms between calibrations of one engine,
    docs/fidelity.md). Why only the decodes at the control's speed: that is what the control measures,
    and a misfit of the step model at the control's batch (a speed of 1.004 against ``llmlb serve``,
    whose speed is 1) then cancels instead of being scaled onto the arrivals' prefill, which on a
    profile of costly prefills cost the term 11%; a true slow spell leaves the arrivals' own steps
    read at the model's speed (their part of the pair's time x the spell)."""
    assert o.control is not None
    k = UNKNOWNS.index("frontend_cpu_s")
    step_s, control, decodes = o.control
    model_s = float(control @ theta)
    speed = step_s / model_s if model_s > 0 else 1.0
    arrivals = o.features[:k] - decodes[:k]
    rest = o.measured_s - speed * float(decodes[:k] @ theta[:k]) - float(arrivals @ theta[:k])
    return rest / (speed * o.features[k]), speed


def fit(obs: list[Observation], notes: list[str], dense: str = "auto") -> Fit:
    """The coefficients (see the module docstring); predictions written into ``obs``.

    The least squares take every observation but the interference pairs; ``frontend_cpu_s``, which only
    those pairs measure, is then the median over the pairs of each one's reading against its own control
    (:func:`frontend_per_arrival`; 0 when negative or when there is no pair), and each pair's prediction
    is the model at its control's speed, so its error is how far that pair's reading lies from the
    median. The mixed steps hold one arrival's frontend time each, a known part of them in the least
    squares: fitted again with the pairs' reading until the reading settles (a few rounds). Read without
    it, on ``llmlb serve`` the mixed steps' 8 ms of frontend went into the step terms and a 50-token
    prefill came out 2.4% long."""
    if not any(o.probe == "decode" for o in obs) or not any(o.probe != "decode" and o.in_fit for o in obs):
        raise UserError("the probes gave no usable decode or prefill observation; see the notes above: "
                        + "; ".join(notes), "llmlb calibrate")
    fitted = [o for o in obs if o.in_fit]
    theta = solve(fitted)
    pred = np.array([o.features @ theta for o in fitted])
    err = np.abs(pred / np.array([o.measured_s for o in fitted]) - 1.0)
    limit = max(0.25, 4 * float(np.median(err)))
    keep = [o for o, e in zip(fitted, err) if e <= limit]
    if len(keep) < len(fitted) and len(keep) >= len(UNKNOWNS):
        for o, e in zip(fitted, err):
            o.outlier = bool(e > limit)
    else:
        keep = fitted
    theta, test = dense_test(keep, dense)
    pairs = [o for o in obs if not o.in_fit]
    k = UNKNOWNS.index("frontend_cpu_s")
    got: list[tuple[float, float]] = []
    if pairs:
        # the pairs' reading rests on the step model, and the mixed steps that carry a frontend time rest on
        # the pairs' reading: fitted again with it until it settles (once where no observation carries it)
        for _ in range(FRONTEND_ROUNDS):
            got = [frontend_per_arrival(o, theta) for o in pairs]
            reading = max(0.0, float(np.median([f for f, _ in got])))
            if abs(reading - theta[k]) <= FRONTEND_TOLERANCE_S or not any(o.features[k] for o in keep):
                break
            theta, test = dense_test(keep, dense, reading)
        theta[k] = reading
    if test["kept"]:
        notes.append(f"dense attention term {'kept' if dense == 'auto' else 'fitted (--dense-attention on)'} "
                     f"(per_dense_s, tokens x kv per step): the probes' squared relative errors "
                     f"{test['sse_without']:.4g} without it, {test['sse_with']:.4g} with it "
                     f"(F = {test['f']}, p = {test['p_value']})")
    for o in fitted:
        o.predicted_s = float(o.features @ theta)
    summary: FrontendReading | None = None
    if pairs:
        for o, (_, speed) in zip(pairs, got):
            assert o.control is not None
            decodes = float(o.control[2] @ theta)
            o.predicted_s = speed * decodes + (float(o.features @ theta) - decodes - theta[k] * o.features[k]) \
                + speed * theta[k] * o.features[k]
        # the estimate before the control was used: the pairs' median against the step model alone
        mean_f = np.mean([o.features for o in pairs], axis=0)
        joint = (float(np.median([o.measured_s for o in pairs])) - float(mean_f[:k] @ theta[:k])) / mean_f[k]
        summary = {"pairs_ms": [round(1e3 * f, 4) for f, _ in got], "speeds": [round(s, 4) for _, s in got],
                   "median_ms": round(1e3 * theta[k], 4), "without_control_ms": round(1e3 * max(0.0, joint), 4)}
    return Fit({name: float(v) for name, v in zip(UNKNOWNS, theta)}, obs, notes, summary, test)
