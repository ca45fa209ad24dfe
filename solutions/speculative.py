"""Speculative sampling: a cheap drafter guesses k tokens, the main model checks them all in one
pass, and a rejection sampler decides which to keep, so that what comes out is distributed
exactly as if the main model had sampled every token itself.

The batched sampler's `tokens` has the layout of vLLM's rejection sampler
(vllm/v1/sample/rejection_sampler.py, which returns only this tensor): per row the accepted
draft tokens, then one token from the main model (the *recovered* token at the first
rejection, or the *bonus* token when all k were accepted), then -1. The course also returns
`accepted`, True up to the first rejection only (its own convention).
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions import checks


def rejection_sample_one(
    target_probs: Float[Tensor, "d_vocab"],
    draft_probs: Float[Tensor, "d_vocab"],
    generator: torch.Generator | None = None,
) -> tuple[int, bool]:
    """One token distributed exactly as `target_probs` (p), from a draft token drawn from
    `draft_probs` (q): keep the draft token x with probability min(1, p(x) / q(x)); otherwise
    draw from max(0, p - q), renormalised (from p if that is all zero: p and q equal up to
    rounding). Returns (token, whether the draft was kept)."""
    checks.probability_pair("target_probs", target_probs, "draft_probs", draft_probs, ndim=1)
    # BEGIN SOLUTION
    x = int(torch.multinomial(draft_probs, 1, generator=generator))
    # u < p/q with probability min(1, p/q); written u * q < p, it needs no division by q.
    u = torch.rand((), generator=generator, device=draft_probs.device)
    if u * draft_probs[x] < target_probs[x]:
        return x, True
    # Rejected: the draft over-proposed x. The mass p lacks relative to q is where p > q.
    residual = (target_probs - draft_probs).clamp(min=0)
    if residual.sum() <= 0:
        # p <= q everywhere: p and q are equal up to rounding, and the rejection came from that
        # rounding. Nothing is left over: the token comes from p itself.
        residual = target_probs
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False
    # END SOLUTION


def acceptance_rate(
    target_probs: Float[Tensor, "... d_vocab"], draft_probs: Float[Tensor, "... d_vocab"]
) -> Float[Tensor, "..."]:
    """The probability that rejection sampling keeps the draft token: sum_x min(p(x), q(x))."""
    # BEGIN SOLUTION
    # P(keep) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(q(x), p(x)).
    return torch.minimum(target_probs, draft_probs).sum(dim=-1)
    # END SOLUTION


def check_rejection_args(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, greedy: bool
) -> int:
    """ValueErrors for what `rejection_sample` cannot take. Returns k."""
    checks.probabilities("target_probs [batch, k + 1, d_vocab]", target_probs, ndim=3)
    batch, k1, d_vocab = target_probs.shape
    if k1 < 2:
        raise ValueError(f"target_probs must cover k + 1 >= 2 positions, got {k1}")
    checks.token_ids("draft_tokens [batch, k]", draft_tokens, d_vocab, ndim=2)
    if tuple(draft_tokens.shape) != (batch, k1 - 1):
        raise ValueError(
            f"draft_tokens must be [batch, k] = {(batch, k1 - 1)} to match target_probs "
            f"{tuple(target_probs.shape)}, got {tuple(draft_tokens.shape)}"
        )
    checks.probabilities("draft_probs [batch, k, d_vocab]", draft_probs, ndim=3)
    if tuple(draft_probs.shape) != (batch, k1 - 1, d_vocab):
        raise ValueError(
            f"draft_probs must be [batch, k, d_vocab] = {(batch, k1 - 1, d_vocab)} to match "
            f"target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}"
        )
    if not greedy:
        q = draft_probs.gather(-1, draft_tokens[..., None])
        if bool((q <= 0).any()):
            row, pos = (q[..., 0] <= 0).nonzero()[0].tolist()
            raise ValueError(
                f"draft_tokens[{row}, {pos}] has draft probability 0: a drafter cannot propose "
                "a token its own distribution rules out"
            )
    return k1 - 1


def rejection_sample(
    target_probs: Float[Tensor, "batch k_plus_1 d_vocab"],
    draft_probs: Float[Tensor, "batch k d_vocab"],
    draft_tokens: Int[Tensor, "batch k"],
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> tuple[Int[Tensor, "batch k_plus_1"], Bool[Tensor, "batch k"]]:
    """Decide k draft tokens per row at once. Returns `tokens` [batch, k + 1]: the accepted
    draft tokens, then the recovered token (at the first rejection: from max(0, p - q)
    renormalised, or from p where that is all zero) or the bonus token (drawn from
    target_probs[:, k] when all k were accepted), then -1; and `accepted` [batch, k], True up
    to the first rejection only. With `greedy`, a draft token is kept iff it is the target's
    argmax, and the recovered or bonus token is the target's argmax."""
    k = check_rejection_args(target_probs, draft_probs, draft_tokens, greedy)
    batch = target_probs.shape[0]
    # BEGIN SOLUTION
    rows = torch.arange(batch, device=target_probs.device)
    if greedy:
        best = target_probs.argmax(dim=-1)  # [batch, k + 1]
        keep = draft_tokens == best[:, :k]
    else:
        p = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]  # [batch, k]
        q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
        u = torch.rand(p.shape, generator=generator, device=p.device)
        keep = u * q < p  # probability min(1, p/q), no division
    # Only the run of kept tokens before the first rejection counts: a later token was drafted
    # after a token the main model did not take.
    accepted = keep.long().cumprod(dim=1).bool()  # [batch, k]
    n_accepted = accepted.sum(dim=1)  # [batch]: also the column of the main model's token

    if greedy:
        next_token = best[rows, n_accepted]
    else:
        # Where the first rejection happened: sample max(0, p - q), renormalised. All k
        # accepted: the bonus token, from the main model's distribution after the last draft.
        at = n_accepted.clamp(max=k - 1)
        residual = (target_probs[rows, at] - draft_probs[rows, at]).clamp(min=0)
        # A residual of zero mass (p <= q everywhere: equal up to rounding): draw from p.
        empty = residual.sum(dim=-1, keepdim=True) <= 0
        residual = torch.where(empty, target_probs[rows, at], residual)
        residual = residual / residual.sum(dim=-1, keepdim=True)
        dist = torch.where((n_accepted == k)[:, None], target_probs[:, k], residual)
        next_token = torch.multinomial(dist, 1, generator=generator)[:, 0]

    tokens = torch.full((batch, k + 1), -1, dtype=torch.long, device=target_probs.device)
    tokens[:, :k] = torch.where(accepted, draft_tokens, -1)
    tokens[rows, n_accepted] = next_token
    return tokens, accepted
    # END SOLUTION
