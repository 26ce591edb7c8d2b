"""Why requests failed: every request that is not ``ok`` counted by status and normalised reason.

A report that says "failed 4" and leaves the reason to SQL is not read; one
that says "4 rejected: input + output = 8,390-9,912 tokens exceeds the
maximum model length 8192" is acted on. The error texts of one run are
grouped by their **shape**: the text with every number replaced, so that
"input + output = 8390 tokens ..." and "input + output = 9912 tokens ..."
are one reason. A number equal in every request of the group stays as
written (a limit, a port, an HTTP status); one that varies (a request's own
length) becomes the range it spans. Long hexadecimal ids (request ids, trace
ids in a server's message) are written ``<id>``. A request without an error
text counts under "no reason recorded".

SQL (the counts before normalising):
``SELECT run_id, status, error, count(*) FROM requests WHERE status <> 'ok' GROUP BY ALL``.
"""

from __future__ import annotations

import re
from typing import Iterable

import pyarrow as pa

from llmlb_bench.metrics.run_figures import Failure, Reason

#: a number standing alone: not part of a word, a dotted address or a version
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
#: request ids, trace ids, hashes: hexadecimal runs of 16+ characters (dashes allowed, as in UUIDs)
HEX_ID = re.compile(r"\b[0-9a-fA-F][0-9a-fA-F-]{14,}[0-9a-fA-F]\b")
NO_REASON = "no reason recorded"
#: reasons listed per run and status; the rest are counted together
MAX_REASONS = 8


def _shape(text: str) -> tuple[str, list[tuple[float, str]]]:
    """The text with ids masked and numbers replaced by a placeholder, and the numbers in order (value,
    as written)."""
    masked = HEX_ID.sub(lambda m: "<id>" if any(c.isdigit() for c in m.group()) else m.group(), text)
    numbers = [(float(m.group()), m.group()) for m in NUMBER.finditer(masked)]
    return NUMBER.sub("\0", masked), numbers


def _number(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,g}"


def _reason(shape: str, spans: list[tuple[float, float, str]]) -> str:
    """The shape with each number put back: as written where constant, else as its range."""
    parts = shape.split("\0")
    out = [parts[0]]
    for (low, high, text), rest in zip(spans, parts[1:]):
        out.append(text if low == high else f"{_number(low)}-{_number(high)}")
        out.append(rest)
    return "".join(out)


def reasons(rows: Iterable[tuple[str | None, int]]) -> list[Reason]:
    """``(error text, requests)`` pairs of one run and status -> ``[{"reason", "requests"}]``, most first."""
    groups: dict[str, tuple[int, list[tuple[float, float, str]]]] = {}     # shape -> (requests, spans)
    for text, n in rows:
        shape, numbers = _shape(text.strip()) if text and text.strip() else (NO_REASON, [])
        requests, spans = groups.get(shape, (0, [(x, x, w) for x, w in numbers]))
        groups[shape] = (requests + n, [(min(lo, x), max(hi, x), w) for (lo, hi, w), (x, _) in zip(spans, numbers)])
    out: list[Reason] = [{"reason": _reason(shape, spans), "requests": requests}
                         for shape, (requests, spans) in groups.items()]
    return sorted(out, key=lambda r: (-r["requests"], r["reason"]))


def failure_sql() -> str:
    return ("SELECT run_id, status, error, count(*) AS n FROM requests WHERE status <> 'ok' "
            "GROUP BY ALL ORDER BY run_id, status, error NULLS FIRST")


def failures(table: pa.Table) -> dict[str, list[Failure]]:
    """run id -> ``[{"status", "reason", "requests"}]`` (most requests first) from :func:`failure_sql`'s rows;
    beyond :data:`MAX_REASONS` reasons of one status, the rest are one row "N other reasons"."""
    by: dict[tuple[str, str], list[tuple[str | None, int]]] = {}
    for r in table.to_pylist():
        by.setdefault((r["run_id"], r["status"]), []).append((r["error"], int(r["n"])))
    out: dict[str, list[Failure]] = {}
    for (run_id, status), rows in by.items():
        found = reasons(rows)
        if len(found) > MAX_REASONS:
            rest = found[MAX_REASONS - 1:]
            found = found[:MAX_REASONS - 1] + [Reason(reason=f"{len(rest)} other reasons",
                                                       requests=sum(r["requests"] for r in rest))]
        out.setdefault(run_id, []).extend(
            {"status": status, "reason": r["reason"], "requests": r["requests"]} for r in found)
    for listed in out.values():
        listed.sort(key=lambda r: (-r["requests"], r["status"], r["reason"]))
    return out


def sentence(row: Failure) -> str:
    """``2 rejected: input + output = ...``: one reason as a reader sees it."""
    status = row["status"].replace("_", " ")
    return f"{row['requests']:,} {status}: {row['reason']}"
