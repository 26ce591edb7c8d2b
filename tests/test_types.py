"""mypy, strict, over the package (pyproject's [tool.mypy]: the whole of llmlb_bench), so this test
and a bare ``mypy`` check the same thing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_passes_on_the_package():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_typed_core_is_checked_strictly():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert conf["strict"] is True
    checked = set()
    for entry in conf["files"]:     # paths and globs, as mypy expands them
        for path in ROOT.glob(entry):
            checked |= set(path.rglob("*.py")) if path.is_dir() else {path}
    core = [ROOT / "llmlb_bench" / "schema.py", *(ROOT / "llmlb_bench" / "policies").rglob("*.py"),
            *(ROOT / "llmlb_bench" / "store").rglob("*.py"), *(ROOT / "llmlb_bench" / "sim").rglob("*.py")]
    assert not [str(p.relative_to(ROOT)) for p in core if p not in checked]
