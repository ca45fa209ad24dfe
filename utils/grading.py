"""The grading seam: an `impl` namespace built from learner notebooks, solutions or stubs, and
the one place where a graded test calls into learner code.

Graded tests never import `solutions`; they use `impl.Attention`, `impl.DemoTransformer`...
where `impl` comes from one of (`IMPL_KINDS`, the only dispatch):

    notebooks  the learner's saved notebooks/NN_name.ipynb (the default of plain `pytest`)
    solutions  the reference implementation in solutions/
    stubs      a fresh build of the pristine notebooks (every exercise unimplemented)
    live       the namespace of a running notebook kernel (the in-notebook `check(...)`)

Rules, the same for `pytest`, `course grade` and `check(...)`:

- Which cells count: the setup cells, the given-code cells, the exercise cells, and any other
  cell that defines a name those use (a helper of yours, `cfg` from a demo cell). Demo cells
  and `check(...)` cells are not run. A live notebook has run what it has run.
- Learner code never runs in the grader's process during a test: each graded test runs in a
  forked child (utils/sandbox.py) under a time budget. An infinite loop, `sys.exit()`,
  `os._exit()` or a crash fails that test with a message naming the function and the line;
  a function found looping fails at once in the exercise's later tests.
- The reference stands in for a broken earlier exercise: when a test of one exercise fails
  inside another exercise's code (not implemented, raising, looping, exiting), or that exercise
  did not load, the test runs again with the reference objects of that exercise, and the
  message says so. A reference function that stands in calls the notebook's own objects of
  the other exercises, so each test still grades its exercise's code wherever it is called.
  Wrong values are not "broken": each exercise's own tests find those.
- A cell that rebinds a name of the setup cell (`torch = None`) fails its own exercise with a
  message saying so; the other exercises are graded with the name restored.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import nbformat

from utils import TESTS_DIR
from utils.cells import (
    cell_names,
    defined_by,
    name_error_hint,
    raises_not_implemented,
    run_cell,
)
from utils.chapters import Chapter, Exercise, import_object, read_chapter, solution_paths
from utils.sandbox import Outcome, call_isolated, exit_description, kind_of
from utils.timing import patient

# A cell run to grade a notebook: COURSE_CELL_TIMEOUT, else 20 s stretched as the budget below.
CELL_TIMEOUT_S = float(os.environ.get("COURSE_CELL_TIMEOUT") or patient(20.0))


# Per graded test, for learner code: generous for a correct solution on a 2-core laptop,
# short enough that a loop is reported in seconds, not minutes. A test may ask for more with
# @pytest.mark.budget(seconds). COURSE_TEST_BUDGET sets it outright; otherwise 20 s, stretched
# by COURSE_TIME_SCALE (utils/timing.py), which a learner never sets and `make test` does.
def test_budget_s() -> float:
    explicit = os.environ.get("COURSE_TEST_BUDGET")
    return float(explicit) if explicit else patient(20.0)


IMPL_KINDS = ("notebooks", "solutions", "stubs", "live")
LIVE_SOURCE = "this notebook"


class ExerciseUnavailable(Exception):
    """The learner's code for an exercise could not be loaded (the message says why)."""


