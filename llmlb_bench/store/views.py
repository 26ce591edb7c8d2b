"""DuckDB views over every run under a results directory.

``requests`` and ``series`` are views straight over the runs' Parquet files
(DuckDB scans them lazily, so ten million rows cost nothing until queried);
``runs`` is a small table built from each ``run.json``, flattened to the
columns people filter on, with the full document kept as JSON in ``meta``.

A run whose Parquet footer is missing (the process was killed with
SIGKILL before it could close its files) cannot be read; it is listed in
``runs`` with status ``broken`` and left out of the other views.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import duckdb
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.schema import REQUESTS, SERIES, TableSpec, open_parquet
from llmlb_bench.store.run import REQUESTS_FILE, RUN_JSON, SERIES_FILE

RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("label", pa.string()), ("backend", pa.string()),
        ("status", pa.string()), ("reason", pa.string()), ("created_utc", pa.string()),
        ("finished_utc", pa.string()), ("policy", pa.string()), ("seed", pa.int64()),
        ("trace_sha256", pa.string()), ("trace_path", pa.string()), ("requests", pa.int64()),
        ("tool_version", pa.string()), ("dir", pa.string()), ("meta", pa.string()),
    ]
)

#: Statement types ``llmlb query`` accepts: it is a read-only interface.
READ_ONLY = {"SELECT", "EXPLAIN"}


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders named by ``paths``: each is a run folder or a folder of runs (searched recursively)."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise UserError("no such results directory or run", p)
        if (p / RUN_JSON).is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(f.parent for f in p.rglob(RUN_JSON)))
        else:
            raise UserError("not a run folder (no run.json) nor a results directory", p)
    seen: set[Path] = set()
    return [d for d in found if not (d.resolve() in seen or seen.add(d.resolve()))]


def load_run_meta(run_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run_dir / RUN_JSON).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"unreadable run.json ({exc})", run_dir / RUN_JSON) from None
    if not isinstance(meta, dict) or "run_id" not in meta:
        raise UserError("run.json has no 'run_id'", run_dir / RUN_JSON)
    return meta


def _readable(path: Path, spec: TableSpec) -> bool:
    if not path.is_file():
        return False
    try:
        open_parquet(path, spec)
        return True
    except UserError:
        return False


def _runs_row(meta: dict[str, Any], run_dir: Path, broken: bool) -> dict[str, Any]:
    cfg = meta.get("config") or {}
    trace = meta.get("trace") or {}
    policy = cfg.get("policy")
    if isinstance(policy, dict):
        policy = policy.get("name")
    return {
        "run_id": meta["run_id"], "label": meta.get("label"), "backend": meta.get("backend"),
        "status": "broken" if broken else meta.get("status"), "reason": meta.get("reason"),
        "created_utc": meta.get("created_utc"), "finished_utc": meta.get("finished_utc"),
        "policy": policy, "seed": cfg.get("seed"), "trace_sha256": trace.get("sha256"),
        "trace_path": trace.get("path"), "requests": (meta.get("rows") or {}).get("requests"),
        "tool_version": (meta.get("tool") or {}).get("version"), "dir": str(run_dir),
        "meta": json.dumps(meta, sort_keys=True),
    }


class Catalog:
    """An in-memory DuckDB connection with the three views registered."""

    def __init__(self, paths: Iterable[str | Path]) -> None:
        self.run_dirs = find_run_dirs(paths)
        self.con = duckdb.connect(":memory:")
        rows, req_files, ser_files = [], [], []
        for d in self.run_dirs:
            meta = load_run_meta(d)
            req_ok = _readable(d / REQUESTS_FILE, REQUESTS)
            rows.append(_runs_row(meta, d, broken=not req_ok))
            if req_ok:
                req_files.append(str(d / REQUESTS_FILE))
                if _readable(d / SERIES_FILE, SERIES):
                    ser_files.append(str(d / SERIES_FILE))
        self.runs_table = pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)
        self.con.register("_runs", self.runs_table)
        self.con.execute("CREATE VIEW runs AS SELECT * FROM _runs")
        self._parquet_view("requests", req_files, REQUESTS)
        self._parquet_view("series", ser_files, SERIES)

    def _parquet_view(self, name: str, files: list[str], spec: TableSpec) -> None:
        if files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{listing}], union_by_name=true)")
        else:
            self.con.register(f"_{name}_empty", spec.empty())
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")

    def query(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        """Run trusted SQL (the package's own metric queries)."""
        return self.con.sql(sql, params=params).to_arrow_table()

    def query_read_only(self, sql: str) -> pa.Table:
        """Run a user's SQL: only SELECT / EXPLAIN statements, one at a time."""
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise UserError(f"SQL does not parse: {str(exc).splitlines()[0]}", "query") from None
        if len(statements) != 1:
            raise UserError(f"expected one SQL statement, got {len(statements)}", "query")
        kind = statements[0].type.name
        if kind not in READ_ONLY:
            raise UserError(f"only read-only queries (SELECT, EXPLAIN) are allowed, got {kind}", "query")
        try:
            return self.con.sql(sql).to_arrow_table()
        except duckdb.Error as exc:
            raise UserError(str(exc).splitlines()[0], "query") from None
