"""`course update` on real git repositories: the course's ("upstream") and a learner's clone.

The upstream renumbers its chapters as the course did (07_serving -> 08_serving, 08_kernels ->
09_kernels, every cell id renumbered with them), then adds a new chapter 7 (07_llama). The
learner's work in the old 07_serving must end up in 08_serving, with a copy in
notebooks/.backups/, and every refusal must leave the clone exactly as it was. The course's
second renumbering (09_kernels -> 10_kernels, chapter 9 left free for the chapter to come) must
carry the kernels notebook the same way, from 09_kernels and, in one update, from 08_kernels.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess

import nbformat
import pytest

from utils import REPO_ROOT
from utils.renames import (
    RENAMES,
    current_name,
    notebooks_under_old_names,
    old_name_notice,
    renames_in,
)
from utils.update import update

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

IDENTITY = {
    "GIT_AUTHOR_NAME": "Course",
    "GIT_AUTHOR_EMAIL": "course@example.com",
    "GIT_COMMITTER_NAME": "Course",
    "GIT_COMMITTER_EMAIL": "course@example.com",
}


def git(repo, *args, check=True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | IDENTITY
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr}")
    return done


def notebook(name: str, title: str) -> str:
    """A notebook as the course builds one: cell ids carry the chapter's number, and an
    exercise cell is known by its tags and `exercise` metadata."""
    number = name[:2]
    cells = [
        nbformat.v4.new_markdown_cell(f"# Chapter {int(number)} — {title}"),
        # Prose of its own, as each chapter has: git pairs a renamed file by its likeness.
        nbformat.v4.new_markdown_cell(
            "".join(f"{title}, line {i} of its prose.\n" for i in range(20))
        ),
        nbformat.v4.new_code_cell("import torch", metadata={"tags": ["setup"]}),
        nbformat.v4.new_code_cell(
            "def slots_of(lengths):\n    raise NotImplementedError()",
            metadata={"tags": ["exercise"], "exercise": "slots_of"},
        ),
        nbformat.v4.new_code_cell('check("slots_of")'),
    ]
    for i, cell in enumerate(cells):
        cell["id"] = f"{number}-{i:03d}"
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"course": {"chapter": name}})
    return nbformat.writes(nb) + "\n"


def work_in(text: str) -> str:
    """The notebook after a learner's session: the exercise written and every cell run (the
    execution counts sit on the line beside each cell's id)."""
    nb = json.loads(text)
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            count += 1
            cell["execution_count"] = count
            cell["outputs"] = [nbformat.v4.new_output("stream", text=f"ran {count}\n")]
        if cell["metadata"].get("exercise") == "slots_of":
            cell["source"] = "def slots_of(lengths):\n    return [n + 1 for n in lengths]  # mine"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def write(repo, path: str, text: str) -> None:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text, encoding="utf-8")


@pytest.fixture
def clones(tmp_path):
    """(upstream, learner): the course before the renumbering, and a learner's clone of it.
    `renumber(upstream)` then commits the renumbering and the new chapter 7 upstream."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    git(upstream, "init", "-q", "-b", "main")
    write(upstream, ".gitignore", "notebooks/.backups/\n.ipynb_checkpoints/\n")
    write(upstream, "notebooks/01_transformer.ipynb", notebook("01_transformer", "Transformer"))
    write(upstream, "notebooks/07_serving.ipynb", notebook("07_serving", "Many requests"))
    write(upstream, "notebooks/08_kernels.ipynb", notebook("08_kernels", "Triton kernels"))
    write(upstream, "README.md", "the course\n")
    git(upstream, "add", ".")
    git(upstream, "commit", "-q", "-m", "the course before the renumbering")
    learner = tmp_path / "learner"
    git(tmp_path, "clone", "-q", str(upstream), str(learner))
    return upstream, learner


# The table as the first renumbering's commit had it: the kernels' later move is not in it yet.
FIRST_RENAMES = {"07_serving": "08_serving", "08_kernels": "09_kernels"}


def renumber(upstream) -> None:
    git(upstream, "rm", "-q", "notebooks/07_serving.ipynb", "notebooks/08_kernels.ipynb")
    write(upstream, "notebooks/08_serving.ipynb", notebook("08_serving", "Many requests"))
    write(upstream, "notebooks/09_kernels.ipynb", notebook("09_kernels", "Triton kernels"))
    write(upstream, "utils/renames.py", f"RENAMES = {FIRST_RENAMES!r}\n")
    write(upstream, "notebooks/01_transformer.ipynb", notebook("01_transformer", "A transformer"))
    git(upstream, "add", ".")
    git(upstream, "commit", "-q", "-m", "renumbering before the new chapter 7")
    write(upstream, "notebooks/07_llama.ipynb", notebook("07_llama", "Today's transformer"))
    git(upstream, "add", ".")
    git(upstream, "commit", "-q", "-m", "chapter 7: today's transformer")


def renumber_kernels(upstream) -> None:
    """The second renumbering: the kernels move from chapter 9 to 10, and the course has no
    chapter 9 until the new one lands. The renames table is the course's own, as committed."""
    git(upstream, "rm", "-q", "notebooks/09_kernels.ipynb")
    write(upstream, "notebooks/10_kernels.ipynb", notebook("10_kernels", "Triton kernels"))
    write(upstream, "utils/renames.py", (REPO_ROOT / "utils" / "renames.py").read_text())
    git(upstream, "add", ".")
    git(upstream, "commit", "-q", "-m", "renumbering before the new chapter 9")


