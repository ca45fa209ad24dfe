"""The LlamaTransformer's forward pass on chapter 5's StaticKeyValueCache.

Chapter 5's `forward_static` contract for the Llama model: the new tokens' keys and values are
written in place into their slots of buffers made once for `n_ctx` positions, and every query
reads all the slots through one mask. What changes from the GPT-2 pass: the buffers hold
n_kv_heads heads, and the keys written are the ROTATED ones (chapter 7's cache rule: a key is
turned once, by its own position, and never again). Positions arrive as a tensor, as slots do,
so a compiled decoding step is one graph for the whole generation.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions.llama import LlamaTransformer
from solutions.static_cache import StaticKeyValueCache


def llama_forward_static(
    model: LlamaTransformer,
    tokens: Int[Tensor, "batch new"],
    cache: StaticKeyValueCache,
    slots: Int[Tensor, "new"],
    positions: Int[Tensor, "batch new"],
    real: Bool[Tensor, "batch new"] | None = None,
) -> Float[Tensor, "batch new d_vocab"]:
    """Logits for the new tokens, written to `slots` of `cache` at `positions` (their angles).
    `real` is False where a new token is left padding. No check, no `.item()`, no Python branch
    on a tensor, as chapter 5's `forward_static`."""
    if real is None:
        real = torch.ones_like(tokens, dtype=torch.bool)
    cache.mask[:, slots] = real
    # Chapter 5's rule: a query reads the real keys up to its own slot, and always its own key.
    own = torch.arange(model.cfg.n_ctx, device=tokens.device)[None, :] == slots[:, None]
    allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)  # [batch, 1, new, n_ctx]
    residual = model.embed(tokens)  # no position embedding: positions turn queries and keys
    for block, keys, values in zip(model.blocks, cache.keys, cache.values, strict=True):
        q, k, v = block.attn.rotated_qkv(block.ln1(residual), positions)
        keys.index_copy_(2, slots, k)  # in place: the same buffers, the same shapes every step
        values.index_copy_(2, slots, v)
        residual = residual + block.attn.attend(q, keys, values, allowed)
        residual = residual + block.mlp(block.ln2(residual))
    return model.unembed(model.ln_final(residual))
