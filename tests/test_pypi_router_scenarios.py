"""The router scenario suite: traces against their definitions, error classification, and a smoke
run of `llmlb routers bench` (direct and vllm-router, fresh llmlb serve backends, one kill and
restart) whose runs are ordinary llmlb runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.pypi_routers.bench import agreement, error_kind
from llmlb_bench.pypi_routers.scenarios import offered_hit_rate, prefix_ladder, sessions, suite
from llmlb_bench.store.views import Catalog
from tests.conftest import cli


@pytest.mark.parametrize("reuse", [0.0, 0.25, 0.5, 0.9])
def test_prefix_ladder_offers_its_share(reuse: float):
    """Every request after the first of its group could reuse exactly round(reuse * 32) blocks."""
    table = prefix_ladder(reuse, 200, 30.0, seed=1)
    groups = len({h[0] for h in table.column("prefix_hashes").to_pylist() if h and reuse})
    expected = (200 - groups) * round(reuse * 32) * 16 / (200 * 512)
    assert offered_hit_rate(table) == pytest.approx(expected)


def test_sessions_extend_their_conversation():
    table = sessions(6, 4, 5.0, seed=2).to_pydict()
    by: dict[int, list[tuple[int, list[int]]]] = {}
    for sid, turn, hs in zip(table["session_id"], table["turn"], table["prefix_hashes"]):
        by.setdefault(sid, []).append((turn, hs))
    for turns in by.values():
        turns.sort()
        assert [t for t, _ in turns] == [0, 1, 2, 3]
        for (_, a), (_, b) in zip(turns, turns[1:]):
            assert b[:len(a)] == a and len(b) == len(a) + 6
    assert np.all(np.diff(table["arrival_s"]) >= 0)


def test_error_kinds():
    assert error_kind("ok", None, 200, False) is None
    assert error_kind("ok", None, 200, True) == "short stream without usage"
    assert error_kind("error", "server error in stream: worker died", 200, False) == "in-band error event"
    assert error_kind("error", "connection lost (after 3 tokens)", 200, False) == "dropped connection"
    assert error_kind("error", "HTTP 503: no workers", 503, False) == "http 503"
    assert error_kind("timeout", "no token for 30 s", None, False) == "timeout"


def test_agreement_same_and_colocation():
    """Swapped labels: no request on the same backend, yet the same partition (Rand index 1);
    one request moved: Rand index from the pair count by hand."""
    x = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert agreement(x, {0: "b", 1: "b", 2: "a", 3: "a"}) == {"same": 0.0, "colocation": 1.0}
    got = agreement(x, {0: "a", 1: "a", 2: "b", 3: "a"})
    # pairs: (0,1) together both; (2,3) together in x only; (0,3), (1,3) apart in x only; (0,2),(1,2) apart both
    assert got["same"] == 0.75 and got["colocation"] == pytest.approx(3 / 6)
    assert agreement({}, x) == {"same": None, "colocation": None}


def test_suite_names_are_unique_and_scale():
    small, full = suite(0.1), suite(1.0)
    assert [s.name for s in small] == [s.name for s in full] and len({s.name for s in full}) == len(full)
    assert all(a.trace.num_rows < b.trace.num_rows for a, b in zip(small, full))


@pytest.mark.slow
def test_bench_smoke_through_vllm_router(tmp_path: Path, capsys):
    code, out, err = cli(["routers", "bench", "-r", "vllm-router", "-s", "prefix-50", "-s", "failover",
                          "--scale", "0.1", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    cells = json.loads((tmp_path / "figures.json").read_text())
    assert [(c["scenario"], c["router"]) for c in cells] == [
        ("prefix-50", "direct"), ("prefix-50", "vllm-router"), ("failover", "direct"), ("failover", "vllm-router")]
    for c in cells:
        assert c["requests"] == 24 and 0 < c["jain_backends"] <= 1
        assert c["ok"] + sum(c["errors"].values()) >= c["requests"] - c["ok"]
        assert c["backend_known"] >= c["ok"] / c["requests"]
    prefix = cells[1]
    assert prefix["cpu_ms_per_request"] > 0 and prefix["added_ttft_p50_s"] is not None
    assert prefix["hit_rate_delivered"] <= prefix["hit_rate_offered"] + 1e-9
    for key in ("agreement_direct", "agreement_sim", "colocation_direct", "colocation_sim"):
        assert 0 <= prefix[key] <= 1
    readme = (tmp_path / "README.md").read_text()
    assert "### failover" in readme and "| vllm-router |" in readme
    cat = Catalog([tmp_path])   # ordinary runs: the query layer reads them
    n = cat.con.execute("SELECT count(*) FROM requests WHERE backend IS NOT NULL").fetchone()[0]
    assert n >= 4 * 24 - 8


@pytest.mark.parametrize("args, where", [
    (["routers", "bench", "-r", "nope"], "--router"),
    (["routers", "bench", "-s", "nope"], "--scenario"),
    (["routers", "bench", "--scale", "0"], "--scale"),
    (["route", "-b", "localhost:8000"], "--backend"),
    (["route", "-b", "http://127.0.0.1:8000", "-p", "nope"], "--policy"),
])
def test_bad_input_is_one_line(args: list[str], where: str, capsys):
    code, out, err = cli(args, capsys)
    assert code == 2 and err.strip().count("\n") == 0 and where in err and "Traceback" not in err


def test_bench_refuses_an_out_folder_with_runs(tmp_path: Path, capsys):
    (tmp_path / "failover" / "direct").mkdir(parents=True)
    code, _, err = cli(["routers", "bench", "-s", "failover", "--out", str(tmp_path)], capsys)
    assert code == 2 and "give another --out" in err
