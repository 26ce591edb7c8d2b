"""Which simulator core runs: the hot modules compiled with mypyc, or their pure-Python sources.

``pip install`` (``setup.py``) compiles :data:`MODULES` with mypyc where it can and records, in
``llmlb_bench/_compiled/manifest.json``, a SHA-256 of every source the compiled code was built
from: the modules themselves and every module of the package they import, at any depth (mypyc
inlines other modules' ``Final`` constants, so an edit there changes what the compiled code
should do too).

WHY the extension modules do not sit next to their sources: Python's import system prefers an
extension module to a ``.py`` file of the same name, so after an editable install (``pip install
-e``, how this repository is developed and tested) a compiled ``cost.so`` would shadow every later
edit of ``cost.py`` without a word. They are built under ``llmlb_bench/_compiled/`` instead, where
no import finds them, and the finder installed by :func:`install` (from the package's
``__init__``) loads them in place of the sources only when every recorded hash still matches.
A core whose sources changed since it was built is never used: the sources run, and the first
import of a core module prints one ``warning:`` line saying so. All compiled or none, since the
compiled modules call each other natively.

``LLMLB_CORE=python`` forces the pure-Python core (debugging, the tests that compare both cores);
``LLMLB_CORE=compiled`` makes a missing or stale compiled core an import error instead of a
fallback (CI); unset or ``auto``: compiled where it is built and fresh.

This module imports only the standard library: ``setup.py`` loads it by path, before any of the
package's dependencies may be installed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

#: the modules compiled with mypyc. They must be ``mypy --strict`` clean (tests/test_types.py), define
#: nothing that is monkeypatched or subclassed outside them (mypyc's classes are closed) and type what
#: user code hands them so that a wrong value still gets a friendly error: compiled code checks every
#: annotation at run time, so the Router types a policy's answers ``Any`` and checks them itself.
#: Measure before adding one: ``functools.cached_property`` made the whole simulation 18x slower
#: compiled (trace_columns.py had it; tests/test_compiled_core.py keeps it out).
MODULES: tuple[str, ...] = (
    "llmlb_bench.sim.cost",
    "llmlb_bench.sim.timeline",
    "llmlb_bench.sim.prefix_cache",
    "llmlb_bench.sim.replica",
    "llmlb_bench.sim.indexed_heap",
    "llmlb_bench.sim.kv_blocks",
    "llmlb_bench.sim.step_plan",
    "llmlb_bench.sim.simulation",
    "llmlb_bench.sim.results",
    "llmlb_bench.sim.series",
    "llmlb_bench.trace_run",
    "llmlb_bench.trace_schedule",
    "llmlb_bench.trace_columns",
    "llmlb_bench.policies.request",
    "llmlb_bench.policies.router",
    "llmlb_bench.policies.books",
)
#: the report's kernels in C (module -> source, relative to the repository): built beside the core, their
#: sources hashed into its manifest, and loaded by the finder only while the core is (else the importer's
#: NumPy code runs: ``llmlb_bench/metrics/kernels.py``). Plain C through the buffer protocol, where
#: mypyc's indexing of NumPy arrays is generic and slow.
KERNELS: dict[str, str] = {"llmlb_bench.metrics.report_kernels": "llmlb_bench/metrics/report_kernels.c",
                           "llmlb_bench.metrics.cache_kernels": "llmlb_bench/metrics/cache_kernels.c"}
#: the header both kernels include (their buffer checks): hashed into the manifest with them
KERNEL_HEADERS = ("llmlb_bench/metrics/kernel_buffers.h",)
PACKAGE = "llmlb_bench"
#: where the build puts the extension modules and the manifest, under the package directory
BUILD_DIR = "_compiled"
MANIFEST = "manifest.json"
#: mypyc's group: the one shared library all compiled modules live in (``<GROUP>__mypyc``)
GROUP = f"{PACKAGE}.{BUILD_DIR}.core"
ENV = "LLMLB_CORE"
CHOICES = ("auto", "python", "compiled")
REBUILD = "pip install -e . or python setup.py build_ext --inplace"


class Core(NamedTuple):
    """The decision: ``compiled`` or not, and why (for the pure core) or what (for the compiled one)."""

    compiled: bool
    why: str
    stale: bool = False

    def describe(self) -> str:
        """One phrase for ``llmlb --version`` and run.json."""
        return f"compiled ({self.why})" if self.compiled else f"pure Python ({self.why})"


def package_dir() -> str:
    """The directory of the ``llmlb_bench`` package this module belongs to."""
    return os.path.dirname(os.path.abspath(__file__))


def _module_file(root: str, name: str) -> str | None:
    """The source of module ``name`` under ``root`` (the directory holding the package), if any."""
    base = os.path.join(root, *name.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _imports(path: str, name: str) -> set[str]:
    """The package's modules that the source of ``name`` imports, wherever in the file."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def source_closure(root: str, modules: Sequence[str] = MODULES) -> list[str]:
    """The sources the compiled core depends on, relative to ``root``: ``modules`` and every package
    module they import, at any depth (a package's ``__init__`` only where it is imported itself:
    what it imports is no input of the compiled code)."""
    todo, seen, files = list(modules), set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(root, name)
        if path is None:
            continue  # a name imported from a module (`from pkg.mod import Class`), not a module
        files.add(os.path.relpath(path, root).replace(os.sep, "/"))
        todo.extend(_imports(path, name))
    return sorted(files)


