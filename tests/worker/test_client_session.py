"""PSClient chooses its session once, at hello: one server (OneServer) or a server group
(through the `groups` it was given: minips.group.root.GROUPS), a client of one server
never loads the group's side, and one given no `groups` says so when it meets a group."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from group_support import running_group

from minips.errors import ConfigError
from minips.group.root import ServerGroups
from minips.worker.client import OneServer, PSClient

TESTS = Path(__file__).resolve().parents[1]  # tests/: its shared support


class RecordingGroups(ServerGroups):
    """minips.group's side, counting the groups a client joined and the times an operator's
    request went on to the other shards."""

    def __init__(self) -> None:
        self.joined = self.reached = 0

    def join(self, client, root_reply, info):
        self.joined += 1
        return super().join(client, root_reply, info)

    def others(self, client, header, group):
        self.reached += 1
        return super().others(client, header, group)


def test_a_client_of_one_server_never_loads_the_groups_side():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import numpy as np
        from test_server_support import SHAPES, running_server
        from minips.worker.client import OneServer, PSClient
        with running_server() as server, PSClient(server.endpoint) as ps:
            ps.hello()
            grads = {{n: np.ones(s, np.float32) for n, s in SHAPES.items()}}
            assert ps.push(grads, base=ps.pull().version, pull_since=0).applied
            ps.ping(); ps.stats(); ps.bye()
            assert isinstance(ps.session, OneServer) and ps.group is None
        print(sorted(m for m in sys.modules if m in (
            "minips.group.root", "minips.group.fanout", "minips.group.connections")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_hello_hands_every_call_to_the_group_side_it_was_given():
    groups = RecordingGroups()
    with running_group(2, workers=1) as group:
        with PSClient(group.root.endpoint, groups=groups) as ps:
            assert isinstance(ps.session, OneServer)
            ps.hello()
            assert groups.joined == 1 and ps.session is ps.group
            assert ps.pull().version == (0, 0) and not ps.ping()
            assert len(ps.stats()["shards"]) == 2  # every shard at once: no operator's view
            assert groups.reached == 0
            with PSClient(group.root.endpoint, groups=groups) as operator:
                shards = operator.stats()["shards"]  # an operator: the root, then its shards
                assert [s is not None for s in shards] == [True, True] and groups.reached == 1
                assert isinstance(operator.session, OneServer) and operator.group is None
            ps.bye()


def test_a_client_given_no_groups_says_so_when_it_meets_a_group():
    """Whoever builds a client that may meet a group gives it the group's side; a plain
    PSClient(address) refuses a group's root (a worker's call or an operator's) in one
    line."""
    with running_group(2, workers=1) as group:
        for call in ("hello", "stats"):
            with PSClient(group.root.endpoint) as ps, pytest.raises(ConfigError) as err:
                getattr(ps, call)()
            assert "groups=minips.group.root.GROUPS" in str(err.value)
            assert ps.group is None
