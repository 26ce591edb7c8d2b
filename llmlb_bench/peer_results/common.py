"""What every peer-tool importer shares: the parsed run, field checks, and writing it to the store.

An importer turns a tool's result file into :class:`ImportedRun` objects
(one per benchmark in the file): request rows in the REQUESTS schema, the
tool's own settings and headline figures, and how its clock works. Storing
them goes through the ordinary :class:`~llmlb_bench.store.RunStore`, so an
imported run is a run like any other: ``llmlb report`` and ``llmlb query``
see it next to simulated and replayed runs, with ``backend`` = the tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, TypedDict, TypeVar, overload

from llmlb_bench.errors import UserError
from llmlb_bench.names import to_name

#: ``clock`` values: "shared" when every request's times are on one timeline
#: (send times known); "per_request" when the tool kept only durations, so
#: each request starts at 0 and the run's duration is the one the tool measured.
CLOCKS = ("shared", "per_request")


@dataclass
class ImportedRun:
    """One benchmark of a peer tool's file, ready to store."""

    name: str                              # becomes part of the run id
    rows: dict[str, list[object]]          # REQUESTS columns
    settings: dict[str, object] = field(default_factory=dict)   # the tool's own settings, kept in config
    reported: dict[str, object] = field(default_factory=dict)   # the tool's own headline figures, kept in summary
    offered_rate: float | None = None
    clock: str = "shared"
    duration_s: float | None = None        # the tool's measured duration (used with clock "per_request")
    notes: list[str] = field(default_factory=list)


_T = TypeVar("_T")


@overload
def field_of(obj: object, key: str, where: str) -> object: ...
@overload
def field_of(obj: object, key: str, where: str, kind: type[_T]) -> _T: ...
@overload
def field_of(obj: object, key: str, where: str, kind: type[_T], required: bool) -> _T | None: ...


def field_of(obj: object, key: str, where: str, kind: type = object, required: bool = True) -> object:
    """``obj[key]`` checked to be of ``kind`` (``float``: any number); a one-line UserError naming the
    field otherwise; None for an absent or null field that is not ``required``."""
    if not isinstance(obj, Mapping):
        raise UserError(f"expected an object at {where}", where)
    if key not in obj or obj[key] is None:
        if required:
            raise UserError(f"missing field {key!r}", where)
        return None
    value = obj[key]
    numeric = kind is float
    kinds: type | tuple[type, ...] = (int, float) if numeric else kind
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool)):
        raise UserError(f"field {key!r} has type {type(value).__name__}, expected {_kind_name(kinds)}", where)
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = [k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,))]
    return {"int, float": "a number", "list": "a list", "dict": "an object", "str": "a string"}.get(
        ", ".join(names), " or ".join(names))


class Segment(TypedDict):
    """A run of token arrivals as requests.parquet's ``token_times`` holds it."""

    start_s: float
    gap_s: float
    count: int


def chunk_segments(first: float, gaps: Sequence[float]) -> list[Segment]:
    """Token-time segments of a stream seen as chunks: one per chunk (count 1), as the replayer writes them.

    The peer tools record one time per received chunk, not per token, so a
    chunk carrying several tokens stays one arrival and ITL counts chunk gaps,
    exactly as vLLM and AIPerf compute theirs.
    """
    out: list[Segment] = [{"start_s": first, "gap_s": 0.0, "count": 1}]
    t = first
    for g in gaps:
        t += g
        out.append({"start_s": t, "gap_s": 0.0, "count": 1})
    return out


def run_id_for(run: ImportedRun, tool: str, source: Path) -> str:
    return to_name(f"{tool}-{source.stem}" + (f"-{run.name}" if run.name else ""))


def store(run: ImportedRun, tool: str, source: Path, results: Path, label: str | None = None) -> Path:
    """Write one imported run; refuses to overwrite an existing run folder."""
    # the store (pyarrow) loads here, not at import: `llmlb import-results --help` lists the parsers
    from llmlb_bench.store import RunStore
    from llmlb_bench.store.run import file_sha256

    run_id = run_id_for(run, tool, source)
    if (results / run_id).exists():
        raise UserError(f"run {run_id} already exists (imported before?)", results / run_id)
    config: dict[str, object] = {"source": {"tool": tool, "file": str(source), "sha256": file_sha256(source)},
                                 tool: run.settings}
    if run.offered_rate is not None:
        config["offered_rate"] = run.offered_rate
    with RunStore(results, config=config, backend=tool, label=label or run_id, run_id=run_id) as st:
        st.requests.write(run.rows)
        st.summary["import"] = {"tool": tool, "clock": run.clock, "duration_s": run.duration_s,
                                "reported": run.reported, "notes": run.notes}
    return results / run_id
