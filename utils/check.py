"""Run graded tests in this process and report them: `check(...)` in a notebook, `course grade`."""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from dataclasses import dataclass, field

import pytest
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from utils import TESTS_DIR
from utils.chapters import find_exercise, read_chapter
from utils.display import show
from utils.grading import Impl, load_impl

GRADED_DIR = TESTS_DIR / "graded"


@dataclass
class TestResult:
    nodeid: str
    chapter: str
    exercise: str
    outcome: str  # passed / failed / skipped / error (a test file that could not be collected)
    message: str  # the failure in words, in full
    note: str = ""  # e.g. which reference stood in for a broken earlier exercise


@dataclass
class GradedRun:
    """What one grading run gave: its results, and why it might have run nothing."""

    results: list[TestResult]
    exit_code: int  # pytest's
    skipped: list[str] = field(default_factory=list)  # the reasons of skipped tests

    @property
    def errors(self) -> list[TestResult]:
        return [r for r in self.results if r.outcome == "error"]

    def why_nothing_ran(self) -> str:
        """The cause, in words, when no test passed or failed."""
        if self.skipped:
            return "every test was skipped: " + "; ".join(dict.fromkeys(self.skipped))
        if self.exit_code == pytest.ExitCode.NO_TESTS_COLLECTED:
            return "no graded test carries this exercise's marker (tests/graded)"
        return f"pytest stopped with exit code {int(self.exit_code)} before any test ran"


def _crash_line(report) -> str:
    """The last line of a collection error that says what went wrong."""
    text = str(report.longrepr).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("E "):
            return line[1:].strip()
    return lines[-1] if lines else "unknown error"


class _Collector:
    def __init__(self):
        self.results: list[TestResult] = []
        self.skipped: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:  # a test file that cannot even be imported: say which and why
            self.results.append(
                TestResult(
                    nodeid=report.nodeid,
                    chapter=_chapter_of_file(report.nodeid),
                    exercise="?",
                    outcome="error",
                    message=f"{report.nodeid} could not be loaded: {_crash_line(report)}",
                )
            )

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped.append(reason.removeprefix("Skipped: "))
        if report.when != "call" and report.outcome == "passed":
            return
        if report.when == "teardown" and report.outcome != "failed":
            return
        props = dict(report.user_properties)
        self.results.append(
            TestResult(
                nodeid=report.nodeid,
                chapter=props.get("chapter", "?"),
                exercise=props.get("exercise", "?"),
                outcome=report.outcome,
                message=props.get("message", ""),
                note=props.get("note", ""),
            )
        )


def _chapter_of_file(nodeid: str) -> str:
    name = nodeid.rsplit("/", 1)[-1]
    return name[len("test_") : len("test_") + 2] if name.startswith("test_") else "?"


def graded_files(chapter: str | None = None) -> list[str]:
    """The graded test files of one chapter (all of them without one): grading a chapter
    never imports another chapter's tests, so one that cannot load never stops the others."""
    pattern = f"test_{chapter[:2]}_*.py" if chapter else "test_*.py"
    return [str(p) for p in sorted(GRADED_DIR.glob(pattern))]


class LiveImpls:
    """A pytest plugin that hands a running notebook's namespace to the `impl` fixture."""

    def __init__(self, impls: dict[str, Impl]):
        self.impls = impls

    def pytest_configure(self, config):
        config.course_live_impls = self.impls


def run_graded(
    args: list[str], plugins: list | None = None, chapter: str | None = None
) -> GradedRun:
    """Run graded tests in this process; pytest's own report is swallowed, results returned."""
    collector = _Collector()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(
            [
                *graded_files(chapter),
                "-q",
                "--capture=sys",
                "--color=no",
                "-p",
                "no:cacheprovider",
                # The plugin that reports exceptions raised in __del__ collects garbage at the
                # end of each run: two full collections, over a kernel that holds models, were
                # three quarters of a check's time (0.54 of 0.70 s, profiled).
                "-p",
                "no:unraisableexception",
                *args,
            ],
            plugins=[collector, *(plugins or [])],
        )
    return GradedRun(collector.results, code, collector.skipped)


class FirstTestOnly:
    """A check cell runs only the first of its exercise's tests (the cheap deterministic ones
    come first) when CHECK_SPOT is set. The test that runs the teacher notebooks sets it in the
    kernel (a cell of its own, not an environment variable: the kernel's environment is a
    learner's); the notebooks' check cells would otherwise repeat the whole graded suite that
    make test's other lane runs on the same solutions, and one test per check still proves that
    the cell's objects reach the grader from a live kernel."""

    @pytest.hookimpl(trylast=True)  # after `-m exercise` has deselected the other tests
    def pytest_collection_modifyitems(self, config, items):
        if len(items) > 1:
            config.hook.pytest_deselected(items=items[1:])
            del items[1:]


CHECK_SPOT = False


def _tests(n: int) -> str:
    return "1 test" if n == 1 else f"{n} tests"


