"""One run's folder: ``<results>/<run_id>/{requests.parquet, series.parquet, run.json}``.

``run.json`` is written when the run starts (status ``running``) and again
when it ends: ``complete``, or ``partial`` with the reason when the run
raised, was interrupted (Ctrl-C) or terminated (SIGTERM). Both Parquet files
are closed in every case, so whatever was flushed stays readable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Callable, Iterator, Mapping, Sequence, TypedDict

from llmlb_bench import __version__
from llmlb_bench.errors import UserError
from llmlb_bench.names import MAX_LEN, check_name, to_name
from llmlb_bench.redact import redact_argv, redact_tree
from llmlb_bench.redact import secrets as secret_values
from llmlb_bench.run_summary import RunSummary
from llmlb_bench.schema import REQUESTS, SERIES, TRACE
from llmlb_bench.store.sink import ParquetSink
from llmlb_bench.store.token_sample import TokenSampleRef, TokenSampleSink

RUN_JSON = "run.json"
REQUESTS_FILE = "requests.parquet"
SERIES_FILE = "series.parquet"
#: where the prefix cache's hits went, per request (llmlb_bench.metrics.cache_accounting)
ACCOUNTING_FILE = "cache_accounting.parquet"


class HostInfo(TypedDict):
    hostname: str
    platform: str
    python: str
    cpu_count: int | None
    #: the processor's model name and the vector extensions it has (:func:`cpu`): two runs' timings
    #: compare only on the same kind of CPU
    cpu: str
    simd: list[str]


#: the vector extensions ``run.json`` names where the CPU has them (x86 and Arm flag names, as
#: /proc/cpuinfo spells them): what decides the speed of bf16 and int8 kernels. The same VM type came
#: with AVX-512 on one day and AVX2 alone on another, and vLLM CPU's steps on the tiny model were then
#: about ten times apart (docs/fidelity-runs.md)
SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
              "asimd", "sve", "sve2")


class ToolInfo(TypedDict):
    name: str
    version: str


class TraceRef(TypedDict):
    """The trace a run replayed or simulated: where it was, its hash, and the spec it was generated from."""

    path: str
    sha256: str
    rows: int | None
    spec: Mapping[str, object] | None


class _MetaAtEnd(TypedDict, total=False):
    """Written when the run ends (a run killed before that has neither)."""

    rows: dict[str, int]
    summary: RunSummary
    # only where the backend named the sample's ranges (store/token_sample.py): the Arrow file; runs
    # written before it kept a Parquet folder, named under ``token_sample`` (a key older readers know,
    # so that they never meet the Arrow file and read the requests instead)
    token_sample_arrow: TokenSampleRef


class RunMeta(_MetaAtEnd):
    """run.json as this store writes it (:class:`RunStore`); ``config`` is the backend's own settings."""

    run_id: str
    label: str
    backend: str
    status: str
    reason: str | None
    created_utc: str
    finished_utc: str | None
    tool: ToolInfo
    schema_versions: dict[str, int]
    argv: list[str]
    host: HostInfo
    pid: int
    config: dict[str, object]
    trace: TraceRef | None


