"""Run graded tests in this process and report them: `check(...)` in a notebook, `course grade`."""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from dataclasses import dataclass

import pytest
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from utils import TESTS_DIR
from utils.chapters import find_exercise, read_chapter
from utils.grading import Impl, load_impl

GRADED_DIR = TESTS_DIR / "graded"


@dataclass
class TestResult:
    nodeid: str
    chapter: str
    exercise: str
    outcome: str  # passed / failed / skipped
    message: str  # first line of the failure, for a table
    note: str = ""  # e.g. which reference stood in for a broken earlier exercise


class _Collector:
    def __init__(self):
        self.results: list[TestResult] = []

    def pytest_runtest_logreport(self, report):
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


class LiveImpls:
    """A pytest plugin that hands a running notebook's namespace to the `impl` fixture."""

    def __init__(self, impls: dict[str, Impl]):
        self.impls = impls

    def pytest_configure(self, config):
        config.course_live_impls = self.impls


def run_graded(args: list[str], plugins: list | None = None) -> list[TestResult]:
    """Run graded tests in this process; pytest's own report is swallowed, results returned."""
    collector = _Collector()
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(
            [str(GRADED_DIR), "-q", "--capture=sys", "-p", "no:cacheprovider", *args],
            plugins=[collector, *(plugins or [])],
        )
    return collector.results


class FirstTestOnly:
    """COURSE_CHECK_SPOT=1: a check cell runs only the first of its exercise's tests (the
    cheap deterministic ones come first). `make test` sets it when it runs the teacher
    notebooks, whose check cells would otherwise repeat the whole graded suite that the other
    lane already runs on the same solutions; one test per check still proves that the cell's
    objects reach the grader from a live kernel."""

    @pytest.hookimpl(trylast=True)  # after `-m exercise` has deselected the other tests
    def pytest_collection_modifyitems(self, config, items):
        if len(items) > 1:
            config.hook.pytest_deselected(items=items[1:])
            del items[1:]


def _tests(n: int) -> str:
    return "1 test" if n == 1 else f"{n} tests"


def check(exercise: str, namespace: dict | None = None) -> None:
    """Grade one exercise against what this notebook has defined; print a short verdict."""
    ex = find_exercise(exercise)
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals
    impl = load_impl("live", ex.chapter, namespace)
    live = LiveImpls({ex.chapter: impl})
    plugins = [live] + ([FirstTestOnly()] if os.environ.get("COURSE_CHECK_SPOT") == "1" else [])
    results = run_graded(["-m", exercise, "--impl", "live"], plugins)
    console = Console()
    results = [r for r in results if r.outcome != "skipped"]  # GPU-only tests without a GPU
    failed = [r for r in results if r.outcome == "failed"]
    passed = [r for r in results if r.outcome == "passed"]
    if not results:
        console.print(f"[yellow]No tests ran for {exercise!r}.[/yellow]")
    elif failed:
        console.print(f"[bold red]✗ {exercise}: {len(failed)} of {_tests(len(results))} failed[/]")
        for r in failed:
            console.print(f"  [red]•[/red] {r.nodeid.split('::')[-1]}: {escape(r.message)}")
    else:
        every = "the test" if len(passed) == 1 else f"all {len(passed)} tests"
        console.print(f"[bold green]✓ {exercise}: {every} passed[/]")
    for note in dict.fromkeys(r.note for r in results if r.note):
        console.print(f"  [dim]note: {escape(note)}[/dim]")
    if (failed or not results) and os.environ.get("COURSE_STRICT_CHECK") == "1":
        raise AssertionError(f"check({exercise!r}) failed")


def grade(impl: str = "notebooks", chapter: str | None = None) -> list[TestResult]:
    args = ["--impl", impl]
    if chapter:
        args += ["-m", f"chapter_{chapter[:2]}"]
    results = run_graded(args)
    table = Table(title=f"Grades ({impl})")
    for col in ("chapter", "exercise", "status", "first failure"):
        table.add_column(col)
    summary: dict[tuple[str, str], list[TestResult]] = {}
    for r in results:
        if r.outcome != "skipped":  # e.g. GPU-only tests without a GPU: neither pass nor fail
            summary.setdefault((r.chapter, r.exercise), []).append(r)
    # Every exercise gets a row, in chapter order, even if it has no result.
    chapters = sorted({c for c, _ in summary} | ({chapter} if chapter else set()))
    done = 0
    rows = 0
    for ch in chapters:
        for ex in read_chapter(ch).exercises:
            rs = summary.get((ch, ex.name), [])
            failed = [r for r in rs if r.outcome == "failed"]
            ok = bool(rs) and not failed
            done += ok
            rows += 1
            status = (
                f"[green]pass {len(rs)}/{len(rs)}[/]"
                if ok
                else (
                    f"[red]fail {len(rs) - len(failed)}/{len(rs)}[/]"
                    if rs
                    else "[yellow]no tests[/]"
                )
            )
            first = escape(failed[0].message[:90]) if failed else ""
            table.add_row(ch, ex.name, status, first)
    table.caption = f"{done} of {rows} exercises pass"
    Console().print(table)
    return results
