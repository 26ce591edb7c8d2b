"""The block sample's token times kept apart by the store (store/token_sample.py) read as the requests' own."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa

from llmlb_bench.metrics.sample import blocks, sample_ranges, token_rows
from llmlb_bench.metrics.sql import request_metrics_sql
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.store import RunStore
from llmlb_bench.store.parts import table_files, write_part
from llmlb_bench.store.token_sample import PARQUET_FILE, RUN_JSON_KEY, TOKEN_SAMPLE_FILE, kept_ref, read_kept
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg

N, SAMPLE = 600, 100


def _rows(rng: random.Random) -> list[dict[str, object]]:
    """Requests in a shuffled (finish) order: some failed, some with no or null token times."""
    out = []
    for i in rng.sample(range(N), N):
        status = "ok" if rng.random() < 0.9 else "error"
        t0 = rng.uniform(0, 50)
        if status == "ok" and rng.random() < 0.05:
            segments: list[dict[str, object]] | None = [] if rng.random() < 0.5 else None
        elif status == "ok":
            segments = [seg(t0 + 0.3 + k, rng.choice([0.0, 0.01, 0.02, 0.05]), rng.randint(1, 9)) for k in range(rng.randint(1, 4))]
        else:
            segments = None
        out.append({"request_id": i, "status": status, "scheduled_s": t0, "sent_s": t0, "slo_class": rng.choice(["a", None]),
                    "first_token_s": segments[0]["start_s"] if segments else None,
                    "last_token_s": segments[-1]["start_s"] if segments else None, "token_times": segments,
                    "output_tokens": sum(int(s["count"]) for s in segments) if segments else 0})
    return out


def _write(results: Path, run_id: str, rows: list[dict[str, object]], ranges: list[tuple[int, int]]) -> Path:
    """The rows through the store in batches of 50 (parts of 64 rows: several parts and flushes)."""
    with RunStore(results, config={}, backend="test", run_id=run_id, rows_per_group=64, token_sample=ranges) as run:
        for a in range(0, len(rows), 50):
            batch = rows[a:a + 50]
            run.requests.write({k: pa.array([r[k] for r in batch], type=run.requests.spec.schema.field(k).type)
                                for k in batch[0]})
    return results / run_id


def _catalog(run_dir: Path) -> Catalog:
    cat = Catalog([run_dir])
    cat.con.execute(request_metrics_sql())
    return cat


def test_the_kept_sample_holds_the_requests_token_times_in_its_ranges(tmp_path):
    rows = _rows(random.Random(1))
    ranges = sample_ranges(pa.array(range(N), pa.int64()), SAMPLE)
    assert ranges == blocks(SAMPLE, 0, N - 1) and sample_ranges(pa.array(range(SAMPLE), pa.int64()), SAMPLE) == []
    run = _write(tmp_path, "r", rows, ranges)
    kept = read_kept(run / TOKEN_SAMPLE_FILE, ["run_id", "request_id", "token_times"]).sort_by("request_id")
    inside = sorted((r for r in rows if any(a <= r["request_id"] <= b for a, b in ranges)), key=lambda r: r["request_id"])
    assert kept.column("request_id").to_pylist() == [r["request_id"] for r in inside]
    assert kept.column("token_times").to_pylist() == [r["token_times"] for r in inside]
    assert set(kept.column("run_id").to_pylist()) == {"r"}
    meta = json.loads((run / "run.json").read_text())[RUN_JSON_KEY]
    assert meta == {"file": TOKEN_SAMPLE_FILE, "ranges": [list(r) for r in ranges], "rows": len(inside)}


def test_token_rows_from_the_kept_sample_equal_the_requests_own(tmp_path):
    rows = _rows(random.Random(2))
    run = _write(tmp_path, "r", rows, blocks(SAMPLE, 0, N - 1))
    cat = _catalog(run)
    kept = json.loads((run / "run.json").read_text())[RUN_JSON_KEY]
    ok = sum(r["status"] == "ok" for r in rows)
    from_requests = token_rows(cat, "r", ok, 0, N - 1, SAMPLE)
    assert from_requests.num_rows > 0
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, kept, str(run)).equals(from_requests)
    # another sample size, other blocks: the requests are read (same rows as without the kept file)
    assert token_rows(cat, "r", ok, 0, N - 1, 2 * SAMPLE, kept, str(run)).equals(token_rows(cat, "r", ok, 0, N - 1, 2 * SAMPLE))
    # a row counted that is not there, the kept file damaged or lost: not whole, the requests are read
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, {**kept, "rows": kept["rows"] + 1}, str(run)).equals(from_requests)
    path = run / TOKEN_SAMPLE_FILE
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, kept, str(run)).equals(from_requests)
    path.unlink()
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, kept, str(run)).equals(from_requests)


def test_the_parquet_sample_of_runs_written_before_is_read_as_before(tmp_path):
    """Runs written before the kept sample was an Arrow file kept it as a Parquet part folder
    (``token_sample.parquet``, run.json naming it): read alike, every part; a part lost, the requests."""
    rows = _rows(random.Random(4))
    run = _write(tmp_path, "r", rows, blocks(SAMPLE, 0, N - 1))
    kept = json.loads((run / "run.json").read_text())[RUN_JSON_KEY]
    table = read_kept(run / TOKEN_SAMPLE_FILE, ["run_id", "request_id", "token_times"])
    folder = run / PARQUET_FILE
    folder.mkdir()
    half = table.num_rows // 2
    for i, part in enumerate((table.slice(0, half), table.slice(half))):
        write_part(folder, i, [part], table.schema)
    (run / TOKEN_SAMPLE_FILE).unlink()
    legacy = {**kept, "file": PARQUET_FILE}
    meta = json.loads((run / "run.json").read_text())
    assert kept_ref(meta) == kept
    del meta[RUN_JSON_KEY]
    assert kept_ref({**meta, "token_sample": legacy}) == legacy and kept_ref(meta) is None
    cat = _catalog(run)
    ok = sum(r["status"] == "ok" for r in rows)
    from_requests = token_rows(cat, "r", ok, 0, N - 1, SAMPLE)
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, legacy, str(run)).equals(from_requests)
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, legacy, str(run)).num_rows == from_requests.num_rows > 0
    table_files(folder)[0].unlink()
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, legacy, str(run)).equals(from_requests)
    shutil.rmtree(folder)
    assert token_rows(cat, "r", ok, 0, N - 1, SAMPLE, legacy, str(run)).equals(from_requests)


def test_a_report_is_the_same_with_and_without_the_kept_sample(tmp_path):
    rows = _rows(random.Random(3))
    with_kept = _write(tmp_path / "a", "r", rows, blocks(SAMPLE, 0, N - 1))
    without = _write(tmp_path / "b", "r", rows, [])
    assert (with_kept / TOKEN_SAMPLE_FILE).is_file() and not (without / TOKEN_SAMPLE_FILE).exists()
    slo, opt = Slo.parse("ttft=500ms,tpot=20ms"), Options(token_sample=SAMPLE)
    a, b = summarize(Catalog([with_kept]), slo, opt)[0], summarize(Catalog([without]), slo, opt)[0]
    assert a["pacing"] is not None and a["pacing"]["sampled"] and a["itl"]["n"]
    for key in ("pacing", "itl", "ttft", "e2e", "tpot"):
        assert a[key] == b[key]
