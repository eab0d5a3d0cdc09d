"""A worker's side of a server group: one request per shard, all sent, then all replies.

When the root's hello reply carries `group` (docs/protocol.md 16.4), `PSClient` makes a
`GroupClient` its session (minips.worker.session) and hands it every later call, so a
caller never sees the group:

    push(grads, base, pull_since=v)
      -> split every gradient by the partition (rows of split parameters: views, no copy)
      -> one push per shard that holds a slice, a pull to each shard that does not
      -> send them all, then poll all the sockets (`exchange`, minips.group.connections:
         the shards work at once; a shard that does not answer in time is retried alone,
         Lazy Pirate)
      -> merge: the replies' slices back into whole parameters, one version per shard

A group's version is a `GroupVersion`, one shard version each; the caller passes it back
as `base` and `since` exactly as a plain server's integer, and int() of it is the root's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from minips.group.agreements import GROUP_ERROR, HELLO_RETRY, check_shard_hello, reach
from minips.group.connections import Connection, Request, exchange
from minips.group.partition import Partition, partition, sample_rows
from minips.protocol import wire
from minips.protocol.sampling import Sampler
from minips.protocol.wire import Message, ProtocolError
from minips.transmission.codecs import Encoder, Factors, Gradient, Spec
from minips.transmission.codecs.base import dense_float32
from minips.worker.replies import PullReply, PushReply, ServerError
from minips.worker.session import fused_pull

# `client` below is the PSClient whose calls a group serves (not imported: it imports this).
PSClient = Any

log = logging.getLogger("minips.client")


class GroupVersion(tuple):
    """A group's version: one `version` per shard, in shard order (docs/protocol.md 16.5).

    Pass it back as `base` / `since` like a plain server's version; int() is the root's.
    """

    def __int__(self) -> int:
        return int(self[0])


def _per_shard(value: Any, servers: int) -> list[Any]:
    """A version as the caller gives it (GroupVersion, an int for every shard, or None)."""
    if isinstance(value, tuple):
        if len(value) != servers:
            raise ValueError(f"a version of {len(value)} shards for a group of {servers}")
        return list(value)
    return [value] * servers


def model_shapes(spec: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The parameter shapes (model order) of the zoo model hello's `config.model` names."""
    from minips.nn import build_model

    model = build_model(spec["name"], seed=0, **spec.get("kwargs", {}))
    return {name: array.shape for name, array in model.params.items()}