@dataclass
class Impl:
    """Attribute access to what a chapter defines, with an explanation for what it lacks."""

    source: str
    chapter: str
    namespace: dict = field(repr=False)
    problems: dict[str, str] = field(default_factory=dict)  # object name -> why it is missing
    isolated: bool = False  # learner code: each test runs in a forked child
    # exercise -> why the reference stands in for it in the other exercises' tests
    broken: dict[str, str] = field(default_factory=dict)
    # (top-level name, attribute or None) -> why calling it fails at once (it looped before)
    hung: dict[tuple[str, str | None], str] = field(default_factory=dict)
    # names the setup cells bind, as they bound them: restored in every test's child
    setup_values: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def live(self) -> bool:
        return self.source == LIVE_SOURCE

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.problems:
            raise ExerciseUnavailable(self.problems[name])
        try:
            return self.namespace[name]
        except KeyError:
            raise AttributeError(f"{self.source} defines no {name!r}") from None

    @cached_property
    def spec(self) -> Chapter:
        return read_chapter(self.chapter)

    @cached_property
    def exercise_of_object(self) -> dict[str, str]:
        return {n: ex.name for ex in self.spec.exercises for n in ex.object_names}

    def exercise_of_code(self, code: types.CodeType) -> str | None:
        """The exercise whose cell defined this code: by the name of the object it belongs to,
        else by what the cell it came from defines."""
        root = code.co_qualname.split(".")[0]
        if root in self.exercise_of_object:
            return self.exercise_of_object[root]
        source = "".join(linecache.getlines(code.co_filename))
        for name in sorted(defined_by(source)):
            if name in self.exercise_of_object:
                return self.exercise_of_object[name]
        return None


# --------------------------------------------------------------------------- loading


_MODULE_IDS = itertools.count()


def _fresh_namespace(chapter: str) -> dict:
    """A new module's globals, registered in sys.modules: code such as `@dataclass` looks up
    the module a class was defined in, and a bare dict would not be found there."""
    module = types.ModuleType(f"course_{chapter}_{next(_MODULE_IDS)}")
    sys.modules[module.__name__] = module
    return module.__dict__


def _fallback(exercise: Exercise, namespace: dict) -> None:
    """Give dependent cells the reference objects of an exercise."""
    for dotted, name in zip(exercise.objects, exercise.object_names, strict=True):
        namespace[name] = import_object(dotted)


def _link_stand_in(exercise: Exercise, namespace: dict, exercise_names: set[str]) -> None:
    """Make a reference function that stands in call the notebook's own objects of the other
    exercises (a reference `forward_with_cache` calls your `positions_and_allowed`), so that a
    test of one exercise grades that exercise's code wherever it is called. Classes, and names
    the notebook does not define, stay the reference's."""
    for name in exercise.object_names:
        ref = namespace.get(name)
        if not isinstance(ref, types.FunctionType):
            continue
        links = {
            n: namespace[n]
            for n in ref.__code__.co_names
            if n in exercise_names and n not in exercise.object_names and n in namespace
        }
        if links:
            linked = types.FunctionType(
                ref.__code__,
                {**ref.__globals__, **links},
                ref.__name__,
                ref.__defaults__,
                ref.__closure__,
            )
            linked.__kwdefaults__ = ref.__kwdefaults__
            linked.__wrapped__ = ref
            namespace[name] = linked


def _is_check_cell(source: str) -> bool:
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return bool(body) and all(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and getattr(s.value.func, "id", None) == "check"
        for s in body
    )


def _first_line(source: str) -> str:
    """A cell's first line of code, to name it by: not a comment, and not a decorator (many
    given cells start with `@dataclass`, which would name them all alike)."""
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", "@")):
            return line.strip()[:40]
    return "…"


def _label(cell, pristine_ids: set[str]) -> str:
    tags = cell.metadata.get("tags", [])
    if "exercise" in tags:
        return f"the `{cell.metadata.get('exercise')}` cell"
    if "setup" in tags:
        return "the setup cell"
    if "source" in tags:
        return f"the given cell `{_first_line(cell.source)}`"
    mine = "" if cell.get("id") in pristine_ids else "your "
    return f"{mine}cell `{_first_line(cell.source)}`"


