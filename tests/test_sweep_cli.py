"""``llmlb sweep`` end to end on a small grid, its coordinates in run.json, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.store.views import Catalog
from llmlb_bench.sweep import load_sweep

REPO = Path(__file__).resolve().parents[1]
CHAT = (REPO / "workloads" / "chat.toml").as_posix()

SMALL = f"""
name = "small"
slo = "ttft=400ms,tpot=50ms"
seeds = [3]

[workloads]
chat = {{ spec = "{CHAT}", requests = 150 }}

[clusters]
two = {{ replicas = 2 }}

[policies]
rr = {{ policy = "round_robin" }}
p2c = {{ policy = "power_of_d", args = {{ d = 2 }} }}

[load]
rate = [10, 20, 30]
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sweep_runs_tags_every_cell_and_a_rerun_only_reports(tmp_path, capsys):
    sweep = _write(tmp_path, SMALL)
    results = tmp_path / "results"
    main(["sweep", str(sweep), "-r", str(results), "-j", "1", "--format", "json"])
    summary = json.loads(capsys.readouterr().out)
    assert [c["policy"] for c in summary["curves"]] == ["rr", "p2c"]
    points = summary["curves"][0]["points"]
    assert [p["x"] for p in points] == [10, 20, 30]
    assert [p["rate"] for p in points] == pytest.approx([10, 20, 30])
    assert [p["rate_scale"] for p in points] == pytest.approx([0.25, 0.5, 0.75])  # chat.toml offers 40 req/s
    assert all(0 <= p["attainment"]["mean"] <= 1 for p in points)
    # realised offered rate (requests / arrival window of the trace run) beside the nominal one: goodput is per
    # second of the same window, so never above it, while a nominal rate can be (10 req/s nominal, 150 requests)
    for p in (p for c in summary["curves"] for p in c["points"]):
        assert 0.5 * p["rate"] < p["realised_rate"]["mean"] < 2 * p["rate"]
        assert p["goodput"]["mean"] <= p["realised_rate"]["mean"] + 1e-9
    for curve in summary["curves"]:  # DistServe's max goodput: the highest rate still at 90% attainment
        meeting = [p["rate"] for p in curve["points"] if p["attainment"]["mean"] >= 0.9]
        assert (curve["max_goodput"] or {}).get("rate") == (max(meeting) if meeting else None)
    assert json.loads((results / "small" / "summary.json").read_text())["curves"] == summary["curves"]

    # coordinates are queryable like any run field
    rows = Catalog([results / "small"], confined=True).query_read_only(
        "select meta->>'$.config.sweep.policy' as policy, (meta->>'$.config.sweep.rate')::double as rate, "
        "(meta->>'$.config.sweep.seed')::int as seed, count(*) as n from runs group by all order by all").to_pylist()
    assert rows == [{"policy": p, "rate": r, "seed": 3, "n": 1} for p in ("p2c", "rr") for r in (10.0, 20.0, 30.0)]

    main(["sweep", str(sweep), "-r", str(results), "-j", "1"])
    out = capsys.readouterr().out
    assert "simulated 0 runs, reused 6" in out
    assert "Stability: chat on two" in out and "knee of e2e.mean" in out

    # HTML and Markdown from the basic install: tables, knees and one inline SVG chart per figure
    main(["sweep", str(sweep), "-r", str(results), "-j", "1", "--format", "html"])
    page = capsys.readouterr().out
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg") == 4 and "<script" not in page and "<h2>Stability: chat on two" in page
    assert "capacity" in page or "attainment below" in page
    main(["sweep", str(sweep), "-r", str(results), "-j", "1", "--format", "md"])
    md = capsys.readouterr().out
    assert md.startswith("### llmlb sweep small") and "| policy | rate | offered nominal | offered realised |" in md


def test_a_changed_sweep_file_does_not_overwrite_finished_cells(tmp_path, capsys):
    results = tmp_path / "results"
    main(["sweep", str(_write(tmp_path, SMALL)), "-r", str(results), "-j", "1", "--format", "json"])
    capsys.readouterr()
    changed = _write(tmp_path, SMALL.replace("replicas = 2", "replicas = 3"))
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(changed), "-r", str(results), "-j", "1"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "holds a finished run of a different sweep definition" in err and "Traceback" not in err


