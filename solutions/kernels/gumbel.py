"""Gumbel-max sampling from logits in one pass: argmax(logits / T + G), G = -log(-log U).

No softmax and no normalisation: each program reads its rows once, block by block, and keeps
only each row's best noisy score and its column. The noise is made in the kernel by a
counter-based generator (Philox): four neighbouring columns of a row share one counter and take
one of its four outputs each, so every logit has its own number, a seed reproduces a run, rows
are independent, and an element's noise does not depend on how the row was cut into blocks.
`gumbel_noise` (given) asks the generator for four numbers per call (tl.randint4x) instead of
one (tl.rand runs the whole generator and keeps one of its four outputs): compiled for an H100
(benchmarks/sass.py, Triton 3.9), 88 instructions per column instead of 125 with tl.rand.
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks
from solutions.kernels.runtime import (
    kernel_tensor,
    row_block,
    rows_per_program,
    seed_value,
)


@triton.jit
def gumbel_noise(seed, rows, start, n_cols, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Standard Gumbel noise G[r, c] = -log(-log U[r, c]) for the rows `rows` [BLOCK_B] and the
    BLOCK_V columns from `start` (a multiple of 4). U[r, c] is lane c % 4 of
    tl.randint4x(seed, r * ceil(n_cols / 4) + c // 4): one call of the generator gives four
    neighbouring columns their numbers."""
    n_groups = (n_cols + 3) // 4
    groups = rows[:, None] * n_groups + (start // 4 + tl.arange(0, BLOCK_V // 4))[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, groups)
    bits = tl.join(tl.join(r0, r2), tl.join(r1, r3)).reshape(BLOCK_B, BLOCK_V)  # c % 4 = lane
    # v = 1 - U, uniform in [0, 1), with the fine steps of small floats near 0, where the
    # largest noise values come from: -log U = -log(1 - v) is v (plus v^2 / 2 ...) there, and
    # log(1 - v) would round 1 - v to 1 for v below 2^-25 (capping G near 17).
    v = tl.random.uint_to_uniform_float(bits)
    small = v < 0.0009765625  # 2^-10: three terms of -log(1 - v) are exact to float32
    e = tl.where(small, v + v * v * 0.5 + v * v * v * 0.33333334, -tl.log(1.0 - v))
    return -tl.log(tl.maximum(e, 1.1754944e-38))  # v = 0: the largest noise float32 allows


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
    """out[r] = argmax over columns c of logits[r, c] * inv_temperature + G[r, c], with G the
    noise `gumbel_noise` gives for (row r, column c); the plain argmax when GREEDY. logits is
    contiguous [n_rows, n_cols]; out is int64 [n_rows]; BLOCK_V is a multiple of 4."""
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
            scores = x * inv_temperature + gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)
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
    block_v, warps = row_block(max(n_cols, 4), gpu_block=16384)  # 4 uniforms per call
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
        num_warps=warps,
    )
    return out
