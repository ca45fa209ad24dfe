"""`course export`: a notebook, outputs and all, as one HTML page that reads well offline.

The page may read nothing but files in its own folder. What nbconvert's defaults get wrong:

- a cell that prints a token at a time (`verbose=True` sampling) stores one stream output per
  flush, and each becomes its own block, one token per line: consecutive stream outputs are
  merged first (nbconvert's `CoalesceStreamsPreprocessor`, off by default);
- the page loads MathJax from a CDN, so offline every formula shows as raw `$...$`: the page
  loads MathJax 2 from a `mathjax/` folder beside it instead, copied there from the
  `jupyter-server-mathjax` package (a subfolder of the page's own, which browsers allow a
  `file://` page to read);
- that package ships one web font, STIX-Web, not MathJax's default TeX font (no
  `jax/output/HTML-CSS/fonts/TeX/`, no `fonts/HTML-CSS/TeX/`): left at its default, MathJax
  asks for the TeX font's data, the file is missing, and every formula is set in the
  browser's plain serif. The page tells MathJax to use STIX-Web, as Jupyter's classic
  notebook configures this same copy, and hides the menu's renderer choice (the other
  renderers' files are not shipped either);
- the page loads require.js from a CDN for the one thing on it that needs it: the script that
  draws widgets (a tqdm progress bar), itself fetched from a CDN and shipped by no package the
  course installs. So a widget is written as text instead: its last saved state (`training:
  100% |██████████| 300/300 [...]`) where the notebook kept one (nbclient does), else the text
  the kernel stored beside it. With no widget left, nothing needs require.js: none is loaded;
- the page would fetch mermaid.js from a CDN for a diagram in a markdown cell: it does not,
  and the diagram reads as its source text.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import nbformat

MATHJAX_DIR = "mathjax"
MATHJAX_URL = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"

# nbconvert's own `lab` page, less its CDN scripts, with MathJax told which font it has
# (STIX-Web: the one web font jupyter-server-mathjax ships). The `@font-face` MathJax declares
# itself, "MathJax_Blank" from `url('about:blank')`, is a request outside the folder that a
# browser refuses to a `file://` page: without its `src` the name falls back as it did anyway.
TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
{{ super() }}
<script type="text/x-mathjax-config">
MathJax.Hub.Config({
    "HTML-CSS": {
        availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
        styles: {"@font-face": {src: null}}
    },
    MathMenu: {showRenderer: false}
});
</script>
{%- endblock html_head_js_mathjax -%}
"""

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def mathjax_source() -> Path:
    """The MathJax 2 distribution the `jupyter-server-mathjax` package ships."""
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def widget_text(model_id: str, states: dict) -> str | None:
    """A widget's last saved state as text, or None where there is none to read.

    A box reads as its children side by side: tqdm's bar is a box of a label ("training:
    100%"), a progress bar and the counts ("300/300 [00:42<00:00, 7.1it/s]").
    """
    model = states.get(model_id)
    if model is None:
        return None
    state = model.get("state", {})
    if "children" in state:
        parts = (widget_text(c.removeprefix("IPY_MODEL_"), states) for c in state["children"])
        return " ".join(p for p in parts if p) or None
    if model.get("model_name", "").endswith("ProgressModel"):
        low, high, value = state.get("min", 0), state.get("max", 100), state.get("value", 0)
        filled = round(10 * (value - low) / (high - low)) if high > low else 10
        return "|" + "█" * filled + " " * (10 - filled) + "|"
    value = state.get("value")
    if isinstance(value, str):  # an HTML or Label widget: its text, tags dropped
        return html.unescape(re.sub(r"<[^>]*>", "", value)).replace("\u2007", " ").strip()
    return None


def widgets_as_text(nb) -> None:
    """Replace each widget output by text, and drop the widget state (see the module doc)."""
    states = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).pop(WIDGET_VIEW, None)
            if view is None:
                continue
            text = widget_text(view.get("model_id", ""), states)
            if text:
                output["data"]["text/plain"] = text


def export_html(notebook: Path, out_dir: Path) -> Path:
    """Write `notebook` as `out_dir/<name>.html`, with `out_dir/mathjax/` beside it."""
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    if not notebook.is_file():
        raise ValueError(f"notebook must be an existing .ipynb file, got {str(notebook)!r}")
    nb = nbformat.read(notebook, as_version=4)
    # The first cell only installs the course on Colab (utils/colab.py): not part of the work.
    nb.cells = [c for c in nb.cells if "colab" not in c.metadata.get("tags", [])]
    widgets_as_text(nb)
    exporter = HTMLExporter(mathjax_url=MATHJAX_URL, raw_template=TEMPLATE)
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / MATHJAX_DIR / "MathJax.js").exists():
        shutil.copytree(mathjax_source(), out_dir / MATHJAX_DIR, dirs_exist_ok=True)
    page = out_dir / f"{notebook.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page