def graded_cells(nb: nbformat.NotebookNode) -> list:
    """The code cells grading runs, in notebook order: setup, given code, exercises, and any
    other cell that defines a name those (or other selected cells) use. Cells tagged `demo`
    (timings, long demonstrations) never run: an unfinished function's given lines name
    variables only the learner's code will bind (`keys`, `logits`), and a demo that binds the
    same names must not be run, at length, to provide them."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    always = [c for c in code if {"setup", "source", "exercise"} & set(c.metadata.get("tags", []))]
    others = [
        c
        for c in code
        if c not in always
        and not _is_check_cell(c.source)
        and "demo" not in c.metadata.get("tags", [])
    ]
    names = {id(c): cell_names(c.source) for c in code}
    provided: set[str] = set()
    needed: set[str] = set()
    for c in always:
        if names[id(c)]:
            provided |= names[id(c)].bound
            needed |= names[id(c)].free
    chosen: set[int] = set()
    changed = True
    while changed:
        changed = False
        for c in others:
            n = names[id(c)]
            if id(c) in chosen or n is None or not (n.bound & (needed - provided)):
                continue
            chosen.add(id(c))
            needed |= n.free
            changed = True
    return [c for c in code if c in always or id(c) in chosen]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def impl_from_notebook(nb: nbformat.NotebookNode, chapter: str, source: str) -> Impl:
    from utils.build import pristine_cell_ids

    spec = read_chapter(chapter)
    namespace = _fresh_namespace(chapter)
    impl = Impl(source=source, chapter=chapter, namespace=namespace, isolated=True)
    seen: set[str] = set()
    pristine = pristine_cell_ids(chapter)
    for cell in graded_cells(nb):
        tags = cell.metadata.get("tags", [])
        label = _label(cell, pristine)
        # What the cells print is not the learner's failure: pytest would show it under
        # "Captured stdout setup" beside every failing test of the chapter.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            error = run_cell(cell.source, namespace, label, CELL_TIMEOUT_S)
        if "setup" in tags or "source" in tags:
            impl.setup_values.update(
                {n: namespace[n] for n in defined_by(cell.source) if n in namespace}
            )
            if error:
                # Without its setup cells nothing in the chapter can be graded honestly.
                why = f"{error}; `course reset {chapter[:2]}` gives a fresh notebook"
                impl.problems.update({n: why for ex in spec.exercises for n in ex.object_names})
            continue
        exercise = None
        if "exercise" in tags:
            try:
                exercise = spec.exercise(cell.metadata.get("exercise"))
            except KeyError:
                exercise = None
        if exercise is not None:
            seen.add(exercise.name)
            for obj in exercise.object_names:
                if error:
                    impl.problems[obj] = f"exercise {exercise.name!r} could not be loaded: {error}"
                elif obj not in namespace:
                    impl.problems[obj] = (
                        f"exercise {exercise.name!r}: its cell ran but did not define {obj!r}"
                    )
        # A cell must not take a setup name away from the cells after it.
        for name, value in impl.setup_values.items():
            if namespace.get(name) is not value:
                why = (
                    f"{label} rebinds `{name}` (defined by the setup cell) to "
                    f"{_short(namespace.get(name))}, which breaks every cell after it: rename "
                    f"your variable. The other exercises are graded with `{name}` restored"
                )
                namespace[name] = value
                if exercise is not None:
                    impl.problems.update({obj: why for obj in exercise.object_names})
        if exercise is not None and any(o in impl.problems for o in exercise.object_names):
            impl.broken[exercise.name] = impl.problems[exercise.object_names[0]]
            _fallback(exercise, namespace)
    for exercise in spec.exercises:
        if exercise.name not in seen:
            why = (
                f"exercise {exercise.name!r} has no cell in {source} (deleted?); "
                f"`course reset {chapter[:2]}` restores a fresh notebook"
            )
            impl.problems.update({n: why for n in exercise.object_names})
            impl.broken[exercise.name] = why
            _fallback(exercise, namespace)
    return impl


def _unreadable(chapter: str, source: str, why: str) -> Impl:
    problems = {n: why for ex in read_chapter(chapter).exercises for n in ex.object_names}
    return Impl(source=source, chapter=chapter, namespace={}, problems=problems)


def impl_from_notebook_file(path: Path, chapter: str) -> Impl:
    if not path.exists():
        why = f"{path.name} is missing; `course reset {chapter[:2]}` builds a fresh one"
        return _unreadable(chapter, str(path), why)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # a notebook file broken beyond JSON
        return _unreadable(chapter, str(path), f"{path.name} cannot be read as a notebook ({err})")
    return impl_from_notebook(nb, chapter, source=f"notebooks/{path.name}")


def impl_from_solutions(chapter: str) -> Impl:
    spec = read_chapter(chapter)
    namespace = _fresh_namespace(chapter)
    for cell in spec.notebook.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code":
            continue
        if "setup" in tags:
            error = run_cell(cell.source, namespace, "the setup cell", CELL_TIMEOUT_S)
            if error:
                raise RuntimeError(f"chapters/{chapter}.py: {error}")
        elif "source" in tags:  # given code: the real objects, as the exercises below
            for dotted in solution_paths(cell.source):
                namespace[dotted.rpartition(".")[2]] = import_object(dotted)
    for exercise in spec.exercises:
        _fallback(exercise, namespace)
    return Impl(source="solutions", chapter=chapter, namespace=namespace)


def _setup_values(chapter: str) -> dict[str, object]:
    """What the chapter's setup cells bind (imports: the same objects as in any kernel)."""
    scratch = _fresh_namespace(chapter)
    for cell in read_chapter(chapter).notebook.cells:
        if cell.cell_type == "code" and "setup" in cell.metadata.get("tags", []):
            run_cell(cell.source, scratch, "the setup cell", CELL_TIMEOUT_S)
            scratch.pop("__builtins__", None)
    return {k: v for k, v in scratch.items() if not k.startswith("__")}


