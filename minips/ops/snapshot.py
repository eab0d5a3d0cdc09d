"""A replica's whole state in one file: how a new backup joins a primary that has served.

The file is a checkpoint (minips.ops.checkpoint_file: the parameters, their versions, the
optimizer's state, the rule's `state()` as "rule/..." arrays), its meta holding what a
checkpoint leaves out and a replica needs (`replica`): the worker registry (ranks,
clocks, counts, each worker's `seq` bookkeeping and answered pushes, its owner), whether
the assembly goes on, the observers seen, the server's counters, and a group's root's
shard addresses (the shards' joins after it hold them too, within a second).

It is taken only at a *quiet* point (`quiet`): no push or pull held, no step half sent,
no stop begun, dense pulls. There a rule's state is all in `state()` (what a rule keeps
past one decision it writes for checkpoints; what it holds for a decision still open,
an ssgd round's pushes, exists only while a push is held), so the file is the whole state
and the inputs after it bring a new backup along (minips/ops/replication.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minips.ops.checkpoint_file import load_checkpoint, restore_store, save_store
from minips.ops.rule_state import load_rule_state, rule_state
from minips.state.registry import WorkerState
from minips.state.requests import Origin

if TYPE_CHECKING:
    from minips.server.server import ParameterServer

# WorkerState fields a snapshot keeps as they are (JSON values)
PLAIN = ("worker_id", "rank", "info", "alive", "finished", "refused", "observer", "clock",
         "steps", "pushes", "samples", "dropped", "extra_bytes_in", "pulls", "bytes_in",
         "bytes_out", "highest_seq")  # fmt: skip


def quiet(server: ParameterServer) -> bool:
    """Whether the server's whole state is in a snapshot (module docstring)."""
    if server.stop.requested or server.pulls.encoder is not None:
        return False
    workers = server.registry.by_id.values()
    return not any(w.held_pushes or w.held_pull or w.partial_step for w in workers)


def write_snapshot(server: ParameterServer, path: Path) -> Path:
    """The server's state, taken at a quiet point, written atomically to `path`."""
    counters = {f.name: getattr(server.ops.counters, f.name)
                for f in fields(server.ops.counters) if f.name != "started"}  # fmt: skip
    registry = server.registry
    replica = {
        "workers": [worker_record(worker) for worker in registry.by_id.values()],
        "assembling": registry.assembling,
        "observers_seen": server.membership.observers_seen,
        "counters": counters,
    }
    if (table := root_table(server)) is not None:  # a group's root: where its shards are
        replica["group"] = table.addresses()
    meta = {"rule": server.rule.name, "updates": counters["updates"],
            "samples": counters["samples"], "time": time.time(), "replica": replica}  # fmt: skip
    extra = {f"rule/{key}": array for key, array in rule_state(server.rule).items()}
    return save_store(server.store, path, meta, extra)


def read_snapshot(server: ParameterServer, path: Path) -> None:
    """Take the state of `write_snapshot`'s file: the server becomes the one that wrote it."""
    checkpoint = load_checkpoint(path)
    restore_store(server.store, checkpoint)
    load_rule_state(server.rule, checkpoint.section("rule/"))
    server.rule.restored = None  # its workers are live: none is forgotten for not saying hello
    replica = checkpoint.meta["replica"]
    now = time.monotonic()
    registry = server.registry
    registry.by_id = {r["worker_id"]: worker_of(r, now) for r in replica["workers"]}
    registry.assembling = replica["assembling"]
    server.membership.observers_seen = replica["observers_seen"]
    for name, value in replica["counters"].items():
        setattr(server.ops.counters, name, value)
    if (table := root_table(server)) is not None and "group" in replica:
        table.restore(replica["group"])


def root_table(server: ParameterServer) -> Any:
    """A group's root's table of its shards (group/shard.py RootTable; None elsewhere)."""
    return getattr(server.group, "table", None)


def worker_record(worker: WorkerState) -> dict[str, Any]:
    """One worker's registry entry as JSON values (its answered pushes as [seq, reply])."""
    record = {name: getattr(worker, name) for name in PLAIN}
    record["answered"] = [[seq, header] for seq, header in worker.answered.items()]
    origin = worker.origin
    record["origin"] = None if origin is None else {
        "routing_id": origin.routing_id.hex(),
        "key": None if origin.key is None else origin.key.decode("ascii"),
    }  # fmt: skip
    return record


def worker_of(record: dict[str, Any], now: float) -> WorkerState:
    """The registry entry of `worker_record`; heard from `now` (its silence counts afresh)."""
    worker = WorkerState(**{name: record[name] for name in PLAIN if name != "worker_id"},
                         worker_id=record["worker_id"], last_seen=now)  # fmt: skip
    worker.answered = OrderedDict((int(seq), header) for seq, header in record["answered"])
    if (origin := record["origin"]) is not None:
        key = origin["key"]
        worker.origin = Origin(bytes.fromhex(origin["routing_id"]), key and key.encode("ascii"))
    return worker


__all__ = ["quiet", "read_snapshot", "write_snapshot"]
