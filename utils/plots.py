"""The course's figures, one function per kind of figure.

Chapter cells call these so that a demo cell shows what the learner should read (which
distribution, which samples) and not matplotlib plumbing. Each function draws one figure and
shows it with `plt.show()`: inline in Jupyter, and nothing at all under a non-interactive
backend such as `MPLBACKEND=Agg`, which the course's CI uses. They return nothing, so that a call
on the last line of a cell does not display the figure a second time.
"""

import math
import operator
from collections.abc import Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyBboxPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from torch import Tensor

EOS = "<|endoftext|>"


def readable_token(text: str, max_chars: int | None = None) -> str:
    """A token's text as a label that is never blank: escapes as `repr` writes them ("\\n"
    shows as a backslash and an n), spaces as "␣" (" the" -> "␣the"), and "''" for the empty
    string. Longer than `max_chars`: cut, ending in "…"."""
    if text == "":
        return "''"
    shown = repr(text)[1:-1].replace(" ", "␣")
    if max_chars is not None and len(shown) > max_chars:
        shown = shown[: max_chars - 1] + "…"
    return shown


def _token_box(ax, x: float, y: float, token: str, max_chars: int, fontsize: int,
               text_colour: str = "black", height: float = 0.64, **patch) -> None:  # fmt: skip
    """A token as a rounded box 0.88 wide centred on (x, y), with its readable text in monospace
    (`patch`: the box's facecolor, edgecolor, linestyle... as FancyBboxPatch takes them)."""
    ax.add_patch(
        FancyBboxPatch(
            (x - 0.44, y - height / 2),
            0.88,
            height,
            boxstyle="round,pad=0,rounding_size=0.1",
            **patch,
        )
    )
    ax.text(x, y, readable_token(token, max_chars=max_chars), ha="center", va="center",
            fontsize=fontsize, color=text_colour, family="monospace", zorder=3)  # fmt: skip


def plot_temperature_curves(
    by_temperature: Mapping[float, Float[Tensor, "d_vocab"]], n_ranks: int | None = None
) -> None:
    """Probability against rank, one curve per temperature, both axes on a log scale.

    Each distribution is sorted on its own, but temperature never changes the order of the
    tokens, so rank r is the same token on every curve. All the ranks are drawn (or the first
    `n_ranks`): the log scales spread the thousands of tokens of the tail, where the
    temperatures differ most. A dotted line marks the uniform distribution, the limit as the
    temperature grows: a high T lifts the tail towards it, a low T sinks it out of sight.
    """
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    d_vocab = next(iter(by_temperature.values())).numel()
    n = d_vocab if n_ranks is None else min(n_ranks, d_vocab)
    ranks = np.arange(1, n + 1)
    for temperature, probs in by_temperature.items():
        curve = probs.detach().double().cpu().sort(descending=True).values[:n].numpy()
        ax.plot(ranks, curve, label=f"T = {temperature}")
    ax.axhline(1 / d_vocab, color="grey", linestyle=":", label="uniform")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Low temperatures push the tail to 1e-40 and below: show six decades under the uniform
    # level, enough for the tail of T >= 1, and let the lower curves leave through the bottom.
    ax.set_ylim(bottom=1e-6 / d_vocab, top=1.5)
    ax.set_xlim(0.8, n * 1.25)
    ax.set_xlabel("rank of the token (1 = most likely at every T)")
    ax.set_ylabel("probability")
    ax.set_title("One distribution at several temperatures", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # outside: hides no curve
    plt.show()


def plot_sample_frequencies(
    samples: Int[Tensor, "n"],
    probs: Float[Tensor, "d_vocab"],
    title: str,
    tokenizer,
    rank_by: Float[Tensor, "d_vocab"],
    n_show: int = 15,
) -> None:
    """Bars: how often each token came out in `samples`; dots: its exact probability `probs`.

    The tokens shown are the `n_show` most likely under `rank_by` (the unfiltered distribution),
    so that figures of the same logits under different filters show the same tokens, and a
    token a filter removed shows as a dot at 0. A printed line says how far the worst bar is
    from its dot, in standard errors of a frequency, sqrt(p (1 - p) / n), and how many samples
    fell outside the kept set (probability 0): the eye cannot judge either from the bars alone.
    """
    fig, ax = plt.subplots(figsize=(8, 3.5), layout="constrained")
    n = samples.numel()
    top = rank_by.topk(n_show).indices
    observed = torch.bincount(samples, minlength=probs.numel()).double() / n
    x = range(n_show)
    ax.bar(x, observed[top], color="tab:blue", alpha=0.7, label=f"frequency in {n:,} samples")
    ax.plot(x, probs[top], "o", color="black", markersize=4, label="exact probability")
    labels = [readable_token(tokenizer.decode([t])) for t in top.tolist()]
    ax.set_xticks(list(x), labels, rotation=70, fontsize=8)
    ax.set_ylabel("frequency / probability")
    ax.set_title(title, fontsize=10)
    p, freq = probs[top].double(), observed[top]
    kept = p > 0
    z = ((freq - p)[kept].abs() / (p * (1 - p) / n)[kept].sqrt()).max().item()
    outside = (probs[samples] == 0).sum().item()
    print(f"{title}: largest gap {z:.1f} standard errors; samples outside the kept set: {outside}")
    ax.legend()
    plt.show()


def plot_attention(pattern: Float[Tensor, "query key"], tokens: list[str], title: str) -> None:
    """One head's attention pattern as a heatmap: row q is how query q spreads its attention
    over the keys, the columns (each row sums to 1, the colour bar runs from 0 to 1).

    Read along a row to see which earlier tokens a position reads from; a bright diagonal is a
    head attending to the current token, a bright first column one resting on the first
    token, a bright sub-diagonal one reading the previous token. Everything above the diagonal
    is 0: the causal mask. `tokens` names the keys; with fewer queries than keys (a cached
    step), the queries are the last positions. Token labels show "\\n" and "␣" for newlines and
    spaces.
    """
    weights = pattern.detach().float().cpu()
    if weights.ndim != 2:
        raise ValueError(f"pattern must be [query, key], got shape {tuple(weights.shape)}")
    n_query, n_key = weights.shape
    if len(tokens) != n_key or n_query > n_key:
        raise ValueError(
            f"pattern {tuple(weights.shape)} needs one token per key ({n_key}), "
            f"got {len(tokens)}; queries are the last positions, so query <= key"
        )
    side = min(7.5, max(3.5, 1.5 + 0.2 * n_key))
    height = side * n_query / n_key + 1.4  # room for the rotated key labels
    fig, ax = plt.subplots(figsize=(side + 1.3, height), layout="constrained")
    image = ax.imshow(weights.numpy(), cmap="Blues", vmin=0, vmax=1)
    labels = [readable_token(t, max_chars=14) for t in tokens]
    step = max(1, math.ceil(n_key / 50))  # past 50 tokens, label every step-th one
    x_ticks = list(range(0, n_key, step))
    y_ticks = [q for q in range(n_query) if (n_key - n_query + q) % step == 0]
    ax.set_xticks(x_ticks, [labels[k] for k in x_ticks], rotation=90, fontsize=8)
    ax.set_yticks(y_ticks, [labels[n_key - n_query + q] for q in y_ticks], fontsize=8)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title, fontsize=10)
    # In axes coordinates, so the bar is as tall as the image, however wide the pattern.
    fig.colorbar(image, cax=ax.inset_axes((1.03, 0, 0.04, 1)), label="attention weight")
    plt.show()


