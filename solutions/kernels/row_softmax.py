"""A row-wise softmax in Triton: the programming model on a problem you know.

Each program takes BLOCK_B rows and walks along them BLOCK_V columns at a time. The first pass
keeps an online maximum and a sum of exp(x - max) rescaled whenever the maximum grows; the
second writes exp(x - max) / sum. The row is read twice and written once, whatever its length:
the running max and sum are all that is carried from block to block, in registers.
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from solutions.kernels.runtime import kernel_tensor, row_block, rows_per_program


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """out[r] = softmax(x[r]) for the BLOCK_B rows of this program; x and out are contiguous
    [n_rows, n_cols]. Computes in float32 and stores in out's dtype. A row may hold -inf (a
    masked token), never only -inf."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    row_start = rows.to(tl.int64)[:, None] * n_cols  # int64: n_rows * n_cols may pass 2**31

    # Pass 1: the running max m and sum s of exp(x - m). When a block raises the max, the sum
    # so far is rescaled by exp(old m - new m). While a row has seen only -inf, m is -inf and
    # x - m would be -inf - (-inf) = NaN: subtract 0 instead (every exp is then 0 anyway).
    m = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_B,), tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + row_start + cols[None, :], mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
        m = m_new

    # Pass 2: read the row again and write exp(x - m) / s in the output's dtype. (Rows past
    # n_rows, masked out, have m = -inf and s = 0: shift by 0 and divide by 1 there.)
    m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.where(s == 0.0, 1.0, s)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + row_start + cols[None, :], mask=mask, other=float("-inf"))
        y = tl.exp(x.to(tl.float32) - m[:, None]) / s[:, None]
        tl.store(out_ptr + row_start + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def softmax(x: Float[Tensor, "batch n"]) -> Float[Tensor, "batch n"]:
    """softmax over the last dimension, like torch.softmax(x, -1), for a 2-D float tensor."""
    x = kernel_tensor("x [batch, n]", x, ndim=2)
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    # A GPU reads a block of up to 16,384 columns per step, one row per program; the interpreter
    # prefers fewer, wider operations over many rows, so its blocks hold BLOCK_B x BLOCK_V.
    block_v, warps = row_block(n_cols, gpu_block=16384)
    block_b = rows_per_program(n_rows, block_v)
    grid = (triton.cdiv(n_rows, block_b),)
    softmax_kernel[grid](x, out, n_rows, n_cols, BLOCK_B=block_b, BLOCK_V=block_v, num_warps=warps)
    return out
