"""What a cluster launcher told this process: its rank, the job's size, the group's root.

`minips launch` is started once per process by torchrun, Slurm's srun, Open MPI's mpirun
or a ps-lite / BytePS / MXNet script, and takes its role from the variables that tool sets,
looked for in this order (the first launcher found wins):

    torchrun   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (+ TORCHELASTIC_RUN_ID)
    Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST or SLURM_NODELIST
    Open MPI   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE
    DMLC       DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER

One exception to the order: when Open MPI's variables are there too, Slurm's are not this
process's own (mpirun inside an allocation starts its processes from daemons that srun
started, and they inherit the daemon's SLURM_PROCID: the node's index, not the rank), so
Open MPI wins.

The root's address (shard 0 of the server group, which every process connects to):
MASTER_ADDR if set (torch's sbatch idiom exports it under any launcher), else the first
host of Slurm's node list (srun's block distribution puts rank 0 there), else
DMLC_PS_ROOT_URI, else 127.0.0.1 (one machine). Its port: MASTER_PORT + 1 under torchrun,
whose own rendezvous store already listens on MASTER_PORT; MASTER_PORT elsewhere;
DMLC_PS_ROOT_PORT under DMLC; else the caller's default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from minips.errors import ConfigError

DMLC_ROLES = ("scheduler", "server", "worker")


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in a launched job.

    launcher: "torchrun", "slurm", "openmpi" or "dmlc". rank / world_size: from a
    rank-based launcher (None under DMLC). dmlc_role: "scheduler", "server" or "worker"
    under DMLC (None otherwise); dmlc_servers / dmlc_workers: DMLC_NUM_SERVER and
    DMLC_NUM_WORKER; dmlc_worker_id: DMLC_WORKER_ID when set. root_host / root_port: where
    the group's root listens. hosts: Slurm's node list, expanded (empty elsewhere).
    """

    launcher: str
    rank: int | None
    world_size: int | None
    root_host: str
    root_port: int
    dmlc_role: str | None = None
    dmlc_servers: int | None = None
    dmlc_workers: int | None = None
    dmlc_worker_id: int | None = None  # DMLC_WORKER_ID (BytePS sets it per worker)
    hosts: tuple[str, ...] = ()

    @property
    def root(self) -> str:
        """The root's address, tcp://HOST:PORT."""
        host = f"[{self.root_host}]" if ":" in self.root_host else self.root_host
        return f"tcp://{host}:{self.root_port}"


def read_launch_env(env: Mapping[str, str], default_port: int = 5555) -> LaunchEnv:
    """The launcher's variables in `env` (os.environ); ConfigError (one line) when none of
    the four launchers' variables are there or one of them is malformed."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return _ranked(env, "torchrun", "RANK", "WORLD_SIZE", default_port)
    # Before Slurm's: under mpirun in an allocation, SLURM_PROCID is the node's (docstring).
    if "OMPI_COMM_WORLD_RANK" in env:
        return _ranked(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", default_port)
    if "SLURM_PROCID" in env:
        return _ranked(env, "slurm", "SLURM_PROCID", "SLURM_NTASKS", default_port)
    if "DMLC_ROLE" in env:
        return _dmlc(env, default_port)
    raise ConfigError(
        "minips launch found no launcher's variables (torchrun's RANK and WORLD_SIZE, "
        "Slurm's SLURM_PROCID, Open MPI's OMPI_COMM_WORLD_RANK or DMLC_ROLE); start it "
        "with torchrun, srun or mpirun, or use minips run / server / worker"
    )


def _ranked(env: Mapping[str, str], launcher: str, rank_key: str, size_key: str,
            default_port: int) -> LaunchEnv:  # fmt: skip
    rank = _uint(env, rank_key)
    world_size = _uint(env, size_key)
    if world_size < 1 or rank >= world_size:
        raise ConfigError(f"{rank_key}={rank} is not a rank of {size_key}={world_size}")
    hosts: tuple[str, ...] = ()
    if launcher == "slurm":
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        hosts = tuple(expand_hostlist(nodelist)) if nodelist else ()
    host = env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
    if "MASTER_PORT" in env:
        # torchrun's agent serves its rendezvous store on MASTER_PORT itself.
        port = _uint(env, "MASTER_PORT") + (1 if "TORCHELASTIC_RUN_ID" in env else 0)
    else:
        port = default_port
    return LaunchEnv(launcher, rank, world_size, host, _port(port, "the root port"), hosts=hosts)


def _dmlc(env: Mapping[str, str], default_port: int) -> LaunchEnv:
    role = env["DMLC_ROLE"]
    if role not in DMLC_ROLES:
        raise ConfigError(f"DMLC_ROLE must be one of {', '.join(DMLC_ROLES)}, got {role!r}")
    for key in ("DMLC_PS_ROOT_URI", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        if not env.get(key):
            raise ConfigError(f"DMLC_ROLE is set but {key} is not")
    servers, workers = _uint(env, "DMLC_NUM_SERVER"), _uint(env, "DMLC_NUM_WORKER")
    if workers < 1:
        raise ConfigError("DMLC_NUM_WORKER must be at least 1")
    port = _uint(env, "DMLC_PS_ROOT_PORT") if env.get("DMLC_PS_ROOT_PORT") else default_port
    host = env.get("MASTER_ADDR") or env["DMLC_PS_ROOT_URI"]
    worker_id = _uint(env, "DMLC_WORKER_ID") if env.get("DMLC_WORKER_ID") else None
    return LaunchEnv("dmlc", None, None, host, _port(port, "DMLC_PS_ROOT_PORT"), role,
                     servers, workers, worker_id)  # fmt: skip


def _uint(env: Mapping[str, str], key: str) -> int:
    text = env.get(key, "")
    if not text.strip().isdigit():
        raise ConfigError(f"{key} must be a non-negative integer, got {text!r}")
    return int(text)


def _port(port: int, what: str) -> int:
    if not 0 < port < 65536:
        raise ConfigError(f"{what} must be in 1..65535, got {port}")
    return port


_BRACKETS = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list -> host names, in order.

    "node[01-04,07],gpu3" -> node01 node02 node03 node04 node07 gpu3; several bracket
    groups multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); a range keeps the zero
    padding of its first bound. ConfigError for unbalanced brackets or a bad range.
    """
    hosts: list[str] = []
    for item in _top_level_items(text):
        hosts += _expand_item(item, text)
    return hosts


def _top_level_items(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ConfigError(f"bad Slurm host list {text!r}: unbalanced brackets")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ConfigError(f"bad Slurm host list {text!r}: unbalanced brackets")
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str, text: str) -> list[str]:
    match = _BRACKETS.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ConfigError(f"bad Slurm host list {text!r}: unbalanced brackets")
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    expanded = []
    for number in _expand_ranges(match.group(1), text):
        expanded += [head + number + rest for rest in _expand_item(tail, text)]
    return expanded


def _expand_ranges(ranges: str, text: str) -> list[str]:
    """ "01-03,07" -> ["01", "02", "03", "07"]."""
    numbers = []
    for part in ranges.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()) or (sep and int(high) < int(low)):
            raise ConfigError(f"bad Slurm host list {text!r}: bad range {part!r}")
        width = len(low)
        last = int(high) if sep else int(low)
        numbers += [str(n).zfill(width) for n in range(int(low), last + 1)]
    return numbers
