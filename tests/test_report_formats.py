"""``llmlb report`` in every format, on hand-built runs: terminal, Markdown, JSON, HTML and figure files."""

from __future__ import annotations

import json
import re
import sys

import pytest
from rich.console import Console

from llmlb_bench.cli import main
from llmlb_bench.report import terminal
from llmlb_bench.report.document import ReportOptions, build
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg, store_run
from shape_check import mismatches


def run_cli(args, capsys):
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr().err
    return capsys.readouterr()


def fail_cli(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def two_tenant_run(results, run_id, slow, config=None):
    """Six requests of tenants a and b (classes chat and batch), one second apart; ``slow`` stretches b."""
    n = 6
    sent = [float(i) for i in range(n)]
    tenant = ["a", "b"] * 3
    ttft = [0.1 if t == "a" else 0.1 * slow for t in tenant]
    first = [s + f for s, f in zip(sent, ttft)]
    return store_run(results, run_id, {
        "request_id": list(range(n)), "tenant": tenant, "slo_class": ["chat", "batch"] * 3,
        "sent_s": sent, "scheduled_s": sent, "first_token_s": first,
        "last_token_s": [f + 0.02 * 9 for f in first],
        "token_times": [[seg(f, 0.02, 10)] for f in first], "input_tokens": [100] * n, "output_tokens": [10] * n,
        "energy_j": [5.0] * n, "status": ["ok"] * n},
        series={"t_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "target": ["r0"] * 6, "waiting": [0, 1, 2, 1, 0, 0],
                "running": [1, 2, 2, 2, 1, 0], "kv_blocks_used": [0, 10, 20, 10, 5, 0],
                "kv_blocks_total": [100] * 6, "power_w": [50.0, 200.0, 250.0, 220.0, 100.0, 60.0]},
        config=config or {}, label=run_id)


@pytest.fixture
def results(tmp_path):
    for i, slow in enumerate((1, 3, 8)):
        two_tenant_run(tmp_path, f"policy{i}", slow, {"offered_rate": float(i + 1), "policy": {"name": "p"}})
    return tmp_path


def test_terminal_report_has_sections_and_group_tables(results, capsys):
    out = run_cli(["report", str(results), "--slo", "ttft=250ms;batch:ttft=500ms"], capsys).out
    for text in ("Comparison", "Per SLO class", "Per tenant", "Load: p", "Details", "Latency (vllm definitions)",
                 "Token pacing", "Fairness across tenants", "Energy and cost", "Serving state", "policy0", "policy2"):
        assert text in out, text


def test_a_group_without_ok_requests_has_no_percentiles_and_the_report_still_renders(tmp_path, capsys):
    """A tenant whose every request failed has no TTFT or E2E percentile (a group's figures leave them
    out): its row says so, where the report failed with a KeyError (the multi-LoRA preset's adapters)."""
    sent = [0.0, 1.0, 2.0, 3.0]
    store_run(tmp_path, "r", {
        "request_id": [0, 1, 2, 3], "tenant": ["a", "b", "a", "b"], "sent_s": sent, "scheduled_s": sent,
        "first_token_s": [0.1, None, 2.1, None], "last_token_s": [0.3, None, 2.3, None],
        "token_times": [[seg(0.1, 0.1, 3)], None, [seg(2.1, 0.1, 3)], None], "input_tokens": [10] * 4,
        "output_tokens": [3, 0, 3, 0], "status": ["ok", "error", "ok", "error"]}, label="r")
    out = run_cli(["report", str(tmp_path), "--slo", "ttft=250ms"], capsys).out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if " req · " in line}
    assert "TTFT p99 100 ms" in rows["a"] and "E2E p99 0.30 s" in rows["a"]
    assert "TTFT p99 - ms" in rows["b"] and "E2E p99 - s" in rows["b"]


def test_terminal_splits_many_runs_into_tables_that_fit(results):
    doc = build(Catalog([results]), ReportOptions(slo=Slo.parse("ttft=250ms")))
    console = Console(width=terminal.FIGURE_WIDTH + 2 * terminal.RUN_WIDTH + 1, record=True, file=sys.stderr)
    terminal.render(doc, console)
    text = console.export_text()
    assert "Details (runs 1-2 of 3)" in text and "Details (runs 3-3 of 3)" in text


