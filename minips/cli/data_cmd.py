"""`minips data`: list and download datasets (placeholder until minips.data lands)."""

import click


@click.group()
def data() -> None:
    """List and download datasets."""