def run_update(repo) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = update(repo)
    return code, out.getvalue(), err.getvalue()


def snapshot(repo) -> dict:
    """Everything a refusal must leave alone: the commit, the index, every file."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in repo.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }
    head = git(repo, "rev-parse", "HEAD").stdout
    return {"head": head, "files": files, "index": git(repo, "ls-files", "-s").stdout}


def snapshot_files(folder) -> dict:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def committed(repo, path: str) -> str:
    return git(repo, "show", f"HEAD:{path}").stdout


def test_plain_git_pull_loses_the_notebook_to_conflicts(clones):
    """Why `course update` exists: git refuses to pull over the edited notebook, and the usual
    way round (stash, pull, pop) follows the rename but leaves conflict markers in the JSON."""
    upstream, learner = clones
    write(learner, "notebooks/07_serving.ipynb", work_in(notebook("07_serving", "Many requests")))
    renumber(upstream)
    pulled = git(learner, "pull", "-q", "--ff-only", check=False)
    assert pulled.returncode != 0 and "would be overwritten" in pulled.stderr
    git(learner, "stash", "-q")
    git(learner, "pull", "-q", "--ff-only")
    assert git(learner, "stash", "pop", check=False).returncode != 0
    text = (learner / "notebooks/08_serving.ipynb").read_text()
    assert "<<<<<<<" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_update_carries_an_edited_notebook_to_its_new_name(clones):
    upstream, learner = clones
    mine = work_in(notebook("07_serving", "Many requests"))
    write(learner, "notebooks/07_serving.ipynb", mine)
    first = work_in(notebook("01_transformer", "Transformer"))  # the course changes it too
    write(learner, "notebooks/01_transformer.ipynb", first)
    renumber(upstream)
    code, out, err = run_update(learner)
    assert code == 0, err
    assert git(learner, "rev-parse", "HEAD").stdout == git(upstream, "rev-parse", "HEAD").stdout
    assert (learner / "notebooks/08_serving.ipynb").read_text() == mine
    assert not (learner / "notebooks/07_serving.ipynb").exists()
    (backup,) = (learner / "notebooks/.backups").glob("07_serving.*.ipynb")
    assert backup.read_text() == mine
    assert (learner / "notebooks/01_transformer.ipynb").read_text() == first
    assert len(list((learner / "notebooks/.backups").glob("01_transformer.*.ipynb"))) == 1
    for fresh in ("07_llama", "09_kernels"):
        path = f"notebooks/{fresh}.ipynb"
        assert (learner / path).read_text() == committed(learner, path), fresh
    status = git(learner, "status", "--porcelain").stdout.splitlines()
    assert status == [" M notebooks/01_transformer.ipynb", " M notebooks/08_serving.ipynb"]
    assert "notebooks/01_transformer.ipynb: your notebook, back in place" in out
    assert "notebooks/07_serving.ipynb -> notebooks/08_serving.ipynb" in out
    assert "notebooks/07_llama.ipynb" in out and backup.name in out
    assert "close that tab without saving" in out


def test_update_carries_a_notebook_left_under_its_old_name(clones):
    """The learner pulled by hand with a clean tree; a Jupyter tab still open on the old name
    then saved it again, untracked."""
    upstream, learner = clones
    renumber(upstream)
    git(learner, "pull", "-q", "--ff-only")
    mine = work_in(notebook("07_serving", "Many requests"))
    write(learner, "notebooks/07_serving.ipynb", mine)
    # The clone is the first renumbering's commit: its table, not today's (where 09_kernels,
    # committed there, is an old name too).
    (old,) = notebooks_under_old_names(learner / "notebooks", FIRST_RENAMES)
    notice = old_name_notice(old, FIRST_RENAMES)
    assert "08_serving.ipynb" in notice and "course update" in notice
    code, out, err = run_update(learner)
    assert code == 0, err
    assert (learner / "notebooks/08_serving.ipynb").read_text() == mine
    assert not (learner / "notebooks/07_serving.ipynb").exists()
    assert len(list((learner / "notebooks/.backups").glob("07_serving.*.ipynb"))) == 1
    assert "07_serving.ipynb -> notebooks/08_serving.ipynb" in out
    assert notebooks_under_old_names(learner / "notebooks", FIRST_RENAMES) == []


def test_update_never_writes_over_work_at_the_new_name(clones):
    upstream, learner = clones
    renumber(upstream)
    git(learner, "pull", "-q", "--ff-only")
    newer = work_in(notebook("08_serving", "Many requests"))
    older = work_in(notebook("07_serving", "Many requests"))
    write(learner, "notebooks/08_serving.ipynb", newer)
    write(learner, "notebooks/07_serving.ipynb", older)
    code, out, err = run_update(learner)
    assert code == 0, err
    assert (learner / "notebooks/08_serving.ipynb").read_text() == newer
    (backup,) = (learner / "notebooks/.backups").glob("07_serving.*.ipynb")
    assert backup.read_text() == older
    assert "holds edits of yours too" in out and backup.name in out


def test_update_carries_the_kernels_notebook_from_chapter_9_to_10(clones):
    upstream, learner = clones
    renumber(upstream)
    git(learner, "pull", "-q", "--ff-only")
    mine = work_in(notebook("09_kernels", "Triton kernels"))
    write(learner, "notebooks/09_kernels.ipynb", mine)
    renumber_kernels(upstream)
    code, out, err = run_update(learner)
    assert code == 0, err
    assert git(learner, "rev-parse", "HEAD").stdout == git(upstream, "rev-parse", "HEAD").stdout
    assert (learner / "notebooks/10_kernels.ipynb").read_text() == mine
    assert not (learner / "notebooks/09_kernels.ipynb").exists()
    (backup,) = (learner / "notebooks/.backups").glob("09_kernels.*.ipynb")
    assert backup.read_text() == mine
    status = git(learner, "status", "--porcelain").stdout.splitlines()
    assert status == [" M notebooks/10_kernels.ipynb"]
    assert "notebooks/09_kernels.ipynb -> notebooks/10_kernels.ipynb" in out
    assert "close that tab without saving" in out


def test_update_follows_both_renumberings_at_once(clones):
    """A learner who last pulled before the first renumbering: 08_kernels -> 09_kernels ->
    10_kernels in one update, through the chain of the newest commit's table."""
    upstream, learner = clones
    mine = work_in(notebook("08_kernels", "Triton kernels"))
    write(learner, "notebooks/08_kernels.ipynb", mine)
    renumber(upstream)
    renumber_kernels(upstream)
    code, out, err = run_update(learner)
    assert code == 0, err
    assert (learner / "notebooks/10_kernels.ipynb").read_text() == mine
    names = sorted(p.name for p in (learner / "notebooks").glob("*.ipynb"))
    assert names == [
        "01_transformer.ipynb", "07_llama.ipynb", "08_serving.ipynb", "10_kernels.ipynb"
    ]  # fmt: skip
    (backup,) = (learner / "notebooks/.backups").glob("08_kernels.*.ipynb")
    assert backup.read_text() == mine
    assert "notebooks/08_kernels.ipynb -> notebooks/10_kernels.ipynb" in out
    assert "renamed by the course: notebooks/07_serving.ipynb -> notebooks/08_serving.ipynb" in out


