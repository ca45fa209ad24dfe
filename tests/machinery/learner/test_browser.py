"""The learner's seat in a real browser: JupyterLab serves chapter 1, headless Chromium opens it
through the Lab UI, and the keyboard does what a learner does. Run the setup cell and the
reference-model cell, write a wrong LayerNorm (epsilon outside the sqrt), run its
`check("layernorm")` cell and read the failure on the page; fix it, check again, read the pass.

The server starts from an environment built like a learner's terminal (the venv's bin first on
PATH, a HOME, LANG), not from this test process's: no TRITON_INTERPRET, COURSE_* or PYTEST_*
variables reach the kernel. Screenshots are kept in build/screenshots/ (their paths are
printed). Skipped, saying what to install, without Debian's chromium or Playwright for Python.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from utils import REPO_ROOT
from utils.paths import cache_dir
from utils.timing import patient

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NOTEBOOK = REPO_ROOT / "notebooks" / "01_transformer.ipynb"
SHOTS = REPO_ROOT / "build" / "screenshots"
SHOT_NAMES = ("browser_check_failing.png", "browser_check_passing.png", "browser_error.png")

# Bounded waits, generous for an idle 2-core machine, stretched for a busy one (COURSE_TIME_SCALE).
SERVER_START_S = patient(60)  # until /api/status answers
UI_LOAD_S = patient(60)  # until the notebook's cells are on the page
SETUP_CELL_S = patient(90)  # kernel start, then the setup cell imports torch and transformers
CELL_S = patient(60)  # any other cell, a check(...) included

# Epsilon outside the square root: the classic mistake, with its own tutor message. It fails
# the epsilon tests and passes the others.
WRONG_BODY = """\
centred = residual - residual.mean(dim=-1, keepdim=True)
std = centred.pow(2).mean(dim=-1, keepdim=True).sqrt()
return centred / (std + self.cfg.layer_norm_eps) * self.w + self.b"""
FIXED_BODY = """\
centred = residual - residual.mean(dim=-1, keepdim=True)
var = centred.pow(2).mean(dim=-1, keepdim=True)
return centred / (var + self.cfg.layer_norm_eps).sqrt() * self.w + self.b"""
# What the failing check must show: the tutor's hint of one failing test, and the name of the
# config field, underscores included, from the other's message.
FAIL_HEADLINE = re.compile(r"✗ layernorm: \d+ of \d+ tests? failed")
FAIL_HINT = "Is your epsilon outside the sqrt?"
FAIL_UNDERSCORED = "layer_norm_eps"
# Sentences of the failure as tests/graded/test_01_transformer.py words them, which must read
# whole on the page: a block wrapped by a fixed width breaks them mid-word ("eps=0." / "1").
FAIL_SENTENCES = (
    "LayerNorm with layer_norm_eps=0.1 differs from the reference model",
    "Read epsilon from self.cfg.layer_norm_eps: 1e-5 is GPT-2's value, not every model's.",
)
PASS_HEADLINE = re.compile(r"✓ layernorm: (all \d+ tests|the test) passed")


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return (
            f"needs Chromium at {CHROMIUM} (Debian: `sudo apt-get install chromium`; "
            "Playwright's own browser download is not used)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return (
            "needs Playwright for Python: `.venv/bin/pip install -e '.[dev]'` "
            "(or `pip install playwright`; no `playwright install` needed)"
        )
    return None


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


# --------------------------------------------------------------------------- the notebook


def _cell_index(cells: list[dict], test, what: str) -> int:
    found = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and test(c)]
    assert len(found) == 1, f"expected one {what} in {NOTEBOOK.name}, found {len(found)}"
    return found[0]


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _notebook_layout() -> dict:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    layout = {
        "setup": _cell_index(cells, lambda c: "setup" in c["metadata"].get("tags", []), "setup"),
        "reference": _cell_index(
            cells, lambda c: "= load_reference()" in _source(c), "reference-model cell"
        ),
        "exercise": _cell_index(
            cells, lambda c: c["metadata"].get("exercise") == "layernorm", "layernorm exercise"
        ),
        "check": _cell_index(
            cells, lambda c: _source(c).strip() == 'check("layernorm")', "layernorm check cell"
        ),
    }
    assert layout["check"] > layout["exercise"] > layout["reference"] > layout["setup"]
    layout["exercise_source"] = _source(cells[layout["exercise"]])
    return layout


def _filled(source: str, body: str) -> str:
    """The exercise cell as a learner leaves it: the stub's raise replaced by their code."""
    match = re.search(r"^( *)raise NotImplementedError\(\)$", source, flags=re.MULTILINE)
    assert match, "the layernorm exercise cell has no `raise NotImplementedError()` line"
    indented = "\n".join(match.group(1) + line for line in body.splitlines())
    return source[: match.start()] + indented + source[match.end() :]


