"""Token and position embeddings: the residual stream starts as their sum."""

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions.config import Config


class Embed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty((cfg.d_vocab, cfg.d_model)))
        nn.init.normal_(self.W_E, std=cfg.init_range)

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # Row `t` of W_E is the vector of token `t`: embedding is just indexing.
        return self.W_E[tokens]
        # END SOLUTION


class PosEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_pos = nn.Parameter(torch.empty((cfg.n_ctx, cfg.d_model)))
        nn.init.normal_(self.W_pos, std=cfg.init_range)

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        # The position of a token, not its id, picks the row; every sequence in the batch
        # gets the same positional vectors.
        batch, seq_len = tokens.shape
        return einops.repeat(
            self.W_pos[:seq_len], "posn d_model -> batch posn d_model", batch=batch
        )
        # END SOLUTION