def _live_culprit(namespace: dict, name: str, impl: Impl) -> str | None:
    """The exercise whose cell, among the inputs this kernel ran, last rebound `name`."""
    for source in reversed(namespace.get("In", [])):
        bound = defined_by(source)
        if name in bound:
            for obj in sorted(bound):
                if obj in impl.exercise_of_object:
                    return impl.exercise_of_object[obj]
            return None
    return None


def impl_from_live(namespace: dict, chapter: str) -> Impl:
    """What a running notebook has defined so far."""
    impl = Impl(source=LIVE_SOURCE, chapter=chapter, namespace=namespace, isolated=True)
    for exercise in impl.spec.exercises:
        for name in exercise.object_names:
            if name not in namespace:
                impl.problems[name] = (
                    f"{name!r} is not defined yet: run the cell of exercise {exercise.name!r}"
                )
    impl.setup_values = _setup_values(chapter)
    for name, value in impl.setup_values.items():
        if name in namespace and namespace[name] is not value:
            culprit = _live_culprit(namespace, name, impl)
            where = f"the `{culprit}` cell" if culprit else "a cell you ran"
            why = (
                f"{where} rebinds `{name}` (defined by the setup cell) to "
                f"{_short(namespace[name])}, which breaks every cell after it: rename your "
                f"variable and run the setup cell again. The other exercises are graded with "
                f"`{name}` restored"
            )
            if culprit:
                exercise = impl.spec.exercise(culprit)
                impl.problems.update({o: why for o in exercise.object_names})
                impl.broken[culprit] = why
    _recall_live(impl)
    return impl


# What live checks learnt about broken exercises and looping functions, kept for the next
# check(...) while the learner's objects stay the same (running a cell again makes new ones).
_LIVE_BROKEN: dict[str, tuple[tuple, str]] = {}
_LIVE_HUNG: dict[tuple[str, str | None], tuple[object, str]] = {}


def _objects(impl: Impl, exercise: str) -> tuple:
    return tuple(impl.namespace.get(n) for n in impl.spec.exercise(exercise).object_names)


def _resolve(namespace: dict, target: tuple[str, str | None]):
    name, attr = target
    value = namespace.get(name)
    return value if attr is None else getattr(value, attr, None)


def _remember_live(impl: Impl) -> None:
    for exercise, why in impl.broken.items():
        _LIVE_BROKEN[exercise] = (_objects(impl, exercise), why)
    for target, why in impl.hung.items():
        _LIVE_HUNG[target] = (_resolve(impl.namespace, target), why)


