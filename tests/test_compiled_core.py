"""The simulator's compiled core (llmlb_bench/compiled_core.py, setup.py): both cores give the same
rows bit for bit, a stale core is never used, and every run says which core ran.

This process runs the compiled core where it is built and fresh (``pip install -e .`` builds it);
the pure-Python reference runs in a subprocess with ``LLMLB_CORE=python``. Where CI is set, a
missing or stale compiled core fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from llmlb_bench import compiled_core
from llmlb_bench.compiled_core import MODULES, build_manifest, choose, extension_path
from llmlb_bench.policies import HOLD, REJECT, Decision, PolicyError, Released, RouteRequest, Router, TargetInfo, View
from llmlb_bench.policies.routing import LeastOutstanding

REPO = Path(__file__).resolve().parents[1]


class PluginPolicy(LeastOutstanding):
    """A user's policy written in Python (loaded as ``module:Class``) on a built-in one, using every hook
    the compiled Router drives: HOLD into its own queue and ``release``, REJECT, ``on_complete`` with
    the measured outcome (which changes later decisions) and ``predicted_cached``."""

    name = "plugin"

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[RouteRequest] = []
        #: requests ended, and those that waited over 2 s for their first token (from the outcomes)
        self.ended = self.late = 0

    def _busy(self, view: View) -> bool:
        return sum(view.outstanding_requests) > 3 * len(view)

    def choose(self, req: RouteRequest, view: View) -> Decision:
        if req.request_id % 40 == 0 and (self.ended + self.late) % 2:
            return REJECT
        if req.request_id % 3 == 0 and self._busy(view):
            self.queue.append(req)
            return HOLD
        return super().choose(req, view)

    def release(self, view: View) -> Released | None:
        if not self.queue or self._busy(view):
            return None
        req = self.queue.pop(0)
        return req, super().choose(req, view)

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        out = req.outcome
        self.ended += 1
        if out is not None and out.first_token_s is not None and out.first_token_s - req.arrival_s > 2.0:
            self.late += 1

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        return req.input_tokens // (target + 2)

#: the presets both cores must agree on: (name, workload, cluster, policy, requests, rate scale)
PRESETS = [
    ("plain", "chat", "a100x4", "least_outstanding", 500, 1.0),
    ("prefix_cache", "shared-prefix", "a100x4", "cache_aware", 300, 1.0),
    ("pd", "chat", "disaggregated", "pd_pair", 300, 1.0),
    ("lora", "multi-lora", "multi-lora", "lora_affinity", 300, 1.0),
    ("speculative", "chat", "speculative", "least_outstanding", 300, 1.0),
    ("failures", "chat", "failures", "least_outstanding", 500, 1.0),
    ("autoscale", "chat", "autoscale", "least_outstanding", 500, 2.0),
    ("autoscale_pid", "chat", "autoscale-pid", "least_outstanding", 500, 2.0),
    # a plugin policy in Python under the compiled Router (this module's name differs in the subprocess)
    ("plugin", "chat", "a100x4", f"{__name__}:PluginPolicy", 500, 2.0),
]

#: run.json summary keys that are not the simulation's outcome
NOT_OUTCOME = {"wall_s", "sim_core"}


def _require_compiled() -> None:
    """Skip where the compiled core is not built (it is optional), fail where CI is set."""
    core = compiled_core.current()
    if not core.compiled:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the compiled simulator core: {core.why}")
        pytest.skip(f"no compiled simulator core: {core.why}")


def _simulate_presets(traces: Path, results: Path) -> None:
    """Simulate every preset into ``results/<name>`` (both cores run this same function)."""
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.schema import read_trace
    from llmlb_bench.sim.config import load_cluster

    for name, _, cluster, policy, _, _ in PRESETS:
        path = traces / f"{name}.parquet"
        simulate_run(read_trace(path), path, load_cluster(REPO / "clusters" / f"{cluster}.toml"), policy, {},
                     seed=7, results=results, run_id=name)


@pytest.fixture(scope="module")
def both_cores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The presets' runs under the compiled core (this process) and the pure one (a subprocess)."""
    _require_compiled()
    from llmlb_bench.workload import generate, load_spec

    base = tmp_path_factory.mktemp("cores")
    traces = base / "traces"
    traces.mkdir()
    for name, workload, _, _, n, scale in PRESETS:
        spec = load_spec(REPO / "workloads" / f"{workload}.toml").replace(requests=n)
        pq.write_table(generate(spec, seed=3, rate_scale=scale), traces / f"{name}.parquet")
    _simulate_presets(traces, base / "compiled")
    code = ("import sys; sys.path.insert(0, sys.argv[3]); from test_compiled_core import _simulate_presets; "
            "from pathlib import Path; _simulate_presets(Path(sys.argv[1]), Path(sys.argv[2]))")
    env = {**os.environ, "LLMLB_CORE": "python"}
    subprocess.run([sys.executable, "-c", code, str(traces), str(base / "python"), str(Path(__file__).parent)],
                   env=env, check=True, timeout=900)
    return base / "compiled", base / "python"


