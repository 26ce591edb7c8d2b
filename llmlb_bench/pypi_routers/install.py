"""The PyPI routers, each installed into its own virtual environment under the cache folder.

Why separate environments: each wheel carries a ~150 MB Rust binary and its own Python
dependencies (fastapi, uvicorn, ...), none of which llmlb needs; kept apart they can neither
break llmlb's environment nor each other. The folder is ``${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}/routers/<name>``
(the same cache root as the other engines), so tests and benchmarks install once per machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import unknown_choice


@dataclass(frozen=True)
class RouterPackage:
    """One router: its PyPI requirement and the command that starts it (relative to the venv)."""

    name: str
    requirement: str
    command: tuple[str, ...]


#: the versions measured in docs/routers.md; a user may install others with ``--requirement``
PACKAGES = {
    "vllm-router": RouterPackage("vllm-router", "vllm-router==0.1.17", ("bin/vllm-router",)),
    "sglang-router": RouterPackage("sglang-router", "sglang-router==0.3.2",
                                   ("bin/python", "-m", "sglang_router.launch_router")),
    "smg": RouterPackage("smg", "smg==1.13.0", ("bin/smg", "launch")),
}


def cache_root() -> Path:
    return Path(os.environ.get("LLMLB_CACHE_DIR") or Path.home() / ".cache" / "llmlb-bench") / "routers"


def package(name: str, where: str = "--router") -> RouterPackage:
    """The router called ``name``; ``where`` names the flag or argument it came from, for the error."""
    if name not in PACKAGES:
        raise unknown_choice("router", name, PACKAGES, where)
    return PACKAGES[name]


def venv(name: str) -> Path:
    return cache_root() / package(name).name


def installed(name: str) -> bool:
    return (venv(name) / package(name).command[0]).exists()


def ensure(name: str, requirement: str | None = None, quiet: bool = True) -> list[str]:
    """Install the router when its environment lacks it; returns the argv prefix that starts it.

    A failed install raises :class:`UserError` with pip's last line (e.g. no network)."""
    pkg = package(name)
    env = venv(name)
    if not installed(name) or requirement:
        env.parent.mkdir(parents=True, exist_ok=True)
        steps = [[sys.executable, "-m", "venv", str(env)],
                 [str(env / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                  *(["-q"] if quiet else []), requirement or pkg.requirement]]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise UserError(f"installing {requirement or pkg.requirement} failed: {last[0]}", str(env))
    return [str(env / pkg.command[0]), *pkg.command[1:]]
