"""`minips data`: list the datasets and where they are found; download the official files."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def data() -> None:
    """List and download datasets."""


@data.command("list")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also look here first (for DIR/NAME or the IDX files directly in DIR).",
)
def list_datasets(data_dir: Path | None) -> None:
    """Show each dataset and where it would be loaded from (or "not found")."""
    from minips.data import DATASET_NAMES
    from minips.provision.locations import find_dataset

    width = max(len(name) for name in DATASET_NAMES)
    for name in DATASET_NAMES:
        where = find_dataset(name, data_dir)
        click.echo(f"{name:<{width}}  {where if where is not None else 'not found'}")


@data.command("download")
@click.argument("name")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Cache root; files go to DIR/NAME. [default: $MINIPS_DATA or ~/.cache/minips]",
)
@click.option("--base-url", default=None, help="Download from this mirror instead.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars.")
def download_dataset(
    name: str, cache_dir: Path | None, base_url: str | None, progress: bool
) -> None:
    """Download dataset NAME (fashion-mnist or mnist) into the cache, verifying checksums."""
    from minips.provision.fetch import download

    target = download(name, cache_dir=cache_dir, base_url=base_url, progress=progress)
    click.echo(f"{name}: saved to {target}")
