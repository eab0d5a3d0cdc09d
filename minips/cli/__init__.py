"""The `minips` command group.

Thin by design: each command parses its options and calls the library. User errors
(`MinipsError`) are printed as one line and exit with status 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import sys

import click

from minips import __version__
from minips.errors import MinipsError


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "MINIPS"}
)
@click.version_option(__version__, prog_name="minips")
def cli() -> None:
    """minips: a small parameter server for distributed deep learning."""


def _register() -> None:
    # Imported here so that `minips --help` stays fast and each command lives in its own module.
    from minips.cli.dashboard_cmd import dashboard
    from minips.cli.data_cmd import data
    from minips.cli.exercise_cmd import exercise
    from minips.cli.ps_cmd import evaluate, run, server, worker
    from minips.cli.report_cmd import plot, report
    from minips.cli.train_cmd import train

    for command in (train, run, server, worker, evaluate, data, report, plot, exercise, dashboard):
        cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the group, turning user errors into one line."""
    try:
        cli.main(args=argv, prog_name="minips", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except MinipsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
