"""The Typer application object and the helpers every command shares.

Commands live in one module each (``llmlb_bench/cli/<command>.py``) and only
parse arguments and call into the package; :func:`main` turns
:class:`UserError` into one line on stderr with exit code 2.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import sys
import types
import warnings
from typing import Iterator, NoReturn

import typer
from rich.markup import escape

from llmlb_bench import interrupts
from llmlb_bench.cli.lazy import LazyGroup
from llmlb_bench.cli.typer_help import load_typer_help
from llmlb_bench.console import help_width, stderr_console, stdout_console
from llmlb_bench.errors import UserError

app = typer.Typer(
    name="llmlb",
    help="Benchmark load balancing for LLM inference: generate or import traces, replay them against "
    "real endpoints or the built-in cluster simulator, and report SLO goodput.\n\n"
    "Example (quick start):  llmlb run workloads/chat.toml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    cls=LazyGroup,
)



def _print_version(value: bool) -> None:
    """``llmlb --version``: the package's version and which simulator core runs (compiled_core.py)."""
    if value:
        from llmlb_bench import __version__
        from llmlb_bench.compiled_core import current

        try:
            core = current(warn=False).describe()
        except ImportError as exc:  # LLMLB_CORE is none of its choices, or =compiled where none is fresh
            raise UserError(str(exc).removeprefix("LLMLB_CORE: "), "LLMLB_CORE") from None
        print(f"llmlb-bench {__version__}\nsimulator core: {core}")
        raise typer.Exit()


@app.callback()
def _group(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                        help="Print the version and which simulator core runs, and exit.")) -> None:
    # the callback makes Typer build the group before any command loads; --version is its only option
    return None


console = stdout_console()
err_console = stderr_console()


def fail(problem: str, where: str | None = None) -> NoReturn:
    raise UserError(problem, where)


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C: runs flush their sinks and are marked partial. The first one
    stops the command; later ones are ignored, so they cannot cut the cleanup short or land in the
    exit callbacks (thread joins, atexit) as a traceback, also when a replay's own handler took
    the first (:mod:`llmlb_bench.interrupts`). The signal is also noted in :data:`_INTERRUPTED`,
    since a library may turn the KeyboardInterrupt into an error of its own or drop it (DuckDB
    raises 'Query interrupted' from a query it was running)."""
    if _in_finalizer(frame):
        # raised inside an object's __del__ (a ParquetWriter collected mid-run), the KeyboardInterrupt
        # would be printed as 'Exception ignored in ...' with a traceback and lost: deliver the signal
        # again in 10 ms, when the finalizer has returned
        import os
        import threading

        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
        return
    first = not _INTERRUPTED
    _INTERRUPTED.append(signum)
    _exiting()
    if first:
        raise KeyboardInterrupt(f"signal {signum}")


def _in_finalizer(frame: object) -> bool:
    """Whether the interrupted code runs inside an object's ``__del__`` (where an exception cannot
    propagate)."""
    f = frame if isinstance(frame, types.FrameType) else None
    while f is not None:
        if f.f_code.co_name == "__del__":
            return True
        f = f.f_back
    return False


#: the signals that stopped the current command, here or in a replay's handlers: whatever became of
#: their KeyboardInterrupt, the command exits 130
_INTERRUPTED = interrupts.STOPPED


def _exiting() -> None:
    """An interrupted command is on its way out: more Ctrl-C (or SIGTERM) must not raise again."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def _click_exceptions() -> tuple[type[Exception], ...]:
    """Click's exception base, from Typer's vendored copy and/or click itself
    (Typer >= 0.20 ships its own ``typer._click``)."""
    found = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


#: how Typer words a value that is none of an option's choices: "'htlm' is not one of 'terminal', 'json'."
_NOT_ONE_OF = re.compile(r"('(?:[^'\\]|\\.)*') is not one of ((?:'(?:[^'\\]|\\.)*'(?:, )?)+)\.")


def _usage_line(exc: Exception) -> str:
    """A usage error as one line, pointing at the command's --help; a value that is none of an
    option's choices gets the closest one, as every other choice does (:func:`unknown_choice`).
    Imported here, on the error path, as in :func:`_run`: every start-up would pay for them."""
    import ast

    from llmlb_bench.tomlfile import unknown_choice

    message = exc.format_message()  # type: ignore[attr-defined]
    param, wrong = getattr(exc, "param", None), _NOT_ONE_OF.search(message)
    if param is not None and wrong is not None and param.opts:
        flag = max(param.opts, key=len)
        choices = [ast.literal_eval(c) for c in re.findall(r"'(?:[^'\\]|\\.)*'", wrong.group(2))]
        message = unknown_choice(flag.lstrip("-").replace("-", " "), ast.literal_eval(wrong.group(1)), choices,
                                 flag).line()
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see '{ctx.command_path} --help')" if ctx is not None else message


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupt)
    rc: object = None     # what the command returned (an exit code from Typer, or None)
    _INTERRUPTED.clear()
    args = sys.argv[1:] if argv is None else argv
    if not args or "--help" in args:   # a help page: Typer's renderer, without what it never uses here
        load_typer_help()
    try:
        try:
            rc = _run(argv)
        except BaseException as exc:
            if not _INTERRUPTED or isinstance(exc, SystemExit) and exc.code == 130:
                raise
        if _INTERRUPTED or rc == 130:  # the interrupt was swallowed, became another error, or Typer's 130
            err_console.print("[yellow]interrupted[/]")
            rc = 130
    finally:
        if rc == 130:  # an interrupt Typer caught (it returns Exit(130) without standalone mode)
            _exiting()
        elif signal.getsignal(signal.SIGINT) is _raise_interrupt:  # in-process runs (tests) get Ctrl-C back
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """Python warnings stay off the user's terminal while a command runs: the package raises none
    (what a person must know is a 'warning:' line of its own), so any that come are a library's
    (matplotlib drawing the report's figures, with a source path and a line of code). ``python -W``
    or PYTHONWARNINGS still shows them."""
    if sys.warnoptions:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _run(argv: list[str] | None) -> object:
    """The command, its errors turned into one line and an exit code."""
    try:
        with help_width(), quiet_warnings():
            return app(args=argv, standalone_mode=False, prog_name="llmlb")
    except UserError as exc:
        from llmlb_bench.redact import redact

        err_console.print(f"[bold red]error:[/] {escape(redact(exc.line()))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _exiting()
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:  # Click's name for a KeyboardInterrupt it caught
        _exiting()
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except Exception as exc:
        if not isinstance(exc, _click_exceptions()):
            raise
        err_console.print(f"[bold red]error:[/] {escape(_usage_line(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]  # a Click exception (checked above)
