"""Versioned Arrow schemas for the three files the tool exchanges.

* ``trace``: one row per request to send (generated or imported).
* ``requests``: one row per request that was run (simulated or replayed); the
  same schema for both backends, so every metric works on both.
* ``series``: per-target samples over time (queue, running, KV, power).

Each file carries ``llmlb.kind`` and ``llmlb.schema_version`` in its Parquet
key-value metadata. Readers accept older versions and files written by other
tools that omit optional columns, and refuse newer versions: a newer file may
mean something this code does not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmlb_bench.errors import UserError

if TYPE_CHECKING:      # numpy loads where a table is built by hand (trace_table), not at import
    import numpy as np
    import numpy.typing as npt

#: a row of a table as pyarrow's ``to_pylist`` gives it, keyed by the columns of its spec (REQUESTS,
#: TRACE ...): pyarrow declares no type for the values, so they are ``Any`` here, the one place it is said
ArrowRow: TypeAlias = dict[str, Any]

META_KIND = b"llmlb.kind"
META_VERSION = b"llmlb.schema_version"
META_SPEC = b"llmlb.spec"
META_BLOCK_SIZE = b"llmlb.block_size"

#: One step of a request's token stream: ``count`` tokens, the first at
#: ``start_s`` and each next one ``gap_s`` later. A simulator writes one
#: segment per run of identical decode steps; a replayer writes one per
#: received chunk (``gap_s`` = 0 when a chunk carries several tokens).
TOKEN_SEGMENT = pa.struct(
    [("start_s", pa.float64()), ("gap_s", pa.float64()), ("count", pa.int32())]
)


@dataclass(frozen=True)
class TableSpec:
    """A named, versioned schema with required and optional columns."""

    kind: str
    version: int
    schema: pa.Schema
    required: frozenset[str]
    defaults: Mapping[str, object] = field(default_factory=dict)
    #: optional columns a writer leaves out when every value is null (readers fill them in again),
    #: so files that do not use a newer feature stay byte for byte what they were before it
    sparse: frozenset[str] = frozenset()

    def metadata(self, extra: Mapping[bytes, bytes] | None = None) -> dict[bytes, bytes]:
        """Key-value metadata to embed in a file of this kind."""
        meta = {META_KIND: self.kind.encode(), META_VERSION: str(self.version).encode()}
        if extra:
            meta.update(extra)
        return meta

    def empty(self) -> pa.Table:
        return self.schema.empty_table()

    def conform(self, table: pa.Table, where: str | Path) -> pa.Table:
        """Return ``table`` with exactly this schema's columns, in order.

        Missing optional columns are filled with their default (or null);
        integer and float columns are cast safely where lossless; anything
        else that does not match is a :class:`UserError` naming the column.
        """
        missing = sorted(self.required - set(table.column_names))
        if missing:
            raise UserError(f"missing column {missing[0]!r} (a {self.kind} file needs {sorted(self.required)})", where)
        columns = []
        for f in self.schema:
            if f.name not in table.column_names:
                default = self.defaults.get(f.name)
                columns.append(pa.array([default] * table.num_rows, type=f.type))
                continue
            col = table.column(f.name)
            if not col.type.equals(f.type):
                col = _safe_cast(col, f, where)
            if not f.nullable and col.null_count:
                raise UserError(f"column {f.name!r} has {col.null_count} null values", where)
            columns.append(col)
        return pa.Table.from_arrays(columns, schema=self.schema.with_metadata(table.schema.metadata))


def _family(t: pa.DataType) -> str:
    """Coarse type family; casts are only tried within a family (ints may widen to floats)."""
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    return str(t)


_CASTABLE = {("int", "int"), ("int", "float"), ("float", "float"), ("string", "string"), ("list", "list")}


def _safe_cast(col: pa.ChunkedArray, f: pa.Field, where: str | Path) -> pa.ChunkedArray:
    src, dst = _family(col.type), _family(f.type)
    if src != "null" and (src, dst) not in _CASTABLE:
        raise UserError(f"column {f.name!r} has type {col.type}, expected {f.type}", where)
    try:
        return col.cast(f.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise UserError(f"column {f.name!r} cannot be read as {f.type}: {str(exc).splitlines()[0]}", where) from None


TRACE = TableSpec(
    kind="trace",
    version=1,
    schema=pa.schema(
        [
            pa.field("request_id", pa.int64(), nullable=False),
            pa.field("arrival_s", pa.float64(), nullable=False),
            pa.field("tenant", pa.dictionary(pa.int32(), pa.string())),
            pa.field("session_id", pa.int64()),
            pa.field("turn", pa.int32()),
            pa.field("parent_id", pa.int64()),
            pa.field("after_parent_s", pa.float64()),
            # a join: further requests (ids) this one also waits for; it leaves after_parent_s after
            # the last of its parent and these ends. Readers that do not know it ignore it
            pa.field("wait_ids", pa.list_(pa.int64())),
            pa.field("input_tokens", pa.int32(), nullable=False),
            pa.field("output_tokens", pa.int32(), nullable=False),
            pa.field("prefix_hashes", pa.list_(pa.uint64())),
            pa.field("images", pa.int16()),
            pa.field("image_tokens", pa.int32()),
            pa.field("audio_s", pa.float32()),
            pa.field("priority", pa.int8()),
            pa.field("slo_class", pa.dictionary(pa.int32(), pa.string())),
            pa.field("kind", pa.dictionary(pa.int32(), pa.string())),
            # the LoRA adapter the request names (sent as the OpenAI ``model``); null = the base model
            pa.field("adapter", pa.dictionary(pa.int32(), pa.string())),
            # how many of output_tokens are reasoning, generated before the first answer token
            # (output_tokens = reasoning + answer); null or 0: none (llmlb_bench.workload.reasoning)
            pa.field("reasoning_tokens", pa.int32()),
        ]
    ),
    required=frozenset({"request_id", "arrival_s", "input_tokens", "output_tokens"}),
    defaults={"tenant": "default", "images": 0, "image_tokens": 0, "audio_s": 0.0, "priority": 0,
              "slo_class": "default", "kind": "chat"},
    sparse=frozenset({"adapter", "wait_ids", "reasoning_tokens"}),
)

#: a value of ``requests.status``
Status = Literal["ok", "error", "timeout", "rejected", "not_sent"]
#: Values of ``requests.status``.
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "rejected", "not_sent")

REQUESTS = TableSpec(
    kind="requests",
    version=1,
    schema=pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("request_id", pa.int64(), nullable=False),
            pa.field("tenant", pa.string()),
            pa.field("slo_class", pa.string()),
            # copied from the trace (null outside conversations): conversation-level metrics need no join
            pa.field("session_id", pa.int64()),
            pa.field("turn", pa.int32()),
            pa.field("target", pa.string()),
            pa.field("scheduled_s", pa.float64()),
            pa.field("sent_s", pa.float64()),
            pa.field("first_token_s", pa.float64()),
            pa.field("last_token_s", pa.float64()),
            pa.field("token_times", pa.list_(TOKEN_SEGMENT)),
            pa.field("input_tokens", pa.int32()),
            pa.field("requested_output_tokens", pa.int32()),
            pa.field("output_tokens", pa.int32()),
            pa.field("cached_tokens", pa.int32()),
            pa.field("status", pa.string(), nullable=False),
            pa.field("error", pa.string()),
            pa.field("http_status", pa.int16()),
            pa.field("preemptions", pa.int32()),
            pa.field("prefill_target", pa.string()),
            pa.field("decode_target", pa.string()),
            pa.field("energy_j", pa.float64()),
            # replayer only: the prompt length the server counted (usage.prompt_tokens), which
            # differs from input_tokens by the prompt-text approximation and the chat template
            pa.field("server_input_tokens", pa.int32()),
            # replayer only: true when the server sent no usage and output_tokens counts stream chunks
            pa.field("output_tokens_estimated", pa.bool_()),
            # replayer only: the backend the response named when the endpoint is a router (its
            # decision; see llmlb_bench.backend_header); null when nothing named one
            pa.field("backend", pa.string()),
            # speculative decoding (the simulator's draws): verify steps that drafted for this request,
            # draft tokens proposed, and those the target accepted; null where the pool does not speculate
            pa.field("spec_drafts", pa.int32()),
            pa.field("spec_draft_tokens", pa.int32()),
            pa.field("spec_accepted_tokens", pa.int32()),
            # copied from the trace: the LoRA adapter the request named (null = the base model)
            pa.field("adapter", pa.string()),
            # a cache-aware policy's expected cached prompt tokens on the target it chose (the
            # Router records Policy.predicted_cached); null for policies that predict nothing
            pa.field("predicted_cached_tokens", pa.int32()),
            # of output_tokens, how many were reasoning (simulator: the trace's; replayer: streamed
            # reasoning deltas, or the server's usage); null: the request had none
            pa.field("reasoning_tokens", pa.int32()),
            # when the first answer token came (token reasoning_tokens + 1); null without reasoning
            pa.field("first_answer_s", pa.float64()),
            # the deliveries in token_times (a segment of gap 0 is one, a spaced segment count of them;
            # 0 without token times), written by the store (store/derived.py) so that the report's tokens
            # per delivery reads no token list; null in files written before the column existed
            pa.field("deliveries", pa.int64()),
        ]
    ),
    required=frozenset({"run_id", "request_id", "status"}),
)

SERIES = TableSpec(
    kind="series",
    version=1,
    schema=pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("t_s", pa.float64(), nullable=False),
            pa.field("target", pa.string(), nullable=False),
            pa.field("waiting", pa.int32()),
            pa.field("running", pa.int32()),
            pa.field("kv_blocks_used", pa.int32()),
            pa.field("kv_blocks_total", pa.int32()),
            pa.field("power_w", pa.float32()),
            # preemptions since the target's previous sample (replayer: vLLM's counter); files without it read as null
            pa.field("preemptions", pa.int32()),
            # LoRA adapters loaded into the target's GPU slots since its previous sample (simulator;
            # null where the target serves no adapters)
            pa.field("adapter_loads", pa.int32()),
            # speculative decoding since the target's previous sample (the replayer: deltas of vLLM's
            # vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total); null where not published
            pa.field("spec_drafts", pa.int32()),
            pa.field("spec_draft_tokens", pa.int32()),
            pa.field("spec_accepted_tokens", pa.int32()),
        ]
    ),
    required=frozenset({"run_id", "t_s", "target"}),
)

#: Per request, where the prefix cache's hits went (llmlb_bench.metrics.cache_accounting, written
#: at the end of a run whose trace has prefix hashes; docs/prefix-cache.md). Tokens throughout;
#: offered = granularity + failed + routing + in_flight + eviction + stale + unmeasured + achieved.
CACHE_ACCOUNTING = TableSpec(
    kind="cache_accounting",
    version=1,
    schema=pa.schema(
        [pa.field("run_id", pa.string(), nullable=False), pa.field("request_id", pa.int64(), nullable=False),
         pa.field("holder", pa.string()), pa.field("unit_tokens", pa.int32())]
        + [pa.field(f"{name}_tokens", pa.int64()) for name in (
            "offered", "reachable", "achieved", "granularity", "failed", "routing", "in_flight", "eviction",
            "stale", "unmeasured", "beyond")]
    ),
    required=frozenset({"run_id", "request_id"}),
)

#: The token times of a run's requests in the id ranges of the report's default block sample, kept apart
#: by the store as the run is written (llmlb_bench.store.token_sample), so that the report reads the
#: sample's lists alone: the same values as the requests' own ``token_times``.
TOKEN_SAMPLE = TableSpec(
    kind="token_sample",
    version=1,
    schema=pa.schema([pa.field("run_id", pa.string(), nullable=False),
                      pa.field("request_id", pa.int64(), nullable=False),
                      pa.field("token_times", pa.list_(TOKEN_SEGMENT))]),
    required=frozenset({"run_id", "request_id"}),
)

SPECS = {s.kind: s for s in (TRACE, REQUESTS, SERIES, CACHE_ACCOUNTING, TOKEN_SAMPLE)}


#: what pyarrow raises on a damaged or crafted file (a footer that decodes as a type it does not
#: implement, e.g. an integer wider than 64 bits, is ArrowNotImplementedError, not ArrowInvalid)
_UNREADABLE = (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError)


def what_file(path: Path) -> str | None:
    """What ``path`` is when it is something this tool makes or reads (a run folder, a workload spec
    or another TOML file of :data:`llmlb_bench.tomlfile.KINDS`, a trace or another Parquet file of
    :data:`SPECS`), so that a file given in the wrong place is named as what it is."""
    from llmlb_bench.tomlfile import kind_of, read_toml

    if path.is_dir():
        return "run folder" if (path / "run.json").is_file() else None
    try:
        if path.suffix == ".toml":
            return kind_of(read_toml(path))
        kind = (pq.read_schema(path).metadata or {}).get(META_KIND, b"").decode()
    except (*_UNREADABLE, ValueError, UserError):  # unreadable, not text, not TOML: nothing to name
        return None
    return f"{kind} Parquet file" if kind in SPECS else None


def open_parquet(path: str | Path, spec: TableSpec) -> pq.ParquetFile:
    """Open ``path`` as a Parquet file of kind ``spec``, or raise a one-line UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError("no such file", path)
    expected = f"{spec.kind} Parquet file"
    if path.is_dir():
        other = what_file(path)
        raise UserError(f"this is a {other}, not a {expected}" if other else f"is a directory, expected a {expected}",
                        path)
    try:
        pf = pq.ParquetFile(path)
    except _UNREADABLE as exc:
        other = what_file(path)
        if other is not None:
            raise UserError(f"this is a {other}, not a {expected}", path) from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"not a readable Parquet file ({reason})", path) from None
    meta = pf.schema_arrow.metadata or {}
    kind = meta.get(META_KIND, b"").decode() or None
    if kind is not None and kind != spec.kind:
        raise UserError(f"is a {kind} file, expected a {spec.kind} file", path)
    version = meta.get(META_VERSION)
    if version is not None:
        try:
            v = int(version)
        except ValueError:
            raise UserError(f"bad schema version {version!r}", path) from None
        if v > spec.version:
            raise UserError(
                f"{spec.kind} schema version {v} is newer than this llmlb supports ({spec.version}); upgrade llmlb",
                path,
            )
    return pf


