"""Rotary position embeddings (RoPE; Su et al., 2021): position enters attention by turning
each query and key, pair of coordinates by pair, through an angle proportional to its position.

Pair i of a head turns by `position * theta ** (-2i / d_head)`. Which coordinates form a pair
is a layout choice, fixed by the checkpoint: HF's Llama (and this course) pairs coordinate i
with i + d_head/2 (`rotate_half`); the RoFormer paper and Meta's original code pair neighbours
(2i, 2i + 1). `interleaved_to_half_split` is the permutation between the two.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks


def rope_cos_sin(
    positions: Int[Tensor, "*batch posn"], d_head: int, theta: float
) -> tuple[Float[Tensor, "*batch posn d_head"], Float[Tensor, "*batch posn d_head"]]:
    """The cosines and sines of each position's angles, in the half-split layout: column i and
    column i + d_head/2 hold pair i's angle, `position * theta ** (-2i / d_head)`."""
    if checks.integer("d_head", d_head, low=2) % 2:
        raise ValueError(f"d_head must be even (RoPE turns pairs of coordinates), got {d_head}")
    checks.positive("theta", theta)
    # BEGIN SOLUTION
    # One frequency per pair, from 1 (pair 0) down to theta ** (-(d_head - 2) / d_head) (the
    # last pair): fast pairs tell near positions apart, slow pairs far ones. Made on the
    # positions' device.
    exponents = torch.arange(0, d_head, 2, device=positions.device).float() / d_head
    inv_freq = 1.0 / theta**exponents  # [d_head / 2]: 2i / d_head for i = 0 .. d_head/2 - 1
    angles = positions.float()[..., None] * inv_freq  # [*batch, posn, d_head / 2]
    # Half-split: pair i is (column i, column i + d_head/2), so both halves hold the same angles.
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()
    # END SOLUTION


def rotate_half(x: Float[Tensor, "... d_head"]) -> Float[Tensor, "... d_head"]:
    """(x1, x2) -> (-x2, x1) on the two halves: each pair (a, b) becomes (-b, a), a quarter turn."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(
    x: Float[Tensor, "batch heads posn d_head"],
    cos: Float[Tensor, "batch posn d_head"],
    sin: Float[Tensor, "batch posn d_head"],
) -> Float[Tensor, "batch heads posn d_head"]:
    """Turn every pair of every head of every position by its angle; the result has x's dtype
    (a model in bfloat16 turns its queries and keys in bfloat16, as HF's does). cos and sin
    come from `rope_cos_sin` of positions [batch, posn], one row per text: the model's own
    callers give it that layout."""
    # BEGIN SOLUTION
    # A pair (a, b) turned by angle t is (a cos t - b sin t, b cos t + a sin t); rotate_half
    # supplies (-b, a). Every head of a position turns by the same angles. The angles were
    # computed in float32; multiplied as they are, they would make 16-bit queries and keys
    # float32 while the values stay 16-bit (HF's LlamaRotaryEmbedding casts them too).
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # broadcast over heads
    return x * cos + rotate_half(x) * sin
    # END SOLUTION


def apply_rope_interleaved(
    x: Float[Tensor, "batch heads posn d_head"], positions: Int[Tensor, "batch posn"], theta: float
) -> Float[Tensor, "batch heads posn d_head"]:
    """The RoFormer paper's layout, as Meta's Llama code writes it: neighbours (2i, 2i + 1) are
    the real and imaginary parts of one complex number, turned by multiplying by e^(i angle)."""
    d_head = x.shape[-1]
    exponents = torch.arange(0, d_head, 2, device=x.device).float() / d_head
    angles = positions.float()[..., None] / theta**exponents  # [batch, posn, d_head / 2]
    turn = torch.polar(torch.ones_like(angles), angles)[:, None]  # e^(i angle), over heads
    pairs = torch.view_as_complex(x.float().unflatten(-1, (d_head // 2, 2)).contiguous())
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


def interleaved_to_half_split(d_head: int) -> Int[Tensor, "d_head"]:
    """The order of a head's coordinates that turns interleaved pairs into half-split ones:
    coordinates 0, 2, 4, ... first, then 1, 3, 5, .... Applied to the output rows of W_Q and W_K
    (what HF's Llama conversion script does to Meta's checkpoints), it makes `apply_rope` give
    the same scores as `apply_rope_interleaved` on the original weights."""
    return torch.cat([torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)])
