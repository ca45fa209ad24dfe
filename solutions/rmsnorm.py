"""RMSNorm: LayerNorm without the mean and without the bias (Zhang & Sennrich, 2019)."""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions.llama_config import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))

    def forward(
        self, residual: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # Divide by the root of the mean square, not the standard deviation: nothing is
        # subtracted, so a residual stream's mean is kept. The square is taken in float32 (as
        # HF does) so that half-precision weights do not overflow it.
        x = residual.float()
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.rms_norm_eps)
        return self.w * (x * inv_rms).to(residual.dtype)
        # END SOLUTION
