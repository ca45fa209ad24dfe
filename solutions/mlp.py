"""The MLP: a position-wise two-layer network, 4x wider in the middle."""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions.config import Config


def gelu_new(x: Tensor) -> Tensor:
    """GELU with the tanh approximation, the one GPT-2 was trained with:
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). PyTorch computes it in one fused op."""
    return nn.functional.gelu(x, approximate="tanh")


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_in = nn.Parameter(torch.empty((cfg.d_model, cfg.d_mlp)))
        self.W_out = nn.Parameter(torch.empty((cfg.d_mlp, cfg.d_model)))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        nn.init.normal_(self.W_in, std=cfg.init_range)
        nn.init.normal_(self.W_out, std=cfg.init_range)

    def forward(
        self, normalized_resid_mid: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # `@` multiplies the last dimension by W's first and keeps [batch, posn] in front.
        pre = normalized_resid_mid @ self.W_in + self.b_in
        post = gelu_new(pre)
        return post @ self.W_out + self.b_out
        # END SOLUTION
