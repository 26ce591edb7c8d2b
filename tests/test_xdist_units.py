"""How scripts/test.sh shares the suite out (tests/conftest.py): two pytest-xdist workers over whole
modules, the modules that start vLLM in one unit and those that start Ray in another (so no two vLLM
fleets or Ray clusters are up at once on a CI machine), then the modules that time a real-time server
run alone (``--phase``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import SHARED_UNITS, SOLO_MODULES, xdist_unit

TESTS = Path(__file__).resolve().parent
#: what starts a vLLM fleet, and what uses Ray
STARTS = {"vllm fleets": re.compile(r"\bvllm_python\("),
          "ray clusters": re.compile(r'\bray_session\(|importorskip\("ray|make_executor\("ray"|RAY, "start"')}


def test_every_module_that_starts_vllm_or_ray_is_in_its_unit():
    modules = [p for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name]
    for unit, pattern in STARTS.items():
        starting = {p.stem for p in modules if pattern.search(p.read_text())}
        assert starting, f"the pattern no longer finds the modules of {unit}"
        assert starting <= SHARED_UNITS[unit], (unit, sorted(starting - SHARED_UNITS[unit]))
    named = SOLO_MODULES.union(*SHARED_UNITS.values())  # a renamed module must be renamed here too
    assert all((TESTS / f"{m}.py").is_file() for m in named), sorted(m for m in named if not (TESTS / f"{m}.py").is_file())


def test_units_are_modules_except_the_shared_ones():
    assert xdist_unit("tests/test_schema.py::test_missing_file") == "tests/test_schema.py"
    assert xdist_unit("tests/test_engines.py::Some::test_x[a-b]") == "vllm fleets"
    assert xdist_unit("tests/test_replay_vllm.py::test_y") == xdist_unit("tests/test_learned_vllm.py::test_z")
    assert xdist_unit("tests/test_replay_ray.py::test_y") == xdist_unit("tests/test_crash_signals.py::test_z")
    assert xdist_unit("tests/test_replay_ray.py::test_y") != xdist_unit("tests/test_replay_vllm.py::test_y")


def test_the_phases_split_the_suite_between_them():
    """``--phase parallel`` and ``--phase solo`` select complementary parts: the solo modules' tests in
    one, the others in the other."""
    files = ["tests/test_validate.py", "tests/test_toml_write.py"]

    def collected(*args: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args, *files],
                             cwd=TESTS.parent, capture_output=True, text=True, check=True).stdout
        return {line for line in out.splitlines() if "::" in line}

    every, parallel, solo = collected(), collected("--phase", "parallel"), collected("--phase", "solo")
    assert parallel and solo and parallel | solo == every and not parallel & solo
    assert all(t.startswith("tests/test_validate.py::") for t in solo)
