"""Each chapter's notebook runs in a Jupyter kernel as a learner's would, and its `check(...)`
cells say what they should: every one "passed" in the teacher build (the solutions in the
cells), and a failure, never "no test ran", in the learner's blank build.

The kernel starts from a learner's environment, built from nothing: PATH, HOME, LANG, and none
of this test process's variables (no TRITON_INTERPRET, no COURSE_*, no PYTEST_*). A kernel that
inherited them once hid a check() that ran no test in every real notebook: pytest's process had
chosen Triton's interpreter, a learner's kernel had not. The setup cell runs exactly as a
learner's does; only after it, one harness cell (shown in HARNESS) makes the run short: quick
sizes, a scratch folder for saved models, one test per check (the graded suite runs in full on
the same solutions in make test's other lane), and this run's COURSE_TIME_SCALE, so that a
check's time budget on a busy machine is the graded suite's.
"""

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from utils.build import build_notebook
from utils.chapters import chapter_names
from utils.timing import patient, time_scale

HARNESS = """\
# Added by tests/machinery/learner/test_notebooks_run.py, after the setup cell: a short run.
import os as _os
import utils.check as _check
_os.environ["COURSE_QUICK"] = "1"
_os.environ["COURSE_SAVED_MODELS"] = {saved!r}
_check.CHECK_SPOT = {spot}
_os.environ["COURSE_TIME_SCALE"] = {scale!r}
"""


def learner_env(home: str) -> dict[str, str]:
    """What a learner's terminal gives a kernel: not a copy of os.environ."""
    venv_bin = str(Path(sys.executable).parent)
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",  # make test runs the graded tests beside it, on 2 cores
    }
    leaked = [k for k in env if k.startswith(("TRITON", "COURSE_", "PYTEST"))]
    assert not leaked, leaked
    return env


def with_harness(nb, saved: Path, spot: bool):
    cells = nb.cells
    setup = next(i for i, c in enumerate(cells) if "setup" in c.metadata.get("tags", []))
    source = HARNESS.format(saved=str(saved), spot=spot, scale=str(time_scale()))
    cells.insert(setup + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["harness"]}))
    return nb


def check_cells(cells) -> list[tuple[str, str]]:
    """(the check call, the text it printed) for each check(...) cell."""
    found = []
    for cell in cells:
        if cell.cell_type == "code" and cell.source.strip().startswith("check("):
            text = []
            for out in cell.get("outputs", []):
                if out.output_type == "stream":
                    text.append(out.text)
                elif "data" in out:
                    text.append(out.data.get("text/plain", ""))
                elif out.output_type == "error":
                    text.append(f"{out.ename}: {out.evalue}")
            found.append((cell.source.strip(), "".join(text)))
    return found


def run_notebook(nb, tmp_path, allow_errors=False):
    client = NotebookClient(
        nb,
        timeout=patient(600),  # a cell; the test itself has 900 s, stretched alike
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=learner_env(os.environ.get("HOME", str(tmp_path))))
    return nb


def first_steps(nb):
    """What a learner runs before writing anything: the setup cell, the given code, the blank
    exercises, every cell that loads a model (a model import once broke every check), and the
    check cells. The demos, which use the unwritten exercises, are left out."""
    keep = ("setup", "harness", "exercise", "source")
    nb.cells = [
        c for c in nb.cells
        if c.cell_type == "code" and (
            set(c.metadata.get("tags", [])) & set(keep)
            or "load_model(" in c.source or "load_reference(" in c.source
            or c.source.strip().startswith("check(")
        )
    ]  # fmt: skip
    return nb


def errors_in(cells) -> list[str]:
    """'cell N (its first line): ename: evalue' for each cell that raised."""
    return [
        f"cell {i} ({cell.source.strip().splitlines()[0][:50]}): {out.ename}: {out.evalue}"
        for i, cell in enumerate(cells)
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "error"
    ]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chapter", chapter_names())
def test_blank_checks_fail_then_the_solved_notebook_passes_in_one_learners_kernel(
    chapter, tmp_path
):
    """A learner's path through a chapter, in one kernel. First the notebook as shipped: after
    the setup cell and the model cells, every check of an unwritten exercise must say it fails
    because it is not implemented. Then, in the same kernel (as a learner who fills in the
    exercises and runs the notebook again), the whole teacher build, top to bottom: no cell may
    raise, and every check must pass; what the failed checks remembered must not stand in the
    way. (One kernel for both: its start and the imports are most of a blank run's time. So a
    given cell that raises is caught in the blank run, the only one a fresh kernel runs.)"""
    saved = tmp_path / "saved"
    nb = first_steps(with_harness(build_notebook(chapter), saved, spot=True))
    n_blank = len(nb.cells)
    nb.cells += with_harness(build_notebook(chapter, teacher=True), saved, spot=True).cells
    run_notebook(nb, tmp_path, allow_errors=True)
    blank, solved = nb.cells[:n_blank], nb.cells[n_blank:]

    given = [c for c in blank if {"setup", "harness", "source", "exercise"}
             & set(c.metadata.get("tags", []))]  # fmt: skip
    raised = errors_in(given)
    assert not raised, (
        "given or exercise cells that raised in the notebook as shipped, run top to bottom in a "
        "fresh kernel (a learner's first run; the solved run below inherits its names, so only "
        "this run can see a cell that uses a name defined further down):\n" + "\n".join(raised)
    )
    checks = check_cells(blank)
    assert checks, f"{chapter} has no check(...) cell"
    bad = [f"{call} -> {text.strip() or '(nothing printed)'}" for call, text in checks
           if "✗" not in text or "not implemented" not in text]  # fmt: skip
    assert not bad, "blank check cells that did not report the unwritten exercise:\n" + "\n".join(
        bad
    )
    raised = errors_in(solved)
    assert not raised, "cells of the solved notebook that raised:\n" + "\n".join(raised)
    checks = check_cells(solved)
    bad = [f"{call} -> {text.strip() or '(nothing printed)'}" for call, text in checks
           if "✓" not in text or "passed" not in text]  # fmt: skip
    assert not bad, "check cells that did not pass in a learner's kernel:\n" + "\n".join(bad)
