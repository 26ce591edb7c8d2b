"""Secrets out of everything the tool stores or prints.

Text from outside (a server's error body, the command line, exception
messages) can carry credentials: a server that rejects a key often echoes it
("Incorrect API key provided: Bearer sk-..."). Every place where such text
reaches storage or a terminal passes it through here: the ``error`` column of
every requests table (:class:`store.ParquetSink`), the whole of ``run.json``
(argv included), and the one-line errors and warnings of the CLI.

Two kinds of rules, both applied everywhere:

- exact values: the API key the replayer sends (:func:`add_secret`), and the
  values of environment variables whose names say they hold a secret
  (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``);
- patterns: ``Authorization:`` header values, ``Bearer``/``Basic`` credentials, OpenAI-style keys
  (``sk-...``), ``api_key=...``-style pairs, passwords in URLs, and the values
  of command-line options named like a secret (``--api-key X``).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:   # Arrow is imported where a column is redacted: every CLI command loads this module
    import pyarrow as pa

MARK = "[redacted]"
#: shorter values are not taken as secrets (redacting "1" everywhere would garble every text)
MIN_SECRET = 8

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: option names whose value is a secret (``--max-tokens`` is a count: plural "tokens" is not one)
_SECRET_OPTION = re.compile(r"--?[A-Za-z0-9_-]*(key|token|secret|password|passwd|credentials?)", re.IGNORECASE)

#: (pattern, replacement); RE2-compatible, so the same rules run in Arrow over whole columns
PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(?i)\b(authorization|proxy-authorization|x-api-key)(\s*:\s*)[^\r\n\"']+", r"\1\2" + MARK),
    (r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{4,}", r"\1\2" + MARK),
    (r"\b(Basic)(\s+)[A-Za-z0-9+/]{8,}={0,2}", r"\1\2" + MARK),
    (r"\bsk-[A-Za-z0-9_-]{6,}", MARK),
    (r"(?i)\b([A-Za-z_-]*(?:api[_-]?key|access[_-]?token|secret|password|passwd))(\\?[\"']?\s*[:=]\s*\\?[\"']?)"
     r"[^\s\"',;&}\\]+", r"\1\2" + MARK),
    (r"(://[^/\s:@]+):[^/\s@]+@", r"\1:" + MARK + "@"),
)
_COMPILED = [(re.compile(p), r.replace("\\1", "\\g<1>").replace("\\2", "\\g<2>")) for p, r in PATTERNS]

_added: set[str] = set()


def add_secret(value: str | None) -> None:
    """Redact this exact value from now on (e.g. the API key the replayer sends)."""
    if value and len(value) >= MIN_SECRET:
        _added.add(value)


def secrets() -> list[str]:
    """The exact values redacted, longest first (so a value containing another goes whole)."""
    found = set(_added)
    for name, value in os.environ.items():
        if _SECRET_ENV.search(name) and len(value) >= MIN_SECRET:
            found.add(value)
    return sorted(found, key=len, reverse=True)


def redact(text: str, values: Sequence[str] | None = None) -> str:
    """``text`` with every secret replaced by ``[redacted]``; ``values``: :func:`secrets`, when the
    caller redacts many strings at once (the environment is read once per document, not per string)."""
    for value in secrets() if values is None else values:
        text = text.replace(value, MARK)
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return text


def redact_array(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A string column with :func:`redact` applied to every value, in Arrow (no Python loop)."""
    import pyarrow.compute as pc

    if values.null_count == len(values):
        return values
    for value in secrets():
        values = pc.replace_substring(values, value, MARK)
    for pattern, replacement in PATTERNS:
        values = pc.replace_substring_regex(values, pattern, replacement)
    return values


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of secret-named options (``--api-key X``, ``--token=X``) and
    any secret inside other arguments (``-H 'Authorization: Bearer X'``) redacted."""
    out: list[str] = []
    values = secrets()
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MARK)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if _SECRET_OPTION.fullmatch(name):
            if eq:
                out.append(f"{name}={MARK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact(arg, values))
    return out


def redact_tree(obj: object, values: Sequence[str] | None = None) -> object:
    """A JSON-like document with every string redacted (keys kept); ``values`` as in :func:`redact`."""
    if values is None:
        values = secrets()
    if isinstance(obj, str):
        return redact(obj, values)
    if isinstance(obj, dict):
        return {k: redact_tree(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_tree(v, values) for v in obj]
    return obj
