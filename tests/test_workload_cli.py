"""``llmlb gen`` end to end through the real entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.schema import read_trace, trace_spec

CHAT = Path(__file__).resolve().parents[1] / "workloads" / "chat.toml"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def cli_ok(args, capsys):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr()
    return capsys.readouterr().out


def test_gen_writes_trace_with_overrides(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    text = cli_ok(["gen", str(CHAT), "-o", str(out), "--seed", "4", "--requests", "500", "--rate-scale", "2"], capsys)
    assert "500 requests" in text and len(text.strip().splitlines()) == 1
    table = read_trace(out)
    assert table.num_rows == 500
    spec = trace_spec(table)
    assert spec["seed"] == 4 and spec["requests"] == 500 and spec["rate_scale"] == 2.0
    # the stored spec alone regenerates the same trace
    again = tmp_path / "again.parquet"
    spec_file = tmp_path / "s.toml"
    from llmlb_bench.tomlfile import dumps_toml as dumps

    spec_file.write_text(dumps(spec))
    cli_ok(["gen", str(spec_file), "-o", str(again)], capsys)
    assert again.read_bytes() == out.read_bytes()


def test_gen_duration(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    cli_ok(["gen", str(CHAT), "-o", str(out), "--duration", "10"], capsys)
    assert read_trace(out).column("arrival_s").to_numpy().max() < 10


def test_gen_bad_spec_is_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(CHAT.read_text().replace("rate = 40.0", "rate = -40.0"))
    out = tmp_path / "t.parquet"
    code, _, err = run_cli(["gen", str(bad), "-o", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "tenants.chat.arrival.rate" in err and "bad.toml" in err
    assert not out.exists() and not list(tmp_path.glob(".*tmp"))


def test_gen_help_has_example(capsys):
    out = cli_ok(["gen", "--help"], capsys)
    assert "Example" in out and "llmlb gen workloads/chat.toml" in out
