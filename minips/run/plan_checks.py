"""A transmission plan checked once, where a run reads it: a plan file or map (--plan), its
codec specs, and its fit to the model. Each refusal is a one-line ConfigError said before
any process starts; a server then sends the plan in hello, and its workers take it as
given (minips.transmission.plan.plan_from_hello).

    plan = load_plan("plan.json")        # read, checked, built (a map: checked, built)
    check_model(plan, shapes, kinds)     # its parameters and codecs fit the model

The formats are normative in docs/protocol.md 13.8 (a plan) and 13 (a codec spec); the
option values are checked by building each codec once (its constructor's checks,
minips.transmission.codecs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minips.errors import ConfigError
from minips.nn.model import Sequential
from minips.transmission.codecs import CODEC_CLASSES, Spec, parse_spec
from minips.transmission.plan import PARAM_KEYS, PLAN_FORMAT, PULL_CODECS, Plan


def check_spec(spec: Spec) -> None:
    """ConfigError unless `spec` is a push codec spec: a known codec, its options known,
    the required ones given, and their values ones its constructor takes."""
    if not isinstance(spec, str) and not (
        isinstance(spec, Mapping) and isinstance(spec.get("codec"), str)
    ):
        raise ConfigError(f"a codec spec is a name or a map with 'codec', got {spec!r}")
    name = spec if isinstance(spec, str) else spec["codec"]
    options = {} if isinstance(spec, str) else {k: v for k, v in spec.items() if k != "codec"}
    cls = CODEC_CLASSES.get(name)
    if cls is None:
        raise ConfigError(f"unknown codec {name!r} (known: {', '.join(CODEC_CLASSES)})")
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ConfigError(f"codec {name}: unknown option(s) {unknown} (allowed: {allowed})")
    missing = [arg for arg in cls.required if arg not in options]
    if missing:
        raise ConfigError(f"codec {name}: option(s) {missing} required")
    cls(**options)  # its constructor's checks of the values (ConfigError), before any process


def check_pull_spec(spec: Spec) -> None:
    """ConfigError unless `spec` is a pull spec: a known pull codec, its options known and
    in range (delta: ratio in (0, 1], dtype float32 or float16, warmup an integer >= 0)."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping) and isinstance(spec.get("codec"), str):
        name, options = spec["codec"], {k: v for k, v in spec.items() if k != "codec"}
    else:
        raise ConfigError(f"a pull spec is a name or a map with 'codec', got {spec!r}")
    if name not in PULL_CODECS:
        raise ConfigError(f"unknown pull codec {name!r} (known: {', '.join(PULL_CODECS)})")
    unknown = sorted(set(options) - set(PULL_CODECS[name]))
    if unknown:
        raise ConfigError(f"pull codec {name}: unknown option(s) {unknown}")
    if name == "delta":
        ratio = options.get("ratio")
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"pull codec delta: ratio must be in (0, 1], got {ratio!r}")
        if options.get("dtype", "float32") not in ("float32", "float16"):
            dtype = options["dtype"]
            raise ConfigError(f"pull codec delta: dtype float32 or float16, got {dtype!r}")
        warmup = options.get("warmup", 0)
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise ConfigError(f"pull codec delta: warmup must be an integer >= 0, got {warmup!r}")


