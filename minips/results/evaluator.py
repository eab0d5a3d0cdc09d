"""The evaluator: a read-only client that pulls the model now and then and tests it.

It registers as an *observer* (no rank, never part of a barrier) and writes `eval`
records {time, samples, updates, version, accuracy, loss, final} to the run's JSONL log,
`version` the one it tested (a server group's: one per shard). When the server says stop
it evaluates the parameters once more (`final: true`) and exits, so the last `eval` line
is normally the model the run ended with; `minips run` checks that by the version and tests
the final checkpoint itself when it is not (minips.run.final_test). A model at chance for
several evaluations (minips.ops.collapse) is logged in one line and written as a
`collapse` record.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from minips.ops.collapse import CollapseWatch, output_classes
from minips.provision.locations import find_data
from minips.results.metrics import MetricsLog
from minips.trainer import evaluate
from minips.worker.client import PSClient, ServerUnavailable
from minips.worker.worker import dataset_from_hello, model_from_hello

log = logging.getLogger("minips.evaluator")

BYE_TIMEOUT = 2.0  # seconds the goodbye waits for a reply (it is not retried)


def run_evaluator(
    client: PSClient,
    metrics: MetricsLog,
    interval: float = 2.0,
    data_dir: str | None = None,
) -> dict | None:
    """Evaluate every `interval` seconds until the server stops; return the last record."""
    try:
        hello = client.hello({"role": "observer", "pid": os.getpid()})
    except KeyboardInterrupt:  # the server may have registered us before the reply was read
        leave(client)
        raise
    try:
        config = hello["config"]
        data = dataset_from_hello(config, data_dir, find_data)
        model = model_from_hello(config)
        rule = (config.get("rule") or {}).get("name")
        watch = CollapseWatch(
            output_classes(model.params), hello["world_size"], config.get("lr"), rule, log.warning
        )
        return _evaluate_until_stop(client, metrics, interval, model, data, watch)
    finally:  # stopped, the server gone, or interrupted (Ctrl-C, SIGTERM): say bye
        leave(client)


def _evaluate_until_stop(client: PSClient, metrics: MetricsLog, interval: float, model: Any,
                         data: Any, watch: CollapseWatch) -> dict | None:  # fmt: skip
    """The evaluator's loop: test the model every `interval` s and once more on the final
    parameters; return the last record."""
    version: int | None = None
    last: dict | None = None
    next_eval = time.monotonic()
    while True:
        # Between evaluations only a cheap ping: it keeps us alive in the server's table and
        # tells us at once when the run stops, so the final model is always evaluated.
        try:
            stopping = client.ping()
            if not stopping and time.monotonic() < next_eval:
                time.sleep(min(0.2, max(0.0, next_eval - time.monotonic())))
                continue
            reply = client.pull(since=version)
            # Stamped with the time of the pull: the parameters tested are those of this
            # moment, not of the end of the (second-long) evaluation.
            pulled_at = round(metrics.elapsed(), 4)
            stats = client.stats()
        except ServerUnavailable:
            break  # the server is gone: what we have is the last model we saw
        if reply.params:
            model.set_params(reply.params, strict=False)
        version = reply.version
        accuracy, loss = evaluate(model, data.x_test, data.y_test)
        last = metrics.write(
            "eval",
            time=pulled_at,
            samples=int(stats.get("samples", 0)),
            updates=int(stats.get("updates", version)),
            version=version,
            accuracy=accuracy,
            loss=loss,
            final=bool(reply.stop),
        )
        if (found := watch.on_evaluation(accuracy, loss, last["updates"])) is not None:
            metrics.write("collapse", **found.record())  # `minips run` stops the run on it
        if reply.stop:
            break
        next_eval = time.monotonic() + interval
    return last


def leave(client: PSClient) -> None:
    """Say bye in one short try: the server may be gone (its stop grace ran out while we
    tested), and the launcher waits for us to leave once the final record is written."""
    client.timeout, client.retries = min(client.timeout, BYE_TIMEOUT), 0
    try:
        client.bye()
    except ServerUnavailable:
        pass
