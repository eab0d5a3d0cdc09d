"""`minips train`: the single-process trainer (placeholder)."""

import click


@click.command()
def train() -> None:
    """Train a model in one process."""
