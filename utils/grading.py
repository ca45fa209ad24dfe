"""The grading seam: an `impl` namespace built from learner notebooks, solutions or stubs.

Graded tests never import `solutions`; they use `impl.Attention`, `impl.DemoTransformer`...
where `impl` comes from one of:

    notebooks  the learner's notebooks/NN_name.ipynb: setup + exercise cells, run in a fresh
               namespace (the default of plain `pytest`)
    solutions  the reference implementation in solutions/
    stubs      a fresh build of the pristine notebooks (every exercise unimplemented)
    live       the namespace of a running notebook kernel (the in-notebook `check(...)`)

Broken learner code never breaks grading: a cell that does not compile, raises, or runs
forever is recorded against its exercise; the objects it should have defined are replaced by
the reference ones for the cells that depend on them, and its own tests fail with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from utils.chapters import Exercise, import_object, read_chapter, solution_paths

CELL_TIMEOUT_S = float(os.environ.get("COURSE_CELL_TIMEOUT", "20"))
IMPL_CHOICES = ("notebooks", "solutions", "stubs", "live")


class ExerciseUnavailable(Exception):
    """The learner's code for an exercise could not be loaded (the message says why)."""


@dataclass
class Impl:
    """Attribute access to what a chapter defines, with an explanation for what it lacks."""

    source: str
    chapter: str
    namespace: dict = field(repr=False)
    problems: dict[str, str] = field(default_factory=dict)  # object name -> why it is missing

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.problems:
            raise ExerciseUnavailable(self.problems[name])
        try:
            return self.namespace[name]
        except KeyError:
            raise AttributeError(f"{self.source} defines no {name!r}") from None


class CellTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt pure-Python infinite loops at the top level of a cell (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CellTimeout()

    # pytest-timeout may already have an alarm running for the current test: keep it.
    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer_remaining, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_remaining > 0:
            left = outer_remaining - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))


_MODULE_IDS = itertools.count()


def _fresh_namespace(chapter: str) -> dict:
    """A new module's globals, registered in sys.modules: code such as `@dataclass` looks up
    the module a class was defined in, and a bare dict would not be found there."""
    module = types.ModuleType(f"course_{chapter}_{next(_MODULE_IDS)}")
    sys.modules[module.__name__] = module
    return module.__dict__


def _python_source(cell_source: str) -> str:
    """Drop IPython-only lines (%magics, !shell) that plain Python cannot compile."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines()
    )


def _run_cell(source: str, namespace: dict, filename: str) -> str | None:
    """Execute one cell; return None, or a one-paragraph description of what went wrong."""
    try:
        code = compile(_python_source(source), filename, "exec")
    except SyntaxError as err:
        return f"{type(err).__name__} in the cell, line {err.lineno}: {err.msg}"
    try:
        with _time_limit(CELL_TIMEOUT_S):
            exec(code, namespace)
    except CellTimeout:
        return f"the cell did not finish within {CELL_TIMEOUT_S:.0f} s (an infinite loop?)"
    except Exception as err:
        last = traceback.extract_tb(err.__traceback__)[-1]
        return f"the cell raised {type(err).__name__}: {err} (line {last.lineno})"
    return None


def _fallback(exercise: Exercise, namespace: dict) -> None:
    """Give dependent cells the reference objects of an exercise that did not load."""
    for dotted, name in zip(exercise.objects, exercise.object_names, strict=True):
        namespace[name] = import_object(dotted)


def impl_from_notebook(nb: nbformat.NotebookNode, chapter: str, source: str) -> Impl:
    spec = read_chapter(chapter)
    namespace = _fresh_namespace(chapter)
    problems: dict[str, str] = {}
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        filename = f"<{source} cell {index}>"
        if "setup" in tags or "source" in tags:
            error = _run_cell(cell.source, namespace, filename)
            if error:
                # Without its setup cells nothing in the chapter can be graded honestly.
                why = f"a setup cell of {source} failed ({error}); run `course reset` if unsure"
                problems.update({n: why for ex in spec.exercises for n in ex.object_names})
        elif "exercise" in tags:
            name = cell.metadata.get("exercise")
            try:
                exercise = spec.exercise(name)
            except KeyError:
                continue
            seen.add(name)
            error = _run_cell(cell.source, namespace, filename)
            for obj in exercise.object_names:
                if error:
                    problems[obj] = f"exercise {name!r} could not be loaded: {error}"
                elif obj not in namespace:
                    problems[obj] = f"exercise {name!r}: its cell ran but did not define {obj!r}"
            if error:
                _fallback(exercise, namespace)
    for exercise in spec.exercises:
        if exercise.name not in seen:
            why = (
                f"exercise {exercise.name!r} has no cell in {source} (deleted?); "
                f"`course reset {chapter[:2]}` restores a fresh notebook"
            )
            problems.update({n: why for n in exercise.object_names})
            _fallback(exercise, namespace)
    return Impl(source=source, chapter=chapter, namespace=namespace, problems=problems)


def impl_from_notebook_file(path: Path, chapter: str) -> Impl:
    if not path.exists():
        why = f"{path.name} is missing; `course reset {chapter[:2]}` builds a fresh one"
        spec = read_chapter(chapter)
        problems = {n: why for ex in spec.exercises for n in ex.object_names}
        return Impl(source=str(path), chapter=chapter, namespace={}, problems=problems)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # a notebook file broken beyond JSON
        spec = read_chapter(chapter)
        why = f"{path.name} cannot be read as a notebook ({err})"
        problems = {n: why for ex in spec.exercises for n in ex.object_names}
        return Impl(source=str(path), chapter=chapter, namespace={}, problems=problems)
    return impl_from_notebook(nb, chapter, source=f"notebooks/{path.name}")


def impl_from_solutions(chapter: str) -> Impl:
    spec = read_chapter(chapter)
    namespace = _fresh_namespace(chapter)
    for index, cell in enumerate(spec.notebook.cells):
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code":
            continue
        if "setup" in tags:
            error = _run_cell(cell.source, namespace, f"<{chapter} setup cell {index}>")
            if error:
                raise RuntimeError(f"setup cell {index} of chapters/{chapter}.py: {error}")
        elif "source" in tags:  # given code: the real objects, as the exercises below
            for dotted in solution_paths(cell.source):
                namespace[dotted.rpartition(".")[2]] = import_object(dotted)
    for exercise in spec.exercises:
        _fallback(exercise, namespace)
    return Impl(source="solutions", chapter=chapter, namespace=namespace)


def impl_from_live(namespace: dict, chapter: str) -> Impl:
    """What a running notebook has defined so far."""
    spec = read_chapter(chapter)
    problems = {}
    for exercise in spec.exercises:
        for name in exercise.object_names:
            if name not in namespace:
                problems[name] = (
                    f"{name!r} is not defined yet: run the cell of exercise {exercise.name!r}"
                )
    return Impl(source="this notebook", chapter=chapter, namespace=namespace, problems=problems)


def load_impl(kind: str, chapter: str) -> Impl:
    from utils.build import build_notebook, notebook_path

    if kind == "solutions":
        return impl_from_solutions(chapter)
    if kind == "stubs":
        return impl_from_notebook(build_notebook(chapter), chapter, source="stub notebook")
    if kind == "notebooks":
        return impl_from_notebook_file(notebook_path(chapter), chapter)
    raise ValueError(f"impl must be one of {IMPL_CHOICES}, got {kind!r}")
