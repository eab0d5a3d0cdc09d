"""Checks of the parameter-server exercises: a worker's push/pull loop, DASGD's f(tau), the
SSP hold condition and top-k sparsification with error feedback."""

from __future__ import annotations

import math
import threading
from types import ModuleType
from typing import Any

import numpy as np

from minips.classroom.exercise.common import CheckResult, StudentCodeError, call, student_function
from minips.classroom.exercise.serving import serving
from minips.ops.client_retries import RetryingClient
from minips.worker.client import PSClient, PullReply, PushReply

# ------------------------------------------------------------------------ the worker loop

SHAPES = {"fc.w": (4, 3), "fc.b": (3,)}
SAMPLES_PER_STEP = 8


class RecordingClient(RetryingClient):
    """A PSClient that remembers every push's reply and the pushes sent after a `stop`."""

    def __init__(self, address: str) -> None:
        super().__init__(address, timeout=5.0, retries=1, worker_id="student")
        self.push_replies: list[PushReply] = []
        self.saw_stop = False  # some reply (pull's or push's) said stop: true
        self.pushes_after_stop = 0

    def pull(self, since: int | None = None) -> PullReply:
        reply = super().pull(since)
        self.saw_stop = self.saw_stop or reply.stop
        return reply

    def push(self, grads: dict[str, np.ndarray], base: int, **kwargs: Any) -> PushReply:
        self.pushes_after_stop += self.saw_stop
        reply = super().push(grads, base, **kwargs)
        self.push_replies.append(reply)
        self.saw_stop = self.saw_stop or reply.stop
        return reply


