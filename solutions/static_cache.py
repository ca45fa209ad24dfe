"""StaticKeyValueCache: chapter 4's cache, allocated once for `n_ctx` positions, written in place.

Chapter 4's `KeyValueCache` grows: every step concatenates one position to every layer's keys
and values, which allocates new tensors and copies the old ones, and every step has a new shape.
A static cache (gpt-fast's `KVCache` in `model.py`, HF's `StaticCache`) is one buffer per layer
for all `n_ctx` positions, made before the first token. A step writes its keys and values into
their slots (`index_copy_`), and attention reads the whole buffer through a mask that hides the
slots not written yet. Every decoding step then has the same shapes and touches the same memory:
nothing to allocate, and nothing for a compiler to specialise again.

Slots and positions differ only where rows are left-padded: slot j is column j of the buffer,
the same for every row; a row's position counts its real tokens (padding gets position 0, as in
chapter 4).
"""

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions import checks
from solutions.attention import Attention
from solutions.config import Config
from solutions.model import DemoTransformer


class StaticKeyValueCache:
    """Keys and values of up to `cfg.n_ctx` positions for `batch` sequences, preallocated.

    `keys[i]` and `values[i]` are layer i's buffers, [batch, n_kv_heads, n_ctx, d_head] (chapter
    4's layout; GPT-2's n_kv_heads is its n_heads); `mask` [batch, n_ctx] is True at the slots
    that hold a real token; `causal` [n_ctx, n_ctx] is True where the query in slot q may read
    the key in slot k (k <= q), made once, so that a step picks its rows (`causal[slots]`)
    instead of comparing slots again. The rows picked are a copy, not a view: indexing with a
    tensor of indices always copies."""

    def __init__(
        self,
        cfg: Config,
        batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        checks.integer("batch", batch, low=1)
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.cfg, self.batch, self.dtype = cfg, batch, dtype
        # BEGIN SOLUTION
        shape = (batch, cfg.n_kv_heads, cfg.n_ctx, cfg.d_head)
        # One buffer per layer and per tensor: each layer writes its own keys and values.
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.mask = torch.zeros(batch, cfg.n_ctx, dtype=torch.bool, device=device)
        slots = torch.arange(cfg.n_ctx, device=device)
        self.causal = slots[None, :] <= slots[:, None]  # [query slot, key slot]
        # END SOLUTION

    @property
    def device(self) -> torch.device:
        return self.mask.device

    def reset(self) -> None:
        """Forget every position (the buffers stay where they are: no new allocation)."""
        self.mask.zero_()

    def check_step(self, model: DemoTransformer, tokens: Tensor, slots: Tensor) -> None:
        """A clear ValueError if `tokens` cannot be written to `slots` of this cache."""
        cfg = model.cfg
        mine = (self.cfg.n_layers, self.cfg.n_kv_heads, self.cfg.d_head, self.cfg.n_ctx)
        theirs = (cfg.n_layers, cfg.n_kv_heads, cfg.d_head, cfg.n_ctx)
        if mine != theirs:
            raise ValueError(
                "cache was made for another model: (n_layers, n_kv_heads, d_head, n_ctx) is "
                f"{mine} for the cache and {theirs} for this model"
            )
        if tokens.ndim != 2 or tokens.shape[0] != self.batch:
            raise ValueError(
                f"tokens must be [batch, new] with the cache's batch of {self.batch}, got shape "
                f"{tuple(tokens.shape)}"
            )
        if model.embed.W_E.dtype != self.dtype:
            raise ValueError(
                f"cache was made for {self.dtype} but the model computes in "
                f"{model.embed.W_E.dtype}: make the cache with the model's dtype"
            )
        if slots.ndim != 1 or slots.shape[0] != tokens.shape[1] or slots.dtype != torch.long:
            raise ValueError(
                f"slots must be a long tensor of shape ({tokens.shape[1]},), one per new token, "
                f"got {slots.dtype} {tuple(slots.shape)}"
            )


def attention_static(
    attn: Attention,
    x: Float[Tensor, "batch new d_model"],
    keys: Float[Tensor, "batch n_heads n_ctx d_head"],
    values: Float[Tensor, "batch n_heads n_ctx d_head"],
    slots: Int[Tensor, "new"],
    allowed: Bool[Tensor, "batch 1 new n_ctx"],
) -> Float[Tensor, "batch new d_model"]:
    """Attention for the new positions `x` (layer-normed), writing their keys and values into
    `slots` of the layer's buffers IN PLACE, then reading every slot that `allowed` lets in."""
    # BEGIN SOLUTION
    rows = x.flatten(0, 1)

    def project(W, b):  # -> [batch, n_heads, new, d_head], the cache's layout
        return (rows @ W + b[:, None]).unflatten(1, x.shape[:2]).transpose(0, 1)

    q, k, v = project(attn.W_Q, attn.b_Q), project(attn.W_K, attn.b_K), project(attn.W_V, attn.b_V)
    # In place: the buffer keeps its address and its shape, so the next step is the same
    # program on the same memory (a `torch.cat` would allocate and copy every step).
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    # Every step reads all n_ctx slots, most of them masked out: the same shape every step,
    # bought with a little arithmetic on slots that are not written yet.
    z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O
    # END SOLUTION


def forward_static(
    model: DemoTransformer,
    tokens: Int[Tensor, "batch new"],
    cache: StaticKeyValueCache,
    slots: Int[Tensor, "new"],
    positions: Int[Tensor, "batch new"],
    real: Bool[Tensor, "batch new"] | None = None,
) -> Float[Tensor, "batch new d_vocab"]:
    """Logits for the new tokens, written to `slots` of `cache` at `positions`. `real` is False
    where a new token is left padding (None: every token is real). No check, no `.item()`, no
    Python branch on a tensor: a decoding step compiles to one graph (`check_step` is the
    caller's, once)."""
    # BEGIN SOLUTION
    if real is None:
        real = torch.ones_like(tokens, dtype=torch.bool)
    cache.mask[:, slots] = real
    # A query reads the real keys up to its own slot, and always its own key (a padding query
    # then has one key to read, not none: no all -inf row, no NaN; chapter 4's reason).
    own = torch.arange(model.cfg.n_ctx, device=tokens.device)[None, :] == slots[:, None]
    allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)  # [batch, 1, new, n_ctx]
    residual = model.embed(tokens) + model.pos_embed.W_pos[positions]
    for block, keys, values in zip(model.blocks, cache.keys, cache.values, strict=True):
        attn_out = attention_static(block.attn, block.ln1(residual), keys, values, slots, allowed)
        residual = residual + attn_out
        residual = residual + block.mlp(block.ln2(residual))
    return model.unembed(model.ln_final(residual))
    # END SOLUTION
