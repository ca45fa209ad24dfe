"""Grouped-query attention (Ainslie et al., 2023): fewer key/value heads than query heads.

Each key/value head serves a group of `group_size` consecutive query heads. `n_kv_heads ==
n_heads` is chapter 1's multi-head attention; `n_kv_heads == 1` is multi-query attention. The
cache a generator keeps shrinks by the same factor, n_heads / n_kv_heads. Queries and keys are
turned by their positions (RoPE) before the scores; values are not.
"""

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions.llama_config import LlamaConfig
from solutions.rope import apply_rope, rope_cos_sin


def expand_kv(
    kv: Float[Tensor, "batch n_kv_heads pos d_head"], group_size: int
) -> Float[Tensor, "batch n_heads pos d_head"]:
    """Each key/value head repeated for the query heads of its group: heads 0 .. group_size - 1
    read key/value head 0, the next group head 1, and so on (HF's `repeat_kv`)."""
    # BEGIN SOLUTION
    # repeat_interleave keeps a head's copies next to each other: [k0, k0, k1, k1, ...]. A
    # plain repeat would give [k0, k1, k0, k1, ...] and pair query heads with the wrong keys.
    return kv.repeat_interleave(group_size, dim=1)
    # END SOLUTION


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_K = nn.Parameter(torch.empty((cfg.n_kv_heads, cfg.d_model, cfg.d_head)))
        self.W_V = nn.Parameter(torch.empty((cfg.n_kv_heads, cfg.d_model, cfg.d_head)))
        self.W_O = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_head, cfg.d_model)))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(W, std=cfg.init_range)

    def rotated_qkv(
        self, x: Float[Tensor, "batch posn d_model"], positions: Int[Tensor, "batch posn"]
    ) -> tuple[
        Float[Tensor, "batch n_heads posn d_head"],
        Float[Tensor, "batch n_kv_heads posn d_head"],
        Float[Tensor, "batch n_kv_heads posn d_head"],
    ]:
        """Queries and keys turned by their positions' angles, and values, heads first (the
        layout of a cache and of PyTorch's attention functions)."""
        # BEGIN SOLUTION
        cos, sin = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)

        def project(W):  # [batch * posn, d_model] @ [heads, d_model, d_head], as in chapter 4
            return (x.flatten(0, 1) @ W).unflatten(1, x.shape[:2]).transpose(0, 1)

        q, k, v = project(self.W_Q), project(self.W_K), project(self.W_V)
        # Queries and keys turn by their positions; values carry what is read, not where.
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
        # END SOLUTION

    def attend(
        self,
        q: Float[Tensor, "batch n_heads new d_head"],
        keys: Float[Tensor, "batch n_kv_heads all d_head"],
        values: Float[Tensor, "batch n_kv_heads all d_head"],
        allowed: Bool[Tensor, "batch 1 new all"] | Bool[Tensor, "new all"] | None,
    ) -> Float[Tensor, "batch new d_model"]:
        """softmax(q k^T / sqrt(d_head)) v where `allowed`, each query head reading its group's
        key/value head, then the heads' outputs through W_O."""
        # BEGIN SOLUTION
        # Each key/value head is copied for its group of query heads, then it is chapter 4's
        # attention: scale 1/sqrt(d_head), True in `allowed` where a query may read a key.
        keys = expand_kv(keys, self.cfg.group_size)
        values = expand_kv(values, self.cfg.group_size)
        z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
        return einops.einsum(z, self.W_O, "b h p e, h e d -> b p d")
        # END SOLUTION

    def forward(
        self,
        normalized_resid_pre: Float[Tensor, "batch posn d_model"],
        positions: Int[Tensor, "batch posn"],
    ) -> Float[Tensor, "batch posn d_model"]:
        q, k, v = self.rotated_qkv(normalized_resid_pre, positions)
        n = normalized_resid_pre.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return self.attend(q, k, v, causal)
