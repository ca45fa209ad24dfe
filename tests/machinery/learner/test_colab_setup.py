"""The first cell of every notebook (utils/colab.py) installs the course where a notebook arrives
alone, as on Google Colab. No Colab can be had here, so the cell runs in what stands for one: a
fresh virtual environment with torch and a Jupyter kernel only (Colab has those), a home folder
outside the repository, and COURSE_SETUP_FROM naming a local repository to clone instead of the
network. That repository has two commits: the course as it is, and a later one that changes the
notebook, so the cell must find the commit that built the notebook it runs in, not the newest.

What this cannot know: Colab itself (its GPUs, its preinstalled packages, how it shows a form
cell). The pip install needs the package registry, so this test runs before make test goes
offline; it takes about two minutes, most of it pip.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from utils import REPO_ROOT, colab
from utils.build import build_notebook
from utils.paths import cache_dir
from utils.timing import patient

CHAPTER = "01_transformer"
NOTEBOOK = f"notebooks/{CHAPTER}.ipynb"

DRIVER = textwrap.dedent(
    """\
    import sys
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(sys.argv[1], as_version=4)
    NotebookClient(nb, timeout=float(sys.argv[2]), kernel_name="python3").execute()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            print(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    """
)

PROBE = textwrap.dedent(
    """\
    import os, solutions, utils
    print("PROBE", os.getcwd(), solutions.__file__, utils.__file__)
    """
)


def git(*args, cwd):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def course_repository(where: Path) -> tuple[str, str]:
    """A repository holding this working tree as one commit (built), then a commit that changes
    chapter 1's notebook: (the first commit, the second)."""
    git("init", "-q", "-b", "main", str(where), cwd=where.parent)
    files = git("ls-files", "-co", "--exclude-standard", "-z", cwd=REPO_ROOT).split("\0")
    for name in filter(None, files):
        if (REPO_ROOT / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, where / name)
    nb = build_notebook(CHAPTER)
    (where / NOTEBOOK).write_text(nbformat.writes(nb) + "\n")
    ident = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    git("add", "-A", cwd=where)
    git(*ident, "commit", "-q", "-m", "the course", cwd=where)
    first = git("rev-parse", "HEAD", cwd=where)
    later = json.loads((where / NOTEBOOK).read_text())
    later["cells"][1]["source"] = ["# A later edition of chapter 1\n"]
    (where / NOTEBOOK).write_text(json.dumps(later, indent=1) + "\n")
    git(*ident, "commit", "-q", "-am", "a later notebook", cwd=where)
    return first, git("rev-parse", "HEAD", cwd=where)


def test_the_colab_cell_is_the_first_cell_and_carries_its_notebooks_digest():
    nb = build_notebook(CHAPTER)
    first = nb.cells[0]
    assert "colab" in first.metadata["tags"] and first.metadata["cellView"] == "form"
    assert colab.cells_digest(nb.cells) in first.source
    # The digest is of the other cells: any change to them changes it.
    nb.cells[1].source += " "
    assert colab.cells_digest(nb.cells) not in first.source


def test_the_colab_cell_does_nothing_elsewhere(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_SETUP_FROM", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    namespace: dict = {}
    exec(build_notebook(CHAPTER).cells[0].source, namespace)
    assert not (tmp_path / "transformer-course").exists()
    assert "setup_course" not in namespace  # the cell leaves one name behind: the repository
    assert "COURSE_REPOSITORY" in namespace


@pytest.mark.timeout(900)  # the installs, then a notebook whose one slow cell has 600 s of it
def test_the_colab_cell_installs_the_course_in_a_fresh_environment(tmp_path):
    source = tmp_path / "published"
    source.mkdir()
    first, second = course_repository(source)
    venv = tmp_path / "venv"
    # sys.executable is this course's own venv: a venv made from it starts empty all the same.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    torch = next(
        line for line in (REPO_ROOT / "Makefile").read_text().splitlines()
        if line.startswith("TORCH ?=")
    ).split("=", 1)[1].strip()  # fmt: skip
    # --no-compile: pip would byte-compile every installed module (torch's thousands) up front;
    # Python compiles what it imports anyway. Only the test's time changes.
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-compile", torch, "ipykernel", "nbclient"],
        check=True,
        capture_output=True,
    )
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    if (cache_dir() / "corpus").is_dir():  # else the cell fetches it, as on Colab
        shutil.copytree(cache_dir() / "corpus", home / ".cache" / "transformer-course" / "corpus")
    outside = tmp_path / "learner"  # where the notebook is opened: not in any repository
    outside.mkdir()
    nb = build_notebook(CHAPTER)  # the notebook of the first commit, not of the later one
    setup = next(c for c in nb.cells if "setup" in c.metadata.get("tags", []))
    nb.cells = [nb.cells[0], setup, nbformat.v4.new_code_cell(PROBE)]
    (outside / "chapter.ipynb").write_text(nbformat.writes(nb))
    (outside / "driver.py").write_text(DRIVER)
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "COURSE_SETUP_FROM": str(source),
        "PIP_NO_COMPILE": "1",  # as above, for the cell's own pip install
    }
    done = subprocess.run(
        [py, "driver.py", "chapter.ipynb", str(patient(600))], cwd=outside, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    clone = home / "transformer-course"
    assert git("rev-parse", "HEAD", cwd=clone) == first != second, (
        "the cell checked out the wrong commit:\n" + done.stdout
    )
    probe = next(line for line in done.stdout.splitlines() if line.startswith("PROBE"))
    cwd, solutions, utils = probe.split()[1:4]
    assert cwd == str(clone / "notebooks"), probe
    assert solutions.startswith(str(clone)) and utils.startswith(str(clone)), probe
    assert f"the course is ready: {clone} at {first[:12]}" in done.stdout, done.stdout