# --------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _learner_env(home: Path) -> dict[str, str]:
    """A fresh terminal after `source .venv/bin/activate`: nothing from this test process."""
    venv_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv_bin.parent),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "USER": os.environ.get("USER", "learner"),
        "SHELL": "/bin/bash",
        "TERM": "xterm-256color",
    }
    # The course's download cache (the corpus) where a learner's would be: ~/.cache.
    real_cache = cache_dir()
    if real_cache.exists():
        (home / ".cache").mkdir(parents=True, exist_ok=True)
        (home / ".cache" / "transformer-course").symlink_to(real_cache)
    return env


class Lab:
    def __init__(self, root: Path, home: Path, log: Path):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.log_path = log
        self.log = log.open("w")
        command = [
            str(Path(sys.executable).parent / "jupyter"),
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")  # as `make lab` does in a root container
        self.process = subprocess.Popen(
            command,
            cwd=root,
            env=_learner_env(home),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                pytest.fail(f"jupyter lab exited with {code}:\n{self.log_tail()}")
            try:
                url = f"{self.base}/api/status?token={self.token}"
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        pytest.fail(f"jupyter lab did not answer in {SERVER_START_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Shut the server down through its API (which shuts its kernels down), then make sure."""
        if self.process.poll() is None:
            try:
                request = urllib.request.Request(
                    f"{self.base}/api/shutdown", method="POST",
                    headers={"Authorization": f"token {self.token}"},
                )  # fmt: skip
                urllib.request.urlopen(request, timeout=5).close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
        self.log.close()


# What the page is asked, in its own language.
_OVERFLOWING = r"""area => [area, ...area.querySelectorAll('*')]
    .filter(el => el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1)
    .map(el => `<${el.tagName.toLowerCase()} class="${el.className}"> scrollWidth `
               + `${el.scrollWidth} > clientWidth ${el.clientWidth}`)"""
_SPLIT_WORDS = r"""area => {
    const chars = [];  // [character, top of the line it is drawn on], in reading order
    const walker = document.createTreeWalker(area, NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (let i = 0; i < node.data.length; i++) {
            if (/\s/.test(node.data[i])) { chars.push([' ', null]); continue; }
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            const rect = range.getClientRects()[0];
            chars.push([node.data[i], rect ? Math.round(rect.top) : null]);
        }
    }
    const split = [];
    let word = '', tops = new Set();
    for (const [ch, top] of [...chars, [' ', null]]) {
        if (ch === ' ') {
            if (tops.size > 1 && word.length <= 60) split.push(word);
            word = ''; tops = new Set();
        } else { word += ch; if (top !== null) tops.add(top); }
    }
    return split;
}"""
_STYLE_OF = """(el, props) =>
    Object.fromEntries(props.map(p => [p, getComputedStyle(el).getPropertyValue(p)]))"""
_COLOUR_OF = r"""(area, text) => {
    const hits = [...area.querySelectorAll('*')].filter(el => el.textContent.includes(text));
    if (!hits.length) return null;
    return getComputedStyle(hits[hits.length - 1]).color.match(/\d+/g).slice(0, 3).map(Number);
}"""

# hidden_underscores' probes: each `_` of an output in a span of its own (returning where each
# is drawn, for those in the viewport), and back to plain text.
_WRAP_UNDERSCORES = r"""area => {
    const nodes = [];
    const walker = document.createTreeWalker(area, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode())
        if (node.data.includes('_')) nodes.push(node);
    const found = [];
    for (const node of nodes) {
        const parts = node.data.split('_');
        const fragment = document.createDocumentFragment();
        let at = 0;
        parts.forEach((part, i) => {
            fragment.append(part);
            at += part.length;
            if (i === parts.length - 1) return;
            const span = document.createElement('span');
            span.dataset.underscoreProbe = '';
            span.textContent = '_';
            const before = node.data.slice(0, at).split(/\s/).pop();
            const after = node.data.slice(at + 1).split(/\s/)[0];
            span.dataset.word = before + '_' + after;
            fragment.append(span);
            at += 1;
        });
        node.replaceWith(fragment);
    }
    for (const span of area.querySelectorAll('span[data-underscore-probe]')) {
        const r = span.getBoundingClientRect();
        if (r.width > 0 && r.top >= 2 && r.bottom + 4 < innerHeight)
            found.push({word: span.dataset.word, x: r.left, y: r.top, w: r.width, h: r.height});
    }
    return found;
}"""
_UNWRAP_UNDERSCORES = """area => {
    area.querySelectorAll('span[data-underscore-probe]').forEach(s => s.replaceWith('_'));
    area.normalize();
}"""


# --------------------------------------------------------------------------- the page


class Notebook:
    """The open notebook, driven as a person does: click a cell, type, Shift+Enter."""

    def __init__(self, page):
        self.page = page

    def wait_for_kernel(self, timeout_s: float) -> None:
        """Until the notebook's kernel is started and idle."""
        indicator = self.page.locator(".jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if indicator.count() and indicator.first.get_attribute("data-status") == "idle":
                time.sleep(1)  # the kernel's info reaches the notebook's metadata
                return
            time.sleep(0.3)
        pytest.fail(f"the kernel was not idle after {timeout_s:.0f} s")

    def modified(self) -> bool:
        """Whether the notebook's tab shows unsaved changes."""
        return self.page.locator(".lm-TabBar-tab.jp-mod-dirty").count() > 0

    def cell(self, index: int):
        return self.page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)

    def prompt_count(self, index: int) -> int | None:
        text = self.cell(index).locator(".jp-InputArea-prompt").first.inner_text()
        match = re.search(r"\[(\d+)\]", text)
        return int(match.group(1)) if match else None

    def output_text(self, index: int) -> str:
        outputs = self.cell(index).locator(".jp-OutputArea")
        return outputs.first.inner_text() if outputs.count() else ""

    def run(self, index: int, timeout_s: float, code: str | None = None) -> str:
        """Click the cell (typing `code` into it first if given), Shift+Enter, wait until its
        prompt shows a new execution count; return its output's text."""
        cell = self.cell(index)
        before = self.prompt_count(index)
        editor = cell.locator(".jp-InputArea-editor .cm-content")
        editor.scroll_into_view_if_needed()
        editor.click(position={"x": 8, "y": 8})  # on the code, clear of any corner pop-up
        if code is not None:
            # Typed newlines auto-indent, so the code goes in whole, over the selected text.
            self.page.keyboard.press("Control+A")
            self.page.keyboard.insert_text(code)
            lines = cell.locator(".jp-InputArea-editor .cm-line").all_text_contents()
            assert lines == code.splitlines(), "the cell reads, after typing:\n" + "\n".join(lines)
        self.page.keyboard.press("Shift+Enter")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            count = self.prompt_count(index)
            if count is not None and count != before:
                return self.output_text(index)
            time.sleep(0.25)
        raise AssertionError(
            f"cell {index} did not finish in {timeout_s:.0f} s; its prompt reads "
            f"{self.cell(index).locator('.jp-InputArea-prompt').first.inner_text()!r}, its "
            f"output so far:\n{self.output_text(index)}"
        )

    def assert_no_error(self, index: int, what: str) -> None:
        text = self.output_text(index)
        assert "Traceback" not in text, f"the {what} cell raised:\n{text}"

    def output(self, index: int):
        return self.cell(index).locator(".jp-OutputArea").first

    def overflowing(self, index: int) -> list[str]:
        """Elements of the cell's output that scroll sideways: their content is wider than
        what shows, so part of the message hides until the learner scrolls."""
        return self.output(index).evaluate(_OVERFLOWING)

    def split_words(self, index: int) -> list[str]:
        """Words of the cell's output that the page breaks across two lines ("eps=0." / "1"):
        found from where each character is drawn, so it sees CSS wrapping as well as newlines
        in the text. Words too long for any line (over 60 characters) may break."""
        return self.output(index).evaluate(_SPLIT_WORDS)

    def hidden_underscores(self, index: int) -> list[str]:
        """Words of the cell's output whose underscores are not drawn: another line's box
        painted over them, or the output's edge clipped them. Each `_` is made transparent in
        place (a span around it, same font, no reflow) and the screenshots before and after
        compared around it: a drawn underscore changes some pixels."""
        from PIL import Image, ImageChops

        output = self.output(index)
        output.scroll_into_view_if_needed()
        boxes = output.evaluate(_WRAP_UNDERSCORES)
        if not boxes:
            return []
        shots = []
        for colour in ("", "transparent"):
            output.evaluate(
                "(area, c) => area.querySelectorAll('span[data-underscore-probe]')"
                ".forEach(s => { s.style.color = c; })",
                colour,
            )
            shots.append(Image.open(io.BytesIO(self.page.screenshot())).convert("L"))
        output.evaluate(_UNWRAP_UNDERSCORES)
        diff = ImageChops.difference(*shots).point(lambda v: 255 if v > 40 else 0)
        hidden = []
        for box in boxes:
            left, right = round(box["x"]), round(box["x"] + box["w"])
            top, bottom = round(box["y"]) - 2, round(box["y"] + box["h"]) + 4
            if not diff.crop((left, max(0, top), max(left + 1, right), bottom)).getbbox():
                hidden.append(box["word"])
        return list(dict.fromkeys(hidden))

    def style_of(self, index: int, selector: str, props: tuple[str, ...]) -> dict:
        found = self.cell(index).locator(selector)
        return found.first.evaluate(_STYLE_OF, list(props)) if found.count() else {}

    def colour_of(self, index: int, text: str) -> tuple[int, int, int] | None:
        """The computed colour of the innermost output element whose text contains `text`."""
        rgb = self.output(index).evaluate(_COLOUR_OF, text)
        return tuple(rgb) if rgb else None

    def show(self, index: int, path: Path) -> Path:
        self.cell(index).scroll_into_view_if_needed()
        self.page.screenshot(path=str(path))
        return path


# --------------------------------------------------------------------------- the test


@pytest.mark.timeout(240)
def test_layernorm_check_in_jupyterlab(tmp_path, capsys):
    from playwright.sync_api import sync_playwright

    layout = _notebook_layout()
    root, home = tmp_path / "notebooks", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name in SHOT_NAMES:  # never leave an earlier run's pictures to be taken for this one's
        (SHOTS / name).unlink(missing_ok=True)
    shots: list[Path] = []
    started = time.monotonic()

    lab = Lab(root, home, tmp_path / "jupyter.log")
    page = None
    try:
        lab.wait_ready()
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 800},
            )
            try:
                page = browser.pages[0] if browser.pages else browser.new_page()
                page.set_default_timeout(UI_LOAD_S * 1000)
                page.goto(f"{lab.base}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
                nb = Notebook(page)
                nb.cell(layout["check"]).wait_for(state="attached", timeout=UI_LOAD_S * 1000)
                # Opened, its kernel started and nothing run: not modified. JupyterLab writes the
                # kernel's metadata into the notebook; the course's server gives the notebook
                # that metadata already (utils/lab_contents.py, make lab-settings).
                nb.wait_for_kernel(SETUP_CELL_S)
                assert nb.modified() is False, (
                    "the notebook shows as modified as soon as it opens, before anything ran: "
                    "is utils/jupyter_server_config.json in the environment (make lab-settings)?"
                )

                nb.run(layout["setup"], SETUP_CELL_S)
                nb.assert_no_error(layout["setup"], "setup")
                nb.run(layout["reference"], CELL_S)
                nb.assert_no_error(layout["reference"], "reference-model")

                # A wrong LayerNorm, then its check.
                wrong = _filled(layout["exercise_source"], WRONG_BODY)
                nb.run(layout["exercise"], CELL_S, code=wrong)
                nb.assert_no_error(layout["exercise"], "layernorm exercise")
                failing = nb.run(layout["check"], CELL_S)
                shots.append(nb.show(layout["check"], SHOTS / SHOT_NAMES[0]))
                # Every way the page fails the learner, reported together.
                problems = []
                if not FAIL_HEADLINE.search(failing):
                    problems.append("no failure headline (✗ layernorm: N of M tests failed)")
                if FAIL_HINT not in failing:
                    problems.append(f"no tutor's hint {FAIL_HINT!r}")
                if FAIL_UNDERSCORED not in failing:
                    problems.append(f"no {FAIL_UNDERSCORED!r} (underscores included) in the text")
                flowing = " ".join(failing.split())
                for sentence in FAIL_SENTENCES:
                    if sentence not in flowing:
                        problems.append(f"the sentence {sentence!r} does not read whole")
                red = nb.colour_of(layout["check"], "✗ layernorm")
                if red and not (red[0] > red[1] + 60 and red[0] > red[2] + 60):
                    problems.append(f"the failure headline is not red but rgb{red}")
                split = nb.split_words(layout["check"])
                if split:
                    style = nb.style_of(
                        layout["check"], ".jp-OutputArea-output pre",
                        ("white-space", "word-break", "overflow-wrap"),
                    )  # fmt: skip
                    problems.append(
                        f"words broken across two lines: {split} (the output's pre: {style})"
                    )
                hidden = nb.hidden_underscores(layout["check"])
                if hidden:
                    problems.append(f"underscores not drawn (covered or clipped) in: {hidden}")
                problems += [
                    f"scrolls sideways (the message is cut at the edge): {el}"
                    for el in nb.overflowing(layout["check"])
                ]
                assert not problems, (
                    "the check of a wrong LayerNorm does not read right:\n- "
                    + "\n- ".join(problems)
                    + f"\nthe page's text of the check's output:\n{failing}"
                )

                # Fixed: the same check passes.
                fixed = _filled(layout["exercise_source"], FIXED_BODY)
                nb.run(layout["exercise"], CELL_S, code=fixed)
                nb.assert_no_error(layout["exercise"], "layernorm exercise")
                passing = nb.run(layout["check"], CELL_S)
                shots.append(nb.show(layout["check"], SHOTS / SHOT_NAMES[1]))
                assert PASS_HEADLINE.search(passing), (
                    f"the check of a correct LayerNorm does not pass:\n{passing}"
                )
                assert not nb.overflowing(layout["check"]), "the pass line scrolls sideways"
                # Nothing of JupyterLab's own covers the notebook: its first-run question about
                # Jupyter news is answered "never" by the course's settings (make lab-settings).
                asked = page.get_by_text("official Jupyter news").count()
                assert asked == 0, (
                    "JupyterLab asks about Jupyter news over the notebook: the course's "
                    "utils/lab-overrides.json is not in the environment (make lab-settings)"
                )
            except BaseException:
                if page is not None:
                    try:
                        page.screenshot(path=str(SHOTS / SHOT_NAMES[2]))
                        shots.append(SHOTS / SHOT_NAMES[2])
                    except Exception as err:  # the page may be gone: the assertion matters more
                        print(f"no screenshot of the failure: {err}")
                raise
            finally:
                browser.close()
    finally:
        lab.stop()
        with capsys.disabled():
            print(f"\nbrowser test: {time.monotonic() - started:.0f} s; screenshots:")
            for shot in shots:
                print(f"  {shot}")
