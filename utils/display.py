"""What the learner reads: check() verdicts and solutions, in a notebook or a terminal.

In a terminal, rich prints them. In Jupyter, rich's own HTML does not read in full: it is a
`white-space: pre` block wrapped at rich's console width (wider than the output area, so the
middle of a long message scrolls out of sight), and its line height lets the next line paint
over the underscores of the line above (the last line's are clipped, and in a highlighted code
block, where every line has a background, all of them). So in Jupyter the same text goes out as
HTML that wraps at the output area's edge, with room for underscores, and as plain text beside
it (what nbconvert, tests and a text-only front end read).
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.syntax import Syntax

from utils.chapters import all_exercises, object_source, strip_fences

BLOCK_STYLE = (
    # word-break: JupyterLab's own stylesheet breaks output lines inside words ("re / ference").
    "white-space: pre-wrap; word-break: normal; overflow-wrap: break-word; line-height: 1.45; "
    "margin: 0; padding: 0.1em 0 0.25em; font-family: var(--jp-code-font-family, monospace)"
)
CODE_THEME = "monokai"


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (rich's own test)."""
    return Console().is_jupyter


def _publish(html_text: str, plain: str) -> None:
    from IPython.display import display

    display({"text/html": html_text, "text/plain": plain}, raw=True)


def show(markup: str) -> None:
    """Print rich markup (`[red]...[/]`): wrapped to the output area in a notebook."""
    if not in_notebook():
        Console(soft_wrap=True, highlight=False).print(markup)
        return
    recorder = Console(
        record=True, file=io.StringIO(), soft_wrap=True, force_jupyter=False, highlight=False,
        force_terminal=True, color_system="truecolor", width=200,
    )  # fmt: skip
    recorder.print(markup)
    plain = recorder.export_text(clear=False)
    page = recorder.export_html(
        inline_styles=True, code_format=f'<pre style="{BLOCK_STYLE}">{{code}}</pre>'
    )
    _publish(page, plain)


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


def code_html(source: str) -> str:
    """Highlighted Python as HTML: one dark background for the whole block (not one per line,
    which would paint over underscores), lines wrapped, never cropped."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    formatter = HtmlFormatter(style=CODE_THEME, noclasses=True, nowrap=True)
    body = highlight(source, PythonLexer(), formatter)
    background = formatter.style.background_color
    return (
        f'<pre style="{BLOCK_STYLE}; background: {background}; color: #f8f8f2; '
        f'padding: 0.6em 0.8em; border-radius: 4px">{body}</pre>'
    )


def show_solution(name: str) -> None:
    """Print the reference solution for `name`. Try the exercise first: reading is not writing."""
    source = solution_source(name)
    if in_notebook():
        _publish(code_html(source), source)
        return
    # soft_wrap: never crop a line of code, whatever the terminal width. The theme paints its
    # own dark background, so the colours read the same on a light or a dark terminal.
    width = max(len(line) for line in source.splitlines()) + 1
    console = Console(soft_wrap=True)
    console.print(Syntax(source, "python", theme=CODE_THEME, code_width=width))
