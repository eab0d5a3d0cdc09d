"""What a run's report says about how it sent its tensors: the transmission plan it ran
(read from RUN_DIR/plan.json, which `minips run` writes for every plan but dense) and the
link it ran behind (--bandwidth: each worker's own; --netem: one shared at the server).

    plan_summary(run.path, run.config)  # {"name", "chosen", "wait_free", "params"} or None
    link_text(run.config)               # "each worker's own 20mbit (--bandwidth)" or None
    plan_lines(report)                  # the report's lines about both
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minips.transmission.codecs import Spec

PLAN_FILE = "plan.json"


def spec_text(spec: Spec) -> str:
    """A codec spec in words: "fp16", {"codec": "topk", "ratio": 0.01} -> "topk ratio 0.01"."""
    if isinstance(spec, str):
        return spec
    options = " ".join(f"{key} {value}" for key, value in spec.items() if key != "codec")
    return f"{spec.get('codec')} {options}".strip()


def plan_summary(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The plan a run ran (None: dense, or none recorded). name: "auto" when the planner
    chose it (its prediction is in the file), else the file given; chosen: the planner's
    candidate ("dense", "dense wait-free", "lossless", "lossy"); params: per parameter its
    push and pull codecs and push interval (parameters not named are dense, every step)."""
    given = config.get("plan")
    if not given or given == "dense":
        return None
    file = Path(path) / PLAN_FILE  # the run's own copy, wherever the directory now lies
    try:
        plan = json.loads(file.read_text())
    except (OSError, ValueError):
        return {"name": str(given), "chosen": None, "wait_free": None, "params": {}}
    predicted = plan.get("predicted") or {}
    params = {
        name: {"push": spec_text(entry.get("push", "dense")),
               "pull": spec_text(entry.get("pull", "dense")), "every": entry.get("every", 1)}
        for name, entry in (plan.get("params") or {}).items()
    }  # fmt: skip
    return {
        "name": "auto" if predicted.get("chosen") else str(given),
        "chosen": predicted.get("chosen"),
        "wait_free": bool(plan.get("wait_free")),
        "params": params,
    }


def link_text(config: dict[str, Any]) -> str | None:
    """The link a run ran behind, in words (None: unlimited)."""
    parts = []
    if config.get("bandwidth"):
        parts.append(f"each worker's own {config['bandwidth']} (--bandwidth)")
    if config.get("netem"):
        parts.append(f"{config['netem']} at the server, shared by the workers (--netem)")
    return "; ".join(parts) or None


def plan_lines(report: dict[str, Any]) -> list[str]:
    """The report's lines about the plan and the link (none for a dense, unlimited run)."""
    lines = []
    if report.get("link"):
        lines.append(f"  link: {report['link']}")
    plan = report.get("plan")
    if plan is None:
        return lines
    chosen = f", the planner's {plan['chosen']} choice" if plan.get("chosen") else ""
    wait_free = ", wait-free" if plan.get("wait_free") else ""
    params = plan["params"]
    rest = "; every other parameter dense" if params else ": every parameter dense"
    lines.append(f"  plan {plan['name']}{chosen}{wait_free}{rest}")
    if params:
        width = max(len("parameter"), *(len(name) for name in params))
        lines.append(f"    {'parameter':<{width}}  {'push':<18} {'pull':<18} {'every':>5}")
        for name, p in params.items():
            lines.append(f"    {name:<{width}}  {p['push']:<18} {p['pull']:<18} {p['every']:>5}")
    return lines
