"""Multi-LoRA against real vLLM (its CPU build): tiny random adapters written locally, served with
``--enable-lora --max-loras 2``; the replayer names adapters as models, rows record them, the
scraped ``vllm:lora_requests_info`` shows which adapters run and wait, and a third adapter waits
for a slot while two others decode, as the simulator's replicas model it (sim/lora.py).

One vLLM server for the module (about 40 s to start); without vLLM the tests fail where ``CI``
is set and skip elsewhere."""

from __future__ import annotations

import json
import math
import urllib.request

import pyarrow as pa
import pytest
from engines_helpers import require_module, vllm_python
from replay_helpers import run_replay

from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_adapter, write_tiny_model
from llmlb_bench.policies import RouteRequest, View
from llmlb_bench.policies.lora import AdapterSnapshot, LoraAffinity
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.scrape import parse_metrics
from tests.sim_helpers import trace

pytestmark = pytest.mark.slow

ADAPTERS = ("a1", "a2", "a3")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    root = tmp_path_factory.mktemp("vllm-lora")
    model = write_tiny_model(root / "tiny")
    modules = {name: str(write_tiny_adapter(root / name, model, rank=8, seed=k)) for k, name in enumerate(ADAPTERS)}
    settings = VllmSettings(lora_modules=modules, max_loras=2, max_lora_rank=8)
    with VllmReplicas(model, 1, settings=settings, python=python, log_dir=root / "logs") as fleet:
        yield fleet.urls[0]


class _Watching(LoraAffinity):
    """LoRA-affinity routing that keeps what the scraper had put in the view for each request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, object] = {}

    def choose(self, req: RouteRequest, view: View) -> int:
        self.seen[req.request_id] = view.adapters[0]
        return super().choose(req, view)


def test_adapters_are_listed_as_models_with_their_base_as_parent(engine):
    with urllib.request.urlopen(engine + "/v1/models", timeout=120) as r:
        listed = {m["id"]: m.get("parent") for m in json.load(r)["data"]}
    assert listed == {"tiny": None, "a1": "tiny", "a2": "tiny", "a3": "tiny"}


def _paced(engine, tmp_path) -> tuple[float, int]:
    """When a3 arrives and how long a1 and a2 decode, from this engine's own pace on this machine: a lone
    a1 request's first token and token gap. a3 comes once a1 and a2 have surely started and the scraper
    (every 0.1 s) has read them (0.5 s on a quiet machine), and they decode four times that long again.
    WHY: at fixed times, a machine slow enough had not admitted a2 by a3's arrival."""
    _, rows, _ = run_replay(trace([0.0], 40, [16], adapter=pa.array(["a1"])), [engine], tmp_path / "pace",
                            _Watching(), ReplayOptions())
    (r,) = rows
    ttft = r["first_token_s"] - r["sent_s"]
    gap = (r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
    arrive = max(0.5, 5 * ttft + 3 * 0.1)
    return arrive, min(4000, max(400, math.ceil(4 * arrive / gap)))


def test_a_third_adapter_waits_for_a_slot_while_two_decode(engine, tmp_path):
    # a1 and a2 decode from t = 0; later (0.5 s, or what this machine's pace needs) come a3 and a base-model request
    adapters = ["a1", "a2", "a3", None]
    arrive, out = _paced(engine, tmp_path)
    table = trace([0.0, 0.0, arrive, arrive], 40, [out, out, 8, 8], adapter=pa.array(adapters))
    policy = _Watching()
    summary, rows, _ = run_replay(table, [engine], tmp_path, policy, ReplayOptions(scrape_s=0.1))
    assert summary["statuses"] == {"ok": 4}, [r["error"] for r in rows]
    assert [r["adapter"] for r in rows] == adapters
    a1, a2, a3, base = rows
    # a3 could not join the batch: its first token comes only after a1 or a2 has left it
    assert a3["first_token_s"] >= min(a1["last_token_s"], a2["last_token_s"])
    # the base model needs no slot: it is served at once, alongside both adapters
    assert base["first_token_s"] < min(a1["last_token_s"], a2["last_token_s"])
    assert base["first_token_s"] - base["sent_s"] < 0.5 * (a3["first_token_s"] - a3["sent_s"])
    # what the scraper had read when a3 arrived: a1 and a2 running in vLLM's two slots
    seen = policy.seen[2]
    assert isinstance(seen, AdapterSnapshot) and seen.max_loras == 2 and set(seen.running) == {"a1", "a2"}

    # afterwards: every state the engine went through is still exposed, the newest says idle
    with urllib.request.urlopen(engine + "/metrics", timeout=120) as r:
        text = r.read().decode()
    assert sum(line.startswith("vllm:lora_requests_info{") for line in text.splitlines()) > 1
    info = parse_metrics(text).lora
    assert info is not None and info.max_loras == 2 and not info.running and not info.waiting
