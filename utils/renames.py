"""The chapters' notebooks that the course renamed: each old name and the name that replaced it.

Learners work in the committed notebooks, so a notebook renamed upstream still holds a learner's
work under its old name. `course update` reads this table (as the commit it updates to has it)
to carry each notebook to its chapter's current name, and `course grade` and `make lab` name any
notebook still found under an old one. Add a line whenever a chapter's notebook changes name;
never reuse an old name for another chapter.
"""

from __future__ import annotations

import ast
from pathlib import Path

# When the Llama chapter became chapter 7, the two chapters after it moved up one; when chapter
# 9 was kept for constrained decoding, the kernels moved to 10 (08_kernels follows both).
RENAMES: dict[str, str] = {
    "07_serving": "08_serving",
    "08_kernels": "09_kernels",
    "09_kernels": "10_kernels",
}


def current_name(name: str, renames: dict[str, str] | None = None) -> str:
    """The chapter's name now, following renames one after another (a name renamed twice
    ends at the last); a name that was never renamed is its own current name."""
    renames = RENAMES if renames is None else renames
    seen = [name]
    while name in renames:
        name = renames[name]
        if name in seen:
            raise ValueError(f"renames must not loop: {' -> '.join([*seen, name])}")
        seen.append(name)
    return name


def renames_in(source: str) -> dict[str, str]:
    """The RENAMES table of a version of this module given as text (another commit's), read
    without running it; an empty table where that version has none."""
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "RENAMES" and node.value is not None:
            table = ast.literal_eval(node.value)
            return {str(old): str(new) for old, new in table.items()}
    return {}


def notebooks_under_old_names(folder: Path, renames: dict[str, str] | None = None) -> list[Path]:
    """The notebooks in `folder` whose name is one the course has since replaced."""
    renames = RENAMES if renames is None else renames
    return [path for path in sorted(Path(folder).glob("*.ipynb")) if path.stem in renames]


def old_name_notice(path: Path, renames: dict[str, str] | None = None) -> str:
    """A sentence saying where a notebook found under an old name belongs and how to carry it."""
    new = current_name(path.stem, renames)
    return (
        f"notebooks/{path.name} is chapter {int(new[:2])}'s notebook under its old name (the "
        f"chapters were renumbered): grading and the course read notebooks/{new}.ipynb. "
        f"`course update` carries yours there, with a copy of each kept in notebooks/.backups/ "
        f"(where notebooks/{new}.ipynb holds work of yours too, it leaves both and says so)."
    )
