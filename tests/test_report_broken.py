"""Broken runs are reported loudly (stderr and the report), never dropped in silence; naming one fails."""

from __future__ import annotations

import json

from conftest import cli
from metrics_helpers import store_run, timed_requests
from llmlb_bench.store.parts import table_files


def _good(results, run_id):
    rows = [{"sent_s": float(i), "first_token_s": i + 0.1, "last_token_s": i + 0.5, "output_tokens": 5}
            for i in range(5)]
    return store_run(results, run_id, timed_requests(rows))


def _corrupt(run_dir):
    for f in table_files(run_dir / "requests.parquet"):
        f.write_bytes(b"not parquet at all")


def test_a_corrupt_run_in_a_results_folder_is_named_on_stderr_and_in_the_report(tmp_path, capsys):
    _good(tmp_path, "ok-run")
    _corrupt(_good(tmp_path, "bad-run"))
    code, out, err = cli(["report", str(tmp_path), "--format", "json"], capsys)
    assert code == 0
    assert "warning:" in err and "bad-run" in err and "broken" in err
    doc = json.loads(out)
    assert [r["run_id"] for r in doc["runs"]] == ["ok-run"]
    assert [d["run_id"] for d in doc["left_out"]] == ["bad-run"]
    assert any("bad-run" in n and "left out" in n for n in doc["notes"])
    code, out, _ = cli(["report", str(tmp_path)], capsys)
    assert "bad-run" in out and "left out" in " ".join(out.split())


def test_naming_a_broken_run_exits_non_zero(tmp_path, capsys):
    _good(tmp_path, "ok-run")
    bad = _good(tmp_path, "bad-run")
    _corrupt(bad)
    code, _, err = cli(["report", str(tmp_path / "ok-run"), str(bad)], capsys)
    assert code == 2 and "bad-run" in err.strip().splitlines()[-1]
    code, _, err = cli(["report", str(bad)], capsys)
    assert code == 2 and "broken" in err
