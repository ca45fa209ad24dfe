"""utils/plots.py draws the chapters' figures under a non-interactive backend, as CI runs the
notebooks (MPLBACKEND=Agg), with the titles, labels and printed summary a learner reads."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.text import Annotation

from utils.plots import (
    beam_tree_steps,
    plot_attention,
    plot_beam_tree,
    plot_coupling,
    plot_gelu,
    plot_kv_groups,
    plot_masks,
    plot_rejection_sampling,
    plot_rope_angles,
    plot_sample_frequencies,
    plot_speculative_rounds,
    plot_speedup,
    plot_temperature_curves,
    plot_top_p_cut,
    plot_transformer_diagram,
    readable_token,
)


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


def test_temperature_curves_every_rank_on_log_axes_legend_outside():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    by_temperature = {T: (logits / T).softmax(-1) for T in [0.5, 1.0, 2.0]}
    plot_temperature_curves(by_temperature)
    fig = plt.gcf()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "T = 0.5",
        "T = 1.0",
        "T = 2.0",
        "uniform",
    ]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "rank of the token (1 = most likely at every T)"
    assert ax.get_ylabel() == "probability"
    for line, T in zip(ax.get_lines(), [0.5, 1.0, 2.0], strict=False):
        curve = line.get_ydata()  # the whole vocabulary, most likely first
        assert len(curve) == 100 and list(curve) == sorted(curve, reverse=True)
        assert list(line.get_xdata()) == list(range(1, 101))
        assert curve == pytest.approx(by_temperature[T].sort(descending=True).values.double())
    assert ax.get_lines()[-1].get_ydata()[0] == pytest.approx(1 / 100)
    # The legend sits outside the axes, where it hides no curve.
    fig.canvas.draw()
    legend_box, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend_box.x0 >= axes_box.x1


def test_temperature_curves_first_ranks_only():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    plot_temperature_curves({1.0: logits.softmax(-1)}, n_ranks=40)
    assert len(plt.gcf().axes[0].get_lines()[0].get_ydata()) == 40


def test_sample_frequencies_bars_dots_and_the_printed_gap(capsys):
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    samples = torch.tensor([0] * 40 + [1] * 30 + [2] * 20 + [3] * 9 + [4])  # one impossible
    plot_sample_frequencies(samples, probs, "demo", CharTokenizer(), rank_by=probs, n_show=4)
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "demo"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert ax.get_ylabel() == "frequency / probability"
    assert [round(bar.get_height(), 2) for bar in ax.patches] == [0.4, 0.3, 0.2, 0.09]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["exact probability", "frequency in 100 samples"]
    printed = capsys.readouterr().out
    assert printed.startswith("demo: largest gap 0.3 standard errors")
    assert printed.rstrip().endswith("samples outside the kept set: 1")


def test_readable_token_never_blank():
    assert readable_token("\n") == "\\n"
    assert readable_token(" the") == "␣the"
    assert readable_token("  ") == "␣␣"
    assert readable_token("") == "''"
    assert readable_token("<|endoftext|>") == "<|endoftext|>"
    assert readable_token("<|endoftext|>", max_chars=6) == "<|end…"


def test_attention_heatmap_with_readable_labels_and_a_colour_bar():
    tokens = ["<|endoftext|>", " the", "\n", "cat"]
    pattern = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1] * 4])
    plot_attention(pattern, tokens, "Layer 0, head 3")
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "Layer 0, head 3"
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    labels = ["<|endoftext|>", "␣the", "\\n", "cat"]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert [t.get_text() for t in ax.get_yticklabels()] == labels
    image = ax.images[0]
    assert image.get_array().tolist() == pattern.tolist()
    assert image.get_clim() == (0, 1)
    assert image.colorbar is not None and image.colorbar.ax.get_ylabel() == "attention weight"


def test_attention_with_fewer_queries_labels_them_as_the_last_tokens():
    pattern = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    plot_attention(pattern, ["a", "b", "c"], "cached")
    ax = plt.gcf().axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "c"]
    with pytest.raises(ValueError, match="one token per key"):
        plot_attention(pattern, ["a", "b"], "wrong")


def test_gelu_curves_and_the_difference_panel():
    plot_gelu()
    ax, ax_diff = plt.gcf().axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["ReLU", "GELU, exact (erf)", "GELU, tanh approx. (GPT-2)"]
    relu, exact, approx = (line.get_ydata() for line in ax.get_lines())
    x = ax.get_lines()[0].get_xdata()
    assert x[0] == -4 and x[-1] == 4
    assert relu.tolist() == [max(v, 0.0) for v in x.tolist()]
    gap = abs(exact - approx).max()
    assert 1e-4 < gap < 1e-3  # tiny, but far above float32 rounding
    assert ax_diff.get_lines()[0].get_ydata() == pytest.approx(exact - approx)
    assert ax_diff.get_title() and ax_diff.get_ylabel() == "exact − tanh approx."


def texts(ax) -> list[str]:
    """The text labels on the axes, arrows (annotations without text) left out."""
    return [t.get_text() for t in ax.texts if t.get_text()]


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_transformer_diagram_labels_every_stage(n_layers):
    plot_transformer_diagram(n_layers)
    labels = texts(plt.gcf().axes[0])
    for label in [
        "tokens  [batch, posn]",
        "Embed + PosEmbed",
        "residual stream",
        "LayerNorm (final)",
        "Unembed",
        "logits  [batch, posn, d_vocab]",
    ]:
        assert label in labels
    assert labels.count("[batch, posn, d_model]") == 2
    assert labels.count("Attention") == labels.count("MLP") == n_layers
    assert labels.count("LayerNorm") == 2 * n_layers
    assert labels.count("+") == 2 * n_layers  # each sublayer adds back into the stream
    assert [f"block {b}" for b in range(n_layers)] == [t for t in labels if t.startswith("block")]
    assert f"× n_layers\n(here {n_layers})" in labels


def test_transformer_diagram_elides_the_middle_of_a_deep_model():
    plot_transformer_diagram(12)
    labels = texts(plt.gcf().axes[0])
    assert [t for t in labels if t.startswith("block")] == ["block 0", "block 1", "block 11"]
    assert "⋮\n9 more blocks" in labels
    with pytest.raises(ValueError, match="n_layers"):
        plot_transformer_diagram(0)


def test_masks_one_panel_each_with_positions_and_a_legend():
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    cached = torch.ones(2, 5, dtype=torch.bool).triu(4)  # 2 new queries after 3 cached keys
    padded = causal | torch.tensor([True, False, False, False])
    plot_masks({"causal": causal, "cached": cached, "padded": padded[None]}, title="Masks")
    fig = plt.gcf()
    assert fig.get_suptitle() == "Masks"
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["causal", "cached", "padded"]
    for ax, mask in zip(axes, [causal, cached, padded], strict=True):
        assert ax.get_xlabel() == "key position" and ax.get_ylabel() == "query position"
        assert ax.images[0].get_array().tolist() == mask.int().tolist()
        n_query, n_key = mask.shape
        assert list(ax.xaxis.get_minorticklocs()) == [k - 0.5 for k in range(n_key + 1)]
        assert list(ax.yaxis.get_minorticklocs()) == [q - 0.5 for q in range(n_query + 1)]
    # The cached step's queries sit at positions 3 and 4, after the cached keys.
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["3", "4"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["True: hidden, may NOT attend", "False: may attend"]
    with pytest.raises(ValueError, match="boolean"):
        plot_masks({"floats": causal.float()})


def test_top_p_cut_keeps_the_token_that_crosses_top_p(capsys):
    probs = torch.tensor([0.125, 0.5, 0.125, 0.25])  # sorted: b, d, a, c
    plot_top_p_cut(probs, 0.6, CharTokenizer(), n_show=4)
    ax = plt.gcf().axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b", "d", "a", "c"]
    bars = ax.patches
    assert [bar.get_height() for bar in bars] == [0.5, 0.25, 0.125, 0.125]
    blue, grey = to_rgba("tab:blue"), to_rgba("lightgrey")
    # d's 0.25 takes the total from 0.5 to 0.75, across 0.6: it is kept, the others are not.
    assert [bar.get_facecolor() for bar in bars] == [blue, blue, grey, grey]
    cumulative, top_p_line, cut = ax.get_lines()
    assert list(cumulative.get_ydata()) == [0.5, 0.75, 0.875, 1.0]
    assert list(top_p_line.get_ydata()) == [0.6, 0.6]
    assert list(cut.get_xdata()) == [1.5, 1.5]
    assert ax.get_title() == "top_p = 0.6: 2 tokens kept, total 0.750"
    assert capsys.readouterr().out == "top_p = 0.6: 2 of 4 tokens kept, total probability 0.7500\n"


def test_top_p_cut_removes_a_token_once_those_before_reach_top_p(capsys):
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    plot_top_p_cut(probs, 0.75, CharTokenizer(), n_show=3)  # c: 0.75 before it, not < 0.75
    ax = plt.gcf().axes[0]
    assert len(ax.patches) == 3
    assert [bar.get_facecolor() for bar in ax.patches][1:] == [
        to_rgba("tab:blue"),
        to_rgba("lightgrey"),
    ]
    assert capsys.readouterr().out.startswith("top_p = 0.75: 2 of 4 tokens kept")
    plot_top_p_cut(probs, 0.1, CharTokenizer(), n_show=2)  # the first token alone
    assert "1 token kept" in plt.gcf().axes[0].get_title()
    assert capsys.readouterr().out.startswith("top_p = 0.1: 1 of 4 tokens kept")


BEAM_STEPS = [
    [(" the", -0.5, None), ("\n", -1.1, None), ("<|endoftext|>", -2.0, None)],
    [(" king", -1.2, 0), (" man", -1.6, 0), (" lord", -2.4, 1)],
    [(",", -1.5, 0), ("<|endoftext|>", -1.7, 2), ("", -2.5, 0)],
]


def test_beam_tree_nodes_edges_and_finished_beams():
    plot_beam_tree(BEAM_STEPS, title="beams")
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "beams"
    nodes = {t.get_text(): t for t in ax.texts if t.get_text()}
    assert list(nodes) == [
        "prompt\n0.00",
        "␣the\n-0.50",
        "\\n\n-1.10",
        "EOS\n-2.00",
        "␣king\n-1.20",
        "␣man\n-1.60",
        "␣lord\n-2.40",
        ",\n-1.50",
        "EOS\n-1.70",
        "''\n-2.50",
    ]
    finished = [text for text, node in nodes.items() if text.startswith("EOS")]
    for text in finished:
        assert nodes[text].get_bbox_patch().get_edgecolor() == to_rgba("tab:red")
    # " man" has no child at step 3: drawn as pruned, in grey.
    assert nodes["␣man\n-1.60"].get_color() == "grey"
    assert nodes["␣king\n-1.20"].get_color() == "black"
    # One edge per beam, from its parent (the prompt at step 1).
    edges = [t for t in ax.texts if isinstance(t, Annotation) and not t.get_text()]
    assert len(edges) == sum(len(step) for step in BEAM_STEPS)
    assert edges[0].xycoords is nodes["␣the\n-0.50"]
    assert edges[0].get_anncoords() is nodes["prompt\n0.00"]
    assert edges[-1].xycoords is nodes["''\n-2.50"]
    assert edges[-1].get_anncoords() is nodes["␣king\n-1.20"]
    # The best score is the top row.
    assert nodes["␣king\n-1.20"].get_position()[1] > nodes["␣man\n-1.60"].get_position()[1]
    with pytest.raises(ValueError, match="parent"):
        plot_beam_tree([[("a", -1.0, None)], [("b", -2.0, 3)]])


def test_beam_tree_steps_finds_parents_by_prefix():
    prompt = [7, 7]
    history = [
        [(-0.5, torch.tensor(prompt + [1])), (-1.0, torch.tensor(prompt + [2]))],
        [(-0.7, torch.tensor(prompt + [2, 0])), (-0.9, torch.tensor(prompt + [1, 3]))],
    ]
    assert beam_tree_steps(history, CharTokenizer()) == [
        [("b", -0.5, None), ("c", -1.0, None)],
        [("a", -0.7, 1), ("d", -0.9, 0)],
    ]
    with pytest.raises(ValueError, match="extends no beam"):
        beam_tree_steps([history[0], [(-1.0, torch.tensor([9, 9, 9, 9]))]], CharTokenizer())


# --------------------------------------------------------------------------- chapter 6


def legend_texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]


def test_rejection_sampling_bars_are_q_p_and_the_frequencies():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.1, 0.4, 0.4])
    samples = torch.tensor([0, 0, 1, 2])
    plot_rejection_sampling(p, q, samples, labels=["a", " b", "\n", "d"], title="demo")
    fig = plt.gcf()
    left, right = fig.axes
    assert fig.get_suptitle() == "demo"
    # Left: q, then p, then the output's frequencies, one bar of each per token.
    heights = [bar.get_height() for bar in left.patches]
    assert heights[:4] == pytest.approx(q.tolist())
    assert heights[4:8] == pytest.approx(p.tolist())
    assert heights[8:] == pytest.approx([0.5, 0.25, 0.25, 0.0])
    for ax in (left, right):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "␣b", "\\n", "d"]
        assert ax.get_xlabel() == "token" and ax.get_ylabel() == "probability"
    # Right: min(p, q), stacked under it max(0, p - q), and an outline of height p.
    kept, recovered, outline = (right.patches[i : i + 4] for i in (0, 4, 8))
    assert [bar.get_height() for bar in kept] == pytest.approx([0.1, 0.1, 0.2, 0.0])
    assert [bar.get_height() for bar in recovered] == pytest.approx([0.4, 0.2, 0.0, 0.0])
    assert [bar.get_y() for bar in recovered] == pytest.approx([0.1, 0.1, 0.2, 0.0])
    assert [bar.get_height() for bar in outline] == pytest.approx(p.tolist())
    assert right.get_title().endswith("α = Σ min(p, q) = 0.40")  # 0.1 + 0.1 + 0.2
    assert legend_texts(fig.legends[0]) == [
        "q: draft",
        "kept draft: min(p, q)",
        "p: target",
        "after a rejection: (1 − α)·residual\n= max(0, p − q)",
        "output: frequency in 4 samples",
        "p (outline)",
    ]


def test_rejection_sampling_names_tokens_by_id_and_rejects_bad_input():
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
    plot_rejection_sampling(p, q, torch.tensor([1, 1, 0]))
    assert [t.get_text() for t in plt.gcf().axes[0].get_xticklabels()] == ["0", "1"]
    with pytest.raises(ValueError, match="^p must be a probability vector"):
        plot_rejection_sampling(torch.tensor([0.5, 0.6]), q, torch.tensor([0]))
    with pytest.raises(ValueError, match="^q must be a probability vector"):
        plot_rejection_sampling(p, torch.tensor([1.2, -0.2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="^q must have one probability per token"):
        plot_rejection_sampling(p, torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0]))
    with pytest.raises(ValueError, match="^p must be a 1-D float tensor"):
        plot_rejection_sampling(torch.ones(2, 2) / 4, q, torch.tensor([0]))
    with pytest.raises(ValueError, match="^samples is empty"):
        plot_rejection_sampling(p, q, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match=r"^samples must be token ids in \[0, 2\), got ids from 0"):
        plot_rejection_sampling(p, q, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="^labels must name the 2 tokens"):
        plot_rejection_sampling(p, q, torch.tensor([0]), labels=["a"])


def test_coupling_mean_curves_quartile_bands_and_a_log_axis():
    temps = [0.1, 0.5, 2.0]
    per_context = torch.tensor([[0.2, 0.4, 0.6], [0.4, 0.6, 0.8], [0.6, 0.8, 1.0]])
    plot_coupling(temps, {"independent noise": [0.1, 0.2, 0.1], "rejection": per_context})
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "How often the two samplers pick the same token"
    assert ax.get_xscale() == "log"  # 2.0 / 0.1 > 10
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "0.5", "2"]
    assert ax.get_xlabel().startswith("temperature") and ax.get_ylabel() == "P(same token)"
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1
    assert legend_texts(ax.get_legend()) == [
        "independent noise",
        "rejection",
        "shaded: 25th to 75th\npercentile over 3 contexts",
    ]
    independent, rejection = ax.get_lines()
    assert list(independent.get_xdata()) == temps
    assert list(independent.get_ydata()) == pytest.approx([0.1, 0.2, 0.1])
    assert list(rejection.get_ydata()) == pytest.approx([0.4, 0.6, 0.8])  # the mean
    (band,) = ax.collections  # the 2-D curve only
    low_high = band.get_paths()[0].vertices[:, 1]
    assert low_high.min() == pytest.approx(0.3) and low_high.max() == pytest.approx(0.9)
    # The legend sits outside the axes, where it hides no curve.
    plt.gcf().canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


def test_coupling_linear_axis_for_a_narrow_range_and_bad_input():
    plot_coupling([0.5, 1.0, 2.0], {"shared Gumbel noise": [1.00001, 0.8, 0.7]}, title="narrow")
    ax = plt.gcf().axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == [1.0, 0.8, 0.7]  # float32 rounding: clamped
    assert ax.get_xscale() == "linear" and ax.get_title() == "narrow"
    assert len(ax.collections) == 0 and len(ax.get_legend().get_texts()) == 1
    with pytest.raises(ValueError, match=r"^curves\['bad'\] must have one value per temperature"):
        plot_coupling([0.5, 1.0], {"bad": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match=r"^curves\['bad'\] must hold probabilities"):
        plot_coupling([0.5, 1.0], {"bad": [0.1, 1.5]})
    with pytest.raises(ValueError, match="^curves is empty"):
        plot_coupling([0.5, 1.0], {})
    with pytest.raises(ValueError, match="^temperatures must be"):
        plot_coupling([0.0, 1.0], {"a": [0.1, 0.2]})


def test_speedup_measured_and_predicted_in_one_colour_with_the_break_even_line():
    measured = {"model drafter": [1.1, 1.2, 0.9], "n-gram": [0.8, 1.3, 1.5]}
    predicted = {"model drafter": torch.tensor([1.2, 1.3, 1.1])}  # tensors work too
    plot_speedup([1, 2, 4], measured, predicted, title="t")
    fig = plt.gcf()
    ax = fig.axes[0]
    assert ax.get_title() == "t"
    assert ax.get_xlabel() == "k (drafted tokens per round)"
    assert ax.get_ylabel() == "speed-up over chapter 4's cached sampler"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    model, model_predicted, ngram, break_even = ax.get_lines()
    assert list(model.get_ydata()) == [1.1, 1.2, 0.9] and model.get_marker() == "o"
    assert list(model_predicted.get_ydata()) == pytest.approx([1.2, 1.3, 1.1])
    assert model_predicted.get_linestyle() == "--"
    assert model_predicted.get_color() == model.get_color() != ngram.get_color()
    assert list(break_even.get_ydata()) == [1, 1]
    assert "no speed-up" in texts(ax)
    assert legend_texts(fig.legends[0]) == [
        "model drafter",
        "n-gram",
        "measured",
        "predicted (formula)",
    ]


def test_speedup_rejects_mismatched_lengths_and_unknown_names():
    with pytest.raises(ValueError, match=r"^measured\['ngram'\] must have one value per k"):
        plot_speedup([1, 2], {"ngram": [1.1]}, {})
    with pytest.raises(ValueError, match=r"^predicted\['ngram'\] must have one value per k"):
        plot_speedup([1, 2], {"ngram": [1.1, 1.2]}, {"ngram": [1.0]})
    with pytest.raises(ValueError, match="^predicted has names that measured lacks"):
        plot_speedup([1, 2], {"ngram": [1.1, 1.2]}, {"model": [1.0, 1.1]})
    with pytest.raises(ValueError, match="^ks is empty"):
        plot_speedup([], {"ngram": []}, {})
    with pytest.raises(ValueError, match="^measured is empty"):
        plot_speedup([1], {}, {})


ROUNDS = [
    {"drafts": [" the", "\n", "c"], "accepted": 1, "main": "x"},
    {"drafts": ["d", "e", "f"], "accepted": 3, "main": " y"},
    {"drafts": ["g", "h", ""], "accepted": torch.tensor(0), "main": "z"},
]


def test_speculative_rounds_one_strip_per_round():
    plot_speculative_rounds(ROUNDS, k=3)
    fig = plt.gcf()
    ax = fig.axes[0]
    assert ax.get_title() == "Speculative decoding, k = 3: 3 rounds"
    labels = texts(ax)
    assert [t for t in labels if t.startswith("round")] == ["round 1", "round 2", "round 3"]
    assert ["draft 1", "draft 2", "draft 3", "main model"] == [
        t for t in labels if t.startswith(("draft", "main"))
    ]
    assert [t for t in labels if t in ("bonus", "recovered")] == ["recovered", "bonus", "recovered"]
    assert [t for t in labels if t.startswith("+")] == ["+2 tokens", "+4 tokens", "+1 token"]
    for token in ["␣the", "\\n", "␣y", "''"]:  # readable_token on drafts and main tokens
        assert token in labels
    # Nine drafts and three main tokens: green kept, red first rejection, grey after it, blue.
    colours = [to_rgba(box.get_facecolor()) for box in ax.patches]
    green, red, grey, blue = (to_rgba(c) for c in ["#009E73", "#D55E00", "#E4E4E4", "#0072B2"])
    assert colours == [green, red, grey, blue, green, green, green, blue, red, grey, grey, blue]
    assert len(ax.get_lines()) == 2  # one strike-through per rejected draft
    assert legend_texts(fig.legends[0]) == [
        "kept draft",
        "first rejected draft (struck out)",
        "after a rejection: not tested",
        "main model's token",
    ]


def test_speculative_rounds_rejects_bad_rounds():
    with pytest.raises(ValueError, match="^rounds is empty"):
        plot_speculative_rounds([], k=3)
    with pytest.raises(ValueError, match="^round 2 needs k = 3 drafts"):
        plot_speculative_rounds([ROUNDS[0], {"drafts": ["a"], "accepted": 0, "main": "x"}], k=3)
    with pytest.raises(ValueError, match="^round 1 needs k = 3 drafts and 0 <= accepted <= 3"):
        plot_speculative_rounds([{**ROUNDS[0], "accepted": 4}], k=3)
    with pytest.raises(ValueError, match="^round 1 must be a dict"):
        plot_speculative_rounds([{"drafts": ["a"], "accepted": 0}], k=1)
    with pytest.raises(ValueError, match="^k must be an integer"):
        plot_speculative_rounds(ROUNDS, k=0)


def test_dual_pivot_rounds_halve_the_interval_and_keep_a_top_p_token():
    from utils.plots import dual_pivot_rounds, plot_dual_pivot

    g = torch.Generator().manual_seed(0)
    probs = (torch.randn(200, generator=g) * 1.5).softmax(-1).double()
    before = probs.sort(descending=True).values
    threshold = before[(before.cumsum(0) - before) < 0.3].min()
    for seed in range(20):
        rounds = dual_pivot_rounds(probs, 0.3, torch.Generator().manual_seed(seed))
        assert [r["kept"] for r in rounds] == [False] * (len(rounds) - 1) + [True]
        assert probs[rounds[-1]["token"]] >= threshold  # the kept token is in the top-p set
        for a, b in zip(rounds, rounds[1:], strict=False):
            assert b["high"] - b["low"] <= (a["high"] - a["low"]) / 2 + 1e-12
            assert a["low"] < threshold <= a["high"] and b["low"] < threshold <= b["high"]
    plot_dual_pivot(probs, 0.3, rounds)
    fig = plt.gcf()
    assert len(fig.axes) == len(rounds) + 1  # a panel per round, then the interval's length
    widths = fig.axes[-1].lines[0].get_ydata()
    assert list(widths) == [r["high"] - r["low"] for r in rounds]
    assert "top-p = 0.3" in fig._suptitle.get_text()


def test_lookahead_window_puts_level_j_column_i_at_offset_i_plus_j_plus_1():
    from utils.plots import plot_lookahead_window

    levels = [["king", "the", "of"], ["is", "king", "the"]]
    plot_lookahead_window("the", levels, new=["dead", "is", "king"], title="toy")
    fig = plt.gcf()
    ax, panel = fig.axes
    assert ax.get_title() == "toy"
    placed = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text()
              for t in ax.texts}  # fmt: skip
    expected = {(0, 0): "the"}
    expected |= {
        (i + j + 1, j + 1): w for j, level in enumerate(levels) for i, w in enumerate(level)
    }
    expected |= {(i + 3, 3): w for i, w in enumerate(["dead", "is", "king"])}
    assert placed == expected
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "text (last)", "level 0", "level 1", "this pass predicts"]  # fmt: skip
    # One trajectory per column, down its diagonal: (i + 1, 1), (i + 2, 2), (i + 3, 3).
    for i, line in enumerate(ax.get_lines()):
        assert list(line.get_xdata()) == [i + 1, i + 2, i + 3]
        assert list(line.get_ydata()) == [1, 2, 3]
    harvested = [t.get_text() for t in panel.texts][1:]
    assert harvested == [
        "column 0: king → is dead",
        "column 1: the → king is",
        "column 2: of → the king",
    ]
    assert [box.get_linestyle() for box in ax.patches].count("--") == 3  # the predictions


def test_lookahead_window_without_predictions_and_bad_input():
    from utils.plots import plot_lookahead_window

    plot_lookahead_window(" a", [[" b", "\n"]])
    fig = plt.gcf()
    assert len(fig.axes) == 1
    assert {t.get_text() for t in fig.axes[0].texts} == {"␣a", "␣b", "\\n"}
    with pytest.raises(ValueError, match="^levels must be a non-empty list"):
        plot_lookahead_window("a", [["b", "c"], ["d"]])
    with pytest.raises(ValueError, match=r"^new must hold one token per column \(2\), got 1"):
        plot_lookahead_window("a", [["b", "c"]], new=["d"])


# The example of chapter 8: three requests share a two-block prompt prefix (blocks 3 and 7).
TABLES = {"a": [3, 7, 0], "b": [3, 7, 9, 4], "c": [3, 7, 11]}
LENGTHS = {"a": 10, "b": 13, "c": 12}


def test_block_table_pool_boxes_shared_prefix_and_partly_filled_last_blocks():
    from utils.plots import FREE_BLOCK, plot_block_table

    plot_block_table(TABLES, LENGTHS, num_blocks=12, block_size=4)
    fig = plt.gcf()
    ax = fig.axes[0]
    assert ax.get_title() == "The paged KV cache: the pool and the block tables"
    outlines = [p for p in ax.patches if p.get_linewidth() > 0]  # a square per block drawn
    assert len(outlines) == 12 + 3 + 4 + 3  # the pool, then the three tables
    pool = outlines[:12]
    assert [(p.get_x() + 0.42, p.get_y() + 0.42) for p in pool] == [(b, 0) for b in range(12)]
    in_pool = sorted((t.get_position()[0], t.get_text()) for t in ax.texts
                     if t.get_position()[1] > -0.5 and t.get_text().isdigit())  # fmt: skip
    assert [text for _, text in in_pool] == [str(b) for b in range(12)]
    free = [b for b, p in enumerate(pool) if to_rgba(p.get_facecolor()) == to_rgba(FREE_BLOCK)]
    assert free == [1, 2, 5, 6, 8, 10]
    # The shared blocks, 3 and 7, are hatched and say "×3": in the pool and in each table.
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 2 + 3 * 2
    assert [(p.get_x() + 0.42, p.get_y() + 0.42) for p in hatched[:2]] == [(3, 0), (7, 0)]
    assert texts(ax).count("×3") == 8
    # The written part of a block is coloured from the left: in the pool, block 3 has one
    # stripe per holder; the last blocks of a, b and c hold 2, 1 and 4 of their 4 slots.
    fills = [p for p in ax.patches if p.get_fill() and p.get_linewidth() == 0]
    at = {}
    for p in fills:
        at.setdefault((round(p.get_x() + 0.42, 6), round(p.get_y(), 6)), []).append(p)
    stripes = [p for (x, y), ps in at.items() if x == 3 and -0.5 < y < 0.5 for p in ps]
    assert len(stripes) == 3 and len({to_rgba(p.get_facecolor()) for p in stripes}) == 3
    pool_fills = {round(p.get_x() + 0.42): p.get_width() for p in fills if p.get_y() > -0.5}
    assert pool_fills[0] == pytest.approx(0.84 * 2 / 4)
    assert pool_fills[4] == pytest.approx(0.84 * 1 / 4)
    assert pool_fills[11] == pytest.approx(0.84)
    assert set(pool_fills) == {0, 3, 4, 7, 9, 11}  # a free block has no fill
    labels = texts(ax)
    assert ["a", "b", "c"] == [t for t in labels if t in TABLES]
    assert [t for t in labels if "tokens" in t] == [
        "10 tokens, last block 2/4",
        "13 tokens, last block 1/4",
        "12 tokens, last block 4/4",
    ]
    assert legend_texts(fig.legends[0]) == [
        "shared prefix block (×n: n holders)",
        "free block",
        "white part: empty slots",
    ]


def test_block_table_wraps_a_large_pool_and_rejects_bad_tables():
    from utils.plots import plot_block_table

    plot_block_table({"x": [20, 5], "y": [7]}, {"x": 5, "y": 0}, 24, 4, title="toy")
    fig = plt.gcf()
    ax = fig.axes[0]
    assert ax.get_title() == "toy"
    pool = [p for p in ax.patches if p.get_linewidth() > 0][:24]
    centres = [(round(p.get_x() + 0.42), round(p.get_y() + 0.42)) for p in pool]
    assert centres == [(b % 12, -(b // 12)) for b in range(24)]  # two rows of 12
    assert not any(p.get_hatch() for p in ax.patches)
    assert "shared prefix block (×n: n holders)" not in legend_texts(fig.legends[0])
    assert "0 tokens, last block 0/4" in texts(ax)  # an empty block, allocated ahead
    with pytest.raises(ValueError, match=r"^tables\['a'\] holds block 12, not an id"):
        plot_block_table({"a": [12]}, {"a": 1}, 12, 4)
    with pytest.raises(ValueError, match=r"^tables\['a'\] holds block -1"):
        plot_block_table({"a": [-1]}, {"a": 1}, 12, 4)
    with pytest.raises(ValueError, match=r"^lengths\['a'\] = 5 tokens need 2 blocks of 4"):
        plot_block_table({"a": [3]}, {"a": 5}, 12, 4)
    with pytest.raises(ValueError, match=r"^lengths\['a'\] = 4 tokens need 1 blocks"):
        plot_block_table({"a": [1, 2, 3]}, {"a": 4}, 12, 4)
    with pytest.raises(ValueError, match=r"^lengths has no entry for 'a'"):
        plot_block_table({"a": [1]}, {}, 12, 4)
    with pytest.raises(ValueError, match="^block_size must be an integer >= 1"):
        plot_block_table({"a": [1]}, {"a": 1}, 12, 0)


SCHEDULE = [
    {"a": ("prefill", 5)},
    {"a": ("prefill", 3), "b": ("prefill", 4)},
    {"a": ("decode", 1), "b": ("preempted", 0)},
    {"a": ("decode", 1), "c": ("prefill", 2)},
    {"b": ("prefill", 7), "c": ("decode", 1)},
]


def test_schedule_timeline_one_cell_per_request_and_step_and_tokens_per_step():
    from utils.plots import SERVE_COLOURS, plot_schedule_timeline

    plot_schedule_timeline(SCHEDULE)
    fig = plt.gcf()
    ax, below = fig.axes
    assert ax.get_title() == "The schedule: 3 requests over 5 steps"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    bottom, top = ax.get_ylim()
    assert bottom > top  # the first request at the top
    cells = {
        (round(p.get_x() + p.get_width() / 2), round(p.get_y() + p.get_height() / 2)): to_rgba(
            p.get_facecolor()
        )
        for p in ax.patches
    }
    assert len(ax.patches) == len(cells) == 9  # one cell per (request, step) it ran
    blue, green, red = (to_rgba(SERVE_COLOURS[k]) for k in ("prefill", "decode", "preempted"))
    assert cells == {
        (0, 0): blue, (1, 0): blue, (2, 0): green, (3, 0): green,
        (1, 1): blue, (2, 1): red, (4, 1): blue,
        (3, 2): blue, (4, 2): green,
    }  # fmt: skip
    chunks = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text()
              for t in ax.texts}  # fmt: skip
    assert chunks == {(0, 0): "5", (1, 0): "3", (1, 1): "4", (3, 2): "2", (4, 1): "7"}
    tokens = [0] * 5
    for bar in below.patches:
        tokens[round(bar.get_x() + bar.get_width() / 2)] += bar.get_height()
    assert tokens == [5, 7, 1, 3, 8]
    assert below.get_xlabel() == "step"
    assert legend_texts(fig.legends[0]) == [
        "prefill chunk (its tokens)",
        "decode (1 token)",
        "preempted: blocks freed",
    ]


def test_schedule_timeline_rejects_unknown_kinds():
    from utils.plots import plot_schedule_timeline

    with pytest.raises(ValueError, match="^steps is empty"):
        plot_schedule_timeline([])
    with pytest.raises(ValueError, match=r"^steps\[1\]\['b'\] must be \(kind, num_tokens\)"):
        plot_schedule_timeline([{"a": ("decode", 1)}, {"b": ("verify", 2)}])
    with pytest.raises(ValueError, match=r"^steps\[0\]\['a'\] must be"):
        plot_schedule_timeline([{"a": "prefill"}])


def test_memory_over_time_one_line_per_series_and_the_pool_line():
    from utils.plots import plot_memory_over_time

    series = {
        "engine: blocks in use": [2, 5, 9, 14, 12, 6],
        "static batching: reserved": [16, 16, 16, 16, 16, 16],
        "static batching: used": [2, 3, 4, 5, 6, 7],
    }
    plot_memory_over_time(series, capacity=16, title="toy")
    fig = plt.gcf()
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 4  # one per series, then the pool
    for line, values in zip(lines, series.values(), strict=False):
        assert list(line.get_xdata()) == list(range(6))
        assert list(line.get_ydata()) == values
    pool = lines[-1]
    assert list(pool.get_ydata()) == [16, 16] and pool.get_linestyle() == "--"
    assert legend_texts(ax.get_legend()) == [*series, "pool"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("step", "KV blocks", "toy")
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 16


def test_memory_over_time_without_capacity_and_bad_input():
    from utils.plots import plot_memory_over_time

    plot_memory_over_time({"used": [1.5, 2.5, 0.5]}, ylabel="MiB")
    ax = plt.gcf().axes[0]
    assert len(ax.get_lines()) == 1
    assert legend_texts(ax.get_legend()) == ["used"]
    assert ax.get_ylabel() == "MiB"
    with pytest.raises(ValueError, match="^series is empty"):
        plot_memory_over_time({})
    with pytest.raises(ValueError, match=r"^series\['a'\] must be a non-empty sequence"):
        plot_memory_over_time({"a": []})


def test_rope_angles_read_back_each_pairs_angle_and_its_speed():
    d_head, theta, posn = 8, 100.0, 12
    speed = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # per pair
    angle = torch.arange(posn, dtype=torch.float64)[:, None] * speed  # [posn, pairs]
    cos, sin = torch.cat([angle.cos()] * 2, dim=1), torch.cat([angle.sin()] * 2, dim=1)
    plot_rope_angles(cos, sin, theta)
    titled = {ax.get_title(): ax for ax in plt.gcf().axes}  # and a colour bar
    left = next(ax for title, ax in titled.items() if "angle at each position" in title)
    right = titled["How fast each pair turns"]
    wrapped = torch.atan2(angle.sin(), angle.cos())  # each angle in (-pi, pi]
    torch.testing.assert_close(torch.tensor(left.images[0].get_array()), wrapped.T.float())
    line = right.get_lines()[0]
    torch.testing.assert_close(torch.tensor(line.get_ydata()), speed.float())
    assert right.get_yscale() == "log" and "theta = 100" in left.get_title()
    with pytest.raises(ValueError, match="even d_head"):
        plot_rope_angles(cos[:, :7], sin[:, :7], theta)


def test_kv_groups_one_line_from_each_query_head_to_the_head_it_reads():
    reads = [0, 0, 0, 1, 1, 1]
    plot_kv_groups(reads, n_kv_heads=2)
    ax = plt.gcf().axes[0]
    lines = ax.get_lines()
    assert len(lines) == len(reads)
    kv_x = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_text().startswith("kv")}
    for h, (line, r) in enumerate(zip(lines, reads, strict=True)):
        assert list(line.get_xdata()) == [h, kv_x[f"kv{r}"]], f"query head {h}"
    assert "6 query heads, 2 key/value heads" in ax.get_title()
    with pytest.raises(ValueError, match="reads"):
        plot_kv_groups([0, 2], n_kv_heads=2)
