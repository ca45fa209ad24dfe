"""`course solution`, `course reset`, `course grade` as a learner uses them."""

import os
import subprocess
import sys

from utils.build import build_notebook, notebook_text
from utils.chapters import all_exercises


def course(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "utils.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_solution_prints_the_source_without_fences():
    done = course("solution", "LayerNorm")
    assert done.returncode == 0, done.stderr
    assert "class LayerNorm" in done.stdout and "sqrt" in done.stdout
    assert "BEGIN SOLUTION" not in done.stdout


def test_solution_of_unknown_name_is_a_clear_error():
    done = course("solution", "Nonsense")
    assert done.returncode == 2
    assert "name must be" in done.stderr and "LayerNorm" in done.stderr


def test_reset_backs_up_and_restores(tmp_path):
    nb = tmp_path / "01_transformer.ipynb"
    nb.write_text("my work", encoding="utf-8")
    done = course("reset", "1", env={"COURSE_NOTEBOOKS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert nb.read_text(encoding="utf-8") == notebook_text(build_notebook("01_transformer"))
    backups = list((tmp_path / ".backups").glob("01_transformer.*.ipynb"))
    assert [b.read_text(encoding="utf-8") for b in backups] == ["my work"]
    # An open Lab tab still holds the old notebook: saving it would undo the reset.
    assert "close its tab without saving" in done.stdout


def test_reset_of_unknown_chapter_is_a_clear_error():
    done = course("reset", "99")
    assert done.returncode == 2 and "chapter must be one of" in done.stderr


def test_grade_fails_on_the_stubs_with_the_reason():
    # One chapter: `make test` grades every chapter's stubs already (--must-fail).
    done = course("grade", "2", "--impl", "stubs")
    assert done.returncode == 1
    n = len([ex for ex in all_exercises() if ex.chapter.startswith("02")])
    assert f"0 of {n} exercises pass" in done.stdout and "not implemented yet" in done.stdout


def test_reset_of_an_unchanged_notebook_keeps_no_backup(tmp_path):
    nb = tmp_path / "01_transformer.ipynb"
    nb.write_text(notebook_text(build_notebook("01_transformer")), encoding="utf-8")
    done = course("reset", "1", env={"COURSE_NOTEBOOKS_DIR": str(tmp_path)})
    assert done.returncode == 0 and "nothing to back up" in done.stdout, done.stderr
    assert not (tmp_path / ".backups").exists()
