"""A parameter server and its workers in one file, speaking minips's real protocol.

Read this first: pyzmq, NumPy and msgpack only, yet a real `minips worker` trains against
this server and this worker against `minips server` (docs/protocol.md is their wire). It
shows hello (rank, config), tau = t - base (the updates a gradient missed), one round trip
per step (push and pull fused), the delay-penalized rules dasgd and vsgd (docs/algorithms.md)
and per-layer codecs (top-k with error feedback, fp16). Left out: retries, exactly-once
(minips/worker/client.py); held replies, liveness, stop, checkpoints, momentum, steps in
several pushes, hostile messages (minips/server/); other rules, codecs, models (minips/).

    python examples/00_tiny_ps.py [--rule vsgd] [--fast]   a server and 3 workers, one process
    python examples/00_tiny_ps.py server --address tcp://127.0.0.1:5555 --workers 1
    python examples/00_tiny_ps.py worker --address tcp://127.0.0.1:5555   (or: minips worker)
"""

import argparse
import gzip
import math
import threading
import zlib
from pathlib import Path

import msgpack
import numpy as np
import zmq

Frame = tuple[dict, np.ndarray]  # an array's descriptor (protocol.md 4) and the array
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "minips" / "sample"  # the bundled data
RULES = {"dasgd": {"name": "dasgd", "schedule": "inverse"},
         "vsgd": {"name": "vsgd", "rho": 0.01, "min_samples": 32, "step_decay": 0.9}}  # fmt: skip
PLAN = {"format": 1, "params": {"fc1.w": {"push": {"codec": "topk", "ratio": 0.1}},
                                "fc2.w": {"push": "fp16"}}}  # fmt: skip
CONFIG = {"model": {"name": "mlp", "kwargs": {"hidden": [64]}}, "dataset": "sample",
          "epochs": 1, "batch_size": 32, "seed": 0, "lr": 0.1, "plan": PLAN}  # fmt: skip


def frame(name: str, array: np.ndarray, codec: str = "dense", part: str = "", of=()) -> Frame:
    """One array's descriptor; each part of a multi-part codec also carries `of`."""
    desc = {"name": name, "dtype": str(array.dtype), "shape": list(array.shape), "codec": codec}
    return ({**desc, "part": part, "of": list(of)} if part else desc), array


def pack(header: dict, frames: list[Frame] | tuple = ()) -> list[bytes]:
    """A msgpack header, then each array's raw bytes: no pickle, no framing of our own."""
    head = {"v": 1, **header, **({"arrays": [desc for desc, _ in frames]} if frames else {})}
    return [msgpack.packb(head)] + [np.ascontiguousarray(a).tobytes() for _, a in frames]


def unpack(frames: list[bytes]) -> tuple[dict, dict[str, np.ndarray]]:
    """The header, and each array as dense float32 (top-k, delta: zeros but at the indices)."""
    header, tensors = msgpack.unpackb(frames[0]), {}
    for desc, raw in zip(header.get("arrays", []), frames[1:], strict=True):
        array, name = np.frombuffer(raw, desc["dtype"]).reshape(desc["shape"]), desc["name"]
        if desc.get("part") == "indices":  # the values come next (protocol.md 13.1)
            tensors[name], where = np.zeros(desc["of"], np.float32), array
        elif desc.get("part") == "values":
            tensors[name].flat[where] = array
        else:
            tensors[name] = array.astype(np.float32)  # a copy: ours to change
    return header, tensors


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """Mean softmax cross-entropy of the MLP (Dense, ReLU, ..., Dense) and its gradients."""
    n_layers, acts = len(params) // 2, [x]  # acts[i]: the input of layer i + 1
    for i in range(1, n_layers + 1):
        z = acts[-1] @ params[f"fc{i}.w"] + params[f"fc{i}.b"]
        acts.append(np.maximum(z, 0) if i < n_layers else z)
    z = acts[-1] - acts[-1].max(axis=1, keepdims=True)  # logits (B, 10), shifted: no overflow
    e = np.exp(z)
    loss = float(np.mean(np.log(e.sum(axis=1)) - z[np.arange(len(y)), y]))
    dz = (e / e.sum(axis=1, keepdims=True) - np.eye(z.shape[1], dtype=np.float32)[y]) / len(y)
    grads = {}  # dz holds the 1/B: a push carries the gradient of the mean (model.md 2)
    for i in range(n_layers, 0, -1):
        grads[f"fc{i}.w"], grads[f"fc{i}.b"] = acts[i - 1].T @ dz, dz.sum(axis=0)
        dz = (dz @ params[f"fc{i}.w"].T) * (acts[i - 1] > 0)  # back through the ReLU
    return loss, grads