class GradientOracle:
    """The `compute_gradients(params)` given to the student: grads of 0.5 ||w - target||^2.

    On each call it also pulls the server's current parameters as an observer and records
    how far the student's copy is from them (it must be equal: one worker, asgd).
    """

    def __init__(self, observer: PSClient) -> None:
        self.observer = observer
        self.calls = 0
        self.findings: list[str] = []

    def __call__(self, params: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        self.calls += 1
        server_params = self.observer.pull().params
        missing = sorted(set(server_params) - set(params or {}))
        if missing:
            self.findings.append(
                f"step {self.calls - 1}: compute_gradients got no {', '.join(missing)}: pass "
                "every parameter (the first pull, since=None, sends them all)"
            )
            return {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}, 0
        gap = max(float(np.max(np.abs(params[n] - server_params[n]))) for n in server_params)
        if gap > 0 and not self.findings:
            self.findings.append(
                f"step {self.calls - 1}: you computed on parameters that are not the server's "
                f"latest (max difference {gap:.3g}): copy reply.params into your dict after "
                "every pull (with since=version a pull sends only what changed)"
            )
        grads = {n: (params[n] - 1.0).astype(np.float32) for n in SHAPES}  # target: all ones
        return grads, SAMPLES_PER_STEP


def _run_student(function, ps: PSClient, oracle: GradientOracle, steps: int) -> None:
    """Run the student's loop in a thread with a deadline (a loop that never ends is a finding)."""
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            call(function, ps, oracle, steps, what=f"with steps={steps}")
        except BaseException as exc:  # reported in the calling thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        raise StudentCodeError(f"run_worker(steps={steps}) did not return within 60 s")
    if "error" in outcome:
        raise outcome["error"]


def _loop_run(
    function, steps: int, max_samples: int
) -> tuple[RecordingClient, GradientOracle, dict]:
    """One run of the student's loop against a fresh server; returns client, oracle, stats."""
    params = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    config = {"model": "exercise", "batch_size": SAMPLES_PER_STEP}
    with serving(params, config, max_samples=max_samples) as server:
        with RecordingClient(server.endpoint) as ps, RetryingClient(server.endpoint) as observer:
            observer.hello({"role": "observer"})
            oracle = GradientOracle(observer)
            try:
                _run_student(function, ps, oracle, steps)
            finally:
                stats = observer.stats()
                observer.bye()
    return ps, oracle, stats


def check_worker_loop(module: ModuleType) -> CheckResult:
    """run_worker(ps, compute_gradients, steps) against a real in-process asgd server."""
    result = CheckResult()
    function = student_function(module, "run_worker")
    steps = 6
    ps, oracle, stats = _loop_run(function, steps, max_samples=0)
    for finding in oracle.findings:
        result.fail(finding)
    if oracle.calls != steps:
        result.fail(f"compute_gradients was called {oracle.calls} times for steps={steps}")
    if stats["updates"] != steps:
        result.fail(f"the server applied {stats['updates']} pushes, expected {steps} (one a step)")
    if stats["samples"] != steps * SAMPLES_PER_STEP:
        result.fail(
            f"the server counted {stats['samples']} samples, expected "
            f"{steps * SAMPLES_PER_STEP}: pass samples=n (from compute_gradients) to push"
        )
    stale = [(i, r.staleness) for i, r in enumerate(ps.push_replies) if r.staleness]
    if stale:
        i, tau = stale[0]
        result.fail(
            f"push {i} had staleness {tau} although you are the only worker: base must be "
            "the `version` of the pull whose parameters you computed on"
        )
    student = [w for w in stats["workers"] if w["worker"] == "student"]
    if not student:
        result.fail("the worker never said hello (call ps.hello() first)")
    elif student[0]["alive"]:
        result.fail("the worker never said bye: call ps.bye() when done (barriers wait for you)")
    if result.passed:
        result.ok(f"{steps} pushes applied, {stats['samples']} samples counted, staleness 0, bye")
    _check_stop(function, result)
    return result


def _check_stop(function, result: CheckResult) -> None:
    """A server whose sample budget runs out says stop: the loop must end there."""
    budget_steps, steps = 3, 12
    ps, _oracle, _stats = _loop_run(function, steps, max_samples=budget_steps * SAMPLES_PER_STEP)
    if not ps.saw_stop:
        result.fail("no reply said stop: true (internal: the sample budget did not stop)")
    elif ps.pushes_after_stop:
        result.fail(
            f"you pushed {ps.pushes_after_stop} more time(s) after a reply said stop: true: "
            "end the loop when reply.stop is set (pull's or push's)"
        )
    else:
        result.ok("the loop ends when the server says stop")


# ------------------------------------------------------------------------- DASGD's f(tau)


def dasgd_reference(tau: int, schedule: str, beta: float, power: float, tau_max: int) -> float:
    """f(tau) of docs/algorithms.md, the scale DASGD gives a push of clock staleness tau."""
    if schedule == "inverse":
        return 1.0 / max(1, tau)
    if schedule == "exp":
        return math.exp(-beta * tau)
    if schedule == "poly":
        return (1.0 + tau) ** -power
    return 1.0 if tau <= tau_max else 0.0


FORMULAS = {
    "inverse": "1 / max(1, tau)",
    "exp": "exp(-beta * tau)",
    "poly": "(1 + tau) ** -power",
    "cutoff": "1 if tau <= tau_max else 0",
}


def check_dasgd_scale(module: ModuleType) -> CheckResult:
    """dasgd_scale(tau, schedule, beta=0.2, power=0.5, tau_max=8) for every schedule."""
    result = CheckResult()
    function = student_function(module, "dasgd_scale")
    settings = [
        {"beta": 0.2, "power": 0.5, "tau_max": 8},
        {"beta": 0.7, "power": 1.5, "tau_max": 2},
    ]
    for schedule, formula in FORMULAS.items():
        wrong = None
        for options in settings:
            for tau in [*range(0, 12), 50, 1000]:
                want = dasgd_reference(tau, schedule, **options)
                got = call(function, tau, schedule, what=f"for schedule {schedule!r}", **options)
                if not isinstance(got, int | float) or not math.isclose(
                    float(got), want, rel_tol=1e-9, abs_tol=1e-12
                ):
                    wrong = (tau, options, got, want)
                    break
            if wrong:
                break
        if wrong:
            tau, options, got, want = wrong
            why = " (tau = 0: a fresh push is not penalised)" if tau == 0 else ""
            result.fail(
                f"schedule {schedule!r} with {options}: f({tau}) = {got!r}, expected "
                f"{want:.6g} = {formula}{why}"
            )
        else:
            result.ok(f"schedule {schedule!r}: f(tau) = {formula} for tau 0..11, 50, 1000")
    return result


# ------------------------------------------------------------------------ SSP hold condition

SSP_CASES = [  # (my_clock, clocks of all live workers incl. mine, s, may pull?)
    (0, [0, 0], 0, True),
    (1, [1, 0], 0, False),
    (5, [5, 2], 3, True),  # exactly s ahead: allowed
    (6, [6, 2], 3, False),
    (3, [7, 3, 5], 1, True),  # I am the slowest
    (4, [4], 0, True),  # alone
    (9, [9, 8, 1, 9], 7, False),  # the slowest is not my neighbour
    (10, [10, 9, 8], 2, True),
]


def check_ssp_hold(module: ModuleType) -> CheckResult:
    """may_pull(my_clock, clocks, s) -> bool: the server answers a pull iff it returns True."""
    result = CheckResult()
    function = student_function(module, "may_pull")
    for my_clock, clocks, s, want in SSP_CASES:
        got = call(function, my_clock, list(clocks), s)
        if not isinstance(got, bool | np.bool_):
            result.fail(f"may_pull({my_clock}, {clocks}, s={s}) returned {got!r}, not a bool")
        elif bool(got) != want:
            ahead = my_clock - min(clocks)
            relation = "<=" if want else ">"
            meaning = "may pull" if want else "must wait (the pull is held)"
            result.fail(
                f"may_pull({my_clock}, {clocks}, s={s}) returned {got}, expected {want}: "
                f"{my_clock} - min(clocks) = {ahead} {relation} s, so this worker {meaning}"
            )
    if result.passed:
        result.ok(f"{len(SSP_CASES)} cases right, the bound inclusive (exactly s ahead may pull)")
    return result


# ------------------------------------------------------------------ top-k, error feedback


def check_topk_feedback(module: ModuleType) -> CheckResult:
    """TopKErrorFeedback(k).compress(grad) -> (flat indices, values); `.residual` kept back.

    Invariant (Stich et al., NeurIPS 2018; Lin et al., ICLR 2018): with acc = residual + grad,
    the k largest |acc| are sent and removed from the residual, so at every step exactly
        sent_t + residual_t == residual_{t-1} + grad_t,
    hence sum of sent + residual == sum of grads: nothing is ever lost, only delayed.
    """
    result = CheckResult()
    cls = student_function(module, "TopKErrorFeedback")
    rng = np.random.default_rng(11)
    k, shape = 3, (4, 5)
    compressor = call(cls, k)
    residual = np.zeros(shape, np.float32)
    total_grads = np.zeros(shape, np.float64)
    total_sent = np.zeros(shape, np.float64)
    for step in range(8):
        grad = rng.standard_normal(shape).astype(np.float32)
        acc = residual + grad  # float32, as the student computes it
        total_grads += grad
        indices, values = call(compressor.compress, grad.copy(), what=f"at step {step}")
        indices = np.asarray(indices).ravel()
        values = np.asarray(values).ravel()
        problem = _topk_step_problem(acc, indices, values, k)
        if problem:
            result.fail(f"step {step}: {problem}")
            return result
        sent = np.zeros(acc.size, np.float32)
        sent[indices] = values
        new_residual = np.asarray(getattr(compressor, "residual", None), dtype=np.float32)
        if new_residual.shape != shape:
            result.fail(f"step {step}: .residual has shape {new_residual.shape}, expected {shape}")
            return result
        leak = sent.reshape(shape) + new_residual - acc
        if np.any(leak != 0):
            i = np.unravel_index(int(np.argmax(np.abs(leak))), shape)
            kept = "sent" if np.isin(np.ravel_multi_index(i, shape), indices) else "not sent"
            result.fail(
                f"step {step}: sent + residual != residual_before + grad at index "
                f"{tuple(map(int, i))} ({kept}; off by {float(leak[i]):.3g}): a sent "
                "coordinate must become 0 in the residual, every other must keep its "
                "accumulated value"
            )
            return result
        residual = new_residual.copy()
        total_sent += sent.reshape(shape)
    drift = float(np.max(np.abs(total_sent + residual - total_grads)))
    result.ok(
        f"8 steps: sent + residual == previous residual + grad exactly at each step; "
        f"sum of sent + residual == sum of grads (to float32 rounding, {drift:.1e})"
    )
    return result


def _topk_step_problem(acc: np.ndarray, indices: np.ndarray, values: np.ndarray, k: int) -> str:
    """What is wrong with one step's (indices, values), or '' when they are right."""
    flat = acc.ravel()
    if len(indices) != k or len(values) != k:
        return f"sent {len(indices)} indices and {len(values)} values, expected k={k} of each"
    if not np.issubdtype(indices.dtype, np.integer) or len(set(indices.tolist())) != k:
        return f"indices must be k distinct flat (integer) positions, got {indices.tolist()}"
    if indices.min() < 0 or indices.max() >= flat.size:
        return f"index out of range 0..{flat.size - 1}: {indices.tolist()} (use flat indices)"
    if np.any(values != flat[indices]):
        return (
            "values are not residual + grad at the sent indices: send the accumulated value "
            "(that is the error feedback), not the gradient alone"
        )
    threshold = np.sort(np.abs(flat))[-k]
    kept_back = [i for i in range(flat.size) if abs(flat[i]) > threshold and i not in indices]
    if kept_back:
        low = int(indices[np.argmin(np.abs(flat[indices]))])
        return (
            f"not the k largest by magnitude: index {kept_back[0]} (|acc| "
            f"{abs(flat[kept_back[0]]):.3g}) was kept back while index {low} (|acc| "
            f"{abs(flat[low]):.3g}) was sent; rank by |residual + grad|"
        )
    return ""
