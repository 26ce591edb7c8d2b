"""DuckDB views over every run under a results directory.

``requests``, ``series`` and ``cache_accounting`` (where each request's prefix-cache hits went,
for runs whose trace has prefix hashes) are views straight over the runs' Parquet files
(DuckDB scans them lazily, so ten million rows cost nothing until queried);
``runs`` is a small table built from each ``run.json``, flattened to the
columns people filter on, with the full document kept as JSON in ``meta``.

Each run's tables are part folders (:mod:`llmlb_bench.store.parts`); a run
killed with SIGKILL keeps its flushed parts and is read like any other. A run
with an unreadable part (a damaged file, or a pre-part-folder file without its
footer) is listed in ``runs`` with status ``broken`` and left out of the others.

User SQL (``llmlb query``) runs on a *confined* catalog: its views read Arrow
datasets opened here, and the DuckDB connection has file-system access off
(``enable_external_access=false``: no file path reaches DuckDB at all, so no
``COPY ... TO``, ``read_text``, ``ATTACH`` or ``EXPORT DATABASE``),
extension install and autoload off, and its configuration locked
(``lock_configuration=true``, set last, after the views exist). What a
statement can do is bounded by the connection, not by reading the SQL.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from llmlb_bench.errors import UserError
from llmlb_bench.schema import CACHE_ACCOUNTING, REQUESTS, SERIES, ArrowRow, TableSpec, open_parquet, what_file
from llmlb_bench.store.parts import table_files
from llmlb_bench.store.run import ACCOUNTING_FILE, REQUESTS_FILE, RUN_JSON, SERIES_FILE, process_gone

RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("label", pa.string()), ("backend", pa.string()),
        ("status", pa.string()), ("reason", pa.string()), ("created_utc", pa.string()),
        ("finished_utc", pa.string()), ("policy", pa.string()), ("seed", pa.int64()),
        ("trace_sha256", pa.string()), ("trace_path", pa.string()), ("requests", pa.int64()),
        ("tool_version", pa.string()), ("dir", pa.string()), ("meta", pa.string()),
    ]
)

#: Statement types ``llmlb query`` accepts (a second fence: the confined connection is the first)
READ_ONLY = {"SELECT", "EXPLAIN SELECT"}

_EXPLAINED = re.compile(r"\s*explain\s+(?:analy[sz]e\s+)?(.*)", re.IGNORECASE | re.DOTALL)

#: DuckDB settings of a confined connection given when it opens; ``enable_external_access`` and
#: ``lock_configuration`` are set after the views exist (registering Arrow data needs neither)
CONFINED_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "allow_community_extensions": False, "allow_unsigned_extensions": False}


#: catalogs of fewer request rows are read by DuckDB on one thread: on a 100k-request run its
#: queries take milliseconds each, and a second thread cost the report ~0.09 CPU-s (some 15%)
#: while the main thread's own CPU stayed the same; the answers are the same on any number of
#: threads (the float sums are exact, docs/metrics.md "Same run, same bytes")
ONE_THREAD_BELOW = 1_000_000


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
            other = what_file(p)
            raise UserError(f"this is a {other}, not a run folder or a results directory" if other else
                            "not a run folder (no run.json) nor a results directory", p)
    seen: set[Path] = set()
    unique = []
    for d in found:
        key = d.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(d)
    return unique


def load_run_meta(run_dir: Path) -> dict[str, object]:
    try:
        meta = json.loads((run_dir / RUN_JSON).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"unreadable run.json ({exc})", run_dir / RUN_JSON) from None
    if not isinstance(meta, dict) or "run_id" not in meta:
        raise UserError("run.json has no 'run_id'", run_dir / RUN_JSON)
    return meta


def _readable(path: Path, spec: TableSpec) -> tuple[list[Path], int, list[pq.FileMetaData]] | None:
    """The part files of the table at ``path`` when every one opens as ``spec`` (none when a run
    was killed before its first flush), their rows and their footers; else None."""
    files = table_files(path)
    try:
        footers = [open_parquet(f, spec).metadata for f in files]
    except UserError:
        return None
    return files, sum(m.num_rows for m in footers), footers


def _holds_no_value(footer: pq.FileMetaData, column: str) -> bool:
    """Whether the footer of a Parquet file shows ``column`` null in every row (or absent); False
    where a row group has no null count to show it."""
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema == column:
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count != group.num_rows:
                    return False
    return True


def _section(meta: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A section of run.json (``config``, ``trace``...), empty where it is absent or null."""
    value = meta.get(key)
    return value if isinstance(value, dict) else {}


