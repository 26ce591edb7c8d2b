"""Continue a partial replay run (``llmlb replay ... --resume RUN_DIR``).

An interrupted run already has one row per trace request: the finished
ones, ``error``/``interrupted`` for those cut off in flight, and
``not_sent`` for the rest. A killed run (SIGKILL, OOM, power loss) has only
the rows flushed before the kill, in its part files (and its worker
processes' part folders). Resuming keeps the finished rows, sends every
other trace request, and writes the result under the same run id, so the
run ends with exactly one row per trace request again.

The old folder is moved aside (``.<run_id>.resume-backup``) before the new
one is created and removed once the new run is closed; if anything fails
in between, the backup is put back, so the old rows are never lost.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.errors import UserError
from llmlb_bench.schema import REQUESTS
from llmlb_bench.store.parts import read_parts
from llmlb_bench.store.run import REQUESTS_FILE, RUN_JSON, file_sha256

#: ``error`` text of a request that was in flight when the run was interrupted
INTERRUPTED = "interrupted"


@dataclass
class Resume:
    """What a resumed run carries over from the partial one."""

    run_id: str
    results_dir: Path
    carried: pa.Table
    done_ids: set[int]
    backup: Path
    previous: dict[str, object]

    def restore(self) -> None:
        """Put the old folder back (the new run could not be created)."""
        target = self.results_dir / self.run_id
        if self.backup.exists() and not target.exists():
            self.backup.rename(target)

    def discard_backup(self) -> None:
        shutil.rmtree(self.backup, ignore_errors=True)


def _rows_kept(run_dir: Path) -> pa.Table:
    """The run's rows, and those its worker processes had written to their own part folders
    (``.workers/<k>/``) if the run was killed before it merged them; one row per request id."""
    tables = [read_parts(run_dir / REQUESTS_FILE, REQUESTS)]
    tables += [read_parts(d / REQUESTS_FILE, REQUESTS) for d in sorted((run_dir / ".workers").glob("*"))]
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    if len(tables) > 1:  # merged rows and their workers' copies: keep the first of each id
        ids = table.column("request_id").to_numpy()
        _, first = np.unique(ids, return_index=True)
        table = table.take(pa.array(np.sort(first)))
    return table


def prepare_resume(run_dir: str | Path, trace_path: str | Path) -> Resume:
    """Check that ``run_dir`` is a partial replay of ``trace_path``, keep its finished rows,
    and move the folder aside so the run can be written again under the same id."""
    run_dir = Path(run_dir)
    meta_path = run_dir / RUN_JSON
    if not meta_path.is_file():
        raise UserError("not a run folder (no run.json)", run_dir)
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        raise UserError("run.json is not valid JSON", meta_path) from None
    if meta.get("backend") != "replay":
        raise UserError(f"is a {meta.get('backend')!r} run, not a replay", run_dir)
    if meta.get("status") == "complete":
        raise UserError("the run is complete; nothing to resume", run_dir)
    recorded = (meta.get("trace") or {}).get("sha256")
    if recorded and recorded != file_sha256(trace_path):
        raise UserError(f"the run replayed a different trace than {trace_path}", run_dir)
    table = _rows_kept(run_dir)
    status = table.column("status")
    interrupted = pc.fill_null(pc.equal(table.column("error"), INTERRUPTED), False)
    keep = pc.and_(pc.not_equal(status, "not_sent"), pc.invert(interrupted))
    carried = table.filter(keep)
    backup = run_dir.with_name(f".{run_dir.name}.resume-backup")
    if backup.exists():
        raise UserError(f"a backup from an earlier resume is in the way: {backup}", run_dir)
    run_dir.rename(backup)
    return Resume(run_id=run_dir.name, results_dir=run_dir.parent, carried=carried,
                  done_ids=set(carried.column("request_id").to_pylist()), backup=backup,
                  previous={"created_utc": meta.get("created_utc"), "reason": meta.get("reason")})
