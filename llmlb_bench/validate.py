"""``llmlb validate``: does the simulator predict THIS engine? Distributions, not single replays.

A real engine does not repeat itself: the same trace replayed three times
against one vLLM replica differed by up to 34% in TTFT p50 on a quiet machine
(docs/fidelity.md). One replay against one simulation therefore cannot show a
5% error. Here both sides are repeated: the trace is replayed K times against
the endpoint (each time with fresh prompt text, so no replay is served from
another's prefix cache) and simulated with the endpoint's profile under K
seeds (the profile's step-time jitter makes seeds differ, sim/jitter.py).
Each figure is then compared as

* **bias**: median over the simulated seeds / median over the real
  repeats - 1, with a bootstrap interval (both sides resampled, independently:
  seed k has nothing to do with replay k). There may be more seeds than
  replays (:func:`default_sim_seeds`): seed j simulates replay j mod K's trace;
* **spread**: each side's coefficient of variation over its repeats, side by
  side (a simulator that is right on average but never varies, or varies far
  more than the engine, predicts tails and comparisons badly);
* **E2E MAPE**: per request, |simulated E2E / real E2E - 1| averaged over the
  trace's requests (each replay against the simulation of the same salted
  trace under seed k), the median over the K pairs;
* **decode steps by batch** (a diagnosis, no aim): the engine's step length per
  token read from both sides' streamed tokens, by the batch decoding through the
  step (:mod:`llmlb_bench.decode_steps`): where the latencies miss, it tells a
  step model that is wrong at the replays' batches from a miss around the steps.

The aims (the project's fidelity aims, docs/fidelity.md): |bias| <= 5% on
E2E and TPOT p50/p90, <= 10% on TTFT p50/p90, and the simulator's spread
within 0.5-2x the real one on those figures (two spreads both under 1% agree:
there is nothing to tell apart). Figure definitions are docs/metrics.md's.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.decode_steps import BucketSteps, by_batch

if TYPE_CHECKING:
    from llmlb_bench.replay import ReplayOptions
    from llmlb_bench.schema import ArrowRow
    from llmlb_bench.sim.profile import ProfileDoc

#: the compared figures, in table order
FIGURES = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90", "itl_p50", "itl_p90", "itl_p99")
#: largest |bias| per figure with an aim
BIAS_AIMS = {"ttft_p50": 0.10, "ttft_p90": 0.10, "tpot_p50": 0.05, "tpot_p90": 0.05, "e2e_p50": 0.05,
             "e2e_p90": 0.05}
#: the simulator's spread over the real one's, within these bounds
SPREAD_AIM = (0.5, 2.0)
#: spreads both below this agree (coefficients of variation of a few tenths of a percent are timer noise)
SPREAD_FLOOR = 0.01
#: bootstrap resamples of the bias interval
RESAMPLES = 2000
#: simulator seeds by default when the profile has a speed drift (:func:`default_sim_seeds`)
DRIFT_SIM_SEEDS = 30


def default_sim_seeds(profile: ProfileDoc, repeats: int) -> int:
    """How many simulator seeds to set against ``repeats`` real replays: at least
    :data:`DRIFT_SIM_SEEDS` when the profile has a speed drift (``drift_sigma`` > 0), else ``repeats``.

    Why: a drift as slow as a replay (an anchored profile's runs over minutes) draws about one speed
    of the replica per seed, so the median over K = 5 seeds is the median of five draws of that
    speed, not the model's median: on vLLM CPU seeds 1-5 started at +1.38 sd of a 0.24 log-sd drift
    (their median), which put every figure +39% (docs/fidelity.md); 30 seeds removed that offset.
    Simulations cost seconds where replays cost minutes, so the default does not ask whether the
    drift is slow enough to need them. Without a drift the seeds differ by the per-step jitter only,
    which a replay's thousand steps average out: as many as the replays."""
    jitter = profile["jitter"]
    drifting = jitter is not None and jitter["drift_sigma"] > 0
    return max(repeats, DRIFT_SIM_SEEDS) if drifting else repeats


def latencies(rows: Sequence[ArrowRow]) -> dict[str, np.ndarray]:
    """TTFT, TPOT, ITL and E2E in seconds (docs/metrics.md) of the requests that streamed a token."""
    ok = [r for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok])
    e2e = np.array([r["last_token_s"] - r["sent_s"] for r in ok])
    tpot = np.array([(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
                     for r in ok if r["output_tokens"] > 1])
    itl = [np.diff(np.sort(np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"])
                                           for s in r["token_times"]])))
           for r in ok if r["token_times"]]
    return {"ttft": ttft, "tpot": tpot, "itl": np.concatenate(itl) if itl else np.zeros(0), "e2e": e2e}


