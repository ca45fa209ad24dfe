"""Gumbel-max sampling, graded against exact probabilities: the checks that chapter 5's
`gumbel_sample` and chapter 6's kernels (Gumbel-max from logits, fused with the matmul) share.
The failure messages name the classic temperature bugs when the samples reveal one."""

from __future__ import annotations

import torch

from tests.graded._oracles import crafted_logits
from tests.graded._stats import assert_samples_follow

TEMPERATURE_AFTER_NOISE = (
    "Your samples follow softmax(logits), the distribution at temperature 1, whatever the "
    "temperature: is the noise added before dividing, argmax((logits + G) / T)? Dividing every "
    "score by the same T > 0 never changes the argmax, so T has no effect. Divide the logits "
    "first, then add the noise: argmax(logits / T + G)."
)
TEMPERATURE_MULTIPLIED = (
    "Your samples follow softmax(logits * T): the logits are multiplied by the temperature. "
    "Divide them: a low temperature must sharpen the distribution, a high one flatten it."
)


def gumbel_logits(seed: int) -> torch.Tensor:
    """chapter 3's crafted logits (probabilities from ~0.3 to ~0), with token 3 masked out."""
    logits = crafted_logits(seed)
    logits[3] = float("-inf")
    return logits


def follows(samples: torch.Tensor, probs: torch.Tensor) -> bool:
    """Whether `samples` pass the chi-square test against `probs` (used only to word a
    failure message, never to decide whether a test fails)."""
    try:
        assert_samples_follow(samples, probs, "")
    except AssertionError:
        return False
    return True


def assert_follows_the_tempered_softmax(samples, logits, temperature) -> None:
    """`samples` follow softmax(logits / T). False failure: ALPHA."""
    what = f"gumbel_sample at temperature {temperature}"
    try:
        assert_samples_follow(samples, (logits.double() / temperature).softmax(-1), what)
    except AssertionError as err:
        if temperature != 1 and follows(samples, logits.double().softmax(-1)):
            raise AssertionError(f"{what}: {TEMPERATURE_AFTER_NOISE}\n{err}") from None
        if temperature != 1 and follows(samples, (logits.double() * temperature).softmax(-1)):
            raise AssertionError(f"{what}: {TEMPERATURE_MULTIPLIED}\n{err}") from None
        raise AssertionError(
            f"{err}\nIs G standard Gumbel noise, -log(-log(U)) with U uniform in (0, 1) "
            "(torch.rand, not torch.randn; -log(U) alone is exponential noise, not Gumbel), "
            "one independent value per logit of every row, and the ARGMAX taken over the "
            "vocabulary (dim=-1)?"
        ) from None


def greedy_rows() -> torch.Tensor:
    """8 rows whose best token leads the runner-up by 0.1. In each row, token 0 is masked
    (-inf), token 1 is positive (a positive logit that is not the best comes first) and token 2
    is exactly 0: logits / 0 would give +inf, +inf and NaN there."""
    logits = torch.randn(8, 24, generator=torch.Generator().manual_seed(43)) * 2
    logits[:, 0] = float("-inf")
    logits[:, 1] = logits[:, 1].abs() + 0.1
    logits[:, 2] = 0.0
    for row in range(8):
        winner = 5 + 2 * row
        others = torch.cat([logits[row, :winner], logits[row, winner + 1 :]])
        logits[row, winner] = others.max() + 0.1
    return logits
