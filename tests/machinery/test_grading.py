"""Grading survives broken learner notebooks, and pristine notebooks fail as 'not implemented'."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import nbformat
import pytest

from utils import REPO_ROOT
from utils.build import build_notebook
from utils.chapters import read_chapter

CHAPTER = "01_transformer"


def run_graded(tmp_path, notebook, *extra):
    """Grade `notebook` in a subprocess; return {test id: (exercise, outcome, message)}."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nbformat.write(notebook, nb_dir / f"{CHAPTER}.ipynb")
    xml = tmp_path / "results.xml"
    env = {**os.environ, "COURSE_NOTEBOOKS_DIR": str(nb_dir), "COURSE_CELL_TIMEOUT": "2"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "tests/graded", "-q", "-m", "chapter_01",
         "--impl", "notebooks", f"--junitxml={xml}", *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcome = "passed" if failure is None else "failed"
        message = "" if failure is None else (failure.get("message") or "") + (failure.text or "")
        results[case.get("name")] = (props.get("exercise"), outcome, message)
    assert results, "no graded test ran"
    return results


def by_exercise(results):
    grouped = {}
    for exercise, outcome, message in results.values():
        grouped.setdefault(exercise, []).append((outcome, message))
    return grouped


def _cell(nb, exercise):
    return next(c for c in nb.cells if c.metadata.get("exercise") == exercise)


def test_broken_cells_fail_only_their_own_exercise(tmp_path):
    nb = build_notebook(CHAPTER, teacher=True)
    _cell(nb, "layernorm").source += "\n\ndef broken(:\n    pass\n"
    _cell(
        nb, "token_strings"
    ).source = "def token_strings(tokenizer, text):\n    while True:\n        pass\n"
    _cell(nb, "mlp").source = "while True:\n    pass\n\n" + _cell(nb, "mlp").source
    nb.cells.remove(_cell(nb, "attention"))

    grouped = by_exercise(run_graded(tmp_path, nb, "--timeout", "10"))
    expected_failures = {
        "layernorm": "SyntaxError",
        "token_strings": "Timeout",
        "mlp": "did not finish",
        "attention": "has no cell",
    }
    for exercise, needle in expected_failures.items():
        outcomes = grouped[exercise]
        assert all(o == "failed" for o, _ in outcomes), exercise
        assert all(needle in m for _, m in outcomes), (exercise, outcomes[0][1][:300])
    for ex in read_chapter(CHAPTER).exercises:
        if ex.name not in expected_failures:
            assert all(o == "passed" for o, _ in grouped[ex.name]), (ex.name, grouped[ex.name])


def test_pristine_notebook_fails_every_exercise_as_not_implemented(tmp_path):
    grouped = by_exercise(run_graded(tmp_path, build_notebook(CHAPTER)))
    assert set(grouped) == {ex.name for ex in read_chapter(CHAPTER).exercises}
    for exercise, outcomes in grouped.items():
        for outcome, message in outcomes:
            assert outcome == "failed" and "not implemented yet" in message, exercise


def test_pasting_the_solutions_passes(tmp_path):
    results = run_graded(tmp_path, build_notebook(CHAPTER, teacher=True))
    failed = {k: v for k, v in results.items() if v[1] != "passed"}
    assert not failed


@pytest.mark.parametrize("name", ["Attention", "LayerNorm"])
def test_impl_explains_a_missing_object(name):
    from utils.grading import ExerciseUnavailable, impl_from_live

    impl = impl_from_live({}, CHAPTER)
    with pytest.raises(ExerciseUnavailable, match="run the cell"):
        getattr(impl, name)
