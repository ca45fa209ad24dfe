"""What a learner reads in a notebook reads in full: check() verdicts and solutions wrap at the
output area's edge (no sideways scrolling), keep every character, and leave room for
underscores (rich's own HTML lets the next line paint over them)."""

import re

import pytest

from utils import display

LONG = (
    "softmax_kernel: the last block of a row reads past its end: load it with a mask and "
    "other=-inf, so that the padding adds exp(-inf) = 0 to the sum; check n_cols, BLOCK_V "
    "and d_model against the row's length " * 3
)


@pytest.fixture
def published(monkeypatch):
    out = []
    monkeypatch.setattr(display, "in_notebook", lambda: True)
    monkeypatch.setattr(display, "_publish", lambda page, plain: out.append((page, plain)))
    return out


def test_a_verdict_wraps_and_keeps_every_character(published):
    display.show(f"[bold red]✗ softmax_kernel: 1 of 4 tests failed[/]\n  [red]•[/red] {LONG}")
    ((page, plain),) = published
    assert LONG.strip() in plain, "the plain text must hold the whole message"
    assert "pre-wrap" in page and "white-space:pre;" not in page.replace(" ", "")
    text = re.sub(r"<[^>]+>", "", page).replace("&#x27;", "'").replace("&quot;", '"')
    assert "other=-inf" in text and "d_model" in text and "n_cols" in text


def test_a_solution_has_one_background_and_room_for_underscores(published):
    display.show_solution("LayerNorm")
    ((page, plain),) = published
    assert "layer_norm_eps" in plain and "class LayerNorm" in plain
    assert page.count("background") == 1, "one background for the block, none per line"
    assert "line-height: 1.45" in page and "pre-wrap" in page
    assert "layer_norm_eps" in re.sub(r"<[^>]+>", "", page)


def test_a_failing_parametrized_test_is_one_line_with_its_count():
    from utils.check import TestResult, failure_lines

    def failed(nodeid, message):
        return TestResult(nodeid, "06_speculative", "lookahead_layout", "failed", message)

    same = "Positions are one too many: the window's level j reads j + i + 1."
    lines = failure_lines(
        [failed(f"t.py::test_layout[{k}]", same) for k in range(5)]
        + [failed(f"t.py::test_offsets[{k}]", f"reads offsets [{k}, {k}]") for k in range(5)]
        + [failed("t.py::test_alone", "one case")]
    )
    assert lines == [
        f"test_layout (5 cases): {same}",
        "test_offsets (5 cases; the first, test_offsets[0]): reads offsets [0, 0]",
        "test_alone: one case",
    ]
