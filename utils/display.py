"""Show a solution's source, highlighted, in a terminal or a notebook."""

from __future__ import annotations

from rich.console import Console
from rich.syntax import Syntax

from utils.chapters import all_exercises, object_source, strip_fences


def solution_path(name: str) -> str:
    """'LayerNorm', 'layernorm' (an exercise) or 'solutions.layernorm.LayerNorm' -> dotted path."""
    for ex in all_exercises():
        if name == ex.name and len(ex.objects) == 1:
            return ex.objects[0]
        for dotted, obj in zip(ex.objects, ex.object_names, strict=True):
            if name in (obj, dotted):
                return dotted
    known = sorted({o for ex in all_exercises() for o in ex.object_names})
    raise ValueError(f"name must be an exercise object such as one of {known}, got {name!r}")


def solution_source(name: str) -> str:
    return strip_fences(object_source(solution_path(name), stub=False))


def show_solution(name: str) -> None:
    """Print the reference solution for `name`. Try the exercise first: reading is not writing."""
    # soft_wrap: never crop a line of code, whatever the terminal width. The theme paints its
    # own dark background, so the colours read the same on a light or a dark Jupyter theme
    # and terminal (ANSI themes take the viewer's background, and yellow on white is unreadable).
    source = solution_source(name)
    width = max(len(line) for line in source.splitlines()) + 1
    console = Console(soft_wrap=True)
    console.print(Syntax(source, "python", theme="monokai", code_width=width))
