"""Failures explained: requests that are not ok, counted by status and normalised reason in every format."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from conftest import cli
from llmlb_bench.cli import main
from llmlb_bench.metrics.failures import NO_REASON, reasons, sentence

LIMIT = "exceeds the maximum model length 8192"


def test_reasons_group_texts_that_differ_in_one_requests_numbers():
    got = reasons([(f"input + output = 8390 tokens {LIMIT}", 1), (f"input + output = 9912 tokens {LIMIT}", 3),
                   (None, 2), ("", 1),
                   ("connect failed: [Errno 111] Connection refused to 127.0.0.1:8000", 1),
                   ("server error: request cmpl-3f2a9b1c2d3e4f5a6b7c not found", 1),
                   ("server error: request cmpl-0aa19b1c2d3e4f5a6b70 not found", 2)])
    assert got == [
        {"reason": f"input + output = 8,390-9,912 tokens {LIMIT}", "requests": 4},   # the limit stays as written
        {"reason": NO_REASON, "requests": 3},
        {"reason": "server error: request cmpl-<id> not found", "requests": 3},
        {"reason": "connect failed: [Errno 111] Connection refused to 127.0.0.1:8000", "requests": 1},
    ]
    assert sentence({"status": "not_sent", **got[1]}) == f"3 not sent: {NO_REASON}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Prompts of about 6,000 tokens and 2,500-token outputs on Llama-3-8B (8,192): a share is rejected."""
    tmp = tmp_path_factory.mktemp("failures")
    spec = tmp / "long.toml"
    spec.write_text("""
name = "long"
seed = 3
requests = 120
[tenants.t]
arrival = { process = "poisson", rate = 2.0 }
input = { dist = "lognormal", median = 5800, sigma = 0.2, max = 9000 }
output = { dist = "fixed", value = 2500 }
""")
    with contextlib.redirect_stdout(io.StringIO()):
        main(["run", str(spec), "-p", "least_outstanding", "--results", str(tmp / "results"), "--replicas", "2"])
    return tmp / "results"


def test_every_format_counts_the_rejected_requests_with_their_reason(results, capsys):
    doc = json.loads(cli(["report", str(results), "--format", "json"], capsys)[1])
    [run] = doc["runs"]
    [f] = run["failures"]
    assert f["status"] == "rejected" and f["requests"] == run["rejected"] > 0
    m = re.fullmatch(rf"input \+ output = ([\d,]+)-([\d,]+) tokens {LIMIT}", f["reason"])
    assert m and 8192 < int(m[1].replace(",", "")) < int(m[2].replace(",", "")) <= 9000 + 2500
    want = f"{f['requests']:,}"
    text = cli(["report", str(results)], capsys)[1]
    line = next(x for x in text.splitlines() if "rejected" in x and "input + output" in x)
    assert want in line and f["reason"] in " ".join(text.split())
    md = cli(["report", str(results), "--format", "md"], capsys)[1]
    assert f"| {want} | rejected | {f['reason']} |" in md
    page = cli(["report", str(results), "--format", "html"], capsys)[1]
    assert f"<td>{want}</td><td>rejected</td><td>{f['reason']}</td>" in page
