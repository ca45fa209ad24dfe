"""One transformer block: attention then MLP, each reading a LayerNorm-ed residual stream
and adding its output back to it (GPT-2 is a pre-LN transformer)."""

from jaxtyping import Float
from torch import Tensor, nn

from solutions.attention import Attention
from solutions.config import Config
from solutions.layernorm import LayerNorm
from solutions.mlp import MLP


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.ln1 = LayerNorm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg)
        self.mlp = MLP(cfg)

    def forward(
        self, resid_pre: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # The residual stream is never normalised itself: only what each layer READS is.
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre))
        resid_post = resid_mid + self.mlp(self.ln2(resid_mid))
        return resid_post
        # END SOLUTION
