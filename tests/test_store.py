"""The streaming sink and the run store: flushed rows survive failures; runs are marked partial."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import textwrap
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from llmlb_bench.schema import REQUESTS
from llmlb_bench.store import ParquetSink, RunStore
from llmlb_bench.store.parts import read_parts, replace_table, table_files
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run


def _rows(start: int, n: int) -> dict:
    return {"request_id": list(range(start, start + n)), "status": ["ok"] * n, "sent_s": [float(i) for i in range(n)]}


def test_sink_flushes_row_groups_by_size(tmp_path):
    sink = ParquetSink(tmp_path / "r.parquet", REQUESTS, rows_per_group=100, flush_s=1e9, constants={"run_id": "x"})
    sink.write(_rows(0, 60))
    assert sink.rows_written == 0  # still buffered
    sink.write(_rows(60, 60))
    assert sink.rows_written == 120
    sink.close()
    assert [f.name for f in table_files(tmp_path / "r.parquet")] == ["part-00000.parquet"]  # one flush, one part
    assert pq.ParquetFile(tmp_path / "r.parquet" / "part-00000.parquet").metadata.num_row_groups == 2
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 120  # a part folder reads as one table
    assert read_parts(tmp_path / "r.parquet", REQUESTS).column("run_id").to_pylist() == ["x"] * 120


def test_sink_flushes_by_time(tmp_path):
    now = [0.0]
    sink = ParquetSink(tmp_path / "r.parquet", REQUESTS, rows_per_group=10**6, flush_s=2.0,
                       constants={"run_id": "x"}, clock=lambda: now[0])
    now[0] = 0.5
    sink.write(_rows(0, 1))
    assert sink.rows_written == 0
    now[0] = 3.0
    sink.write(_rows(1, 1))
    assert sink.rows_written == 2
    sink.close()


def test_run_that_raises_keeps_flushed_rows_and_is_partial(tmp_path):
    with pytest.raises(RuntimeError):
        with RunStore(tmp_path, config={"seed": 1}, backend="sim", label="t", run_id="boom",
                      rows_per_group=10) as run:
            run.requests.write(_rows(0, 25))  # two row groups flushed, 5 rows buffered
            raise RuntimeError("simulated crash")
    meta = json.loads((tmp_path / "boom" / "run.json").read_text())
    assert meta["status"] == "partial"
    assert meta["reason"] == "RuntimeError: simulated crash"
    table = read_parts(tmp_path / "boom" / "requests.parquet", REQUESTS)
    assert table.num_rows == 25  # close() flushed the buffered tail too
    cat = Catalog([tmp_path])
    assert cat.query("select status from runs").column(0).to_pylist() == ["partial"]
    assert cat.query("select count(*) from requests").column(0).to_pylist() == [25]


def test_sigterm_marks_run_partial_in_a_real_process(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, time
        from llmlb_bench.cli.app import _raise_interrupt
        from llmlb_bench.store import RunStore
        signal.signal(signal.SIGTERM, _raise_interrupt)
        with RunStore({str(tmp_path)!r}, config={{}}, backend="sim", run_id="term", rows_per_group=4) as run:
            run.requests.write({{"request_id": list(range(8)), "status": ["ok"] * 8}})
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    meta = json.loads((tmp_path / "term" / "run.json").read_text())
    assert meta["status"] == "partial" and meta["reason"] == "interrupted"
    assert pq.read_table(tmp_path / "term" / "requests.parquet").num_rows == 8


def test_a_ctrl_c_after_the_one_a_replay_caught_is_ignored():
    """A replay catches the first Ctrl-C itself and puts the command line's handler back once it has
    stopped; a second Ctrl-C then must not raise into the cleanup still to come (the partial run's
    last rows, the line saying where it is kept). It did: three Ctrl-Cs 50 ms apart on a loaded
    machine ended a replay with 'interrupted' alone. In a real process with the command line's
    handler, after a replay's handler noted the first signal, the second one is ignored."""
    script = textwrap.dedent("""
        import os, signal, time
        from llmlb_bench import interrupts
        from llmlb_bench.cli.app import _raise_interrupt
        signal.signal(signal.SIGINT, _raise_interrupt)
        interrupts.note(signal.SIGINT)          # what the replay's own handler does with the first
        os.kill(os.getpid(), signal.SIGINT)     # the second, once the handler is back
        time.sleep(0.2)
        print("cleanup went on")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "cleanup went on", proc.stderr


def test_unreadable_run_is_listed_as_broken_not_fatal(tmp_path):
    with RunStore(tmp_path, config={}, backend="sim", run_id="good") as run:
        run.requests.write(_rows(0, 3))
    (tmp_path / "dead").mkdir()
    (tmp_path / "dead" / "run.json").write_text(json.dumps({"run_id": "dead", "status": "running"}))
    (tmp_path / "dead" / "requests.parquet").write_bytes(b"PAR1 no footer")
    cat = Catalog([tmp_path])
    status = dict(cat.query("select run_id, status from runs order by 1").to_pylist()[i].values() for i in range(2))
    assert status == {"dead": "broken", "good": "complete"}
    assert cat.query("select count(*) from requests").column(0).to_pylist() == [3]


def test_many_small_parts_are_compacted_at_close_and_read_the_same(tmp_path):
    now = [0.0]
    sink = ParquetSink(tmp_path / "r.parquet", REQUESTS, flush_s=1.0, constants={"run_id": "x"}, clock=lambda: now[0])
    for i in range(100):  # a slow replay: one part a second
        now[0] += 1.0
        sink.write(_rows(i, 1))
    assert len(table_files(tmp_path / "r.parquet")) == 100
    sink.close()
    assert [f.name for f in table_files(tmp_path / "r.parquet")] == ["part-00000.parquet"]
    assert read_parts(tmp_path / "r.parquet", REQUESTS).column("request_id").to_pylist() == list(range(100))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]  # no .new / .old left


def test_a_table_replaced_is_readable_at_every_step(tmp_path):
    """replace_table swaps folders by two renames; a reader between them reads the old folder."""
    sink = ParquetSink(tmp_path / "r.parquet", REQUESTS, constants={"run_id": "x"})
    sink.write(_rows(0, 3))
    sink.close()
    (tmp_path / "r.parquet").rename(tmp_path / ".r.parquet.old")  # killed between the renames
    assert read_parts(tmp_path / "r.parquet", REQUESTS).num_rows == 3
    (tmp_path / ".r.parquet.old").rename(tmp_path / "r.parquet")
    table = read_parts(tmp_path / "r.parquet", REQUESTS).slice(0, 2)
    replace_table(tmp_path / "r.parquet", [table], table.schema)
    assert read_parts(tmp_path / "r.parquet", REQUESTS).num_rows == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]


def test_a_part_left_half_written_by_a_kill_is_not_read(tmp_path):
    """A SIGKILL during a flush leaves that part's temporary file (a Parquet file without its
    footer): no reader takes it for a part, so the flushed rows before it still read whole."""
    sink = ParquetSink(tmp_path / "r.parquet", REQUESTS, constants={"run_id": "x"})
    sink.write(_rows(0, 3))
    sink.flush()
    whole = table_files(tmp_path / "r.parquet")[0]
    (tmp_path / "r.parquet" / ".part-00001.parquet.tmp").write_bytes(whole.read_bytes()[:-40])
    assert table_files(tmp_path / "r.parquet") == [whole]
    assert read_parts(tmp_path / "r.parquet", REQUESTS).num_rows == 3
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 3
    (tmp_path / "run").mkdir()
    (tmp_path / "r.parquet").rename(tmp_path / "run" / "requests.parquet")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"run_id": "x", "status": "running"}))
    assert Catalog([tmp_path / "run"]).query("select count(*) from requests").column(0).to_pylist() == [3]


def test_a_run_whose_process_is_gone_shows_as_killed(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with RunStore(tmp_path, config={}, backend="replay", run_id="gone") as run:
        run.requests.write(_rows(0, 2))
    meta = json.loads((tmp_path / "gone" / "run.json").read_text())
    meta.update(status="running", pid=int(proc.stdout))  # as a SIGKILL leaves it
    (tmp_path / "gone" / "run.json").write_text(json.dumps(meta))
    assert Catalog([tmp_path]).query("select status from runs").column(0).to_pylist() == ["killed"]
    meta["pid"] = os.getpid()  # still running (this process)
    (tmp_path / "gone" / "run.json").write_text(json.dumps(meta))
    assert Catalog([tmp_path]).query("select status from runs").column(0).to_pylist() == ["running"]


def test_resume_keeps_the_rows_of_a_killed_runs_workers_once(tmp_path):
    from llmlb_bench.replay.resume import prepare_resume
    from llmlb_bench.schema import write_trace

    from conftest import make_trace

    write_trace(make_trace(n=6), tmp_path / "t.parquet")
    with RunStore(tmp_path / "res", config={}, backend="replay", run_id="w", trace_path=tmp_path / "t.parquet"):
        pass
    run_dir = tmp_path / "res" / "w"
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    for k, ids in ((0, [0, 2]), (1, [1, 2])):  # request 2 in both (merged, then killed before cleanup)
        sink = ParquetSink(run_dir / ".workers" / str(k) / "requests.parquet", REQUESTS, constants={"run_id": "w"})
        sink.write({"request_id": ids, "status": ["ok"] * 2})
        sink.flush()  # never closed, as in a killed worker
    res = prepare_resume(run_dir, tmp_path / "t.parquet")
    assert sorted(res.carried.column("request_id").to_pylist()) == [0, 1, 2] and res.done_ids == {0, 1, 2}
    res.restore()


def test_a_column_null_in_every_row_is_known_from_the_footers(tmp_path):
    """``Catalog.holds_no_value`` reads the files' null counts: true where every row is null or the
    column is absent, false where one row has a value or a footer keeps no null count (then only a
    scan could tell, and the metric runs its query)."""
    rows = {"request_id": [0, 1, 2], "sent_s": [0.0, 0.1, 0.2], "status": ["ok"] * 3}
    store_run(tmp_path / "a", "none", {**rows, "session_id": [None] * 3})
    store_run(tmp_path / "b", "one", {**rows, "session_id": [None, 7, None]})
    assert Catalog([tmp_path / "a"]).holds_no_value("requests", "session_id")
    assert Catalog([tmp_path / "a"]).holds_no_value("requests", "no_such_column")
    assert not Catalog([tmp_path / "b"]).holds_no_value("requests", "session_id")
    assert not Catalog([tmp_path]).holds_no_value("requests", "session_id")    # one run of two has one
    [part] = table_files(tmp_path / "a" / "none" / "requests.parquet")
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata(table.schema.metadata), part, write_statistics=False)
    assert not Catalog([tmp_path / "a"]).holds_no_value("requests", "session_id")


def test_small_answers_read_as_rows_are_the_arrow_tables_rows(tmp_path):
    """``Catalog.rows`` gives what ``query(...).to_pylist()`` gives (nulls, NaN, decimals, doubles,
    lists, structs), but for an uncast integer sum: an int where Arrow gives a Decimal."""
    store_run(tmp_path, "r", {"request_id": [0, 1, 2], "sent_s": [0.0, 0.1, 0.25], "status": ["ok", "ok", "error"],
                              "input_tokens": [5, 6, 7]})
    cat = Catalog([tmp_path])
    sql = ("SELECT run_id, status, count(*) AS n, sum(input_tokens)::BIGINT AS tokens, max(sent_s) AS last, "
           "sum(CAST(sent_s AS DECIMAL(38, 18))) AS exact, max(session_id) AS none, 'NaN'::DOUBLE AS nan, "
           "list(request_id ORDER BY request_id) AS ids, {'a': min(request_id)} AS s "
           "FROM requests GROUP BY ALL ORDER BY status")
    rows, table = cat.rows(sql), cat.query(sql).to_pylist()
    assert [r.keys() for r in rows] == [r.keys() for r in table] and len(rows) == 2
    for got, want in zip(rows, table):
        assert math.isnan(got.pop("nan")) and math.isnan(want.pop("nan"))
        assert got == want and all(type(got[k]) is type(want[k]) for k in got)
    [wide] = cat.rows("SELECT sum(input_tokens) AS total FROM requests")
    assert wide == {"total": 18} and cat.query("SELECT sum(input_tokens) AS total FROM requests").to_pylist() == [
        {"total": Decimal(18)}]


def test_run_json_names_the_cpu_and_its_vector_extensions(tmp_path):
    """Two runs' timings compare only on the same kind of CPU: run.json says which ran it."""
    from llmlb_bench.store.run import cpu

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                   "flags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\n"
                   "flags\t\t: avx512f\n")
    assert cpu.__wrapped__(str(x86)) == ("AMD EPYC 7B13", ["avx2"])
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm sve sve2\n")
    assert cpu.__wrapped__(str(arm)) == (platform.processor(), ["asimd", "sve", "sve2"])
    assert cpu.__wrapped__(str(tmp_path / "none"))[1] == []
    with RunStore(tmp_path / "runs", config={}, backend="sim") as run:
        pass
    host = json.loads((run.dir / "run.json").read_text())["host"]
    assert host["cpu"] == cpu()[0] and host["simd"] == cpu()[1]
