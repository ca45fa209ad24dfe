"""LayerNorm: make each residual vector mean 0 and variance 1, then scale and shift it."""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions.config import Config


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(
        self, residual: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # Not in place: the caller's residual stream must survive (it is added back later).
        residual = residual - residual.mean(dim=-1, keepdim=True)
        # Biased variance (divide by d_model, not d_model - 1), and epsilon INSIDE the sqrt:
        # that is how GPT-2 was trained, so that is what its weights expect.
        scale = (residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()
        return residual / scale * self.w + self.b
        # END SOLUTION
