"""The course's figures, one function per kind of figure.

Chapter cells call these so that a demo cell shows what the learner should read (which
distribution, which samples) and not matplotlib plumbing. Each function draws one figure and
shows it with `plt.show()`: inline in Jupyter, and nothing at all under a non-interactive
backend such as `MPLBACKEND=Agg`, which the course's CI uses. They return nothing, so that a call
on the last line of a cell does not display the figure a second time.
"""

from collections.abc import Mapping

import matplotlib.pyplot as plt
import torch
from jaxtyping import Float, Int
from torch import Tensor


def plot_temperature_curves(
    by_temperature: Mapping[float, Float[Tensor, "d_vocab"]], n_ranks: int = 40
) -> None:
    """Probability against rank, one curve per temperature, on a log scale.

    Each distribution is sorted on its own, but temperature never changes the order of the
    tokens, so rank r is the same token on every curve. A dotted line marks the uniform
    distribution, the limit as the temperature grows.
    """
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ranks = range(1, n_ranks + 1)
    for temperature, probs in by_temperature.items():
        ax.plot(ranks, probs.sort(descending=True).values[:n_ranks], label=f"T = {temperature}")
    d_vocab = next(iter(by_temperature.values())).numel()
    ax.axhline(1 / d_vocab, color="grey", linestyle=":", label="uniform")
    ax.set_yscale("log")
    ax.set_xlabel("rank of the token (1 = most likely at every T)")
    ax.set_ylabel("probability")
    ax.legend()
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
    fig, ax = plt.subplots(figsize=(8, 3.5))
    n = samples.numel()
    top = rank_by.topk(n_show).indices
    observed = torch.bincount(samples, minlength=probs.numel()).double() / n
    x = range(n_show)
    ax.bar(x, observed[top], color="tab:blue", alpha=0.7, label=f"frequency in {n:,} samples")
    ax.plot(x, probs[top], "o", color="black", markersize=4, label="exact probability")
    labels = [repr(tokenizer.decode([t]))[1:-1] for t in top.tolist()]
    ax.set_xticks(list(x), labels, rotation=70, fontsize=8)
    ax.set_title(title, fontsize=10)
    p, freq = probs[top].double(), observed[top]
    kept = p > 0
    z = ((freq - p)[kept].abs() / (p * (1 - p) / n)[kept].sqrt()).max().item()
    outside = (probs[samples] == 0).sum().item()
    print(f"{title}: largest gap {z:.1f} standard errors; samples outside the kept set: {outside}")
    ax.legend()
    plt.show()
