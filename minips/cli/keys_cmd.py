"""`minips keys DIR`: make CURVE key pairs for a server and its clients."""

from __future__ import annotations

import click


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--client",
    "clients",
    multiple=True,
    metavar="NAME",
    help="A client key pair to make (repeatable; default: worker and operator).",
)
@click.option(
    "--operator",
    "operators",
    multiple=True,
    metavar="NAME",
    help="A client that may stop and checkpoint the server (default: operator).",
)
def keys(directory: str, clients: tuple[str, ...], operators: tuple[str, ...]) -> None:
    """Make CURVE key pairs for a server and its clients (authentication).

    Writes DIRECTORY/server.key(_secret), one NAME.key(_secret) per client, the clients'
    public keys in DIRECTORY/allowed/ and the operators' in DIRECTORY/operators/. Give the
    server `--keys DIRECTORY`; give a client machine server.key and its own NAME.key_secret.
    """
    from minips.provision.keyfiles import OPERATOR, WORKER, make_keys

    clients = clients or (WORKER, OPERATOR)
    operators = operators or tuple(name for name in clients if name == OPERATOR)
    for path in make_keys(directory, clients, operators):
        click.echo(str(path))
