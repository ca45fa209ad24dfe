"""The mask: a constraint's allowed tokens applied to the model's logits.

Every token outside the allowed set gets the logit -inf, so softmax gives it probability 0 and
the allowed tokens share all the probability in the proportions the model gave them: the
model's distribution renormalised over the allowed set. The mask comes FIRST, before chapter 3's
temperature, top-k and top-p: those must choose among the tokens that can still be sampled. Top-k
before the mask may keep k tokens that are all forbidden, leaving nothing; top-p before it would
measure its nucleus on probability that the mask then throws away.
"""

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def token_mask(
    allowed: list[int], d_vocab: int, device: torch.device | str = "cpu"
) -> Bool[Tensor, "d_vocab"]:
    """True at each id in `allowed`, False elsewhere."""
    # BEGIN SOLUTION
    mask = torch.zeros(d_vocab, dtype=torch.bool, device=device)
    mask[torch.tensor(allowed, dtype=torch.long, device=device)] = True
    return mask
    # END SOLUTION


def mask_logits(
    logits: Float[Tensor, "batch d_vocab"], mask: Bool[Tensor, "batch d_vocab"]
) -> Float[Tensor, "batch d_vocab"]:
    """The logits with -inf wherever `mask` is False (a new tensor: the caller's is unchanged)."""
    # BEGIN SOLUTION
    return logits.masked_fill(~mask, float("-inf"))
    # END SOLUTION
