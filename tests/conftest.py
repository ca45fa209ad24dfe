"""Pytest wiring for the autograder: `--impl`, the `impl` fixture, exercise markers, and the
rule that every graded test must fail on the blank stubs."""

from __future__ import annotations

import sys

import pytest

from utils.chapters import all_exercises
from utils.grading import ExerciseUnavailable, Impl, Verdict, load_impl, run_graded_test

EXERCISES = {ex.name: ex for ex in all_exercises()}
_IMPL_CACHE: dict[tuple[str, str], object] = {}


def pytest_configure(config):
    if config.getoption("--must-fail") and config.getoption("--impl") != "stubs":
        raise pytest.UsageError("--must-fail only makes sense with --impl stubs")
    for name, ex in EXERCISES.items():
        config.addinivalue_line("markers", f"{name}: exercise {name} of chapter {ex.chapter}")
    for chapter in sorted({ex.chapter for ex in EXERCISES.values()}):
        config.addinivalue_line("markers", f"chapter_{chapter[:2]}: graded tests of {chapter}")


def _exercise_of(item) -> str | None:
    names = [m.name for m in item.iter_markers() if m.name in EXERCISES]
    return names[0] if len(names) == 1 else None


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "graded" not in item.nodeid.split("::")[0].split("/"):
            continue
        names = [m.name for m in item.iter_markers() if m.name in EXERCISES]
        if len(names) != 1:
            raise pytest.UsageError(f"{item.nodeid} must carry exactly one exercise marker")
        item.add_marker(pytest.mark.graded)
        item.add_marker(getattr(pytest.mark, f"chapter_{EXERCISES[names[0]].chapter[:2]}"))


@pytest.fixture
def impl(request):
    """The implementation under grade for this test module's CHAPTER."""
    chapter = request.module.CHAPTER
    kind = request.config.getoption("--impl")
    if kind == "live":
        return request.config.course_live_impls[chapter]  # set by utils.check.LiveImpls
    key = (kind, chapter)
    if key not in _IMPL_CACHE:
        _IMPL_CACHE[key] = load_impl(kind, chapter)
    return _IMPL_CACHE[key]


class GradedFailure(Exception):
    """A graded test that failed in its child process; the verdict says how."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message)
        self.verdict = verdict


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Graded tests of learner code run in a forked child (utils/grading.py says why)."""
    impl = pyfuncitem.funcargs.get("impl")
    exercise = _exercise_of(pyfuncitem)
    if not isinstance(impl, Impl) or not impl.isolated or exercise is None:
        return None  # pytest calls the test here, as usual
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    def call():
        pyfuncitem.obj(**args)

    def describe(err: BaseException) -> str:
        return str(pyfuncitem.repr_failure(pytest.ExceptionInfo.from_exception(err)))

    budget = pyfuncitem.get_closest_marker("budget")
    verdict = run_graded_test(impl, exercise, call, describe, budget.args[0] if budget else None)
    sys.stdout.write(verdict.stdout)
    sys.stderr.write(verdict.stderr)
    if verdict.notes:
        pyfuncitem.user_properties.append(("note", "; ".join(verdict.notes)))
    if not verdict.passed:
        raise GradedFailure(verdict)
    return True


def _not_implemented(excinfo) -> bool:
    err = excinfo.value if excinfo else None
    if isinstance(err, GradedFailure):
        return err.verdict.not_implemented
    while err is not None:
        if isinstance(err, NotImplementedError):
            return True
        err = err.__cause__ or err.__context__
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    exercise = _exercise_of(item)
    if exercise is None or "graded" not in item.keywords:
        return
    report.user_properties.append(("exercise", exercise))
    report.user_properties.append(("chapter", EXERCISES[exercise].chapter))
    excinfo = call.excinfo
    if report.when != "call":
        if report.failed and excinfo is not None:  # a fixture broke: say how
            report.user_properties.append(("message", excinfo.exconly().splitlines()[0]))
        return
    if report.failed and excinfo is not None:
        if isinstance(excinfo.value, GradedFailure):
            message = excinfo.value.verdict.message
            report.longrepr = excinfo.value.verdict.longrepr
        elif _not_implemented(excinfo):
            message = "not implemented yet: the cell still raises NotImplementedError"
            report.longrepr = message
        elif excinfo.errisinstance(ExerciseUnavailable):
            message = str(excinfo.value)
            report.longrepr = message
        else:
            message = excinfo.exconly().splitlines()[0] if excinfo.exconly() else excinfo.typename
        report.user_properties.append(("message", message))

    if item.config.getoption("--must-fail"):
        # Inverted: on blank stubs a graded test must fail, and fail because the exercise is
        # not implemented. A test that passes here cannot tell a learner anything.
        if report.passed:
            report.outcome = "failed"
            report.longrepr = "this graded test PASSES on the blank stubs: it cannot fail"
        elif report.failed and _not_implemented(excinfo):
            report.outcome = "passed"
            report.longrepr = None
        elif report.failed:
            report.longrepr = (
                "fails on the stubs, but not because the exercise is unimplemented: "
                + excinfo.exconly().splitlines()[0]
            )


@pytest.fixture(scope="session")
def shipped():
    """The shipped model as chapter 1's DemoTransformer (never graded itself), its tokenizer.
    Shared by every test: a test that changes it must work on a copy."""
    from utils.models import load_model

    return load_model("shakespeare")


@pytest.fixture(scope="session")
def shipped64(shipped):
    """The shipped model in float64: comparisons where rounding must not hide a mistake."""
    import copy

    return copy.deepcopy(shipped[0]).double()


@pytest.fixture(scope="session")
def hf():
    """The same weights as HF's GPT2LMHeadModel: the implementation nobody here wrote."""
    from utils.models import load_hf

    return load_hf("shakespeare")[0]
