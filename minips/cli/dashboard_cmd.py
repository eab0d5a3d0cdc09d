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
    "--updates-log", type=click.Path(dir_okay=False),
    help="The server's --updates-log (RUN_DIR/updates.jsonl of minips run): the staleness "
    "histogram and each worker's staleness and scale.",
)  # fmt: skip
@click.option(
    "--listen", default="127.0.0.1:8050", show_default=True,
    help="HOST:PORT of the page (port 0: any free port).",
)  # fmt: skip
@click.option(
    "--keys", type=click.Path(file_okay=False),
    help="Key directory (minips keys) of an authenticated server.",
)  # fmt: skip
@click.option(
    "--key-name", default="operator", show_default=True,
    help="The key pair in --keys the dashboard uses (any admitted key may ask `stats`).",
)  # fmt: skip
def dashboard(
    connect: str,
    metrics: str | None,
    updates_log: str | None,
    listen: str,
    keys: str | None,
    key_name: str,
) -> None:
    """Serve a live page of a server's stats: accuracy, updates/s, workers, bytes.

    Read-only like the evaluator: it only asks the server for `stats`. When the server
    stops, the page keeps its last numbers. Ctrl-C stops it.
    """
    from minips.classroom.dashboard import start_dashboard
    from minips.guard.addresses import normalize
    from minips.provision.keyfiles import load_client_keys

    connect = normalize(connect, "--connect", wildcard_port=False)  # not in the polling thread
    client_keys = load_client_keys(keys, key_name) if keys else None
    url, stop = start_dashboard(connect, metrics, listen, updates_log, client_keys, _say)
    click.echo(f"dashboard for {connect} on {url} (Ctrl-C stops it)")
    click.echo(f"projector view: {url}?projector")
    try:
        while True:
            time.sleep(3600)
    finally:
        stop()


def _say(line: str) -> None:
    """What the page's poller says about the server (nothing answers; it answers again)."""
    click.echo(line)
