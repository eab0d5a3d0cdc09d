"""`minips dashboard`: a live view of a running server in the browser (read-only)."""

from __future__ import annotations

import time

import click


@click.command()
@click.option("--connect", required=True, help="Server address, e.g. tcp://127.0.0.1:5555.")
@click.option(
    "--metrics", type=click.Path(dir_okay=False),
    help="A metrics JSONL file whose `eval` lines give the accuracy curves "
    "(minips evaluate --metrics FILE, or RUN_DIR/eval.jsonl of minips run).",
)  # fmt: skip
@click.option(
    "--listen", default="127.0.0.1:8050", show_default=True,
    help="HOST:PORT of the page (port 0: any free port).",
)  # fmt: skip
def dashboard(connect: str, metrics: str | None, listen: str) -> None:
    """Serve a live page of a server's stats: accuracy, updates/s, workers, bytes.

    Read-only like the evaluator: it only asks the server for `stats`. Ctrl-C stops it.
    """
    from minips.dashboard import start_dashboard

    url, stop = start_dashboard(connect, metrics, listen)
    click.echo(f"dashboard for {connect} on {url} (Ctrl-C stops it)")
    try:
        while True:
            time.sleep(3600)
    finally:
        stop()