def test_update_carries_a_kernels_notebook_left_under_chapter_9(clones):
    """Pulled by hand past the second renumbering; a tab still open on 09_kernels saved it."""
    upstream, learner = clones
    renumber(upstream)
    renumber_kernels(upstream)
    git(learner, "pull", "-q", "--ff-only")
    mine = work_in(notebook("09_kernels", "Triton kernels"))
    write(learner, "notebooks/09_kernels.ipynb", mine)
    (old,) = notebooks_under_old_names(learner / "notebooks")
    notice = old_name_notice(old)
    assert "chapter 10's notebook" in notice and "notebooks/10_kernels.ipynb" in notice
    code, out, err = run_update(learner)
    assert code == 0, err
    assert (learner / "notebooks/10_kernels.ipynb").read_text() == mine
    assert not (learner / "notebooks/09_kernels.ipynb").exists()
    assert "09_kernels.ipynb -> notebooks/10_kernels.ipynb" in out
    assert notebooks_under_old_names(learner / "notebooks") == []


def test_update_refuses_outside_a_git_clone(tmp_path):
    write(tmp_path, "notebooks/07_serving.ipynb", notebook("07_serving", "Many requests"))
    before = snapshot_files(tmp_path)
    code, out, err = run_update(tmp_path)
    assert code == 1 and "not a git clone" in err and "nothing was changed" in err
    assert snapshot_files(tmp_path) == before


