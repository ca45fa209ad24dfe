"""Sampling from probabilities by inverse transform: one uniform per row, no sort, one read.

The token is the first column whose prefix sum exceeds u. A program walks its rows block by
block, carrying the running total in a register: the true prefix is never written anywhere.
A row crosses u in one block only, so each block is first only summed (cheap), and scanned
with tl.cumsum (a prefix sum across the program's threads, the costly part) only when some
row's running total passes u inside it. Compiled for an H100 (benchmarks/sass.py, Triton 3.9:
blocks of 16,384 columns on 16 warps), a block that is only summed runs 213 instructions per
thread and 2 barriers, a scanned one 1,070 and 6.
The row is read once; the output is one integer per row. torch.multinomial(probs, 1) (torch
2.13) reads the rows five times and writes them twice: it checks them (aminmax, sum), writes
exponential noise, writes probs / noise, and takes its argmax.
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from solutions.kernels.runtime import (
    kernel_tensor,
    refuse_empty_rows,
    row_block,
    rows_per_program,
    seed_value,
)


@triton.jit
def inverse_transform_kernel(
    probs_ptr, out_ptr, n_rows, n_cols, seed, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr
):
    """out[r] = the first column c with probs[r, 0] + ... + probs[r, c] > u, where
    u = tl.rand(seed, r); if rounding leaves u above every prefix (a row summing to a little
    under 1), the last column of positive probability; -1 if the row has none (all zeros or
    NaN: the wrapper refuses it). probs is contiguous [n_rows, n_cols], each row summing to 1
    up to rounding; out is int64 [n_rows]."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    u = tl.rand(seed, rows)
    total = tl.zeros((BLOCK_B,), tl.float32)  # the prefix sum at the end of the last block
    chosen = tl.full((BLOCK_B,), -1, tl.int32)
    last_block = tl.full((BLOCK_B,), -1, tl.int32)  # start of the last block with any mass
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        p = tl.load(probs_ptr + rows.to(tl.int64)[:, None] * n_cols + cols[None, :], mask=mask)
        p = tl.where(mask, p.to(tl.float32), 0.0)
        block_total = tl.sum(p, axis=1)
        # A row crosses u in one block only: every other block gives just its sum. The prefix
        # sum (the costly part: a scan across the program's threads) runs only on a block where
        # some row's running total passes u.
        crossing = (chosen < 0) & (total + block_total > u)
        if tl.max(crossing.to(tl.int32), axis=0) > 0:
            prefix = total[:, None] + tl.cumsum(p, axis=1)
            # A column of probability 0 adds nothing to the prefix, so it cannot be the first
            # to exceed u; `p > 0` says so outright, whatever the rounding.
            crossed = (prefix > u[:, None]) & (p > 0)
            first = tl.min(tl.where(crossed, cols[None, :], n_cols), axis=1)
            chosen = tl.where((chosen < 0) & (first < n_cols), first, chosen)
        last_block = tl.where(block_total > 0, start, last_block)
        total += block_total
    # Rounding's fallback (u above every prefix: a row summing to a little under 1): the last
    # column of positive probability, read again from the last block that had any. Still -1
    # for a row of zeros or NaN (the wrapper refuses it). Rare: most programs skip this.
    if tl.min(tl.where(row_ok, chosen, 0), axis=0) < 0:
        cols = tl.maximum(last_block, 0)[:, None] + tl.arange(0, BLOCK_V)[None, :]
        mask = (row_ok & (last_block >= 0))[:, None] & (cols < n_cols)
        p = tl.load(probs_ptr + rows.to(tl.int64)[:, None] * n_cols + cols, mask=mask, other=0.0)
        last_possible = tl.max(tl.where(mask & (p > 0), cols, -1), axis=1)
        chosen = tl.where(chosen < 0, last_possible, chosen)
    tl.store(out_ptr + rows, chosen.to(tl.int64), mask=row_ok)
    # END SOLUTION


def sample_from_probs(probs: Float[Tensor, "batch d_vocab"], seed: int = 0) -> Int[Tensor, "batch"]:
    """One token per row, drawn from `probs` (rows of non-negative numbers summing to 1; not
    checked here, since a check would read the whole tensor again). A row with no positive
    probability (all zeros, or NaN) is a ValueError."""
    seed = seed_value(seed)
    probs = kernel_tensor("probs [batch, d_vocab]", probs, ndim=2)
    n_rows, n_cols = probs.shape
    out = torch.empty(n_rows, dtype=torch.int64, device=probs.device)
    block_v, warps = row_block(n_cols, gpu_block=16384)  # 64 KB of a row in flight
    block_b = rows_per_program(n_rows, block_v)
    inverse_transform_kernel[(triton.cdiv(n_rows, block_b),)](
        probs, out, n_rows, n_cols, seed, BLOCK_B=block_b, BLOCK_V=block_v, num_warps=warps
    )
    return refuse_empty_rows(out, probs, "probs")
