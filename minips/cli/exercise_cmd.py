"""`minips exercise list`, `minips exercise handout DIR` and `minips exercise check NAME`."""

from __future__ import annotations

import sys

import click


@click.group()
def exercise() -> None:
    """Class exercises (`handout DIR` writes the starters) and their automatic checks."""


@exercise.command("list")
def list_exercises() -> None:
    """Each exercise: name, expected time, starter file, learning goal."""
    from minips.classroom.exercise import EXERCISES

    for ex in EXERCISES.values():
        click.echo(f"{ex.name:22s} {ex.minutes:3d} min  {ex.starter:18s} {ex.goal}")


@exercise.command("handout")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite starters already in DIRECTORY.")
def handout_exercises(directory: str, force: bool) -> None:
    """Write every exercise's starter into DIRECTORY (made if missing): the handout.

    The starters ship with minips, so this works from an installed package alone; no
    solution is in it.
    """
    from minips.classroom.exercise import handout

    written = handout(directory, force)
    click.echo(f"wrote {len(written)} files to {directory}: {', '.join(p.name for p in written)}")
    click.echo(f"next: cd {directory} && minips exercise list")


@exercise.command("check")
@click.argument("name")
@click.option(
    "--file", "path", type=click.Path(dir_okay=False),
    help="Your answer (default: the starter's file name in the current directory).",
)  # fmt: skip
def check_exercise(name: str, path: str | None) -> None:
    """Check your answer to exercise NAME: say what is wrong, or what was verified.

    Exit status 0 when the check passes, 1 when it finds something wrong.
    """
    from minips.classroom.exercise import check

    answer, result = check(name, path)
    click.echo(f"checking {answer} ({name})")
    for note in result.notes:
        click.echo(f"  ok: {note}")
    for finding in result.findings:
        click.echo(f"  WRONG: {finding}")
    click.echo("PASSED" if result.passed else f"FAILED: {len(result.findings)} problem(s)")
    if not result.passed:
        sys.exit(1)
