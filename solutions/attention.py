"""Causal multi-head self-attention: every position reads from itself and earlier positions."""

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions.config import Config


class Attention(nn.Module):
    IGNORE: Float[Tensor, ""]

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_K = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_V = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_O = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_head, cfg.d_model)))
        self.b_Q = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_K = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_V = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(W, std=cfg.init_range)
        # A buffer moves with the module to the GPU; -inf becomes exactly 0 after softmax.
        self.register_buffer("IGNORE", torch.tensor(float("-inf")), persistent=False)

    def forward(
        self, normalized_resid_pre: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        x = normalized_resid_pre
        q = einops.einsum(x, self.W_Q, "b p d, h d e -> b p h e") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p d, h d e -> b p h e") + self.b_K
        v = einops.einsum(x, self.W_V, "b p d, h d e -> b p h e") + self.b_V

        # Scaling by 1/sqrt(d_head) keeps the scores' variance near 1 whatever the head width,
        # so the softmax is not pushed into its flat, one-hot regime.
        scores = einops.einsum(q, k, "b q h e, b k h e -> b h q k") / self.cfg.d_head**0.5
        pattern = self.apply_causal_mask(scores).softmax(dim=-1)

        z = einops.einsum(pattern, v, "b h q k, b k h e -> b q h e")
        # Each head writes into the residual stream through its own slice of W_O; summing over
        # heads is the same as concatenating them and applying one big matrix.
        return einops.einsum(z, self.W_O, "b q h e, h e d -> b q d") + self.b_O
        # END SOLUTION

    def apply_causal_mask(
        self, attn_scores: Float[Tensor, "batch n_heads query_pos key_pos"]
    ) -> Float[Tensor, "batch n_heads query_pos key_pos"]:
        """Replace the score of every key that comes AFTER its query with -inf."""
        # BEGIN SOLUTION
        n_query, n_key = attn_scores.shape[-2:]
        # diagonal=1: a query may attend to its own position, never to a later one.
        future = torch.triu(
            torch.ones(n_query, n_key, dtype=torch.bool, device=attn_scores.device), diagonal=1
        )
        return attn_scores.masked_fill(future, self.IGNORE)
        # END SOLUTION
