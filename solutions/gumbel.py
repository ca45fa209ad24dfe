"""The Gumbel-max trick, and how often two distributions pick the same token under three ways of
coupling their randomness.

Sampling from softmax(logits) is the same as adding independent standard Gumbel noise to each
logit and taking the argmax. Written that way, the randomness (the noise G) is separate from the
distribution (the logits): two models can share one draw of G. How often they then agree on the
token, compared with independent draws and with the rejection sampler of speculative decoding,
is what the three `same_token_*` functions compute, exactly.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks


def gumbel_sample(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch"]:
    """One token per row, distributed as softmax(logits / temperature): argmax(logits / T + G)
    with G standard Gumbel noise. temperature=0 is greedy."""
    checks.number("temperature", temperature, low=0.0)
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        raise ValueError("logits must be a floating tensor of shape [batch, d_vocab]")
    # BEGIN SOLUTION
    if temperature == 0:
        return logits.argmax(dim=-1)  # the limit T -> 0: no noise to draw, no division by 0
    # G = -log(-log U) for U uniform in (0, 1). torch.rand can return exactly 0, and log(0) is
    # -inf: keep U at least the smallest positive float.
    u = torch.rand(logits.shape, generator=generator, device=logits.device)
    u = u.clamp(min=torch.finfo(u.dtype).tiny)
    gumbel = -torch.log(-torch.log(u))
    # The temperature scales the logits, not the noise: (logits + G) / T has the same argmax
    # as logits + G, whatever T is.
    return (logits / temperature + gumbel).argmax(dim=-1)
    # END SOLUTION


def same_token_shared_gumbel(
    p: Float[Tensor, "... d_vocab"], q: Float[Tensor, "... d_vocab"]
) -> Float[Tensor, "..."]:
    """P(argmax(log p + G) == argmax(log q + G)) with the SAME noise G, exactly (the formula
    is derived in the section above). Cost: a [d_vocab, d_vocab] matrix per row."""
    checks.probability_pair("p", p, "q", q)
    # BEGIN SOLUTION
    both = (p > 0) & (q > 0)  # log 0 = -inf never wins: k must be possible under p AND q
    # Divide by 1 where p_k or q_k is 0: those terms are dropped below, and 0 / 0 would be NaN.
    p_k = torch.where(both, p, 1.0)[..., :, None]
    q_k = torch.where(both, q, 1.0)[..., :, None]
    ratios = torch.maximum(p[..., None, :] / p_k, q[..., None, :] / q_k)  # [..., k, j]
    return torch.where(both, 1 / ratios.sum(dim=-1), 0.0).sum(dim=-1)
    # END SOLUTION


def same_token_independent(
    p: Float[Tensor, "... d_vocab"], q: Float[Tensor, "... d_vocab"]
) -> Float[Tensor, "..."]:
    """P(x == y) for x ~ p and y ~ q drawn independently."""
    checks.probability_pair("p", p, "q", q)
    # BEGIN SOLUTION
    return (p * q).sum(dim=-1)  # both pick k with probability p_k q_k
    # END SOLUTION


def same_token_rejection(
    p: Float[Tensor, "... d_vocab"], q: Float[Tensor, "... d_vocab"]
) -> Float[Tensor, "..."]:
    """P(the rejection sampler keeps the draft y ~ q as its token x ~ p): the largest probability
    any coupling of p and q can reach."""
    checks.probability_pair("p", p, "q", q)
    # BEGIN SOLUTION
    # Draft k is proposed with probability q_k and kept with probability min(1, p_k / q_k).
    return torch.minimum(p, q).sum(dim=-1)
    # END SOLUTION
