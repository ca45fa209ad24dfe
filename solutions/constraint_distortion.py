"""What masking each step does to the model's distribution (Park et al., 2024, "Grammar-Aligned
Decoding", arXiv:2405.21047).

The distribution a constraint asks for is the model's own, conditioned on the answer keeping
the constraint: p(y | y allowed) = p(y) / Z, with Z the model's probability of all the allowed
answers together. Masking each step samples from something else: at each step the allowed
tokens share ALL the probability, in the model's proportions, whatever becomes of them later.
A prefix the model likes for reasons the constraint forbids (`R` at the start of `ROMEO`, when
only `Romeo` is allowed) keeps its whole probability and must then be finished in a way the
model did not want. Per-step masking gives each answer

    q(y) = prod_t p(y_t | y_<t) / p(allowed at step t | y_<t),

which equals p(y) / Z only when every step's allowed mass is the same along every answer.

For a constraint with finitely many answers both can be computed exactly: every answer is a
path of tokens through the index, ending in end-of-text, and each step of a path is one
forward pass. `answer_probabilities` walks them all.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Int
from torch import Tensor

from solutions.token_index import TokenIndex


@torch.inference_mode()
def answer_probabilities(
    model, prompt_ids: list[int], index: TokenIndex, max_tokens: int = 32
) -> dict[tuple[int, ...], tuple[float, float]]:
    """Every answer the index allows (token ids, ending in end-of-text), with its log
    probability under the model, log p(y), and under per-step masking, log q(y). The model's
    log-softmax is taken in float64. Refuses a constraint with an answer longer than
    `max_tokens` (its answers may be endless: it cannot be enumerated)."""
    answers: dict[tuple[int, ...], tuple[float, float]] = {}

    def visit(state: int, path: tuple[int, ...], log_p: float, log_q: float) -> None:
        if len(path) >= max_tokens:
            raise ValueError(f"an answer is longer than max_tokens={max_tokens}: the "
                             "constraint's answers cannot be enumerated")  # fmt: skip
        ids: Int[Tensor, "1 seq"] = torch.tensor([prompt_ids + list(path)])
        log_probs = model(ids)[0, -1].double().log_softmax(-1)
        allowed = index.allowed(state)
        log_allowed = log_probs[allowed]
        log_mass = torch.logsumexp(log_allowed, 0).item()  # p(allowed at this step)
        for token, lp in zip(allowed, log_allowed.tolist(), strict=True):
            if token == index.eos_id:
                answers[(*path, token)] = (log_p + lp, log_q + lp - log_mass)
            else:
                visit(index.advance(state, token), (*path, token), log_p + lp,
                      log_q + lp - log_mass)  # fmt: skip

    visit(index.initial, (), 0.0, 0.0)
    return answers


def conditioned_and_masked(
    answers: dict[tuple[int, ...], tuple[float, float]],
) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float], float]:
    """The answers' probabilities conditioned on the constraint, p(y) / Z, and under per-step
    masking, q(y); and Z, the model's probability of all allowed answers."""
    log_z = torch.logsumexp(torch.tensor([lp for lp, _ in answers.values()]), 0).item()
    exact = {y: math.exp(lp - log_z) for y, (lp, _) in answers.items()}
    masked = {y: math.exp(lq) for y, (_, lq) in answers.items()}
    return exact, masked, math.exp(log_z)


def kl_divergence(p: dict, q: dict) -> float:
    """KL(p || q) in nats, over the keys of p (q must be positive wherever p is)."""
    return sum(pi * math.log(pi / q[k]) for k, pi in p.items() if pi > 0)
