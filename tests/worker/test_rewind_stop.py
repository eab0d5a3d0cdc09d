"""A batch rewound by `bad_base` pulls everything again (docs/protocol.md 7); when that
pull says the server is stopping, the worker stops instead of training on."""

from __future__ import annotations

from minips.nn.zoo import mlp
from minips.worker.replies import PullReply, ServerError
from minips.worker.worker import Worker


class RestartedServerSide:
    """A worker's client and sender at a server that forgot the worker's version and is
    stopping: every push is answered `bad_base`, every pull carries `stop`."""

    def __init__(self, stop: bool) -> None:
        self.stop, self.pulls = stop, []

    def finish(self, extra, samples, version, loss):
        raise ServerError("base 9 is past the server's version 5", "bad_base")

    def pull(self, since):
        self.pulls.append(since)
        return PullReply(version=5, params={}, param_versions={}, stop=self.stop)


def _rewound_worker(stop: bool) -> tuple[Worker, RestartedServerSide]:
    side = RestartedServerSide(stop)
    worker = Worker(side)
    worker.model, worker.sender, worker.version = mlp(), side, 9
    return worker, side


def test_a_rewind_pull_that_says_stop_stops_the_worker() -> None:
    worker, side = _rewound_worker(stop=True)
    assert worker.push({}, samples=64, loss=1.0) is None  # the batch is dropped
    assert side.pulls == [None] and worker.version == 5  # everything pulled again
    assert worker.report.stopped_by_server


def test_a_rewind_pull_of_a_serving_server_lets_the_worker_go_on() -> None:
    worker, _ = _rewound_worker(stop=False)
    assert worker.push({}, samples=64, loss=1.0) is None
    assert not worker.report.stopped_by_server
