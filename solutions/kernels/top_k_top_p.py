"""Exact top-k and top-p sampling without sorting: FlashInfer's dual-pivot rejection sampling.

The kept set is {x : p_x >= tau} for a threshold tau nobody computes. Membership of one token j
needs one pass: top-k keeps j iff fewer than k tokens are strictly more likely (ties with the
k-th kept, as in chapter 3); top-p keeps j iff the strictly more likely tokens hold less than
top_p of the mass. So: draw j from p restricted to {p > low}; keep it if it passes, else raise
low and draw again. Every draw's candidates contain the whole kept set, so an accepted draw is
an exact sample of the renormalised kept distribution.

The second pivot bounds the rounds: (low, high] always contains tau. Each round tests
pivot0 = p_j and pivot1 = (p_j + high) / 2 in the same pass: pivot0 passes -> accept; only
pivot1 passes -> (low, high] = (pivot0, pivot1]; neither -> low = pivot1. The interval at least
halves, and once it is shorter than gap = tau - (largest dropped probability) every candidate
is kept: at most 2 + ceil(log2(1 / gap)) rounds. In float32 the interval cannot halve more than
about 150 times before low and high are neighbouring floats (and then every candidate is kept),
so MAX_ROUNDS = 256 is never reached; if it were, the last draw would be returned. Each round
reads the row twice; typical language-model rows need a few rounds, a sort reads it many times.
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
from solutions.sampling import check_sampling_args

MAX_ROUNDS = 256


def top_p_one_pivot(
    probs: Float[Tensor, "d_vocab"], top_p: float, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """The idea in PyTorch, for one row (summing to 1), with one pivot: a token of the top-p set,
    renormalised, and the number of rounds it took. Each round draws j from p restricted to
    {p > low} and keeps it if the tokens strictly more likely than j hold less than top_p;
    otherwise every token at most as likely as j is out, and the next round draws only among
    the tokens more likely than j."""
    if top_p is None:
        raise ValueError("top_p must be a number in (0, 1], got None")
    check_sampling_args(top_p=top_p)
    if not isinstance(probs, Tensor) or probs.ndim != 1 or not probs.is_floating_point():
        raise ValueError("probs must be a floating tensor of shape [d_vocab]")
    low, rounds = 0.0, 0
    while True:
        # BEGIN SOLUTION
        rounds += 1
        candidates = torch.where(probs > low, probs, 0.0)  # the kept set is always inside
        token = int(torch.multinomial(candidates, 1, generator=generator))
        pivot = probs[token]
        if float(probs[probs > pivot].sum()) < top_p:  # strictly more likely: less than top_p
            return token, rounds
        low = float(pivot)
        # END SOLUTION


@triton.jit
def top_k_top_p_kernel(
    probs_ptr,
    out_ptr,
    rounds_ptr,
    n_rows,
    n_cols,
    top_k,
    top_p,
    seed,
    MODE: tl.constexpr,  # 0: plain sampling, 1: top-k, 2: top-p
    MAX_ROUNDS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """out[r]: a token drawn from probs[r] restricted to its top-k (MODE 1) or top-p (MODE 2)
    set, renormalised (MODE 0: from all of probs[r]); rounds[r]: how many draws it took. Round
    i of row r draws with u = tl.rand(seed, r * MAX_ROUNDS + i). A row with no positive
    probability (all zeros, or NaN) gets token -1 after 0 rounds. probs is contiguous
    [n_rows, n_cols]; out is int64 [n_rows], rounds int32 [n_rows]."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    row_base = rows.to(tl.int64) * n_cols
    row_start = row_base[:, None]

    low = tl.zeros((BLOCK_B,), tl.float32)  # candidates: p > low
    high = tl.full((BLOCK_B,), 1.0, tl.float32)  # tau <= high
    # The mass of the candidates: the whole row's, 1 up to rounding, in the first round (no pass
    # just to sum the row: the first draw's running prefix ends at its total, as FlashInfer
    # takes it).
    mass = tl.full((BLOCK_B,), 1.0, tl.float32)
    total = tl.full((BLOCK_B,), 1.0, tl.float32)
    token = tl.full((BLOCK_B,), -1, tl.int32)
    rounds = tl.zeros((BLOCK_B,), tl.int32)
    done = ~row_ok
    i = 0
    while tl.sum((~done).to(tl.int32), axis=0) > 0:
        # Draw j from p restricted to {p > low}: inverse transform, u scaled by their mass.
        u = tl.rand(seed, rows * MAX_ROUNDS + i) * mass
        prefix_end = tl.zeros((BLOCK_B,), tl.float32)
        j = tl.full((BLOCK_B,), -1, tl.int32)
        last_candidate = tl.full((BLOCK_B,), -1, tl.int32)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            p = tl.load(probs_ptr + row_start + cols[None, :], mask=mask, other=0.0)
            q = tl.where(p.to(tl.float32) > low[:, None], p.to(tl.float32), 0.0)
            prefix = prefix_end[:, None] + tl.cumsum(q, axis=1)
            first = tl.min(tl.where((prefix > u[:, None]) & (q > 0), cols[None, :], n_cols), 1)
            j = tl.where((j < 0) & (first < n_cols), first, j)
            last_candidate = tl.maximum(
                last_candidate, tl.max(tl.where(q > 0, cols[None, :], -1), axis=1)
            )
            prefix_end = tl.max(prefix, axis=1)
        j = tl.where(j < 0, last_candidate, j)  # rounding left u above every prefix
        if i == 0:  # the first draw's candidates are the whole row: its prefix ends at the total
            total = prefix_end
        # A row with nothing to sample (all zeros, or NaN: NaN > 0 is false) has no candidate:
        # it stops with token -1 and 0 rounds (the wrapper refuses it).
        done = done | (j < 0)
        p_j = tl.load(probs_ptr + row_base + j, mask=row_ok & (j >= 0), other=0.0)
        pivot0 = p_j.to(tl.float32)
        pivot1 = (pivot0 + high) * 0.5

        # One pass: the mass and the count of tokens strictly above each pivot.
        mass0 = tl.zeros((BLOCK_B,), tl.float32)
        mass1 = tl.zeros((BLOCK_B,), tl.float32)
        count0 = tl.zeros((BLOCK_B,), tl.int32)
        count1 = tl.zeros((BLOCK_B,), tl.int32)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            p = tl.load(probs_ptr + row_start + cols[None, :], mask=mask, other=0.0)
            p = p.to(tl.float32)
            above0 = p > pivot0[:, None]
            above1 = p > pivot1[:, None]
            mass0 += tl.sum(tl.where(above0, p, 0.0), axis=1)
            mass1 += tl.sum(tl.where(above1, p, 0.0), axis=1)
            count0 += tl.sum(above0.to(tl.int32), axis=1)
            count1 += tl.sum(above1.to(tl.int32), axis=1)

        if MODE == 1:
            keep0 = count0 < top_k
            keep1 = count1 < top_k
        elif MODE == 2:
            keep0 = mass0 < top_p * total
            keep1 = mass1 < top_p * total
        else:
            keep0 = row_ok
            keep1 = row_ok
        keep0 = keep0 | (i == MAX_ROUNDS - 1)  # never reached (see the module's docstring)
        active = ~done
        token = tl.where(active & keep0, j, token)
        rounds = tl.where(active, i + 1, rounds)
        # Rejected: every token at most as likely as j is out, and so is every token at most
        # as likely as pivot1 unless pivot1 passed, in which case tau <= pivot1.
        narrow = active & ~keep0 & keep1
        skip = active & ~keep0 & ~keep1
        low = tl.where(narrow, pivot0, tl.where(skip, pivot1, low))
        high = tl.where(narrow, pivot1, high)
        mass = tl.where(narrow, mass0, tl.where(skip, mass1, mass))
        done = done | keep0
        i += 1
    tl.store(out_ptr + rows, token.to(tl.int64), mask=row_ok)
    tl.store(rounds_ptr + rows, rounds, mask=row_ok)
    # END SOLUTION