@pytest.mark.parametrize("preset", [p[0] for p in PRESETS])
def test_both_cores_give_bit_identical_runs(both_cores: tuple[Path, Path], preset: str) -> None:
    compiled, python = (d / preset for d in both_cores)
    a, b = (pq.read_table(d / "requests.parquet") for d in (compiled, python))
    assert a.num_rows > 0 and a.schema == b.schema
    for column in a.column_names:  # column by column, for a message that names the first difference
        if column != "run_id":
            assert a.column(column).equals(b.column(column)), f"{preset}: requests.{column} differs"
    sa, sb = (pq.read_table(d / "series.parquet") for d in (compiled, python))
    assert sa.drop(["run_id"]).equals(sb.drop(["run_id"])), f"{preset}: series differ"
    ja, jb = (json.loads((d / "run.json").read_text())["summary"] for d in (compiled, python))
    assert ja["sim_core"].startswith("compiled") and jb["sim_core"] == "pure Python (forced by LLMLB_CORE=python)"
    assert {k: v for k, v in ja.items() if k not in NOT_OUTCOME} == {k: v for k, v in jb.items() if k not in NOT_OUTCOME}


def test_the_plugin_preset_exercises_every_hook(both_cores: tuple[Path, Path]) -> None:
    """The plugin preset held, released, rejected and predicted (else it would test less than it says)."""
    rows = pq.read_table(both_cores[0] / "plugin" / "requests.parquet").to_pylist()
    status = {r["status"] for r in rows}
    assert {"ok", "rejected"} <= status, status
    assert any(r["predicted_cached_tokens"] for r in rows)
    sent = [r for r in rows if r["sent_s"] is not None]
    assert any(r["sent_s"] > r["scheduled_s"] for r in sent)     # held by the policy, released later


def test_the_router_keeps_its_own_errors_for_wrong_typed_answers() -> None:
    """Compiled code checks its annotations at run time: a policy's answer of the wrong type must still
    get the Router's one-line error (not a TypeError), from ``choose`` and ``choose_pair`` alike."""

    class Wrong:
        name = "wrong"

        def choose(self, req: RouteRequest, view: View) -> object:
            return "0"

        def choose_pair(self, req: RouteRequest, view: View) -> object:
            return (0.0, 1)

    targets = [TargetInfo("p", pool="prefill"), TargetInfo("d", pool="decode")]
    for pairs in (False, True):
        router: Router[str] = Router(Wrong(), View(targets), dispatch=lambda *a: None,
                                     reject=lambda *a: None, disaggregated=pairs)
        route = router.route_pair if pairs else router.route
        with pytest.raises(PolicyError, match=r"policy 'wrong' chose target (0\.0|'0'); there are 2 targets"):
            route("a", RouteRequest(0, 0.0, 10, 5), 0.0)


def test_compiled_core_is_what_this_process_runs() -> None:
    _require_compiled()
    import importlib

    for name in MODULES:
        assert importlib.import_module(name).__file__.endswith(tuple(extension_suffixes()))
    assert compiled_core.running().startswith("compiled")


def extension_suffixes() -> list[str]:
    from importlib.machinery import EXTENSION_SUFFIXES

    return EXTENSION_SUFFIXES


