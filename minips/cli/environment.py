"""MINIPS_* environment variables that no option reads: named in one warning line.

Every option of `minips CMD` can be given as MINIPS_CMD_OPTION (click's auto_envvar_prefix),
so a misspelled variable (MINIPS_RUN_WORKRS=4) would otherwise be ignored without a word and
the run would use the default. A variable is named when it starts with the running
command's prefix and no option of that command reads it, or when its prefix is no
command's and it is not one of the variables minips reads directly (OTHER_VARIABLES).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import click

# Read directly, not through an option: the data look-up, the shaped links' names, and
# the variables the test suite, the benchmarks and CI use.
OTHER_VARIABLES = {"MINIPS_DATA", "MINIPS_SYSTEM_DATA", "MINIPS_UPDATE_SCREENSHOT",
                   "MINIPS_BENCH_SOCKETS", "MINIPS_CI_VENV"}  # fmt: skip
OTHER_PREFIXES = ("MINIPS_NETEM_",)


def option_variables(command: click.Command, prefix: str) -> set[str]:
    """The variables the options of `command` (and of its subcommands) read under `prefix`."""
    names = set()
    for param in command.params:
        if isinstance(param.envvar, str):
            names.add(param.envvar)
        elif param.envvar:
            names.update(param.envvar)
        if isinstance(param, click.Option) and param.name:
            names.add(f"{prefix}_{param.name.upper()}")
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            names |= option_variables(sub, f"{prefix}_{name.upper().replace('-', '_')}")
    return names


def unknown_variables(
    environ: Mapping[str, str], command_name: str, command: click.Command, all_commands: list[str]
) -> list[str]:
    """One line per MINIPS_* variable in `environ` that nothing would read, with a
    "did you mean" where a known variable is close: `command_name` is the command being run
    (its variables are all known), `all_commands` every command's name."""
    prefix = f"MINIPS_{command_name.upper().replace('-', '_')}"
    known = option_variables(command, prefix)
    command_prefixes = [f"MINIPS_{name.upper().replace('-', '_')}_" for name in all_commands]
    lines = []
    for variable in sorted(environ):
        if not variable.startswith("MINIPS_") or variable in known | OTHER_VARIABLES:
            continue
        if variable.startswith(OTHER_PREFIXES):
            continue
        ours = variable.startswith(prefix + "_")
        another_command = not ours and variable.startswith(tuple(command_prefixes))
        if another_command:
            continue  # another command's option (a run's children inherit the environment)
        close = difflib.get_close_matches(variable, sorted(known | OTHER_VARIABLES), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        where = f"no option of `minips {command_name}` reads it" if ours else "nothing reads it"
        lines.append(f"warning: {variable} is ignored: {where}{hint}")
    return lines
