"""Time limits hold on a busy machine: each is an idle machine's, stretched by one setting
(COURSE_TIME_SCALE, utils/timing.py), pytest-timeout's per-test limit included."""

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
