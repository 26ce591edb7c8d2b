"""Property-based fuzzing of every reader of outside input (docs/security.md).

Hypothesis generates inputs around valid ones (the repository's own
workload, cluster and sweep files; real-looking trace rows; SSE streams) and
mutates them: fields dropped, renamed, retyped, given extreme values; bytes
flipped and files cut short. The property is the same everywhere: a reader
either succeeds or raises :class:`UserError` (one line, exit 2) — no other
exception (a traceback), and a failed ``llmlb trace import`` leaves no output file.

Bounded and deterministic (``derandomize=True``: the same examples on every
run, so CI cannot flake); each test tries ``EXAMPLES`` inputs and checks it did.
No per-example deadline: Hypothesis judges one only after the example returns (a
hang is never caught by it), and a fixed one fails a slow example on a slow or
loaded machine and then shrinks it into inputs this machine never tries (pinned
to one busy core, 2 s was passed and the search went elsewhere).
"""

from __future__ import annotations

import copy
import io
import json
import math
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cli, make_trace
from llmlb_bench.errors import UserError
from llmlb_bench.replay.sse import SSEDecoder
from llmlb_bench.schema import TRACE, read_trace, write_trace
from llmlb_bench.sim.config import ClusterConfig
from llmlb_bench.sweep.spec import parse_sweep
from llmlb_bench.tomlfile import read_toml
from llmlb_bench.workload.importers import import_trace
from llmlb_bench.workload.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 150
CLI_EXAMPLES = 40
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
tried: dict[str, int] = {}


def _count(name: str) -> None:
    tried[name] = tried.get(name, 0) + 1


def _must_be_user_error(fn, *args, **kwargs):
    """Call ``fn``: success or UserError pass; any other exception fails the test (with the input)."""
    try:
        return fn(*args, **kwargs)
    except UserError as exc:
        assert "\n" not in exc.line(), "errors are one line"
        return None


