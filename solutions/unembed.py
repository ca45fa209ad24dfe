"""Unembed: one logit per vocabulary token from the final residual stream."""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions.config import Config


class Unembed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_U = nn.Parameter(torch.empty((cfg.d_model, cfg.d_vocab)))
        nn.init.normal_(self.W_U, std=cfg.init_range)
        # GPT-2 has no unembedding bias. The reference's weights (transformer-lens names) carry
        # a `b_U` of zeros, so this module has one too: it loads as zeros and, being an
        # ordinary parameter here, training may move it.
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(
        self, normalized_resid_final: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_vocab"]:
        # BEGIN SOLUTION
        return normalized_resid_final @ self.W_U + self.b_U
        # END SOLUTION
