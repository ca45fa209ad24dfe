"""Chapter 7's model on chapter 8's paged cache: the Llama model's runner for the engine.

What differs from the GPT-2 runner (solutions/model_runner.py) is inside the model: no position
embedding; queries and keys turned by each token's own position (RoPE) BEFORE the keys are
written, so a block stores rotated keys and a key is never turned again; n_kv_heads key/value
heads, each read by a group of query heads. A block of its cache holds n_kv_heads heads, not
n_heads: the same bytes hold n_heads / n_kv_heads times the tokens.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from solutions.llama import LlamaTransformer
from solutions.paged_attention import (
    PagedKVCache,
    StepInputs,
    attend_strided,
    attention_groups,
    write_slots,
)


def forward_paged_llama(
    model: LlamaTransformer,
    keys_values: PagedKVCache,
    inputs: StepInputs,
    logits_at: Int[Tensor, "S"],
) -> Float[Tensor, "S d_vocab"]:
    """`forward_paged` for chapter 7's model: the step's T tokens as one row of a batch of one,
    each turned by its own position in its own request (chapter 7's `rotated_qkv`), with keys
    and values read through the block tables by `attend_strided`, the GPT-2 runner's attention,
    whose query heads read their group's key/value head in place."""
    groups = attention_groups(inputs, keys_values.block_size)
    positions = inputs.positions[None]  # [1, T]: a token's position in its request
    residual = model.embed(inputs.token_ids[None])  # [1, T, d_model]; no position embedding
    for block, keys, values in zip(model.blocks, keys_values.keys, keys_values.values, strict=True):
        q, k, v = block.attn.rotated_qkv(block.ln1(residual), positions)  # [1, heads, T, d_head]
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # [T, heads, d_head], as in a block
        # The keys go into the cache rotated by their own positions: never turned again.
        write_slots(keys, values, inputs.slot_mapping, k, v)
        z = torch.empty_like(q)
        for g in groups:
            # Not chapter 7's `attend`: its `expand_kv` copies each key/value head for its group
            # of query heads, a copy as large as the GPT-2 model's whole gathered context.
            z[g.rows] = attend_strided(q[g.rows], keys, values, g.block_tables, g.query_pos)
        residual = residual + (z.flatten(1) @ block.attn.W_O.flatten(0, 1))[None]  # heads summed
        residual = residual + block.mlp(block.ln2(residual))
    return model.unembed(model.ln_final(residual[0, logits_at]))


class LlamaModelRunner:
    """Chapter 7's model through `forward_paged_llama`."""

    def __init__(self, model: LlamaTransformer):
        self.model = model

    def forward(
        self, cache: PagedKVCache, inputs: StepInputs, logits_at: Int[Tensor, "S"]
    ) -> Float[Tensor, "S d_vocab"]:
        return forward_paged_llama(self.model, cache, inputs, logits_at)
