"""Characterisation figures against theory, and ``llmlb trace stats``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from llmlb_bench.cli import main
from llmlb_bench.schema import write_trace
from llmlb_bench.workload import WorkloadSpec, generate
from llmlb_bench.workload.stats import hill_alpha, hurst, index_of_dispersion, trace_stats


def test_poisson_figures():
    t = np.cumsum(np.random.default_rng(0).exponential(0.02, 200_000))
    assert abs(index_of_dispersion(t, 1.0) - 1.0) < 0.06
    assert abs(hurst(t) - 0.5) < 0.06


def test_hill_recovers_pareto_tail():
    x = np.random.default_rng(1).pareto(1.5, 200_000) + 1.0
    assert abs(hill_alpha(x) - 1.5) / 1.5 < 0.1
    assert hill_alpha(np.random.default_rng(2).exponential(1.0, 200_000)) > 4  # light tail: large alpha


def structured_trace():
    return generate(WorkloadSpec.from_dict({"seed": 1, "requests": 8000, "tenants": {
        "chat": {"arrival": {"process": "mmpp", "states": [{"rate": 2.0, "mean_s": 30.0},
                                                           {"rate": 30.0, "mean_s": 10.0}]},
                 "input": {"dist": "lognormal", "median": 200, "sigma": 1.0},
                 "output": {"dist": "lognormal", "median": 100, "sigma": 0.8}, "io_correlation": 0.5,
                 "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": {"dist": "fixed", "value": 5.0}},
                 "system_prompt": {"groups": 4, "tokens": {"dist": "fixed", "value": 512}}},
        "vlm": {"arrival": {"process": "poisson", "rate": 2.0}, "input": {"dist": "fixed", "value": 50},
                "output": {"dist": "fixed", "value": 20}, "kind": "multimodal",
                "multimodal": {"images": {"dist": "fixed", "value": 1}, "rule": "llava"}},
    }}))


def test_trace_stats_figures():
    table = structured_trace()
    s = trace_stats(table)
    assert s["requests"] == 8000 and s["rate_rps"] > 0
    assert s["idc"]["10s"] > s["idc"]["1s"] > 3  # MMPP bursts: dispersion grows with the window
    assert s["io_spearman"] > 0.2
    assert 0.3 < s["prefix"]["reuse_ratio"] < 1 and s["prefix"]["block_size"] == 16
    assert s["sessions"]["max_requests"] == 3 and s["dependent_requests"] > 2000
    assert 0 < s["images"]["requests_with_images"] < 0.5
    assert set(s["tenants"]) == {"chat", "vlm"} and s["kinds"]["multimodal"] == s["tenants"]["vlm"]
    json.dumps(s)  # JSON-able (no NaN)


def test_cli_stats_json_and_plots(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    write_trace(structured_trace(), path, block_size=16)
    main(["trace", "stats", str(path), "--json", "--plots", str(tmp_path / "plots")])
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] == 8000 and len(figures["plots"]) == 3
    for p in figures["plots"]:
        root = ET.parse(p).getroot()
        assert root.tag.endswith("svg") and list(root.iter("{http://www.w3.org/2000/svg}polyline"))
    main(["trace", "stats", str(path)])
    assert "index of dispersion" in capsys.readouterr().out


def test_cli_stats_bad_file(tmp_path, capsys):
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(SystemExit) as info:
        main(["trace", "stats", str(bad)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "x.parquet" in err and len(err.strip().splitlines()) == 1
