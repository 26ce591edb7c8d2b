"""Deployment: a policy trained in the simulator runs unchanged as ``llmlb route -p learned`` in front of
two real vLLM replicas (its CPU build, a tiny random-weight model), and its decisions there are the
file's own on the observations it saw.

Two replicas start for this module (their own cores; about 40 s each on an idle machine), found
through engines_helpers.vllm_python and require_module: a missing vLLM or tokenizers package is a
failure where ``CI`` is set, as in the other real-engine modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engines_helpers import require_module, vllm_python
from learning_helpers import ROOT, audit, route_with_policy
from serve_helpers import request

from llmlb_bench.engines.vllm import VllmReplicas, write_tiny_model
from llmlb_bench.policies.features import PER_TARGET

pytestmark = pytest.mark.slow


def test_a_trained_policy_routes_two_real_vllm_replicas_as_it_decides_offline(tmp_path):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    policy = tmp_path / "policy.json"
    train = subprocess.run([sys.executable, "-m", "llmlb_bench", "learn", "train", "workloads/chat.toml",
                            "--replicas", "2", "--requests", "150", "--traces", "1", "--generations", "2",
                            "--population", "4", "--elite", "2", "--slo", "ttft=500ms,tpot=50ms", "-o", str(policy)],
                           cwd=ROOT, capture_output=True, text=True)
    assert train.returncode == 0, train.stderr
    model = write_tiny_model(tmp_path / "tiny")

    def send(url: str, i: int) -> None:
        status, _, body = request(url, "POST", "/v1/completions",
                                  {"model": "tiny", "prompt": f"deploy {i} " + "word " * (10 + 9 * i),
                                   "max_tokens": 6 + i % 7, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}}, timeout=300)
        assert status == 200, body[:200]

    with VllmReplicas(model, 2, python=python, log_dir=tmp_path / "logs") as fleet:
        rows, log = route_with_policy(fleet.urls, policy, tmp_path, send, n=12, concurrency=3)
        urls = fleet.urls
    # an ordinary run: every request a row naming its backend, the run complete, llmlb report reads it
    assert len(rows) == 12 and {r["status"] for r in rows} == {"ok"}, [r["error"] for r in rows]
    # the proxy numbers requests in the order they reach it, which three client threads need not keep
    assert sorted(r["output_tokens"] for r in rows) == sorted(6 + i % 7 for i in range(12))
    assert json.loads((tmp_path / "route" / "run.json").read_text())["status"] == "complete"
    report = subprocess.run([sys.executable, "-m", "llmlb_bench", "report", str(tmp_path / "route"), "-f", "json"],
                            cwd=ROOT, capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["runs"][0]["ok"] == 12
    # every decision is the file's model on the observation logged at that moment
    decisions = audit(policy, log, rows, urls)
    assert len(decisions) == 12
    names = json.loads(policy.read_text())["features"]["per_target"]
    assert [f["name"] for f in names] == list(PER_TARGET)