def _runs_row(meta: dict[str, object], run_dir: Path, broken: bool) -> dict[str, object]:
    cfg, trace = _section(meta, "config"), _section(meta, "trace")
    policy = cfg.get("policy")
    if isinstance(policy, dict):
        policy = policy.get("name")
    return {
        "run_id": meta["run_id"], "label": meta.get("label"), "backend": meta.get("backend"),
        "status": "broken" if broken else "killed" if process_gone(meta) else meta.get("status"),
        "reason": meta.get("reason"),
        "created_utc": meta.get("created_utc"), "finished_utc": meta.get("finished_utc"),
        "policy": policy, "seed": cfg.get("seed"), "trace_sha256": trace.get("sha256"),
        "trace_path": trace.get("path"), "requests": _section(meta, "rows").get("requests"),
        "tool_version": _section(meta, "tool").get("version"), "dir": str(run_dir),
        "meta": json.dumps(meta, sort_keys=True),
    }


class Catalog:
    """An in-memory DuckDB connection with the views registered.

    ``confined=True`` for SQL a user wrote (see the module docstring); the package's own metric
    queries use the default connection, which reads the Parquet files natively."""

    def __init__(self, paths: Iterable[str | Path], *, confined: bool = False) -> None:
        self.run_dirs = find_run_dirs(paths)
        self.confined = confined
        #: the views no file backs (``requests``, ``series``, ``cache_accounting``): empty, so a metric
        #: needs no query of them to know it has nothing to report
        self.empty: set[str] = set()
        #: each view's files' footers, read once to check them (:meth:`holds_no_value`)
        self._footers: dict[str, list[pq.FileMetaData]] = {"requests": [], "series": [], "cache_accounting": []}
        self.con = duckdb.connect(":memory:", config=CONFINED_CONFIG if confined else {})
        rows: list[dict[str, object]] = []
        req_files: list[str] = []
        ser_files: list[str] = []
        acc_files: list[str] = []
        requests = 0
        for d in self.run_dirs:
            meta = load_run_meta(d)
            req = _readable(d / REQUESTS_FILE, REQUESTS)
            rows.append(_runs_row(meta, d, broken=req is None))
            if req is not None:
                req_files.extend(str(f) for f in req[0])
                requests += req[1]
                self._footers["requests"] += req[2]
                for name, listing, file, spec in (("series", ser_files, SERIES_FILE, SERIES),
                                                  ("cache_accounting", acc_files, ACCOUNTING_FILE, CACHE_ACCOUNTING)):
                    table = _readable(d / file, spec)
                    if table is not None:
                        listing.extend(str(f) for f in table[0])
                        self._footers[name] += table[2]
        if requests < ONE_THREAD_BELOW:
            self.con.execute("SET threads = 1")
        self.runs_table = pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)
        self.con.register("_runs", self.runs_table)
        # meta is the run.json document as JSON (not text), so meta.config.policy.name and meta->>'$.seed' read it
        self.con.execute("CREATE VIEW runs AS SELECT * REPLACE (CAST(meta AS JSON) AS meta) FROM _runs")
        self._parquet_view("requests", req_files, REQUESTS)
        self._parquet_view("series", ser_files, SERIES)
        self._parquet_view("cache_accounting", acc_files, CACHE_ACCOUNTING)
        if confined:
            self.con.execute("SET enable_external_access = false")
            self.con.execute("SET lock_configuration = true")

    def _parquet_view(self, name: str, files: list[str], spec: TableSpec) -> None:
        """A view over ``files`` with at least every column of ``spec``: a column no file has (all runs
        older than it) reads as null, so the metric SQL may name every column of the schema."""
        if files and self.confined:
            # the files are opened here, by Arrow; DuckDB scans the dataset and never sees a path.
            # Columns are united by name as read_parquet(union_by_name) does (older runs lack some)
            schema = pa.unify_schemas([pads.dataset(f, format="parquet").schema for f in files],
                                      promote_options="permissive")
            absent = [f for f in spec.schema if f.name not in schema.names]
            if absent:
                schema = pa.unify_schemas([schema, pa.schema(absent)])
            self.con.register(f"_{name}_data", pads.dataset(files, format="parquet", schema=schema))
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_data")
        elif files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            scan = f"SELECT * FROM read_parquet([{listing}], union_by_name=true)"
            present = {r[0] for r in self.con.sql(f"DESCRIBE {scan}").fetchall()}
            absent = [f for f in spec.schema if f.name not in present]
            if absent:
                self.con.register(f"_{name}_absent", pa.schema(absent).empty_table())
                scan += f" UNION ALL BY NAME SELECT * FROM _{name}_absent"
            self.con.execute(f"CREATE VIEW {name} AS {scan}")
        else:
            self.empty.add(name)
            self.con.register(f"_{name}_empty", spec.empty())
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")

    def holds_no_value(self, view: str, column: str) -> bool:
        """Whether ``column`` is null in every row of ``view``, as its files' footers show without a
        scan (False where a footer has no null count): a metric over that column alone then has
        nothing to report, and skips its query (on a 100k-request run without sessions, the
        conversations' query cost 0.009 CPU-s of the report to find none)."""
        return all(_holds_no_value(f, column) for f in self._footers[view])

    def query(self, sql: str, params: Sequence[object] | None = None) -> pa.Table:
        """Run trusted SQL (the package's own metric queries)."""
        return self.con.sql(sql, params=params).to_arrow_table()

    def rows(self, sql: str) -> list[ArrowRow]:
        """Run trusted SQL whose answer is small and read row by row (a few rows per run): its rows as
        dicts, straight from DuckDB's cursor. ``query`` goes through DuckDB's relation API, which binds a
        statement before it runs it, then through an Arrow table; for a small answer those steps cost
        more than the answer (0.5-2 ms per statement). The values are Python's as Arrow's ``to_pylist``
        gives them, but for an uncast integer sum (HUGEINT), an int here where Arrow gives a Decimal:
        the package's queries cast their sums."""
        cursor = self.con.execute(sql)
        names = [d[0] for d in cursor.description or ()]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def query_batches(self, sql: str, rows_per_batch: int) -> pa.RecordBatchReader:
        """Run trusted SQL and read its result as it comes, ``rows_per_batch`` rows at a time (DuckDB
        never holds the whole result: metrics/columns.py)."""
        rel = self.con.sql(sql)
        # DuckDB 1.4 renamed fetch_arrow_reader (still there, deprecated)
        reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader
        batches: pa.RecordBatchReader = reader(rows_per_batch)
        return batches

    def query_read_only(self, sql: str) -> pa.Table:
        """Run a user's SQL on a confined catalog: one SELECT or EXPLAIN statement."""
        if not self.confined:
            raise RuntimeError("user SQL runs only on a Catalog opened with confined=True")
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise UserError(f"SQL does not parse: {str(exc).splitlines()[0]}", "query") from None
        if len(statements) != 1:
            raise UserError(f"expected one SQL statement, got {len(statements)}", "query")
        kind = statements[0].type.name
        if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs the statement it explains: that must be a SELECT too
            inner = _EXPLAINED.match(statements[0].query)
            kind = "EXPLAIN " + (self._statement_kind(inner.group(1)) if inner else "(unreadable: put comments after it)")
        if kind not in READ_ONLY:
            raise UserError(f"only read-only queries (SELECT, EXPLAIN SELECT) are allowed, got {kind}", "query")
        try:
            return self.con.sql(sql).to_arrow_table()
        except duckdb.Error as exc:
            raise UserError(str(exc).splitlines()[0], "query") from None

    def _statement_kind(self, sql: str) -> str:
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error:
            return "?"
        return statements[0].type.name if len(statements) == 1 else "?"
