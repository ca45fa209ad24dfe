"""utils/plots.py draws the chapters' figures under a non-interactive backend, as CI runs the
notebooks (MPLBACKEND=Agg), with the titles, labels and printed summary a learner reads."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

from utils.plots import plot_sample_frequencies, plot_temperature_curves


@pytest.fixture(autouse=True)
def agg_backend():
    """Draw off-screen, and leave no figure behind for the next test."""
    backend = plt.get_backend()
    plt.switch_backend("Agg")
    yield
    plt.close("all")
    plt.switch_backend(backend)


class CharTokenizer:
    """Token t decodes to the letter t places after 'a': enough for tick labels."""

    def decode(self, tokens: list[int]) -> str:
        return "".join(chr(ord("a") + t) for t in tokens)


def test_temperature_curves_one_per_temperature_and_the_uniform_level():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    by_temperature = {T: (logits / T).softmax(-1) for T in [0.5, 1.0, 2.0]}
    plot_temperature_curves(by_temperature, n_ranks=40)
    ax = plt.gcf().axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "T = 0.5",
        "T = 1.0",
        "T = 2.0",
        "uniform",
    ]
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "rank of the token (1 = most likely at every T)"
    assert ax.get_ylabel() == "probability"
    curve = ax.get_lines()[0].get_ydata()
    assert len(curve) == 40 and list(curve) == sorted(curve, reverse=True)
    assert ax.get_lines()[-1].get_ydata()[0] == pytest.approx(1 / 100)


def test_sample_frequencies_bars_dots_and_the_printed_gap(capsys):
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    samples = torch.tensor([0] * 40 + [1] * 30 + [2] * 20 + [3] * 9 + [4])  # one impossible
    plot_sample_frequencies(samples, probs, "demo", CharTokenizer(), rank_by=probs, n_show=4)
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "demo"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [round(bar.get_height(), 2) for bar in ax.patches] == [0.4, 0.3, 0.2, 0.09]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["exact probability", "frequency in 100 samples"]
    printed = capsys.readouterr().out
    assert printed.startswith("demo: largest gap 0.3 standard errors")
    assert printed.rstrip().endswith("samples outside the kept set: 1")
