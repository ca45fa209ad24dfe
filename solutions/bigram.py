"""A bigram baseline: the next token's distribution given only the current token, by counting.

Any model worth training must beat it; evaluating it with the same `evaluate` as the
transformer makes the comparison fair.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn


class BigramLM(nn.Module):
    def __init__(self, tokens: Int[Tensor, " n_tokens"], d_vocab: int, alpha: float = 0.1):
        super().__init__()
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0 (add-alpha smoothing), got {alpha}")
        counts = torch.zeros(d_vocab, d_vocab)
        pairs = tokens[:-1] * d_vocab + tokens[1:]
        counts.view(-1).index_add_(0, pairs, torch.ones(len(pairs)))
        # Add-alpha smoothing: a pair never seen in training still gets a little probability.
        probs = (counts + alpha) / (counts + alpha).sum(dim=-1, keepdim=True)
        self.register_buffer("log_probs", probs.log())

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_vocab"]:
        return self.log_probs[tokens]  # log-probabilities are valid logits
