"""DemoTransformer: GPT-2 from tokens to logits."""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions.block import TransformerBlock
from solutions.config import Config
from solutions.embed import Embed, PosEmbed
from solutions.layernorm import LayerNorm
from solutions.unembed import Unembed


class DemoTransformer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg)
        self.unembed = Unembed(cfg)

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_vocab"]:
        # Bad input gets a clear error here, not an index error deep inside an embedding.
        if tokens.ndim != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be an integer tensor of shape [batch, posn], "
                f"got dtype {tokens.dtype} and shape {tuple(tokens.shape)}"
            )
        if not 1 <= tokens.shape[1] <= self.cfg.n_ctx:
            raise ValueError(
                f"tokens must hold between 1 and n_ctx={self.cfg.n_ctx} positions, "
                f"got {tokens.shape[1]}"
            )
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.cfg.d_vocab:
            raise ValueError(f"token ids must lie in [0, d_vocab={self.cfg.d_vocab})")
        # BEGIN SOLUTION
        residual = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            residual = block(residual)
        return self.unembed(self.ln_final(residual))
        # END SOLUTION
