"""The one baseline rule of ``llmlb run``, ``report`` (and so every command that ends with a report).

Runs are compared within groups of one workload (:mod:`llmlb_bench.metrics.comparable`).
The baseline of a group is the run of the group named with ``--baseline``
(its run id, name, label, policy or folder; a name that matches several
runs of one group is an error listing them; a group where it matches none
is not compared), else the run **created first** (run.json ``created_utc``,
to the microsecond; equal times keep the order the runs were found in). So
``--baseline least_outstanding`` over chat and agent runs compares each
workload's runs with its own least_outstanding run. ``llmlb run -p A -p B`` simulates A first, so A is the baseline of
its own report and of ``llmlb report`` over the same folder alike, whatever
the folders' names sort as. ``llmlb gate`` names its baseline (the BASELINE
argument) and a sweep its reference policy (``capacity.reference``, default
the first policy given), so neither picks one. docs/metrics.md, "Verdicts".
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Mapping, Sequence, TypeVar

from llmlb_bench.errors import UserError

FLAG = "--baseline"
#: a run summary (metrics.run_figures.RunFigures, or a run.json row): the rule reads only its names and time
R = TypeVar("R", bound=Mapping[str, object])


def created(s: Mapping[str, object]) -> dt.datetime:
    """When the run was created (the latest possible time when its run.json does not say)."""
    raw = s.get("created_utc")
    try:
        t = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def first_created(runs: Sequence[R]) -> R:
    """The run created first; the earliest found among equal times."""
    return min(enumerate(runs), key=lambda ir: (created(ir[1]), ir[0]))[1]


def _matches(s: Mapping[str, object], name: str) -> bool:
    return name in (s["run_id"], s.get("name"), s.get("label"), s.get("policy")) or Path(name).name == s["run_id"]


def named(runs: Sequence[R], name: str) -> R:
    """The one run ``name`` designates; a one-line error when none or several do."""
    found = [s for s in runs if _matches(s, name)]
    if len(found) == 1:
        return found[0]
    exact = [s for s in found if s["run_id"] == name]   # a run id is unambiguous even where it is another's label
    if len(exact) == 1:
        return exact[0]
    if not found:
        raise UserError(f"no run {name!r} in this report (runs: {', '.join(str(s['run_id']) for s in runs)})", FLAG)
    raise UserError(f"{name!r} matches {len(found)} runs ({', '.join(str(s['run_id']) for s in found)}); "
                    "name one by its run id", FLAG)


def pick_baseline(group: Sequence[R], name: str | None) -> R | None:
    """The baseline of one group of comparable runs (run summaries with ``run_id``, ``name``, ``label``,
    ``policy`` and ``created_utc``): the run ``name`` designates (None when it designates none of them),
    else the one created first."""
    if name is None:
        return first_created(group)
    return named(group, name) if any(_matches(s, name) for s in group) else None
