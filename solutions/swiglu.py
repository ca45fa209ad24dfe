"""The gated MLP of today's models (SwiGLU; Shazeer, 2020): one branch, passed through SiLU,
gates another, element by element, before the down projection. No biases."""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from solutions.llama_config import LlamaConfig


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.W_gate = nn.Parameter(torch.empty((cfg.d_model, cfg.d_mlp)))
        self.W_up = nn.Parameter(torch.empty((cfg.d_model, cfg.d_mlp)))
        self.W_down = nn.Parameter(torch.empty((cfg.d_mlp, cfg.d_model)))
        for W in (self.W_gate, self.W_up, self.W_down):
            nn.init.normal_(W, std=cfg.init_range)

    def forward(
        self, normalized_resid_mid: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        x = normalized_resid_mid
        # SiLU on the gate only; the up branch stays linear and is scaled by the gate.
        return (F.silu(x @ self.W_gate) * (x @ self.W_up)) @ self.W_down
        # END SOLUTION
