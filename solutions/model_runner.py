"""The GPT-2 model's runner: what the engine calls to run one step of chapter 1's model over the
paged cache.

A runner is built once per engine from the model (`Runner(model)`) and has one method,
`forward(cache, inputs, logits_at)`: the logits at `logits_at` of one flattened step. The engine
does not know which model it serves: the architecture registry (solutions/architectures.py, vLLM's
model registry in miniature) picks the runner by the model's class. Everything around the forward
pass is the same for every architecture: the scheduler, the block pool, the step's flattened
inputs, the slots (`prepare_inputs`), the grouping of requests (`attention_groups`), the cache's
writes (`write_slots`) and the gather of blocks (`gather_blocks`). What differs is inside the
model: here, learned positions added to the embeddings, one fused projection to queries, keys
and values, as many key/value heads as query heads (`forward_paged`). Chapter 7's model has its
own runner (solutions/llama_paged.py).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from solutions.model import DemoTransformer
from solutions.paged_attention import (
    PagedKVCache,
    StepInputs,
    attend_strided,
    forward_paged,
    fused_qkv,
)


class GPT2ModelRunner:
    """Chapter 1's model through `forward_paged`, with `attend_strided`. The fused projection
    of each layer is made once, here, not in every layer of every step (the engine serves a
    model whose weights do not change while it runs)."""

    def __init__(self, model: DemoTransformer):
        self.model = model
        with torch.no_grad():
            self.qkv = [fused_qkv(block.attn) for block in model.blocks]

    def forward(
        self, cache: PagedKVCache, inputs: StepInputs, logits_at: Int[Tensor, "S"]
    ) -> Float[Tensor, "S d_vocab"]:
        return forward_paged(self.model, cache, inputs, logits_at, attend_strided, self.qkv)