def new_run_id(label: str = "run") -> str:
    """A sortable, unique run id: ``<label>-<UTC time>-<4 hex>``."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{to_name(label, limit=MAX_LEN - 24)}-{stamp}-{secrets.token_hex(2)}"


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def host_info() -> HostInfo:
    model, simd = cpu()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "cpu": model,
        "simd": simd,
    }


@functools.cache
def cpu(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """The first processor's model name and which of :data:`SIMD_FLAGS` it has, from ``cpuinfo``
    (Linux); elsewhere ``platform.processor()`` and no flags. Read once per process."""
    model, flags = "", set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags = set(value.split())
                    break       # the first processor's block: its flags line ends what is needed
    except OSError:
        pass
    return model or platform.processor(), [f for f in SIMD_FLAGS if f in flags]


def process_gone(meta: Mapping[str, object]) -> bool:
    """A ``running`` run whose process, on this host, no longer exists: it was killed (SIGKILL,
    the OOM killer, a power loss) before it could say ``partial``."""
    pid, host = meta.get("pid"), meta.get("host")
    if meta.get("status") != "running" or not isinstance(pid, int) or not isinstance(host, dict) or \
            host.get("hostname") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: it exists
        return False
    return False


def _now() -> str:
    # to the microsecond: the runs one command makes in a row (``llmlb run -p A -p B``) keep their order,
    # which picks a report's baseline (report/baseline.py)
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so nobody (CI, a resuming run) reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _stored_meta(meta: RunMeta) -> dict[str, object]:
    """run.json as written: every string redacted, the command line option-aware (``--api-key X``)."""
    values = secret_values()
    doc = {k: redact_tree(v, values) for k, v in meta.items()}
    doc["argv"] = redact_argv(meta.get("argv") or [])
    return doc


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back for the block (on the main thread; elsewhere they cannot be
    handled anyway), then raise the KeyboardInterrupt one of them asked for, if any."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    saved = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if caught:
        raise KeyboardInterrupt(f"signal {caught[0]}")


class RunStore:
    """Context manager that owns one run's folder and its two sinks.

    Use::

        with RunStore(results, config=cfg, backend="sim", label="rr") as run:
            run.requests.write({...})
            run.series.write({...})
            run.summary["wall_s"] = ...        # run_summary.RunSummary
    """

    def __init__(self, results_dir: str | Path, *, config: Mapping[str, object], backend: str,
                 label: str = "run", run_id: str | None = None, trace_path: str | Path | None = None,
                 trace_rows: int | None = None, trace_spec: Mapping[str, object] | None = None,
                 rows_per_group: int = 65536, flush_s: float = 1.0,
                 token_sample: Sequence[tuple[int, int]] = ()) -> None:
        self.run_id = check_name(run_id, "--run-id") if run_id is not None else new_run_id(label)
        self.dir = Path(results_dir) / self.run_id
        #: run.json's summary, filled by the backend (its shape: run_summary.py)
        self.summary: RunSummary = {}
        #: called with this store once its Parquet files are closed, before run.json is written
        #: (the replayer fills requests' energy_j from the run's own power series there)
        self.finalizers: list[Callable[["RunStore"], None]] = []
        self._rows_per_group = rows_per_group
        self._flush_s = flush_s
        #: request id ranges (inclusive) whose token times are also kept apart for the report's block sample
        self._token_ranges = list(token_sample)
        self.token_sample: TokenSampleSink | None = None
        self.meta: RunMeta = {
            "run_id": self.run_id,
            "label": label,
            "backend": backend,
            "status": "running",
            "reason": None,
            "created_utc": _now(),
            "finished_utc": None,
            "tool": {"name": "llmlb-bench", "version": __version__},
            "schema_versions": {s.kind: s.version for s in (TRACE, REQUESTS, SERIES)},
            "argv": sys.argv,
            "host": host_info(),
            "pid": os.getpid(),
            "config": dict(config),
            "trace": None,
        }
        if trace_path is not None:
            self.meta["trace"] = {
                "path": str(trace_path),
                "sha256": file_sha256(trace_path),
                "rows": trace_rows,
                "spec": trace_spec,
            }

    def __enter__(self) -> "RunStore":
        if self.dir.exists():
            raise FileExistsError(f"run folder already exists: {self.dir}")
        self._made_results = not self.dir.parent.exists()
        try:
            # a Ctrl-C between run.json and the sinks would leave a run 'running' forever (no __exit__
            # follows a failed __enter__): hold it until both exist, then close the run as interrupted
            with signals_deferred():
                self.dir.mkdir(parents=True)
                write_json_atomic(self.dir / RUN_JSON, _stored_meta(self.meta))
                const = {"run_id": self.run_id}
                if self._token_ranges:
                    self.token_sample = TokenSampleSink(self.dir, self.run_id, self._token_ranges)
                self.requests = ParquetSink(self.dir / REQUESTS_FILE, REQUESTS, constants=const,
                                            rows_per_group=self._rows_per_group, flush_s=self._flush_s,
                                            tee=self.token_sample.take if self.token_sample else None)
                self.series = ParquetSink(self.dir / SERIES_FILE, SERIES, constants=const,
                                          rows_per_group=self._rows_per_group, flush_s=self._flush_s)
        except KeyboardInterrupt as exc:
            if hasattr(self, "series"):
                self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with signals_deferred():  # a second Ctrl-C must not cut the writing of run.json short
            self._finish(exc_type, exc)

    def _finish(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        try:
            self.requests.close()
        finally:
            self.series.close()
        kept = self.token_sample.close() if self.token_sample is not None else None
        if exc_type is not None and issubclass(exc_type, UserError) and self.requests.rows_written == 0 \
                and self.series.rows_written == 0:
            # bad input found once the run had started (e.g. no Ray cluster at --address) and before
            # anything was done: like every refused command, it leaves nothing behind
            shutil.rmtree(self.dir, ignore_errors=True)
            if self._made_results:
                with contextlib.suppress(OSError):
                    self.dir.parent.rmdir()  # only when empty
            return
        for finalize in self.finalizers:
            finalize(self)
        if exc_type is None:
            self.meta["status"] = "complete"
        else:
            self.meta["status"] = "partial"
            if issubclass(exc_type, KeyboardInterrupt):
                self.meta["reason"] = "interrupted"
            else:
                self.meta["reason"] = f"{exc_type.__name__}: {exc}".splitlines()[0]
        self.meta["finished_utc"] = _now()
        self.meta["rows"] = {"requests": self.requests.rows_written, "series": self.series.rows_written}
        self.meta["summary"] = self.summary
        if kept is not None:
            self.meta["token_sample_arrow"] = kept      # token_sample.RUN_JSON_KEY
        write_json_atomic(self.dir / RUN_JSON, _stored_meta(self.meta))
