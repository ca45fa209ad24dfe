"""utils/timing.py: time limits that hold on a busy machine (each an idle machine's, stretched by
one setting, COURSE_TIME_SCALE, pytest-timeout's per-test limit included), and the measuring
helpers the chapters and benchmarks share."""

import os
import subprocess
import sys
import textwrap

import pytest

from utils import REPO_ROOT
from utils.timing import patient, time_scale

SLEEPER = textwrap.dedent(
    """\
    import time

    import pytest


    @pytest.mark.timeout(1)
    def test_marked():
        time.sleep(2)
    """
)


def test_patient_stretches_by_the_one_setting(monkeypatch):
    monkeypatch.delenv("COURSE_TIME_SCALE", raising=False)
    assert time_scale() == 1 and patient(20) == 20  # a learner's budgets, as they always were
    monkeypatch.setenv("COURSE_TIME_SCALE", "2.5")
    assert patient(20) == 50


@pytest.mark.parametrize("bad", ["0.5", "0", "-2", "fast", "nan"])
def test_a_scale_below_one_or_not_a_number_is_refused(monkeypatch, bad):
    monkeypatch.setenv("COURSE_TIME_SCALE", bad)
    with pytest.raises(ValueError, match="COURSE_TIME_SCALE must be a number >= 1"):
        time_scale()


@pytest.mark.parametrize("scale, outcome", [("1", "1 failed"), ("3", "1 passed")])
def test_pytest_timeouts_stretch_with_the_scale(tmp_path, scale, outcome):
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "utils.pytest_options", "-p",
         "no:cacheprovider", str(tmp_path / "test_sleeper.py")],
        cwd=tmp_path, env={**os.environ, "COURSE_TIME_SCALE": scale, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=patient(120),
    )  # fmt: skip
    assert outcome in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


# --------------------------------------------------------------------------- measuring helpers


def test_interleaved_runs_rotate_the_order_and_compare_every_output():
    from utils.timing import interleaved_runs

    calls = []
    outputs = {"a": iter([1, 1, 1, 1]), "b": iter([1, 1, 2, 1]), "c": iter([1, 1, 1, 1])}
    methods = {name: (lambda n=name: calls.append(n) or next(outputs[n])) for name in outputs}
    times, same = interleaved_runs(methods, runs=3, reference="a")
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert same == {"a": True, "b": False, "c": True}  # b's third call differed


def test_ratios_are_medians_within_runs_and_goals_say_met():
    from utils.records import goal
    from utils.timing import median_ratio, ratio_within_runs

    times = {"fast": [1.0, 2.0, 1.0], "slow": [3.0, 2.0, 5.0]}  # within runs: 3, 1, 5
    assert median_ratio(times["slow"], times["fast"]) == 3
    assert ratio_within_runs(times, "fast", "slow") == 3.0
    assert ratio_within_runs(times, "fast", "absent") is None
    assert goal("x", 2.5, 2.0, at_least=True)["met"] is True
    assert goal("x", 2.5, 2.0, at_least=False)["met"] is False
    assert goal("x", None, 2.0, at_least=True) == {
        "what": "x",
        "measured": None,
        "target": 2.0,
        "met": None,
    }
