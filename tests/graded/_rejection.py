"""Rejection sampling for speculative decoding, graded against exact probabilities: the
shared body of chapter 6's `rejection_sample` tests and chapter 10's kernel of the same contract.

Ground truth is the definition, not the course's code: the output at every position must be
distributed as the target p, whatever the draft q; the draft is kept with probability
sum_x min(p(x), q(x)); after a rejection the token follows max(0, p - q) renormalised; and the
layout (accepted prefix, one main-model token, then -1) is checked exactly on inputs where every
outcome is forced. Each check takes the sampler to grade and the device of its tensors.
"""

from __future__ import annotations

import pytest
import torch

from tests.graded._oracles import assert_untouched
from tests.support import ALPHA, assert_rows_independent, assert_samples_follow, follows

V = 6
# Pairs (p, q) on a 6-token vocabulary: q is 0 where p is not (token 0 of OVERLAP) and p is 0
# where q is not (token 5); identical; disjoint supports; a sharp p under a flat q.
OVERLAP = ([0.35, 0.25, 0.2, 0.1, 0.1, 0.0], [0.0, 0.1, 0.2, 0.3, 0.2, 0.2])
IDENTICAL = ([0.3, 0.1, 0.2, 0.15, 0.05, 0.2], [0.3, 0.1, 0.2, 0.15, 0.05, 0.2])
DISJOINT = ([0.5, 0.5, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.25, 0.25, 0.25, 0.25])
SHARP = ([0.8, 0.1, 0.05, 0.05, 0.0, 0.0], [0.2, 0.2, 0.15, 0.15, 0.15, 0.15])
PAIRS = {"overlap": OVERLAP, "identical": IDENTICAL, "disjoint": DISJOINT, "sharp": SHARP}


def tensors(pair) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = (torch.tensor(x, dtype=torch.float32) for x in pair)
    return p, q


