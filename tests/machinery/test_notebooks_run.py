"""Each chapter's teacher build (solutions in the cells) runs top to bottom in a real kernel,
and every `check(...)` cell in it passes."""

import pytest
from nbclient import NotebookClient

from utils.build import build_notebook
from utils.chapters import chapter_names


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chapter", chapter_names())
def test_teacher_notebook_runs_end_to_end(chapter, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_STRICT_CHECK", "1")  # a failing check(...) raises in the cell
    # Each check(...) runs its exercise's first test only: the graded suite runs in full on the
    # same solutions beside this (make test's other lane), and one test per check cell proves
    # that the live notebook's objects reach the grader.
    monkeypatch.setenv("COURSE_CHECK_SPOT", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COURSE_QUICK", "1")  # chapters that train use a short schedule
    monkeypatch.setenv("COURSE_SAVED_MODELS", str(tmp_path / "saved"))  # not a learner's "mine"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # make test runs the graded tests beside it
    nb = build_notebook(chapter, teacher=True)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