def read_table(path: str | Path, spec: TableSpec) -> pa.Table:
    """Read and validate a whole file of kind ``spec``."""
    pf = open_parquet(path, spec)
    try:
        table = pf.read()
    except _UNREADABLE as exc:
        raise UserError(f"unreadable Parquet data ({str(exc).splitlines()[0]})", path) from None
    return spec.conform(table, path)


def read_trace(path: str | Path) -> pa.Table:
    """Read a trace file; the table keeps its metadata (spec, block size)."""
    table = read_table(path, TRACE)
    ids = table.column("request_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        raise UserError("column 'request_id' has duplicate values", path)
    if table.num_rows and pc.min(table.column("arrival_s")).as_py() < 0:
        raise UserError("column 'arrival_s' has negative values", path)
    return table


def trace_table(arrival: Sequence[float] | np.ndarray, input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike,
                where: str = "trace", **extra: object) -> pa.Table:
    """A TRACE table from columns (request ids 0..n-1; scalar lengths broadcast), for code
    that builds small traces by hand: tests, reproductions, benchmarks."""
    import numpy as np

    n = len(arrival)
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": np.asarray(arrival, dtype=np.float64),
        "input_tokens": np.broadcast_to(np.asarray(input_tokens, dtype=np.int32), (n,)).copy(),
        "output_tokens": np.broadcast_to(np.asarray(output_tokens, dtype=np.int32), (n,)).copy(),
        **extra,
    }
    return TRACE.conform(pa.table(cols), where)