def top_k_top_p_sample(
    probs: Float[Tensor, "batch d_vocab"],
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    return_rounds: bool = False,
) -> Int[Tensor, "batch"] | tuple[Int[Tensor, "batch"], Int[Tensor, "batch"]]:
    """One token per row from the top-k or the top-p set of `probs` (rows summing to 1),
    renormalised, without sorting; neither: plain sampling. With `return_rounds`, also how many
    rounds each row took. A row with no positive probability (all zeros, or NaN) is a
    ValueError."""
    use_top_k, use_top_p = check_sampling_args(top_k=top_k, top_p=top_p)
    seed = seed_value(seed)
    probs = kernel_tensor("probs [batch, d_vocab]", probs, ndim=2)
    n_rows, n_cols = probs.shape
    if n_rows * MAX_ROUNDS >= 2**31:
        raise ValueError(f"probs has {n_rows} rows; at most {2**31 // MAX_ROUNDS - 1}")
    out = torch.empty(n_rows, dtype=torch.int64, device=probs.device)
    rounds = torch.empty(n_rows, dtype=torch.int32, device=probs.device)
    block_v, warps = row_block(n_cols, gpu_block=8192)  # more state per column: 8,192
    block_b = rows_per_program(n_rows, block_v)
    top_k_top_p_kernel[(triton.cdiv(n_rows, block_b),)](
        probs,
        out,
        rounds,
        n_rows,
        n_cols,
        top_k if use_top_k else n_cols,
        top_p if use_top_p else 1.0,
        seed,
        MODE=1 if use_top_k else 2 if use_top_p else 0,
        MAX_ROUNDS=MAX_ROUNDS,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
        num_warps=warps,
    )
    refuse_empty_rows(out, probs, "probs")
    return (out, rounds) if return_rounds else out
