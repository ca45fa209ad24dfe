"""Sampling fused into the unembedding: softmax(hidden @ W_U^T / T) sampled by Gumbel-max,
without ever writing the [batch, d_vocab] logits to memory.

Each program computes one [BLOCK_B, BLOCK_V] tile of logits in registers (tl.dot over d_model
in blocks of BLOCK_D, accumulated in float32), adds Gumbel noise (gumbel_noise: the numbers
gumbel_kernel adds at the same row and column, so both kernels draw the same token from the
same logits and seed), and writes only each row's best score and column of the tile: two
numbers per row per tile instead of BLOCK_V. A reduction over the tiles, d_vocab / BLOCK_V
numbers per row, picks the token. The kernel reads W_U once per tile of rows, as the matmul
alone does, so it costs about what the matmul costs.
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks
from solutions.kernels.gumbel import gumbel_noise
from solutions.kernels.runtime import INTERPRET, kernel_tensor, next_power_of_2, seed_value


@triton.jit
def fused_matmul_kernel(
    h_ptr,
    w_ptr,
    score_ptr,
    col_ptr,
    n_rows,
    n_vocab,
    d_model,
    n_tiles,
    inv_temperature,
    seed,
    GREEDY: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """For rows tile tl.program_id(0) and vocabulary tile t = tl.program_id(1): the logits
    h[rows] @ w[cols].T (h contiguous [n_rows, d_model], w contiguous [n_vocab, d_model]), each
    times inv_temperature plus the Gumbel noise gumbel_noise(seed, rows, t * BLOCK_V, n_vocab,
    BLOCK_B, BLOCK_V); when GREEDY, the plain logits (inv_temperature is then 0 and unused).
    Stores each row's best score in score[row, t] and its column in col[row, t] (both
    contiguous [n_rows, n_tiles]). UPCAST: convert the loaded
    blocks to float32 before tl.dot (Triton's interpreter holds bfloat16 as raw 16-bit integers,
    and its tl.dot would multiply those; a GPU multiplies bfloat16 directly, on its tensor
    cores)."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    tile = tl.program_id(1)
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < n_rows
    col_ok = cols < n_vocab
    acc = tl.zeros((BLOCK_B, BLOCK_V), tl.float32)
    for d0 in range(0, d_model, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < d_model
        h = tl.load(
            h_ptr + rows.to(tl.int64)[:, None] * d_model + ds[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + cols.to(tl.int64)[:, None] * d_model + ds[None, :],
            mask=col_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        # Accumulate in float32 whatever h and w hold. "ieee": float32 inputs are multiplied
        # in full float32, not rounded to TF32 first (16- and 8-bit inputs ignore it).
        acc = tl.dot(h, tl.trans(w), acc, input_precision="ieee")
    if GREEDY:
        scores = acc
    else:
        # The noise gumbel_kernel adds to logit (row, column): the same generator calls.
        noise = gumbel_noise(seed, rows, tile * BLOCK_V, n_vocab, BLOCK_B, BLOCK_V)
        scores = acc * inv_temperature + noise
    scores = tl.where(col_ok[None, :], scores, float("-inf"))  # columns past the vocabulary
    best = tl.max(scores, axis=1)
    best_col = tile * BLOCK_V + tl.argmax(scores, axis=1)
    out = rows * n_tiles + tile
    tl.store(score_ptr + out, best, mask=row_ok)
    tl.store(col_ptr + out, best_col.to(tl.int64), mask=row_ok)
    # END SOLUTION


def fused_tiles(n_rows: int) -> tuple[int, int, int, dict]:
    """(BLOCK_B, BLOCK_V, BLOCK_D, launch options). On a GPU: from 16 to 64 rows per tile (W_U
    is then read once per 64 rows), 128 columns, d_model in steps of 64, pipelined over 3
    stages. Why at least 16 rows: tl.dot accepts fewer (Triton 3.9 asks only K = BLOCK_D >= 16
    for 16-bit inputs, 8 for float32: min_dot_size in triton/backends/nvidia/compiler.py), but
    the tensor cores multiply 16 rows at a time, so compiled for sm_90 a bf16 tile of 1 or 8
    rows runs the same 16 mma.sync m16n8k16 per step as one of 16. Under the interpreter: many
    rows per program."""
    if INTERPRET:
        return min(max(next_power_of_2(n_rows), 16), 512), 64, 32, {}
    block_b = min(max(next_power_of_2(n_rows), 16), 64)
    return block_b, 128, 64, {"num_warps": 4, "num_stages": 3}


def fused_matmul_sample(
    hidden: Float[Tensor, "batch d_model"],
    W_U: Float[Tensor, "d_vocab d_model"],
    temperature: float = 1.0,
    seed: int = 0,
) -> Int[Tensor, "batch"]:
    """One token per row, distributed as softmax(hidden @ W_U.T / temperature) (temperature 0:
    the argmax), without the logits in memory. hidden and W_U: float32, float16 or bfloat16,
    the same dtype; W_U in HF's layout [d_vocab, d_model]."""
    checks.number("temperature", temperature, low=0.0)
    seed = seed_value(seed)
    hidden = kernel_tensor("hidden [batch, d_model]", hidden, ndim=2)
    W_U = kernel_tensor("W_U [d_vocab, d_model]", W_U, ndim=2)
    if hidden.dtype != W_U.dtype or hidden.dtype not in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    ):
        raise ValueError(
            f"hidden and W_U must share one dtype of float32, float16, bfloat16; got "
            f"{hidden.dtype} and {W_U.dtype}"
        )
    (n_rows, d_model), (n_vocab, d_w) = hidden.shape, W_U.shape
    if d_w != d_model:
        raise ValueError(f"W_U must be [d_vocab, d_model = {d_model}], got {tuple(W_U.shape)}")
    if n_rows * n_vocab >= 2**31:
        raise ValueError(f"batch * d_vocab = {n_rows * n_vocab}; at most 2**31 - 1 (offsets)")
    block_b, block_v, block_d, options = fused_tiles(n_rows)
    n_tiles = triton.cdiv(n_vocab, block_v)
    scores = torch.empty(n_rows, n_tiles, dtype=torch.float32, device=hidden.device)
    cols = torch.empty(n_rows, n_tiles, dtype=torch.int64, device=hidden.device)
    grid = (triton.cdiv(n_rows, block_b), n_tiles)  # row tiles first: neighbours share W's tile
    fused_matmul_kernel[grid](
        hidden,
        W_U,
        scores,
        cols,
        n_rows,
        n_vocab,
        d_model,
        n_tiles,
        1.0 / temperature if temperature > 0 else 0.0,
        seed,
        GREEDY=temperature == 0,
        UPCAST=INTERPRET and hidden.dtype == torch.bfloat16,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
        BLOCK_D=block_d,
        **options,
    )
    # The last step: each row's best tile. d_vocab / BLOCK_V numbers per row, not d_vocab.
    return cols.gather(1, scores.argmax(dim=1, keepdim=True))[:, 0]
