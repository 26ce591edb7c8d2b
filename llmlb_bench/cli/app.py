"""The Typer application object and the helpers every command shares.

Commands live in one module each (``llmlb_bench/cli/<command>.py``) and only
parse arguments and call into the package; :func:`main` turns
:class:`UserError` into one line on stderr with exit code 2.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from llmlb_bench.errors import UserError

app = typer.Typer(
    name="llmlb",
    help="Benchmark load balancing for LLM inference: generate or import traces, replay them against "
    "real endpoints or the built-in cluster simulator, and report SLO goodput.\n\n"
    "Quick start:  llmlb run workloads/chat.toml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

console = Console()
err_console = Console(stderr=True)


def fail(problem: str, where: str | None = None) -> NoReturn:
    raise UserError(problem, where)


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C: runs flush their sinks and are marked partial."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from llmlb_bench.cli import commands  # noqa: F401  (registers the commands)

    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        rc = app(args=argv, standalone_mode=False)
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {escape(exc.line())}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
    if isinstance(rc, int) and rc:
        sys.exit(rc)
