"""Keys and authentication: ZeroMQ CURVE encryption with an allow-list of client keys.

CURVE (ZeroMQ RFC 26, CurveZMQ) encrypts and authenticates every connection with
Curve25519 key pairs. The server knows its own secret key and a list of allowed client
*public* keys; a client knows its own key pair and the server's public key. The server
checks each connecting client's key through ZAP (ZeroMQ RFC 27), the pattern the ZeroMQ
guide calls "Ironhouse": a client whose key is not on the list never completes the
handshake, so it can send nothing at all. Every message that does arrive carries its
sender's public key (the ZMTP metadata property "User-Id", the key's Z85 text, which
minips/protocol/auth.py's `sender_key` reads), which the server uses to recognise
operators (`require_operator`) and, with the connection's routing id, to bind a worker id
to the client that registered it (a key admits clients; several may share one).

The core's sockets take the keys they are given through one method, `keys.secure(...)`
(the protocols of minips/protocol/auth.py): ServerKeys and ClientKeys are those keys.
The key files that hold them (`minips keys DIR`) are minips/provision/keyfiles.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

    from minips.state.requests import Origin


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

    def secure(self, context: zmq.Context, socket: zmq.Socket) -> ThreadAuthenticator:
        """Make `socket` a CURVE server admitting only `allowed` (before it binds); the
        gatekeeper returned checks every client of `context` until `.stop()`."""
        gatekeeper = start_gatekeeper(context, self)
        make_curve_server(socket, self)
        return gatekeeper


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client needs: its own pair and the server's public key."""

    pair: KeyPair
    server_public: bytes

    def secure(self, socket: zmq.Socket) -> None:
        """Make `socket` a CURVE client of the server (before it connects)."""
        make_curve_client(socket, self)


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
    # Imported here: it pulls in asyncio (about 40 ms), which a process without CURVE never needs.
    from zmq.auth.thread import ThreadAuthenticator

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


def require_operator(origin: Origin, keys: ServerKeys | None) -> None:
    """Under CURVE only an operator key may stop or checkpoint (error `operator`)."""
    if keys is not None and origin.key not in keys.operators:
        raise ProtocolError("only an operator key may stop or checkpoint the server", "operator")
