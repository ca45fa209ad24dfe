"""DemoTransformer: GPT-2 from tokens to logits."""

from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions import checks
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
        checks.token_ids("tokens [batch, posn]", tokens, self.cfg.d_vocab, ndim=2)
        checks.integer(f"the number of positions (n_ctx={self.cfg.n_ctx})", tokens.shape[1],
                       low=1, high=self.cfg.n_ctx)  # fmt: skip
        # BEGIN SOLUTION
        residual = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            residual = block(residual)
        return self.unembed(self.ln_final(residual))
        # END SOLUTION
