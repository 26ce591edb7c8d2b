"""docs/ARCHITECTURE.md against the code: every file it names exists, every top-level module and
folder of the package is in it, and so is every DuckDB view the catalog and the metrics create."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "llmlb_bench"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def test_every_file_it_names_exists():
    files = {p.name for d in ("llmlb_bench", "tests", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")}
    files |= {p.name for p in ROOT.glob("*.py")}
    named = set(re.findall(r"([A-Za-z_]\w*\.py)\b", DOC))
    assert sorted(named - files) == []


def test_every_top_level_module_and_folder_is_in_it():
    top = [p for p in PKG.iterdir() if not p.name.startswith(("_", ".")) and (p.suffix == ".py" or p.is_dir())]
    assert sorted(p.name for p in top if p.name.removesuffix(".py") not in DOC) == []


def test_every_view_is_in_it():
    code = (PKG / "store" / "views.py").read_text() + (PKG / "metrics" / "sql.py").read_text()
    views = set(re.findall(r"CREATE (?:OR REPLACE )?VIEW (\w+)", code)) | set(re.findall(r'_parquet_view\("(\w+)"', code))
    assert {"requests", "series", "runs", "cache_accounting", "request_metrics"} <= views
    assert sorted(v for v in views if f"`{v}`" not in DOC) == []
