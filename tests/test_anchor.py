"""Anchoring a profile to the engine's long-run speed (calibrate/anchor.py): the arithmetic on made-up
reference windows, the profile's ``reference`` and ``anchor`` tables (parsed, checked, read by no
simulation), and the reference probe against ``llmlb serve``, whose speed is known: a profile
calibrated while the engine ran twice as fast is brought back to the served step model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.calibrate.anchor import AnchorProbe, anchored
from llmlb_bench.calibrate.probes import Prober
from llmlb_bench.calibrate.dispersion import DriftSample, drift
from llmlb_bench.errors import UserError
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.schema import trace_table, write_trace
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.profile import STEP_TERMS, parse_profile
from tests.conftest import cli
from tests.serve_helpers import ServeThread
from tests.sim_helpers import run_sim

#: the served engine: a 4-request decode step of 10 + 4 x (0.02 + 1) + ~0.03 = about 14 ms
STEP = {"base_s": 0.010, "per_token_s": 2e-5, "per_sample_s": 1e-3, "per_attn_s": 0.0, "per_kv_s": 1e-7,
        "per_dense_s": 1e-10}
ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16, "num_kv_blocks": 4000,
          "max_model_len": 4096, "enable_prefix_caching": True}
#: the reference probe: 32 tokens, so that a window keeps its 8 steps when a loaded client's 4 requests are
#: admitted a few steps apart
REFERENCE = {"batch": 4, "context": 16, "tokens": 32, "step_s": 0.007, "probes": 10}


def profile(scale: float = 1.0, **extra: object) -> dict:
    return {"llmlb_profile": 2, "engine": dict(ENGINE), "step": {k: v * scale for k, v in STEP.items()},
            "request_overhead_s": 0.002, "jitter": {"sigma": 0.05, "drift_sigma": 0.3, "drift_period_s": 2.0},
            **extra}


def samples(steps_s: list[float], every_s: float = 1.0) -> list[DriftSample]:
    return [DriftSample("drift 4x16", k * every_s, math.log(s), 1e-4) for k, s in enumerate(steps_s)]


def test_anchored_rescales_every_step_term_by_the_long_run_median_and_takes_its_drift():
    windows = samples([0.012, 0.015, 0.014, 0.030, 0.013, 0.016, 0.011], every_s=20.0)
    doc = anchored(parse_profile(profile(reference=REFERENCE, frontend_cpu_s=0.004)), windows)
    scale = 0.014 / 0.007         # the windows' median over the calibration's reference step
    assert doc["anchor"]["scale"] == pytest.approx(scale, rel=1e-12)
    assert doc["anchor"]["reference_step_s"] == pytest.approx(0.014, rel=1e-12)
    assert doc["anchor"]["calibration_step_s"] == 0.007
    assert doc["anchor"]["probes"] == 7 and doc["anchor"]["span_s"] == 120.0
    assert (doc["anchor"]["calibration_drift_sigma"], doc["anchor"]["calibration_drift_period_s"]) == (0.3, 2.0)
    for k in STEP_TERMS:
        assert doc["step"][k] == pytest.approx(STEP[k] * scale, rel=1e-12)
    assert doc["jitter"] is not None
    want = drift(windows)
    assert {k: doc["jitter"][k] for k in want} == want            # the long run's drift, not the calibration's
    assert doc["jitter"]["sigma"] == 0.05                         # the per-step spread as calibrated
    # the frontend's CPU per request is in the step model's time (calibrate/fit.py): rescaled with it
    assert doc["frontend_cpu_s"] == pytest.approx(0.004 * scale, rel=1e-12)
    assert doc["request_overhead_s"] == 0.002 and doc["reference"] == REFERENCE
    assert parse_profile(json.loads(json.dumps(doc))) == doc      # a file that loads as it was written


def test_what_cannot_be_anchored_is_a_one_line_error():
    with pytest.raises(UserError, match="no reference probe"):
        anchored(parse_profile(profile()), samples([0.01] * 8))
    with pytest.raises(UserError, match="an anchor needs 4"):
        anchored(parse_profile(profile(reference=REFERENCE)), samples([0.01] * 3))
    once = anchored(parse_profile(profile(reference=REFERENCE)), samples([0.01] * 8))
    with pytest.raises(UserError, match="anchored already"):
        anchored(once, samples([0.01] * 8))


@pytest.mark.parametrize("table, bad, where", [
    ("reference", {**REFERENCE, "step_s": 0}, "reference.step_s"),
    ("reference", {**REFERENCE, "batch": 1.5}, "reference.batch"),
    ("reference", [1, 2], "reference: must be a table"),
    ("anchor", {"scale": 2.0, "reference_step_s": 0.02, "calibration_step_s": 0.01, "probes": 9, "span_s": 60,
                "calibration_drift_sigma": 0.1}, "anchor.calibration_drift_period_s"),
    ("anchor", {"scale": 3.0, "reference_step_s": 0.02, "calibration_step_s": 0.01, "probes": 9, "span_s": 60,
                "calibration_drift_sigma": 0.1, "calibration_drift_period_s": 5}, "anchor.scale: must be"),
])
def test_bad_reference_and_anchor_tables_are_one_line_errors(tmp_path: Path, capsys, table: str, bad: object,
                                                             where: str):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile(**{table: bad})))
    trace = tmp_path / "t.parquet"
    write_trace(trace_table(np.zeros(2), 20, 4, "t"), trace, block_size=16)
    code, _, err = cli(["simulate", str(trace), "--profile", str(path), "-r", str(tmp_path / "res")], capsys)
    assert code == 2 and where in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_simulator_reads_neither_table(tmp_path: Path):
    """A profile with a reference and an anchor table gives the rows of the same step model without them."""
    trace = trace_table(0.02 * np.arange(30), 100, 12, "t")
    plain = parse_profile(profile())
    tagged = parse_profile(profile(reference=REFERENCE, anchor={
        "scale": 1.0, "reference_step_s": 0.007, "calibration_step_s": 0.007, "probes": 9, "span_s": 60.0,
        "calibration_drift_sigma": 0.3, "calibration_drift_period_s": 2.0}))
    assert tagged["anchor"]["probes"] == 9 and tagged["reference"] == REFERENCE
    rows = [run_sim(tmp_path, trace, ClusterConfig.build(replicas=1).with_profile(p), seed=3, run_id=f"r{n}")[0]
            for n, p in enumerate((plain, tagged))]
    assert rows[0].drop(["run_id"]).equals(rows[1].drop(["run_id"]))


def served_reference_step() -> float:
    """The served engine's decode step with the reference probe's 4 requests at their window's middle."""
    kv = 4 * (REFERENCE["context"] + REFERENCE["tokens"] / 2)
    return STEP["base_s"] + 4 * (STEP["per_token_s"] + STEP["per_sample_s"]) + (STEP["per_kv_s"] + 4 * STEP["per_dense_s"]) * kv


