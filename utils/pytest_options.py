"""The grader's command-line options, as a pytest plugin loaded from pyproject's `addopts`.

Options must be known before pytest reads any conftest.py below the repository root, so that
`pytest --impl solutions`, `pytest --runslow` and `pytest --impl stubs --must-fail` work as
typed from the repository root, with or without a path.
"""

from __future__ import annotations

from utils.grading import IMPL_KINDS


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
