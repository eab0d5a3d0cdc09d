"""`minips web`: the gateway through which browsers join a run as workers."""

from __future__ import annotations

import asyncio
import logging
import signal

import click

from minips.classroom.web.admission import Admission
from minips.cli.numbers import BoundedIntRange


@click.command()
@click.option(
    "--connect", required=True, help="Parameter server address, e.g. tcp://127.0.0.1:5555."
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    help="HOST:PORT of the page (0.0.0.0:8080 lets other machines join; port 0: any).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Where to find datasets, as for `minips worker`.",
)
@click.option(
    "--url-file",
    type=click.Path(dir_okay=False),
    help="Write the page's URL here once serving (for launchers).",
)
@click.option(
    "--allow-origin",
    multiple=True,
    metavar="ORIGIN",
    help="Also let in pages from ORIGIN, e.g. https://class.example.org (a class behind a "
    "reverse proxy); the gateway's own page is always let in. Repeatable.",
)
@click.option(
    "--max-browsers",
    type=BoundedIntRange(min=1),
    default=Admission.max_browsers,
    show_default=True,
    help="WebSockets at once; one more is refused with a clear message.",
)
@click.option(
    "--max-memory",
    type=BoundedIntRange(min=1),
    default=Admission.max_memory >> 20,
    show_default=True,
    help="MiB of browsers' messages held at once, over all of them.",
)
@click.option("--verbose", "-v", is_flag=True)
def web(
    connect: str,
    listen: str,
    data_dir: str | None,
    url_file: str | None,
    allow_origin: tuple[str, ...],
    max_browsers: int,
    max_memory: int,
    verbose: bool,
) -> None:
    """Serve the browser worker page and relay browsers to the server at --connect.

    Each browser that opens the page becomes one worker of the run: it downloads its data
    shard from here, trains with JavaScript in a Web Worker, and talks to the server through
    this gateway. Needs pip install 'minips[web]'.
    """  # fmt: skip
    from minips.classroom.web.gateway import Gateway, check_installed, parse_listen
    from minips.guard.addresses import normalize
    from minips.results.rundir import check_writable
    from minips.results.whole_file import write_whole

    check_installed()
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    host, port = parse_listen(listen)
    connect = normalize(connect, "--connect", wildcard_port=False)  # not a page that never trains
    if url_file:
        check_writable(url_file, "--url-file")
    admission = Admission(max_browsers, max_memory << 20, list(allow_origin))
    gateway = Gateway(connect, host, port, data_dir, admission)

    def announce() -> None:
        # SIGTERM (a launcher's stop) ends serving as Ctrl-C does: exit code 0, not -15.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, gateway.stop)
        click.echo(f"minips web gateway: open {gateway.url} (relaying to {connect})")
        if url_file:  # whole or not at all: a launcher never reads half a URL
            write_whole(url_file, gateway.url + "\n")

    try:
        asyncio.run(gateway.serve(announce))
    except OSError as exc:  # port in use, address not available
        if exc.filename is not None:
            raise  # a file, not the address (minips.cli says which)
        from minips.errors import ConfigError

        raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