def trace_spec(table: pa.Table) -> dict[str, object] | None:
    """The generating spec stored in a trace's metadata, if any."""
    raw = (table.schema.metadata or {}).get(META_SPEC)
    spec: dict[str, object] | None = json.loads(raw) if raw else None     # written by write_trace: an object
    return spec


def trace_block_size(table: pa.Table, default: int = 16) -> int:
    raw = (table.schema.metadata or {}).get(META_BLOCK_SIZE)
    return int(raw) if raw else default


def write_trace(table: pa.Table, path: str | Path, spec: Mapping[str, object] | None = None,
                block_size: int | None = None) -> None:
    """Write a trace atomically (temp file + rename): never a half-written file."""
    extra: dict[bytes, bytes] = {}
    if spec is not None:
        extra[META_SPEC] = json.dumps(spec, sort_keys=True).encode()
    if block_size is not None:
        extra[META_BLOCK_SIZE] = str(block_size).encode()
    table = TRACE.conform(table, path)
    for name in TRACE.sparse:
        if table.column(name).null_count == table.num_rows:
            table = table.drop_columns([name])
    table = table.replace_schema_metadata(TRACE.metadata(extra))
    write_atomic(table, path)


def write_atomic(table: pa.Table, path: str | Path, row_group_size: int = 1 << 20) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