def check_entry(name: str, entry: Any) -> None:
    """ConfigError unless `entry` is one parameter's plan: a map of PARAM_KEYS, its specs
    checked, `every` an integer >= 1 and `priority` an integer."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"plan entry {name!r} must be a map, got {entry!r}")
    unknown = sorted(set(entry) - set(PARAM_KEYS))
    if unknown:
        known = ", ".join(PARAM_KEYS)
        raise ConfigError(f"plan entry {name!r}: unknown key(s) {unknown} (known: {known})")
    check_spec(entry.get("push", "dense"))
    check_pull_spec(entry.get("pull", "dense"))
    for key, default in (("every", 1), ("priority", 0)):
        value = entry.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or (key == "every" and value < 1):
            bound = " >= 1" if key == "every" else ""
            raise ConfigError(
                f"plan entry {name!r}: {key} must be an integer{bound}, got {value!r}"
            )


def check_document(document: Any) -> None:
    """ConfigError (one line) unless `document` is a plan in `Plan.to_dict`'s form."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"a plan is a JSON object, got {type(document).__name__}")
    unknown = sorted(set(document) - {"format", "wait_free", "params", "predicted"})
    if unknown:
        raise ConfigError(f"plan: unknown key(s) {unknown}")
    if document.get("format", PLAN_FORMAT) != PLAN_FORMAT:
        raise ConfigError(f"plan format {document.get('format')!r} is not {PLAN_FORMAT}")
    params = document.get("params") or {}
    if not isinstance(params, Mapping):
        raise ConfigError("plan: 'params' must map parameter names to entries")
    wait_free = document.get("wait_free", False)
    if not isinstance(wait_free, bool):
        raise ConfigError(f"plan: wait_free must be true or false, got {wait_free!r}")
    for name, entry in params.items():
        check_entry(str(name), entry)


def check_model(
    plan: Plan, shapes: Mapping[str, tuple[int, ...]], kinds: Mapping[str, str]
) -> None:
    """ConfigError unless every parameter `plan` names exists and its codecs fit it.

    shapes: parameter -> shape; kinds: layer name -> kind ("fc", "conv"). `sf` needs a
    2-D weight of an fc layer; at least one parameter must be pushed every step (a
    step's last push must carry something).
    """
    for name, p in plan.params.items():
        if name not in shapes:
            raise ConfigError(f"plan names {name!r}, which this model does not have")
        codec, _ = parse_spec(p.push)
        layer = name.rsplit(".", 1)[0]
        if codec == "sf" and (kinds.get(layer) != "fc" or len(shapes[name]) != 2):
            raise ConfigError(f"plan: codec sf needs an fc layer's weight, not {name!r}")
        if codec == "lowrank" and len(shapes[name]) < 2:
            raise ConfigError(f"plan: codec lowrank needs a matrix, not {name!r}")
    # The step's last push must carry a gradient: without a sender thread it holds
    # every layer, with one only the layer nearest the input (produced last).
    first = next(iter(shapes), "").rsplit(".", 1)[0]
    last_push = [n for n in shapes if not plan.wait_free or n.rsplit(".", 1)[0] == first]
    if last_push and all(plan.param(name).every > 1 for name in last_push):
        where = f"of the first layer ({first}) " if plan.wait_free else ""
        raise ConfigError(f"plan: at least one parameter {where}must be pushed every step")


def load_plan(source: str | Path | Mapping[str, Any] | None) -> Plan:
    """ "dense" / None -> the all-dense plan; a map -> checked, then Plan.from_dict; else a
    JSON file path, read and checked the same way.

    ("auto" is resolved by the planner, which measures this machine:
    minips.run.plan_measure.choose_plan.)
    """
    if source is None or source == "dense":
        return Plan()
    if isinstance(source, Mapping):
        check_document(source)
        return Plan.from_dict(source)
    if source == "auto":
        raise ConfigError("plan 'auto' must be resolved by the planner first")
    path = Path(source)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"plan {source!r} is neither dense, auto nor an existing file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"plan file {path} is not readable JSON: {exc}") from None
    check_document(document)
    return Plan.from_dict(document)


def checked_plan(document: Mapping[str, Any] | None, model: Sequential) -> Plan:
    """The plan a server sent in hello (absent: all dense), checked as a document and
    against `model` (`check_model`): ConfigError with the first reason."""
    if document is not None and not isinstance(document, Mapping):
        raise ConfigError(f"the server's plan is not a map: {type(document).__name__}")
    plan = load_plan(document)
    shapes = {name: array.shape for name, array in model.params.items()}
    check_model(plan, shapes, {info.name: info.kind for info in model.layer_info()})
    return plan
