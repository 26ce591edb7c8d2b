"""A run's table on disk: a folder of complete Parquet part files.

``requests.parquet`` and ``series.parquet`` of a run are folders (the layout
Spark and Arrow datasets use for one table in several files). Every flush of a
sink writes one small, complete Parquet file ``part-NNNNN.parquet`` through a
temporary name, fsync and rename, so a process killed at any instant (SIGKILL,
the OOM killer, power loss) leaves only whole part files: everything flushed
before the kill can be read, and nothing half-written is ever seen.

Every reader goes through :func:`table_files` or :func:`read_parts`, which
also accept the single-file layout of runs written before part folders (and
foreign files). ``pyarrow.parquet.read_table(folder)`` reads a part folder
too (files starting with ``.`` are ignored, as temporary files are named).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.schema import TableSpec, read_table

PART_PREFIX = "part-"


def part_name(index: int) -> str:
    return f"{PART_PREFIX}{index:05d}.parquet"


def _aside(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}.{what}")


def table_files(path: str | Path) -> list[Path]:
    """The Parquet files that hold the table at ``path``, in order: the file itself (the
    single-file layout), or a part folder's parts; ``[]`` when there is nothing."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        old = _aside(path, "old")  # killed between the two renames of replace_table
        return table_files(old) if old.is_dir() else []
    return sorted(p for p in path.iterdir() if p.name.startswith(PART_PREFIX) and p.name.endswith(".parquet"))


def read_parts(path: str | Path, spec: TableSpec) -> pa.Table:
    """The whole table at ``path`` (every part, validated as ``spec``); empty when there is none."""
    tables = [read_table(f, spec) for f in table_files(path)]
    if not tables:
        return spec.empty()
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(folder: Path, index: int, tables: Iterable[pa.Table], schema: pa.Schema, *,
               row_group_size: int = 1 << 20, **options: object) -> Path:
    """Write ``tables`` as the complete part file ``index`` of ``folder``: temporary name,
    fsync, rename, fsync of the folder. ``options`` go to :class:`pyarrow.parquet.ParquetWriter`."""
    final = folder / part_name(index)
    tmp = folder / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            with pq.ParquetWriter(f, schema, **options) as writer:
                for table in tables:
                    writer.write_table(table, row_group_size=row_group_size)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(folder)
    return final


def replace_table(path: str | Path, tables: Iterable[pa.Table], schema: pa.Schema, *,
                  row_group_size: int = 1 << 20, **options: object) -> None:
    """Replace the table at ``path`` with ``tables`` as one part (compaction, a rewritten column).

    The new folder is written whole beside the old one and swapped in by two renames; a reader
    that finds neither name (killed between them) reads the old folder (:func:`table_files`)."""
    path = Path(path)
    new, old = _aside(path, "new"), _aside(path, "old")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    write_part(new, 0, tables, schema, row_group_size=row_group_size, **options)
    shutil.rmtree(old, ignore_errors=True)
    if path.is_dir():
        path.rename(old)
    elif path.exists():
        path.unlink()  # the single-file layout: the new table has been written whole first
    new.rename(path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