def _recall_live(impl: Impl) -> None:
    for exercise, (objects, why) in _LIVE_BROKEN.items():
        now = _objects(impl, exercise)
        if all(a is b for a, b in zip(now, objects, strict=True)):
            impl.broken.setdefault(exercise, why)
    for target, (obj, why) in _LIVE_HUNG.items():
        if _resolve(impl.namespace, target) is obj:
            impl.hung.setdefault(target, why)


def load_impl(kind: str, chapter: str, namespace: dict | None = None) -> Impl:
    """The one dispatch over IMPL_KINDS."""
    from utils.build import build_notebook, notebook_path

    if kind == "solutions":
        return impl_from_solutions(chapter)
    if kind == "stubs":
        return impl_from_notebook(build_notebook(chapter), chapter, source="stub notebook")
    if kind == "notebooks":
        return impl_from_notebook_file(notebook_path(chapter), chapter)
    if kind == "live":
        if namespace is None:
            raise ValueError("impl 'live' needs the notebook's namespace")
        return impl_from_live(namespace, chapter)
    raise ValueError(f"impl must be one of {IMPL_KINDS}, got {kind!r}")


# --------------------------------------------------------------------------- running a test


@dataclass(frozen=True)
class Place:
    """A frame of learner code: which exercise's cell, which function, which line."""

    exercise: str | None
    qualname: str
    line: int
    target: tuple[str, str | None]  # what to replace to make calling it fail at once
    cell: str = "a cell of yours"  # the cell's label, as tracebacks show it
    text: str = ""  # the line itself, as written

    @property
    def given(self) -> bool:
        """Code the course wrote (a given, setup or unchanged cell), not the learner."""
        return self.exercise is None and not self.cell.startswith(("your ", "a cell of yours"))

    def describe(self) -> str:
        where = f"the `{self.exercise}` cell" if self.exercise else self.cell
        what = "its top level" if self.qualname == "<module>" else f"`{self.qualname}`"
        return f"{what} ({where}, line {self.line})"


@dataclass
class Verdict:
    """What one graded test gave, summarised for pytest and the tables."""

    passed: bool
    message: str = ""  # the first line, for a table
    longrepr: str = ""  # the full report
    not_implemented: bool = False
    notes: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""


def _learner_places(err: BaseException, impl: Impl) -> list[Place]:
    """Frames of learner code in the traceback of `err`, innermost first."""
    places = []
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals is impl.namespace:
            code = frame.f_code
            parts = code.co_qualname.split(".")
            target = (parts[0], parts[1] if len(parts) > 1 and parts[1] != "<locals>" else None)
            cell = code.co_filename.strip("<>").rsplit(" #", 1)[0]  # run_cell's label
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            places.append(
                Place(
                    impl.exercise_of_code(code), code.co_qualname, tb.tb_lineno, target, cell, text
                )
            )
        tb = tb.tb_next
    return places[::-1]


def exception_message(err: BaseException) -> str:
    """The exception as the test wrote it. A failed assert or `pytest.fail` is the test's own
    sentence, shown without "AssertionError:"; pytest's rewriting appends the assert's operands
    ("assert False / + where False = close(tensor([[..."), which only bury it."""
    tutor = isinstance(err, AssertionError) or type(err).__name__ == "Failed"
    text = str(err) if tutor else f"{type(err).__name__}: {err}"
    lines = text.splitlines() or [type(err).__name__]
    if tutor and lines[0].startswith("assert "):  # a bare assert: its first line says it
        return lines[0]
    cut = next((i for i, line in enumerate(lines) if i and line.startswith("assert ")), None)
    return "\n".join(lines[:cut])


def failure_report(err: BaseException) -> str:
    """A failed graded test as a learner reads it: the message first (pytest's short summary
    shows the first line), then where, through the test's lines and the learner's cells only
    (no fixture dumps, no tensor reprs, no library internals)."""
    where = []
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith("<"):  # a notebook cell
            shown = filename.strip("<>").rsplit(" #", 1)[0]
        elif filename.startswith(str(TESTS_DIR)) and not filename.endswith("conftest.py"):
            shown = str(Path(filename).relative_to(TESTS_DIR.parent))
        else:
            continue
        line = linecache.getline(filename, lineno).strip()
        where.append(f"  {shown}, line {lineno}, in {frame.f_code.co_name}: {line}")
    report = exception_message(err)
    return report + ("\n\nwhere:\n" + "\n".join(where) if where else "")