def plot_gelu() -> None:
    """GELU, exact (with erf) and GPT-2's tanh approximation, against ReLU; the right panel
    is the difference between the two GELUs.

    On the left the two GELUs look like one curve: smooth where ReLU has a corner, slightly
    negative for negative inputs (lowest about -0.17 near x = -0.75), close to ReLU for large
    |x|. The right panel shows they are not the same function: they differ by up to a few
    1e-4, far more than float32 rounding (about 1e-7), so a model run with the wrong one
    fails a test that compares its outputs with GPT-2's.
    """
    x_t = torch.linspace(-4, 4, 801, dtype=torch.float64)
    x, exact, approx = (t.numpy() for t in (x_t, F.gelu(x_t), F.gelu(x_t, approximate="tanh")))
    fig, (ax, ax_diff) = plt.subplots(1, 2, figsize=(9, 3.5), width_ratios=[3, 2])
    ax.plot(x, np.maximum(x, 0), color="grey", linestyle=":", label="ReLU")
    ax.plot(x, exact, label="GELU, exact (erf)")
    ax.plot(x, approx, linestyle="--", label="GELU, tanh approx. (GPT-2)")
    ax.set_xlabel("x")
    ax.set_ylabel("activation")
    ax.set_title("GELU against ReLU", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    diff = exact - approx
    ax_diff.plot(x, diff, color="tab:red")
    ax_diff.axhline(0, color="grey", linewidth=0.5)
    worst = np.abs(diff).argmax()
    ax_diff.plot(x[worst], diff[worst], "o", color="tab:red", markersize=4)
    ax_diff.annotate(
        f"largest gap {abs(diff[worst]):.1e}\nat x = {x[worst]:.2f}",
        (x[worst], diff[worst]),
        xytext=(0.05, 0.95),
        textcoords="axes fraction",
        va="top",
        fontsize=8,
    )
    ax_diff.set_xlabel("x")
    ax_diff.set_ylabel("exact − tanh approx.")
    ax_diff.set_title("The difference, zoomed in", fontsize=10)
    ax_diff.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    fig.tight_layout()
    plt.show()


def _box(ax, x: float, y: float, text: str, color: str, width: float = 2.4) -> None:
    """A rounded box centred on (x, y), 0.6 high, with its text."""
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - 0.3),
            width,
            0.6,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            facecolor=color,
            edgecolor="black",
            linewidth=0.8,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(
    ax, start: tuple[float, float], end: tuple[float, float], colour: str = "black", width=1.0
) -> None:
    """An arrow from `start` to `end`, in data coordinates."""
    style = {"arrowstyle": "-|>", "color": colour, "linewidth": width, "shrinkA": 0, "shrinkB": 0}
    ax.annotate("", xy=end, xytext=start, arrowprops=style)


def plot_transformer_diagram(n_layers: int = 2) -> None:
    """The GPT-2 architecture as a block diagram, read from the bottom up.

    Token ids become vectors (token embedding plus position embedding) that start the
    residual stream, the blue vertical line, `[batch, posn, d_model]` all the way up. Every
    block reads the stream twice and writes back into it by addition (+): attention (which
    moves information between positions), then the MLP (which works on each position alone),
    each after its own LayerNorm. At the top a last LayerNorm and the unembedding turn the
    stream into logits, `[batch, posn, d_vocab]`: a score for every token of the vocabulary
    at every position. `n_layers` blocks are drawn (from 5 on: the first two, "⋮", and the
    last); they share a design, but each has its own weights.
    """
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    drawn = list(range(n_layers)) if n_layers <= 4 else [0, 1, None, n_layers - 1]
    sub_h, add_h = 1.25, 0.8  # between the two branches of a block; from a branch to its +
    block_h, gap_h = 2 * sub_h + 0.45, 1.3  # a block; the "⋮" that stands for blocks left out
    first = 2.7  # the first branch
    top = first + sum(block_h if b is not None else gap_h for b in drawn)  # after the blocks
    x_min, x_max, y_min, y_max = -3.6, 8.6, -0.45, top + 2.95
    scale = 7.0 / (x_max - x_min)  # inches per unit
    fig, ax = plt.subplots(figsize=(7.0, scale * (y_max - y_min) + 0.4))
    blue = "tab:blue"
    radius = 0.18  # of the + circles

    _box(ax, 0, 0, "tokens  [batch, posn]", "white", width=3.4)
    _arrow(ax, (0, 0.3), (0, 0.95))
    _box(ax, 0, 1.25, "Embed + PosEmbed", "honeydew", width=3.4)
    stream_labels = {"ha": "right", "va": "center", "fontsize": 8, "color": blue}
    ax.text(-0.25, 1.95, "[batch, posn, d_model]", **stream_labels)
    ax.text(
        -0.75,
        (first + top) / 2,
        "residual stream",
        rotation=90,
        ha="right",
        va="center",
        fontsize=9,
        color=blue,
    )

    y, stream_from = first, 1.55  # the block's first branch; where the stream's next piece starts
    for b in drawn:
        if b is None:  # the blocks left out
            ax.plot([0, 0], [stream_from, y + gap_h - 0.4], color=blue, linewidth=2)
            ax.text(
                2.9,
                y + gap_h / 2 - 0.4,
                f"⋮\n{n_layers - 3} more blocks",
                ha="center",
                va="center",
                fontsize=9,
            )
            stream_from, y = y + gap_h - 0.4, y + gap_h
            continue
        ax.add_patch(
            FancyBboxPatch(
                (-0.6, y - 0.4),
                7.0,
                block_h - 0.1,
                boxstyle="round,pad=0,rounding_size=0.15",
                facecolor="none",
                edgecolor="grey",
                linestyle="--",
                linewidth=0.8,
            )
        )
        ax.text(
            6.25,
            y + block_h - 0.8,
            f"block {b}",
            ha="right",
            va="center",
            fontsize=9,
            color="dimgrey",
        )
        for k, (name, colour) in enumerate([("Attention", "moccasin"), ("MLP", "lightblue")]):
            y0 = y + k * sub_h  # where the branch leaves the stream
            y_add = y0 + add_h  # where it comes back
            _arrow(ax, (0, stream_from), (0, y_add - radius), blue, 2)
            ax.plot(0, y0, "o", color=blue, markersize=4)
            _arrow(ax, (0, y0), (1.0, y0))
            _box(ax, 2.0, y0, "LayerNorm", "whitesmoke", width=2.0)
            _arrow(ax, (3.0, y0), (3.6, y0))
            _box(ax, 4.6, y0, name, colour, width=2.0)
            ax.plot([4.6, 4.6], [y0 + 0.3, y_add], color="black", linewidth=1)
            _arrow(ax, (4.6, y_add), (radius, y_add))
            ax.add_patch(
                Circle((0, y_add), radius, facecolor="white", edgecolor=blue, linewidth=1.5)
            )
            ax.text(0, y_add, "+", ha="center", va="center", fontsize=10, color=blue)
            stream_from = y_add + radius
        y += block_h
    ax.plot(
        [6.7, 6.85, 6.85, 6.7],
        [first - 0.4, first - 0.4, y - 0.5, y - 0.5],
        color="black",
        linewidth=1,
    )
    ax.text(
        7.0,
        (first + y) / 2 - 0.45,
        f"× n_layers\n(here {n_layers})",
        ha="left",
        va="center",
        fontsize=9,
    )
    y -= 0.35  # the last + is 0.35 above the top of the last block's box
    _arrow(ax, (0, stream_from), (0, y + 0.35), blue, 2)
    ax.text(-0.25, y + 0.1, "[batch, posn, d_model]", **stream_labels)
    _box(ax, 0, y + 0.65, "LayerNorm (final)", "whitesmoke", width=3.4)
    _arrow(ax, (0, y + 0.95), (0, y + 1.45))
    _box(ax, 0, y + 1.75, "Unembed", "honeydew", width=3.4)
    _arrow(ax, (0, y + 2.05), (0, y + 2.55))
    _box(ax, 0, y + 2.85, "logits  [batch, posn, d_vocab]", "white", width=4.4)

    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("GPT-2, from tokens (bottom) to logits (top)", fontsize=10)
    fig.tight_layout()
    plt.show()