def failure_lines(failed: list[TestResult]) -> list[str]:
    """One line per failing test function, not per case: the cases of a parametrized test that
    fail with the same message are one cause, said once with their count; cases that fail
    differently show the first case's message and the count."""
    by_test: dict[str, list[TestResult]] = {}
    for r in failed:
        by_test.setdefault(r.nodeid.split("::")[-1].split("[")[0], []).append(r)
    lines = []
    for test, rs in by_test.items():
        if len(rs) == 1:
            lines.append(f"{rs[0].nodeid.split('::')[-1]}: {rs[0].message}")
        elif len({r.message for r in rs}) == 1:
            lines.append(f"{test} ({len(rs)} cases): {rs[0].message}")
        else:
            first = rs[0].nodeid.split("::")[-1]
            lines.append(f"{test} ({len(rs)} cases; the first, {first}): {rs[0].message}")
    return lines


def check(exercise: str, namespace: dict | None = None) -> None:
    """Grade one exercise against what this notebook has defined; print a short verdict."""
    ex = find_exercise(exercise)
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals
    impl = load_impl("live", ex.chapter, namespace)
    live = LiveImpls({ex.chapter: impl})
    plugins = [live] + ([FirstTestOnly()] if CHECK_SPOT else [])
    run = run_graded(["-m", exercise, "--impl", "live"], plugins, chapter=ex.chapter)
    results = [r for r in run.results if r.outcome != "skipped"]  # GPU-only tests without a GPU
    failed = [r for r in results if r.outcome in ("failed", "error")]
    passed = [r for r in results if r.outcome == "passed"]
    lines = []
    if run.errors:
        lines.append(f"[bold red]✗ {exercise}: the graded tests could not be loaded[/]")
        lines += [f"  [red]•[/red] {escape(r.message)}" for r in run.errors]
    elif not results:
        lines.append(f"[bold red]✗ {exercise}: no test ran: {escape(run.why_nothing_ran())}[/]")
    elif failed:
        lines.append(f"[bold red]✗ {exercise}: {len(failed)} of {_tests(len(results))} failed[/]")
        lines += [f"  [red]•[/red] {escape(line)}" for line in failure_lines(failed)]
    else:
        every = "the test" if len(passed) == 1 else f"all {len(passed)} tests"
        lines.append(f"[bold green]✓ {exercise}: {every} passed[/]")
    for note in dict.fromkeys(r.note for r in results if r.note):
        lines.append(f"  [dim]note: {escape(note)}[/dim]")
    show("\n".join(lines))
    if (failed or not results) and os.environ.get("COURSE_STRICT_CHECK") == "1":
        raise AssertionError(f"check({exercise!r}) failed")


def grade(impl: str = "notebooks", chapter: str | None = None) -> GradedRun:
    args = ["--impl", impl]
    if chapter:
        args += ["-m", f"chapter_{chapter[:2]}"]
    run = run_graded(args, chapter=chapter)
    table = Table(title=f"Grades ({impl})")
    for col in ("chapter", "exercise", "status", "first failure"):
        table.add_column(col, overflow="fold")
    summary: dict[tuple[str, str], list[TestResult]] = {}
    for r in run.results:
        if r.outcome not in ("skipped", "error"):  # GPU-only tests without a GPU: neither
            summary.setdefault((r.chapter, r.exercise), []).append(r)
    # Every exercise gets a row, in chapter order, even if it has no result.
    chapters = sorted(
        {c for c, _ in summary} | ({chapter} if chapter else set()) | _chapters_of(run.errors)
    )
    done = 0
    rows = 0
    for ch in chapters:
        for ex in read_chapter(ch).exercises:
            rs = summary.get((ch, ex.name), [])
            failed = [r for r in rs if r.outcome == "failed"]
            ok = bool(rs) and not failed
            done += ok
            rows += 1
            if ok:
                status = f"[green]pass {len(rs)}/{len(rs)}[/]"
            elif rs:
                status = f"[red]fail {len(rs) - len(failed)}/{len(rs)}[/]"
            else:
                status = "[red]no test ran[/]"
            first = escape(failed[0].message) if failed else ""
            if not rs:
                errors = [r.message for r in run.errors if r.chapter == ch[:2]]
                first = escape(errors[0] if errors else run.why_nothing_ran())
            table.add_row(ch, ex.name, status, first)
    table.caption = f"{done} of {rows} exercises pass."
    if impl == "notebooks":  # why a check() in the notebook can say otherwise
        table.caption += (
            " Graded from your saved notebooks, every needed cell run in order (save first); a "
            "check() in the notebook grades what its kernel has run."
        )
    Console().print(table)
    return run


def _chapters_of(errors: list[TestResult]) -> set[str]:
    """The chapters whose test files could not be loaded, by name."""
    from utils.chapters import chapter_names

    numbers = {r.chapter for r in errors}
    return {name for name in chapter_names() if name[:2] in numbers}
