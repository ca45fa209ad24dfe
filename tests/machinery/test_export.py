"""`course export`: one block per printed text, and MathJax read from beside the page."""

import nbformat

from utils.export import MATHJAX_DIR, export_html


def test_export_merges_streams_and_loads_mathjax_offline(tmp_path):
    cell = nbformat.v4.new_code_cell("for t in 'abc': print(t, end='', flush=True)")
    # What a kernel stores when a loop flushes a token at a time: one stream output each.
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in "abc"]
    math = nbformat.v4.new_markdown_cell("The softmax: $p_i = e^{z_i} / \\sum_j e^{z_j}$.")
    path = tmp_path / "03_sampling.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[math, cell]), path)

    page = export_html(path, tmp_path / "out")

    html = page.read_text(encoding="utf-8")
    assert "<pre>abc" in html, "the three flushes must read as one text"
    assert "libs/mathjax" not in html.lower(), "MathJax must not come from a CDN"
    assert f'src="{MATHJAX_DIR}/MathJax.js' in html
    assert (tmp_path / "out" / MATHJAX_DIR / "MathJax.js").is_file()
    assert (tmp_path / "out" / MATHJAX_DIR / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()
