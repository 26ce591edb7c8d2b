"""ruff over the package, the tests, the benchmarks and the scripts; the rules are pyproject's
[tool.ruff] (bug-finding ones, no style), so this test and a bare ``ruff check`` agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PATHS = ["llmlb_bench", "tests", "benchmarks", "scripts"]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_reports_a_real_finding(tmp_path):
    """The check can fail: an undefined name, seen with the project's settings, is a finding."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_name\n")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                           str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "F821" in proc.stdout, proc.stdout + proc.stderr