def test_markdown_is_a_pr_comment(results, capsys):
    out = run_cli(["report", str(results), "--format", "md", "--slo", "ttft=250ms"], capsys).out
    assert out.startswith("### llmlb report — 3 run(s)")
    assert "| run | requests |" in out and "<details><summary>All figures</summary>" in out
    # every table row has as many cells as its header
    for block in re.findall(r"(\| .+\|\n\|[:\-|]+\|\n(?:\|.*\|\n)+)", out):
        lines = block.strip().splitlines()
        widths = {len(re.split(r"(?<!\\)\|", ln)) for ln in lines}
        assert len(widths) == 1, block


def test_json_is_strict_and_complete(results, capsys):
    out = run_cli(["report", str(results), "--format", "json", "--slo", "ttft=250ms", "--definitions", "guidellm"],
                  capsys).out
    doc = json.loads(out)
    assert doc["options"]["definitions"] == "guidellm" and doc["options"]["slo"] == {"ttft_s": 0.25}
    assert [r["run_id"] for r in doc["runs"]] == ["policy0", "policy1", "policy2"]
    r = doc["runs"][1]
    assert set(r["ttft"]["ci"]) == {"p50", "p90", "p95", "p99", "p99.9"}
    assert r["fairness"]["tenants"] == 2 and r["energy"]["energy_source"] == "series"
    assert r["per_tenant"]["a"]["attainment"] == 1.0 and r["per_tenant"]["b"]["attainment"] == 0.0
    [curve] = doc["curves"]
    assert [p["rate"] for p in curve["points"]] == [1.0, 2.0, 3.0]
    assert "NaN" not in out and "Infinity" not in out
    assert mismatches(doc, ReportDoc, "report") == []   # curves, groups, fairness: the shape report/shape.py declares


def test_json_to_a_file_and_bad_outputs(results, tmp_path, capsys):
    target = tmp_path / "out" / "report.json"
    run_cli(["report", str(results), "--format", "json", "-o", str(target)], capsys)
    assert json.loads(target.read_text())["runs"]
    line = fail_cli(["report", str(results), "--format", "json", "-o", str(tmp_path)], capsys)
    assert "is a directory" in line
    line = fail_cli(["report", str(results), "--slo", "ttft=1s;ttft=2s"], capsys)
    assert "--slo" in line


def test_html_is_self_contained(results, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    page = tmp_path / "report.html"
    run_cli(["report", str(results), "--format", "html", "-o", str(page), "--slo", "ttft=250ms"], capsys)
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    # compare, CDFs, tenants, one load curve, three timelines
    assert text.count("<svg") == 7
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", text), "no external resources"
    assert "<script" not in text
    assert ">Per tenant<" in text and ">Load: p<" in text


def test_figure_files_are_deterministic(results, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        run_cli(["report", str(results), "--figures", str(d), "--format", "json", "-o", str(d / "r.json")], capsys)
    names = sorted(p.name for p in a.iterdir() if p.suffix != ".json")
    assert {n.rsplit(".", 1)[1] for n in names} == {"png", "svg", "pdf"} and len(names) == 7 * 3
    assert "load_p.svg" in names and "timeline_policy0.png" in names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_html_without_matplotlib_has_inline_svg_and_figure_files_say_what_to_install(results, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    page = tmp_path / "r.html"
    run_cli(["report", str(results), "--format", "html", "-o", str(page), "--slo", "ttft=250ms"], capsys)
    text = page.read_text()
    # TTFT and E2E CDFs, the load curve's goodput and E2E p99: drawn by report.svg
    assert text.count("<svg") == 4 and "<script" not in text and ">TTFT CDF<" in text
    line = fail_cli(["report", str(results), "--figures", str(tmp_path / "figs")], capsys)
    assert "pip install 'llmlb-bench[plots]'" in line
    assert not (tmp_path / "figs").exists()
    # the terminal report does not need it
    assert "Comparison" in run_cli(["report", str(results)], capsys).out


def test_the_report_reads_at_80_columns(results):
    """No line wider than the terminal: the comparison and load tables turn to one column per run."""
    doc = build(Catalog([results]), ReportOptions(slo=Slo.parse("ttft=250ms")))
    console = Console(width=80, record=True, file=sys.stderr)
    terminal.render(doc, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    # transposed comparison: figures down the side, every run a column, no header cut into pieces
    assert "│ TTFT p99 ms " in text and "attain %" in text
