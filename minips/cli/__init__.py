"""The `minips` command: `main` is its entry point (the console script, `python -m minips`).

The command group is minips.cli.command_line (the table of commands, each imported when
used), and each command a module here. `main` loads the group with a stop signal said in
one line (minips.cli.early_signals): a Ctrl-C while Python loads click and the command is
`interrupted`, never a traceback. `cli` and `COMMANDS` are the group's.
"""

from __future__ import annotations

from typing import Any

from minips.cli.early_signals import signals_while_loading


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: the command line, loaded, then run (command_line.main)."""
    with signals_while_loading():
        from minips.cli.command_line import main as run
    run(argv)


def __getattr__(name: str) -> Any:
    """`cli` and `COMMANDS`, from the group's module, loaded on first use."""
    if name in ("cli", "COMMANDS"):
        from minips.cli import command_line

        return getattr(command_line, name)
    raise AttributeError(f"module 'minips.cli' has no attribute {name!r}")
