"""LlamaTransformer: today's decoder (Llama, Mistral, SmolLM2) from tokens to logits.

GPT-2's block with four changes: RMSNorm for LayerNorm, rotary positions for learned ones,
a gated MLP (SwiGLU) for the GELU MLP, grouped-query attention; and no biases anywhere.
The residual stream, the pre-norm blocks and the tied unembedding are chapter 1's.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions import checks
from solutions.embed import Embed
from solutions.gqa import GroupedQueryAttention
from solutions.llama_config import LlamaConfig
from solutions.rmsnorm import RMSNorm
from solutions.swiglu import SwiGLU
from solutions.train import TiedUnembed


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.ln1 = RMSNorm(cfg)
        self.attn = GroupedQueryAttention(cfg)
        self.ln2 = RMSNorm(cfg)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, resid_pre: Float[Tensor, "batch posn d_model"], positions: Int[Tensor, "batch posn"]
    ) -> Float[Tensor, "batch posn d_model"]:
        # BEGIN SOLUTION
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre), positions)
        return resid_mid + self.mlp(self.ln2(resid_mid))
        # END SOLUTION


class LlamaUnembed(nn.Module):
    """An unembedding of its own (a model with untied embeddings); no bias."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty((cfg.d_model, cfg.d_vocab)))
        nn.init.normal_(self.W_U, std=cfg.init_range)

    def forward(
        self, x: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_vocab"]:
        return x @ self.W_U


class LlamaTransformer(nn.Module):
    def __init__(self, cfg: LlamaConfig, tie_embeddings: bool = True):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList([LlamaBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = RMSNorm(cfg)
        self.unembed = TiedUnembed(self.embed) if tie_embeddings else LlamaUnembed(cfg)

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_vocab"]:
        checks.token_ids("tokens [batch, posn]", tokens, self.cfg.d_vocab, ndim=2)
        checks.integer(f"the number of positions (n_ctx={self.cfg.n_ctx})", tokens.shape[1],
                       low=1, high=self.cfg.n_ctx)  # fmt: skip
        # BEGIN SOLUTION
        # No position embedding is added: positions reach the model only through the angles
        # that turn each layer's queries and keys.
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape)
        residual = self.embed(tokens)
        for block in self.blocks:
            residual = block(residual, positions)
        return self.unembed(self.ln_final(residual))
        # END SOLUTION
