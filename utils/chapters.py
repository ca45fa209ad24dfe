"""Read a chapter source (chapters/NN_name.py, jupytext percent format) into its parts.

A chapter is a sequence of cells. Three kinds matter to the machinery:

    # %% tags=["setup"]                       imports and helpers; also run when grading
    # %% tags=["exercise"] exercise="mlp"     an exercise: one `# solution: module.Object`
    # solution: solutions.mlp.MLP             line per object it shows
    # %% tags=["source"]                      given code, shown whole from solutions/
    # solution: solutions.train.train         (no exercise); also run when grading
    # %% tags=["demo"]                        a timing or long demo: grading never runs it
    # %% tags=["claim"]                       asserts that the prose's numbers are what the
                                              cells above computed: in the teacher build only
                                              (make test runs it), left out of the learner's
    # %%                                      anything else: demos, plots, check() calls
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jupytext

from utils import CHAPTERS_DIR

SOLUTION_PREFIX = "# solution:"
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"


@dataclass(frozen=True)
class Exercise:
    chapter: str  # "01_transformer"
    name: str  # "attention": the pytest marker and the check("...") argument
    objects: tuple[str, ...]  # dotted paths: "solutions.attention.Attention"

    @property
    def object_names(self) -> tuple[str, ...]:
        return tuple(path.rsplit(".", 1)[1] for path in self.objects)


@dataclass
class Chapter:
    name: str
    path: Path
    notebook: object  # nbformat.NotebookNode as read by jupytext
    exercises: list[Exercise] = field(default_factory=list)

    def exercise(self, name: str) -> Exercise:
        for ex in self.exercises:
            if ex.name == name:
                return ex
        raise KeyError(name)


def solution_paths(cell_source: str) -> tuple[str, ...]:
    """The dotted paths named by a cell's `# solution:` lines."""
    return tuple(
        line[len(SOLUTION_PREFIX) :].strip()
        for line in cell_source.splitlines()
        if line.startswith(SOLUTION_PREFIX)
    )


def chapter_names() -> list[str]:
    return sorted(p.stem for p in CHAPTERS_DIR.glob("[0-9][0-9]_*.py"))


def resolve_chapter(name_or_number: str) -> str:
    """'1', '01' or '01_transformer' -> '01_transformer'."""
    names = chapter_names()
    if name_or_number in names:
        return name_or_number
    if name_or_number.isdigit():
        matches = [n for n in names if n.startswith(f"{int(name_or_number):02d}_")]
        if matches:
            return matches[0]
    raise ValueError(f"chapter must be one of {names} (or its number), got {name_or_number!r}")


@cache
def read_chapter(name: str) -> Chapter:
    path = CHAPTERS_DIR / f"{name}.py"
    notebook = jupytext.reads(path.read_text(encoding="utf-8"), fmt="py:percent")
    chapter = Chapter(name=name, path=path, notebook=notebook)
    seen: set[str] = set()
    for cell in notebook.cells:
        if "exercise" not in cell.metadata.get("tags", []):
            continue
        ex_name = cell.metadata.get("exercise")
        if not ex_name or not str(ex_name).isidentifier():
            raise ValueError(f'{path}: an exercise cell needs exercise="<identifier>"')
        objects = solution_paths(cell.source)
        if not objects:
            raise ValueError(f"{path}: exercise {ex_name!r} names no `{SOLUTION_PREFIX}` object")
        if ex_name in seen:
            raise ValueError(f"{path}: exercise {ex_name!r} appears twice")
        seen.add(ex_name)
        chapter.exercises.append(Exercise(chapter=name, name=ex_name, objects=objects))
    return chapter


def all_exercises() -> list[Exercise]:
    return [ex for name in chapter_names() for ex in read_chapter(name).exercises]


def find_exercise(name: str) -> Exercise:
    for ex in all_exercises():
        if ex.name == name:
            return ex
    raise ValueError(f"exercise must be one of {[ex.name for ex in all_exercises()]}, got {name!r}")


def import_object(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def object_source(dotted: str, stub: bool) -> str:
    """Source of a solution object; with `stub`, each fenced region becomes a
    `raise NotImplementedError()` at the region's indentation."""
    obj = import_object(dotted)
    # A Triton kernel is an object wrapping the decorated function: its source is the function's
    # (decorator included).
    source = inspect.getsource(getattr(obj, "fn", obj)).rstrip("\n")
    return stub_out(source) if stub else source


def stub_out(source: str) -> str:
    out: list[str] = []
    inside = False
    for lineno, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN} at line {lineno}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}raise NotImplementedError()")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{END} without {BEGIN} at line {lineno}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} without {END}")
    return "\n".join(out)


def strip_fences(source: str) -> str:
    """The solution as a reader should see it: the fence comments removed."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in (BEGIN, END))
