"""A server group's crash recovery under ssgd: the whole group goes back to one version.

Under ssgd a round is one version on every shard (docs/protocol.md 16.6), and every shard
checkpoints at the same versions, keeping the one before (minips.ops.group_checkpoints).
Restarting a crashed shard alone from its checkpoint at version c would tear the group:
its slices back at c, its peers' at v > c, and the round in flight at the crash applied on
some shards only. So `minips run` rolls the group back instead: it stops every other shard
(what they hold past c is dropped) and starts every shard again from its own checkpoint
at c, the highest version all of them can restart from (the run's start when one has no
checkpoint yet) below the round in flight. That round is based at b >= R - 1, R being the
highest version any shard reached (the workers wait for every shard's reply before their
next push), so c < R - 1. The workers ride through as with one restarted server: their
retries reach shards that forgot them, they say hello again (waiting while the root's
group re-forms), and every retry, based past c, is answered `bad_base` by every shard: the
round in flight is applied nowhere, and the workers pull version c and go on. Each
shard's restart is recorded (`rolled_back` for one that did not crash) with the updates
it lost.

Without such a version (a damaged file, a crash in the first rounds) or past the crashed
shard's restart budget, the caller restarts the crashed shard alone (minips.run.recovery)
and the run ends saying that its shards' versions differ (GroupCheckpoint.torn_line).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minips.ops.group_checkpoints import assemble
from minips.run.processes import ProcessGroup
from minips.run.recovery import ServerRestarts

if TYPE_CHECKING:
    from minips.run.replicas import ReplicaSet


class GroupRollback:
    """The group's restart of `names` (the root first, then shards 1..K-1), each with its
    ServerRestarts policy; `announce(line)` is told what a rollback costs."""

    def __init__(
        self,
        processes: ProcessGroup,
        names: list[str],
        policies: list[ServerRestarts],
        announce: Callable[[str], None],
        replicas: ReplicaSet | None = None,
    ) -> None:
        self.processes, self.names, self.policies = processes, names, policies
        self.announce, self.replicas = announce, replicas

    @classmethod
    def of(
        cls,
        rule: str,
        processes: ProcessGroup,
        names: list[str],
        policies: list[ServerRestarts],
        announce: Callable[[str], None],
        replicas: ReplicaSet | None = None,
    ) -> GroupRollback | None:
        """A run's group rollback: under ssgd, with every shard a child of this launcher
        (`minips launch` has the others started by the job); else None. With replicas a
        shard's failover is no crash (its backup is the shard's process then): only a
        shard that lost every replica rolls the group back, its backups stopped too."""
        if rule != "ssgd" or len(names) < 2 or len(names) != len(policies):
            return None
        return cls(processes, names, policies, announce, replicas)

    def recover(self) -> bool:
        """When a shard crashed, the whole group back to one version (module docstring).
        False when none crashed, or when the group cannot go back together: the caller
        then restarts the crashed shard alone, or ends the run."""
        children = [self.processes[name] for name in self.names]
        crashed = [j for j, child in enumerate(children)
                   if child.crashed() and not self._fails_over(j)]  # fmt: skip
        if not crashed or not all(self.policies[j].allows(children[j]) for j in crashed):
            return False
        # the backups first: a backup whose primary stopped answering would take over
        backups = self.replicas.live_backups() if self.replicas is not None else []
        alive = [*backups, *(child for child in children if not child.exited())]
        for child in alive:  # frozen: no checkpoint written while the version is chosen
            child.proc.send_signal(signal.SIGSTOP)
        try:
            common = self._common_versions(children)
        except BaseException:  # an interrupt, a file that cannot be read: they go on as they were
            _resume(alive)
            raise
        if not common:
            _resume(alive)
            return False
        for child in alive:
            child.proc.kill()  # SIGKILL reaches a stopped process
            child.proc.wait()
        if self.replicas is not None:  # each restarted primary gets a new backup
            self.replicas.roll_back(stopped=backups)
        version = max(common)
        for j, child in enumerate(children):  # the root first: the shards join it
            self.policies[j].prepare(child, at=version, rolled_back=j not in crashed)
            child.start(self.processes.logs, self.processes.env)
        lost = max(policy.restarts[-1].last_version for policy in self.policies) - version
        who = ", ".join("the root" if j == 0 else f"shard {j}" for j in crashed)
        self.announce(f"{who} crashed: the server group went back to version {version} on "
                      f"every shard ({lost} round(s) dropped), so its shards stay at one "
                      f"version")  # fmt: skip
        return True

    def _common_versions(self, children: list[Any]) -> set[int]:
        """The versions every shard can restart from, below the round in flight."""
        common = set.intersection(*(policy.versions() for policy in self.policies))
        reached = max(p.reached(child) for p, child in zip(self.policies, children, strict=True))
        return {version for version in common if version < reached - 1}

    def _fails_over(self, shard: int) -> bool:
        """Whether shard `shard` has a backup that takes over from its crashed primary."""
        return self.replicas is not None and self.replicas.backs_up(shard)


def _resume(children: list[Any]) -> None:
    """Let frozen children run again (a stopped process would ignore the SIGTERM that
    stops a run and be killed without its final checkpoint)."""
    for child in children:
        child.proc.send_signal(signal.SIGCONT)


def final_group_checkpoint(
    checkpoint: str | Path, restarts: list[dict[str, Any]], announce: Callable[[str], None]
) -> dict[str, Any] | None:
    """The group checkpoint a run ends with, made of each shard's last file; its record
    for the summary (GroupCheckpoint.record; None without shard files). Shards left at
    different versions by a restart are announced in one line (without a restart they
    may differ by the plan alone: a parameter pushed less often is its shard's count)."""
    group = assemble(checkpoint, final=True)
    if group is None:
        return None
    if group.torn_line() is not None and restarts:
        announce(group.torn_line())
    return group.record()
