"""Each exercise check fails on its untouched starter, passes on a correct solution
(tests/exercise_solutions/), and names the mistake for typical wrong answers."""

import subprocess
import sys
from pathlib import Path

import pytest

from minips.classroom.exercise import EXERCISES, check
from minips.classroom.exercise.ps_checks import FORMULAS, dasgd_reference
from minips.rules import make_rule

ROOT = Path(__file__).resolve().parents[2]
STARTERS = ROOT / "minips" / "classroom" / "exercise" / "starters"
SOLUTIONS = Path(__file__).resolve().parents[1] / "exercise_solutions"


@pytest.mark.parametrize("name", list(EXERCISES))
def test_check_fails_on_the_untouched_starter(name):
    answer, result = check(name, STARTERS / EXERCISES[name].starter)
    assert not result.passed
    assert "not written yet" in result.findings[0] or "not a number" in result.findings[0]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_check_passes_on_a_correct_solution(name):
    _answer, result = check(name, SOLUTIONS / EXERCISES[name].starter)
    assert result.passed, result.findings
    assert result.notes


def _variant(tmp_path, name, old, new):
    """The solution of `name` with `old` replaced by `new`: a typical student mistake."""
    source = (SOLUTIONS / EXERCISES[name].starter).read_text()
    assert old in source
    path = tmp_path / EXERCISES[name].starter
    path.write_text(source.replace(old, new))
    _answer, result = check(name, path)
    assert not result.passed
    return "\n".join(result.findings)


def test_dense_mean_instead_of_sum_is_named(tmp_path):
    text = _variant(tmp_path, "dense-backward", "dy.sum(axis=0)", "dy.mean(axis=0)")
    assert "db wrong for N=5" in text and "times too small" in text and "sum over the batch" in text
    assert "dx wrong" not in text and "dw wrong" not in text


def test_dense_transposed_dw_is_a_shape_finding(tmp_path):
    text = _variant(tmp_path, "dense-backward", "x.T @ dy", "(x.T @ dy).T")
    assert "dw wrong for N=5, in=4, out=3: dw has shape (3, 4), expected (4, 3)" in text


def test_conv_padding_mistake_names_padding_and_index(tmp_path):
    # Forgetting to cut the padding off dx is right only for padding 0.
    right = "return dxp[:, :, padding : padding + h, padding : padding + wd]"
    text = _variant(tmp_path, "conv-backward", right, "return dxp[:, :, :h, :wd]")
    assert "dx wrong for stride=1, padding=1: " in text
    assert "stride=1, padding=0" not in text and "dw wrong" not in text
    assert "max relative error" in text and "at index (" in text


def test_conv_stride_mistake_is_found_for_strided_cases_only(tmp_path):
    text = _variant(
        tmp_path, "conv-backward", "slice(j * stride, j * stride + k)", "slice(j, j + k)"
    )
    assert "stride=2, padding=0" in text and "stride=1" not in text


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_softmax_without_shift_overflows_with_advice(tmp_path):
    text = _variant(
        tmp_path, "softmax-xent", "logits - logits.max(axis=1, keepdims=True)", "logits"
    )
    assert "logits near 1000: exp overflows to inf" in text and "subtract each row's max" in text
    assert "logits near -1000: exp underflows to 0 for every class" in text
    assert "small logits" not in text


def test_softmax_gradient_not_divided_by_n(tmp_path):
    text = _variant(tmp_path, "softmax-xent", "grad / n", "grad")
    assert "dlogits wrong" in text and "times too large" in text and "mean over N" in text


def test_worker_loop_wrong_base_and_missing_samples_and_bye(tmp_path):
    source = (SOLUTIONS / "worker_loop.py").read_text()
    wrong = (
        source.replace("base=version, samples=samples", "base=0")
        .replace("    ps.bye()\n", "")
    )  # fmt: skip
    path = tmp_path / "worker_loop.py"
    path.write_text(wrong)
    _answer, result = check("worker-loop", path)
    text = "\n".join(result.findings)
    assert "push 1 had staleness 1" in text and "base must be" in text
    assert "counted 0 samples, expected 48" in text
    assert "never said bye" in text


