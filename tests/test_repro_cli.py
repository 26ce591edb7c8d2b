"""``llmlb repro``: list, run one into a reports folder (README + figure, byte-identical on rerun),
and one-line errors for bad invocations."""

from __future__ import annotations

import pytest

from llmlb_bench.cli import main
from llmlb_bench.repro import REPRODUCTIONS

NAME = "sarathi-chunked-prefill"  # the fastest at small scale (under a second)


def test_list_names_every_reproduction(capsys):
    main(["repro", "list"])
    out = capsys.readouterr().out
    for name in REPRODUCTIONS:
        assert name[:12] in out


def test_run_writes_readme_and_figures_identically_twice(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    main(["repro", "run", NAME, "--scale", "small", "--reports", str(first)])
    main(["repro", "run", NAME, "--scale", "small", "--reports", str(second)])
    assert "PASS" in capsys.readouterr().out
    files = sorted(p.name for p in (first / NAME).iterdir())
    assert files == ["README.md", "itl_p99.png", "itl_p99.svg", "verdict.json"]
    assert (first / "README.md").read_bytes() == (second / "README.md").read_bytes()
    assert f"]({NAME}/README.md) |" in (first / "README.md").read_text()
    for name in files:
        assert (first / NAME / name).read_bytes() == (second / NAME / name).read_bytes(), name
    text = (first / NAME / "README.md").read_text()
    assert "**Verdict: PASS**" in text and "| whole prefill | round_robin / fcfs |" in text
    assert "![ITL p99 (s)](itl_p99.svg)" in text
    assert str(tmp_path) not in text


@pytest.mark.parametrize("argv, fragment", [
    (["repro", "run", "no-such-paper"], "unknown reproduction 'no-such-paper'"),
    (["repro", "run"], "give one reproduction NAME or --all"),
    (["repro", "run", NAME, "--all"], "give one reproduction NAME or --all"),
    (["repro", "run", NAME, "--scale", "huge"], "unknown scale 'huge'"),
])
def test_bad_invocations_are_one_line_errors(argv, fragment, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv + ["--reports", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert fragment in err and "Traceback" not in err
    assert not any(tmp_path.iterdir()), "nothing written"


def test_a_failed_check_still_writes_its_report_and_exits_1(tmp_path, monkeypatch, capsys):
    import dataclasses

    from llmlb_bench.repro import Verdict

    failing = dataclasses.replace(REPRODUCTIONS[NAME], check=lambda s: Verdict(False, "forced failure"))
    monkeypatch.setitem(REPRODUCTIONS, NAME, failing)
    with pytest.raises(SystemExit) as info:
        main(["repro", "run", NAME, "--scale", "small", "--reports", str(tmp_path)])
    assert info.value.code == 1
    assert "FAIL" in capsys.readouterr().out
    assert "**Verdict: FAIL** — forced failure" in (tmp_path / NAME / "README.md").read_text()
