"""Build learner notebooks from chapters/ (prose, cell order) and solutions/ (code).

    stub build     exercise cells hold the solution source with each fenced region replaced
                   by `raise NotImplementedError()` -> notebooks/NN_name.ipynb (committed)
    teacher build  exercise cells hold the whole solution (used by CI to run each chapter),
                   and the cells tagged "claim" stay in: each asserts that a number the prose
                   quotes is what the cells above it computed, so a retrained model or changed
                   code fails make test instead of leaving the text wrong. The learner's build
                   leaves them out (cell ids keep the chapter's numbering).

The output is byte-for-byte deterministic: fixed cell ids, no outputs, fixed metadata.
"""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

import nbformat

from utils import NOTEBOOKS_DIR, REPO_ROOT, colab
from utils.chapters import SOLUTION_PREFIX, chapter_names, object_source, read_chapter, strip_fences

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
KEPT_METADATA = ("tags", "exercise")


def _exercise_source(cell_source: str, stub: bool) -> str:
    parts = []
    for line in cell_source.splitlines():
        if line.startswith(SOLUTION_PREFIX):
            source = object_source(line[len(SOLUTION_PREFIX) :].strip(), stub=stub)
            parts.append(source if stub else strip_fences(source))
        elif line.strip():
            parts.append(line)
    return "\n\n\n".join(parts)


def build_notebook(chapter: str, teacher: bool = False) -> nbformat.NotebookNode:
    source = read_chapter(chapter).notebook
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": KERNELSPEC,
        "language_info": {"name": "python"},
        "course": {"chapter": chapter, "build": "teacher" if teacher else "learner"},
    }
    for i, cell in enumerate(source.cells):
        metadata = {k: cell.metadata[k] for k in KEPT_METADATA if k in cell.metadata}
        text = cell.source
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(text, metadata=metadata)
        elif cell.cell_type == "code":
            tags = metadata.get("tags", [])
            if "claim" in tags and not teacher:
                continue
            if "exercise" in tags:
                text = _exercise_source(text, stub=not teacher)
            elif "source" in tags:  # given code: always whole
                text = _exercise_source(text, stub=False)
            new = nbformat.v4.new_code_cell(text, metadata=metadata)
        else:
            new = nbformat.v4.new_raw_cell(text, metadata=metadata)
        new.id = cell_id(chapter, i)
        nb.cells.append(new)
    nb.cells.insert(0, colab_cell(chapter, colab.cells_digest(nb.cells)))
    nbformat.validate(nb)
    return nb


def colab_cell(chapter: str, digest: str) -> nbformat.NotebookNode:
    """The first cell: on Google Colab it installs the course (utils/colab.py); Colab shows only
    its title (cellView form) and JupyterLab folds its code away (source_hidden)."""
    cell = nbformat.v4.new_code_cell(
        colab.cell_source(f"notebooks/{chapter}.ipynb", digest),  # in the repository, always
        metadata={"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["colab"]},
    )
    cell.id = f"{chapter[:2]}-{colab.CELL_ID_SUFFIX}"
    return cell


def cell_id(chapter: str, index: int) -> str:
    return f"{chapter[:2]}-{index:03d}"


def pristine_cell_ids(chapter: str) -> set[str]:
    """The ids of the cells a fresh build has: any other cell is one the learner added."""
    cells = range(len(read_chapter(chapter).notebook.cells))
    return {cell_id(chapter, i) for i in cells} | {f"{chapter[:2]}-{colab.CELL_ID_SUFFIX}"}


def notebook_text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def notebook_path(chapter: str) -> Path:
    return NOTEBOOKS_DIR / f"{chapter}.ipynb"


def build_all(out_dir: Path | None = None, teacher: bool = False) -> list[Path]:
    out_dir = Path(out_dir) if out_dir is not None else NOTEBOOKS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for chapter in chapter_names():
        path = out_dir / f"{chapter}.ipynb"
        path.write_text(notebook_text(build_notebook(chapter, teacher=teacher)), encoding="utf-8")
        written.append(path)
    return written


def _head_text(path: Path) -> str | None:
    """The notebook as last committed, or None outside a git checkout."""
    try:
        rel = path.relative_to(REPO_ROOT).as_posix()
        done = subprocess.run(
            ["git", "show", f"HEAD:{rel}"], cwd=REPO_ROOT, capture_output=True, text=True
        )
    except (OSError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def stale_notebooks() -> dict[str, str]:
    """Notebooks that differ from a fresh build: {chapter: first lines of the diff}.

    A learner works in notebooks/, so a notebook that differs in the working tree is compared
    as committed (HEAD) too: it is stale only if neither version matches a fresh build.
    """
    stale = {}
    for chapter in chapter_names():
        fresh = notebook_text(build_notebook(chapter))
        path = notebook_path(chapter)
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != fresh:
            current = _head_text(path) or current
        if current != fresh:
            diff = difflib.unified_diff(
                current.splitlines(), fresh.splitlines(), "committed", "fresh build", lineterm=""
            )
            stale[chapter] = "\n".join(list(diff)[:20]) or "(missing)"
    expected = {f"{c}.ipynb" for c in chapter_names()}
    for extra in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        if extra.name not in expected:
            stale[extra.stem] = "notebook has no chapter source"
    return stale