def figures(rows: Sequence[ArrowRow]) -> dict[str, float]:
    """Every figure of :data:`FIGURES` of one run (NaN where the run has no such value)."""
    lat = latencies(rows)
    out = {}
    for name in FIGURES:
        metric, p = name.split("_p")
        v = lat[metric]
        out[name] = float(np.percentile(v, int(p))) if v.size else float("nan")
    return out


def e2e_mape(real: Sequence[ArrowRow], sim: Sequence[ArrowRow]) -> float | None:
    """Mean over the requests both runs completed of |simulated E2E / real E2E - 1| (matched by id)."""
    by_id = {r["request_id"]: r["last_token_s"] - r["sent_s"] for r in sim
             if r["status"] == "ok" and r["last_token_s"] is not None}
    ape = [abs(by_id[r["request_id"]] / (r["last_token_s"] - r["sent_s"]) - 1) for r in real
           if r["status"] == "ok" and r["last_token_s"] is not None and r["request_id"] in by_id
           and r["last_token_s"] > r["sent_s"]]
    return float(np.mean(ape)) if ape else None


def _cv(v: np.ndarray) -> float:
    return float(np.std(v, ddof=1) / np.mean(v)) if v.size > 1 and np.mean(v) > 0 else float("nan")


@dataclass
class FigureComparison:
    """One figure over the repeats of both sides (see the module docstring)."""

    figure: str
    real: list[float]
    sim: list[float]
    bias: float
    low: float
    high: float
    real_spread: float
    sim_spread: float

    @property
    def spread_ratio(self) -> float:
        return self.sim_spread / self.real_spread if self.real_spread > 0 else float("inf")

    def failures(self) -> list[str]:
        """What misses an aim (empty: none, or no aim for this figure)."""
        aim = BIAS_AIMS.get(self.figure)
        if aim is None:
            return []
        out = []
        if not abs(self.bias) <= aim:
            out.append(f"{self.figure} bias {100 * self.bias:+.1f}% (aim within {100 * aim:.0f}%)")
        both_quiet = self.real_spread < SPREAD_FLOOR and self.sim_spread < SPREAD_FLOOR
        if not both_quiet and not SPREAD_AIM[0] <= self.spread_ratio <= SPREAD_AIM[1]:
            out.append(f"{self.figure} spread {self.spread_ratio:.2f}x the real one "
                       f"(aim {SPREAD_AIM[0]:g}-{SPREAD_AIM[1]:g}x)")
        return out