# ---- values and mutations of parsed TOML documents -------------------------------------------

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=12), st.sampled_from(["", "poisson", "lognormal", "round_robin", "h100-sxm"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


def _paths(doc, prefix=()):
    """Every (container, key) of a nested document."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append((doc, k))
        out.extend(_paths(v, prefix + (k,)))
    return out


@st.composite
def mutated(draw, base: dict) -> dict:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        spots = _paths(doc)
        if not spots:
            break
        container, key = draw(st.sampled_from(spots))
        op = draw(st.sampled_from(["drop", "value", "typo", "extra"]))
        if op == "drop" and isinstance(container, dict):
            del container[key]
        elif op == "typo" and isinstance(container, dict) and isinstance(key, str) and key:
            i = draw(st.integers(min_value=0, max_value=len(key) - 1))
            container[key[:i] + key[i + 1:] + draw(st.sampled_from(["", "s", "x"]))] = container.pop(key)
        elif op == "extra" and isinstance(container, dict):
            container[draw(st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=10))] = draw(values)
        else:
            container[key] = draw(values)
    return doc


def _toml(name: str) -> dict:
    return read_toml(ROOT / name)


WORKLOADS = [_toml(f"workloads/{n}") for n in ("chat.toml", "multi-tenant.toml", "agentic.toml", "multimodal.toml")]
CLUSTERS = [_toml(f"clusters/{n}") for n in ("a100x4.toml", "autoscale.toml", "disaggregated.toml", "hetero.toml")]
SWEEPS = [_toml(f"sweeps/{n}") for n in ("policies.toml", "distserve.toml")]


@FUZZ
@given(st.sampled_from(WORKLOADS).flatmap(mutated))
def test_workload_specs(doc):
    _count("workload")
    _must_be_user_error(WorkloadSpec.from_dict, doc, "fuzz.toml")


@FUZZ
@given(st.sampled_from(CLUSTERS).flatmap(mutated))
def test_cluster_files(doc):
    _count("cluster")
    _must_be_user_error(lambda: ClusterConfig.from_dict(doc, where="fuzz.toml").pools)


@FUZZ
@given(st.sampled_from(SWEEPS).flatmap(mutated))
def test_sweep_files(doc):
    _count("sweep")
    _must_be_user_error(parse_sweep, doc, "fuzz.toml", ROOT / "sweeps")


@FUZZ
@given(st.text(max_size=300) | st.sampled_from(["a = 1\na = 2", "[x]\n[x]", "a = \"\\uD800\"", "\x00", "= 1"]))
def test_toml_text(tmp_path_factory, text):
    _count("toml text")
    path = tmp_path_factory.mktemp("t") / "f.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _must_be_user_error(read_toml, path)


# ---- trace importers: CSV, JSONL and JSON around each format's real columns -------------------

cells = st.one_of(st.integers(min_value=-5, max_value=10**12).map(str), st.floats().map(repr),
                  st.sampled_from(["", "NaN", "inf", "-1", "1e309", "x", "2023-11-16 18:15:46.6805900",
                                   "2024-05-10 00:00:00.000+00:00", "\"a,b\"", "0"]))
CSV_HEADERS = {
    "azure-2023": ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
    "azure-mm-2025": ["TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens"],
    "burstgpt": ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"],
}


@st.composite
def csv_files(draw):
    fmt = draw(st.sampled_from(sorted(CSV_HEADERS)))
    header = list(CSV_HEADERS[fmt])
    if draw(st.booleans()):
        header = draw(st.permutations(header))[: draw(st.integers(min_value=0, max_value=len(header)))]
    rows = draw(st.lists(st.lists(cells, min_size=0, max_size=len(header) + 1), max_size=6))
    text = "\n".join([",".join(header)] + [",".join(r) for r in rows])
    return fmt, text.encode()


json_values = st.one_of(st.integers(min_value=-5, max_value=2**53), st.floats(allow_nan=False), st.none(),
                        st.text(max_size=6), st.lists(st.integers(min_value=-1, max_value=2**64 - 1), max_size=4))
JSONL_KEYS = {
    "mooncake": ["timestamp", "input_length", "output_length", "hash_ids"],
    "bailian": ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
                "hash_ids"],
}


@st.composite
def jsonl_files(draw):
    fmt = draw(st.sampled_from(sorted(JSONL_KEYS)))
    keys = JSONL_KEYS[fmt]
    rows = draw(st.lists(st.fixed_dictionaries({}, optional={k: json_values for k in keys}), max_size=6))
    lines = [json.dumps(r) for r in rows]
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["{", "[1,2]", "null", "{\"timestamp\": }", "\ufeff{}"])))
    return fmt, "\n".join(lines).encode()


sharegpt_docs = st.one_of(
    st.lists(st.fixed_dictionaries({}, optional={"id": st.text(max_size=4), "conversations": st.lists(
        st.fixed_dictionaries({}, optional={"from": st.sampled_from(["human", "gpt", "system", "x"]),
                                            "value": st.one_of(st.text(max_size=40), st.integers(), st.none())}),
        max_size=4)}), max_size=4),
    json_values, st.dictionaries(st.text(max_size=4), json_values, max_size=3))


@FUZZ
@given(st.one_of(csv_files(), jsonl_files(), sharegpt_docs.map(lambda d: ("sharegpt", json.dumps(d).encode()))))
def test_trace_importers(tmp_path_factory, case):
    _count("trace import")
    fmt, data = case
    path = tmp_path_factory.mktemp("i") / "in.txt"
    path.write_bytes(data)
    out = _must_be_user_error(import_trace, fmt, path, rate=5.0)
    if out is not None:  # a trace that imports is a valid trace
        TRACE.conform(out.table, "fuzz")
        assert out.table.num_rows == 0 or min(out.table.column("arrival_s").to_pylist()) >= 0


@settings(FUZZ, max_examples=CLI_EXAMPLES)  # a whole CLI run per example
@given(csv_files())
def test_a_failed_import_writes_nothing(tmp_path_factory, capsys, case):
    """Through the CLI: exit 0 with a readable trace, or exit 2 with one line and no output file."""
    _count("trace import (CLI)")
    fmt, data = case
    folder = tmp_path_factory.mktemp("c")
    (folder / "in.csv").write_bytes(data)
    code, out, err = cli(["trace", "import", str(folder / "in.csv"), "--format", fmt, "-o",
                          str(folder / "out.parquet")], capsys)
    if code == 0:
        read_trace(folder / "out.parquet")
    else:
        assert code == 2 and err.startswith("error:") and "Traceback" not in err
        assert sorted(p.name for p in folder.iterdir()) == ["in.csv"]


# ---- Parquet traces: valid files cut short, bytes flipped, columns of the wrong kind ---------

def _valid_trace_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(make_trace(n=20), buf)
    return buf.getvalue()


VALID = _valid_trace_bytes()


@st.composite
def damaged_parquet(draw):
    data = bytearray(VALID)
    how = draw(st.sampled_from(["cut", "flip", "junk"]))
    if how == "cut":
        return bytes(data[: draw(st.integers(min_value=0, max_value=len(data) - 1))])
    if how == "flip":
        for _ in range(draw(st.integers(min_value=1, max_value=8))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        return bytes(data)
    return draw(st.binary(max_size=200))


column_types = st.sampled_from([pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_(), pa.list_(pa.int64()),
                                pa.uint64(), pa.float32(), pa.dictionary(pa.int32(), pa.string())])


@st.composite
def odd_tables(draw):
    names = draw(st.lists(st.sampled_from(["request_id", "arrival_s", "input_tokens", "output_tokens", "tenant",
                                           "prefix_hashes", "parent_id", "after_parent_s", "turn", "x"]),
                          unique=True, max_size=7))
    n = draw(st.integers(min_value=0, max_value=5))
    cols = {}
    for name in names:
        t = draw(column_types)
        if pa.types.is_dictionary(t):
            cols[name] = pa.array(["a"] * n).dictionary_encode()
        elif pa.types.is_list(t):
            cols[name] = pa.array([[1, 2]] * n, t)
        elif pa.types.is_string(t):
            cols[name] = pa.array(["1"] * n, t)
        elif pa.types.is_boolean(t):
            cols[name] = pa.array([True] * n, t)
        else:
            # 2.0**31, a float: pyarrow refuses the int 2**31 for float32 (not exactly representable by its
            # rule), an error of this strategy, not of the reader
            v = draw(st.sampled_from([0, 1, -1, 2.0**31, 1e300, math.nan] if pa.types.is_floating(t) else [0, 1, 7]))
            cols[name] = pa.array([v] * n, t) if not (isinstance(v, float) and not pa.types.is_floating(t)) \
                else pa.array([0] * n, t)
    return pa.table(cols) if cols else pa.table({"x": pa.array([], pa.int64())})


@FUZZ
@given(st.one_of(damaged_parquet(), odd_tables()))
def test_parquet_traces(tmp_path_factory, case):
    _count("parquet trace")
    path = tmp_path_factory.mktemp("p") / "t.parquet"
    if isinstance(case, bytes):
        path.write_bytes(case)
    else:
        pq.write_table(case, path)
    table = _must_be_user_error(read_trace, path)
    if table is not None:
        out = path.with_name("copy.parquet")
        write_trace(table, out)  # what read_trace accepts can be written and read back
        assert read_trace(out).num_rows == table.num_rows


# ---- the SSE decoder: any bytes, split anywhere --------------------------------------------

sse_pieces = st.lists(st.one_of(
    st.sampled_from([b"data: {\"x\":1}\n\n", b"data: [DONE]\n\n", b": ping\n\n", b"event: error\ndata: e\n\n",
                     b"\r\n", b"\n", b"\r", b"data:", b"data: a\ndata: b\n\n", b"\xff\xfe", b"id: 3\n"]),
    st.binary(max_size=20)), max_size=20)


@FUZZ
@given(sse_pieces, st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_sse_decoder_any_bytes_any_split(pieces, cuts):
    _count("sse")
    stream = b"".join(pieces)
    whole = SSEDecoder()
    expected = whole.feed(stream)
    split = SSEDecoder()
    got, start = [], 0
    for cut in sorted(c for c in cuts if c <= len(stream)) + [len(stream)]:
        got += split.feed(stream[start:cut])
        start = cut
    assert got == expected and split.pending == whole.pending  # how TCP splits it does not matter
    assert all(isinstance(name, bytes) and isinstance(data, bytes) for name, data in got)


def test_zz_every_fuzzer_tried_its_inputs():
    """Runs last in this file (pytest keeps file order): each fuzzer above ran its full budget."""
    names = ["workload", "cluster", "sweep", "toml text", "trace import", "trace import (CLI)", "parquet trace", "sse"]
    ran = {k: tried.get(k, 0) for k in names}
    if not any(ran.values()):
        pytest.skip("run with the fuzzers (this test only counts them)")
    assert all(v >= (CLI_EXAMPLES if "CLI" in k else EXAMPLES) for k, v in ran.items()), ran
