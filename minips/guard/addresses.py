"""Addresses: check `--connect` and `--bind` up front, and explain bind errors in one line.

ZeroMQ itself is unkind here: connecting to "127.0.0.1:5555" (no transport) fails only
when the socket is used, and a client connecting to a name that does not resolve just
waits. So every address is checked before a socket sees it:

    normalize_connect("127.0.0.1:5555")  -> "tcp://127.0.0.1:5555"
    normalize_connect("tcp://nohost:1")  -> AddressError: cannot resolve host 'nohost' ...
    normalize_bind("127.0.0.1:*")        -> "tcp://127.0.0.1:*"   (* = any free port)
    bind(socket, "tcp://127.0.0.1:5570") -> AddressError: ... is already in use ...
    still_listening("ipc:///run/ps.sock") -> True while a live server accepts there (a
                                          bind would replace its file: refused, `in_use`)

A bare `host:port` is taken as TCP; `ipc://path` and `inproc://name` pass unchanged.
"""

from __future__ import annotations

import errno
import ipaddress
import socket as socketlib

import zmq

from minips.errors import ConfigError

TRANSPORTS = ("tcp://", "ipc://", "inproc://")


class AddressError(ConfigError):
    """An address that cannot be used: malformed, unresolvable, or not bindable."""


def split_tcp(address: str, what: str, wildcard_port: bool) -> tuple[str, str]:
    """("host", "port") of "tcp://host:port" or "host:port" (IPv6 hosts in brackets)."""
    rest = address.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{what} {address!r} needs a host and a port, e.g. tcp://127.0.0.1:5555")
    ok_port = port.isdigit() and 0 < int(port) < 65536
    if not (ok_port or (wildcard_port and port == "*")):
        allowed = "1..65535" + (" or *" if wildcard_port else "")
        raise AddressError(f"{what} {address!r}: port {port!r} is not a port number ({allowed})")
    return host.removeprefix("[").removesuffix("]"), port


def normalize(address: str, what: str, wildcard_port: bool) -> str:
    """The address with a transport: a bare "host:port" becomes "tcp://host:port"."""
    address = address.strip()
    if address.startswith(("ipc://", "inproc://")):
        if len(address.split("://", 1)[1]) == 0:
            raise AddressError(f"{what} {address!r} lacks a path")
        return address
    if "://" in address and not address.startswith("tcp://"):
        raise AddressError(f"{what} {address!r}: transport must be one of {', '.join(TRANSPORTS)}")
    host, port = split_tcp(address, what, wildcard_port)
    return f"tcp://{'[' + host + ']' if ':' in host else host}:{port}"


def normalize_connect(address: str) -> str:
    """A client's server address, checked and resolved (AddressError names what is wrong)."""
    address = normalize(address, "--connect", wildcard_port=False)
    if address.startswith("tcp://"):
        host, _ = split_tcp(address, "--connect", wildcard_port=False)
        resolve(host, address)
    return address


def normalize_bind(address: str) -> str:
    """A server's listening address, checked ("*" as host: every interface; as port: any)."""
    address = normalize(address, "--bind", wildcard_port=True)
    if address.startswith("tcp://"):
        host, _ = split_tcp(address, "--bind", wildcard_port=True)
        if host != "*":
            resolve(host, address)
    return address


def resolve(host: str, address: str) -> None:
    """AddressError when `host` is not an IP address and does not resolve."""
    try:
        socketlib.getaddrinfo(host, None, type=socketlib.SOCK_STREAM)
    except (socketlib.gaierror, UnicodeError) as exc:
        raise AddressError(f"cannot resolve host {host!r} in {address} ({exc})") from None


def is_loopback(address: str) -> bool:
    """True for ipc/inproc and for TCP on a loopback host (127.0.0.0/8, ::1, localhost)."""
    if not address.startswith("tcp://"):
        return True
    host, _ = split_tcp(address, "address", wildcard_port=True)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface or a host name: assume reachable from outside
        return False


def bind(socket: zmq.Socket, address: str) -> str:
    """Bind `socket` to `address`; return the bound endpoint, or AddressError with the fix."""
    try:
        socket.bind(address)
    except zmq.ZMQError as exc:
        raise explain_bind_error(address, exc) from None
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


def explain_bind_error(address: str, exc: zmq.ZMQError) -> AddressError:
    """One line: what went wrong binding `address`, and what to do about it."""
    fixes = {
        errno.EADDRINUSE: "is already in use (another server?): pick another port, "
        "or port * for any free one",
        errno.EADDRNOTAVAIL: "is not an address of this machine: use 127.0.0.1 (this "
        "machine only), 0.0.0.0 (every interface) or one of its interface addresses",
        errno.EACCES: "needs privileges (ports below 1024): use a port from 1024 up",
        errno.ENODEV: "names no network interface of this machine",
    }
    fix = fixes.get(exc.errno, f"cannot be bound: {exc.strerror}")
    return AddressError(f"--bind {address} {fix}")


def in_use(address: str) -> AddressError:
    """The one line for an ipc `address` a live server accepts on (`still_listening`)."""
    return AddressError(f"--bind {address} is in use by a live server: stop it first, or bind "
                        "another address")  # fmt: skip


def still_listening(where: str) -> bool:
    """Whether a live process accepts connections on the ipc path `where` (False for any
    other transport, where a bind in use fails by itself). ZeroMQ binding an ipc path
    replaces its socket file: without this look, a second server (a copied config's, or a
    backup that took a stalled primary for dead) would take the address of a live one,
    whose new clients would then reach the second; the old one's connections stay on it."""
    if not where.startswith("ipc://"):
        return False
    path = where.removeprefix("ipc://")
    path = "\0" + path[1:] if path.startswith("@") else path  # Linux's abstract names
    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:  # no file, or a dead process's file: nobody accepts
            return False
    return True
