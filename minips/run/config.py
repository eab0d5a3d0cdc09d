"""One definition of a run's configuration, and everything derived from it.

A distributed run is configured by the fields of `RunConfig`; the single-process trainer's
`TrainConfig` is derived from the same fields (those `minips train` takes). Each field is
declared once with `setting(...)`: its default, help, range, the commands that take it,
whether workers receive it in `hello`, and which server option it sets (`OpsOptions`).
The rest is derived from those declarations (the declaring itself: minips.run.settings),
so a new field is one declaration:

    config_options(cls, command)      the click options of `minips run` / `server` / `train`
                                      (minips.cli.click_options; for `rule_options`, each rule's
                                      flags from Rule.options)
    cls.from_options(values)          the config from those options' values
    config.validate()                 the same ranges the CLI enforces, plus cross-field checks
    config.to_json(), cls.from_json() config.json of a run directory, which its server reads
    config.hello_config(model_spec)   the `config` map workers receive in `hello`
    config.server_options()           the server's options (OpsOptions: its operations' too)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, make_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click

from minips.data.datasets import DATASET_NAMES
from minips.errors import ConfigError
from minips.group.agreements import ROOT_TIMEOUT
from minips.nn.zoo import MODEL_NAMES
from minips.ops.ops_options import OpsOptions
from minips.provision.keyfiles import load_server_keys
from minips.rules import DEFAULT_MOMENTUM, DEFAULT_RULE, RULES, RuleOption
from minips.run.config_checks import (
    check_browser_slots,
    check_group,
    check_hetero,
    check_partition,
    check_plan_batch,
    check_plan_file,
    check_speed_schedule,
)
from minips.run.rule_plugins import make_rule, rule_momentum
from minips.run.settings import (
    TRAIN_RUN_SERVER,
    check_finite,
    check_range,
    check_type,
    setting,
    setting_of,
)
from minips.server.server import ServerOptions
from minips.state.registry import MAX_REGISTERED

RULE_OPTIONS = "rule_options"  # the field assembled from the rules' own flags (Rule.options)


def _comma_floats(text: str | None) -> list[float]:
    """ "1,1,2" -> [1.0, 1.0, 2.0] (nothing given: [])."""
    try:
        return [float(part) for part in text.split(",")] if text else []
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None


def _speed_schedule(text: str | None) -> str:
    """A `--hetero-schedule`, checked (minips.run.speeds); nothing given: fixed."""
    from minips.run.speeds import SpeedSchedule

    SpeedSchedule.parse(text or "fixed")  # ScheduleError is a ValueError: its one line
    return text or "fixed"


def _rule_option_pairs(items: tuple[str, ...] | None) -> dict[str, Any]:
    """("rho=0.05", "schedule=exp") -> {"rho": 0.05, "schedule": "exp"} (values as JSON)."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        try:
            options[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = raw  # a bare word, e.g. schedule=inverse
    return options


def _rate_text(text: str | None) -> str | None:
    """A link rate as given ("100mbit"), checked by plan_measure.parse_rate; None: unset."""
    if text in (None, "", "unlimited"):
        return None
    from minips.run.plan_measure import parse_rate

    try:
        parse_rate(text)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return text


def _shaped_rate_text(text: str | None) -> str | None:
    """A `--netem` rate: as `_rate_text`, and one tc's tbf can shape (1 byte/s up to
    2^64 - 1), checked here so that no run directory is claimed for a link tc refuses."""
    if (text := _rate_text(text)) is None:
        return None
    from minips.run.plan_measure import parse_rate

    if not 1 <= parse_rate(text) < 2**64:
        raise ValueError(f"bad rate {text!r}: tc shapes 8bit (1 byte/s) to 2^64 - 1 bytes/s")
    return text


Config = TypeVar("Config", bound="ConfigBase")


class ConfigBase:
    """What every configuration dataclass here can do with its declared settings."""

    def __post_init__(self) -> None:
        # An unset momentum is the rule's choice (0 under dana: its momentum is its own),
        # decided here, once, so config.json and the server's arguments say what ran.
        if getattr(self, "momentum", 0.0) is None:
            object.__setattr__(self, "momentum", rule_momentum(getattr(self, "rule", None)))

    @classmethod
    def from_options(
        cls: type[Config], values: Mapping[str, Any], base: Config | None = None
    ) -> Config:
        """The config from a command's option values (a rule flag given with another rule:
        ConfigError "--beta only applies to --rule dasgd"). base: the config those values
        change (`minips server --config FILE` with options beside it); a field they do not
        name keeps base's value."""
        values = {**asdict(base), **values} if base is not None else dict(values)
        if RULE_OPTIONS in {f.name for f in fields(cls)}:
            rule = values.get("rule", getattr(cls, "rule", None))
            values[RULE_OPTIONS] = _collect_rule_flags(values, rule)
        return cls(**values)

    @classmethod
    def from_json(cls: type[Config], path: str | Path) -> Config:
        """The config a config.json holds (to_json's output); ConfigError (one line) for a
        file that is not one: unreadable, an unknown field, a value of the wrong type."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not a configuration file ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a configuration file (not a JSON object)")
        declared = {item.name: item for item in fields(cls)}
        unknown = sorted(set(data) - set(declared))
        if unknown:
            raise ConfigError(f"{path}: unknown configuration field(s) {', '.join(unknown)}")
        for name, value in data.items():
            check_type(declared[name], value, path)
        return cls(**data)

    def validate(self) -> None:
        """One-line ConfigError for a value outside its declared range."""
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and not isinstance(value, (list, dict)):
                check_range(item.name.replace("_", " "), value, setting_of(item))

    def to_json(self) -> str:
        """The config as an indented JSON object (config.json)."""
        return json.dumps(asdict(self), indent=2) + "\n"


@dataclass(frozen=True)
class RunConfig(ConfigBase):
    """Everything that defines a distributed run (`minips run`, `minips server`).

    `epochs` counts passes over each worker's shard. `momentum` None (not given) is the
    rule's choice, filled in when the config is made (minips.run.rule_plugins.rule_momentum:
    0 under dana and dana-gap, else 0.9), so `replace(config, rule=...)` keeps the one
    chosen for the first rule. The field order is the order of the options in --help and of the keys
    of hello's config (kept so the protocol's bytes do not change).
    """

    # fmt: off
    # what the worker trains: model, data, epochs, batch size, seed
    model: str = setting("lenet5", "Model from the zoo (minips.nn).",
                         commands=TRAIN_RUN_SERVER, to_workers=True, choices=MODEL_NAMES)
    dataset: str = setting("sample", "Dataset (where each is found: minips data list).",
                           commands=TRAIN_RUN_SERVER,
                           to_workers=True, choices=DATASET_NAMES)
    data_dir: str | None = setting(None, "Directory with the dataset's IDX files (only "
                                   "there when given).", commands=TRAIN_RUN_SERVER,
                                   to_workers=True, cli_type=click.Path(file_okay=False))
    epochs: int = setting(5, "Passes over the training data (a worker: over its shard).",
                          commands=TRAIN_RUN_SERVER, to_workers=True, minimum=1)
    batch_size: int = setting(64, "Samples per gradient.", commands=TRAIN_RUN_SERVER,
                              to_workers=True, minimum=1)
    seed: int = setting(0, "Seed of the initial parameters and of the shuffling.",
                        commands=TRAIN_RUN_SERVER, to_workers=True, minimum=0)
    # the cluster
    workers: int = setting(2, "Number of workers (ranks 0..N-1; at most the ids a server "
                           "remembers).", minimum=1, maximum=MAX_REGISTERED,
                           server_option="world_size", commands=("run", "server"))
    hetero: list[float] = setting([], "Slowdown factor per worker, e.g. 1,1,2,4.",
                                  to_workers=True, parse=_comma_floats)
    hetero_schedule: str = setting("fixed", "How the slowdowns change from step to step: "
                                   "fixed, fluctuate:N:MAX (redrawn every N steps), "
                                   "pareto:ALPHA:P (heavy-tailed pauses), or "
                                   "away:RANK:AFTER:SECONDS (docs/model.md 4.5).",
                                   to_workers=True, omit_default=True,
                                   parse=_speed_schedule)
    partition: str = setting("iid", "Which examples each worker trains on: iid (random "
                             "equal shards), dirichlet:ALPHA (label skew, each label split "
                             "by a Dirichlet(ALPHA) draw: 0.1 skewed, 1000 near iid) or "
                             "shards:K (K one-label shards per worker); docs/model.md 4.2.",
                             to_workers=True, omit_default=True)
    servers: int = setting(1, "Server processes the parameters are split over: a server "
                           "group behind one address (docs/protocol.md 16); 1: one server.",
                           minimum=1)
    replicas: int = setting(1, "Copies of the server, each in its own process: 2 keeps a "
                            "backup that takes over when the primary dies, no acknowledged "
                            "update lost (docs/protocol.md 17); 1: one server.",
                            commands=("run", "server", "launch"), minimum=1, maximum=2)
    failover_after: float = setting(1.0, "With --replicas 2: seconds of silence on the "
                                    "replication link after which a backup takes over and a "
                                    "primary lets its backup go (both replicas need the same; "
                                    "longer on a loaded machine, docs/protocol.md 17.2).",
                                    commands=("run", "server", "launch"), minimum=0.5,
                                    maximum=60.0)
    # browser workers (`minips run` only; `minips web` serves a separate server)
    browser: int = setting(0, "Of the --workers, how many are browser slots: the run serves "
                           "the worker page and waits for that many browsers to open it "
                           "(docs/classroom.md).", commands=("run",), minimum=0)
    browser_headless: bool = setting(False, "Fill the --browser slots with tabs of a headless "
                                     "chromium started here (tests, benchmarks).",
                                     commands=("run",))
    listen: str = setting("127.0.0.1:8080", "HOST:PORT of the worker page with --browser "
                          "(0.0.0.0:8080: other machines join; port 0: any free one).",
                          commands=("run",))
    join_wait: float = setting(30.0, "Seconds the run waits for a browser seat not taken yet "
                               "(from the start), or left before its shard was done (from "
                               "then); past it, --empty-seats says what happens.",
                               commands=("run",), minimum=0)
    empty_seats: str = setting("go-on", "A browser seat still empty after --join-wait: the "
                               "run goes on with the workers it has (go-on), or ends (end).",
                               commands=("run",), choices=("go-on", "end"))
    # the server's optimizer and update rule
    lr: float = setting(0.01, "Learning rate.", commands=TRAIN_RUN_SERVER, to_workers=True,
                        minimum=0, min_open=True)
    momentum: float | None = setting(None, "Momentum of the (server's) SGD [default: "
                                     f"{DEFAULT_MOMENTUM}; 0 under dana and dana-gap, which "
                                     "keep their own per worker, and under ringmaster and "
                                     "delay-adaptive, plain SGD in their papers].",
                                     commands=TRAIN_RUN_SERVER, minimum=0, maximum=1,
                                     max_open=True, kind=float)
    weight_decay: float = setting(0.0, "L2 weight decay.", commands=TRAIN_RUN_SERVER, minimum=0)
    rule: str = setting(DEFAULT_RULE, f"Update rule: {', '.join(RULES)} (docs/algorithms.md), "
                                      "or FILE.py:CLASS / MODULE:CLASS of your own.")
    rule_options: dict[str, Any] = setting({}, "Extra rule option KEY=VALUE.",
                                           flag="--rule-option", multiple=True,
                                           parse=_rule_option_pairs)
    # how the server runs (defaults: OpsOptions', minips/ops/ops_options.py)
    max_samples: int = setting(OpsOptions.max_samples, "Stop once all workers together "
                               "processed this many samples (0: no limit; `epochs` stays "
                               "each worker's bound).", minimum=0, server_option="max_samples")
    heartbeat_timeout: float = setting(ServerOptions.heartbeat_timeout, "Seconds of silence "
                                       "before a worker is declared dead.", minimum=0,
                                       min_open=True, server_option="heartbeat_timeout")
    checkpoint_every: int = setting(OpsOptions.checkpoint_every, "Checkpoint every N "
                                    "updates (0: at the end).", minimum=0,
                                    server_option="checkpoint_every")
    checkpoint_interval: float = setting(5.0, "Also checkpoint every this many seconds when "
                                         "the model changed (0: never by time; an ssgd "
                                         "group checkpoints by updates instead, every "
                                         "--checkpoint-every or 50, so its shards keep the "
                                         "same versions).", minimum=0,
                                         server_option="checkpoint_interval")
    keep_checkpoints: bool = setting(False, "Keep every checkpoint as CHECKPOINT-vVERSION.npz "
                                     "(with --checkpoint-every N: the model at the same "
                                     "versions in every run, to evaluate afterwards).",
                                     server_option="keep_checkpoints")
    resume: str | None = setting(None, "Start from this checkpoint (a server's, or "
                                 "`minips train --save`'s).", server_option="resume",
                                 commands=TRAIN_RUN_SERVER,
                                 cli_type=click.Path(dir_okay=False, exists=True))
    clip_norm: float = setting(OpsOptions.clip_norm, "Clip each push's gradients to this "
                               "global L2 norm (0: never).", minimum=0,
                               server_option="clip_norm")
    # authentication (docs/protocol.md 15)
    keys: str | None = setting(None, "CURVE key directory (minips keys): only its allowed "
                               "keys may connect; stop and checkpoint need an operator key.",
                               cli_type=click.Path(file_okay=False))
    auth: bool = setting(False, "Authenticate and encrypt this run's own connections with "
                         "CURVE (keys made in RUN_DIR/keys unless --keys is given).",
                         commands=("run",))
    # `minips server` only (`minips run` picks a free port and RUN_DIR/checkpoint.npz)
    bind: str = setting("tcp://127.0.0.1:5555", "Listen address (tcp://0.0.0.0:5555 accepts "
                        "other machines).", commands=("server",), server_option="bind")
    checkpoint: str | None = setting(None, "Checkpoint file (.npz).", commands=("server",),
                                     server_option="checkpoint_path",
                                     cli_type=click.Path(dir_okay=False))
    observers_awaited: int = setting(0, "Once every rank finished, stop only after this many "
                                     "observers (an evaluator) said hello, so one started "
                                     "beside the job still tests the final model.",
                                     commands=("server",), minimum=0, flag="--await-observers",
                                     server_option="observers_awaited")
    shard: int = setting(-1, "Serve only shard J of the --servers group (0: the root, whose "
                         "--bind is the group's address, waiting for the others; 1..K-1: "
                         "join --root). -1: all K shards on this machine, or with --root "
                         "the index the root gives.", commands=("server",), minimum=-1)
    root: str | None = setting(None, "The group's root address, for --shard J >= 1 (the "
                               "shard takes the run's configuration from it).",
                               commands=("server",))
    backup_of: str | None = setting(None, "Serve as the backup of the primary whose "
                                    "replication link is at this address (docs/protocol.md "
                                    "17.3).", commands=("server",))
    root_timeout: float = setting(ROOT_TIMEOUT, "A shard whose root answers none of its "
                                  "joins for this many seconds stops (the root is gone); "
                                  "a root that hears no join from a shard for as long ends "
                                  "with an error naming it.",
                                  commands=("server",), minimum=0, min_open=True)
    # layer-aware transmission (docs/algorithms.md "Transmission"; transmission/plan.py,
    # transmission/planning/planner.py)
    plan: str = setting("dense", "Transmission plan: dense, auto (chosen by the planner for "
                        "the link, see `minips plan`) or a plan JSON file (minips plan --json).")
    bandwidth: str | None = setting(None, "Each worker's own link, e.g. 100mbit, 1gbit: a "
                                    "token bucket per direction (unset: unlimited).",
                                    to_workers=True, omit_default=True, parse=_rate_text)
    netem: str | None = setting(None, "A shared link at the server, e.g. 100mbit: the server "
                                "runs in its own network namespace behind a tc-shaped veth "
                                "pair (root only; minips/run/netem.py).", commands=("run",),
                                parse=_shaped_rate_text)
    trace: str | None = setting(None, "Write a Chrome trace (Perfetto) of the first worker's "
                                "compute and send/receive spans to this file.",
                                commands=("run",), cli_type=click.Path(dir_okay=False))
    # fmt: on

    def validate(self) -> None:
        """One-line ConfigError/DataError for options no run could use."""
        super().validate()
        check_hetero(self.hetero, self.workers)
        check_speed_schedule(self.hetero_schedule, self.workers)
        check_partition(self.partition, self.workers)
        for key, value in self.rule_options.items():
            check_finite(f"rule option {key}", value)
        rule = make_rule(self.rule, **self.rule_options)  # a bad rule option: its one-line error
        rule.check_server_momentum(self.momentum)  # here, not later in the server process
        check_browser_slots(self.browser, self.workers, self.browser_headless, self.listen)
        check_group(self.servers, self.shard, self.root, self.model)
        check_plan_batch(self.plan, self.batch_size)
        check_plan_file(self.plan, self.model)
        from minips.provision.locations import find_data, find_dataset

        if find_dataset(self.dataset, self.data_dir) is None:
            find_data(self.dataset, self.data_dir)  # it words the error: where it looked

    def hello_config(self, model_spec: dict[str, Any]) -> dict[str, Any]:
        """The `config` map every worker receives in `hello` (the model as its spec)."""
        sent = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if setting_of(f).to_workers
            and not (setting_of(f).omit_default and getattr(self, f.name) == f.default)
        }
        return copy.deepcopy({**sent, "model": model_spec})

    def server_options(self) -> OpsOptions:
        """The options this run's server and its operations are built with."""
        chosen = {setting_of(f).server_option: getattr(self, f.name) for f in fields(self)}
        options = OpsOptions(**{key: value for key, value in chosen.items() if key})
        # CURVE keys from the `keys` directory; without one, no authentication
        return replace(options, keys=load_server_keys(self.keys) if self.keys else None)


