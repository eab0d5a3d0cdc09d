"""How a server's operations run (OpsOptions): checkpoints, the sample budget, clipping.

The core's `ServerOptions` (minips/server/options.py) says how the loop runs; `OpsOptions`
is those and what only the operations read. A run's server is given one (run/config.py,
`server_options`); `ServerOps` reads a plain ServerOptions as one with these at their
defaults (a checkpoint only at shutdown, no sample budget, no clipping).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from minips.server.options import ServerOptions


@dataclass(frozen=True)
class OpsOptions(ServerOptions):
    """ServerOptions (bind, world_size, the timers, checkpoint_path, ...) and the operations'.

    checkpoint_every / checkpoint_interval: a checkpoint (at `checkpoint_path`) every N
    updates and every S seconds when the version moved (0: only at shutdown).
    keep_checkpoints: each checkpoint also stays as NAME-vVERSION.npz (a run's curve
    evaluated afterwards at the same versions in every run). resume: a checkpoint to start
    from (its update and sample counts too). max_samples: stop once pushes reported this
    many training samples in total (0: no limit). clip_norm: clip each push's gradients to
    this global L2 norm (0: never).
    """

    checkpoint_every: int = 0
    checkpoint_interval: float = 0.0
    keep_checkpoints: bool = False
    resume: str | Path | None = None
    max_samples: int = 0
    clip_norm: float = 0.0

    @classmethod
    def of(cls, options: ServerOptions) -> OpsOptions:
        """`options` as OpsOptions: itself, or a plain ServerOptions with the operations'
        settings at their defaults."""
        if isinstance(options, cls):
            return options
        return cls(**{item.name: getattr(options, item.name) for item in fields(options)})
