"""Chapter 6's speculative rejection sampler as one kernel: same arguments, same layout.

A program takes BLOCK_B rows and decides their k drafts in order (keep draft j iff
u_j * q(x_j) < p(x_j), and only while every earlier draft was kept), then draws the one token
the main model adds: from max(0, p - q) renormalised at the first rejection (from p if that is
all zero), or from the target's last position (the bonus token) when all k were kept. Only the
k drafted tokens' probabilities are gathered for the decisions; the one distribution that is
sampled is read twice (its mass, then the crossing). The uniforms come from the caller's
generator, drawn by the wrapper, so that chapter 6's `generator` argument keeps its meaning.
"""

import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions.kernels.runtime import (
    DEVICE,
    kernel_tensor,
    row_block,
    rows_per_program,
)
from solutions.speculative import check_rejection_args


@triton.jit
def _residual_block(
    target_ptr,
    draft_ptr,
    target_row,
    draft_row,
    use_p,
    row_ok,
    start,
    n_vocab,
    BLOCK_V: tl.constexpr,
):
    """One block of the distribution the main model's token is drawn from: the target row
    where `use_p`, else max(0, target - draft)."""
    cols = start + tl.arange(0, BLOCK_V)
    mask = row_ok[:, None] & (cols < n_vocab)[None, :]
    p = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=0.0)
    q = tl.load(
        draft_ptr + draft_row[:, None] + cols[None, :], mask=mask & ~use_p[:, None], other=0.0
    )
    return tl.maximum(p.to(tl.float32) - q.to(tl.float32), 0.0)


