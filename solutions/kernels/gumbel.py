"""Gumbel-max sampling from logits in one pass: argmax(logits / T + G), G = -log(-log U).

No softmax and no normalisation: each program reads its rows once, block by block, and keeps
only each row's best noisy score and its column. The uniforms are made in the kernel by
tl.rand(seed, offset), a counter-based generator: the offset row * V + column gives every logit
its own number, so a seed reproduces a run, rows are independent, and an element's noise does
not depend on how the row was cut into blocks (the fused kernel uses the same offsets).
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks
from solutions.kernels.runtime import (
    INTERPRET,
    kernel_tensor,
    next_power_of_2,
    rows_per_program,
    seed_value,
)


@triton.jit
def gumbel_kernel(
    logits_ptr,
    out_ptr,
    n_rows,
    n_cols,
    inv_temperature,
    seed,
    GREEDY: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """out[r] = argmax over columns c of logits[r, c] * inv_temperature + G[r, c], with
    G = -log(-log(u)) and u = tl.rand(seed, r * n_cols + c); the plain argmax when GREEDY.
    logits is contiguous [n_rows, n_cols]; out is int64 [n_rows]."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    best = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    best_col = tl.zeros((BLOCK_B,), tl.int32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(logits_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
        if GREEDY:
            scores = x
        else:
            # The temperature scales the logits only: (x + G) / T has the argmax of x + G.
            u = tl.maximum(tl.rand(seed, offsets), 1.1754944e-38)  # smallest normal float32
            scores = x * inv_temperature - tl.log(-tl.log(u))
        scores = tl.where(mask, scores, float("-inf"))
        block_best = tl.max(scores, axis=1)
        block_col = start + tl.argmax(scores, axis=1)  # argmax is the column within the block
        better = block_best > best  # strictly: on a tie the earlier column stays
        best = tl.where(better, block_best, best)
        best_col = tl.where(better, block_col, best_col)
    tl.store(out_ptr + rows, best_col.to(tl.int64), mask=row_ok)
    # END SOLUTION


def gumbel_sample(
    logits: Float[Tensor, "batch d_vocab"], temperature: float = 1.0, seed: int = 0
) -> Int[Tensor, "batch"]:
    """One token per row, distributed as softmax(logits / temperature); temperature 0 is the
    argmax. The same seed gives the same tokens."""
    checks.number("temperature", temperature, low=0.0)
    seed = seed_value(seed)
    logits = kernel_tensor("logits [batch, d_vocab]", logits, ndim=2)
    n_rows, n_cols = logits.shape
    if n_rows * n_cols >= 2**31:
        raise ValueError(f"logits has {n_rows * n_cols} elements; at most 2**31 - 1 (offsets)")
    out = torch.empty(n_rows, dtype=torch.int64, device=logits.device)
    block_v = min(next_power_of_2(n_cols), 1024 if INTERPRET else 2048)
    block_b = rows_per_program(n_rows, block_v)
    gumbel_kernel[(triton.cdiv(n_rows, block_b),)](
        logits,
        out,
        n_rows,
        n_cols,
        1.0 / temperature if temperature > 0 else 0.0,
        seed,
        GREEDY=temperature == 0,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
    )
    return out
