"""A Typer group that imports a command's module only when that command runs or shows its help.

``llmlb --help`` used to import every command module, and with them DuckDB, pandas, the simulator
and the replayer: over a second before any output, paid by every command. The group knows its
commands from the table in :mod:`llmlb_bench.cli.commands`; listing them (the top-level help, a
did-you-mean) builds light placeholders from the table's summaries, and resolving one to run it
imports its module, which registers it on the app, and builds the real Click command from that
registration with Typer's own converter, so a lazily loaded command behaves exactly as an eagerly
registered one.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

import typer
from typer.core import TyperGroup

try:        # Typer >= 0.20 ships its own copy of Click
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError  # type: ignore[assignment]  # the same class, from Click itself

from llmlb_bench.cli.commands import COMMANDS, load


class Group(TyperGroup):
    """Typer's group, whose ``--help`` flag is False when absent, as Click's own flags are.

    Typer (0.2x) validates an option's value with a pydantic adapter unless the value is already a
    bool, and its ``--help`` flag has no default, so a group's absent ``--help`` came in as None and
    made ``llmlb CMD --help`` (the group ``llmlb`` parses before ``CMD`` shows its help) import pydantic
    and build a validator: about a sixth of what a command's help costs (benchmarks/cli_startup.py).
    Every group of the CLI (``llmlb`` and each ``llmlb GROUP``) is one of these; the flag's help text
    and behaviour are unchanged, since a Click flag's value when absent is False anyway."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option


class LazyGroup(Group):
    """The ``llmlb`` group: commands from :data:`~llmlb_bench.cli.commands.COMMANDS`, loaded on use.

    Click's context, formatter and commands are Any here: they are the classes of Typer's own copy of
    Click or of Click itself, depending on Typer's version (see the imports above)."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *super().list_commands(ctx)]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in COMMANDS:
            return cmd
        if self._listing:       # the top-level help lists every command: no module needs to load for it
            return typer.core.TyperCommand(cmd_name, help=COMMANDS[cmd_name].summary)
        return self._load(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """Typer's, with its did-you-mean drawn from every command (it looks only at loaded ones)."""
        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches and "Did you mean" not in exc.message:
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def _load(self, name: str) -> Any:
        from llmlb_bench.cli.app import app

        load(name)
        short, markup = app.pretty_exceptions_short, app.rich_markup_mode
        for info in app.registered_commands:
            if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:  # type: ignore[union-attr]
                cmd = typer.main.get_command_from_info(info, pretty_exceptions_short=short, rich_markup_mode=markup)
                break
        else:
            group = next(g for g in app.registered_groups if g.name == name)
            cmd = typer.main.get_group_from_info(group, suggest_commands=app.suggest_commands,
                                                 pretty_exceptions_short=short, rich_markup_mode=markup)
        self.commands[name] = cmd
        return cmd
