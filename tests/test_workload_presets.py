"""Every preset in workloads/ loads, generates quickly, and shows the property it is named for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from llmlb_bench.workload import generate, load_spec
from llmlb_bench.workload.stats import trace_stats

PRESETS = Path(__file__).resolve().parents[1] / "workloads"
NAMES = ["chat", "code", "rag", "multimodal", "reasoning", "agentic", "bursty", "diurnal", "multi-tenant",
         "shared-prefix"]


def test_every_named_preset_exists_and_cites_a_source():
    for name in NAMES:
        text = (PRESETS / f"{name}.toml").read_text()
        assert text.startswith("#") and ("Source" in text or "What it models" in text), name


@pytest.fixture(scope="module")
def traces():
    return {name: generate(load_spec(PRESETS / f"{name}.toml")) for name in NAMES}


def test_presets_show_their_property(traces):
    s = {name: trace_stats(t) for name, t in traces.items()}
    assert s["bursty"]["idc"]["10s"] > 5
    assert s["code"]["output_tokens"]["p50"] < 40 and s["code"]["input_tokens"]["p50"] > 800
    assert s["rag"]["input_tokens"]["p50"] > 3000
    assert s["multimodal"]["images"]["requests_with_images"] == 1.0
    out = traces["reasoning"].column("output_tokens").to_numpy()
    assert s["reasoning"]["output_tokens"]["p50"] > 1000 and (out < 700).mean() > 0.15  # two modes
    assert s["agentic"]["dependent_requests"] > 0.6 * traces["agentic"].num_rows
    assert len(s["multi-tenant"]["tenants"]) == 3
    assert s["shared-prefix"]["prefix"]["reuse_ratio"] > 0.4 and s["shared-prefix"]["sessions"]["sessions"] > 500
    arrival = traces["diurnal"].column("arrival_s").to_numpy()
    middle = ((arrival > 200) & (arrival < 400)).sum()
    edges = (arrival < 100).sum() + (arrival > 500).sum()
    assert middle > 1.8 * edges  # peak in the middle of the compressed day


def test_chat_preset_sizing(traces):
    t = traces["chat"]
    assert 2000 <= t.num_rows <= 5000
    assert pc.max(t.column("input_tokens")).as_py() <= 8192
    assert np.median(t.column("output_tokens").to_numpy()) > 100


#: presets that do not fit the default model's context, and what their comment must say about it
LONGER_THAN_DEFAULT = {"coding-agent": "qwen2.5-7b", "multimodal": "8,192"}


@pytest.mark.parametrize("path", sorted(PRESETS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_preset_fits_the_default_models_context_or_says_why_not(path):
    """prompt + output within the default fleet's context (Llama-3-8B: 8,192), as generated with the preset's
    own seed: the tour's `llmlb run workloads/chat.toml` rejected 4 requests before its caps were set."""
    from llmlb_bench.sim import ClusterConfig

    cfg = ClusterConfig.build()
    context = cfg.pools[0].model_spec(cfg.catalogs).max_context
    t = generate(load_spec(path))
    longest = int(pc.max(pc.add(t.column("input_tokens").cast("int64"), t.column("output_tokens"))).as_py())
    if path.stem in LONGER_THAN_DEFAULT:
        head = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        assert LONGER_THAN_DEFAULT[path.stem] in head, path.stem
    else:
        assert longest <= context, f"{path.name}: a request of {longest} tokens, context {context}"