def is_not_implemented(err: BaseException | None) -> bool:
    """The blank exercise's `raise NotImplementedError()` (or a test's "still raises
    NotImplementedError"), or a blank kernel refused by Triton's compiler at that `raise`: on a
    GPU a kernel is compiled before it runs, and the compiler takes no `raise`
    (UnsupportedLanguageConstruct, seen on an H100), where the interpreter runs the line and
    raises. PyTorch raises NotImplementedError too, with words of its own ("Cannot copy out of
    meta tensor" where code reads a meta tensor's values): that is a slip, not a blank cell."""
    while err is not None:
        if isinstance(err, NotImplementedError) and (
            not str(err) or "NotImplementedError" in str(err)
        ):
            return True
        if raises_not_implemented(getattr(err, "node", None)):
            return True
        err = err.__cause__ or err.__context__
    return False


META_READ = (
    "The test ran your code on PyTorch's 'meta' device, whose tensors have shapes but no "
    "values: a line that reads values back into Python (.tolist(), .item(), int() or float() "
    "of a tensor, an `if` on a tensor) cannot run there, and on a GPU it makes the host wait "
    "for the device. Which line of yours reads a tensor's values?"
)


NONE_USED = (
    "A value your code handed back is None where a tensor or a number was expected: does a "
    "function of yours end without returning its result (assigned to a local, or changed in "
    "place and not returned)?"
)


def _raised_here(err: BaseException, places: list[Place]) -> str:
    """For an exception that is not a test's own sentence: where in the learner's code it was
    raised, their own line quoted (not a fix), and what a meta tensor's refusal means. An
    explicit refusal (`raise ValueError`) by one exercise's function, called from another
    exercise's, names the caller: what it handed over is what was refused."""
    first = exception_message(err).splitlines()[0]
    here = places[0] if places else None
    words = []
    if "meta tensor" in first or "'Meta' backend" in first:
        words.append(META_READ)
    if "'NoneType' object" in first:
        words.append(NONE_USED)
    caller = next((p for p in places[1:] if p.exercise not in (None, here and here.exercise)), None)
    refusal = here is not None and here.text.lstrip().startswith("raise ValueError")
    if refusal and caller is not None and isinstance(err, ValueError):
        words.append(
            f"It was refused by {here.describe()}, called from your {caller.describe()}: "
            f"`{caller.text}`. What that call handed over is what was refused."
        )
    elif here is not None and not here.given and here.text:
        words.append(f"It was raised in your {here.describe()}: `{here.text}`.")
    return " ".join(words)


def _caused_by(err: BaseException | None, kind: type) -> BaseException | None:
    while err is not None:
        if isinstance(err, kind):
            return err
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def _prepared(impl: Impl, exercise: str):
    """The namespace as `_prepare_child` sets it for one test, then as it was before. In a
    forked child the undoing is moot; a test run in this process (no fork: Windows, or CUDA
    available) must give the learner's namespace and classes back as it found them. Only what
    the grader bound is undone: what the learner's code binds stays, as it would in their
    notebook (Triton's interpreter, for one, binds a name in a kernel's globals once)."""
    ns = impl.namespace
    before = dict(ns)
    patched: list[tuple[object, str, object]] = []  # (object, attribute, value before)
    _prepare_child(impl, exercise, patched)
    bound = {n for n in ns if ns[n] is not before.get(n, _MISSING)}
    try:
        yield
    finally:
        for name in bound:
            if name in before:
                ns[name] = before[name]
            else:
                ns.pop(name, None)
        for obj, attr, value in reversed(patched):
            if value is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)


_MISSING = object()


