"""Every user error is one line on stderr, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmlb_bench.cli import main
from llmlb_bench.store import RunStore


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture
def results(tmp_path):
    with RunStore(tmp_path, config={}, backend="test", run_id="one") as run:
        run.requests.write({"request_id": [1], "status": ["ok"], "sent_s": [0.0], "first_token_s": [0.1],
                            "last_token_s": [0.2], "output_tokens": [2], "scheduled_s": [0.0]})
    return tmp_path


@pytest.mark.parametrize("sql, fragment", [
    ("delete from requests", "only read-only queries"),
    ("copy (select 1) to 'x.csv'", "only read-only queries"),
    ("select 1; select 2", "expected one SQL statement"),
    ("select nope from requests", "nope"),
    ("selec 1", "SQL does not parse"),
])
def test_query_errors(results, capsys, sql, fragment):
    code, _, err = run_cli(["query", sql, "--results", str(results)], capsys)
    assert_one_line_error(code, err, fragment)


def test_query_answers_and_formats(results, capsys):
    code = 0
    try:
        main(["query", "select count(*) as n from requests", "--results", str(results), "--format", "json"])
    except SystemExit as e:
        code = e.code
    out, _ = capsys.readouterr()
    assert code in (0, None) and out.strip() == '[{"n": 1}]'
    main(["query", "select request_id, token_times from requests", "--results", str(results), "--format", "csv"])
    out, _ = capsys.readouterr()
    assert out.splitlines()[0] == '"request_id","token_times"'


def test_query_missing_results_dir(tmp_path, capsys):
    code, _, err = run_cli(["query", "select 1", "--results", str(tmp_path / "none")], capsys)
    assert_one_line_error(code, err, "no such results directory")


def test_report_on_empty_dir(tmp_path, capsys):
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "no runs with request rows")


def test_report_bad_slo(results, capsys):
    code, _, err = run_cli(["report", str(results), "--slo", "ttft=fast"], capsys)
    assert_one_line_error(code, err, "--slo", "cannot parse")


def test_report_json(results, capsys):
    main(["report", str(results), "--format", "json", "--slo", "ttft=150ms"])
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"][0]["slo"]["attainment"] == 1.0


def test_corrupt_run_json(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{not json")
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "run.json", "unreadable")


def test_real_entry_point_reports_bad_trace_in_one_line(tmp_path):
    """Through a real process: ``python -m llmlb_bench`` on a file that is not Parquet."""
    bad = tmp_path / "trace.parquet"
    bad.write_text("hello")
    proc = subprocess.run([sys.executable, "-m", "llmlb_bench", "simulate", str(bad), "--results", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc.returncode, proc.stderr, str(bad), "not a readable Parquet file")
    assert not (tmp_path / "res").exists()


def test_help_of_every_command_has_an_example(capsys):
    from llmlb_bench.cli.app import app
    from llmlb_bench.cli.commands import load_all

    load_all()  # commands load lazily: register every one to walk them

    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"query", "report", "simulate", "run", "policies"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"]) or sys.exit(0)
        assert info.value.code in (0, None)
        out = capsys.readouterr().out
        assert "Example" in out, name


@pytest.mark.parametrize("args, fragment", [
    (["report", "--bogus"], "No such option: --bogus"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
    (["simulate"], "Missing argument 'trace'"),
    (["simulate", "t.parquet", "--replicas", "0"], "Invalid value for '--replicas'"),
])
def test_usage_errors_are_one_line(args, fragment, capsys):
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, fragment, "llmlb")


def test_routers_install_names_the_argument_and_installs_nothing(tmp_path, monkeypatch, capsys):
    """A misspelt router among good ones is refused before the first (slow) install starts."""
    monkeypatch.setenv("LLMLB_CACHE_DIR", str(tmp_path))
    code, _, err = run_cli(["routers", "install", "smg", "vllm-routr"], capsys)
    assert_one_line_error(code, err, "NAMES", "unknown router 'vllm-routr'")
    assert not (tmp_path / "routers").exists()
