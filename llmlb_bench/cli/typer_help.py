"""Load Typer's help renderer without the two rich modules our help never uses.

``typer.rich_utils`` renders every ``--help`` and usage error. At its top it imports
``rich.markdown`` (with markdown-it and pygments) for ``rich_markup_mode="markdown"`` and
``rich.traceback`` (with ``rich.pretty`` and attrs) for pretty tracebacks; the app uses markup
mode ``"rich"`` and turns pretty tracebacks off, so neither is ever called, yet together they are
about a fifth of what a ``--help`` costs (benchmarks/cli_startup.py). While ``typer.rich_utils``
loads, each of the two modules is stood in for by a module whose class imports the real one the
first time it is called or asked for an attribute, so nothing changes if Typer ever does use them;
the stand-ins leave ``sys.modules`` as soon as it has loaded, so the real modules stay importable
by everything else.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: module -> the class ``typer.rich_utils`` takes from it
_DEFERRED = (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback"))


class _Forwarding(type):
    """Metaclass of a stand-in: class attributes (``Traceback.from_exception``) come from the real class
    (Any: whatever Rich's class has, forwarded untouched)."""

    _module: str
    _name: str

    def real(cls) -> Any:
        return getattr(importlib.import_module(cls._module), cls._name)

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(cls.real(), attr)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)


def _stand_in(module: str, name: str) -> types.ModuleType:
    stub = types.ModuleType(module, f"stands in for {module} while typer.rich_utils loads (llmlb_bench.cli.typer_help)")
    setattr(stub, name, _Forwarding(name, (), {"_module": module, "_name": name}))
    return stub


def load_typer_help() -> None:
    """Import ``typer.rich_utils`` (once) with stand-ins for the modules it does not need."""
    if "typer.rich_utils" in sys.modules:
        return
    stubs = {module: _stand_in(module, name) for module, name in _DEFERRED if module not in sys.modules}
    sys.modules.update(stubs)
    try:
        importlib.import_module("typer.rich_utils")
    finally:
        for module, stub in stubs.items():
            if sys.modules.get(module) is stub:
                del sys.modules[module]
