"""How a server runs (ServerOptions), and the config it sends every worker (hello_config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from minips.errors import ConfigError
from minips.protocol import auth
from minips.protocol.wire import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class ServerOptions:
    """How a server runs (not what it trains): address, cluster size, timers, checkpoint.

    bind: the address to listen on ("tcp://127.0.0.1:*" picks a free port). world_size:
    ranks 0..world_size-1 (None: no limit). heartbeat_timeout: seconds of silence before a
    worker is declared dead. checkpoint_path: where the final checkpoint is written (how
    often else, and a resume: the operations' OpsOptions, minips/ops/ops_options.py).
    stop_grace: seconds a stopping server waits for clients to leave. observers_awaited:
    the stop once every rank finished waits until this many observers have said hello
    (docs/protocol.md 5.6). poll_interval: seconds between looks at the clock when idle.
    """

    bind: str = "tcp://127.0.0.1:*"
    world_size: int | None = None
    heartbeat_timeout: float = 30.0  # > a client's reply timeout (10 s): docs/protocol.md 7
    checkpoint_path: str | Path | None = None
    observers_awaited: int = 0
    limits: Limits = DEFAULT_LIMITS
    stop_grace: float = 5.0
    poll_interval: float = 0.05
    keys: auth.ServerSocketKeys | None = None  # CURVE: guard/curve.py's ServerKeys
    send_hwm: int = 32  # replies queued per connection before ZeroMQ drops (docs/protocol.md 10)

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")


def hello_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of the config sent in `hello`; ConfigError unless msgpack can send it."""
    config = dict(config or {})
    try:
        msgpack.packb(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"server config must be msgpack-serialisable: {exc}") from None
    return config
