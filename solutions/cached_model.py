"""The DemoTransformer forward pass with a KeyValueCache: compute the new positions only.

These functions read the weights of the chapter-1 modules (`model.blocks[i].attn.W_Q`, ...), so
they work on any DemoTransformer, including one loaded with `load_model`. With an empty cache
they compute what `model(tokens)` computes, up to float rounding.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions import checks
from solutions.attention import Attention
from solutions.kv_cache import KeyValueCache
from solutions.model import DemoTransformer


def causal_mask(n_query: int, n_key: int, device=None) -> Bool[Tensor, "query_pos key_pos"]:
    """True where a key comes AFTER its query. The queries are the LAST n_query of the n_key
    positions: query i sits at position n_key - n_query + i."""
    # BEGIN SOLUTION
    # Query i may see keys up to its own position, offset + i; the diagonal moves right by the
    # number of cached positions. With no cache (offset 0) this is chapter 1's mask.
    offset = n_key - n_query
    ones = torch.ones(n_query, n_key, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=offset + 1)
    # END SOLUTION


def attention_with_cache(
    attn: Attention,
    x: Float[Tensor, "batch new d_model"],
    past_keys: Float[Tensor, "batch n_heads past d_head"],
    past_values: Float[Tensor, "batch n_heads past d_head"],
    allowed: Bool[Tensor, "batch 1 new all"] | Bool[Tensor, "new all"] | None = None,
) -> tuple[
    Float[Tensor, "batch new d_model"],
    Float[Tensor, "batch n_heads all d_head"],
    Float[Tensor, "batch n_heads all d_head"],
]:
    """Attention for the new positions `x` (already layer-normed), reading the cached keys and
    values too (`all` = past + new positions). Returns the output and the keys and values of
    all positions. `allowed` says which keys each query may read (None: all of them)."""
    # BEGIN SOLUTION
    # Every head projects every new position: [batch * new, d_model] @ [n_heads, d_model,
    # d_head] broadcasts to [n_heads, batch * new, d_head]. (x[:, None] @ attn.W_Q gives the
    # same numbers, but PyTorch then copies the weights once per sequence of the batch.)
    rows = x.flatten(0, 1)

    def project(W, b):  # -> [batch, n_heads, new, d_head], the cache's layout
        return (rows @ W + b[:, None]).unflatten(1, x.shape[:2]).transpose(0, 1)

    q, k, v = project(attn.W_Q, attn.b_Q), project(attn.W_K, attn.b_K), project(attn.W_V, attn.b_V)
    # The old positions cost nothing here: their keys and values are read, not recomputed.
    keys = torch.cat([past_keys, k], dim=2)
    values = torch.cat([past_values, v], dim=2)

    # softmax(q k^T / sqrt(d_head) + mask) v in one fused call: chapter 1's attention, the
    # same numbers, with -inf wherever `allowed` is False.
    z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
    # Each head writes through its own slice of W_O, and the heads' outputs add up: chapter 1's
    # einsum over h (and d_head).
    out = torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O
    return out, keys, values
    # END SOLUTION


def start_forward(
    model: DemoTransformer,
    tokens: Int[Tensor, "batch new"],
    cache: KeyValueCache | None,
    attention_mask: Bool[Tensor, "batch new"] | None,
) -> tuple[KeyValueCache, Bool[Tensor, "batch all"]]:
    """Check `forward_with_cache`'s arguments. Returns the cache to extend (an empty one for
    `cache=None`) and the mask of all positions, cached then new: True at real tokens."""
    cfg = model.cfg
    checks.token_ids("tokens [batch, new]", tokens, cfg.d_vocab, ndim=2)
    if tokens.shape[1] < 1:
        raise ValueError("tokens must hold at least one new position")
    if cache is None:
        cache = KeyValueCache.new_empty(cfg, tokens.shape[0], tokens.device, model.embed.W_E.dtype)
    cache.check_next(cfg, tokens)
    if attention_mask is None:
        attention_mask = torch.ones_like(tokens, dtype=torch.bool)
    elif attention_mask.shape != tokens.shape or attention_mask.dtype != torch.bool:
        raise ValueError(
            f"attention_mask must be a bool tensor shaped like tokens {tuple(tokens.shape)}, "
            f"got {attention_mask.dtype} {tuple(attention_mask.shape)}"
        )
    return cache, torch.cat([cache.mask, attention_mask], dim=1)


def positions_and_allowed(
    mask: Bool[Tensor, "batch all"], n_new: int
) -> tuple[Int[Tensor, "batch new"], Bool[Tensor, "batch 1 new all"]]:
    """For the last `n_new` of the positions that `mask` covers (True at real tokens, False at
    left padding): each one's position, the number of real tokens before it in its row, and
    which keys each of their queries may read. A real query reads the real keys up to its own
    column; every query, padding or not, reads its own key."""
    # BEGIN SOLUTION
    # Padding gets position 0 (-1 would index the LAST row of W_pos); nobody reads its result.
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -n_new:]
    n_all = mask.shape[1]
    causal = ~causal_mask(n_new, n_all, device=mask.device)  # [new, all]
    # A padding query sees its own key, so its softmax has no all -inf row: NaN would leak
    # into the real rows through 0 * NaN in the next layer's weighted sum of values.
    column = torch.arange(n_all, device=mask.device)
    own_key = column[None, :] == column[-n_new:, None]  # [new, all]
    # mask[:, None, None, :] is [batch, 1, 1, all]: it broadcasts over heads and queries.
    allowed = causal & (mask[:, None, None, :] | own_key)  # [batch, 1, new, all]
    return positions, allowed
    # END SOLUTION


def explicit_layout(
    model: DemoTransformer,
    mask: Bool[Tensor, "batch all"],
    n_new: int,
    positions: Int[Tensor, "new"] | None,
    allowed: Bool[Tensor, "new all"] | None,
) -> tuple[Int[Tensor, "new"], Bool[Tensor, "new all"]]:
    """Check a caller's own `positions` and `allowed` (chapter 6's lookahead decoding, where
    the new tokens are not one sequence but several branches)."""
    n_all = mask.shape[1]
    if positions is None or allowed is None:
        raise ValueError("give both positions [new] and allowed [new, past + new], or neither")
    if not mask.all():
        raise ValueError("positions and allowed cannot be combined with padding (attention_mask)")
    if positions.shape != (n_new,) or positions.dtype != torch.long:
        raise ValueError(f"positions must be a long tensor of shape ({n_new},), got "
                         f"{positions.dtype} {tuple(positions.shape)}")  # fmt: skip
    if bool((positions < 0).any()) or bool((positions >= model.cfg.n_ctx).any()):
        raise ValueError(f"positions must lie in [0, n_ctx={model.cfg.n_ctx})")
    if allowed.shape != (n_new, n_all) or allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor of shape ({n_new}, {n_all}) (new tokens, "
                         f"cached + new), got {allowed.dtype} {tuple(allowed.shape)}")  # fmt: skip
    own = allowed[:, n_all - n_new :].diagonal()
    if not bool(own.all()):
        raise ValueError("allowed must let every new token read its own key (its diagonal)")
    return positions.to(mask.device), allowed.to(mask.device)


def forward_with_cache(
    model: DemoTransformer,
    tokens: Int[Tensor, "batch new"],
    cache: KeyValueCache | None = None,
    attention_mask: Bool[Tensor, "batch new"] | None = None,
    positions: Int[Tensor, "new"] | None = None,
    allowed: Bool[Tensor, "new all"] | None = None,
) -> tuple[Float[Tensor, "batch new d_vocab"], KeyValueCache]:
    """Logits for the NEW tokens only, given the cache of everything before them, and the
    longer cache. `cache=None` starts from an empty cache: the logits are then those of
    `model(tokens)` (up to float rounding). `attention_mask` (False at left padding) lets the
    rows of a batch hold prompts of different lengths. Chapter 6's lookahead decoding passes
    its own `positions` [new] and `allowed` [new, cached + new] (True where a new token may
    read a key) instead of the causal ones."""
    cache, mask = start_forward(model, tokens, cache, attention_mask)
    n_new, n_all = tokens.shape[1], mask.shape[1]
    if positions is not None or allowed is not None:  # the caller's own layout
        positions, allowed = explicit_layout(model, mask, n_new, positions, allowed)
    elif not mask.all():  # a left-padded batch: section 8's exercise
        positions, allowed = positions_and_allowed(mask, n_new)
    else:  # no padding: `positions` [new] and `allowed` (changes 1 and 2 of section 5)
        # BEGIN SOLUTION
        # The new tokens come after the cached ones.
        positions = torch.arange(cache.length, n_all, device=tokens.device)  # [new]
        # One new token may read every cached key, so the usual decoding step needs no mask.
        allowed = None if n_new == 1 else ~causal_mask(n_new, n_all, device=tokens.device)
        # END SOLUTION
    # The model on the new positions: `logits`, and each layer's `keys` and `values` (change 3)
    # BEGIN SOLUTION
    residual = model.embed(tokens) + model.pos_embed.W_pos[positions]
    keys, values = [], []
    for block, past_k, past_v in zip(model.blocks, cache.keys, cache.values, strict=True):
        attn_out, k, v = attention_with_cache(
            block.attn, block.ln1(residual), past_k, past_v, allowed
        )
        residual = residual + attn_out
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