def _derived_fields(source: type, command: str) -> list[tuple[str, Any, Field]]:
    """The fields of `source` that `command` takes, as fresh fields for make_dataclass."""
    chosen = []
    for item in fields(source):
        if command in setting_of(item).commands:
            default = (
                {"default": item.default}
                if item.default is not MISSING
                else {"default_factory": item.default_factory}
            )
            chosen.append((item.name, item.type, field(**default, metadata=item.metadata)))
    return chosen


# fmt: off
TrainConfig = make_dataclass(
    "TrainConfig",
    [*_derived_fields(RunConfig, "train"),
     ("eval_every", int, setting(0, "Evaluate every N samples (0: once per epoch).",
                                 commands=("train",), minimum=0))],
    bases=(ConfigBase,),
    frozen=True,
)
# fmt: on
TrainConfig.__module__ = __name__  # make_dataclass would name the caller's module
TrainConfig.__doc__ = """Everything that defines a single-process training run (`minips train`).

The fields of RunConfig that `train` takes (model, data, optimizer, epochs, seed: the same
declarations, so the baseline and a cluster run are configured alike), plus `eval_every`.
"""


def rule_flags() -> dict[str, tuple[str, RuleOption]]:
    """Every rule's declared options by click parameter: "beta" -> ("dasgd", its RuleOption)."""
    return {
        option.flag[2:].replace("-", "_"): (name, option)
        for name, rule in RULES.items()
        for option in rule.options
    }


def _collect_rule_flags(values: dict[str, Any], rule: str | None) -> dict[str, Any]:
    """Pop the rules' flags from `values` into the chosen rule's options (with --rule-option's)."""
    collected = dict(values.get(RULE_OPTIONS) or {})
    for param, (owner, option) in rule_flags().items():
        value = values.pop(param, None)
        if value is None:
            continue
        if rule != owner:
            raise ConfigError(f"{option.flag} only applies to --rule {owner}")
        collected[option.key] = value
    return collected