def test_help_shows_an_example(capsys):
    main(["sweep", "--help"])
    assert "llmlb sweep sweeps/policies.toml" in capsys.readouterr().out


BASE = SMALL.replace('name = "small"\n', "")


@pytest.mark.parametrize("text, fragments", [
    (BASE.replace("[load]\nrate = [10, 20, 30]", ""), ["nothing to run"]),
    (BASE.replace("rate = [10, 20, 30]", "load = [0.5]"), ["load.load", "add a [capacity] section"]),
    (BASE.replace("rate = [10, 20, 30]", "rate = [10, 10]"), ["load.rate", "values repeat"]),
    (BASE.replace("rate = [10, 20, 30]", "rate = [10]\nrate_scale = [1]"), ["give exactly one of"]),
    (BASE.replace("rate = [10, 20, 30]", "rate = [0, 1]"), ["load.rate[0]", "must be > 0"]),
    (BASE.replace('rr = { policy = "round_robin" }', 'rr = { policy = "round_robbin" }'),
     ["policies.rr", "unknown policy 'round_robbin'"]),
    (BASE.replace("args = { d = 2 }", "args = { dd = 2 }"), ["policies.p2c", "no parameter 'dd'"]),
    (BASE.replace("two = { replicas = 2 }", "two = { replicas = 2, gpus = 'x' }"),
     ["clusters.two", "unknown field 'gpus' (did you mean 'gpu'?)"]),
    (BASE.replace("two = { replicas = 2 }", "two = { gpu = 'tpu-v9' }"), ["clusters.two", "tpu-v9"]),
    (BASE.replace("two = {", "'two words' = {"), ["clusters.two words", "not a valid label"]),
    (BASE.replace("seeds = [3]", "seeds = [3, 3]"), ["seeds", "seeds repeat"]),
    (BASE.replace("seeds = [3]", "seeds = [3]\nrepeats = 2"), ["repeats", "not both"]),
    (BASE.replace("requests = 150", "requests = 150, duration_s = 5"), ["workloads.chat", "not both"]),
    (BASE.replace(CHAT, "nowhere.toml"), ["workloads.chat.spec", "no such workload spec", "nowhere.toml"]),
    (BASE.replace('slo = "ttft=400ms,tpot=50ms"', 'slo = "ttft=fast"'), ["slo", "cannot parse"]),
    (BASE + "\n[capacity]\nrate = [5, 1]\n", ["capacity.rate", "low < high"]),
    (BASE.replace('slo = "ttft=400ms,tpot=50ms"\n', "") + "\n[capacity]\nrate = [1, 5]\n",
     ["slo", "needs an SLO"]),
    (BASE + "\n[capacity]\nrate = [1, 5]\nreference = 'p3c'\n", ["capacity.reference", "p3c"]),
    ("knee_metrc = 'e2e.p99'\n" + BASE, ["knee_metrc", "unknown field"]),
    (BASE.replace('p2c = { policy = "power_of_d", args = { d = 2 } }',
                  'p2c = { policy = "power_of_d", clusters = ["four"] }'), ["policies.p2c.clusters", "'four'"]),
    ("attainment = 1.5\n" + BASE, ["attainment", "must be < 1"]),
    ("name = 1\n", ["name", "expected a string"]),
    ("not toml [", ["not valid TOML"]),
])
def test_bad_sweep_files_are_one_line_errors_naming_file_and_field(tmp_path, capsys, text, fragments):
    sweep = _write(tmp_path, text, "bad.toml")
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(sweep), "-r", str(tmp_path / "results")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    for f in ["bad.toml", *fragments]:
        assert f in lines[0], lines[0]
    assert not (tmp_path / "results").exists()  # nothing written


def test_missing_sweep_file_and_executor_errors(tmp_path, capsys):
    for args, fragment in ([["sweep", str(tmp_path / "none.toml")], "no such file"],
                           [["sweep", str(_write(tmp_path, SMALL)), "--executor", "slurm"], "unknown executor"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2 and fragment in capsys.readouterr().err


def test_example_sweeps_parse():
    files = sorted((REPO / "sweeps").glob("*.toml"))
    assert files, "sweeps/ holds the example sweeps"
    for f in files:
        spec = load_sweep(f)
        assert spec.pairs()