def test_worker_loop_stale_params_and_ignored_stop(tmp_path):
    # The budget's last push is answered normally; the next pull says stop.
    text = _variant(tmp_path, "worker-loop", "        if reply.stop:\n            break\n", "")
    assert "after a reply said stop: true" in text
    text = _variant(
        tmp_path,
        "worker-loop",
        "params.update(reply.params)",
        "params = params or dict(reply.params)",
    )
    assert "step 1: you computed on parameters that are not the server's latest" in text


def test_dasgd_inverse_without_max_is_caught_at_tau_zero(tmp_path):
    text = _variant(tmp_path, "dasgd-scale", "1.0 / max(1, tau)", "1.0 / tau")
    assert "for schedule 'inverse' raised ZeroDivisionError" in text


def test_dasgd_cutoff_off_by_one_names_the_tau(tmp_path):
    text = _variant(tmp_path, "dasgd-scale", "tau <= tau_max", "tau < tau_max")
    assert "schedule 'cutoff' with {'beta': 0.2, 'power': 0.5, 'tau_max': 8}: f(8) = 0.0" in text
    assert "'inverse'" not in text


def test_ssp_strict_bound_is_explained(tmp_path):
    text = _variant(tmp_path, "ssp-hold", "<= s", "< s")
    assert (
        "may_pull(5, [5, 2], s=3) returned False, expected True: 5 - min(clocks) = 3 <= s" in text
    )


def test_topk_without_feedback_and_by_value(tmp_path):
    text = _variant(tmp_path, "topk-feedback", "acc[indices] = 0", "acc[:] = 0")
    assert "step 0: sent + residual != residual_before + grad" in text and "not sent" in text
    text = _variant(tmp_path, "topk-feedback", "np.argpartition(np.abs(acc)", "np.argpartition(acc")
    assert "not the k largest by magnitude" in text


def test_staleness_table_inconsistencies(tmp_path):
    table = tmp_path / "staleness.csv"
    table.write_text("workers,staleness_mean,staleness_max\n1,0.5,2\n2,1.0,4\n")
    _answer, result = check("staleness-experiment", table)
    text = "\n".join(result.findings)
    assert "at least 3 worker counts" in text and "workers=1: staleness mean 0.5" in text


def test_checker_reference_matches_the_servers_dasgd():
    # The checker keeps its own f(tau) (students read it); it must be the server's.
    options = {"exp": {"beta": 0.3}, "poly": {"power": 0.7}, "cutoff": {"tau_max": 4}}
    for schedule in FORMULAS:
        rule = make_rule("dasgd", schedule=schedule, **options.get(schedule, {}))
        settings = {"beta": 0.3, "power": 0.7, "tau_max": 4}
        for tau in range(0, 10):
            assert dasgd_reference(tau, schedule, **settings) == rule.factor(tau)


def test_cli_list_and_check_exit_codes(tmp_path):
    def minips(*args):
        return subprocess.run(
            [sys.executable, "-m", "minips", *args], capture_output=True, text=True, timeout=60
        )

    listing = minips("exercise", "list")
    assert listing.returncode == 0 and all(name in listing.stdout for name in EXERCISES)
    good = minips("exercise", "check", "ssp-hold", "--file", str(SOLUTIONS / "ssp_hold.py"))
    assert good.returncode == 0 and "PASSED" in good.stdout
    bad = minips("exercise", "check", "ssp-hold", "--file", str(STARTERS / "ssp_hold.py"))
    assert bad.returncode == 1 and "WRONG: may_pull() is not written yet" in bad.stdout
    unknown = minips("exercise", "check", "nope")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: unknown exercise 'nope'")
    missing = minips("exercise", "check", "ssp-hold", "--file", str(tmp_path / "none.py"))
    assert missing.returncode == 2 and "error: no file" in missing.stderr
