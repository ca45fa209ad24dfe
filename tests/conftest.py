"""Pytest wiring for the autograder: `--impl`, the `impl` fixture, exercise markers, and the
rule that every graded test must fail on the blank stubs."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# Chapter 10: without a GPU, Triton's interpreter runs the kernels; the choice is made when
# `solutions` is imported, before anything here can import triton.
import solutions  # noqa: F401
from utils.chapters import all_exercises
from utils.grading import (
    ExerciseUnavailable,
    Impl,
    Verdict,
    failure_report,
    load_impl,
    run_graded_test,
)
from utils.timing import patient

EXERCISES = {ex.name: ex for ex in all_exercises()}
_IMPL_CACHE: dict[tuple[str, str], object] = {}


def pytest_configure(config):
    # The tests run small models: one thread is about as fast on a quiet machine and many times
    # faster on a busy one, where every parallel operation waits for its slowest thread (7x on
    # chapter 4's graded tests beside another test run). Forked graded children use one too.
    # A live check() runs pytest inside the learner's kernel: the setting is undone at the end.
    config.course_threads_before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("COURSE_TEST_THREADS", "1")))
    if config.getoption("--must-fail") and config.getoption("--impl") != "stubs":
        raise pytest.UsageError("--must-fail only makes sense with --impl stubs")
    if config.getoption("--mutants"):
        config.pluginmanager.register(MutantRun(), "course-mutants")
        # What a mutant's own code warns about (a scheduler stepped too early, a NaN in the
        # interpreter) is part of its mistake, not news about the run.
        config.addinivalue_line("filterwarnings", "ignore")
    for name, ex in EXERCISES.items():
        config.addinivalue_line("markers", f"{name}: exercise {name} of chapter {ex.chapter}")
    for chapter in sorted({ex.chapter for ex in EXERCISES.values()}):
        config.addinivalue_line("markers", f"chapter_{chapter[:2]}: graded tests of {chapter}")


def pytest_unconfigure(config):
    torch.set_num_threads(config.course_threads_before)


def pytest_ignore_collect(collection_path, config):
    """`pytest -m <exercise>` and `-m chapter_NN` load only that chapter's graded test files:
    grading one chapter never depends on whether another chapter's tests can be imported."""
    name = collection_path.name
    if collection_path.parent.name != "graded" or not name.startswith("test_"):
        return None
    chapter = _chapter_of_markexpr(config.getoption("markexpr", ""))
    if chapter is not None and not name.startswith(f"test_{chapter[:2]}_"):
        return True
    return None


def _chapter_of_markexpr(expr: str) -> str | None:
    """The chapter that `-m` selects when it names one exercise or one chapter, else None."""
    expr = (expr or "").strip()
    if expr in EXERCISES:
        return EXERCISES[expr].chapter
    if expr.startswith("chapter_") and expr[len("chapter_") :].isdigit():
        return expr[len("chapter_") :]
    return None


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
    if request.config.getoption("--mutants"):
        return MutantRun.impl(chapter, request.param)
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

    budget = pyfuncitem.get_closest_marker("budget")
    verdict = run_graded_test(
        impl, exercise, call, failure_report, patient(budget.args[0]) if budget else None
    )
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
def drafter_model():
    """The shipped draft model (same tokenizer, smaller) as a DemoTransformer."""
    from utils.models import load_model

    return load_model("shakespeare-draft")[0]


@pytest.fixture(scope="session")
def hf_draft():
    """The draft model's weights as HF's GPT2LMHeadModel."""
    from utils.models import load_hf

    return load_hf("shakespeare-draft")[0]


@pytest.fixture(scope="session")
def hf():
    """The same weights as HF's GPT2LMHeadModel: the implementation nobody here wrote."""
    from utils.models import load_hf

    return load_hf("shakespeare")[0]


def _fingerprint(value) -> list:
    """Each tensor a fixture holds (in a module, a tuple, a list or a dict), as its version
    counter (bumped by every in-place op) and its sum (which catches writes through `.data`)."""
    found = []

    def visit(v):
        if isinstance(v, torch.nn.Module):
            for t in v.state_dict(keep_vars=True).values():
                visit(t)
        elif isinstance(v, torch.Tensor):
            total = float(v.detach().double().sum())
            found.append((v._version, "nan" if total != total else total))
        elif isinstance(v, tuple | list):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    visit(value)
    return found