class GroupClient:
    """The group behind a PSClient (see the module docstring); built from the root's hello.

    Holds one Connection and one Encoder (codec state: top-k's residual, per slice) per
    shard, each shard's last version, and the last whole array handed out of each split
    parameter (a pull in which only some of its shards changed fills the rest from it).
    """

    def __init__(self, client: PSClient, group: Mapping[str, Any]) -> None:
        self.client = client
        self.servers = int(group["servers"])
        self.addresses = [
            reach(address, client.address) if address else "" for address in group["addresses"]
        ]
        self.addresses[0] = client.address
        self.connections = [
            Connection(client._context, address, client.routing_id, client.limits, client.keys)
            for address in self.addresses
        ]
        self.encoders = [Encoder() for _ in range(self.servers)]
        self.versions: list[int] = [0] * self.servers
        self.latest: dict[str, np.ndarray] = {}  # split parameter -> last whole array sent up
        self.open_steps: set[int] = set()  # shards holding `last: false` pushes of this step
        self.info: dict[str, Any] = {}
        self.root_reply: dict[str, Any] = {}
        self.partition: Partition | None = None  # known once joined (an operator needs none)
        self.sampler: Sampler | None = None
        self.one_version = False  # ssgd's: set at join

    @classmethod
    def refreshed(
        cls, known: GroupClient | None, client: PSClient, group: Mapping[str, Any]
    ) -> GroupClient:
        """An operator's view of a group: `known` when its addresses are still the root's
        latest (joins happen while a group starts), else a new one."""
        fresh = cls(client, group)
        if known is not None and known.addresses == fresh.addresses:
            return known
        if known is not None:
            known.close()
        return fresh

    # ------------------------------------------------------------------------- the calls
    def join(self, root_reply: dict[str, Any], info: dict[str, Any]) -> None:
        """hello to every shard but the root, with the root's rank (docs/protocol.md 16.4);
        the partition from the model the config names."""
        self.root_reply = root_reply
        config = root_reply["config"]
        self.partition = partition(model_shapes(config["model"]), self.servers)
        rule = config.get("rule") or {}
        # ssgd's shards keep one version (a crash takes them all back together, 16.9)
        self.one_version = rule.get("name") == "ssgd"
        if rule.get("name") == "vsgd":
            self.sampler = Sampler(rule["rho"], rule["min_samples"])
        self.versions[0] = int(root_reply["version"])
        self.info = dict(info)
        if info.get("role") != "observer":
            self.info["rank"] = root_reply["rank"]
        header = {"op": "hello", "worker": self.client.worker_id, "info": self.info}
        replies = self._exchange({j: (header, []) for j in range(1, self.servers)})
        for shard, message in replies.items():
            self._raise_error(shard, message)
            self.versions[shard] = int(message.header["version"])
            why = check_shard_hello(message.header, root_reply, shard)
            if why is not None:
                raise _group_error(f"shard {shard} at {self.addresses[shard]} {why}")

    def pull(self, since: Any) -> PullReply:
        """One pull per shard, `since` that shard's version; the merged reply."""
        sinces = _per_shard(since, self.servers)
        requests = {
            j: ({"op": "pull", "worker": self.client.worker_id, "since": sinces[j]}, [])
            for j in range(self.servers)
        }
        return self._merge_pulls(self._worker_exchange(requests))

    def push(
        self,
        grads: Mapping[str, Gradient],
        base: Any,
        extra: dict[str, np.ndarray] | None,
        last: bool,
        codecs: Mapping[str, Spec] | None,
        samples: int | None,
        pull_since: Any,
        loss: float | None = None,
    ) -> PushReply:
        """The push of PSClient.push, one per shard (module docstring); pull_since may be
        NO_PULL (minips.worker.session)."""
        since, fused = fused_pull(pull_since)
        bases, sinces = _per_shard(base, self.servers), _per_shard(since, self.servers)
        seq = self.client.next_seq()
        requests: dict[int, Request] = {}
        extras = self._split_extras(extra or {})
        for shard, slices in enumerate(self._split_grads(grads)):
            if not slices and not (last and shard in self.open_steps):
                if fused:
                    header = {"op": "pull", "worker": self.client.worker_id, "since": sinces[shard]}
                    requests[shard] = (header, [])
                continue
            header = {"op": "push", "worker": self.client.worker_id, "seq": seq,
                      "base": bases[shard], "last": last}  # fmt: skip
            if last:  # every shard counts the step's samples and watches its loss
                header.update(
                    {k: v for k, v in (("samples", samples), ("loss", loss)) if v is not None}
                )
            if fused:
                header["pull_since"] = sinces[shard]
            requests[shard] = (header, self._encode(shard, slices, extras[shard], codecs))
        replies = self._behind_pulled(self._worker_exchange(requests, behind_ok=True))
        for shard, message in replies.items():
            if message.op == "push":
                (self.open_steps.discard if last else self.open_steps.add)(shard)
        pushed = [m.header for m in replies.values() if m.op == "push"]
        stop = any(m.header.get("stop") for m in replies.values())
        version = self._version(replies)
        pulled = self._merge_pulls(replies) if fused else None
        return PushReply(
            version=pulled.version if pulled is not None else version,
            applied=any(h["applied"] for h in pushed),
            staleness=max(h["staleness"] for h in pushed),
            stop=stop,
            pull=pulled,
        )

    def ping(self) -> bool:
        """A heartbeat to every shard; whether any says stop."""
        header = {"op": "ping", "worker": self.client.worker_id}
        return any(m.header["stop"] for m in self.worker_each(header).values())

    def bye(self, header: dict[str, Any]) -> None:
        self.each(header)

    def operator(self, header: dict[str, Any]) -> dict[int, Message]:
        """An operator's request to every shard at once (all joined: the hello said so)."""
        return self.each(header)

    def others(self, header: dict[str, Any]) -> dict[int, Message]:
        """An operator's request to every shard but the root that has joined; one that does
        not answer is left out (it may have stopped)."""
        joined = [j for j in range(1, self.servers) if self.addresses[j]]
        return self.each(header, joined, tolerate=True)

    def each(
        self, header: dict[str, Any], shards: Any = None, tolerate: bool = False
    ) -> dict[int, Message]:
        """The same request (ping, bye, stats, stop, checkpoint) to every shard (or to
        `shards`); error replies raise ServerError; with `tolerate`, a shard that does not
        answer is left out instead of raising ServerUnavailable."""
        targets = range(self.servers) if shards is None else shards
        client = self.client
        requests = dict.fromkeys(targets, (header, []))
        replies = exchange(self.connections, requests, client.timeout, client.retries,
                           client.link, tolerate)  # fmt: skip
        for shard, message in replies.items():
            self._raise_error(shard, message)
        return replies

    def worker_each(self, header: dict[str, Any]) -> dict[int, Message]:
        """A worker's request without arrays (ping) to every shard, saying hello again to
        a shard that forgot us (16.4); error replies raise ServerError."""
        return self._worker_exchange(dict.fromkeys(range(self.servers), (header, [])))

    def bytes_sent(self) -> dict[str, int]:
        """Array bytes pushed per parameter (all its slices) and extra, over all shards."""
        total: dict[str, int] = {}
        for encoder in self.encoders:
            for name, nbytes in encoder.bytes_sent.items():
                total[name] = total.get(name, 0) + nbytes
        return total

    def close(self) -> None:
        for connection in self.connections:
            connection.abandon()

    # ------------------------------------------------------------------------- machinery
    def _exchange(self, requests: Mapping[int, Request]) -> dict[int, Message]:
        client = self.client
        return exchange(self.connections, requests, client.timeout, client.retries, client.link)

    def _behind_pulled(self, replies: dict[int, Message]) -> dict[int, Message]:
        """A push some shards applied and others answered `bad_base` (restarted from an
        older checkpoint, 7): it is not sent again (the shards that applied it would apply
        it twice); each shard behind is pulled whole instead, its reply in the push's
        place, so the next push is based on its version. ServerError (the caller pulls and
        computes again) when no shard applied it, or under ssgd, whose shards go back
        together and must stay at one version."""
        behind = [j for j, m in replies.items() if m.header.get("code") == "bad_base"]
        if not behind:
            return replies
        applied = any(m.op == "push" and m.header.get("applied") for m in replies.values())
        if self.one_version or not applied:
            self._raise_error(behind[0], replies[behind[0]])
        log.warning("shard(s) %s went back to an older version: pulled again", behind)
        pull = {"op": "pull", "worker": self.client.worker_id, "since": None}
        return {**replies, **self._worker_exchange(dict.fromkeys(behind, (pull, [])))}

    def _worker_exchange(
        self, requests: Mapping[int, Request], behind_ok: bool = False
    ) -> dict[int, Message]:
        """`_exchange`, saying hello again to a shard that forgot us (docs/protocol.md 16.4)
        and repeating its request there; other error replies raise ServerError (but for
        `bad_base` with `behind_ok`: the push's to handle, `_behind_pulled`)."""
        replies = self._exchange(requests)
        for _ in range(self.client.retries):
            forgot = [j for j, m in replies.items() if m.header.get("code") == "unknown_worker"]
            if not forgot:
                break
            log.warning("shard(s) %s do not know worker %s any more: saying hello again",
                        forgot, self.client.worker_id)  # fmt: skip
            self._hello_again(forgot)
            replies.update(self._exchange({j: requests[j] for j in forgot}))
        for shard, message in replies.items():
            if not (behind_ok and message.header.get("code") == "bad_base"):
                self._raise_error(shard, message)
            if "version" in message.header:
                self.versions[shard] = int(message.header["version"])
        return replies

    def _hello_again(self, shards: list[int]) -> None:
        """hello to `shards`, which forgot us (a restart), as at join (16.4). A restarted
        root answers `group` until its shards joined it again: ask again every HELLO_RETRY
        s for at most the client's `assemble_timeout` s, as a first hello does (16.3)."""
        hello = {"op": "hello", "worker": self.client.worker_id, "info": self.info}
        deadline = time.monotonic() + self.client.assemble_timeout
        while shards:
            replies = self._exchange(dict.fromkeys(shards, (hello, [])))
            shards = [j for j, m in replies.items() if m.header.get("code") == GROUP_ERROR]
            for shard, message in replies.items():
                if shard not in shards or time.monotonic() > deadline:
                    self._raise_error(shard, message)
            if shards:
                time.sleep(HELLO_RETRY)

    def _raise_error(self, shard: int, message: Message) -> None:
        if message.op == "error":
            reason = f"{message.header['reason']} (shard {shard} of {self.servers})"
            raise ServerError(reason, message.header["code"])

    def _version(self, replies: Mapping[int, Message]) -> GroupVersion:
        return GroupVersion(
            int(replies[j].header["version"]) if j in replies else self.versions[j]
            for j in range(self.servers)
        )

    def _split_grads(self, grads: Mapping[str, Gradient]) -> list[dict[str, Gradient]]:
        """Each shard's slices of the gradients (views; sf factors: x's columns of the rows)."""
        parts: list[dict[str, Gradient]] = [{} for _ in range(self.servers)]
        for name, grad in grads.items():
            if name not in self.partition.shapes:  # what a server would answer (section 9)
                raise ProtocolError(f"gradient for unknown parameter {name!r}", "unknown_param")
            for piece in self.partition.slices(name):
                if isinstance(grad, Factors) and not piece.whole:
                    parts[piece.shard][name] = Factors(grad.x[:, piece.start : piece.stop], grad.dy)
                else:
                    parts[piece.shard][name] = piece.of(grad)
        return parts

    def _split_extras(self, extra: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each shard's extras: VSGD's samples by the coordinates of its slices (16.6),
        any other extra to every shard."""
        parts: list[dict[str, np.ndarray]] = [{} for _ in range(self.servers)]
        for key, values in extra.items():
            name = key.removeprefix("sample/")
            if self.sampler is None or name == key or name not in self.partition.shapes:
                for part in parts:
                    part[key] = values
                continue
            size = int(np.prod(self.partition.shapes[name], dtype=np.int64))
            indices = self.sampler.indices(name, size)
            for piece in self.partition.slices(name):
                parts[piece.shard][key] = values[sample_rows(indices, piece)]
        return parts

    def _encode(
        self,
        shard: int,
        grads: dict[str, Gradient],
        extra: dict[str, np.ndarray],
        codecs: Mapping[str, Spec] | None,
    ) -> list[wire.WirePart]:
        """A shard's push as wire parts; its encoder keeps the slices' codec state."""
        encoder = self.encoders[shard]
        if codecs:
            coded = encoder.encode(grads, codecs)
        else:
            coded = [wire.WirePart(n, dense_float32(g)) for n, g in grads.items()]
            encoder.count(coded)
        plain = [wire.WirePart(f"extra/{key}", a) for key, a in extra.items()]
        encoder.count(plain)
        return coded + plain

    def _merge_pulls(self, replies: Mapping[int, Message]) -> PullReply:
        """The shards' pull halves as one reply: whole parameters, their deltas offset to
        positions in the whole parameter, the version of every shard."""
        pulled = {j: m for j, m in replies.items() if "param_versions" in m.header}
        pieces: dict[str, dict[int, np.ndarray]] = {}
        deltas: dict[str, dict[str, list[np.ndarray]]] = {}
        param_versions: dict[str, int] = {}
        for shard, message in pulled.items():
            for name, version in message.header["param_versions"].items():
                param_versions[name] = max(version, param_versions.get(name, 0))
            for name, array in message.arrays.items():
                pieces.setdefault(name, {})[shard] = array
            for name, parts in message.parts.items():
                if message.codecs[name] == "delta":
                    offset = self.partition_slice(name, shard).offset
                    entry = deltas.setdefault(name, {"indices": [], "values": []})
                    entry["indices"].append(parts["indices"].astype(np.int64) + offset)
                    entry["values"].append(parts["values"].astype(np.float32))
        params = {name: self._whole(name, by_shard) for name, by_shard in pieces.items()}
        merged = {
            name: {key: np.concatenate(chunks) for key, chunks in entry.items()}
            for name, entry in deltas.items()
        }
        for name, entry in merged.items():
            if name in self.latest:  # what the caller now holds, for the next partial pull
                updated = self.latest[name].copy()
                updated.reshape(-1)[entry["indices"]] += entry["values"]
                self.latest[name] = updated
        stop = any(m.header.get("stop") for m in pulled.values())
        return PullReply(self._version(replies), params, param_versions, stop, merged)

    def partition_slice(self, name: str, shard: int):
        """Shard `shard`'s slice of parameter `name`."""
        return next(s for s in self.partition.slices(name) if s.shard == shard)

    def _whole(self, name: str, by_shard: dict[int, np.ndarray]) -> np.ndarray:
        """Parameter `name` from the slices that came; remembered when it is split."""
        if len(self.partition.slices(name)) == 1:
            return next(iter(by_shard.values()))
        floats = {j: np.asarray(a, np.float32) for j, a in by_shard.items()}
        whole = self.partition.assemble(name, floats, self.latest.get(name))
        whole.flags.writeable = False
        self.latest[name] = whole
        return whole


def _group_error(reason: str) -> Exception:
    return ServerError(reason, "group")