def _fake_build(tmp_path: Path) -> Path:
    """A package tree with the core's sources (copies) and a manifest + extension files as a build
    leaves them; returns its package directory."""
    root = tmp_path / "tree"
    for rel in compiled_core.source_closure(str(REPO)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    pkg = root / "llmlb_bench"
    (pkg / "_compiled").mkdir()
    (pkg / "_compiled" / "manifest.json").write_text(json.dumps(build_manifest(str(root), True)))
    for name in MODULES:
        Path(extension_path(str(pkg), name)).parent.mkdir(parents=True, exist_ok=True)
        Path(extension_path(str(pkg), name)).write_bytes(b"")
    return pkg


def test_a_core_whose_sources_changed_is_not_used(tmp_path: Path) -> None:
    pkg = _fake_build(tmp_path)
    assert choose(str(pkg), {}) == (True, f"mypyc, {len(MODULES)} module{'s' if len(MODULES) > 1 else ''}", False)
    assert choose(str(pkg), {"LLMLB_CORE": "python"}) == (False, "forced by LLMLB_CORE=python", False)
    # an edit of a compiled module, or of a module it imports (mypyc inlines its Final constants)
    for rel in ("llmlb_bench/sim/cost.py", "llmlb_bench/sim/catalog.py"):
        source = pkg.parent / rel
        text = source.read_text()
        source.write_text(text + "\n# edited\n")
        core = choose(str(pkg), {})
        assert not core.compiled and core.stale and f"stale: {rel} changed since it was built" in core.why
        source.write_text(text)
    assert choose(str(pkg), {}).compiled  # the same bytes again: fresh again


def test_a_missing_or_failed_build_falls_back_and_says_why(tmp_path: Path) -> None:
    pkg = _fake_build(tmp_path)
    Path(extension_path(str(pkg), MODULES[0])).unlink()
    core = choose(str(pkg), {})
    assert not core.compiled and not core.stale and "not built for this Python" in core.why
    manifest = pkg / "_compiled" / "manifest.json"
    manifest.write_text(json.dumps({"built": False, "reason": "CompileError: no C compiler"}))
    assert choose(str(pkg), {}) == (False, "the compiled core did not build: CompileError: no C compiler", False)
    manifest.unlink()
    assert "not built" in choose(str(pkg), {}).why
    with pytest.raises(ValueError, match="'fast' is none of auto, python, compiled"):
        choose(str(pkg), {"LLMLB_CORE": "fast"})


def test_a_stale_core_warns_once_and_runs_the_sources(tmp_path: Path) -> None:
    """A real edited copy of the package, with this checkout's build: one warning line, the
    sources run; LLMLB_CORE=compiled turns the fallback into an error."""
    _require_compiled()
    root = tmp_path / "copy"
    shutil.copytree(REPO / "llmlb_bench", root / "llmlb_bench", ignore=shutil.ignore_patterns("__pycache__"))
    cost = root / "llmlb_bench" / "sim" / "cost.py"
    cost.write_text(cost.read_text() + "\n# edited after the build\n")
    code = "import llmlb_bench.sim.cost as c, llmlb_bench.sim.replica; print(c.__file__)"
    env = {**os.environ, "PYTHONPATH": str(root), "LLMLB_CORE": "auto"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cost)
    assert done.stderr.count("warning: simulator core: running pure Python: the compiled core is stale: "
                             "llmlb_bench/sim/cost.py changed since it was built") == 1, done.stderr
    done = subprocess.run([sys.executable, "-c", code], env={**env, "LLMLB_CORE": "compiled"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "LLMLB_CORE=compiled, but the compiled core is stale" in done.stderr


def test_version_names_the_core() -> None:
    run = [sys.executable, "-m", "llmlb_bench", "--version"]
    forced = subprocess.run(run, env={**os.environ, "LLMLB_CORE": "python"}, capture_output=True, text=True,
                            timeout=300, check=True)
    assert forced.stdout.splitlines()[1] == "simulator core: pure Python (forced by LLMLB_CORE=python)"
    default = subprocess.run(run, env={k: v for k, v in os.environ.items() if k != "LLMLB_CORE"},
                             capture_output=True, text=True, timeout=300, check=True)
    assert default.stdout.splitlines()[1] == f"simulator core: {choose(compiled_core.package_dir(), {}).describe()}"
    bad = subprocess.run(run, env={**os.environ, "LLMLB_CORE": "fast"}, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: LLMLB_CORE: 'fast' is none of auto, python, compiled"


def test_compiled_modules_avoid_what_mypyc_makes_slow_or_closed() -> None:
    """functools.cached_property made a compiled module 18x slower (trace_columns.py, measured);
    a test that monkeypatches a compiled module (mypyc's classes are closed) must run it under the
    pure-Python core (sim_helpers.in_pure_python)."""
    import ast

    sources = {name: (REPO / (name.replace(".", "/") + ".py")).read_text() for name in MODULES}
    for name, text in sources.items():
        names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(ast.parse(text))
                 if isinstance(n, (ast.Attribute, ast.Name))}
        assert "cached_property" not in names, name
    unguarded = []
    for test in (REPO / "tests").glob("test_*.py"):
        for fn in ast.walk(ast.parse(test.read_text())):
            if isinstance(fn, ast.FunctionDef):
                body = ast.unparse(fn)
                patches = "monkeypatch.setattr(" in body and any(f"{m.rpartition('.')[2]}_mod." in body
                                                                for m in MODULES)
                if patches and "in_pure_python(" not in body:
                    unguarded.append(f"{test.name}::{fn.name}")
    assert not unguarded, unguarded


def test_route_request_is_native_and_still_a_dataclass() -> None:
    """policies/request.py is compiled with the core (the core builds one per request and reads its
    fields natively); the dataclass's repr, equality, fields and replace must work as before, and a
    field is type-checked when set (compiled) as its hint says."""
    import dataclasses

    from llmlb_bench.policies import Outcome

    _require_compiled()
    import llmlb_bench.policies.request as request

    assert request.__file__.endswith(tuple(extension_suffixes()))
    route = RouteRequest(7, 1.5, 100, 20, tenant="a", prefix_hashes=[3, 4])
    assert repr(route).startswith("RouteRequest(request_id=7, arrival_s=1.5, input_tokens=100, max_output_tokens=20, "
                                  "tenant='a', session_id=None")
    assert [f.name for f in dataclasses.fields(route)][:4] == ["request_id", "arrival_s", "input_tokens",
                                                               "max_output_tokens"]
    assert route == RouteRequest(7, 1.5, 100, 20, "a", prefix_hashes=[3, 4])
    assert dataclasses.replace(route, kind="code").kind == "code"
    route.outcome = Outcome("ok", 2.0, 3.0, 20)
    assert route.outcome.end_s == 3.0 and route != RouteRequest(7, 1.5, 100, 20, "a", prefix_hashes=[3, 4])
    with pytest.raises(AttributeError):
        route.colour = "red"  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        RouteRequest("7", 1.5, 100, 20)  # type: ignore[arg-type]
