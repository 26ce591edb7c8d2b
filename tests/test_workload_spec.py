"""Spec validation: every mistake is one UserError naming the file and the dotted field."""

from __future__ import annotations

import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.workload import load_spec

GOOD = """
seed = 3
requests = 100
[tenants.chat]
arrival = { process = "poisson", rate = 5.0 }
input = { dist = "lognormal", median = 300, sigma = 1.0 }
output = { dist = "lognormal", mu = 5.0, sigma = 0.5, max = 512 }
"""


def write(tmp_path, text):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def error_of(tmp_path, text) -> str:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_spec(path)
    line = info.value.line()
    assert "\n" not in line
    assert line.startswith(str(path) + ": ")
    return line


def test_good_spec_loads_and_round_trips(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.seed == 3 and spec.requests == 100 and spec.duration_s is None
    assert spec.tenant_names == ["chat"]
    assert spec.tenants[0].output.max == 512
    again = type(spec).from_dict(spec.to_dict())
    assert again.to_dict() == spec.to_dict()


def test_unknown_distribution(tmp_path):
    line = error_of(tmp_path, GOOD.replace('dist = "lognormal", median', 'dist = "lognormale", median'))
    assert "tenants.chat.input.dist" in line and "lognormale" in line and "known: " in line


def test_negative_rate(tmp_path):
    line = error_of(tmp_path, GOOD.replace("rate = 5.0", "rate = -1"))
    assert "tenants.chat.arrival.rate" in line and "must be > 0" in line


def test_missing_field(tmp_path):
    line = error_of(tmp_path, GOOD.replace(", sigma = 1.0 }", " }"))
    assert "tenants.chat.input.sigma: missing required field" in line


def test_negative_sigma(tmp_path):
    line = error_of(tmp_path, GOOD.replace("sigma = 1.0", "sigma = -1"))
    assert "tenants.chat.input.sigma" in line


def test_typo_is_an_unknown_field(tmp_path):
    line = error_of(tmp_path, GOOD.replace("sigma = 0.5", "sigm = 0.5"))
    assert "tenants.chat.output: unknown field 'sigm' (did you mean 'sigma'?)" in line
    line = error_of(tmp_path, GOOD.replace("max = 512", "maxx = 512"))
    assert "tenants.chat.output: unknown field 'maxx' (did you mean 'max'?)" in line
    # a typo is named as such, not by the symptom it causes (a missing or conflicting field)
    line = error_of(tmp_path, GOOD.replace("requests =", "reqests ="))
    assert "unknown field 'reqests' (did you mean 'requests'?)" in line
    line = error_of(tmp_path, GOOD.replace("median = 300", "medain = 300"))
    assert "unknown field 'medain' (did you mean 'median'?)" in line


def test_wrong_type(tmp_path):
    line = error_of(tmp_path, GOOD.replace("rate = 5.0", 'rate = "fast"'))
    assert "tenants.chat.arrival.rate: expected a number" in line


def test_requests_or_duration(tmp_path):
    assert "exactly one of requests" in error_of(tmp_path, GOOD.replace("requests = 100", ""))
    assert "exactly one of requests" in error_of(tmp_path, GOOD.replace("requests = 100", "requests = 1\nduration_s = 2"))


def test_no_tenants(tmp_path):
    assert "tenants" in error_of(tmp_path, "requests = 1\n[tenants]\n")


def test_bad_toml_and_missing_file(tmp_path):
    assert "not valid TOML" in error_of(tmp_path, "requests = = 1")
    with pytest.raises(UserError, match="no such file"):
        load_spec(tmp_path / "absent.toml")


def test_replace_overrides_run_length(tmp_path):
    spec = load_spec(write(tmp_path, GOOD)).replace(duration_s=10.0, seed=9)
    assert spec.duration_s == 10.0 and spec.requests is None and spec.seed == 9
    assert spec.to_dict()["seed"] == 9


def test_presets_load():
    from pathlib import Path

    presets = sorted((Path(__file__).resolve().parents[1] / "workloads").glob("*.toml"))
    assert presets
    for path in presets:
        load_spec(path)
