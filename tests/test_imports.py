"""The package's import graph: no cycles (but Typer's command registration), no upward arrows.

Read statically (every ``import`` in every module, at any depth, except those only for type
checkers), so a lazy import inside a function counts as much as one at the top: a cycle there
still couples the two modules. Layers, from the bottom: the policies and the schemas; the
simulator; the backends (replayer, ``llmlb serve``, ``llmlb route``) and what drives them
(learning, sweeps, reproductions); the CLI at the top.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "llmlb_bench"

#: package -> packages it must never import (directly or lazily)
FORBIDDEN = {
    "policies": ("sim", "replay", "serve", "proxy", "pypi_routers", "learn", "cli", "report", "sweep", "repro",
                 "experiment", "calibrate", "gate"),
    "sim": ("replay", "serve", "proxy", "pypi_routers", "learn", "cli", "report", "sweep", "repro", "gate"),
    "replay": ("serve", "proxy", "pypi_routers", "learn", "cli", "report", "sweep", "repro", "gate"),
    "metrics": ("replay", "serve", "proxy", "learn", "cli", "report", "sweep", "repro"),
    "store": ("sim", "replay", "serve", "proxy", "learn", "cli", "report", "sweep", "repro"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


@functools.cache
def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_lines(tree)
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = up + ("." + base if base else "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t.startswith("llmlb_bench") and (r := resolve(t)) and r != m:
                    graph[m].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycles_but_the_cli_registration():
    cycles = [c for c in _cycles(_graph()) if not all(m.startswith("llmlb_bench.cli.") for m in c)]
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_upward_imports():
    bad = []
    def part(name: str) -> str:
        return (name.split(".") + [""])[1].removesuffix(".py")

    for m, deps in _graph().items():
        for d in deps:
            if part(d) in FORBIDDEN.get(part(m), ()):
                bad.append(f"{m} -> {d}")
    assert bad == []
