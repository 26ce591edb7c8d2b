"""Sessions, shared system prompts, prefix hashes, multimodal tokens and agentic fan-out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmlb_bench.workload import WorkloadSpec, generate
from llmlb_bench.workload.multimodal import qwen2vl_tokens
from llmlb_bench.workload.prefixes import reuse_ratio

B = 16
FIXED = {"dist": "fixed"}


def build(tenants, requests=3000, **top):
    return generate(WorkloadSpec.from_dict({"seed": 7, "requests": requests, "block_size": B, "tenants": tenants,
                                            **top}))


def by_id(table):
    return {r["request_id"]: r for r in table.to_pylist()}


def chat(**extra):
    return {"arrival": {"process": "poisson", "rate": 2.0},
            "input": {"dist": "lognormal", "median": 120, "sigma": 0.6},
            "output": {"dist": "lognormal", "median": 150, "sigma": 0.5}, **extra}


SESSIONS = {"turns": {"dist": "zipf", "s": 1.2, "n": 8}, "think_s": {"dist": "exponential", "mean": 20.0}}


def test_sessions_accumulate_context_and_chain_prefixes():
    table = build({"chat": chat(sessions=SESSIONS)})
    rows = by_id(table)
    children = [r for r in rows.values() if r["parent_id"] is not None]
    assert len(children) > 500
    for r in children:
        p = rows[r["parent_id"]]
        assert p["session_id"] == r["session_id"] and r["turn"] == p["turn"] + 1
        assert r["request_id"] > p["request_id"]
        assert math.isclose(r["arrival_s"], p["arrival_s"] + r["after_parent_s"], rel_tol=1e-9, abs_tol=1e-9)
        new_tokens = r["input_tokens"] - p["input_tokens"] - p["output_tokens"]
        assert new_tokens >= 1  # the prompt is the previous prompt + its reply + a new message
        full = p["input_tokens"] // B
        assert r["prefix_hashes"][:full] == p["prefix_hashes"][:full]
        assert r["prefix_hashes"][full] != p["prefix_hashes"][full] if full < len(p["prefix_hashes"]) else True
    for r in rows.values():
        assert len(r["prefix_hashes"]) == -(-r["input_tokens"] // B)
    first = [r for r in rows.values() if r["turn"] == 1]
    assert all(r["parent_id"] is None and r["after_parent_s"] is None for r in first)
    # distinct sessions never share a block (no system prompt here)
    a, b = first[0], first[1]
    assert not set(a["prefix_hashes"]) & set(b["prefix_hashes"])


def test_system_prompts_are_shared_by_zipf_popularity():
    sp = {"groups": 10, "popularity": 1.0, "tokens": {**FIXED, "value": 800}}
    table = build({"chat": chat(system_prompt=sp)}, requests=20_000)
    first_block = np.array([h[0] for h in table.column("prefix_hashes").to_pylist()])
    values, counts = np.unique(first_block, return_counts=True)
    assert len(values) == 10
    share = np.sort(counts)[::-1] / counts.sum()
    zipf = 1 / np.arange(1, 11) / np.sum(1 / np.arange(1, 11))
    assert np.allclose(share, zipf, atol=0.01)
    rows = table.to_pylist()
    same = [r for r in rows if r["prefix_hashes"][0] == rows[0]["prefix_hashes"][0]][:2]
    assert same[0]["prefix_hashes"][:800 // B] == same[1]["prefix_hashes"][:800 // B]
    assert same[0]["prefix_hashes"][800 // B] != same[1]["prefix_hashes"][800 // B]
    assert all(r["input_tokens"] >= 801 for r in rows)
    # infinite-cache reuse: 50 of every ~58 blocks are a shared system prompt seen before
    ratio = reuse_ratio(table.column("prefix_hashes"))
    mean_blocks = np.mean([len(r["prefix_hashes"]) for r in rows])
    assert abs(ratio - (800 // B) / mean_blocks) < 0.01


def test_pools_share_prompts_across_tenants():
    sp = {"groups": 3, "tokens": {**FIXED, "value": 320}, "pool": "platform"}
    table = build({"a": chat(system_prompt=sp), "b": chat(system_prompt=sp)}, requests=500)
    firsts = {(r["tenant"], r["prefix_hashes"][0]) for r in table.to_pylist()}
    assert {h for t, h in firsts if t == "a"} == {h for t, h in firsts if t == "b"}


def test_max_context_ends_sessions():
    long = {"turns": {**FIXED, "value": 50}, "think_s": {**FIXED, "value": 1.0}}
    table = build({"chat": chat(sessions=long, max_context=2000)}, requests=2000)
    inp = table.column("input_tokens").to_numpy()
    out = table.column("output_tokens").to_numpy()
    turn = table.column("turn").to_numpy()
    assert np.all((inp + out <= 2000) | (turn == 1))
    assert turn.max() < 50


def test_multimodal_llava_and_qwen2vl_tokens():
    mm = {"images": {**FIXED, "value": 2}, "rule": "llava"}
    t = build({"v": {**chat(), "input": {**FIXED, "value": 100}, "multimodal": mm}}, requests=100)
    assert set(t.column("images").to_pylist()) == {2}
    assert set(t.column("image_tokens").to_pylist()) == {1152}
    assert set(t.column("input_tokens").to_pylist()) == {1252}
    mm = {"images": {**FIXED, "value": 1}, "rule": "qwen2-vl", "resolutions": [[1920, 1080], [336, 336]],
          "resolution_probs": [0.5, 0.5], "audio_s": {**FIXED, "value": 4.0}}
    t = build({"v": {**chat(), "input": {**FIXED, "value": 100}, "multimodal": mm}}, requests=2000)
    tokens = np.array(t.column("image_tokens").to_pylist())
    assert set(tokens) == {2691, 144}
    assert abs((tokens == 144).mean() - 0.5) < 0.05
    assert np.array_equal(t.column("input_tokens").to_numpy(), 100 + tokens + 100)  # + 4 s x 25 audio tokens
    assert set(t.column("audio_s").to_pylist()) == {4.0}


@pytest.mark.parametrize("w,h,tokens", [(1920, 1080, 39 * 69), (336, 336, 144), (28, 28, 4),
                                        (10000, 10000, 127 * 127), (100, 3000, 4 * 107)])
def test_qwen2vl_smart_resize(w, h, tokens):
    # 1920x1080 -> 1932x1092; tiny images grow to 56x56; huge ones shrink to <= 16384 tokens
    assert qwen2vl_tokens(np.array([w]), np.array([h]))[0] == tokens


def test_agentic_fanout():
    agent = {"arrival": {"process": "poisson", "rate": 1.0}, "input": {**FIXED, "value": 500},
             "output": {**FIXED, "value": 60},
             "fanout": {"children": {"dist": "empirical", "values": [1, 2, 3], "probs": [0.2, 0.5, 0.3]},
                        "depth": 2, "tool_s": {"dist": "exponential", "mean": 3.0},
                        "tool_tokens": {**FIXED, "value": 200}, "output": {**FIXED, "value": 30}}}
    table = build({"agent": agent}, requests=5000)
    rows = by_id(table)
    roots = [r for r in rows.values() if r["parent_id"] is None]
    kids = [r for r in rows.values() if r["parent_id"] is not None]
    mean_k = 0.2 + 1.0 + 0.9
    assert abs(len(kids) / len(roots) - (mean_k + mean_k**2)) / (mean_k + mean_k**2) < 0.08
    siblings_of: dict[int, list] = {}
    for r in kids:
        siblings_of.setdefault(r["parent_id"], []).append(r)
    for r in kids:
        p = rows[r["parent_id"]]
        assert p["request_id"] < r["request_id"] and p["session_id"] == r["session_id"]
        assert r["input_tokens"] == p["input_tokens"] + p["output_tokens"] + 200
        assert r["output_tokens"] == 30 and r["after_parent_s"] >= 0
        assert math.isclose(r["arrival_s"], p["arrival_s"] + r["after_parent_s"], rel_tol=1e-9)
        shared = (p["input_tokens"] + p["output_tokens"]) // B
        assert r["prefix_hashes"][:p["input_tokens"] // B] == p["prefix_hashes"][:p["input_tokens"] // B]
        for s in (x for x in siblings_of[r["parent_id"]] if x is not r):  # siblings share the parent's context, then diverge at the tool result
            assert s["prefix_hashes"][:shared] == r["prefix_hashes"][:shared]
            assert s["prefix_hashes"][-1] != r["prefix_hashes"][-1]


def test_truncation_never_orphans_and_is_deterministic(tmp_path):
    spec = {"chat": chat(sessions=SESSIONS)}
    a, b = build(spec, requests=777), build(spec, requests=777)
    assert a.equals(b) and a.num_rows == 777
    ids = set(a.column("request_id").to_pylist())
    assert all(p in ids for p in a.column("parent_id").to_pylist() if p is not None)


def test_prefix_hashes_switch():
    assert build({"chat": chat()}, requests=10).column("prefix_hashes").null_count == 10
    hashed = build({"chat": chat()}, requests=10, prefix_hashes=True).column("prefix_hashes")
    assert hashed.null_count == 0 and reuse_ratio(hashed) == 0.0
