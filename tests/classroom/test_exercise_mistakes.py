"""Each exercise check against a table of wrong answers: one per mistake its messages name,
and one per direction of each comparison (a little too much and a little too little), each
failing with the message that names it; answers right up to rounding pass.

Every wrong answer is the solution in tests/exercise_solutions/ with one edit, as a student
would write it.
"""

from pathlib import Path

import numpy as np
import pytest

from minips.classroom.exercise import EXERCISES, check
from minips.classroom.exercise.nn_checks import scale_hint

SOLUTIONS = Path(__file__).resolve().parents[1] / "exercise_solutions"


def findings(tmp_path: Path, name: str, edits: list[tuple[str, str]]) -> str:
    """The findings of exercise `name`'s check on its solution with `edits` applied ("" when
    it passes)."""
    source = (SOLUTIONS / EXERCISES[name].starter).read_text()
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / EXERCISES[name].starter
    path.write_text(source)
    _answer, result = check(name, path)
    return "\n".join(result.findings)


SSP = [  # (edit of `return my_clock - min(clocks) <= s`, what the check must say)
    ("my_clock - min(clocks) < s", "may_pull(5, [5, 2], s=3) returned False, expected True"),
    (
        "my_clock - min(clocks) <= s + 1",
        "may_pull(6, [6, 2], s=3) returned True, expected "
        "False: 6 - min(clocks) = 4 > s, so this worker must wait",
    ),  # fmt: skip
    ("my_clock - max(clocks) <= s", "may_pull(1, [1, 0], s=0) returned True, expected False"),
    ("my_clock - clocks[len(clocks) > 1] <= s", "may_pull(9, [9, 8, 1, 9], s=7) returned True"),
    ("int(my_clock - min(clocks) <= s)", "may_pull(0, [0, 0], s=0) returned 1, not a bool"),
]


@pytest.mark.parametrize(("wrong", "said"), SSP)
def test_ssp_hold_wrong_answers(tmp_path, wrong, said):
    assert said in findings(tmp_path, "ssp-hold", [("my_clock - min(clocks) <= s", wrong)])


