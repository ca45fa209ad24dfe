"""`course export`: a notebook, outputs and all, as one HTML page that reads well offline.

Two things nbconvert's defaults get wrong for this course:

- a cell that prints a token at a time (`verbose=True` sampling) stores one stream output per
  flush, and each becomes its own block, one token per line: consecutive stream outputs are
  merged first (nbconvert's `CoalesceStreamsPreprocessor`, off by default);
- the page loads MathJax from a CDN, so offline every formula shows as raw `$...$`: the page
  loads MathJax 2 from a `mathjax/` folder beside it instead, copied there from the
  `jupyter-server-mathjax` package (a subfolder of the page's own, which browsers allow a
  `file://` page to read).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

MATHJAX_DIR = "mathjax"
MATHJAX_URL = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"


def mathjax_source() -> Path:
    """The MathJax 2 distribution the `jupyter-server-mathjax` package ships."""
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def export_html(notebook: Path, out_dir: Path) -> Path:
    """Write `notebook` as `out_dir/<name>.html`, with `out_dir/mathjax/` beside it."""
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    if not notebook.is_file():
        raise ValueError(f"notebook must be an existing .ipynb file, got {str(notebook)!r}")
    nb = nbformat.read(notebook, as_version=4)
    exporter = HTMLExporter(mathjax_url=MATHJAX_URL)
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / MATHJAX_DIR / "MathJax.js").exists():
        shutil.copytree(mathjax_source(), out_dir / MATHJAX_DIR, dirs_exist_ok=True)
    page = out_dir / f"{notebook.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page