class MutantRun:
    """`--mutants`: every graded test runs once per curated mutant of its exercise, and a
    mutant must fail at least one of them (tests/machinery/mutants/ says more)."""

    _impls: dict[str, Impl] = {}

    def __init__(self):
        self.killed: dict[str, str] = {}  # mutant id -> the test that killed it
        self.messages: dict[str, tuple[str, str]] = {}  # mutant id -> (test, whole message)
        self.tried: dict[str, str] = {}  # mutant id -> chapter
        self._fingerprints: dict[str, list] = {}  # session fixture -> its tensors, summarised
        self._changed: list[str] = []  # the session fixtures the last test's call changed

    @staticmethod
    def impl(chapter: str, mutant_id: str) -> Impl:
        from tests.machinery.mutants import all_mutants, mutated_notebook
        from utils.grading import impl_from_notebook

        if mutant_id not in MutantRun._impls:
            nb = mutated_notebook(chapter, all_mutants()[mutant_id])
            MutantRun._impls[mutant_id] = impl_from_notebook(
                nb, chapter, source=f"mutant {mutant_id}"
            )
        return MutantRun._impls[mutant_id]

    def pytest_generate_tests(self, metafunc):
        from tests.machinery.mutants import mutants_of

        if "impl" not in metafunc.fixturenames:
            return
        names = [m.name for m in metafunc.definition.iter_markers() if m.name in EXERCISES]
        mutants = mutants_of(names[0]) if len(names) == 1 else []
        if mutants:
            metafunc.parametrize("impl", [m.id for m in mutants], indirect=True)
        else:
            skip = pytest.mark.skip(reason="no mutants of this exercise")
            metafunc.parametrize("impl", [pytest.param(None, marks=skip)], indirect=True)

    def pytest_collection_modifyitems(self, items):
        """A mutant's `try_first` test moves to the front of its module's tests (order only)."""
        from tests.machinery.mutants import all_mutants

        first = {m.id: m.try_first for m in all_mutants().values() if m.try_first}
        start: dict[str, int] = {}  # each module's first position, so modules stay together
        for i, item in enumerate(items):
            start.setdefault(item.nodeid.split("::")[0], i)

        def early(item) -> bool:
            mutant = self._mutant_of(item)
            return mutant in first and item.originalname == first[mutant]

        items.sort(key=lambda item: (start[item.nodeid.split("::")[0]], not early(item)))

    @staticmethod
    def _mutant_of(item) -> str | None:
        callspec = getattr(item, "callspec", None)
        return callspec.params.get("impl") if callspec else None

    def pytest_runtest_setup(self, item):
        mutant = self._mutant_of(item)
        if mutant is not None and mutant in self.killed:
            pytest.skip(f"mutant already killed by {self.killed[mutant]}")

    def _shared(self, item) -> dict:
        """The session fixtures of a mutant's test, where it runs in this process."""
        from utils.sandbox import runs_in_process

        if self._mutant_of(item) is None or not runs_in_process():
            return {}
        defs = item._fixtureinfo.name2fixturedefs
        return {
            name: value
            for name, value in item.funcargs.items()
            if name in defs and defs[name][-1].scope == "session"
        }

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        """Where mutants run in this process (make test sets COURSE_NO_FORK: a fork per test cost
        it a third of its time), a mutant that changed a shared model or tensor in place would
        decide the verdicts of the mutants after it. Each session fixture's tensors are summed
        before the first test that uses it and compared after every mutant's test; a change
        fails that test's teardown (its call's failure would only count as a kill), naming the
        mutant."""
        shared = self._shared(item)
        for name, value in shared.items():
            if name not in self._fingerprints:
                self._fingerprints[name] = _fingerprint(value)
        yield
        self._changed = [n for n, v in shared.items() if _fingerprint(v) != self._fingerprints[n]]

    def pytest_runtest_teardown(self, item):
        changed, self._changed = self._changed, []
        if changed:
            raise AssertionError(
                f"mutant {self._mutant_of(item)} changed the shared fixture {changed[0]!r} in "
                "place: in one process that would decide later mutants' verdicts. Run the "
                "mutants forked (without COURSE_NO_FORK=1), or make the test give the code a copy."
            )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        mutant = self._mutant_of(item)
        if mutant is None or report.when != "call":
            return
        self.tried[mutant] = item.module.CHAPTER
        if report.failed and mutant not in self.killed:
            message = dict(report.user_properties).get("message") or report.longreprtext
            lines = str(message).strip().splitlines() or [""]
            self.killed[mutant] = f"{item.originalname}: {lines[0][:160]}"
            self.messages[mutant] = (item.originalname, str(message))
        # A test a mutant passes is no failure in itself: another test may kill it.
        report.outcome, report.longrepr = "passed", None

    def survivors(self) -> list[str]:
        return sorted(m for m in self.tried if m not in self.killed)

    def mistold(self) -> dict[str, str]:
        """Killed mutants whose killing message lacks words their `says` declares."""
        from tests.machinery.mutants import all_mutants

        found = {}
        for mutant, (test, message) in sorted(self.messages.items()):
            text = " ".join(message.lower().split())
            missing = [
                w for w in all_mutants()[mutant].says if " ".join(w.lower().split()) not in text
            ]
            if missing:
                found[mutant] = f"{test} does not say {missing}"
        return found

    def pytest_terminal_summary(self, terminalreporter):
        from tests.machinery.mutants import all_mutants

        tr = terminalreporter
        tr.section("learner-style mutants")
        for chapter in sorted(set(self.tried.values())):
            ids = [m for m, ch in self.tried.items() if ch == chapter]
            dead = sum(m in self.killed for m in ids)
            tr.write_line(f"{chapter}: {dead}/{len(ids)} mutants killed")
        if tr.config.option.verbose > 0:  # -v: how each mutant died
            for mutant, how in sorted(self.killed.items()):
                tr.write_line(f"killed {mutant} by {how}")
        for mutant in self.survivors():
            tr.write_line(f"SURVIVED {mutant}: {all_mutants()[mutant].why}", red=True)
        for mutant, how in self.mistold().items():
            tr.write_line(f"MISTOLD {mutant} ({all_mutants()[mutant].why}): {how}", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.survivors() or self.mistold():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