def served() -> ServeThread:
    """llmlb serve on the step model without jitter: every step takes the model's time."""
    return ServeThread(ClusterConfig.build(replicas=1).with_profile({**profile(), "jitter": None}),
                       ServeOptions(port=0), make_policy("round_robin"))


def test_the_reference_probe_against_llmlb_serve_finds_its_speed(tmp_path: Path):
    """A calibration that saw the engine twice as fast as it runs (its step terms and its reference step
    halved) is brought back to the served step model. The server writes each token when its step
    ends, never before; a loaded machine writes some late, which lengthens the windows (how much is
    this machine's, not checked) and can shorten a gap after a late one, so the check is on the
    median over the windows: at least the served step (within 10%), where the profile had half."""
    fast = parse_profile(profile(0.5, reference={**REFERENCE, "step_s": 0.5 * served_reference_step()}))
    st = served()
    options = ReplayOptions(api="completions")
    try:
        probe = AnchorProbe(st.urls[0], fast, options, tmp_path / "anchor", per_slot=2)
        for _ in range(3):
            probe.slot()
        # a calibration with the same seed (0): its requests' ids, hence their prompt text, are not the anchor's
        calibration = Prober(st.urls[0], preflight(st.urls, options), options, tmp_path / "calibration")
        first = calibration.decode(REFERENCE["batch"], REFERENCE["context"], REFERENCE["tokens"], 16, "drift")
    finally:
        st.close()
    anchor_ids = {r["request_id"] for run in probe.runs for r in run.rows}
    assert len(anchor_ids) == 6 * REFERENCE["batch"]
    assert anchor_ids.isdisjoint(r["request_id"] for r in first.rows)
    windows = probe.samples()
    assert len(probe.runs) == 6 and len(windows) == 6
    long_run = math.exp(float(np.median([w.log_step for w in windows])))
    assert long_run >= 0.9 * served_reference_step()
    doc = anchored(fast, windows)
    assert doc["anchor"]["scale"] == pytest.approx(long_run / (0.5 * served_reference_step()), rel=1e-9)
    for k in STEP_TERMS:
        assert doc["step"][k] >= 0.9 * STEP[k], k


