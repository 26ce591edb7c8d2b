"""Catalogs and cluster configuration: contents, validation, user overrides, round trips."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig, CostModel, PoolConfig, load_catalog

GPUS = {"a100-80g", "h100-sxm", "h200", "l4", "a10g", "mi300x", "b200"}
MODELS = {"llama-2-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen2.5-72b", "mixtral-8x7b", "deepseek-v3"}


def test_builtin_catalog_has_the_required_entries():
    cat = load_catalog()
    assert GPUS <= set(cat.gpus) and MODELS <= set(cat.models)
    assert cat.gpus["h100-sxm"].bf16_tflops == 989 and cat.gpus["a100-80g"].hbm_gb_s == 2039
    m = cat.models["llama-3-8b"]
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB per token
    assert cat.models["deepseek-v3"].kv_bytes_per_token == 61 * (512 + 64) * 2  # MLA latent
    assert cat.models["mixtral-8x7b"].is_moe and not m.is_moe


def test_every_figure_in_the_builtin_catalog_cites_a_source():
    from importlib import resources

    for name in ("gpus.toml", "models.toml"):
        text = (resources.files("llmlb_bench") / "catalog" / name).read_text()
        data_lines = [ln for ln in text.splitlines() if "=" in ln and not ln.lstrip().startswith("#")]
        numeric = [ln for ln in data_lines if ln.split("=")[0].strip() in ("bf16_tflops", "hbm_gb_s", "params_b")]
        assert numeric and all("#" in ln for ln in numeric), f"{name}: uncited figure"


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UserError, match=r"unknown GPU 'h100'.*h100-sxm") as e:
        ClusterConfig.build(gpu="h100")
    assert e.value.where == "cluster.gpu"
    with pytest.raises(UserError, match=r"unknown model 'llama3'.*llama-3-8b"):
        ClusterConfig.build(model="llama3")


@pytest.mark.parametrize("kwargs, line", [
    ({"replicas": 0}, "cluster.replicas: must be a positive integer"),
    ({"tp": 0}, "cluster.tp: must be a positive integer"),
    # keyword settings are type-checked like a cluster file's: the line names the field
    ({"tp": 1.5}, "cluster: tp: expected an integer, got a number"),
    ({"gpu_memory_utilization": 1.2}, "cluster.gpu_memory_utilization: must be in (0, 1]"),
    ({"max_num_seqs": 512, "max_num_batched_tokens": 256}, "cluster.max_num_batched_tokens: "),
])
def test_bad_settings_name_the_field(kwargs, line):
    with pytest.raises(UserError) as e:
        ClusterConfig.build(**kwargs)
    assert str(e.value).startswith(line)


def test_config_round_trips_through_json():
    cfg = ClusterConfig.build(replicas=8, gpu="h100-sxm", model="llama-3-70b", tp=4, max_num_seqs=128)
    back = ClusterConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    with pytest.raises(UserError, match="unknown field 'replica' \\(did you mean 'replicas'\\?\\)"):
        ClusterConfig.from_dict({"replica": 3})


def test_settings_are_parsed_once_into_typed_pools_and_stored_as_tables():
    cfg = ClusterConfig.build(tp=2, pools=({"name": "prefill", "replicas": 1},
                                           {"name": "decode", "replicas": 2, "gpu": "h100-sxm"}))
    assert all(isinstance(p, PoolConfig) for p in cfg.pools)
    assert [(p.name, p.role, p.replicas, p.gpu, p.tp) for p in cfg.pools] == \
        [("prefill", "prefill", 1, "a100-80g", 2), ("decode", "decode", 2, "h100-sxm", 2)]
    assert cfg.replicas == 3 and cfg.disaggregated
    # vLLM's batch defaults per GPU, filled in when parsed
    assert [(p.max_num_seqs, p.max_num_batched_tokens) for p in cfg.pools] == [(256, 2048), (1024, 8192)]
    stored = json.loads(json.dumps(cfg.to_dict()))          # run.json: every pool a table of all its fields
    assert [sorted(p) for p in stored["pools"]] == [sorted(f.name for f in dataclasses.fields(PoolConfig))] * 2
    assert ClusterConfig.from_dict(stored) == cfg
    assert [p.name for p in ClusterConfig.build(replicas=2).pools] == ["default"]
    with pytest.raises(TypeError, match="ClusterConfig.build"):
        ClusterConfig(replicas=2)                           # unparsed settings are refused, not half-used


def test_model_that_does_not_fit_is_a_user_error():
    cfg = ClusterConfig.build(gpu="a100-80g", model="llama-3-70b", tp=1)
    with pytest.raises(UserError, match="does not fit.*raise tp"):
        CostModel(cfg.model_spec, cfg.gpu_spec, cfg.tp)


def test_user_catalog_adds_and_overrides(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("""
[models.llama-3-8b-fp8]
description = "Llama 3 8B with FP8 weights"
params_b = 8.03
active_params_b = 8.03
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
head_dim = 128
intermediate = 14336
vocab = 128256
tied_embeddings = false
experts = 0
active_experts = 0
kv_lora_rank = 0
qk_rope_head_dim = 0
weight_bytes = 1
kv_bytes = 1
max_context = 8192
""")
    cat = load_catalog([path])
    assert cat.models["llama-3-8b-fp8"].kv_bytes_per_token == 64 * 1024
    cfg = ClusterConfig.build(model="llama-3-8b-fp8", catalogs=(str(path),))
    fp8 = CostModel(cfg.model_spec, cfg.gpu_spec)
    bf16 = CostModel(load_catalog().models["llama-3-8b"], cfg.gpu_spec)
    assert fp8.kv_blocks > 2 * bf16.kv_blocks and fp8.decode_time(1, 100) < bf16.decode_time(1, 100)


@pytest.mark.parametrize("text, problem", [
    ("[gpus.x]\nmemory_gib = 1\n", "missing field"),
    ("[gpus.a100-80g]\nfoo = 1\n", "unknown field 'foo'"),
    ("[widgets.x]\n", "unknown section 'widgets'"),
    ("[gpus.x\n", "not valid TOML"),
])
def test_bad_user_catalog_is_one_line_error(tmp_path, text, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=problem) as e:
        load_catalog([path])
    assert e.value.where == str(path) and "\n" not in e.value.line()


def test_bad_field_value_names_entry_and_field(tmp_path):
    import dataclasses

    base = load_catalog().gpus["l4"]
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name != "name"}
    fields["memory_efficiency"] = 1.5
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    path = tmp_path / "bad.toml"
    path.write_text(f"[gpus.l4x]\n{body}\n")
    with pytest.raises(UserError, match="entry 'l4x' field 'memory_efficiency'"):
        load_catalog([path])