def _prepare_child(impl: Impl, exercise: str, patched: list) -> None:
    """In the test's child: the setup names as the setup cell bound them, the reference for
    every broken other exercise, and looping functions of this one failing at once (each
    attribute replaced is noted in `patched`, with its value before)."""
    ns = impl.namespace
    for name, value in impl.setup_values.items():
        ns[name] = value
    stand_ins = [o for o in impl.broken if o != exercise]
    for other in stand_ins:
        _fallback(impl.spec.exercise(other), ns)
    for other in stand_ins:
        _link_stand_in(impl.spec.exercise(other), ns, set(impl.exercise_of_object))
    for (name, attr), why in impl.hung.items():
        if impl.exercise_of_object.get(name) != exercise and name in impl.exercise_of_object:
            continue

        def fail_at_once(*_args, _why=why, **_kwargs):
            raise ExerciseUnavailable(_why)

        if attr is None:
            ns[name] = fail_at_once
        elif name in ns:
            patched.append((ns[name], attr, getattr(ns[name], "__dict__", {}).get(attr, _MISSING)))
            setattr(ns[name], attr, fail_at_once)


def _reason(kind: str, info: dict, culprit: Place) -> str:
    what = culprit.describe()
    if info["not_implemented"] and kind == "error":
        return f"your `{culprit.exercise}` exercise is not implemented yet"
    if kind == "hang":
        return f"your {what} did not finish (an infinite loop?)"
    if kind == "exit":
        return f"your {what}: {info['exit']}"
    return f"your {what} raised {info['first_line']}"


def run_graded_test(
    impl: Impl,
    exercise: str,
    call: Callable[[], object],
    describe: Callable[[BaseException], str],
    budget_s: float | None = None,
) -> Verdict:
    """Run one graded test of `exercise` on learner code, in a forked child per attempt.

    `describe(exception)` (run in the child) renders a failure as pytest would."""
    budget_s = test_budget_s() if budget_s is None else budget_s

    def child():
        with _prepared(impl, exercise):
            return call()

    def summarise(err: BaseException) -> dict:
        unavailable = _caused_by(err, ExerciseUnavailable)
        name_error = _caused_by(err, NameError)
        not_implemented = is_not_implemented(err)
        # A full report only where it will be shown (rendering one reads source: slow).
        plain = kind_of(err) == "error" and not (unavailable or not_implemented)
        places = _learner_places(err, impl)
        tutor = isinstance(err, AssertionError) or type(err).__name__ == "Failed"
        return {
            "places": places,
            "first_line": exception_message(err).splitlines()[0],
            "raised_here": "" if tutor else _raised_here(err, places),
            "longrepr": describe(err) if plain else "",
            "not_implemented": not_implemented,
            "unavailable": str(unavailable) if unavailable else None,
            "name_error": None if name_error is None else name_error_hint(name_error, impl.live),
            "exit": exit_description(err) if kind_of(err) == "exit" else "",
            "argument_check": isinstance(err, ValueError),
        }

    try:
        return _run_attempts(impl, exercise, child, summarise, budget_s)
    finally:
        if impl.live:
            _remember_live(impl)


