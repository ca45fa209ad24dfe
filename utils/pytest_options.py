"""The grader's command-line options, as a pytest plugin loaded from pyproject's `addopts`.

Options must be known before pytest reads any conftest.py below the repository root, so that
`pytest --impl solutions`, `pytest --runslow` and `pytest --impl stubs --must-fail` work as
typed from the repository root, with or without a path.
"""

from __future__ import annotations

import pytest

from utils.grading import IMPL_KINDS
from utils.timing import patient, time_scale


def pytest_addoption(parser):
    group = parser.getgroup("course", "the course's grader")
    group.addoption(
        "--impl",
        default="notebooks",
        choices=IMPL_KINDS,
        help="what to grade: the learner's notebooks (default), solutions, or blank stubs",
    )
    group.addoption(
        "--must-fail",
        action="store_true",
        help="with --impl stubs: invert outcomes, so that a graded test passing on the blank "
        "stubs is reported as a failure (the course's self-check)",
    )
    group.addoption(
        "--mutants",
        action="store_true",
        help="grade the curated learner-style mutants (tests/machinery/mutants/) instead: "
        "each must fail at least one graded test of its exercise",
    )
    group.addoption(
        "--runslow",
        action="store_true",
        help="also run the tests marked slow (e.g. statistical tests repeated over many seeds)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running; skipped unless --runslow")
    config.addinivalue_line(
        "markers", "budget(seconds): time allowed to learner code in this graded test"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """pytest-timeout's limit on each test (its marker's, else the ini's `timeout`) stretched by
    COURSE_TIME_SCALE, as every other limit is (utils/timing.py)."""
    if time_scale() == 1:
        return
    default = config.getoption("timeout", None) or config.getini("timeout")
    for item in items:
        marker = item.get_closest_marker("timeout")
        if marker is None:
            seconds = default
        else:
            seconds = marker.args[0] if marker.args else marker.kwargs.get("timeout", default)
        if seconds and float(seconds) > 0:
            item.add_marker(pytest.mark.timeout(patient(float(seconds))), append=False)