def residual_of(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), renormalised: the distribution of a token that replaces a rejected one."""
    r = [max(0.0, float(a) - float(b)) for a, b in zip(p, q, strict=True)]
    return torch.tensor(r, dtype=torch.float64) / sum(r)


def min_mass(p: torch.Tensor, q: torch.Tensor) -> float:
    return sum(min(float(a), float(b)) for a, b in zip(p, q, strict=True))


def assert_rate(hits: torch.Tensor, rate: float, what: str) -> None:
    """`hits` (bools) look like coin flips of probability `rate` (false failure ALPHA)."""
    flips = hits.long()
    assert_samples_follow(flips, torch.tensor([1 - rate, rate]), what)


# Known mistakes, recognised from one position's outcomes (only to word a failure message).
FORGOT_Q = (
    "a draft x is kept with probability p(x), as if q(x) were missing from the test: keep it "
    "with probability min(1, p(x) / q(x)), that is when u * q(x) < p(x)"
)
UPSIDE_DOWN = (
    "a draft x is kept with probability min(1, q(x) / p(x)): the ratio is upside down. Keep it "
    "with probability min(1, p(x) / q(x)), that is when u * q(x) < p(x)"
)
DRAFT_FROM_P = (
    "the draft is kept as often as a draft drawn from p would be: is the draft x drawn from p "
    "instead of q? It must come from q (draft_probs), the draft model's distribution, and be "
    "kept with probability min(1, p(x) / q(x))"
)
NEVER_KEPT = (
    "no draft was ever reported as kept, though a draft passes u * q(x) < p(x) with probability "
    "sum min(p, q) = {a:.2f}: return True with a kept draft"
)
RESAMPLED_FROM_P = (
    "after a rejection the token follows p itself, not max(0, p - q) renormalised: p counts "
    "again the tokens the draft already covers. Resample from the residual max(0, p - q)"
)
RESAMPLED_FROM_ABS = (
    "after a rejection the token follows |p - q|, not max(0, p - q): the tokens q proposes more "
    "often than p wants come back. Clamp the difference at 0 (clamp(min=0)), do not take abs()"
)


def _bernoulli(rate: float) -> torch.Tensor:
    return torch.tensor([1 - rate, rate], dtype=torch.float64)


def diagnose_position(tokens, kept, p, q) -> str | None:
    """The known mistake that one position's outcomes show, if any: `tokens` and `kept` (bools)
    over the rows that reached the position, p and q its distributions. Statistical
    (`follows`), and only used to word a failure: a correct sampler is never judged by it."""
    tokens, kept = tokens.cpu().flatten(), kept.cpu().flatten().bool()
    p, q = p.double().cpu(), q.double().cpu()
    if kept.numel() == 0:
        return None
    a = min_mass(p, q)
    if a > 0.05 and not bool(kept.any()):
        return NEVER_KEPT.format(a=a)
    if not follows(kept.long(), _bernoulli(a)):
        # Each known wrong rule keeps x with its own probability: both the kept rate and the
        # kept tokens must fit it (a rate alone can fit by chance, e.g. with shared uniforms).
        safe_p = torch.where(p > 0, p, 1.0)
        safe_q = torch.where(q > 0, q, 1.0)
        upside = torch.where(p > 0, torch.clamp(q / safe_p, max=1.0), 1.0)
        from_p = torch.where(q > 0, torch.clamp(p / safe_q, max=1.0), 1.0)
        rules = ((q * p, FORGOT_Q), (q * upside, UPSIDE_DOWN), (p * from_p, DRAFT_FROM_P))
        for kept_mass, sentence in rules:
            rate = float(kept_mass.sum())
            if (
                abs(rate - a) > 0.02
                and follows(kept.long(), _bernoulli(rate))
                and follows(tokens[kept], kept_mass)
            ):
                return sentence
        return None
    rejected = tokens[~kept]
    if a < 1 and rejected.numel() and not follows(rejected, residual_of(p, q)):
        if follows(rejected, p):
            return RESAMPLED_FROM_P
        if follows(rejected, (p - q).abs()):
            return RESAMPLED_FROM_ABS
    return None


def diagnosed(diagnosis: str | None, err: AssertionError, where: str) -> AssertionError:
    """`err`, led by the diagnosis when there is one (its first line is what a learner reads)."""
    if diagnosis is None:
        return err
    return AssertionError(f"{where}: {diagnosis}.\n{err}")


IN_PLACE_PROBS = (
    "The caller still needs them (the main model's probabilities serve the next round)."
)


def assert_all_untouched(now, before, who: str) -> None:
    for tensor, then in zip(now, before, strict=True):
        assert_untouched(tensor, then, who, IN_PLACE_PROBS)


N_ROWS = 20_000


def position_pairs(k: int, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """target [k + 1, V] and draft [k, V]: a different pair at each position (and in the other
    order for the other half of the batch)."""
    order = list(PAIRS.values())
    if flip:
        order = order[::-1]
    target = torch.tensor([order[j % 4][0] for j in range(k + 1)])
    draft = torch.tensor([order[j % 4][1] for j in range(k)])
    return target, draft


def batch_for(k: int, seed: int = 0):
    """N_ROWS rows, half with one sequence of pairs and half with another, and draft tokens
    drawn from the draft distributions (by the test)."""
    halves = [position_pairs(k, flip) for flip in (False, True)]
    half = N_ROWS // 2
    target = torch.cat([t.expand(half, -1, -1) for t, _ in halves]).contiguous()
    draft = torch.cat([d.expand(half, -1, -1) for _, d in halves]).contiguous()
    g = torch.Generator().manual_seed(1000 + seed)
    tokens = torch.multinomial(draft.reshape(-1, V), 1, generator=g).reshape(N_ROWS, k)
    return target, draft, tokens, halves


def call_batch(sample, target, draft, tokens, seed=0, greedy=False, device="cpu"):
    """`sample` (a `rejection_sample`) on the test's tensors, moved to `device`; the outputs,
    checked for shape and dtype, back on the CPU. The inputs must come back unchanged."""
    target, draft, tokens = (t.to(device) for t in (target, draft, tokens))
    before = (target.clone(), draft.clone(), tokens.clone())
    out, accepted = sample(
        target, draft, tokens, generator=torch.Generator().manual_seed(seed), greedy=greedy
    )
    assert_all_untouched((target, draft, tokens), before, "rejection_sample")
    out, accepted = out.cpu(), accepted.cpu()
    batch, k = tokens.shape
    assert tuple(out.shape) == (batch, k + 1), (
        f"tokens must be [batch, k + 1] = {(batch, k + 1)}, got {tuple(out.shape)}"
    )
    assert tuple(accepted.shape) == (batch, k), (
        f"accepted must be [batch, k] = {(batch, k)}, got {tuple(accepted.shape)}"
    )
    assert accepted.dtype == torch.bool, f"accepted must be a bool tensor, got {accepted.dtype}"
    return out, accepted


def assert_layout(out, accepted, drafts):
    """accepted is a prefix; the accepted drafts, one main-model token, then -1."""
    k = drafts.shape[1]
    prefix = accepted.long().cumprod(dim=1).bool()
    bad = (accepted != prefix).any(dim=1)
    if bad.any():
        row = int(bad.nonzero()[0])
        pytest.fail(
            f"row {row}: accepted = {accepted[row].int().tolist()} is not True up to the first "
            "rejection only. A draft after a rejected one was proposed after a token the main "
            "model did not take: it can never count, even if its own test passes."
        )
    n = accepted.sum(dim=1)
    cols = torch.arange(k + 1)[None, :]
    expected_drafts = torch.where(accepted, drafts, -1)
    wrong = (out[:, :k] != expected_drafts) & (cols[:, :k] < n[:, None])
    if wrong.any():
        row = int(wrong.any(dim=1).nonzero()[0])
        pytest.fail(f"row {row}: the accepted positions must hold the draft tokens themselves")
    main = out.gather(1, n[:, None])[:, 0]
    assert bool((main >= 0).all()), (
        "every row gets one token from the main model at column n_accepted: the recovered "
        "token after a rejection, or the bonus token when all k were accepted"
    )
    after = cols > n[:, None]
    if bool((out[after] != -1).any()):
        row = int(((out != -1) & after).any(dim=1).nonzero()[0])
        pytest.fail(
            f"row {row}: tokens = {out[row].tolist()} with {int(n[row])} accepted: every column "
            "after the main model's token must be -1 (no bonus token after a rejection, no "
            "draft after the first rejection)"
        )
    return n


def forced_outcomes_give_the_layout(sample, device="cpu"):
    # Draft distributions are one-hot, so p(draft) decides: p = 0 rejects, p = q = 1 keeps.
    k = 3
    one_hot = torch.eye(V)
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    draft = one_hot[drafts]  # [3, k, V]
    target = torch.zeros(3, k + 1, V)
    target[0, :k] = one_hot[drafts[0]]  # row 0: all three kept
    target[0, k] = one_hot[4]  # ... bonus: token 4 for sure
    target[1, 0] = one_hot[1]  # row 1: first kept,
    target[1, 1] = one_hot[5]  # second rejected (p(2) = 0): recovered token 5 for sure
    target[1, 2] = one_hot[3]  # would be kept, but comes after a rejection
    target[1, 3] = one_hot[0]
    target[2, 0] = one_hot[0]  # row 2: rejected at once (p(1) = 0): recovered 0
    target[2, 1] = one_hot[2]  # would be kept after it: must not be
    target[2, 2] = one_hot[3]
    target[2, 3] = one_hot[4]
    out, accepted = call_batch(sample, target, draft, drafts, seed=3, device=device)
    expected_out = [[1, 2, 3, 4], [1, 5, -1, -1], [0, -1, -1, -1]]
    expected_acc = [[True, True, True], [True, False, False], [False, False, False]]
    assert accepted.tolist() != [[False] * k] * 3, (
        "every draft was rejected, but row 0's are all certain (p = q = 1): is draft i tested "
        "against target_probs[:, i + 1], the NEXT position? Position i's distribution is the one "
        "draft i was drawn for (the last position, k, is only for the bonus token)"
    )
    kept_p0 = [f"row {r}'s draft {j}" for r, j in ((1, 1), (2, 0)) if bool(accepted[r, j])]
    if kept_p0:
        pytest.fail(
            f"{' and '.join(kept_p0)} were kept, but p(draft) = 0 there (and q(draft) = 1): "
            "they must be rejected for sure, min(1, p(x) / q(x)) = 0. Is the ratio upside down "
            "(a draft kept with probability min(1, q(x) / p(x)), when u * p(x) < q(x))? Keep a "
            f"draft when u * q(x) < p(x). accepted should be {expected_acc}, got "
            f"{accepted.tolist()}"
        )
    assert accepted.tolist() == expected_acc, (
        f"accepted should be {expected_acc}, got {accepted.tolist()}: True up to the first "
        "rejection only (row 2's second draft passes its own test, but comes after a rejection)"
    )
    got = out.tolist()
    # The target read with a row stride of k positions where the token is drawn: row r's
    # position `at` is then row-major position r * k + at of the [3 * (k + 1), V] target.
    flat = target.reshape(-1, V)
    strided = [int(flat[r * k + at].argmax()) for r, at in ((0, k), (1, 1), (2, 0))]
    drawn = [got[0][k], got[1][1], got[2][0]]
    if drawn == strided and drawn != [4, 5, 0]:
        pytest.fail(
            f"tokens should be {expected_out}, got {got}: the accepted drafts are right, but "
            f"the tokens drawn from the target (row 0's bonus, rows 1 and 2's recovered ones) "
            f"are {drawn}, the tokens of the target's positions r * k + n_accepted of the "
            f"flattened [batch * (k + 1), d_vocab] tensor: a row stride of k positions. Each "
            "row of the target holds k + 1 positions (one per draft, then the bonus token's), "
            "so from row 1 on a row read its neighbour's distributions: where the token is "
            "drawn, as where drafts are tested, the target's row stride is k + 1 positions."
        )
    if got[1][1] == 0 or got[2][0] == 4:
        pytest.fail(
            f"tokens should be {expected_out}, got {got}: after a rejection the token came from "
            "the target's last position, the bonus token's distribution (row 1 rejects its "
            "draft 1: its token must come from max(0, p - q) at position 1, token 5; row 2's, "
            "at position 0, token 0). The bonus token is drawn only when all k drafts were kept"
        )
    if got[1][1] == 1:
        pytest.fail(
            f"tokens should be {expected_out}, got {got}: row 1's recovered token (1) comes from "
            "position 0's distributions, but its first rejection is at position 1. Take p and q "
            "at the position of the first rejection (n_accepted), not at position 0"
        )
    if got[1][2] == 3 or got[2][1:3] == [2, 3]:
        pytest.fail(
            f"tokens should be {expected_out}, got {got}: the rejected drafts are still in "
            "tokens. After the main model's token (the recovered one) every column is -1: a "
            "draft after the first rejection never counts"
        )
    if got[0][3] == 3:
        pytest.fail(
            f"tokens should be {expected_out}, got {got}: row 0 kept all {k} drafts, and its "
            f"bonus token came from position {k - 1}, the last draft's distribution (token 3 "
            f"for sure), not from position {k}, the target's LAST position (token 4). The "
            "target has k + 1 positions: the bonus token reads the one after the last draft"
        )
    assert out.tolist() == expected_out, (
        f"tokens should be {expected_out}, got {out.tolist()}: the accepted drafts, then the "
        "recovered token (from max(0, p - q)) or, when all k were kept, the bonus token (from the "
        "target's last position), then -1"
    )


V_ZERO = 4  # the vocabulary of the zero-residual check


def zero_residual_draws_from_the_target(sample, device="cpu"):
    # False failure: ALPHA. Position 0 is kept for sure (p = q = one-hot on token 3). At
    # position 1, p = [0, 0.4995, 0.5, 0] and q = [0.0005, 0.4995, 0.5, 0] (rows sum to 1
    # within the 1e-3 the checks allow): draft 0 has p = 0, so it is always rejected, and
    # max(0, p - q) is zero everywhere. p and q are the same distribution up to rounding, and
    # the recovered token must come from p (renormalised): token 1 or 2, never -1, never 0.
    n = 2_000
    one_hot = torch.eye(V_ZERO)[3]
    p1 = torch.tensor([0.0, 0.4995, 0.5, 0.0])
    q1 = torch.tensor([0.0005, 0.4995, 0.5, 0.0])
    target = torch.stack([one_hot, p1, one_hot]).expand(n, -1, -1).contiguous()
    draft = torch.stack([one_hot, q1]).expand(n, -1, -1).contiguous()
    drafts = torch.tensor([3, 0]).expand(n, -1).contiguous()
    try:
        out, accepted = call_batch(sample, target, draft, drafts, seed=5, device=device)
    except RuntimeError as error:
        pytest.fail(
            "a rejection whose residual max(0, p - q) is zero everywhere (p <= q: the two are "
            "equal up to rounding) must still give a token: draw it from p instead. Got "
            f"{type(error).__name__}: {str(error).splitlines()[0]}"
        )
    recovered = out[:, 1]
    assert accepted[:, 0].all() and not accepted[:, 1].any(), (
        "position 0 (p = q = one-hot) must be kept and position 1 (p(draft) = 0) rejected"
    )
    bad = (recovered < 1) | (recovered > 2)
    last = V_ZERO - 1
    if bad.any() and bool((recovered[bad] == last).all()) and int(bad.sum()) < n // 2:
        pytest.fail(
            f"after a rejection whose residual max(0, p - q) is zero everywhere, {int(bad.sum())} "
            f"of {n} rows got token {last}, the LAST token of the vocabulary, whose probability is "
            "0: does your draw run off the end of a distribution that is not renormalised (an "
            "inverse-CDF draw with a uniform u in (0, 1) against cumulative sums that stop below "
            "1; here p itself, whose total is 0.9995)? Renormalise the distribution (divide it "
            "by its sum) before drawing from it"
        )
    assert not bad.any(), (
        f"after a rejection whose residual max(0, p - q) is zero everywhere, row "
        f"{int(bad.nonzero()[0])} got token {int(recovered[bad][0])}: p and q are equal up to "
        "rounding, so the token must come from p (tokens 1 and 2 here), never -1 and never a "
        "token of probability 0"
    )
    assert (out[:, 2] == -1).all(), "after the recovered token, -1"
    assert_samples_follow(
        recovered,
        p1.double(),
        "the recovered token after a residual of zero mass must follow p, renormalised",
    )


def draws_are_independent(sample, device="cpu"):
    # False failure: 2 * ALPHA (the rows: ALPHA over every distance; the positions: ALPHA).
    # Every row has the same p and q (k = 2); the test draws each row's drafts from q itself,
    # independently. Position 0's token follows p_0 in every row, so the tokens of two rows
    # must be independent draws of p_0. Given that draft 0 was kept (it is then distributed as
    # min(p_0, q_0) / alpha_0), the token at position 1 must still follow p_1, independently:
    # each position decides with its own uniform.
    p0, q0 = tensors(SHARP)
    p1, q1 = tensors(OVERLAP)
    p2, _ = tensors(IDENTICAL)
    target = torch.stack([p0, p1, p2]).expand(N_ROWS, -1, -1).contiguous()
    draft = torch.stack([q0, q1]).expand(N_ROWS, -1, -1).contiguous()
    g = torch.Generator().manual_seed(77)
    tokens = torch.multinomial(draft.reshape(-1, V), 1, generator=g).reshape(N_ROWS, 2)
    out, accepted = call_batch(sample, target, draft, tokens, seed=8, device=device)
    assert_layout(out, accepted, tokens)
    kept = accepted[:, 0]
    try:
        assert_rows_independent(
            out[:, 0], p0, "the token at position 0, in rows with the same p and q (rows must "
            "not share their uniforms)"
        )  # fmt: skip
    except AssertionError as err:
        # A wrong marginal fails the pairs too: name that mistake rather than the rows.
        diagnosis = diagnose_position(out[:, 0], kept, p0, q0)
        raise diagnosed(diagnosis, err, "rejection_sample, position 0") from None
    first = torch.minimum(p0, q0).double()
    try:
        assert_samples_follow(
            out[kept, 0] * V + out[kept, 1],
            torch.outer(first / first.sum(), p1.double()).flatten(),
            "the kept draft 0 and the token at position 1, as pairs: they must be independent "
            "(each position decides with its own uniform, never one shared by the row's k "
            "drafts)",
        )
    except AssertionError as err:
        diagnosis = diagnose_position(out[kept, 1], accepted[kept, 1], p1, q1)
        raise diagnosed(diagnosis, err, "rejection_sample, position 1") from None


def greedy_keeps_the_argmax_run(sample, device="cpu"):
    k = 3
    g = torch.Generator().manual_seed(7)
    target = torch.rand(4, k + 1, V, generator=g).softmax(-1)
    best = target.argmax(-1)  # [4, k + 1]
    draft = torch.rand(4, k, V, generator=g).softmax(-1)
    drafts = best[:, :k].clone()
    drafts[1, 1] = (best[1, 1] + 1) % V  # row 1: second draft wrong
    drafts[2, 0] = (best[2, 0] + 2) % V  # row 2: first wrong, the next two right
    drafts[3, 2] = (best[3, 2] + 3) % V  # row 3: last wrong
    out, accepted = call_batch(sample, target, draft, drafts, seed=0, greedy=True, device=device)
    b = best.tolist()
    expected = [
        b[0],
        [b[1][0], b[1][1], -1, -1],
        [b[2][0], -1, -1, -1],
        [b[3][0], b[3][1], b[3][2], -1],
    ]
    assert int(accepted.sum()) > 0, (
        f"greedy: no draft was kept, but rows 0, 1 and 3 draft the target's argmax (expected "
        f"tokens {expected}). Is draft i compared with the argmax at position i + 1, the NEXT "
        "position? Draft i is kept iff it is the argmax of target_probs[:, i]."
    )
    assert out.tolist() == expected, (
        f"greedy: expected tokens {expected}, got {out.tolist()}. Keep a draft iff it is the "
        "target's argmax (and all before it were kept); the main model's token is the argmax "
        "of the target at the first mismatch, or of its last position when all were kept."
    )
    assert accepted.sum(dim=1).tolist() == [3, 1, 0, 2]


def batched_sampler_uses_the_generator(sample, device="cpu"):
    target, draft, tokens, _ = batch_for(3, seed=2)
    target, draft, tokens = target[:300], draft[:300], tokens[:300]
    a = call_batch(sample, target, draft, tokens, seed=11, device=device)
    torch.manual_seed(99)  # the global generator must not matter
    b = call_batch(sample, target, draft, tokens, seed=11, device=device)
    c = call_batch(sample, target, draft, tokens, seed=12, device=device)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (
        "the same generator must give the same result: pass generator=generator to every draw "
        "(torch.rand for u, torch.multinomial for the recovered or bonus token)"
    )
    assert not torch.equal(a[0], c[0]), "different generator seeds must give different results"


def every_position_follows_the_target(sample, k, device="cpu"):
    # False failure: 2 halves x (k + 1) positions <= 10 comparisons, at most 1e-4.
    target, draft, tokens, halves = batch_for(k)
    out, accepted = call_batch(sample, target, draft, tokens, device=device)
    n = assert_layout(out, accepted, tokens)
    half = N_ROWS // 2
    for h, (p_rows, _) in enumerate(halves):
        rows = slice(h * half, (h + 1) * half)
        for j in range(k + 1):
            reached = n[rows] >= j
            what = "the bonus token" if j == k else f"position {j}"
            try:
                assert_samples_follow(
                    out[rows][reached, j],
                    p_rows[j],
                    f"k={k}, {'second' if h else 'first'} half of the batch, {what}: given that "
                    "the row gets this far, its token must follow the target p of this position",
                    alpha=ALPHA,
                )
            except AssertionError as err:
                q_rows = halves[h][1]
                diagnosis = None
                if j < k:
                    kept = accepted[rows][reached, j]
                    diagnosis = diagnose_position(out[rows][reached, j], kept, p_rows[j], q_rows[j])
                raise diagnosed(diagnosis, err, f"k={k}, {what}") from None


def acceptance_and_recovered_tokens(sample, k, device="cpu"):
    # False failure: 2 * k comparisons (k <= 4 rates and residuals on the first half), <= 8e-5.
    target, draft, tokens, halves = batch_for(k, seed=1)
    out, accepted = call_batch(sample, target, draft, tokens, seed=1, device=device)
    n = assert_layout(out, accepted, tokens)
    p_rows, q_rows = halves[0]
    half = N_ROWS // 2
    out, accepted, n = out[:half], accepted[:half], n[:half]
    for j in range(k):
        reached = n >= j
        a = min_mass(p_rows[j], q_rows[j])
        try:
            if 0 < a < 1:
                assert_rate(
                    accepted[reached, j],
                    a,
                    f"k={k}, position {j}: a draft must be kept with probability sum min(p, q) = "
                    f"{a:.2f}",
                )
            rejected = reached & (n == j)
            if a < 1:
                assert_samples_follow(
                    out[rejected, j],
                    residual_of(p_rows[j], q_rows[j]),
                    f"k={k}, position {j}: the recovered token after a rejection must follow "
                    "max(0, p - q) renormalised (not p, and not unnormalised)",
                )
        except AssertionError as err:
            diagnosis = diagnose_position(
                out[reached, j], accepted[reached, j], p_rows[j], q_rows[j]
            )
            raise diagnosed(diagnosis, err, f"k={k}, position {j}") from None