def _run_attempts(impl, exercise, child, summarise, budget_s) -> Verdict:
    for _attempt in range(len(impl.spec.exercises) + 1):
        outcome: Outcome = call_isolated(child, summarise, budget_s)
        if outcome.kind in ("ok", "died", "killed"):
            break
        info = outcome.value
        if outcome.kind == "hang" and info["places"] and info["places"][0].given:
            break  # stopped in the course's own code (a busy machine?): nobody's to blame
        in_exercise = [p for p in info["places"] if p.exercise is not None]
        first = info["places"][0] if info["places"] else None
        refused = first is not None and first.text.lstrip().startswith("raise ValueError")
        if in_exercise[1:] and info["argument_check"] and (first.exercise is None or refused):
            # A check (a given one such as start_forward, or a given line of an exercise cell
            # such as advance's refusal) refused the arguments an exercise's function received:
            # its caller passed them, and the function that ran the check is right.
            in_exercise = in_exercise[1:]
        culprit = in_exercise[0] if in_exercise else None
        blamable = culprit is not None and culprit.exercise != exercise
        if not blamable or culprit.exercise in impl.broken or info["unavailable"]:
            break
        impl.broken[culprit.exercise] = _reason(outcome.kind, info, culprit)
        # and run the test again, with the reference for that exercise
    if outcome.kind == "ok":
        verdict = Verdict(True)
    elif outcome.kind in ("died", "killed"):
        message = unfinished_message(outcome)
        verdict = Verdict(False, message, message)
    else:
        verdict = _failure(impl, exercise, outcome, outcome.value, budget_s)
    verdict.stdout, verdict.stderr = outcome.stdout, outcome.stderr
    order = [ex.name for ex in impl.spec.exercises]
    stood_in = {
        other: why
        for other, why in impl.broken.items()
        if other != exercise and order.index(other) < order.index(exercise)
    }
    if stood_in:
        names = ", ".join(f"`{other}`" for other in stood_in)
        verdict.notes = [f"the reference stood in for {names}, broken in this notebook"]
    if stood_in and not verdict.passed:
        reasons = "; ".join(f"`{other}`: {why}" for other, why in stood_in.items())
        verdict.longrepr += f"\n\n(The reference stood in for what is broken: {reasons}.)"
    return verdict


def unfinished_message(outcome: Outcome) -> str:
    """What to tell a learner whose test's process died or was killed."""
    if outcome.kind == "died" and ("SIGSEGV" in outcome.detail or "SIGBUS" in outcome.detail):
        return (
            f"the test did not finish: {outcome.detail}, a read or write of memory outside "
            "every tensor. In a Triton kernel: a tl.load or tl.store whose mask does not cover "
            "the block's columns past the end of the row (or no mask at all); elsewhere, an "
            "index past the end reaching a library's unchecked code"
        )
    return (
        f"the test did not finish: {outcome.detail}. Does your code end the process or run "
        "for ever inside a library call?"
    )


def _failure(impl: Impl, exercise: str, outcome: Outcome, info: dict, budget_s: float) -> Verdict:
    places = info["places"]
    here = places[0] if places else None
    not_implemented = False
    if here is not None and here.exercise == exercise:
        # Broken, not just wrong: the other exercises' tests use the reference instead.
        impl.broken.setdefault(exercise, _reason(outcome.kind, info, here))
    if outcome.kind == "hang":
        # Stopped inside the course's own code: no loop of the learner's was running then.
        if here is not None and here.given:
            message = (
                f"did not finish within {budget_s:.0f} s, inside the course's own code "
                f"({places[0].describe()}), with none of yours running: a busy machine? "
                "COURSE_TEST_BUDGET=60 gives each test 60 s"
            )
        elif here is not None:
            message = (
                f"did not finish within {budget_s:.0f} s: an infinite loop in {here.describe()}?"
            )
            if here.exercise in (exercise, None):
                impl.hung[here.target] = (
                    f"an infinite loop in {here.describe()}? It did not finish in an earlier "
                    "test: fix it first"
                )
        else:
            message = f"did not finish within {budget_s:.0f} s (an infinite loop?)"
        longrepr = message
    elif outcome.kind == "exit":
        where = f" in {here.describe()}" if here else ""
        message = f"{info['exit']}{where}: only this test stopped, but a notebook would end there"
        longrepr = message
    elif info["unavailable"]:
        message = longrepr = info["unavailable"]
    elif info["not_implemented"]:
        message = longrepr = "not implemented yet: the cell still raises NotImplementedError"
        not_implemented = True
    else:
        message = info["first_line"]
        longrepr = info["longrepr"]
        if info.get("raised_here"):
            stop = "" if message[-1:] in ".!?" else "."
            message = f"{message}{stop} {info['raised_here']}"
            longrepr = f"{longrepr}\n\n{info['raised_here']}"
        if info["name_error"]:
            message = f"{message}. {info['name_error']}"
            longrepr = f"{longrepr}\n\n{info['name_error']}"
    return Verdict(False, message, longrepr, not_implemented=not_implemented)
