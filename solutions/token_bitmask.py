"""The token bitmask: a batch's allowed sets as bits, applied to the batch's logits at once.

A serving engine runs many constrained requests in one step, each in its own state. Their
allowed sets go into one tensor of bits, one row per request and one bit per token: 32 tokens to
an int32 word, bit k of word w standing for token 32w + k (the least significant bit first).
That is xgrammar's layout (`allocate_token_bitmask`, `apply_token_bitmask_inplace`); vLLM's
`StructuredOutputManager` keeps one such bitmask for the batch, whichever backend fills its
rows (vllm/v1/structured_output/__init__.py). A row costs d_vocab / 8 bytes (512 for 4,096
tokens; 16,032 for Llama 3's 128,256) instead of a boolean per token, and a row of all ones
(-1) leaves an unconstrained request as it is.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

BITS = 32  # tokens per int32 word


def bitmask_width(d_vocab: int) -> int:
    """The words in one row: enough for every token id."""
    return (d_vocab + BITS - 1) // BITS


def bitmask_of(allowed: list[int], d_vocab: int) -> Int[Tensor, "words"]:
    """One row of the bitmask: bit k of word w set exactly when token 32w + k is in `allowed`,
    as int32 (a word whose top bit is set is negative)."""
    # BEGIN SOLUTION
    bits = torch.zeros(bitmask_width(d_vocab) * BITS, dtype=torch.int64)
    bits[torch.tensor(allowed, dtype=torch.long)] = 1
    words = (bits.view(-1, BITS) << torch.arange(BITS)).sum(dim=1)  # up to 2**32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    # END SOLUTION


def apply_token_bitmask(
    logits: Float[Tensor, "batch d_vocab"], bitmask: Int[Tensor, "batch words"]
) -> Float[Tensor, "batch d_vocab"]:
    """The logits with -inf at every token whose bit is 0 in its row, in one operation over the
    whole batch (a new tensor: the caller's logits are unchanged)."""
    # BEGIN SOLUTION
    shifts = torch.arange(BITS, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [batch, words, 32]: arithmetic shift, bit k
    allowed = bits.flatten(1)[:, : logits.shape[-1]].bool()
    return logits.masked_fill(~allowed, float("-inf"))
    # END SOLUTION
