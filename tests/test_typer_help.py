"""Help pages load Typer's renderer without rich.markdown and rich.traceback (cli/typer_help.py), and
read byte for byte as they do with them; the stand-ins hand out the real classes when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

_HELP = ("import sys\n{pre}from llmlb_bench.cli import main\n"
         "try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
         "print('MODULES', ' '.join(sorted(sys.modules)))")


def _help(argv: list[str], pre: str = "") -> tuple[str, set[str]]:
    out = subprocess.run([sys.executable, "-c", _HELP.format(pre=pre, argv=argv)], capture_output=True, text=True,
                         check=True, timeout=300, env=None).stdout
    page, _, modules = out.rpartition("MODULES ")
    return page, set(modules.split())


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["routers", "install", "--help"]])
def test_help_is_the_same_page_without_the_unused_modules(argv: list[str]) -> None:
    page, modules = _help(argv)
    assert "rich.markdown" not in modules and "rich.traceback" not in modules and "markdown_it" not in modules
    # rich.markdown and rich.traceback already loaded: nothing is stood in for, Typer gets the real ones
    real_page, real_modules = _help(argv, pre="import rich.markdown, rich.traceback\n")
    assert "rich.markdown" in real_modules and "Usage" in page
    assert page == real_page


def test_the_stand_ins_hand_out_the_real_classes() -> None:
    code = ("from llmlb_bench.cli.typer_help import load_typer_help\nload_typer_help()\n"
            "import sys, typer.rich_utils as ru\nassert 'rich.markdown' not in sys.modules\n"
            "md = ru.Markdown('# x')\nimport rich.markdown, rich.traceback\n"
            "assert type(md) is rich.markdown.Markdown and ru.Traceback.from_exception is not None\n"
            "assert ru.Traceback.from_exception.__func__ is rich.traceback.Traceback.from_exception.__func__\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
