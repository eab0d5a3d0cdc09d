"""A real ParameterServer in a background thread, for checks that run a student's worker.

The one place where the exercise checker builds a server, so that a change of the server's
constructor is one edit here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.rules import make_rule
from minips.server.server import ParameterServer
from minips.state.store import SGD


@contextlib.contextmanager
def serving(
    params: dict[str, np.ndarray],
    config: dict[str, Any],
    lr: float = 0.5,
    max_samples: int = 0,
) -> Iterator[ParameterServer]:
    """An asgd server on a free loopback port, one worker, plain SGD; stopped on exit."""
    server = ParameterServer(
        params,
        make_rule("asgd"),
        SGD(params, lr=lr, momentum=0.0),
        OpsOptions(
            bind="tcp://127.0.0.1:*",
            world_size=1,
            heartbeat_timeout=30.0,
            stop_grace=5.0,
            poll_interval=0.02,
            max_samples=max_samples,
        ),
        config=config,
        operations=ServerOps,
    )
    thread = threading.Thread(target=server.run, name="exercise-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.request_stop()
        thread.join(timeout=10)
        server.close()