@dataclass
class Comparison:
    figures: list[FigureComparison]
    #: per pair (replay k, seed k): E2E MAPE
    mape: list[float] = field(default_factory=list)
    #: real requests the engine did not serve, over all replays (their figures leave them out)
    unserved: int = 0
    #: the decode steps' median length by batch on both sides (a diagnosis: no aim, not in the verdict)
    steps: list[BucketSteps] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        out = [f for c in self.figures for f in c.failures()]
        if self.unserved:
            out.append(f"{self.unserved} real requests not served (the replays' figures leave them out)")
        if not any(c.figure in BIAS_AIMS for c in self.figures):
            out.append("no figure with an aim was measured on both sides")
        return out

    def verdict(self) -> str:
        """One line: within the aims, or which figures miss them."""
        fails = self.failures
        if not fails:
            return "verdict: within the aims (|bias| <= 5% E2E/TPOT, <= 10% TTFT, spread 0.5-2x) for this engine and trace"
        return f"verdict: NOT within the aims ({len(fails)} misses): " + "; ".join(fails)

    def to_dict(self) -> dict[str, object]:
        return {"figures": {c.figure: {"real_s": c.real, "sim_s": c.sim, "bias": c.bias, "bias_interval": [c.low, c.high],
                                       "real_spread": c.real_spread, "sim_spread": c.sim_spread} for c in self.figures},
                "e2e_mape": self.mape, "e2e_mape_median": float(np.median(self.mape)) if self.mape else None,
                "unserved_requests": self.unserved,
                "decode_steps": {b.batch: {"real_s": b.real_s, "sim_s": b.sim_s, "real_steps": b.real_steps,
                                           "sim_steps": b.sim_steps} for b in self.steps},
                "failures": self.failures, "verdict": self.verdict()}


def compare(real_runs: Sequence[Sequence[ArrowRow]], sim_runs: Sequence[Sequence[ArrowRow]],
            seed: int = 0, resamples: int = RESAMPLES) -> Comparison:
    """Bias (with a 95% bootstrap interval) and spreads of every figure over the runs of both
    sides (as many or more simulations than replays), and the decode steps by batch; E2E MAPE of each (real k, sim k) pair for k
    below the number of replays, which must be replays and simulations of the same trace (same
    request ids)."""
    rng = np.random.default_rng(seed)
    real_f = [figures(r) for r in real_runs]
    sim_f = [figures(s) for s in sim_runs]
    out = []
    for name in FIGURES:
        a = np.array([f[name] for f in real_f])
        b = np.array([f[name] for f in sim_f])
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
        if not a.size or not b.size or not np.median(a) > 0:
            continue
        bias = float(np.median(b) / np.median(a) - 1)
        ra = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
        rb = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
        boot = rb / np.maximum(ra, 1e-12) - 1
        out.append(FigureComparison(name, a.tolist(), b.tolist(), bias, float(np.percentile(boot, 2.5)),
                                    float(np.percentile(boot, 97.5)), _cv(a), _cv(b)))
    mape = [m for m in (e2e_mape(r, s) for r, s in zip(real_runs, sim_runs)) if m is not None]
    return Comparison(out, mape, sum(r["status"] != "ok" for rows in real_runs for r in rows),
                      by_batch(real_runs, sim_runs))


# ---- the command's orchestration --------------------------------------------------------------



