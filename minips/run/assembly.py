"""minips's public `PSClient` and `ParameterServer`: the core's two classes with the usual
parts attached, for a user who writes `from minips import PSClient, ParameterServer`; and
its `ServerOptions`, the core's with the usual operations' settings (OpsOptions).

The core's classes are given what is not the idea by whoever builds them, so that the core
imports no operation (docs/architecture.md): a server its operations (checks, limits,
failures, telemetry, checkpoints: minips/ops/server_ops.py), a client its way to a server
group (minips/group/root.py). This is the one place that builds both whole, as `minips run`
and `minips worker` do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minips.group.root import GROUPS
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.server.seams import Operations
from minips.server.server import ParameterServer as CoreServer
from minips.worker.client import PSClient as CoreClient
from minips.worker.session import GroupSide

# The public ServerOptions: the core's settings and the usual operations' (checkpoints,
# the sample budget, clipping), which `ServerOps` reads.
ServerOptions = OpsOptions


class ParameterServer(CoreServer):
    """The core's ParameterServer (minips/server/server.py) with the usual operations,
    `ServerOps`, unless it is given others: `ParameterServer(params, rule, optimizer)`."""

    def __init__(
        self, *args: Any, operations: Callable[..., Operations] = ServerOps, **kwargs: Any
    ) -> None:
        super().__init__(*args, operations=operations, **kwargs)


class PSClient(CoreClient):
    """The core's PSClient (minips/worker/client.py) that reaches a server group too
    (`groups=GROUPS` unless it is given other groups, or None to refuse one)."""

    def __init__(self, *args: Any, groups: GroupSide | None = GROUPS, **kwargs: Any) -> None:
        super().__init__(*args, groups=groups, **kwargs)
