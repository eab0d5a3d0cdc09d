"""The `minips` command group (minips.cli.main loads it and runs it).

Thin by design: each command parses its options and calls the library. User errors
(`MinipsError`) are printed as one line and exit with status 2; anything else is a bug and
keeps its traceback.

Commands are registered in the COMMANDS table below and imported only when used: a
command's module (and what it needs: numpy, zmq, an optional extra's library) loads when
that command runs or shows its own help, never for `minips --help` or another command.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from minips import __version__
from minips.cli.early_signals import sigterm_said
from minips.cli.environment import unknown_variables
from minips.errors import MinipsError

# name -> ("module:attribute" of the click command, the line `minips --help` shows for it;
# None: hidden). The line is the first line of the command's docstring (a test checks).
COMMANDS: dict[str, tuple[str, str | None]] = {
    "train": ("minips.cli.train_cmd:train",
              "Train a model in one process (the baseline for distributed runs)."),
    "run": ("minips.cli.ps_cmd:run",
            "Run a server, N workers and an evaluator on this machine, as processes."),
    "server": ("minips.cli.ps_cmd:server",
               "Serve the model to workers until stopped (Ctrl-C, SIGTERM, or a `stop` request)."),
    "launch": ("minips.cli.launch_cmd:launch",
               "Take this process's role in a job started by torchrun, srun, mpirun or DMLC."),
    "worker": ("minips.cli.client_cmd:worker",
               "Train here for the server at --connect (everything else comes from it)."),
    "evaluate": ("minips.cli.client_cmd:evaluate",
                 "Test the model of the server at --connect every few seconds, until it stops."),
    "data": ("minips.cli.data_cmd:data", "List and download datasets."),
    "plan": ("minips.cli.plan_cmd:plan",
             "Choose per-layer codecs for a link: the least predicted time to accuracy."),
    "report": ("minips.cli.report_cmd:report",
               "Summarise run directories: accuracy, time, traffic, staleness per worker."),
    "plot": ("minips.cli.report_cmd:plot",
             "Plot accuracy vs time and vs samples, and staleness histograms (needs matplotlib)."),
    "web": ("minips.cli.web_cmd:web",
            "Serve the browser worker page and relay browsers to the server at --connect."),
    "dashboard": ("minips.cli.dashboard_cmd:dashboard",
                  "Serve a live page of a server's stats: accuracy, updates/s, workers, bytes."),
    "keys": ("minips.cli.keys_cmd:keys",
             "Make CURVE key pairs for a server and its clients (authentication)."),
    "exercise": ("minips.cli.exercise_cmd:exercise",
                 "Class exercises (`handout DIR` writes the starters) and their automatic checks."),
}  # fmt: skip


# Commands whose process computes beside the job's other processes on the same cores (a
# launched worker or shard): BLAS gets one thread per process, as `minips run` gives its
# children, before the command's module loads numpy.
SINGLE_THREADED_COMMANDS = ("launch",)


def pin_blas_to_one_thread() -> None:
    """One BLAS thread for this process (OPENBLAS/OMP/MKL_NUM_THREADS=1), unless the user
    set them; effective only before numpy is first imported."""
    from minips.run.processes import SINGLE_THREADED_BLAS

    for name, value in SINGLE_THREADED_BLAS.items():
        os.environ.setdefault(name, value)


class LazyGroup(click.Group):
    """A click group that finds its commands in a table and imports each on first use."""

    def __init__(self, *args: Any, table: dict[str, tuple[str, str | None]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.table = table

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.table)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.table:
            return None
        if cmd_name in SINGLE_THREADED_COMMANDS:
            pin_blas_to_one_thread()
        module, _, attribute = self.table[cmd_name][0].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name is not None and command is not None:
            for line in unknown_variables(os.environ, name, command, list(self.table)):
                click.echo(line, err=True)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table, so listing the commands imports none of them.
        rows = [(name, line) for name, (_, line) in self.table.items() if line is not None]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def click_error_line(exc: click.exceptions.ClickException) -> str:
    """A click error as one line naming what was wrong: the option, or the environment
    variable when the value came from one (MINIPS_RUN_WORKERS=abc names that variable),
    then where to read the command's help."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    named = isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter)
    if named and param is not None and ctx is not None:
        message = f"{_param_name(ctx, param)}: {' '.join(exc.message.split())}"
    if ctx is not None and isinstance(exc, click.UsageError):
        message += f" (see '{ctx.command_path} --help')"
    return message


def path_error_line(exc: OSError) -> str:
    """A file system's refusal as one line: "cannot use PATH: Read-only file system".

    An OSError that names a path (a read-only --out, a --metrics file whose directory is a
    file, a full disk) is the machine saying no to a path the command was given, not a bug.
    """
    where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):  # a file where a directory must be
        in_the_way = next((p for p in (Path(where), *Path(where).parents) if p.is_file()), None)
        if in_the_way is not None:
            what = "a file" if str(in_the_way) == where else f"{in_the_way} is a file"
            return f"cannot use {where}: {what}, not a directory"
    return f"cannot use {where}: {exc.strerror or exc}"


def _param_name(ctx: click.Context, param: click.Parameter) -> str:
    """ "--workers", "RUN_DIR", or "MINIPS_RUN_WORKERS" for a value read from the environment."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    if source is click.core.ParameterSource.ENVIRONMENT:
        if isinstance(param.envvar, str):
            return param.envvar
        if ctx.auto_envvar_prefix and param.name:
            return f"{ctx.auto_envvar_prefix}_{param.name.upper()}"
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


@click.group(
    cls=LazyGroup,
    table=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "MINIPS"},
)
@click.version_option(__version__, prog_name="minips")
def cli() -> None:
    """minips: a small parameter server for distributed deep learning.

    Every option can also be given as an environment variable MINIPS_<COMMAND>_<OPTION>,
    e.g. MINIPS_RUN_WORKERS=4 for `minips run --workers 4` (a MINIPS_ variable that no
    option reads is named in a warning). Datasets are looked up in
    --data-dir, then /usr/share/datasets, then $MINIPS_DATA (default ~/.cache/minips).
    """


def main(argv: list[str] | None = None) -> None:
    """Run the group, turning user errors into one line (a SIGTERM before the command
    handles its own: minips.cli.early_signals)."""
    try:
        with sigterm_said():
            cli.main(args=argv, prog_name="minips", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        click.echo(f"error: {click_error_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except MinipsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        if exc.filename is None:
            raise  # not about a path the user named: a bug, with its traceback
        click.echo(f"error: {path_error_line(exc)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