def source_hashes(root: str, files: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each file (relative to ``root``); a missing file hashes to ``"missing"``."""
    import hashlib

    out = {}
    for rel in files:
        try:
            with open(os.path.join(root, rel), "rb") as f:
                out[rel] = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:
            out[rel] = "missing"
    return out


def extension_path(pkg_dir: str, name: str) -> str:
    """Where the build puts the compiled ``name`` for this Python (its extension suffix)."""
    from importlib.machinery import EXTENSION_SUFFIXES

    rel = name.split(".")[1:]  # without the package itself
    return os.path.join(pkg_dir, BUILD_DIR, *rel[:-1], rel[-1] + EXTENSION_SUFFIXES[0])


def build_manifest(root: str, built: bool, reason: str = "") -> dict[str, object]:
    """What ``setup.py`` records after a build (or a failed one): the modules, this Python's
    extension suffix, and the hash of every source the build read."""
    from importlib.machinery import EXTENSION_SUFFIXES

    files = source_closure(root) + sorted(KERNELS.values()) + list(KERNEL_HEADERS)
    return {"built": built, "reason": reason, "modules": list(MODULES), "suffix": EXTENSION_SUFFIXES[0],
            "sources": source_hashes(root, files) if built else {}}


def choose(pkg_dir: str, env: Mapping[str, str]) -> Core:
    """Which core this process runs, from ``LLMLB_CORE`` and the build's manifest.

    Raises ValueError for an ``LLMLB_CORE`` that is none of :data:`CHOICES`."""
    import json

    choice = (env.get(ENV) or "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"{env.get(ENV)!r} is none of {', '.join(CHOICES)}")
    if choice == "python":
        return Core(False, f"forced by {ENV}=python")
    try:
        with open(os.path.join(pkg_dir, BUILD_DIR, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return Core(False, f"the compiled core is not built: {REBUILD}")
    except (OSError, ValueError) as exc:
        return Core(False, f"the compiled core's manifest is unreadable ({exc}): {REBUILD}")
    if not manifest.get("built"):
        return Core(False, f"the compiled core did not build: {manifest.get('reason') or 'no reason recorded'}")
    if manifest.get("modules") != list(MODULES):
        return Core(False, f"the compiled core was built for other modules: {REBUILD}", stale=True)
    missing = [m for m in MODULES if not os.path.isfile(extension_path(pkg_dir, m))]
    if missing:
        return Core(False, f"the compiled core is not built for this Python ({missing[0]} has no "
                           f"{os.path.basename(extension_path(pkg_dir, missing[0]))}): {REBUILD}")
    # only the recorded files are hashed (parsing the sources for their imports would cost 0.14 s of
    # CPU per process): a source that starts importing another module changes, and is caught itself
    root = os.path.dirname(pkg_dir)
    recorded: dict[str, str] = manifest.get("sources") or {}
    now = source_hashes(root, sorted(recorded))
    changed = [f for f in now if recorded[f] != now[f]]
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return Core(False, f"the compiled core is stale: {changed[0]}{more} changed since it was built; "
                           f"rebuild: {REBUILD}", stale=True)
    return Core(True, f"mypyc, {len(MODULES)} module{'s' if len(MODULES) > 1 else ''}")


class _Finder:
    """Loads the compiled modules in place of their sources when :func:`choose` says so; for every
    other name, and for the pure core, it finds nothing and the ordinary finders load the sources."""

    def __init__(self, pkg_dir: str) -> None:
        self.pkg_dir = pkg_dir
        self.core: Core | None = None
        self.warned = False

    def decide(self, warn: bool = True) -> Core:
        if self.core is None:
            try:
                core = choose(self.pkg_dir, os.environ)
            except ValueError as exc:
                raise ImportError(f"{ENV}: {exc}") from None
            if not core.compiled and (os.environ.get(ENV) or "").strip().lower() == "compiled":
                raise ImportError(f"{ENV}=compiled, but {core.why}")
            self.core = core
        if warn and self.core.stale and not self.warned:
            self.warned = True
            print(f"warning: simulator core: running pure Python: {self.core.why}", file=sys.stderr)
        return self.core

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> ModuleSpec | None:
        if (fullname not in MODULES and fullname not in KERNELS) or not self.decide().compiled:
            return None
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import spec_from_file_location

        so = extension_path(self.pkg_dir, fullname)
        if fullname in KERNELS and not os.path.isfile(so):
            return None     # a kernel has no source module: its importer runs its NumPy code
        return spec_from_file_location(fullname, so, loader=ExtensionFileLoader(fullname, so))


_FINDER = _Finder(package_dir())


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once); called by the package's ``__init__``."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def current(warn: bool = True) -> Core:
    """The core this process runs (or will run once the simulator is imported); ``warn=False``
    leaves the stale core's warning line to the first import (``llmlb --version`` says it itself)."""
    return _FINDER.decide(warn)


def running() -> str:
    """The core that ran, for run.json: read from the loaded modules themselves, so a module
    loaded some other way (before the finder, from another path) cannot be misreported."""
    core = current()
    loaded = [sys.modules[m] for m in MODULES if m in sys.modules]
    from importlib.machinery import EXTENSION_SUFFIXES

    compiled = [m for m in loaded if str(getattr(m, "__file__", "")).endswith(tuple(EXTENSION_SUFFIXES))]
    if core.compiled and len(compiled) != len(loaded):
        return "mixed: some core modules compiled, some pure Python"
    return core.describe()
