"""A heavy library bound at a module's top but loaded at its first use.

Why: ``llmlb policies`` and every command's ``--help`` import the policy registry, whose learned
and bandit policies compute with numpy; importing numpy there costs ~0.1 s of start-up that
listing policies never uses. ``np = lazy_module("numpy")`` gives the module object at once and
runs numpy's own import at the first attribute read (``importlib.util.LazyLoader``), after which
it is the ordinary module. Already imported: the module itself.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module that loads itself when first used."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
