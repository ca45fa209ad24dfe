"""Learner-style mutants: the mistakes the graded tests must catch.

A mutant is one realistic bug, written as a text edit of an exercise cell as a learner would
type it (the cell of the teacher build, that is the solution without its fences): `find`
must occur exactly once in the cell, and is replaced by `replace`. Running

    pytest tests/graded --mutants

grades every mutant, with the same machinery that grades a learner's notebook, against the
graded tests of its exercise. A mutant is killed when at least one of them fails; once killed,
its remaining tests are skipped. The run fails if any mutant survives, and ends with the kill
rate per chapter. A mutant that declares `says` must also be killed by a message that contains
those words: a test that fails for the wrong reason, with advice about another mistake, does
not count.

Only non-equivalent mutants belong here: each must change what the exercise computes for some
input its signature allows. Each chapter's list lives in its own module (`ch01.py`, ...).
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass

import nbformat


@dataclass(frozen=True)
class Mutant:
    exercise: str  # the exercise whose cell is edited and whose graded tests must kill it
    find: str  # text of the cell (teacher build), exactly once
    replace: str
    why: str  # the mistake, in a tutor's words
    name: str = ""  # short id; default: derived from `why`
    # Words the learner must be told: the message of the test that kills the mutant must
    # contain each (case-insensitive), so that it names this mistake and not another one.
    # Written from the mistake, not copied from today's message.
    says: tuple[str, ...] = ()
    # A graded test to run first for this mutant (its function's name), for a mutant that only
    # a late test kills: the tests before it all pass on it, slowly (a kernel that runs right
    # under the interpreter and that a GPU compiler refuses; a slip that shows only past n_ctx).
    # Since they pass, the killing test's message is still the first the learner reads. Order
    # only: if this test does not kill the mutant, every other test still runs. Set where a run
    # measured a second or more spent before the kill (`make test` pays it for every mutant).
    try_first: str = ""

    @property
    def id(self) -> str:
        if self.name:
            return f"{self.exercise}-{self.name}"
        words = re.findall(r"[a-z0-9]+", self.why.lower())[:6]
        return f"{self.exercise}-{'-'.join(words)}"


def _modules():
    from tests.machinery.mutants import (
        ch01,
        ch02,
        ch03,
        ch04,
        ch05,
        ch06,
        ch06_gumbel,
        ch06_lookahead,
        ch07,
        ch08,
        ch09,
        ch10,
    )

    return (ch01, ch02, ch03, ch04, ch05, ch06, ch06_gumbel, ch06_lookahead, ch07, ch08, ch09, ch10)


@functools.cache
def all_mutants() -> dict[str, Mutant]:
    """Every curated mutant, by id (ids are unique)."""
    mutants: dict[str, Mutant] = {}
    for module in _modules():
        for mutant in module.MUTANTS:
            if mutant.id in mutants:
                raise ValueError(f"two mutants share the id {mutant.id!r}: give one a name")
            mutants[mutant.id] = mutant
    return mutants


def mutants_of(exercise: str) -> list[Mutant]:
    return [m for m in all_mutants().values() if m.exercise == exercise]


@functools.cache
def _teacher_notebook(chapter: str) -> nbformat.NotebookNode:
    from utils.build import build_notebook

    return build_notebook(chapter, teacher=True)


def mutated_notebook(chapter: str, mutant: Mutant) -> nbformat.NotebookNode:
    """The teacher notebook of `chapter` with the mutant's edit made in its exercise cell."""
    nb = copy.deepcopy(_teacher_notebook(chapter))
    cells = [
        c
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("exercise") == mutant.exercise
    ]
    if len(cells) != 1:
        raise ValueError(f"mutant {mutant.id}: exercise {mutant.exercise!r} has no single cell")
    count = cells[0].source.count(mutant.find)
    if count != 1:
        raise ValueError(
            f"mutant {mutant.id}: its text occurs {count} times in the `{mutant.exercise}` "
            f"cell (must be once; did the solution change?):\n{mutant.find}"
        )
    cells[0].source = cells[0].source.replace(mutant.find, mutant.replace)
    return nb
