"""minips's public `PSClient`, `ParameterServer` and `Worker`: the core's classes with the
usual parts attached, for a user who writes `from minips import PSClient, ParameterServer`;
and its `ServerOptions`, the core's with the usual operations' settings (OpsOptions).

The core's classes are given what is not the idea by whoever builds them, so that the core
imports no operation (docs/architecture.md): a server its operations (checks, limits,
failures, telemetry, checkpoints: minips/ops/server_ops.py), a client its retries and
its way to a server group (minips/ops/client_retries.py, minips/group/root.py), a worker
the machine's datasets (minips/provision/locations.py) and hello's reply and plan checked
(minips/run/hello_checks.py, plan_checks.py). This is the one place that
builds them whole, as `minips run` and `minips worker` do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minips.data.datasets import FindData
from minips.group.root import GROUPS
from minips.ops.client_retries import RetryingClient
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.provision.locations import find_data
from minips.run.hello_checks import check_hello
from minips.run.plan_checks import checked_plan
from minips.server.seams import Operations
from minips.server.server import ParameterServer as CoreServer
from minips.transmission.plan import Plan
from minips.worker.session import GroupSide
from minips.worker.worker import Worker as CoreWorker

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


class PSClient(RetryingClient):
    """The core's PSClient (minips/worker/client.py) that says hello again, explains silence
    (RetryingClient, minips/ops/client_retries.py) and reaches a server group too
    (`groups=GROUPS` unless it is given other groups, or None to refuse one)."""

    def __init__(self, *args: Any, groups: GroupSide | None = GROUPS, **kwargs: Any) -> None:
        super().__init__(*args, groups=groups, **kwargs)


class Worker(CoreWorker):
    """The core's Worker (minips/worker/worker.py) that finds the dataset where `minips
    worker` does (`find_data=find_data`: the system and cache directories too)."""

    def __init__(self, *args: Any, find_data: FindData | None = find_data, **kwargs: Any) -> None:
        super().__init__(*args, find_data=find_data, **kwargs)

    def take_hello(self, hello: dict[str, Any]) -> dict[str, Any]:
        """hello's reply, its form checked (one-line ProtocolError naming the field)."""
        check_hello(hello)
        return hello

    def take_plan(self, config: dict[str, Any]) -> Plan:
        """The plan hello's config carries, checked as a run checks its own (one-line
        ConfigError): the server may be another implementation, or a hostile one."""
        return checked_plan(config.get("plan"), self.model)
