"""CURVE key files: a key directory written (`minips keys DIR`) and read back into the keys
the server and its clients put on their sockets (minips/guard/curve.py).

A key directory, as `minips keys DIR` writes it (ZeroMQ's certificate format, the files
`zmq.auth.create_certificates` writes and every binding can read: Z85 text keys):

    DIR/server.key          the server's public key      (give it to every client)
    DIR/server.key_secret   the server's key pair        (the server only)
    DIR/NAME.key            client NAME's public key
    DIR/NAME.key_secret     client NAME's key pair       (that client only)
    DIR/allowed/NAME.key    the allow-list: public keys that may connect
    DIR/operators/NAME.key  public keys that may also `stop` and `checkpoint`

By default NAME is `worker` (workers and evaluators) and `operator`. Copying a `.key`
file into `allowed/` (or out of it) is how an operator admits (or bans) a client; the
server reads the directories when it starts. docs/protocol.md section 15 says the same for
implementers in other languages.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import zmq.auth

from minips.errors import ConfigError
from minips.guard.curve import ClientKeys, KeyPair, ServerKeys

SERVER = "server"
WORKER = "worker"
OPERATOR = "operator"
ALLOWED_DIR = "allowed"
OPERATORS_DIR = "operators"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


class AuthError(ConfigError):
    """A key file or key directory is missing or unreadable."""


# A client's name is the stem of its key files: no path separator, no hidden file.
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_client_names(clients: tuple[str, ...]) -> None:
    """AuthError unless each name makes key files inside the key directory, once each
    (`../x` would write outside it; `server` or a repeated name would overwrite a pair)."""
    bad = [name for name in clients if not CLIENT_NAME.fullmatch(name) or name == SERVER]
    if bad:
        raise AuthError(
            f"client names {bad} cannot name key files: use letters, digits, '_', '-' and "
            f"'.' (not first), and not {SERVER!r}"
        )
    repeated = sorted({name for name in clients if clients.count(name) > 1})
    if repeated:
        raise AuthError(f"client names {repeated} are given more than once")


def make_keys(directory: str | Path, clients: tuple[str, ...] = (WORKER, OPERATOR),
              operators: tuple[str, ...] = (OPERATOR,)) -> list[Path]:  # fmt: skip
    """Write a key directory (module docstring): the server's pair and one pair per client.

    Every client's public key goes into `allowed/`, each of `operators` also into
    `operators/`. Existing files are never overwritten (AuthError): a new key would lock
    out every client holding the old one. Returns the files written.
    """
    check_client_names(clients)
    directory = Path(directory)
    names = (SERVER, *clients)
    existing = [directory / f"{n}{s}" for n in names for s in (PUBLIC_SUFFIX, SECRET_SUFFIX)]
    clash = [str(path) for path in existing if path.exists()]
    if clash:
        raise AuthError(f"key files already exist (remove them first): {', '.join(clash)}")
    unknown = sorted(set(operators) - set(clients))
    if unknown:
        raise AuthError(f"operator names {unknown} are not among the clients {list(clients)}")
    for sub in (ALLOWED_DIR, OPERATORS_DIR):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        public, secret = zmq.auth.create_certificates(directory, name)
        Path(secret).chmod(0o600)  # a secret key is readable by its owner only
        written += [Path(public), Path(secret)]
        if name == SERVER:
            continue
        for sub, members in ((ALLOWED_DIR, clients), (OPERATORS_DIR, operators)):
            if name in members:
                written.append(Path(shutil.copy(public, directory / sub)))
    return written


def load_pair(path: str | Path) -> KeyPair:
    """Read a `.key` or `.key_secret` file (a `.key_secret` gives both halves)."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise AuthError(f"cannot read key file {path}: {exc}") from None
    if public is None or len(public) != 40:
        raise AuthError(f"key file {path} holds no Z85 public key")
    return KeyPair(public, secret)


def load_public_keys(directory: str | Path) -> frozenset[bytes]:
    """Every public key in the `.key` files of a directory (missing directory: none)."""
    directory = Path(directory)
    if not directory.is_dir():
        return frozenset()
    return frozenset(load_pair(path).public for path in sorted(directory.glob(f"*{PUBLIC_SUFFIX}")))


def load_server_keys(directory: str | Path) -> ServerKeys:
    """The server's side of a key directory: AuthError when its secret key is missing."""
    directory = Path(directory)
    pair = _load_secret(directory / f"{SERVER}{SECRET_SUFFIX}")
    operators = load_public_keys(directory / OPERATORS_DIR)
    allowed = load_public_keys(directory / ALLOWED_DIR) | operators
    if not allowed:
        raise AuthError(f"no allowed client keys in {directory / ALLOWED_DIR} (run `minips keys`)")
    return ServerKeys(pair, allowed, operators)


def load_client_keys(directory: str | Path, name: str = WORKER) -> ClientKeys:
    """Client NAME's side of a key directory: its pair and the server's public key."""
    directory = Path(directory)
    pair = _load_secret(directory / f"{name}{SECRET_SUFFIX}")
    server = load_pair(directory / f"{SERVER}{PUBLIC_SUFFIX}")
    return ClientKeys(pair, server.public)


def _load_secret(path: Path) -> KeyPair:
    if not path.is_file():
        raise AuthError(f"no secret key file {path} (make one with `minips keys`)")
    pair = load_pair(path)
    if pair.secret is None:
        raise AuthError(f"key file {path} holds no secret key")
    return pair
