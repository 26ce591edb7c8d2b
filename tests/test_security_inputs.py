"""Bad names and SLOs stop a command before any work, with one line and exit 2 (docs/security.md).

Names that become folders (``--run-id``, ``llmlb capacity --name``) cannot leave ``--results``;
``--slo`` is parsed as the command line is read, so ``run``, ``simulate`` and ``replay`` refuse a
bad one before generating, simulating or replaying anything (nothing appears under --results).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import cli, make_trace
from llmlb_bench.errors import UserError
from llmlb_bench.names import MAX_LEN, check_name, to_name
from llmlb_bench.schema import write_trace
from llmlb_bench.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
BAD_NAMES = ["../x", "/tmp/abs", "x/../../y", ".", "..", ".hidden", "a\\b", "a b", "", "x" * (MAX_LEN + 1),
             "run\x00id", "~root", "résumé"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_names_are_refused(name):
    with pytest.raises(UserError) as e:
        check_name(name, "--run-id")
    assert e.value.where == "--run-id" and "\n" not in e.value.line()


def test_safe_names_and_sanitising():
    for name in ("run-1", "a.b_c", "2026-12-01T10", "x" * MAX_LEN):
        assert check_name(name, "--run-id") == name
    for text in BAD_NAMES:
        check_name(to_name(text), "label")  # whatever a label holds, the run id made from it is safe


def test_the_run_store_itself_refuses_them(tmp_path):
    with pytest.raises(UserError):
        RunStore(tmp_path / "res", config={}, backend="sim", run_id="../escape")
    assert not (tmp_path / "escape").exists()


@pytest.fixture
def trace(tmp_path):
    write_trace(make_trace(n=5), tmp_path / "t.parquet")
    return tmp_path / "t.parquet"


@pytest.mark.parametrize("name", ["../x", "/tmp/abs-llmlb", "x/../../y", ".", ".."])
def test_simulate_and_replay_refuse_a_bad_run_id_before_any_work(name, trace, tmp_path, capsys):
    for cmd in (["simulate", str(trace)], ["replay", str(trace), "-e", "http://127.0.0.1:9"]):
        code, out, err = cli(cmd + ["-r", str(tmp_path / "res"), "--run-id", name], capsys)
        assert code == 2 and err.startswith("error: --run-id:") and err.count("\n") == 1, err
    assert not (tmp_path / "res").exists() and not (tmp_path / "x").exists() and not (tmp_path.parent / "y").exists()


def test_capacity_refuses_a_bad_name(tmp_path, capsys):
    code, _, err = cli(["capacity", str(ROOT / "workloads" / "chat.toml"), "-e", "http://127.0.0.1:9",
                        "--slo", "ttft=1s", "--rate", "1,2", "--name", "../up", "-r", str(tmp_path / "res")], capsys)
    assert code == 2 and err.startswith("error: --name:")
    assert not (tmp_path / "res").exists() and not (tmp_path / "up").exists()


@pytest.mark.parametrize("slo, problem", [("ttft=oops", "cannot parse"), ("", "is empty"), (";", "is empty"),
                                          ("tpot=", "cannot parse"), ("latency=1s", "unknown SLO metric")])
def test_a_bad_slo_stops_run_simulate_and_replay_before_any_work(slo, problem, trace, tmp_path, capsys):
    spec = ROOT / "workloads" / "chat.toml"
    for cmd in (["run", str(spec)], ["simulate", str(trace)],
                ["replay", str(trace), "-e", "http://127.0.0.1:9"]):  # nothing listens there: never reached
        code, _, err = cli(cmd + ["-r", str(tmp_path / "res"), "--slo", slo], capsys)
        assert code == 2 and err.startswith("error: --slo:") and problem in err, (cmd, err)
    assert not (tmp_path / "res").exists()


def test_every_listening_command_binds_loopback_by_default():
    """Servers (serve, route, engines ...) listen on 127.0.0.1 unless --host says otherwise."""
    import typer

    from llmlb_bench.cli.commands import load_all

    load_all()  # commands load lazily: register every one to walk them
    from llmlb_bench.cli.app import app

    def walk(cmd, path):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    hosts = {path: p.default for path, cmd in walk(typer.main.get_command(app), "llmlb")
             for p in getattr(cmd, "params", []) if p.name == "host"}
    assert {"llmlb serve", "llmlb route"} <= set(hosts)
    assert all(default == "127.0.0.1" for default in hosts.values()), hosts
