"""The HTML report in a real headless browser (Debian's chromium): no console errors, charts drawn."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from llmlb_bench.cli import main
from engines_helpers import require, require_module
from metrics_helpers import seg, store_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _browser():
    """A real browser, or fail where ``CI`` is set (.ci/run installs it) and skip elsewhere."""
    require(CHROMIUM, "chromium", "apt-get install chromium (.ci/run does)")


def chromium(*args: str, profile) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    """Lines chromium logs for the page's console (``INFO:CONSOLE``), e.g. uncaught errors."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


@pytest.fixture
def page(tmp_path):
    require_module("matplotlib", "the page's full figure set")
    rng = np.random.default_rng(0)
    for rate in (2.0, 4.0, 8.0):
        n = 40
        sent = np.cumsum(rng.exponential(1 / rate, n))
        ttft = rng.exponential(0.05 * rate, n)
        first = sent + ttft
        store_run(tmp_path / "runs", f"lo-{rate:g}", {
            "request_id": list(range(n)), "tenant": ["a", "b"] * (n // 2), "sent_s": sent, "scheduled_s": sent,
            "first_token_s": first, "last_token_s": first + 0.9,
            "token_times": [[seg(float(f), 0.1, 10)] for f in first], "output_tokens": [10] * n,
            "input_tokens": [200] * n, "status": ["ok"] * n},
            series={"t_s": list(range(10)), "target": ["r0"] * 10, "waiting": list(rng.integers(0, 5, 10)),
                    "kv_blocks_used": list(rng.integers(0, 90, 10)), "kv_blocks_total": [100] * 10,
                    "power_w": list(rng.uniform(100, 300, 10))},
            config={"offered_rate": rate, "policy": {"name": "lo"}}, backend="sim")
    html = tmp_path / "report.html"
    try:
        main(["report", str(tmp_path / "runs"), "--slo", "ttft=300ms", "--format", "html", "-o", str(html)])
    except SystemExit as e:
        assert e.code in (0, None)
    return html


def test_report_loads_without_console_errors_and_charts_render(page, tmp_path):
    shot = tmp_path / "shot.png"
    proc = chromium("--window-size=1280,2200", f"--screenshot={shot}", page.as_uri(), profile=tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2200, 1280)
    assert pixels.std() > 0.05, "the screenshot is blank"
    # the figure area holds coloured chart marks, not just black text on white
    colour = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.3
    assert colour.mean() > 0.005


def test_dom_holds_every_figure(page, tmp_path):
    proc = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert proc.returncode == 0 and console_messages(proc.stderr) == []
    assert proc.stdout.count("<svg") >= 5 and "Comparison" in proc.stdout


def test_the_console_check_sees_errors(tmp_path):
    """The check above is not vacuous: a page with a script error does log it."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    proc = chromium("--dump-dom", bad.as_uri(), profile=tmp_path / "profile")
    assert any("undefinedFunction" in m for m in console_messages(proc.stderr))
