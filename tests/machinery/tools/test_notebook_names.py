"""Every name a learner's exercise cell or given cell uses is defined in the same notebook, or
is a builtin. Grading runs the cells a test needs in a namespace of its own and may pass where
the learner's kernel raises NameError: chapter 4's `forward_with_cache` called a checker that
lived in `solutions/` alone, so passing `positions=` failed in the learner's notebook while
every test passed.

Static, on each chapter's build with the solutions in (the learner's build lacks the lines that
bind a function's own locals, which would then look global): a name the cell reads at its top
level must be bound by a cell above it; a name read inside a function or method, which Python
looks up when it runs, by some cell of the notebook (chapter 4's `forward_with_cache` calls
section 8's `positions_and_allowed` for padded batches, which come after section 8)."""

import builtins

import nbformat
import pytest

from utils.build import build_notebook
from utils.cells import cell_names
from utils.chapters import chapter_names

# What a Jupyter kernel defines besides Python's builtins.
KERNEL_NAMES = {"display", "get_ipython", "In", "Out", "exit", "quit"}


def undefined_names(nb) -> list[str]:
    """'cell N (what): name, ...' for each exercise or given cell that reads a name the
    notebook does not define where the read needs it."""
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    names = {i: cell_names(c.source) for i, c in code}
    anywhere = set(dir(builtins)) | KERNEL_NAMES
    for found in names.values():
        anywhere |= found.bound
    above = set(dir(builtins)) | KERNEL_NAMES
    problems = []
    for i, cell in code:
        found = names[i]
        bound, read_top, read_later = found.bound, found.free_at_top, found.free
        tags = cell.metadata.get("tags", [])
        what = cell.metadata.get("exercise") and f"exercise {cell.metadata['exercise']}"
        what = what or ("given code" if "source" in tags else None)
        missing = sorted((read_top - above) | (read_later - anywhere))
        if what and missing:
            problems.append(f"cell {i} ({what}): {', '.join(missing)}")
        above |= bound
    return problems


@pytest.mark.parametrize("chapter", chapter_names())
def test_every_name_a_learners_cell_uses_is_defined_above_it(chapter):
    problems = undefined_names(build_notebook(chapter, teacher=True))
    where = "names the notebook does not define where they are read:\n"
    assert not problems, where + "\n".join(problems)


def test_the_check_finds_a_name_defined_only_in_solutions():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\nfrom solutions import checks"),
        nbformat.v4.new_code_cell(
            "def f(x):\n    y = g(x)\n    return explicit_layout(y) + torch.ones(1) + len(x)",
            metadata={"exercise": "f"},
        ),
        nbformat.v4.new_code_cell("f(later)\n", metadata={"tags": ["source"]}),
        nbformat.v4.new_code_cell("def g(x):\n    return x\nlater = 1", metadata={"exercise": "g"}),
    ]
    assert undefined_names(nb) == [
        "cell 1 (exercise f): explicit_layout",  # in no cell: g, defined further down, is fine
        "cell 2 (given code): later",  # read at the top level before its cell
    ]
