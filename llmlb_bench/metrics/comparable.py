"""Which runs may be compared: a verdict or a gate between runs of different workloads is meaningless.

A relative change ("TTFT p99 -81%") says something about two policies, fleets
or builds only when both runs served the same traffic. So every run gets a
**workload identity** from its run.json, and runs are compared only within a
group of equal identities:

* the trace's generating spec (``trace.spec`` in run.json, the spec a trace
  file carries) without its ``seed`` and ``description``: two seeds of one
  spec are repeats of one workload (the gate's "runs" design), two specs are
  two workloads; a trace without a spec (an import, a hand-made file) is
  identified by its SHA-256 instead;
* the load it was set to: a sweep's rate (its traces carry the spec before
  the rate scale) or an offered rate run.json declares, a replay's time
  scale (the same trace replayed twice as fast is another load), and a closed
  loop's users and think time (simulated or replayed: ``--users``).

A run whose run.json names no trace has an empty identity (nothing known)
and is grouped with the other such runs only. The SLO and the metric
definitions must match too; a report and a gate apply one of each to every
run they read, so they can only differ between stored figures (a sweep's
``summary.json``), which the gate checks where it reads them.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence, TypeVar

from llmlb_bench.metrics.identity import facets
from llmlb_bench.metrics.meta import table

T = TypeVar("T")

#: spec fields that do not change the traffic: the seed (repeats) and the prose
IGNORED = ("seed", "description")
#: differing fields named in a message before "and N more"
SHOWN = 4


def workload_identity(meta: Mapping[str, object]) -> dict[str, object]:
    """What two runs must share to be compared (see the module docstring); ``{}`` when nothing is known."""
    trace = table(meta, "trace")
    out: dict[str, object] = {}
    spec = trace.get("spec")
    if isinstance(spec, Mapping):
        out["spec"] = {k: v for k, v in spec.items() if k not in IGNORED}
    elif trace.get("sha256"):
        out["trace file"] = trace["sha256"]
    f = facets(meta)
    for key in ("rate", "time_scale", "closed_loop"):
        if f.get(key) is not None:
            out[key.replace("_", " ")] = f[key]
    return out


def identity_key(meta: Mapping[str, object]) -> str:
    return json.dumps(workload_identity(meta), sort_keys=True, default=str)


def _flat(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def _value(v: object) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,g}"
    if isinstance(v, str):
        return v[:12] if len(v) == 64 else v    # a SHA-256: its first 12 hex digits tell files apart
    return json.dumps(v, sort_keys=True)


def differences(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """The fields two identities differ in, each as ``field A vs B`` (``spec.`` dropped from spec fields).
    Specs of different names are other workloads altogether: their name and top-level fields are named,
    not every tenant's field."""
    fa, fb = _flat(a), _flat(b)
    sa, sb = table(a, "spec"), table(b, "spec")
    if sa.get("name") != sb.get("name"):
        keep = {f"spec.{k}" for k in set(sa) | set(sb) if not isinstance(sa.get(k, sb.get(k)), Mapping)}
        fa = {k: v for k, v in fa.items() if not k.startswith("spec.") or k in keep}
        fb = {k: v for k, v in fb.items() if not k.startswith("spec.") or k in keep}
    out = []
    for key in sorted(set(fa) | set(fb), key=lambda k: (k.startswith("spec."), k)):
        if fa.get(key) != fb.get(key):
            name = key[5:] if key.startswith("spec.") else key
            out.append(f"{name} {_value(fa.get(key))} vs {_value(fb.get(key))}")
    return out


def differences_text(a: Mapping[str, object], b: Mapping[str, object]) -> str:
    """:func:`differences` as one clause, the first :data:`SHOWN` fields named and the rest counted."""
    diff = differences(a, b)
    if not a or not b:
        diff = ["the trace of one is unknown (its run.json names none)"] + diff
    more = f", and {len(diff) - SHOWN} more fields" if len(diff) > SHOWN else ""
    return ", ".join(diff[:SHOWN]) + more


def groups(items: Sequence[T], metas: Sequence[Mapping[str, object]]) -> list[list[T]]:
    """``items`` split by the workload identity of their ``metas`` (same order), groups in order of first
    appearance and items in their order."""
    by: dict[str, list[T]] = {}
    for item, meta in zip(items, metas):
        by.setdefault(identity_key(meta), []).append(item)
    return list(by.values())


def describe(meta: Mapping[str, object]) -> str:
    """A group's workload in a few words: the spec's name and request count, or the trace file's."""
    trace = table(meta, "trace")
    spec = trace.get("spec")
    parts = []
    if isinstance(spec, Mapping):
        parts.append(str(spec.get("name") or "spec"))
    elif trace.get("path"):
        parts.append(str(trace["path"]).replace("\\", "/").rsplit("/", 1)[-1])
    else:
        parts.append("trace unknown")
    rows = trace.get("rows")
    if isinstance(rows, int):
        parts.append(f"{rows:,} requests")
    f = facets(meta)
    parts += [str(f[k]) for k in ("rate", "time_scale") if f.get(k)]
    return ", ".join(parts)


def mixed(metas: Iterable[Mapping[str, object]]) -> bool:
    """True when these runs are of more than one workload."""
    return len({identity_key(m) for m in metas}) > 1
