"""The notebook build: deterministic, stubs hide every solution, committed notebooks are fresh."""

import re
import subprocess
import sys

import nbformat
import pytest

from utils import CHAPTERS_DIR
from utils.build import build_notebook, notebook_path, notebook_text, stale_notebooks
from utils.chapters import all_exercises, chapter_names, read_chapter, strip_fences, stub_out


def test_committed_notebooks_are_fresh_builds():
    stale = stale_notebooks()
    assert not stale, "stale notebooks, run `course build`:\n" + "\n".join(stale.values())


def test_course_build_check_command_passes():
    done = subprocess.run(
        [sys.executable, "-m", "utils.cli", "build", "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("chapter", chapter_names())
def test_build_is_deterministic(chapter):
    assert notebook_text(build_notebook(chapter)) == notebook_text(build_notebook(chapter))


@pytest.mark.parametrize("chapter", chapter_names())
def test_committed_notebooks_carry_no_outputs(chapter):
    nb = nbformat.read(notebook_path(chapter), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def _exercise_cells(nb):
    return {c.metadata["exercise"]: c.source for c in nb.cells if "exercise" in c.metadata}


@pytest.mark.parametrize("chapter", chapter_names())
def test_stub_cells_hide_the_solution_and_teacher_cells_keep_it(chapter):
    stub = _exercise_cells(build_notebook(chapter))
    teacher = _exercise_cells(build_notebook(chapter, teacher=True))
    assert set(stub) == {ex.name for ex in read_chapter(chapter).exercises}
    for name, source in stub.items():
        assert "raise NotImplementedError()" in source, name
        assert "BEGIN SOLUTION" not in source and "END SOLUTION" not in source
        assert "NotImplementedError" not in teacher[name]
        assert "BEGIN SOLUTION" not in teacher[name]
        assert len(teacher[name]) > len(source)


def _claim_sources(nb):
    return [c.source for c in nb.cells if "claim" in c.metadata.get("tags", [])]


@pytest.mark.parametrize("chapter", chapter_names())
def test_claim_cells_run_in_the_teacher_build_only(chapter):
    """A claim cell asserts a number the prose quotes; make test runs it (teacher build) and the
    learner never sees it. Every chapter quotes numbers its cells compute, so each has one."""
    chapter_claims = [
        c.source for c in read_chapter(chapter).notebook.cells
        if "claim" in c.metadata.get("tags", [])
    ]  # fmt: skip
    assert chapter_claims, f"{chapter} has no claim cell"
    assert all("assert " in source for source in chapter_claims)
    assert _claim_sources(build_notebook(chapter, teacher=True)) == chapter_claims
    assert _claim_sources(build_notebook(chapter)) == []


def test_stub_out_keeps_everything_outside_the_fence():
    source = (
        "def f(x):\n"
        '    """Doc."""\n'
        "    check(x)\n"
        "    # BEGIN SOLUTION\n"
        "    return x + 1\n"
        "    # END SOLUTION\n"
    )
    assert (
        stub_out(source)
        == 'def f(x):\n    """Doc."""\n    check(x)\n    raise NotImplementedError()'
    )
    assert strip_fences(source) == 'def f(x):\n    """Doc."""\n    check(x)\n    return x + 1'


@pytest.mark.parametrize(
    "bad",
    [
        "    # BEGIN SOLUTION\n    x\n",
        "    # END SOLUTION\n",
        "# BEGIN SOLUTION\n# BEGIN SOLUTION\n",
    ],
)
def test_stub_out_rejects_broken_fences(bad):
    with pytest.raises(ValueError):
        stub_out(bad)


def test_every_exercise_object_has_a_fenced_region():
    from utils.chapters import object_source

    for ex in all_exercises():
        for dotted in ex.objects:
            assert "# BEGIN SOLUTION" in object_source(dotted, stub=False), dotted


@pytest.mark.parametrize("chapter", chapter_names())
def test_a_chapter_names_its_own_number_in_its_commands(chapter):
    """`course grade N` and `course reset NN` in a chapter's prose grade and reset that chapter:
    after a renumbering, chapters 6, 8 and 9 still named their old numbers."""
    number = int(chapter[:2])
    text = (CHAPTERS_DIR / f"{chapter}.py").read_text()
    named = {int(n) for n in re.findall(r"course (?:grade|reset) (\d+)", text)}
    assert named <= {number}, f"{chapter} names `course grade/reset` {sorted(named)}"
