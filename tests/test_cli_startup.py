"""Start-up cost of the CLI: every command pays for what the command registry imports."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_registry_does_not_import_scipy():
    # scipy.stats alone took half a second to import; only the commands that use it may load it
    code = "import sys, llmlb_bench.cli.commands; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
