"""The LlamaTransformer's forward pass with chapter 4's KeyValueCache: the new positions only.

What changes from chapter 4's `forward_with_cache`: the cache holds n_kv_heads heads per layer,
and the keys it holds are the ROTATED ones. A key is turned once, by its own position, when it
is computed; a later query is turned by its position, and their score then depends on the
offset between the two (the point of RoPE). So each new position's angles come from its place
in its row: after the cached positions, and counting real tokens only in a left-padded batch.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions.cached_model import explicit_layout, positions_and_allowed, start_forward
from solutions.kv_cache import KeyValueCache
from solutions.llama import LlamaTransformer


def llama_forward_with_cache(
    model: LlamaTransformer,
    tokens: Int[Tensor, "batch new"],
    cache: KeyValueCache | None = None,
    attention_mask: Bool[Tensor, "batch new"] | None = None,
    positions: Int[Tensor, "new"] | None = None,
    allowed: Bool[Tensor, "new all"] | None = None,
) -> tuple[Float[Tensor, "batch new d_vocab"], KeyValueCache]:
    """Chapter 4's `forward_with_cache` contract for the Llama model: logits for the new tokens
    and the longer cache. Same arguments, same checks, same masks."""
    cache, mask = start_forward(model, tokens, cache, attention_mask)
    n_new = tokens.shape[1]
    if positions is not None or allowed is not None:  # chapter 6's lookahead layout
        positions, allowed = explicit_layout(model, mask, n_new, positions, allowed)
    else:  # chapter 4's: causal, and left padding where the mask has it
        positions, allowed = positions_and_allowed(mask, n_new)
        if mask.all() and n_new == 1:
            allowed = None  # one new token reads every cached key: no mask needed
    # From here, positions is [new] (the lookahead layout) or [batch, new], and allowed is
    # [new, all], [batch, 1, new, all] or None: the arguments' annotations are the caller's.
    # BEGIN SOLUTION
    # Each row's own positions: [new] (one layout for the batch) becomes [batch, new].
    positions = positions.expand(tokens.shape)
    residual = model.embed(tokens)
    keys, values = [], []
    for block, past_k, past_v in zip(model.blocks, cache.keys, cache.values, strict=True):
        x = block.ln1(residual)
        q, k, v = block.attn.rotated_qkv(x, positions)
        # The cache keeps keys as rotated by their own positions: they are never turned again.
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        residual = residual + block.attn.attend(q, k, v, allowed)
        residual = residual + block.mlp(block.ln2(residual))
        keys.append(k)
        values.append(v)
    logits = model.unembed(model.ln_final(residual))
    # END SOLUTION
    new_cache = KeyValueCache(
        keys=tuple(keys),
        values=tuple(values),
        tokens=torch.cat([cache.tokens, tokens], dim=1),
        mask=mask,
        cfg=model.cfg,
    )
    return logits, new_cache