def plot_masks(masks: Mapping[str, Bool[Tensor, "query key"]], title: str = "") -> None:
    """Boolean attention masks side by side, one panel per entry, named by its key.

    True (dark) means HIDDEN: the query of that row may NOT attend to the key of that column,
    as chapter 4's `causal_mask` returns it (for a mask of allowed keys, pass `~allowed`).
    Queries are the last positions, as in a cached step: a mask of 2 queries over 5 keys has
    rows for positions 3 and 4, and the y axis says so. Read one row at a time: the light
    cells are the keys that query mixes. Leading dimensions of size 1 are dropped.
    """
    if not masks:
        raise ValueError("masks is empty: give at least one {name: mask}")
    panels = {}
    for name, mask in masks.items():
        m = torch.as_tensor(mask).detach().cpu()
        while m.ndim > 2 and m.shape[0] == 1:
            m = m[0]
        if m.ndim != 2 or m.dtype != torch.bool:
            raise ValueError(
                f"mask {name!r} must be a boolean [query, key] tensor, got "
                f"{m.dtype} of shape {tuple(m.shape)}"
            )
        panels[name] = m
    widths = [m.shape[1] + 1.5 for m in panels.values()]
    n_rows = max(m.shape[0] for m in panels.values())
    cell = min(0.45, 7.5 / sum(widths))  # inches per cell
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(min(9.0, cell * sum(widths) + 1.0), cell * n_rows + 2.0),
        width_ratios=widths,
        squeeze=False,
        layout="constrained",
    )
    colours = ["lightsteelblue", "dimgrey"]  # False, True
    for ax, (name, m) in zip(axes[0], panels.items(), strict=True):
        n_query, n_key = m.shape
        ax.imshow(m.int().numpy(), cmap=ListedColormap(colours), vmin=0, vmax=1)
        ax.set_xticks(range(n_key), [str(k) for k in range(n_key)], fontsize=8)
        queries = range(n_key - n_query, n_key) if n_query <= n_key else range(n_query)
        ax.set_yticks(range(n_query), [str(q) for q in queries], fontsize=8)
        ax.set_xticks(np.arange(-0.5, n_key), minor=True)
        ax.set_yticks(np.arange(-0.5, n_query), minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key position", fontsize=9)
        ax.set_ylabel("query position", fontsize=9)
        ax.set_title(name, fontsize=10)
    handles = [
        Patch(facecolor=colours[1], label="True: hidden, may NOT attend"),
        Patch(facecolor=colours[0], label="False: may attend"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    plt.show()


def plot_top_p_cut(
    probs: Float[Tensor, "d_vocab"], top_p: float, tokenizer, n_show: int = 20
) -> None:
    """Where top-p sampling cuts a distribution: the `n_show` most likely tokens as bars, most
    likely first, and the running total of their probabilities as a line.

    A token is kept while the more likely tokens before it sum to LESS than `top_p`, so the
    token whose bar takes the line across the dashed `top_p` level is still kept: the kept
    set (blue bars, black labels) is the smallest that reaches `top_p`, and a dotted line
    marks the cut when it falls inside the figure; grey bars and labels are removed. When
    the model is sure, the first token alone can reach `top_p`; when it hesitates, the
    nucleus holds many tokens, often more than are drawn. Prints how many tokens are kept and
    their total probability (at least `top_p`).
    """
    p = probs.detach().double().cpu().flatten()
    sorted_p, order = p.sort(descending=True)
    cumulative = sorted_p.cumsum(0)
    kept = (cumulative - sorted_p) < top_p
    kept[0] = True  # at least one token, whatever top_p is
    if top_p >= 1:
        kept[:] = True  # no filtering at all, as in HF (rounding could drop the last tokens)
    n_kept, total = int(kept.sum()), sorted_p[kept].sum().item()
    n_show = min(n_show, p.numel())
    x = np.arange(n_show)
    kept_colour, removed_colour = "tab:blue", "lightgrey"
    fig, ax = plt.subplots(figsize=(8.5, 3.8), layout="constrained")
    colours = [kept_colour if k else removed_colour for k in kept[:n_show].tolist()]
    ax.bar(x, sorted_p[:n_show].numpy(), color=colours)
    ax.plot(x, cumulative[:n_show].numpy(), "o-", color="tab:orange", markersize=3)
    ax.axhline(top_p, color="tab:red", linestyle="--", linewidth=1)
    if n_kept < n_show:
        ax.axvline(n_kept - 0.5, color="black", linestyle=":", linewidth=1)
    labels = [readable_token(tokenizer.decode([t])) for t in order[:n_show].tolist()]
    ax.set_xticks(x, labels, rotation=70, fontsize=8)
    for label, keep in zip(ax.get_xticklabels(), kept[:n_show].tolist(), strict=True):
        label.set_color("black" if keep else "grey")
    ax.set_xlim(-0.7, n_show - 0.3)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("probability")
    tokens = "token" if n_kept == 1 else "tokens"
    ax.set_title(f"top_p = {top_p}: {n_kept:,} {tokens} kept, total {total:.3f}", fontsize=10)
    more = f"\n({n_kept - n_show:,} more\nbeyond the figure)" if n_kept > n_show else ""
    handles = [
        Patch(facecolor=kept_colour, label=f"kept{more}"),
        Patch(facecolor=removed_colour, label="removed"),
        Line2D([], [], color="tab:orange", marker="o", markersize=3, label="cumulative"),
        Line2D([], [], color="tab:red", linestyle="--", label=f"top_p = {top_p}"),
    ]
    if n_kept < n_show:
        handles.append(Line2D([], [], color="black", linestyle=":", label="the cut"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    print(
        f"top_p = {top_p}: {n_kept:,} of {p.numel():,} tokens kept, total probability {total:.4f}"
    )
    plt.show()


BeamStep = list[tuple[str, float, int | None]]


def plot_beam_tree(steps: list[BeamStep], title: str = "") -> None:
    """The tree a beam search grew, left to right: column t holds the beams kept after step t
    (`steps[t]`: token text, score, index of the parent in `steps[t - 1]`, None at t = 0),
    each drawn as its new token and its score (the sum of log-probabilities so far).

    Within a column the best score is at the top. Follow the edges back to see which
    continuations share a prefix: a good beam often takes several places at the next step,
    and a beam with no child died there (grey). Red boxes are finished beams, which ended
    with <|endoftext|> and leave the race.
    """
    if not steps:
        raise ValueError("steps is empty: give the beams of at least one step")
    n_steps = len(steps)
    n_rows = max(len(beams) for beams in steps)
    fig, ax = plt.subplots(
        figsize=(min(9.0, 1.3 + 0.95 * (n_steps + 1)), 0.55 * n_rows + 1.3), layout="constrained"
    )
    has_child = [set() for _ in steps]
    for t in range(1, n_steps):
        for _, _, parent in steps[t]:
            if parent is None or not 0 <= parent < len(steps[t - 1]):
                raise ValueError(f"step {t}: parent {parent!r} is not a beam of step {t - 1}")
            has_child[t - 1].add(parent)
    # Rows by score, best at the top; the prompt is the root, column 0.
    rows = []
    for beams in steps:
        ranking = sorted(range(len(beams)), key=lambda i, beams=beams: -beams[i][1])
        rows.append({i: rank for rank, i in enumerate(ranking)})
    centre = (n_rows - 1) / 2
    style = {"boxstyle": "round,pad=0.3", "linewidth": 1}
    text = {"ha": "center", "va": "center", "multialignment": "center", "fontsize": 8}
    root = ax.text(
        0,
        -centre,
        "prompt\n0.00",
        **text,
        bbox={**style, "facecolor": "white", "edgecolor": "black"},
    )
    nodes: list[list] = []
    for t, beams in enumerate(steps):
        nodes.append([])
        for i, (token, score, _) in enumerate(beams):
            finished = token == EOS
            dead = not finished and t < n_steps - 1 and i not in has_child[t]
            face, edge = "white", "black"
            if finished:
                face, edge = "mistyrose", "tab:red"
            elif dead:
                face, edge = "whitesmoke", "darkgrey"
            label = "EOS" if finished else readable_token(token, max_chars=9)
            node = ax.text(
                t + 1,
                -rows[t][i],
                f"{label}\n{score:.2f}",
                **text,
                color="grey" if dead else "black",
                bbox={**style, "facecolor": face, "edgecolor": edge},
            )
            nodes[t].append(node)
    for t, beams in enumerate(steps):
        for i, (_, _, parent) in enumerate(beams):
            source = root if t == 0 else nodes[t - 1][parent]
            ax.annotate(
                "",
                xy=(0, 0.5),
                xycoords=nodes[t][i],
                xytext=(1, 0.5),
                textcoords=source,
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": "grey",
                    "linewidth": 0.8,
                    "shrinkA": 1,
                    "shrinkB": 1,
                },
            )
    ax.set_xlim(-0.6, n_steps + 0.6)
    ax.set_ylim(-(n_rows - 1) - 0.6, 0.6)
    ax.set_xticks(
        range(n_steps + 1), ["prompt"] + [f"step {t + 1}" for t in range(n_steps)], fontsize=8
    )
    ax.set_yticks([])
    for side in ["left", "right", "top"]:
        ax.spines[side].set_visible(False)
    handles = [
        Patch(facecolor="white", edgecolor="black", label="token, score"),
        Patch(facecolor="whitesmoke", edgecolor="darkgrey", label="no child: pruned"),
        Patch(facecolor="mistyrose", edgecolor="tab:red", label="finished: <|endoftext|>"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    plt.show()


def beam_tree_steps(
    history: Sequence[Iterable[tuple[float, Int[Tensor, "seq"]]]], tokenizer
) -> list[BeamStep]:
    """`plot_beam_tree`'s `steps` from the beams kept at each step of a beam search.

    `history[t]` holds the beams kept after step t as (score, tokens) pairs, the format of
    `Beams.to_list()`: the whole sequence, prompt included, so the beams of step t are one
    token longer than those of step t - 1. A beam's parent is the beam of the step before
    whose tokens are its own minus the last, so this needs nothing from the search itself.
    One way to record `history`: after each `filter(num_beams)` of a search, append
    `continuing.to_list() + finished.to_list()`.
    """
    steps: list[BeamStep] = []
    previous: dict[tuple[int, ...], int] = {}
    for t, beams in enumerate(history):
        step: BeamStep = []
        current: dict[tuple[int, ...], int] = {}
        for score, tokens in beams:
            ids = tuple(torch.as_tensor(tokens).flatten().tolist())
            parent = None
            if t > 0:
                if ids[:-1] not in previous:
                    raise ValueError(f"a beam of step {t} extends no beam of step {t - 1}")
                parent = previous[ids[:-1]]
            current.setdefault(ids, len(step))
            step.append((tokenizer.decode([ids[-1]]), float(score), parent))
        steps.append(step)
        previous = current
    return steps


# --------------------------------------------------------------------------- chapter 6

# Okabe and Ito's colour-blind-safe palette, in the order the curves of one figure take it.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"]
SPEC_COLOURS = {
    "kept": "#009E73",  # green: a draft the main model kept
    "rejected": "#D55E00",  # vermillion: the first draft it rejected
    "ignored": "#E4E4E4",  # light grey: drafts after a rejection, never tested
    "main": "#0072B2",  # blue: the main model's own token, recovered or bonus
    "recovered": "#CC79A7",  # reddish purple: probability that reaches p through the residual
}


def _probability_vector(name: str, p) -> Float[Tensor, "d_vocab"]:
    """`p` as a float64 CPU vector; a ValueError naming `name` unless it is a 1-D vector of
    probabilities (>= 0, summing to 1 within 1e-3)."""
    p = torch.as_tensor(p).detach().cpu()
    if p.ndim != 1 or p.numel() == 0 or not p.is_floating_point():
        raise ValueError(
            f"{name} must be a 1-D float tensor of probabilities, got {p.dtype} of shape "
            f"{tuple(p.shape)}"
        )
    p = p.double()
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()) or abs(p.sum().item() - 1) > 1e-3:
        raise ValueError(
            f"{name} must be a probability vector (>= 0, summing to 1), got sum "
            f"{p.sum().item():.4f} and minimum {p.min().item():.4f}"
        )
    return p


def plot_rejection_sampling(
    p: Float[Tensor, "d_vocab"],
    q: Float[Tensor, "d_vocab"],
    samples: Int[Tensor, "n"],
    labels: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """Rejection sampling on a small vocabulary, in two panels.

    Left, three bars per token: the draft's q (what is proposed), the target's p, and how often
    the token came out of `samples` (tokens produced by rejection sampling). The last bar
    follows p, not q, even for a token the draft never proposes. Right, why: p splits into the
    part that arrives as a kept draft, min(p, q), and the part that arrives after a rejection,
    (1 - alpha) times the residual distribution, which is max(0, p - q); stacked, the two
    reach the outline of p exactly. alpha = sum min(p, q), in the right panel's title, is the
    probability that the draft is kept. `labels` names the tokens (default: their ids).
    """
    p, q = _probability_vector("p", p), _probability_vector("q", q)
    n_vocab = p.numel()
    if q.numel() != n_vocab:
        raise ValueError(f"q must have one probability per token of p ({n_vocab}), got {q.numel()}")
    samples = torch.as_tensor(samples).detach().cpu().flatten()
    if samples.numel() == 0:
        raise ValueError("samples is empty: give the tokens rejection sampling produced")
    if samples.is_floating_point() or samples.is_complex() or samples.dtype == torch.bool:
        raise ValueError(f"samples must be integer token ids, got {samples.dtype}")
    if samples.min() < 0 or samples.max() >= n_vocab:
        raise ValueError(
            f"samples must be token ids in [0, {n_vocab}), got ids from {int(samples.min())} "
            f"to {int(samples.max())}"
        )
    if labels is None:
        names = [str(t) for t in range(n_vocab)]
    elif len(labels) != n_vocab:
        raise ValueError(f"labels must name the {n_vocab} tokens, got {len(labels)}")
    else:
        names = [readable_token(str(s), max_chars=8) for s in labels]
    n = samples.numel()
    frequency = torch.bincount(samples.long(), minlength=n_vocab).double() / n
    kept = torch.minimum(p, q)
    recovered = p - kept  # = max(0, p - q) = (1 - alpha) * the residual distribution
    alpha = kept.sum().item()

    x = np.arange(n_vocab)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10.5, 4.2), width_ratios=[3, 2], layout="constrained"
    )
    width = 0.27
    left.bar(x - width, q.numpy(), width, color=OKABE_ITO[1], label="q: draft")
    left.bar(x, p.numpy(), width, color=OKABE_ITO[0], label="p: target")
    left.bar(
        x + width,
        frequency.numpy(),
        width,
        color=OKABE_ITO[4],
        label=f"output: frequency in {n:,} samples",
    )
    right.bar(x, kept.numpy(), 0.6, color=SPEC_COLOURS["kept"], label="kept draft: min(p, q)")
    right.bar(
        x,
        recovered.numpy(),
        0.6,
        bottom=kept.numpy(),
        color=SPEC_COLOURS["recovered"],
        label="after a rejection: (1 − α)·residual\n= max(0, p − q)",
    )
    # An empty box of height p around each stacked bar: the two parts fill it exactly.
    right.bar(x, p.numpy(), 0.74, fill=False, edgecolor="black", linewidth=1.2, label="p (outline)")
    top = 1.1 * max(p.max().item(), q.max().item(), frequency.max().item())
    long_labels = max(len(s) for s in names) > 3
    for ax in (left, right):
        ax.set_xticks(x, names, fontsize=9)
        if long_labels:
            ax.tick_params(axis="x", labelrotation=45)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
                label.set_rotation_mode("anchor")
        ax.set_xlim(-0.6, n_vocab - 0.4)
        ax.set_ylim(0, top)
        ax.set_xlabel("token")
        ax.set_ylabel("probability")
    left.set_title("Proposed (q), wanted (p), produced (output)", fontsize=10)
    right.set_title(f"p = kept + recovered;  α = Σ min(p, q) = {alpha:.2f}", fontsize=10)
    # One legend for both panels, below them, where it hides no bar.
    # Filled column by column: the left panel's entries on the top row, the right's below.
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    handles = [handles[i] for i in (0, 3, 1, 4, 2, 5)]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    plt.show()


def _as_curve(name: str, values, n_temperatures: int) -> Float[Tensor, "n_contexts n_temp"]:
    """One curve of `plot_coupling` as [n_contexts, n_temperatures] (n_contexts = 1 for 1-D)."""
    v = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    v = v[None] if v.ndim == 1 else v
    if v.ndim != 2 or v.shape[1] != n_temperatures or v.shape[0] == 0:
        raise ValueError(
            f"curves[{name!r}] must have one value per temperature ({n_temperatures}), as 1-D "
            f"or [n_contexts, {n_temperatures}]; got shape {tuple(torch.as_tensor(values).shape)}"
        )
    # Float32 sums over a whole vocabulary can end a little above 1: allow rounding, no more.
    if not bool(((v >= -1e-4) & (v <= 1 + 1e-4)).all()):
        raise ValueError(f"curves[{name!r}] must hold probabilities in [0, 1]")
    return v.clamp(0, 1)


def plot_coupling(
    temperatures: Sequence[float],
    curves: Mapping[str, Sequence[float] | Float[Tensor, "n_temp"] | Float[Tensor, "n_ctx n_temp"]],
    title: str = "",
) -> None:
    """How often two samplers pick the same token, against the temperature, one curve per way
    of coupling them (say, independent noise, shared Gumbel noise, rejection sampling).

    A curve is one probability per temperature, or a [n_contexts, n_temperatures] tensor of
    them, one row per context: then the line is their mean and the shaded band runs from the
    25th to the 75th percentile, how much the contexts differ. The temperature axis is
    logarithmic when the temperatures span more than a factor 10; the y axis runs from 0
    (never the same token) to 1 (always).
    """
    temps = np.asarray(list(temperatures), dtype=float)
    if temps.ndim != 1 or temps.size == 0 or not (temps > 0).all():
        raise ValueError("temperatures must be a non-empty 1-D sequence of positive numbers")
    if not curves:
        raise ValueError("curves is empty: give at least one {name: probabilities}")
    data = {name: _as_curve(name, values, temps.size) for name, values in curves.items()}
    fig, ax = plt.subplots(figsize=(8.5, 4), layout="constrained")
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    n_contexts = set()
    for i, (name, v) in enumerate(data.items()):
        colour = OKABE_ITO[i % len(OKABE_ITO)]
        ax.plot(
            temps,
            v.mean(0).numpy(),
            marker=markers[i % len(markers)],
            markersize=5,
            color=colour,
            label=name,
        )
        if v.shape[0] > 1:
            low, high = torch.quantile(v, 0.25, dim=0), torch.quantile(v, 0.75, dim=0)
            ax.fill_between(temps, low.numpy(), high.numpy(), color=colour, alpha=0.18, lw=0)
            n_contexts.add(v.shape[0])
    if temps.max() / temps.min() > 10:
        ax.set_xscale("log")
        ax.set_xticks(temps, [f"{t:g}" for t in temps])  # the temperatures, not powers of 10
        ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("temperature (both models)")
    ax.set_ylabel("P(same token)")
    ax.grid(alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if n_contexts:
        over = f"{n_contexts.pop()} contexts" if len(n_contexts) == 1 else "the contexts"
        band = Patch(
            facecolor="grey", alpha=0.3, label=f"shaded: 25th to 75th\npercentile over {over}"
        )
        handles.append(band)
    ax.legend(handles=handles, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "How often the two samplers pick the same token", fontsize=10)
    plt.show()


def plot_speedup(
    ks: Sequence[int],
    measured: Mapping[str, Sequence[float]],
    predicted: Mapping[str, Sequence[float]],
    title: str = "",
) -> None:
    """Speed-up of speculative decoding against k, one colour per setting (a drafter, a
    temperature): measured as markers joined by a solid line, the formula's prediction as a
    dashed line in the same colour. `predicted` may leave out settings. Above the grey line at
    1 speculation pays; below it, chapter 4's cached sampler alone is faster.
    """
    ks = list(ks)
    if not ks:
        raise ValueError("ks is empty: give the values of k that were timed")
    if not measured:
        raise ValueError("measured is empty: give at least one {name: speed-ups}")
    for what, mapping in [("measured", measured), ("predicted", predicted)]:
        for name, values in mapping.items():
            if len(values) != len(ks):
                raise ValueError(
                    f"{what}[{name!r}] must have one value per k ({len(ks)}), got {len(values)}"
                )
    extra = [name for name in predicted if name not in measured]
    if extra:
        raise ValueError(f"predicted has names that measured lacks: {extra}")
    measured = {name: [float(v) for v in values] for name, values in measured.items()}
    predicted = {name: [float(v) for v in values] for name, values in predicted.items()}
    fig, ax = plt.subplots(figsize=(8.5, 4.2), layout="constrained")
    highest = max(
        [1.0, *(v for values in [*measured.values(), *predicted.values()] for v in values)]
    )
    for i, (name, values) in enumerate(measured.items()):
        colour = OKABE_ITO[i % len(OKABE_ITO)]
        ax.plot(ks, values, marker="o", color=colour, label=name)
        if name in predicted:
            ax.plot(ks, predicted[name], linestyle="--", color=colour, linewidth=1.2)
    ax.axhline(1.0, color="grey", linewidth=1.2, linestyle=":")
    # Just outside the right edge of the axes, at the height of the line: it hides no point.
    ax.annotate(
        "no speed-up",
        xy=(1.0, 1.0),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        ha="left",
        fontsize=8,
        color="dimgrey",
    )
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", marker="o", label="measured"))
    if predicted:
        handles.append(Line2D([], [], color="black", linestyle="--", label="predicted (formula)"))
    # Below the axes, where it hides no point.
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 4),
        fontsize=8,
        frameon=False,
    )
    ax.set_xticks(ks)
    ax.set_ylim(0, 1.12 * highest)
    ax.set_xlabel("k (drafted tokens per round)")
    ax.set_ylabel("speed-up over chapter 4's cached sampler")
    ax.grid(alpha=0.3)
    ax.set_title(title or "Speculative decoding: speed-up against k", fontsize=10)
    plt.show()


def plot_speculative_rounds(rounds: Sequence[Mapping], k: int, title: str = "") -> None:
    """A few rounds of speculative decoding on one text, one strip per round, top to bottom.

    Each round is a dict: "drafts", the k drafted tokens (strings); "accepted", how many of
    them the main model kept (n); "main", the main model's own token. The strip shows the
    kept drafts in green, the first rejected draft in red and struck out, the drafts after it
    in grey (never tested: they followed a rejected token), then the main model's token in
    blue: "recovered" when it replaces the rejected draft, "bonus" when all k were kept. A
    round adds n + 1 tokens to the text, printed at the right.
    """
    if isinstance(k, bool) or not hasattr(k, "__index__") or operator.index(k) < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    k = operator.index(k)
    if not rounds:
        raise ValueError("rounds is empty: give at least one round")
    accepted = []
    for r, rnd in enumerate(rounds, start=1):
        if not isinstance(rnd, Mapping) or not {"drafts", "accepted", "main"} <= set(rnd):
            raise ValueError(f"round {r} must be a dict with 'drafts', 'accepted' and 'main'")
        try:
            n = operator.index(rnd["accepted"])  # an int, or a 0-d integer tensor
        except TypeError:
            n = None
        if len(rnd["drafts"]) != k or n is None or not 0 <= n <= k:
            raise ValueError(
                f"round {r} needs k = {k} drafts and 0 <= accepted <= {k}, got "
                f"{len(rnd['drafts'])} drafts and accepted = {rnd['accepted']!r}"
            )
        accepted.append(n)
    n_rounds = len(rounds)
    main_x = k + 0.25  # the main model's column, a little apart from the drafts
    fig, ax = plt.subplots(figsize=(1.0 * (k + 4.6), 0.55 * n_rounds + 1.5), layout="constrained")
    text_colour = {"kept": "white", "rejected": "white", "ignored": "dimgrey", "main": "white"}

    def box(x: float, y: float, token: str, kind: str) -> None:
        edge = "none" if kind != "ignored" else "darkgrey"
        _token_box(ax, x, y, token, max_chars=9, fontsize=9, text_colour=text_colour[kind],
                   facecolor=SPEC_COLOURS[kind], edgecolor=edge)  # fmt: skip

    for r, rnd in enumerate(rounds):
        y, n = -r, accepted[r]
        ax.text(-0.65, y, f"round {r + 1}", ha="right", va="center", fontsize=9)
        for i, token in enumerate(rnd["drafts"]):
            kind = "kept" if i < n else ("rejected" if i == n else "ignored")
            box(i, y, str(token), kind)
            if kind == "rejected":  # struck out
                ax.plot([i - 0.34, i + 0.34], [y, y], color="black", linewidth=1.3)
        box(main_x, y, str(rnd["main"]), "main")
        how = "bonus" if n == k else "recovered"
        ax.text(
            main_x + 0.55, y, how, ha="left", va="center", fontsize=9, color=SPEC_COLOURS["main"]
        )
        added = n + 1
        ax.text(
            main_x + 1.7,
            y,
            f"+{added} token{'s' if added > 1 else ''}",
            ha="left",
            va="center",
            fontsize=9,
        )
    header = {"ha": "center", "va": "bottom", "fontsize": 8, "color": "dimgrey"}
    for i in range(k):
        ax.text(i, 0.45, f"draft {i + 1}", **header)
    ax.text(main_x, 0.45, "main model", **header)
    ax.text(main_x + 1.7, 0.45, "text grows", **{**header, "ha": "left"})
    ax.set_xlim(-1.9, main_x + 2.9)
    ax.set_ylim(-(n_rounds - 1) - 0.5, 0.8)
    ax.axis("off")
    handles = [
        Patch(facecolor=SPEC_COLOURS["kept"], label="kept draft"),
        Patch(facecolor=SPEC_COLOURS["rejected"], label="first rejected draft (struck out)"),
        Patch(
            facecolor=SPEC_COLOURS["ignored"],
            edgecolor="darkgrey",
            label="after a rejection: not tested",
        ),
        Patch(facecolor=SPEC_COLOURS["main"], label="main model's token"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    rounds_word = "round" if n_rounds == 1 else "rounds"
    ax.set_title(title or f"Speculative decoding, k = {k}: {n_rounds} {rounds_word}", fontsize=10)
    plt.show()


def dual_pivot_rounds(
    probs: Float[Tensor, "d_vocab"], top_p: float, generator: torch.Generator
) -> list[dict]:
    """The rounds of dual-pivot top-p sampling on one row, written plainly in PyTorch for the
    figure (chapter 10's kernel does the same with one pass per step): each round's interval
    (low, high], the drawn token, its two pivots, and whether the token was kept."""
    probs = probs.double() / probs.sum()
    low, high, rounds = 0.0, 1.0, []
    while True:
        candidates = torch.where(probs > low, probs, 0.0)
        token = int(torch.multinomial(candidates, 1, generator=generator))
        pivot0 = float(probs[token])
        pivot1 = (pivot0 + high) / 2
        kept0 = float(probs[probs > pivot0].sum()) < top_p
        kept1 = float(probs[probs > pivot1].sum()) < top_p
        rounds.append(
            dict(low=low, high=high, token=token, pivot0=pivot0, pivot1=pivot1, kept=kept0)
        )
        if kept0:
            return rounds
        low, high = (pivot0, pivot1) if kept1 else (pivot1, high)


def plot_dual_pivot(probs: Float[Tensor, "d_vocab"], top_p: float, rounds: Sequence[Mapping]):
    """One panel per round, then the interval's length round by round. Each round panel: the
    probabilities sorted from most to least likely (for the eye only: the kernel never sorts),
    the top-p set in blue, the threshold tau (the least likely kept probability) as a black
    line, the round's interval (low, high] shaded, the drawn token and the two pivots as
    lines. The last panel plots high - low on a linear axis: it at least halves each round."""
    probs = probs.double() / probs.sum()
    order = probs.argsort(descending=True)
    sorted_p = probs[order]
    before = sorted_p.cumsum(0) - sorted_p
    in_set = before < top_p
    tau = float(sorted_p[in_set].min())
    rank = {int(t): i for i, t in enumerate(order)}
    n = len(rounds)
    fig, axes = plt.subplots(1, n + 1, figsize=(3.1 * n + 2.6, 3.4), squeeze=False,
                             gridspec_kw={"width_ratios": [3] * n + [2]})  # fmt: skip
    x = np.arange(1, len(sorted_p) + 1)  # ranks, on a log axis: the few likely tokens matter
    colors = np.where(in_set.numpy(), "tab:blue", "lightgray")
    for i, (ax, r) in enumerate(zip(axes[0][:n], rounds, strict=True)):
        ax.bar(x, sorted_p.numpy(), width=0.8, color=colors)
        ax.axhspan(max(r["low"], 1e-12), r["high"], color="tab:orange", alpha=0.15)
        ax.axhline(tau, color="black", lw=1.2)
        ax.axhline(r["pivot0"], color="tab:red", lw=1)
        ax.axhline(r["pivot1"], color="tab:purple", lw=1, ls="--")
        ax.plot(rank[r["token"]] + 1, r["pivot0"], "v", color="tab:red", ms=8)
        verdict = "kept" if r["kept"] else "rejected"
        ax.set_title(f"round {i + 1}: (low, high] = ({r['low']:.3g}, {r['high']:.3g}]\n"
                     f"drew rank {rank[r['token']] + 1}: {verdict}", fontsize=8)  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="rank (most likely: 1)",
               ylim=(0.5 * float(sorted_p[sorted_p > 0].min()), 1.5))  # fmt: skip
    axes[0][0].set_ylabel("probability")
    widths = [r["high"] - r["low"] for r in rounds]
    ax = axes[0][n]
    ax.plot(range(1, n + 1), widths, "o-", color="tab:orange")
    ax.set(xlabel="round", ylabel="high - low", ylim=(0, 1.05), xticks=range(1, n + 1),
           title="the interval, round by round")  # fmt: skip
    ax.title.set_fontsize(8)
    handles = [
        Patch(color="tab:blue", label="top-p set"),
        Line2D([], [], color="black", lw=1.2, label="τ: least likely kept"),
        Patch(color="tab:orange", alpha=0.3, label="(low, high]: holds τ"),
        Line2D([], [], color="tab:red", lw=1, marker="v", label="pivot 0 = p(drawn)"),
        Line2D([], [], color="tab:purple", lw=1, ls="--", label="pivot 1 = (pivot 0 + high) / 2"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.suptitle(f"Dual-pivot sampling, top-p = {top_p}", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plt.show()


def plot_lookahead_mask(
    offsets: Int[Tensor, "new"],
    allowed: Bool[Tensor, "new new"],
    n_levels: int,
    window: int,
    ngram: int,
    title: str = "",
) -> None:
    """The attention mask of one lookahead-decoding pass (the cached text, read by every token,
    left out): row q is a token of the pass, a filled square at column k means q may read k.
    The pass is `last`, then `n_levels` levels of `window` guesses, then candidates of
    ngram - 1 tokens. Squares take the colour of the row's branch; each label is the token's
    role and its offset after `last` (L1·3: level 1, offset 3; c0·2: candidate 0, offset 2)."""
    for name, value, low in (("n_levels", n_levels, 1), ("window", window, 1), ("ngram", ngram, 2)):
        if isinstance(value, bool) or not hasattr(value, "__index__") or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    offsets, allowed = torch.as_tensor(offsets), torch.as_tensor(allowed)
    n = offsets.numel()
    n_window = n_levels * window
    if offsets.ndim != 1 or allowed.shape != (n, n) or (n - 1 - n_window) % (ngram - 1):
        raise ValueError(
            f"offsets must be [new] and allowed [new, new] for 1 + {n_levels} x {window} window "
            f"tokens and whole candidates of {ngram - 1}; got {tuple(offsets.shape)} and "
            f"{tuple(allowed.shape)}"
        )
    n_cand = (n - 1 - n_window) // (ngram - 1)
    level_colours = plt.get_cmap("Oranges")(np.linspace(0.45, 0.85, n_levels))
    cand_colours = plt.get_cmap("Blues")(np.linspace(0.5, 0.8, max(n_cand, 1)))
    colours, labels = [np.array(plt.get_cmap("Greys")(0.6))], ["last"]
    for q in range(1, n):
        if q <= n_window:
            j = (q - 1) // window
            colours.append(level_colours[j])
            labels.append(f"L{j}·{int(offsets[q])}")
        else:
            g = (q - 1 - n_window) // (ngram - 1)
            colours.append(cand_colours[g])
            labels.append(f"c{g}·{int(offsets[q])}")
    image = np.ones((n, n, 4))
    for q in range(n):
        image[q, allowed[q].cpu().numpy().astype(bool)] = colours[q]
    size = max(4.5, 0.28 * n + 1.5)
    fig, ax = plt.subplots(figsize=(size, size), layout="constrained")
    ax.imshow(image, interpolation="nearest")
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set_xticks(np.arange(-0.5, n, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n, 1), minor=True)
    ax.grid(which="minor", color="lightgrey", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    for edge in (0.5, n_window + 0.5):  # the borders between last, the window and candidates
        ax.axhline(edge, color="black", linewidth=1)
        ax.axvline(edge, color="black", linewidth=1)
    ax.set_xlabel("may read (key)")
    ax.set_ylabel("token of the pass (query)")
    handles = [Patch(color=level_colours[j], label=f"window level {j}") for j in range(n_levels)]
    handles += [Patch(color=cand_colours[g], label=f"candidate {g}") for g in range(n_cand)]
    # What a tick label says: the second number is an offset after `last`, not a column.
    handles.append(
        Patch(
            color="none",
            label="labels: L1·3 = level 1,\noffset 3 after last;\nc0·2 = candidate 0, offset 2",
        )
    )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(title or f"Lookahead pass: W = {window}, N = {ngram}, {n_cand} candidates")
    plt.show()


def plot_lookahead_window(
    last: str,
    levels: Sequence[Sequence[str]],
    new: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """The lookahead branch of one pass, laid out by position: `last` at offset 0, then level
    j, column i at offset i + j + 1 (`levels` oldest first, each `window` token texts), so each
    column climbs down a diagonal. With `new` (the pass's prediction after each column's newest
    guess, `window` texts) the diagonals gain one more token, and the panel at the right lists
    the n-gram each column gives the pool: its oldest token is the key, the rest the
    continuation. Each column has its own colour; a dashed box is a prediction of this pass."""
    rows = [list(map(str, level)) for level in levels]
    if not rows or not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        raise ValueError(
            "levels must be a non-empty list of levels of the same non-zero length (the window's"
            f" width); got lengths {[len(row) for row in rows]}"
        )
    n_levels, window = len(rows), len(rows[0])
    if new is not None and len(new) != window:
        raise ValueError(f"new must hold one token per column ({window}), got {len(new)}")
    n_rows = n_levels + (new is not None)
    last_offset = window + n_rows - 1  # the furthest position drawn
    colours = plt.get_cmap("tab10")(np.arange(window) % 10)
    fig, axes = plt.subplots(
        1,
        2 if new is not None else 1,
        figsize=(1.0 * (last_offset + 2) + (3.2 if new is not None else 0), 0.75 * n_rows + 2.0),
        gridspec_kw={"width_ratios": [last_offset + 2, 3.2]} if new is not None else None,
        layout="constrained",
        squeeze=False,
    )
    ax = axes[0][0]

    def box(x: float, y: float, token: str, colour, dashed: bool = False) -> None:
        _token_box(ax, x, y, token, max_chars=8, fontsize=8, height=0.6,
                   facecolor=0.8 + 0.2 * np.asarray(colour[:3]),  # a pale, opaque fill
                   edgecolor=colour, linestyle="--" if dashed else "-", linewidth=1.4,
                   zorder=2)  # fmt: skip

    box(0, 0, str(last), np.array(plt.get_cmap("Greys")(0.6)))
    for i in range(window):
        trajectory = [(i + j + 1, j + 1) for j in range(n_rows)]
        xs, ys = zip(*trajectory, strict=True)
        ax.plot(xs, ys, color=colours[i], linewidth=2, alpha=0.5, zorder=1)  # the trajectory
        for j in range(n_levels):
            box(i + j + 1, j + 1, rows[j][i], colours[i])
        if new is not None:
            box(i + n_rows, n_rows, str(new[i]), colours[i], dashed=True)
    names = ["text (last)"] + [f"level {j}" for j in range(n_levels)]
    names += ["this pass predicts"] if new is not None else []
    ax.set_yticks(range(n_rows + 1), names, fontsize=8)
    ax.set_xticks(range(last_offset + 1))
    ax.tick_params(labelsize=8)
    ax.set(xlim=(-0.6, last_offset + 0.6), ylim=(n_rows + 0.6, -0.6))
    ax.set_xlabel("offset after last (the position each token guesses)", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"The lookahead window: {window} columns, {n_levels} levels", fontsize=10)
    if new is not None:
        panel = axes[0][1]
        panel.axis("off")
        panel.set(xlim=(0, 1), ylim=(window + 1, -0.5))
        panel.text(0, 0, "into the pool\n(key → continuation)", fontsize=8, va="center")
        for i in range(window):
            gram = [rows[j][i] for j in range(n_levels)] + [str(new[i])]
            key, rest = gram[0], " ".join(readable_token(t, max_chars=8) for t in gram[1:])
            panel.text(0, i + 1, f"column {i}: {readable_token(key, max_chars=8)} → {rest}",
                       fontsize=8, va="center", family="monospace", color=colours[i])  # fmt: skip
    plt.show()


# --------------------------------------------------------------------------- chapter 8

SERVE_COLOURS = {
    "prefill": "#0072B2",  # blue: a chunk of the prompt read (its keys and values written)
    "decode": "#009E73",  # green: one token generated
    "preempted": "#D55E00",  # vermillion: the request's blocks freed, back to the queue
}
FREE_BLOCK = "#E4E4E4"  # light grey: a block nobody holds


def _pale(colour, white: float = 0.5) -> tuple[float, float, float]:
    """`colour` mixed with `white` of white: a fill on which black text stays readable."""
    rgb = np.asarray(to_rgba(colour)[:3])
    return tuple(rgb + white * (1 - rgb))


def _kv_block(ax, x: float, y: float, block_id: int, colours: Sequence, filled: float) -> None:
    """A KV block as a square 0.84 wide centred on (x, y), labelled with its id: grey when no
    request holds it (`colours` empty), else white with its written share `filled` coloured
    from the left, in one stripe per holder; hatched, with "×n", when n > 1 requests hold it."""
    s, x0, y0 = 0.84, x - 0.42, y - 0.42
    face = FREE_BLOCK if not colours else "white"
    ax.add_patch(Rectangle((x0, y0), s, s, facecolor=face, edgecolor="black", linewidth=0.8))
    for i, colour in enumerate(colours):
        height = s / len(colours)
        ax.add_patch(Rectangle((x0, y0 + i * height), s * filled, height,
                               facecolor=_pale(colour), linewidth=0))  # fmt: skip
    shared = len(colours) > 1
    if shared:
        ax.add_patch(Rectangle((x0, y0), s, s, fill=False, hatch="///", edgecolor="dimgrey",
                               linewidth=0))  # fmt: skip
        ax.text(x, y - 0.2, f"×{len(colours)}", ha="center", va="center", fontsize=7,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
    on_white = {"facecolor": "white", "edgecolor": "none", "pad": 0.5} if shared else None
    ax.text(x, y + 0.1 if shared else y, str(block_id), ha="center", va="center", fontsize=8,
            color="dimgrey" if not colours else "black", bbox=on_white)  # fmt: skip


def plot_block_table(
    tables: Mapping[str, Sequence[int]],
    lengths: Mapping[str, int],
    num_blocks: int,
    block_size: int,
    title: str = "",
) -> None:
    """The paged KV cache at one moment: the block pool on top, each request's block table below.

    The pool is `num_blocks` squares labelled with their block ids, coloured by the request that
    holds them: grey is free; hatched, with ×n, is shared by n requests (prefix caching: their
    prompts begin with the same tokens, so they read the same keys and values). The coloured
    part of a square is the share of its `block_size` slots already written: a request's last
    block is often partly white. Below, request r's row is `tables[r]` in order, the blocks that
    hold its tokens 0 to block_size - 1, then the next block_size, and so on: scattered through
    the pool, wherever a block was free. `lengths[r]` is its number of tokens in the cache.
    """
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if isinstance(value, bool) or not hasattr(value, "__index__") or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for r, table in tables.items():
        for b in table:
            if isinstance(b, bool) or not hasattr(b, "__index__") or not 0 <= b < num_blocks:
                raise ValueError(f"tables[{r!r}] holds block {b!r}, not an id of the pool's "
                                 f"{num_blocks} blocks (0 to {num_blocks - 1})")  # fmt: skip
        if r not in lengths:
            raise ValueError(f"lengths has no entry for {r!r}, a request of tables")
        need = math.ceil(lengths[r] / block_size)
        if not need <= len(table) <= need + 1:
            raise ValueError(
                f"lengths[{r!r}] = {lengths[r]} tokens need {need} blocks of {block_size} (one "
                f"more at most), but tables[{r!r}] has {len(table)}"
            )
    palette = OKABE_ITO[:6] + ["#882255", "#999933", "#332288", "#F0E442", "#117733", "#AA4499"]
    colour = {r: palette[i % len(palette)] for i, r in enumerate(tables)}
    written = {r: [min(max(lengths[r] - j * block_size, 0), block_size) for j in range(len(t))]
               for r, t in tables.items()}  # fmt: skip
    holders: list[list] = [[] for _ in range(num_blocks)]
    filled = [0.0] * num_blocks
    for r, table in tables.items():
        for j, b in enumerate(table):
            holders[b] += [r] if r not in holders[b] else []
            filled[b] = max(filled[b], written[r][j] / block_size)
    n_rows = math.ceil(num_blocks / 16)
    n_cols = math.ceil(num_blocks / n_rows)
    first = -n_rows - 1.0  # the first request's row; the pool's rows are 0, -1, ...
    longest = max((len(t) for t in tables.values()), default=0)
    x_min = -0.9 - 0.13 * max((len(str(r)) for r in tables), default=0)
    x_max = max(n_cols - 0.4, longest + 3.3)
    y_min, y_max = first - len(tables) + 0.4, 1.1
    unit = min(0.5, 9.5 / (x_max - x_min))  # inches per block
    fig, ax = plt.subplots(figsize=(unit * (x_max - x_min) + 0.4, unit * (y_max - y_min) + 0.9),
                           layout="constrained")  # fmt: skip
    heading = {"ha": "left", "va": "center", "fontsize": 9, "color": "dimgrey"}
    ax.text(-0.42, 0.75, f"block pool: {num_blocks} blocks of {block_size} slots", **heading)
    for b in range(num_blocks):
        _kv_block(ax, b % n_cols, -(b // n_cols), b, [colour[r] for r in holders[b]], filled[b])
    ax.text(-0.42, first + 0.75, "block tables (position in the request → block id)", **heading)
    for i, (r, table) in enumerate(tables.items()):
        y = first - i
        ax.text(-0.6, y, str(r), ha="right", va="center", fontsize=9)
        for j, b in enumerate(table):
            _kv_block(ax, j, y, b, [colour[r]] * len(holders[b]), written[r][j] / block_size)
        last = f"last block {written[r][-1]}/{block_size}" if table else "no block"
        ax.text(len(table) - 0.3, y, f"{lengths[r]} tokens, {last}", va="center", fontsize=8)
    ax.set(xlim=(x_min, x_max), ylim=(y_min, y_max), aspect="equal")
    ax.axis("off")
    handles = []  # the requests' colours need no entry: each row names its request
    if any(len(h) > 1 for h in holders):
        handles.append(Patch(facecolor="white", hatch="///", edgecolor="dimgrey",
                             label="shared prefix block (×n: n holders)"))  # fmt: skip
    handles.append(Patch(facecolor=FREE_BLOCK, edgecolor="black", label="free block"))
    handles.append(Patch(facecolor="white", edgecolor="black", label="white part: empty slots"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.set_title(title or "The paged KV cache: the pool and the block tables", fontsize=10)
    plt.show()


def plot_schedule_timeline(steps: Sequence[Mapping[str, tuple[str, int]]], title: str = "") -> None:
    """What the scheduler ran, step by step: a Gantt chart with a row per request (the first to
    arrive at the top) and a column per step.

    `steps[i]` maps a request id to (kind, num_tokens) at step i. A blue cell is a prefill chunk,
    labelled with the number of prompt tokens it read (when the cells are wide enough for it); a
    green cell a decode step, one token; a vermillion cell a preemption: the request's blocks
    were freed at that step and it went back to the queue, to read its tokens again later. An
    empty cell is a step in which the request did not run (not yet admitted, waiting, finished).
    Below, the tokens each step computed, all requests together, stacked by kind: chunked
    prefill fills the step's token budget around the decodes.
    """
    if not steps:
        raise ValueError("steps is empty: give one {request id: (kind, num_tokens)} per step")
    rows: dict[str, int] = {}
    for i, step in enumerate(steps):
        for r, entry in step.items():
            kind = entry[0] if isinstance(entry, tuple | list) and len(entry) == 2 else None
            if kind not in SERVE_COLOURS:
                raise ValueError(f"steps[{i}][{r!r}] must be (kind, num_tokens) with kind one of "
                                 f"{', '.join(SERVE_COLOURS)}; got {entry!r}")  # fmt: skip
            rows.setdefault(r, len(rows))
    n_steps, n_rows = len(steps), len(rows)
    width = min(11.0, max(6.0, 0.4 * n_steps + 2.0))
    fig, (ax, below) = plt.subplots(2, 1, sharex=True, figsize=(width, 0.38 * n_rows + 2.9),
                                    height_ratios=[max(n_rows, 2), 2.4],
                                    layout="constrained")  # fmt: skip
    label_cells = (width - 1.8) / n_steps >= 0.22  # inches per step: room for two digits
    for i, step in enumerate(steps):
        for r, (kind, n) in step.items():
            ax.barh(rows[r], 0.9, left=i - 0.45, height=0.72, color=SERVE_COLOURS[kind])
            if kind == "prefill" and label_cells:
                ax.text(i, rows[r], str(n), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(n_rows), [str(r) for r in rows], fontsize=9)
    ax.set_ylim(max(n_rows, 1) - 0.5, -0.5)  # the first request at the top
    ax.set_ylabel("request")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    by_kind = {kind: [sum(n for k, n in step.values() if k == kind) for step in steps]
               for kind in ("decode", "prefill")}  # fmt: skip
    below.bar(range(n_steps), by_kind["decode"], 0.8, color=SERVE_COLOURS["decode"])
    below.bar(range(n_steps), by_kind["prefill"], 0.8, bottom=by_kind["decode"],
              color=SERVE_COLOURS["prefill"])  # fmt: skip
    below.set_ylabel("tokens\nin the step", fontsize=9)
    below.set_xlabel("step")
    below.set_xlim(-0.6, n_steps - 0.4)
    below.xaxis.set_major_locator(MaxNLocator(integer=True))
    below.grid(axis="y", alpha=0.3)
    handles = [
        Patch(color=SERVE_COLOURS["prefill"], label="prefill chunk (its tokens)"),
        Patch(color=SERVE_COLOURS["decode"], label="decode (1 token)"),
        Patch(color=SERVE_COLOURS["preempted"], label="preempted: blocks freed"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.set_title(title or f"The schedule: {n_rows} requests over {n_steps} steps", fontsize=10)
    plt.show()


def plot_memory_over_time(
    series: Mapping[str, Sequence[float]],
    capacity: float | None = None,
    ylabel: str = "KV blocks",
    title: str = "",
) -> None:
    """KV-cache memory against the step, one line per series (say, the blocks an engine holds,
    against what static batching reserves and what it actually uses), with the pool's size as
    a dashed line at `capacity` when given. The gap between a "reserved" line and a "used" one
    is memory no request can use; a line that stays near the pool is a cache kept full.
    """
    if not series:
        raise ValueError("series is empty: give at least one {name: values}")
    values = {name: np.asarray(list(v), dtype=float) for name, v in series.items()}
    for name, v in values.items():
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"series[{name!r}] must be a non-empty sequence of numbers")
    fig, ax = plt.subplots(figsize=(8.5, 3.8), layout="constrained")
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for i, (name, v) in enumerate(values.items()):
        marker = markers[i % len(markers)] if v.size <= 60 else None
        ax.plot(np.arange(v.size), v, color=OKABE_ITO[i % len(OKABE_ITO)], label=name,
                marker=marker, markersize=3)  # fmt: skip
    highest = max(float(v.max()) for v in values.values())
    if capacity is not None:
        ax.axhline(capacity, color="grey", linestyle="--", linewidth=1.2, label="pool")
        highest = max(highest, capacity)
    ax.set_ylim(0, 1.1 * highest if highest > 0 else 1)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # outside: hides no line
    ax.set_title(title or "KV-cache memory over time", fontsize=10)
    plt.show()


def plot_rope_angles(
    cos: Float[Tensor, "posn d_head"], sin: Float[Tensor, "posn d_head"], theta: float
) -> None:
    """Rotary embeddings' angles, read back from the cosines and sines of positions 0, 1, ...
    (half-split layout: column i holds pair i). Left: each pair's angle at each position, as a
    colour that goes once round the wheel per turn; pair 0 spins through a turn every few
    positions, the last pairs barely move. Right: how far each pair turns per position (its
    angle at position 1), on a log scale: a straight line from 1 down towards 1/theta.
    """
    if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[0] < 2 or cos.shape[1] % 2:
        raise ValueError("cos and sin must be [posn >= 2, even d_head], of one shape")
    pairs = cos.shape[1] // 2
    angles = torch.atan2(sin[:, :pairs], cos[:, :pairs]).float()  # in (-pi, pi]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained",
                                      width_ratios=[1.6, 1])  # fmt: skip
    image = left.imshow(angles.T.numpy(), aspect="auto", origin="lower", cmap="twilight",
                        vmin=-math.pi, vmax=math.pi, interpolation="nearest")  # fmt: skip
    fig.colorbar(image, ax=left, label="angle (radians, one turn = 2π)")
    left.set_xlabel("position")
    left.set_ylabel("pair i")
    left.set_title(f"Each pair's angle at each position (theta = {theta:g})", fontsize=10)
    per_step = angles[1].abs().numpy()
    right.semilogy(np.arange(pairs), per_step, "o-", markersize=3, color=OKABE_ITO[0])
    right.axhline(1 / theta, color="grey", linestyle="--", linewidth=1, label="1 / theta")
    right.set_xlabel("pair i")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("radians per position")
    right.set_title("How fast each pair turns", fontsize=10)
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=8)
    plt.show()


def plot_kv_groups(reads: Sequence[int], n_kv_heads: int, title: str = "") -> None:
    """Which key/value head each query head reads: `reads[h]` is query head h's. One row of
    boxes for the query heads, one for the key/value heads, a line for each read, coloured by
    key/value head: consecutive query heads sharing one head is grouped-query attention."""
    reads = [int(r) for r in reads]
    if not reads or any(not 0 <= r < n_kv_heads for r in reads):
        raise ValueError(f"reads must be a non-empty list of heads in [0, {n_kv_heads})")
    n_heads = len(reads)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * n_heads + 1), 2.6), layout="constrained")
    span = n_heads - 1 if n_heads > 1 else 1
    kv_x = [span * (j + 0.5) / n_kv_heads for j in range(n_kv_heads)]
    for h, r in enumerate(reads):
        colour = OKABE_ITO[r % len(OKABE_ITO)]
        ax.plot([h, kv_x[r]], [1, 0], color=colour, linewidth=1.5, zorder=1)
        ax.add_patch(Rectangle((h - 0.3, 0.92), 0.6, 0.2, color=_pale(colour), zorder=2))
        ax.text(h, 1.02, f"q{h}", ha="center", va="center", fontsize=9, zorder=3)
    for j, x in enumerate(kv_x):
        colour = OKABE_ITO[j % len(OKABE_ITO)]
        ax.add_patch(Rectangle((x - 0.35, -0.12), 0.7, 0.2, color=colour, zorder=2))
        ax.text(x, -0.02, f"kv{j}", ha="center", va="center", fontsize=9, color="white", zorder=3)
    ax.set_xlim(-0.7, span + 0.7)
    ax.set_ylim(-0.3, 1.3)
    ax.axis("off")
    ax.text(-0.65, 1.2, "query heads", fontsize=9, va="center")
    ax.text(-0.65, -0.25, "key/value heads", fontsize=9, va="center")
    ax.set_title(title or f"{n_heads} query heads, {n_kv_heads} key/value heads", fontsize=10)
    plt.show()
