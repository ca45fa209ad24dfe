"""`course export`: one block per printed text, and a page that reads nothing but its own folder.

No browser here (CI may have none): the page's HTML is parsed for everything it would load,
and MathJax's font is followed, as MathJax names its files, into the copied `mathjax/` folder.
"""

import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from utils.export import MATHJAX_DIR, export_html

FORMULAS = "Inline $\\sqrt{x^2}$, and displayed: $$\\frac{a}{b} = \\sum_i e^{z_i}$$"
LINK = "https://example.com/reading"
PIXEL = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def widget_model(name: str, **state) -> dict:
    return {"model_name": name, "model_module": "@jupyter-widgets/controls", "state": state}


def tqdm_cell():
    """A finished tqdm bar as a kernel leaves it: a widget view, and beside it the text of
    the bar when it was first drawn (0%); the last state is in the notebook's metadata."""
    cell = nbformat.v4.new_code_cell("for _ in tqdm(range(5), desc='sampling'): pass")
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                "application/vnd.jupyter.widget-view+json": view,
                "text/plain": "sampling:   0%|          | 0/5 [00:00<?, ?it/s]",
            },
        )
    ]
    state = {
        "box": widget_model("HBoxModel", children=["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]),
        "l": widget_model("HTMLModel", value="sampling:\u2007100%"),
        "p": widget_model("FloatProgressModel", value=5.0, max=5.0, bar_style="success"),
        "r": widget_model("HTMLModel", value="\u20075/5\u2007[00:00&lt;00:00,\u2007493.11it/s]"),
    }
    widgets = {"application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2}}
    return cell, widgets


@pytest.fixture
def exported(tmp_path) -> Path:
    cell = nbformat.v4.new_code_cell("for t in 'abc': print(t, end='', flush=True)")
    # What a kernel stores when a loop flushes a token at a time: one stream output each.
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in "abc"]
    cell.outputs.append(nbformat.v4.new_output("display_data", data={"image/png": PIXEL}))
    math = nbformat.v4.new_markdown_cell(f"{FORMULAS}\n\nSee [the paper]({LINK}).")
    bar, widgets = tqdm_cell()
    nb = nbformat.v4.new_notebook(cells=[math, cell, bar])
    nb.metadata["widgets"] = widgets
    path = tmp_path / "03_sampling.ipynb"
    nbformat.write(nb, path)
    return export_html(path, tmp_path / "out")


class Loads(HTMLParser):
    """What a page loads: src/href of any tag but <a>, and the text of its scripts and styles
    (a script that loads another names its URL in its code: `import("https://...")`)."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.links: list[str] = []
        self.code: list[str] = []  # inline scripts' and styles' text
        self._in_code = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("src", "href"):
            if attrs.get(name) is not None:
                (self.links if tag == "a" else self.urls).append(attrs[name])
        self._in_code = tag in ("script", "style") and "src" not in attrs

    def handle_endtag(self, tag):
        self._in_code = False

    def handle_data(self, data):
        if self._in_code:
            self.code.append(data)


def page_loads(page: Path) -> Loads:
    loads = Loads()
    loads.feed(page.read_text(encoding="utf-8"))
    return loads


def test_export_merges_streams_and_loads_mathjax_offline(exported):
    html = exported.read_text(encoding="utf-8")
    assert "<pre>abc" in html, "the three flushes must read as one text"
    assert "libs/mathjax" not in html.lower(), "MathJax must not come from a CDN"
    assert f'src="{MATHJAX_DIR}/MathJax.js' in html
    assert (exported.parent / MATHJAX_DIR / "MathJax.js").is_file()


def test_page_loads_only_files_beside_it(exported):
    loads = page_loads(exported)
    assert LINK in loads.links, "a hyperlink in the notebook's markdown stays a hyperlink"
    assert loads.urls, "the page loads MathJax at least"
    for url in loads.urls:
        if url.startswith("data:"):  # a plot, inside the page itself
            continue
        assert "://" not in url and not url.startswith("//"), f"the page loads {url}"
        assert (exported.parent / url.split("?")[0]).is_file(), f"{url} is not beside the page"
    for code in loads.code:
        # CSS comments cite their sources; nothing else may name a remote URL.
        code = re.sub(r"/\*.*?\*/", "", code, flags=re.DOTALL)
        remote = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}/[^\s'\")]*", code)
        assert not remote, f"a script or style on the page loads {remote}"


def test_widget_reads_as_its_last_state(exported):
    html = exported.read_text(encoding="utf-8")
    assert "widget-view+json" not in html and "widget-state+json" not in html
    assert "sampling: 100% |██████████| 5/5 [00:00&lt;00:00, 493.11it/s]" in html
    assert "0/5" not in html, "the bar as first drawn, at 0%, is not what the run did"


def mathjax_web_font(page: Path) -> str:
    """The HTML-CSS web font the page's configuration asks MathJax for (its default: TeX)."""
    configs = re.findall(
        r'<script type="text/x-mathjax-config">(.*?)</script>',
        page.read_text(encoding="utf-8"),
        flags=re.DOTALL,
    )
    fonts = [m for c in configs for m in re.findall(r'webFont:\s*"([\w-]+)"', c)]
    return fonts[-1] if fonts else "TeX"


def test_mathjax_finds_its_font_beside_the_page(exported):
    mathjax = exported.parent / MATHJAX_DIR
    configs = re.search(r"MathJax\.js\?config=([\w,-]+)", exported.read_text()).group(1)
    for config in configs.split(","):
        assert (mathjax / "config" / f"{config}.js").is_file(), config
    font = mathjax_web_font(exported)
    data = mathjax / "jax/output/HTML-CSS/fonts" / font
    assert (data / "fontdata.js").is_file(), f"MathJax would ask for the {font} font's data"
    assert (data / "fontdata-extra.js").is_file()
    # fontdata.js maps each font family to its glyph file; the family names the web font file
    # as MathJax's HTML-CSS output does (fontFace): "X_Main-bold-italic" -> X_Main-BoldItalic.
    table = re.search(r"FONTS:\{(.*?)\}", (data / "fontdata.js").read_text()).group(1)
    families = re.findall(r'"?([\w-]+)"?:"([\w/]+\.js)"', table)
    assert families
    for family, glyphs in families:
        assert (data / glyphs).is_file(), glyphs
        woff = re.sub("-b", "-B", family, count=1)
        woff = re.sub("-i", "-I", woff, count=1).replace("-Bold-", "-Bold", 1)
        woff += "" if "-" in woff else "-Regular"
        assert (mathjax / "fonts/HTML-CSS" / font / "woff" / f"{woff}.woff").is_file(), woff


def test_the_colab_cell_is_left_out(tmp_path):
    from utils.build import build_notebook

    path = tmp_path / "01_transformer.ipynb"
    nbformat.write(build_notebook("01_transformer"), path)
    html = export_html(path, tmp_path / "out").read_text(encoding="utf-8")
    assert "Chapter 1" in html and "setup_course" not in html