def load_shard(config: dict, rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's training images (N, 784), normalised (model.md 4.1), and labels (N,):
    every W-th example, simpler than model.md 4.2's shards (any disjoint split trains)."""
    read = [gzip.decompress((Path(config.get("data_dir") or SAMPLE_DIR) / name).read_bytes())
            for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")]  # fmt: skip
    pixels = np.frombuffer(read[0], np.uint8, offset=16).reshape(-1, 784).astype(np.float32)
    x = pixels * np.float32(1 / (255 * 0.3530)) - np.float32(0.2860 / 0.3530)  # Fashion-MNIST's
    labels = np.frombuffer(read[1], np.uint8, offset=8).astype(np.int64)  # 16, 8: IDX headers
    return x[rank::world_size], labels[rank::world_size]


def vsgd_sample(name: str, size: int, rule: dict) -> np.ndarray:
    """S_P (protocol.md 6.4): the k coordinates with the smallest SplitMix64 keys seeded by
    the CRC-32 of the name; integer arithmetic, so a worker in any language picks the same."""
    k = min(size, max(rule["min_samples"], math.ceil(rule["rho"] * size)))
    steps = np.arange(1, size + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = np.uint64(zlib.crc32(name.encode())) + steps  # wraps mod 2^64, as it should
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.sort(np.argsort(z ^ (z >> np.uint64(31)))[:k])  # ascending coordinates


def encode(name: str, grad: np.ndarray, spec: str | dict, residual: dict) -> list[Frame]:
    """A gradient's frames by its plan's push spec: dense, fp16, or top-k with error feedback."""
    codec = spec if isinstance(spec, str) else spec["codec"]
    if codec != "topk":
        return [frame(name, grad.astype(np.float16 if codec == "fp16" else np.float32), codec)]
    a = residual.get(name, 0) + grad.reshape(-1)  # a = r + g: what earlier steps did not send
    k = math.ceil(spec["ratio"] * a.size)
    indices = np.sort(np.argpartition(np.abs(a), -k)[-k:]).astype(np.int32)
    values, a[indices] = a[indices], 0  # r <- a but the sent entries: delayed, never lost
    residual[name], of = a, grad.shape
    return [frame(name, indices, "topk", "indices", of), frame(name, values, "topk", "values", of)]


# ------------------------------------------------------------------------------ the server
class Refused(Exception):
    """Refused(code, reason): the error reply of protocol.md 9; nothing changes."""


class TinyServer:
    """The parameters and their version t; applies each push at once, as the rule scales it."""

    def __init__(self, rule: str, world_size: int) -> None:
        self.rule = RULES[rule]
        self.config = {**CONFIG, "rule": self.rule, "world_size": world_size}  # hello adds rank
        rng, sizes, self.params = np.random.default_rng(0), [784, 64, 10], {}  # the model's
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False), 1):  # He-normal
            w = rng.standard_normal((n_in, n_out), np.float32) * np.float32(math.sqrt(2 / n_in))
            self.params[f"fc{i}.w"], self.params[f"fc{i}.b"] = w, np.zeros(n_out, np.float32)
        self.versions = dict.fromkeys(self.params, 0)  # when each parameter last changed
        self.t, self.world_size, self.ranks = 0, world_size, {}  # ranks: worker id -> rank
        sampled = self.params.items() if rule == "vsgd" else ()  # vsgd: S_P of each parameter
        self.samples = {n: vsgd_sample(n, p.size, self.rule) for n, p in sampled}
        self.step_p, self.losses, self.byes = {}, [], 0

    def serve(self, sock: zmq.Socket) -> None:
        """Answer every request at once, until every rank has said bye."""
        while self.byes < self.world_size:
            identity, *frames = sock.recv_multipart()  # ROUTER: the sender's id comes first
            header, tensors = unpack(frames)
            try:
                reply, arrays = self.handle(header, tensors)
            except Refused as error:
                reply, arrays = {"op": "error", "code": error.args[0], "reason": error.args[1]}, []
            rid = {"rid": header["rid"]} if "rid" in header else {}  # how replies are matched
            sock.send_multipart([identity, *pack({**reply, **rid}, arrays)])
        loss = [f"{np.mean(part or [0]):.3g}" for part in (self.losses[:5], self.losses[-5:])]
        print(f"server: {self.t} updates applied, rule {self.rule['name']}, loss reported "
              f"{loss[0]} -> {loss[1]}\n", end="")  # in one write: threads print too  # fmt: skip

    def handle(self, header: dict, tensors: dict) -> tuple[dict, list[Frame]]:
        """hello, pull, push or bye: the op's method."""
        if (op := header["op"]) not in ("hello", "pull", "push", "bye"):
            raise Refused("unknown_op", f"this tiny server does not do {op!r}")
        self.byes += op == "bye"
        return ({"op": "bye"}, []) if op == "bye" else getattr(self, op)(header, tensors)

    def hello(self, header: dict, _: dict) -> tuple[dict, list[Frame]]:
        """A rank (the next free one) and the run's config: all a worker needs to start."""
        me, size = header["worker"], self.world_size
        if me not in self.ranks and len(self.ranks) == size:
            raise Refused("full", f"all {size} ranks are taken")
        rank = self.ranks.setdefault(me, len(self.ranks))
        return {"op": "hello", "worker": me, "rank": rank, "world_size": size, "version": self.t,
                "heartbeat_timeout": 30, "config": {**self.config, "rank": rank}}, []  # fmt: skip

    def pull(self, header: dict, _: dict, reply: dict | None = None) -> tuple[dict, list[Frame]]:
        """The parameters changed since `since` (all for None), also as a fused push's reply."""
        since = header.get("pull_since" if reply else "since")
        fresh = since is None or since > self.t  # it knows nothing of our versions
        frames = [frame(n, p) for n, p in self.params.items() if fresh or self.versions[n] > since]
        pulled = {"version": self.t, "param_versions": self.versions, "stop": False}
        return {**(reply or {"op": "pull"}), **pulled}, frames

    def push(self, header: dict, tensors: dict) -> tuple[dict, list[Frame]]:
        """tau, the rule's factors, the update, the reply (with the pull half when fused)."""
        grads = {n: g for n, g in tensors.items() if not n.startswith("extra/")}
        self.check_push(header, grads, tensors)
        tau = self.t - header["base"]  # clock staleness: the updates since the worker's pull
        scales, d = self.scales(grads, tensors, tau)
        before = {n: self.sampled(n) for n in grads if self.samples}
        for name, grad in grads.items():
            self.params[name] -= np.float32(self.config["lr"] * scales[name]) * grad  # SGD
            self.versions[name] = self.t + 1
        self.t += 1
        decay = self.rule.get("step_decay", 0)  # vsgd's step_p: an EMA of one update's move
        for name, old in before.items():
            move, last = np.linalg.norm(self.sampled(name) - old), self.step_p.get(name)
            self.step_p[name] = move if last is None else decay * last + (1 - decay) * move
        self.losses.append(header.get("loss", math.nan))  # the worker's, on its batch
        vsgd = f" d {d:.3f}" if self.samples else ""  # d: how many typical updates behind
        rank, scale = self.ranks.get(header["worker"]), min(scales.values())
        print(f"update {self.t}: rank {rank} tau {tau}{vsgd} scale {scale:.3f}\n", end="")
        reply = {"op": "push", "version": self.t, "seq": header["seq"], "applied": True,
                 "staleness": tau, "stop": False}  # fmt: skip
        return self.pull(header, tensors, reply) if "pull_since" in header else (reply, [])

    def check_push(self, header: dict, grads: dict, tensors: dict) -> None:
        """The refusals a push can get here; `push` assumes it passed them."""
        if header["base"] > self.t:  # a gradient of parameters the server never had
            raise Refused("bad_base", f"base {header['base']} is ahead of version {self.t}")
        for name, grad in grads.items():
            if name not in self.params or grad.shape != self.params[name].shape:
                raise Refused("shape", f"no parameter {name!r} of shape {grad.shape}")
            sample = tensors.get(f"extra/sample/{name}")  # vsgd: the worker's values at S_P
            if self.samples and np.shape(sample) != self.samples[name].shape:
                raise Refused("rule", f"vsgd needs the {name} values at S_P with its gradient")

    def sampled(self, name: str) -> np.ndarray:
        return self.params[name].flat[self.samples[name]].astype(np.float64)

    def scales(self, grads: dict, tensors: dict, tau: int) -> tuple[dict[str, float], float]:
        """The rule's factor per parameter, and vsgd's largest d (docs/algorithms.md)."""
        if not self.samples:  # dasgd: Zhang et al., IJCAI 2016
            return dict.fromkeys(grads, 1 / max(1, tau)), 0.0
        gap2, step2 = {}, {}  # per layer, squared: the worker's copy to ours; a typical update
        for name in grads:
            layer, diff = name.split(".")[0], self.sampled(name) - tensors[f"extra/sample/{name}"]
            gap2[layer] = gap2.get(layer, 0.0) + float(diff @ diff)
            step2[layer] = step2.get(layer, 0.0) + self.step_p.get(name, 0.0) ** 2
        d = {lay: math.sqrt(gap2[lay] / step2[lay]) if step2[lay] else 0.0 for lay in gap2}
        return {n: 1 / max(1.0, d[n.split(".")[0]]) for n in grads}, max(d.values())


# ------------------------------------------------------------------------------ the worker
def worker(ctx: zmq.Context, address: str, steps: int | None) -> None:
    """hello, one pull, then a fused push + pull per step, bye."""
    sock, me = ctx.socket(zmq.DEALER), np.random.default_rng().bytes(16).hex()  # a random id
    sock.connect(address)

    def request(header: dict, frames: list[Frame] | tuple = ()) -> tuple[dict, dict]:
        """Send one request, wait for its reply: one at a time, so no reply is mistaken."""
        sock.send_multipart(pack(header, frames))
        if not sock.poll(60_000):  # minips's client would retry on a new socket (protocol.md 8)
            raise SystemExit(f"error: no reply to {header['op']} within 60 s")
        reply, tensors = unpack(sock.recv_multipart())
        if reply["op"] == "error":
            raise SystemExit(f"error: {header['op']} refused ({reply['code']}): {reply['reason']}")
        return reply, tensors

    hello, _ = request({"op": "hello", "worker": me, "info": {"role": "worker"}})
    config, rank, rule = hello["config"], hello["rank"], hello["config"]["rule"]
    plan = {n: e.get("push", "dense") for n, e in config.get("plan", {}).get("params", {}).items()}
    asks = {config["model"]["name"], config["dataset"]}  # and every codec of the plan:
    asks |= {spec if isinstance(spec, str) else spec["codec"] for spec in plan.values()}
    if cannot := asks - {"mlp", "sample", "fashion-mnist", "dense", "fp16", "topk"}:  # 5.6
        request({"op": "bye", "worker": me, "refused": f"the tiny worker cannot do {cannot}"})
        raise SystemExit(f"error: the tiny worker cannot do {cannot} (a model, data or codec)")
    x, y = load_shard(config, rank, hello["world_size"])
    rng = np.random.default_rng(config["seed"] * 1000 + rank)  # any uniform shuffle will do
    epoch_steps = math.ceil(config["epochs"] * len(y) / config["batch_size"])
    reply, params = request({"op": "pull", "worker": me, "since": None})
    at = {n: vsgd_sample(n, p.size, rule) for n, p in params.items() if rule["name"] == "vsgd"}
    residual, losses, sent = {}, [], 0
    for seq in range(min(steps or epoch_steps, epoch_steps)):
        batch = rng.choice(len(y), config["batch_size"], replace=False)
        loss, grads = loss_and_grads(params, x[batch], y[batch])
        frames = [f for n, g in grads.items() for f in encode(n, g, plan.get(n, "dense"), residual)]
        # vsgd: the values the gradient was computed at, before the reply overwrites them
        frames += [frame(f"extra/sample/{n}", params[n].flat[at[n]]) for n in grads if at]
        sent, base = sent + sum(a.nbytes for _, a in frames), reply["version"]
        header = {"op": "push", "worker": me, "seq": seq, "base": base, "pull_since": base}
        reply, fresh = request({**header, "samples": len(batch), "loss": loss}, frames)
        deltas = {d["name"] for d in reply.get("arrays", []) if d["codec"] == "delta"}
        for name, value in fresh.items():  # overwrite what changed; a delta is added
            params[name] = params[name] + value if name in deltas else value
        losses.append(loss)
        if reply["stop"]:
            break
    request({"op": "bye", "worker": me, "finished": len(losses) == epoch_steps})
    print(f"worker {rank}: loss {np.mean(losses[:5]):.3g} -> {np.mean(losses[-5:]):.3g} in "
          f"{len(losses)} steps, pushed {sent // len(losses):,} B per step (dense: "
          f"{sum(g.nbytes for g in grads.values()):,})\n", end="")  # in one write  # fmt: skip


def main() -> None:
    """demo (the default): a server and its workers in one process; or one of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", choices=["demo", "server", "worker"], default="demo")
    parser.add_argument("--address", default="tcp://127.0.0.1:5555", help="the server's")
    parser.add_argument("--rule", choices=list(RULES), default="dasgd")
    parser.add_argument("--workers", type=int, default=3, help="the run's world size")
    parser.add_argument("--fast", action="store_const", const=30, dest="steps", help="30 steps")
    args, ctx = parser.parse_args(), zmq.Context()
    if args.role == "worker":
        return worker(ctx, args.address, args.steps)
    sock, address = ctx.socket(zmq.ROUTER), "inproc://tiny-ps"  # inproc: between threads
    sock.bind(address if args.role == "demo" else args.address)
    threads = [threading.Thread(target=worker, args=(ctx, address, args.steps), daemon=True)
               for _ in range(args.workers if args.role == "demo" else 0)]  # fmt: skip
    for thread in threads:  # daemons: a server that fails does not leave them waiting
        thread.start()
    TinyServer(args.rule, args.workers).serve(sock)
    for thread in threads:
        thread.join()
    sock.close(linger=1000)  # let the last reply leave before the process ends


if __name__ == "__main__":
    main()