def test_validate_anchors_the_profile_between_its_replays(tmp_path: Path, capsys):
    """llmlb validate with a profile that has a reference probe sends it around every replay, simulates
    with the anchored profile (written beside the runs and stored in the simulated runs' config) and
    says by how much it rescaled; the profile as given is simulated too, under the same seeds, and shown
    beside (the given profile has half the served step: its TPOT comes out about half the real one's)."""
    fast = profile(0.5, reference={**REFERENCE, "step_s": 0.5 * served_reference_step()})
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(fast))
    trace = tmp_path / "t.parquet"
    write_trace(trace_table(0.3 * np.arange(4), 60, 6, "t"), trace, block_size=16)
    st = served()
    try:
        res = tmp_path / "res"
        code, out, err = cli(["validate", st.urls[0], "--profile", str(prof), "--trace", str(trace), "--repeats", "2",
                              "--warmup", "0", "-r", str(res)], capsys)
        assert code == 0, err
    finally:
        st.close()
    assert "anchored: the reference probe's typical step" in out
    written = json.loads((res / "anchored-profile.json").read_text())
    assert written["anchor"]["probes"] == 9          # 3 slots (before each replay, after the last) of 3
    assert written["step"]["base_s"] >= 0.9 * STEP["base_s"]         # the given profile had half
    summary = json.loads(next(res.glob("validate-*.json")).read_text())
    assert summary["profile"] == written
    run = json.loads((res / summary["sim_runs"][0] / "run.json").read_text())
    assert run["config"]["cluster"]["pools"][0]["profile"]["anchor"] == written["anchor"]
    assert len(pq.read_table(res / summary["real_runs"][0] / "requests.parquet")) == 4
    calibrated = summary["calibrated"]
    assert "anchor" not in calibrated["profile"] and calibrated["profile"]["step"]["base_s"] == fast["step"]["base_s"]
    assert len(calibrated["sim_runs"]) == len(summary["sim_runs"])
    run = json.loads((res / calibrated["sim_runs"][0] / "run.json").read_text())
    assert "anchor" not in run["config"]["cluster"]["pools"][0]["profile"]
    as_given, anchored_tpot = calibrated["figures"]["tpot_p50"]["bias"], summary["figures"]["tpot_p50"]["bias"]
    assert as_given < -0.3 and anchored_tpot > as_given, (as_given, anchored_tpot)
    assert "the profile as calibrated, without the anchor" in out


def test_validate_anchor_without_a_reference_is_one_line_before_any_work(tmp_path: Path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(profile()))
    res = tmp_path / "res"
    code, _, err = cli(["validate", "http://127.0.0.1:9", "--profile", str(prof), "--anchor", "-r", str(res)], capsys)
    assert code == 2 and "no reference probe" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not res.exists()