DASGD = [  # (old, new, what the check must say)
    (
        "1.0 / max(1, tau)",
        "1.0 / (1 + tau)",
        "schedule 'inverse' with {'beta': 0.2, 'power': "
        "0.5, 'tau_max': 8}: f(1) = 0.5, expected 1 = 1 / max(1, tau)",
    ),  # fmt: skip
    ("math.exp(-beta * tau)", "math.exp(-beta * (tau + 1))", "f(0) = 0.818"),
    ("math.exp(-beta * tau)", "math.exp(-0.2 * tau)", "schedule 'exp' with {'beta': 0.7"),
    (
        "math.exp(-beta * tau)",
        "round(math.exp(-beta * tau), 3)",
        "schedule 'exp' with {'beta': 0.2, 'power': 0.5, 'tau_max': 8}: f(1) = 0.819,",
    ),  # fmt: skip
    ("math.exp(-beta * tau)", "math.exp(-beta * tau) * (1 + 1e-6)", "f(0) = 1.000001, expected 1"),
    (
        "(1.0 + tau) ** -power",
        "max(1, tau) ** -power",
        "schedule 'poly' with {'beta': 0.2, "
        "'power': 0.5, 'tau_max': 8}: f(1) = 1.0, expected 0.707107 = (1 + tau) ** -power",
    ),  # fmt: skip
    ("(1.0 + tau) ** -power", "(1.0 + tau) ** -0.5", "schedule 'poly' with {'beta': 0.7"),
    (
        "tau <= tau_max",
        "tau <= tau_max + 1",
        "schedule 'cutoff' with {'beta': 0.2, 'power': "
        "0.5, 'tau_max': 8}: f(9) = 1.0, expected 0 = 1 if tau <= tau_max else 0",
    ),  # fmt: skip
    (
        "tau <= tau_max",
        "tau <= 8",
        "schedule 'cutoff' with {'beta': 0.7, 'power': 1.5, 'tau_max': 2}: f(3) = 1.0",
    ),  # fmt: skip
    (
        "return 1.0 if",
        "return str(1.0) if",
        "schedule 'cutoff' with {'beta': 0.2, 'power': 0.5, 'tau_max': 8}: f(0) = '1.0'",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("old", "new", "said"), DASGD)
def test_dasgd_scale_wrong_answers(tmp_path, old, new, said):
    text = findings(tmp_path, "dasgd-scale", [(old, new)])
    assert said in text, text
    assert text.count("\n") == 0  # one schedule wrong: one finding


def test_dasgd_scale_passes_within_rounding_and_names_a_fresh_push(tmp_path):
    assert findings(tmp_path, "dasgd-scale", [("(1.0 + tau) ** -power", "(1.0 + tau) ** "
                    "-power * (1 + 1e-12)")]) == ""  # fmt: skip
    text = findings(
        tmp_path, "dasgd-scale", [("math.exp(-beta * tau)", "math.exp(-beta * (tau + 1))")]
    )
    assert "(tau = 0: a fresh push is not penalised)" in text


TOPK = [  # (old, new, what the check must say)
    ("[-self.k :]", "[-self.k + 1 :]", "step 0: sent 2 indices and 2 values, expected k=3"),
    ("[-self.k :]", "[-self.k - 1 :]", "step 0: sent 4 indices and 4 values, expected k=3"),
    (
        "return indices, values",
        "return np.r_[indices[:-1], indices[0]], values",
        "step 0: indices must be k distinct flat (integer) positions",
    ),  # fmt: skip
    ("return indices, values", "return indices.astype(float), values", "(integer) positions"),
    (
        "return indices, values",
        "return indices - acc.size, values",
        "step 0: index out of range 0..19",
    ),
    (
        "return indices, values",
        "return np.r_[indices[:-1], acc.size], values",
        "step 0: index out of range 0..19",
    ),  # fmt: skip
    (
        "values = acc[indices].copy()",
        "values = grad.ravel()[indices].copy()",
        "values are not residual + grad at the sent indices",
    ),  # fmt: skip
    (
        "values = acc[indices].copy()",
        "values = np.abs(acc[indices])",
        "values are not residual + grad at the sent indices",
    ),  # fmt: skip
    ("np.argpartition(np.abs(acc)", "np.argpartition(acc", "not the k largest by magnitude"),
    ("np.argpartition(np.abs(acc)", "np.argpartition(-np.abs(acc)", "not the k largest"),
    ("acc[indices] = 0", "acc[indices] *= 1e-4", "sent + residual != residual_before + grad"),
    ("acc[indices] = 0", "acc[:] = 0", "sent + residual != residual_before + grad"),
    (
        "self.residual = acc.reshape(grad.shape)",
        "self.residual = acc",
        "step 0: .residual has shape (20,), expected (4, 5)",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("old", "new", "said"), TOPK)
def test_topk_feedback_wrong_answers(tmp_path, old, new, said):
    text = findings(tmp_path, "topk-feedback", [(old, new)])
    assert said in text, text


DENSE = [  # (old, new, what the check must say)
    ("dy.sum(axis=0)", "dy.mean(axis=0)", "db wrong for N=5, in=4, out=3: "),
    ("dy.sum(axis=0)", "dy.sum(axis=1)", "db has shape (5,), expected (3,)"),
    ("x.T @ dy,", "x.T @ dy / len(x),", "(dw is 5 times too small, the batch size"),
    ("x.T @ dy,", "x.T @ dy * (1 + 5e-5),", "dw wrong for N=1, in=3, out=2: max relative error"),
    ("x.T @ dy,", "x.T @ dy * (1 - 5e-5),", "dw wrong for N=1, in=3, out=2: max relative error"),
    ("dy @ w.T,", "dy @ w,", "dense_backward() for N=1, in=3, out=2 raised ValueError"),
    ("dy @ w.T,", "dy @ w.T * 2,", "dx wrong for N=1, in=3, out=2: max relative error 1 at"),
    ("dy @ w.T,", "None,", "dx is None (did you forget to return it?)"),
    (
        "dy @ w.T,",
        "(dy @ w.T) * np.where(np.arange(len(dy))[:, None] > 0, 1, np.nan),",
        "dx wrong for N=5, in=4, out=3: dx has non-finite values (first at index (0, 0))",
    ),  # fmt: skip
    (
        "dy @ w.T,",
        "(dy @ w.T) + np.where(np.arange(len(dy))[:, None] > 0, 0, np.nan),",
        "dx has non-finite values (first at index (0, 0))",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("old", "new", "said"), DENSE)
def test_dense_backward_wrong_answers(tmp_path, old, new, said):
    text = findings(tmp_path, "dense-backward", [(old, new)])
    assert said in text, text


def test_the_batch_size_hint_from_two_samples_on():
    # N = 2 is the smallest batch where a mean and a sum differ: the hint comes there too.
    want = np.array([2.0, -4.0])
    assert "2 times too small" in scale_hint("db", want / 2, want, 2)
    assert "2 times too large" in scale_hint("db", want * 2, want, 2)
    assert scale_hint("db", want, want, 2) == ""


def test_dense_backward_passes_within_rounding(tmp_path):
    assert findings(tmp_path, "dense-backward", [("x.T @ dy,", "x.T @ dy * (1 + 1e-7),")]) == ""


XENT = [  # (old, new, what the check must say)
    (
        "float(np.mean(log_sum",
        "float(np.sum(log_sum",
        "loss wrong for N=4, K=5, small logits: got",
    ),  # fmt: skip
    (
        "float(np.mean(log_sum",
        "float(np.sum(log_sum",
        "(it is 4 times too large: the loss is the mean over the batch)",
    ),  # fmt: skip
    (
        "loss = float(np.mean(log_sum - shifted[np.arange(n), labels]))",
        "loss = log_sum - shifted[np.arange(n), labels]",
        "loss for N=4, K=5, small logits has shape (4,): return one number",
    ),  # fmt: skip
    (
        "shifted = logits - logits.max(axis=1, keepdims=True)",
        "shifted = (logits - logits.max(axis=1, keepdims=True)).astype(np.float16)",
        "loss wrong for N=4, K=5, small logits",
    ),  # fmt: skip
    ("return loss, grad / n", "return loss, grad / (n + 1)", "dlogits wrong for N=1, K=3"),
    ("return loss, grad / n", "return loss, -grad / n", "dlogits wrong for N=4, K=5"),
    ("return loss, grad / n", "return loss, grad", "times too large, the batch size"),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("old", "new", "said"), XENT)
def test_softmax_xent_wrong_answers(tmp_path, old, new, said):
    text = findings(tmp_path, "softmax-xent", [(old, new)])
    assert said in text, text


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_softmax_xent_names_overflow_and_underflow_apart(tmp_path):
    # Shifting only rows whose max is positive: right near +1000, every exp underflows
    # near -1000 (the check must call that underflow, not overflow).
    text = findings(tmp_path, "softmax-xent", [(
        "shifted = logits - logits.max(axis=1, keepdims=True)",
        "shifted = logits - np.maximum(logits.max(axis=1, keepdims=True), 0)",
    )])  # fmt: skip
    assert "logits near -1000: exp underflows to 0 for every class" in text
    assert "overflows" not in text


TABLE_HEADER = "workers,staleness_mean,staleness_max\n"
TABLES = [  # (rows, what the check must say)
    ("1,0,0\n2,1,2\n", "measure at least 3 worker counts, starting with 1; the table has [1, 2]"),
    ("2,1,2\n3,2,4\n4,3,5\n", "starting with 1; the table has [2, 3, 4]"),
    ("1,0,1\n2,1,2\n4,3,5\n", "workers=1: staleness mean 0, max 1, expected 0"),
    ("1,0.2,1\n2,1,2\n4,3,5\n", "workers=1: staleness mean 0.2, max 1, expected 0"),
    ("1,0,0\n2,-0.5,2\n4,3,5\n", "workers=2: mean -0.5 is not between 0 and the max 2"),
    ("1,0,0\n2,3,2\n4,3,5\n", "workers=2: mean 3 is not between 0 and the max 2"),
    ("1,0,0\n2,0.05,1\n4,3,5\n", "workers=2: mean staleness 0.05 is far below"),
    ("1,0,0\n2,1,2\n4,0.2,5\n", "workers=4: mean staleness 0.2 is far below"),
    ("1,0,0\n2,x,2\n4,3,5\n", "line 3: staleness_mean is 'x', not a number"),
]


@pytest.mark.parametrize(("rows", "said"), TABLES)
def test_staleness_table_wrong_answers(tmp_path, rows, said):
    path = tmp_path / "staleness.csv"
    path.write_text(TABLE_HEADER + rows)
    _answer, result = check("staleness-experiment", path)
    assert not result.passed and said in "\n".join(result.findings), result.findings


def test_staleness_table_at_the_bounds_passes(tmp_path):
    # The check's bounds are inclusive: mean == max, mean == 0.1 * (N - 1).
    path = tmp_path / "staleness.csv"
    path.write_text(TABLE_HEADER + "1,0,0\n2,0.1,0.1\n3,0.2,3\n")
    _answer, result = check("staleness-experiment", path)
    assert result.passed, result.findings
    path.write_text("workers,staleness_mean\n1,0\n")
    _answer, result = check("staleness-experiment", path)
    assert (
        "needs a header with the columns workers, staleness_mean, staleness_max"
        in (result.findings[0])
    )


LOOP = [  # (old, new, what the check must say): each is two runs against a real server
    (
        "        if ps.push(grads, base=version, samples=samples).stop:\n            break\n",
        "        ps.push(grads, base=version, samples=samples)\n"
        "        if ps.push(grads, base=version, samples=samples).stop:\n            break\n",
        "the server applied 12 pushes, expected 6 (one a step)",
    ),  # fmt: skip
    (
        "for _ in range(steps):",
        "for _ in range(steps - 1):",
        "compute_gradients was called 5 times for steps=6",
    ),  # fmt: skip
    (
        "base=version, samples=samples",
        "base=version, samples=samples // 2",
        "the server counted 24 samples, expected 48",
    ),  # fmt: skip
    (
        "base=version, samples=samples",
        "base=max(0, version - 1), samples=samples",
        "push 1 had staleness 1 although you are the only worker",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("old", "new", "said"), LOOP)
def test_worker_loop_wrong_answers(tmp_path, old, new, said):
    text = findings(tmp_path, "worker-loop", [(old, new)])
    assert said in text, text