def salt(*parts: object) -> int:
    """A replay's prompt salt: different per repeat, the same for the same inputs."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big") >> 2


def default_trace(profile: ProfileDoc, requests: int, load: float, seed: int) -> pa.Table:
    """Chat-like Poisson traffic (lognormal prompts of median 200 tokens, outputs of median 48) at
    ``load`` x the profile's simulated capacity (its throughput on the same requests all sent at
    once), prompts kept to a quarter of the model length."""
    from llmlb_bench.workload import WorkloadSpec, generate

    engine = profile["engine"]
    top = max(16, min(1500, engine["max_model_len"] // 4))
    spec = WorkloadSpec.from_dict({"name": "validate", "seed": seed, "requests": requests,
                                   "block_size": engine["block_size"],
                                   "tenants": {"chat": {"kind": "chat", "arrival": {"process": "poisson", "rate": 1.0},
                                                        "input": {"dist": "lognormal", "median": min(200, top // 2),
                                                                  "sigma": 0.8, "max": top},
                                                        "output": {"dist": "lognormal", "median": 48, "sigma": 0.6,
                                                                   "max": 256}}}}, "llmlb validate")
    nominal = generate(spec, seed=seed)
    capacity = simulated_capacity(nominal, profile)
    span = float(np.max(nominal.column("arrival_s").to_numpy())) or 1.0
    return generate(spec, seed=seed, rate_scale=load * capacity / (nominal.num_rows / span))


def simulated_capacity(trace: pa.Table, profile: ProfileDoc) -> float:
    """Completed requests per second when every request of ``trace`` arrives at once (one replica
    of the profile, no jitter): what the engine sustains on these lengths."""
    import tempfile

    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.store import RunStore

    burst = trace.set_column(trace.schema.get_field_index("arrival_s"), "arrival_s",
                             pa.array(np.zeros(trace.num_rows)))
    cfg = ClusterConfig.build(replicas=1, jitter=False).with_profile(profile)
    with tempfile.TemporaryDirectory(prefix="llmlb-validate-") as tmp:
        store = RunStore(tmp, config={"cluster": cfg.to_dict()}, backend="sim", run_id="capacity")
        with store:
            simulate(burst, cfg, make_policy("round_robin"), store, seed=0)
        rows = pq.read_table(store.dir / "requests.parquet", columns=["status", "last_token_s"]).to_pylist()
    ends = [r["last_token_s"] for r in rows if r["status"] == "ok" and r["last_token_s"] is not None]
    return len(ends) / max(ends) if ends else 1.0


@dataclass
class Validation:
    comparison: Comparison
    real_runs: list[str]
    sim_runs: list[str]
    profile: ProfileDoc
    load_average: tuple[float, float]
    #: anchored runs only: the profile as calibrated, simulated under the same seeds against the same
    #: replays (the anchor helped some calibrations and hurt others, docs/fidelity.md, so both are shown)
    calibrated: Comparison | None = None
    calibrated_runs: list[str] = field(default_factory=list)


def validate(url: str, trace: pa.Table, repeats: int, profile: ProfileDoc, options: ReplayOptions,
             results: Path, seed: int = 0, warmup: int = 16, anchor: bool = False, sim_seeds: int | None = None,
             say: Callable[[str], None] = lambda line: None) -> Validation:
    """Replay ``trace`` ``repeats`` times against ``url`` (after a ``warmup``-request replay that
    counts for nothing: the first requests after a start are slow) and simulate it with
    ``profile`` under ``sim_seeds`` seeds (None: :func:`default_sim_seeds` of the profile simulated,
    anchored where asked; seed j simulates replay j mod ``repeats``'s salted copy); every replay and
    simulation is an ordinary run in ``results``.
    ``anchor``: send the profile's reference probe before every replay and after the last, and
    simulate with the profile anchored to their long-run median (calibrate/anchor.py; written to
    ``results`` as ``anchored-profile.json``, beside a calibrated one): so the simulations run after all the
    replays. The profile as given is then simulated too, under the same seeds (``calibrated``): which
    of the two predicts an engine better has gone both ways (docs/fidelity.md, "Where fidelity stands")."""
    import os
    import tempfile

    from llmlb_bench.calibrate.anchor import AnchorProbe, anchored
    from llmlb_bench.calibrate.probes import served_none
    from llmlb_bench.policies import make_policy
    from llmlb_bench.replay import replay
    from llmlb_bench.schema import read_trace, trace_block_size, write_trace
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.sim.jitter import JitterSpec
    from llmlb_bench.store import RunStore
    from llmlb_bench.sweep.endpoint_capacity import fresh_prompts

    load_start = os.getloadavg()[0]
    block = trace_block_size(trace, profile["engine"]["block_size"])
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    traces = results / f"validate-{stamp}-traces"

    def salted(k: object) -> tuple[pa.Table, Path]:
        path = traces / f"{k}.parquet"
        write_trace(fresh_prompts(trace, salt(stamp, seed, k)), path, block_size=block)
        return read_trace(path), path

    def replay_into(table: pa.Table, path: Path, run_id: str) -> list[ArrowRow]:
        store = RunStore(results, config={"endpoints": [url], "validate": "real", "options": options.describe()},
                         backend="replay", run_id=run_id, trace_path=path, trace_rows=table.num_rows)
        with store:
            replay(table, [url], make_policy("round_robin", {}), store, options)
        rows: list[ArrowRow] = pq.read_table(store.dir / "requests.parquet").to_pylist()
        served_none(rows, url, options.force_output_length, run_id)
        return rows

    if warmup:
        table, path = salted("warmup")
        n = min(warmup, table.num_rows)
        replay_into(table.slice(0, n), path, f"validate-{stamp}-warmup")
    real_ids, real_rows = [], []
    copies = [salted(k) for k in range(repeats)]
    given = profile
    with tempfile.TemporaryDirectory(prefix="llmlb-anchor-") as tmp:
        probe = AnchorProbe(url, profile, options, Path(tmp), seed=seed) if anchor else None
        for k, (table, path) in enumerate(copies):
            if probe is not None:
                probe.slot()
            run_id = f"validate-{stamp}-real-{k}"
            real_rows.append(replay_into(table, path, run_id))
            real_ids.append(run_id)
            say(f"replay {k + 1}/{repeats}: E2E p50 {1e3 * figures(real_rows[-1])['e2e_p50']:.1f} ms")
        if probe is not None:
            probe.slot()
            profile = anchored(profile, probe.samples())
            (results / "anchored-profile.json").write_text(json.dumps(profile, indent=2) + "\n")
            a, drifting = profile["anchor"], profile["jitter"] or JitterSpec().to_dict()
            say(f"anchored: the reference probe's typical step {1e3 * a['reference_step_s']:.3f} ms over "
                f"{a['span_s']:.0f} s ({a['probes']} windows) against {1e3 * a['calibration_step_s']:.3f} ms in the "
                f"calibration: step model x {a['scale']:.3f}; drift log sd {drifting['drift_sigma']:.3f} "
                f"over {drifting['drift_period_s']:.3g} s")
    n_seeds = sim_seeds if sim_seeds is not None else default_sim_seeds(profile, repeats)

    def simulated(doc: ProfileDoc, name: str) -> tuple[list[str], list[list[ArrowRow]]]:
        """``doc`` simulated under the run's seeds, seed k on replay k mod ``repeats``'s copy."""
        cfg = ClusterConfig.build(replicas=1).with_profile(doc)
        ids, rows = [], []
        for k in range(n_seeds):
            table, path = copies[k % repeats]
            run_id = f"validate-{stamp}-{name}-{k}"
            store = RunStore(results, config={"cluster": cfg.to_dict(), "validate": name}, backend="sim",
                             run_id=run_id, trace_path=path, trace_rows=table.num_rows)
            with store:
                simulate(table, cfg, make_policy("round_robin", {}), store, seed=seed + k)
            rows.append(pq.read_table(store.dir / "requests.parquet").to_pylist())
            ids.append(run_id)
        return ids, rows

    say(f"simulating {n_seeds} seeds against the {repeats} replays" + (", anchored and as calibrated" if anchor else ""))
    sim_ids, sim_rows = simulated(profile, "sim")
    result = Validation(compare(real_rows, sim_rows, seed=seed), real_ids, sim_ids, profile,
                        (load_start, os.getloadavg()[0]))
    if anchor:
        result.calibrated_runs, calibrated_rows = simulated(given, "sim-calibrated")
        result.calibrated = compare(real_rows, calibrated_rows, seed=seed)
    (results / f"validate-{stamp}.json").write_text(json.dumps(
        {"endpoint": url, "repeats": repeats, "sim_seeds": n_seeds, "seed": seed, "real_runs": real_ids, "sim_runs": sim_ids,
         "load_average": result.load_average, "profile": profile, **result.comparison.to_dict(),
         **({"calibrated": {"profile": given, "sim_runs": result.calibrated_runs, **result.calibrated.to_dict()}}
            if result.calibrated is not None else {})}, indent=1))
    return result