def test_update_refuses_without_the_network(clones):
    upstream, learner = clones
    write(learner, "notebooks/07_serving.ipynb", work_in(notebook("07_serving", "Many requests")))
    renumber(upstream)
    git(learner, "remote", "set-url", "origin", str(upstream.parent / "unreachable"))
    before = snapshot(learner)
    code, out, err = run_update(learner)
    assert code == 1 and "could not be reached" in err and "nothing was changed" in err
    assert snapshot(learner) == before


def test_update_refuses_the_learners_own_commits_and_its_advice_works(clones):
    upstream, learner = clones
    mine = work_in(notebook("07_serving", "Many requests"))
    write(learner, "notebooks/07_serving.ipynb", mine)
    git(learner, "commit", "-q", "-am", "my serving exercises")
    renumber(upstream)
    before = snapshot(learner)
    code, out, err = run_update(learner)
    assert code == 1 and "1 commit of your own" in err and "my serving exercises" in err
    assert snapshot(learner) == before
    # The advice, followed word for word, keeps the commit and carries the notebook.
    commands = [line.split("#")[0].split() for line in err.splitlines() if line.startswith("    ")]
    steps = [" ".join(c[:2]) for c in commands]
    assert steps == ["git branch", "git reset", "git restore", "course update"]
    for command in commands[:-1]:
        git(learner, *command[1:])
    code, out, err = run_update(learner)
    assert code == 0, err
    assert (learner / "notebooks/08_serving.ipynb").read_text() == mine
    assert git(learner, "log", "-1", "--format=%s", "my-work").stdout.strip() == (
        "my serving exercises"
    )


def test_update_refuses_when_its_changes_meet_a_file_changed_outside_notebooks(clones):
    upstream, learner = clones
    write(upstream, "README.md", "the course, renumbered\n")
    renumber(upstream)
    write(learner, "README.md", "my notes\n")
    write(learner, "notebooks/07_serving.ipynb", work_in(notebook("07_serving", "Many requests")))
    before = snapshot(learner)
    code, out, err = run_update(learner)
    assert code == 1 and "README.md" in err and "nothing was changed" in err
    assert snapshot(learner) == before


def test_update_with_nothing_new_changes_nothing(clones):
    upstream, learner = clones
    write(learner, "notebooks/01_transformer.ipynb", work_in(notebook("01_transformer", "T")))
    before = snapshot(learner)
    code, out, err = run_update(learner)
    assert code == 0 and "nothing to do" in out, err
    assert snapshot(learner) == before


def test_renames_table():
    assert current_name("07_serving") == "08_serving" and current_name("07_llama") == "07_llama"
    # Renamed twice: the kernels were chapter 8, then 9, and are chapter 10.
    assert current_name("08_kernels") == "10_kernels" == current_name("09_kernels")
    assert current_name("10_kernels") == "10_kernels"
    assert current_name("a", {"a": "b", "b": "c"}) == "c"
    with pytest.raises(ValueError, match="loop"):
        current_name("a", {"a": "b", "b": "a"})
    assert renames_in((REPO_ROOT / "utils" / "renames.py").read_text()) == RENAMES
    assert renames_in("X = 1\n") == {}


def test_the_command_is_listed():
    from utils.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0 and "update" in out.getvalue()
