"""The TOML the tool writes (tomli-w) reads back through the one reader, as the same document."""

from __future__ import annotations

import math

from llmlb_bench.tomlfile import dumps_toml, read_toml


def test_written_specs_read_back_equal_without_the_nones(tmp_path):
    doc = {"name": "fit", "requests": 500, "seed": None, "rate_scale": 1.5,
           "input": {"dist": "empirical", "values": [12, 40, 90], "weights": (0.5, 0.25, 0.25), "min": None},
           "tenants": {"chat": {"arrival": {"process": "poisson", "rate": 2.0}, "share": 1.0}},
           "limits": {"ttft_s": math.inf}}
    path = tmp_path / "spec.toml"
    path.write_text(dumps_toml(doc, comment="Workload spec fitted to x.csv\nsecond line"))
    text = path.read_text()
    assert text.startswith("# Workload spec fitted to x.csv\n# second line\n")
    back = read_toml(path)
    assert back == {"name": "fit", "requests": 500, "rate_scale": 1.5,
                    "input": {"dist": "empirical", "values": [12, 40, 90], "weights": [0.5, 0.25, 0.25]},
                    "tenants": {"chat": {"arrival": {"process": "poisson", "rate": 2.0}, "share": 1.0}},
                    "limits": {"ttft_s": math.inf}}
