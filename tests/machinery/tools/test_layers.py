"""The chapter sources sit above utils/ and solutions/ (../shared/DESIGN.md, "Layers"): each
chapters/NN_*.py imports, of the course's own code, only `solutions` and `utils`, what a learner's
notebook can import after `make setup`. A name that starts with a digit is not importable, so
import-linter (pyproject.toml's contracts, the other layers) cannot read these files: this test
parses them instead, every import statement, those inside a function too."""

from __future__ import annotations

import ast
import re

import pytest

import utils
from utils import CHAPTERS_DIR, REPO_ROOT

ALLOWED = {"solutions", "utils"}

# The course's own top-level names: what `import X` would find in the repository's root (a
# folder, a package or not, or a module), when a notebook's kernel starts there.
FIRST_PARTY = {
    path.stem
    for path in REPO_ROOT.iterdir()
    if not path.name.startswith((".", "_"))
    and (path.is_dir() or path.suffix == ".py")
    and path.stem.isidentifier()
}

CHAPTERS = sorted(CHAPTERS_DIR.glob("[0-9][0-9]_*.py"))


def wrong_imports(source: str) -> list[str]:
    """Each import in `source` that reaches course code other than solutions and utils, as
    'line N: the statement' (empty when there is none). Relative imports count as wrong: a
    chapter is not a package."""
    wrong = []
    nodes = sorted(ast.walk(ast.parse(source)), key=lambda node: getattr(node, "lineno", 0))
    for node in nodes:
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = ["." * node.level] if node.level else [node.module.split(".")[0]]
        else:
            continue
        if any(root.startswith(".") or root in FIRST_PARTY - ALLOWED for root in roots):
            wrong.append(f"line {node.lineno}: {ast.unparse(node)}")
    return wrong


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 9, f"chapter sources not found in {CHAPTERS_DIR}"
    assert {"solutions", "utils", "benchmarks", "tests"} <= FIRST_PARTY


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_imports_only_solutions_and_utils(path):
    wrong = wrong_imports(path.read_text())
    assert not wrong, (
        f"chapters/{path.name} imports course code other than solutions and utils (a notebook "
        "sits above utils/ and solutions/ only; benchmarks/ and tests/ are not there for a "
        "learner): " + "; ".join(wrong)
    )


def test_the_check_sees_a_wrong_import_anywhere():
    source = (
        "import torch\nfrom solutions.model import DemoTransformer\nimport utils.plots\n"
        "def f():\n    from benchmarks.records import write\n"
        "import tests.support as s\nfrom . import sibling\n"
    )
    assert wrong_imports(source) == [
        "line 5: from benchmarks.records import write",
        "line 6: import tests.support as s",
        "line 7: from . import sibling",
    ]


def test_the_map_of_utils_names_every_module_in_it():
    """utils/__init__.py's docstring says whom each module serves: a module added, removed or
    renamed is added, removed or renamed there too."""
    here = {p.name for p in (REPO_ROOT / "utils").iterdir() if p.suffix in (".py", ".json")}
    named = set(re.findall(r"\b[a-z_-]+\.(?:py|json)\b", utils.__doc__))
    assert here - {"__init__.py"} <= named, f"not in the map: {sorted(here - named)}"
    assert named <= here, f"in the map, not in utils/: {sorted(named - here)}"