@triton.jit
def _mass(
    target_ptr,
    draft_ptr,
    target_row,
    draft_row,
    use_p,
    row_ok,
    n_vocab,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The total of each row's `_residual_block`s: the mass of the distribution to sample."""
    mass = tl.zeros((BLOCK_B,), tl.float32)
    for start in range(0, n_vocab, BLOCK_V):
        r = _residual_block(
            target_ptr, draft_ptr, target_row, draft_row, use_p, row_ok, start, n_vocab, BLOCK_V
        )
        mass += tl.sum(r, axis=1)
    return mass


@triton.jit
def _row_argmax(ptr, row_start, row_ok, n_cols, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """The column of each row's largest value (the first, on a tie), block by block."""
    best = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    best_col = tl.zeros((BLOCK_B,), tl.int32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(ptr + row_start[:, None] + cols[None, :], mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        block_best = tl.max(x, axis=1)
        better = block_best > best
        best = tl.where(better, block_best, best)
        best_col = tl.where(better, start + tl.argmax(x, axis=1), best_col)
    return best_col


@triton.jit
def rejection_kernel(
    target_ptr,
    draft_ptr,
    draft_tokens_ptr,
    u_ptr,
    out_ptr,
    accepted_ptr,
    n_rows,
    k,
    n_vocab,
    GREEDY: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """target [n_rows, k + 1, n_vocab], draft [n_rows, k, n_vocab], draft_tokens int64
    [n_rows, k], u float32 [n_rows, k + 1] (all contiguous). Writes out int64 [n_rows, k + 1]
    (filled with -1 by the caller): the accepted drafts, then the recovered token (from
    max(0, p - q), or from p where that has no mass) or the bonus token; and accepted (int8,
    0/1) [n_rows, k]. GREEDY: keep a draft iff it is the target's argmax, and
    add the target's argmax."""
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    going = row_ok  # every draft so far was kept
    n_accepted = tl.zeros((BLOCK_B,), tl.int32)
    for j in range(0, k):
        x = tl.load(draft_tokens_ptr + rows64 * k + j, mask=row_ok, other=0)
        target_row = (rows64 * (k + 1) + j) * n_vocab
        if GREEDY:
            keep = x == _row_argmax(target_ptr, target_row, row_ok, n_vocab, BLOCK_B, BLOCK_V)
        else:
            p = tl.load(target_ptr + target_row + x, mask=row_ok, other=0.0)
            q = tl.load(draft_ptr + (rows64 * k + j) * n_vocab + x, mask=row_ok, other=1.0)
            u = tl.load(u_ptr + rows64 * (k + 1) + j, mask=row_ok, other=1.0)
            keep = u * q < p  # probability min(1, p / q), without dividing
        keep = keep & going  # a draft after a rejection never counts
        tl.store(accepted_ptr + rows64 * k + j, keep.to(tl.int8), mask=row_ok)
        tl.store(out_ptr + rows64 * (k + 1) + j, tl.where(keep, x, -1), mask=row_ok & keep)
        n_accepted += keep.to(tl.int32)
        going = keep

    # The main model's token, at column n_accepted.
    at = n_accepted.to(tl.int64)
    target_row = (rows64 * (k + 1) + at) * n_vocab
    if GREEDY:
        token = _row_argmax(target_ptr, target_row, row_ok, n_vocab, BLOCK_B, BLOCK_V)
    else:
        use_p = n_accepted == k  # the bonus token comes from p itself
        draft_row = (rows64 * k + tl.minimum(at, k - 1)) * n_vocab
        # Pass 1: the mass of the distribution to sample (the residual is not normalised).
        mass = _mass(
            target_ptr, draft_ptr, target_row, draft_row, use_p, row_ok, n_vocab, BLOCK_B, BLOCK_V
        )
        # A residual of zero mass (p <= q everywhere: p and q equal up to rounding, and the
        # rejection came from that rounding): draw from p instead, as for a bonus token.
        empty = row_ok & (mass <= 0)
        if tl.sum(empty.to(tl.int32), axis=0) > 0:
            use_p = use_p | empty
            p_mass = _mass(
                target_ptr,
                draft_ptr,
                target_row,
                draft_row,
                use_p,
                row_ok,
                n_vocab,
                BLOCK_B,
                BLOCK_V,
            )
            mass = tl.where(empty, p_mass, mass)
        # Pass 2: the first column whose prefix exceeds u * mass (else the last possible one).
        threshold = tl.load(u_ptr + rows64 * (k + 1) + k, mask=row_ok, other=0.0) * mass
        prefix_end = tl.zeros((BLOCK_B,), tl.float32)
        token = tl.full((BLOCK_B,), -1, tl.int32)
        last_possible = tl.full((BLOCK_B,), -1, tl.int32)
        for start in range(0, n_vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            r = _residual_block(
                target_ptr, draft_ptr, target_row, draft_row, use_p, row_ok, start, n_vocab, BLOCK_V
            )
            prefix = prefix_end[:, None] + tl.cumsum(r, axis=1)
            first = tl.min(
                tl.where((prefix > threshold[:, None]) & (r > 0), cols[None, :], n_vocab), 1
            )
            token = tl.where((token < 0) & (first < n_vocab), first, token)
            last_possible = tl.maximum(last_possible, tl.max(tl.where(r > 0, cols[None, :], -1), 1))
            prefix_end = tl.max(prefix, axis=1)
        token = tl.where(token < 0, last_possible, token)
    tl.store(out_ptr + rows64 * (k + 1) + at, token.to(tl.int64), mask=row_ok)
    # END SOLUTION


def rejection_sample(
    target_probs: Float[Tensor, "batch k_plus_1 d_vocab"],
    draft_probs: Float[Tensor, "batch k d_vocab"],
    draft_tokens: Int[Tensor, "batch k"],
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> tuple[Int[Tensor, "batch k_plus_1"], Bool[Tensor, "batch k"]]:
    """Chapter 6's `rejection_sample`, as one kernel: `tokens` [batch, k + 1] (accepted drafts,
    then the recovered or bonus token, then -1) and `accepted` [batch, k]."""
    k = check_rejection_args(target_probs, draft_probs, draft_tokens, greedy)
    target_probs = kernel_tensor("target_probs [batch, k + 1, d_vocab]", target_probs, ndim=3)
    draft_probs = kernel_tensor("draft_probs [batch, k, d_vocab]", draft_probs, ndim=3)
    draft_tokens = kernel_tensor("draft_tokens [batch, k]", draft_tokens, 2, floating=False)
    batch, _, n_vocab = target_probs.shape
    # The generator decides, as in chapter 6: drawn where it lives, then moved to the kernels.
    where = generator.device if generator is not None else DEVICE
    u = torch.rand(batch, k + 1, generator=generator, device=where).to(DEVICE)
    out = torch.full((batch, k + 1), -1, dtype=torch.int64, device=DEVICE)
    accepted = torch.zeros(batch, k, dtype=torch.int8, device=DEVICE)
    block_v, _ = row_block(n_vocab, gpu_block=4096)
    block_b = rows_per_program(batch, block_v)
    rejection_kernel[(triton.cdiv(batch, block_b),)](
        target_probs,
        draft_probs,
        draft_tokens.long(),
        u,
        out,
        accepted,
        batch,
        k,
        n_vocab,
        GREEDY=greedy,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
    )
    return out, accepted.bool()
