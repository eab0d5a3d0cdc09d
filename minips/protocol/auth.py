"""Keys and authentication: ZeroMQ CURVE encryption with an allow-list of client keys.

CURVE (ZeroMQ RFC 26, CurveZMQ) encrypts and authenticates every connection with
Curve25519 key pairs. The server knows its own secret key and a list of allowed client
*public* keys; a client knows its own key pair and the server's public key. The server
checks each connecting client's key through ZAP (ZeroMQ RFC 27), the pattern the ZeroMQ
guide calls "Ironhouse": a client whose key is not on the list never completes the
handshake, so it can send nothing at all. Every message that does arrive carries its
sender's public key (the ZMTP metadata property "User-Id", the key's Z85 text), which the
server uses to recognise operators and, with the connection's routing id, to bind a worker
id to the client that registered it (a key admits clients; several may share one).

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
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from minips.errors import ConfigError

SERVER = "server"
WORKER = "worker"
OPERATOR = "operator"
ALLOWED_DIR = "allowed"
OPERATORS_DIR = "operators"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


class AuthError(ConfigError):
    """A key file or key directory is missing or unreadable."""


@dataclass(frozen=True)
class KeyPair:
    """A Curve25519 key pair as 40-character Z85 texts (bytes); `secret` None: public only."""

    public: bytes
    secret: bytes | None = None


@dataclass(frozen=True)
class ServerKeys:
    """What a CURVE server needs: its own pair, the allowed client keys, the operator keys.

    allowed and operators: Z85 public keys; every operator key is also allowed.
    """

    pair: KeyPair
    allowed: frozenset[bytes]
    operators: frozenset[bytes]


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client needs: its own pair and the server's public key."""

    pair: KeyPair
    server_public: bytes


# ------------------------------------------------------------------------------ key files


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


# ------------------------------------------------------------------------------- sockets


class AllowList:
    """The ZAP credentials check: is this client's public key on the list?"""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self.allowed = allowed

    def callback(self, domain: str, z85_key: bytes) -> bool:
        return z85_key in self.allowed


def start_gatekeeper(context: zmq.Context, keys: ServerKeys) -> ThreadAuthenticator:
    """Start the ZAP handler for every CURVE server socket of `context`; `.stop()` it later.

    It admits exactly the keys in `keys.allowed` (all domains). Start it before binding.
    """
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", credentials_provider=AllowList(keys.allowed))
    return authenticator


def make_curve_server(socket: zmq.Socket, keys: ServerKeys) -> None:
    """Make `socket` a CURVE server with the server's pair (before bind)."""
    socket.curve_secretkey = keys.pair.secret
    socket.curve_publickey = keys.pair.public
    socket.curve_server = True


def make_curve_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    """Make `socket` a CURVE client of the server whose public key it holds (before connect)."""
    socket.curve_secretkey = keys.pair.secret
    socket.curve_publickey = keys.pair.public
    socket.curve_serverkey = keys.server_public


def sender_key(frame: zmq.Frame) -> bytes | None:
    """The Z85 public key a received frame came with (None without CURVE)."""
    try:
        user_id = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):  # no metadata: a plain or in-process peer
        return None
    return user_id.encode("ascii") if user_id else None
