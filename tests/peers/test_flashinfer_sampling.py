"""FlashInfer's sampling tests, rewritten for chapter 10's Triton kernels.

Source: flashinfer-ai/flashinfer, tests/utils/test_sampling.py at commit
fb28d7242b3506a2348265962041acc1fb56cca4 (tests/test_sampling.py in older versions). The cases,
sizes and thresholds come from there; the code is this course's own. They check the course's
reference kernels (`solutions.kernels`), not a learner's: no `impl` fixture.

What changed on the way, and why (tests/peers/README.md says it at more length):

- The kernels run here through Triton's interpreter on the CPU, block operation by block
  operation, so FlashInfer's sizes (batches up to 989 rows, vocabularies up to 128256 tokens,
  5,000,000 draws per distribution) are shrunk; each place says from what. Many draws of one
  distribution are the many rows of ONE call, which is what FlashInfer's `indices` argument of
  zeros does too. FlashInfer's statistical thresholds are never loosened: a frequency test keeps
  its cosine similarity > 0.99 and draws as many samples as that threshold needs (see
  `samples_needed`).
- Seeds: the kernels take an int `seed` (Triton's counter-based tl.rand(seed, offset)) and
  `rejection_sample` takes a torch.Generator (its uniforms are drawn by the wrapper), where
  FlashInfer takes a generator or a seed and an offset. The offset has no counterpart.
- Scalars only: the course's top_k / top_p are one int / float for the whole batch, not
  FlashInfer's per-request tensors, and a filter is applied to probabilities the caller
  normalised (there is no top-k / top-p from logits, no renorm and no mask-logits function).
- top-k and top-p together are refused (ValueError): the course does not filter jointly.
- A row with nothing to sample (all zeros, or NaN) is a ValueError naming the row, where
  FlashInfer returns token 0 and `valid = False`.
- `rejection_sample` returns `accepted` [batch, k], True up to the first rejection only; its
  row sums are FlashInfer's `emitted_num`. FlashInfer's `accepted_num` (every draft that would
  pass its own test, after a rejection too) has no counterpart.
- No counterpart, not ported: min-p sampling, top_k_renorm_probs / top_p_renorm_probs,
  top_k_mask_logits, top-k/top-p from logits and its alignment with the probs path, the
  `indices` argument (its int32/int64 test becomes: every sampler returns int64 [batch]), and
  the CUDA default-device regression test.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import solutions  # noqa: F401  (first: it sets TRITON_INTERPRET=1 before Triton is imported)

pytest.importorskip("triton")  # Triton is a Linux-only dependency

from solutions.kernels import (  # noqa: E402
    gumbel_sample,
    rejection_sample,
    sample_from_probs,
    softmax,
    top_k_top_p_sample,
)
from solutions.kernels.runtime import DEVICE  # noqa: E402

# FlashInfer's frequency tests pass when the cosine similarity of the observed frequencies and
# the expected distribution is above this. Kept as it is; only the number of draws changes.
COSINE_THRESHOLD = 0.99
# The chance that a correct sampler fails one frequency test here, to first order (Gaussian
# counts): `samples_needed` draws enough for it.
FALSE_FAILURE = 1e-4
# FlashInfer's batch sizes, and its vocabularies shrunk: 111 is theirs; 1000 stands for 32000
# and 128256, which the interpreter cannot run with thousands of rows per case.
BATCHES = [1, 99, 989]
VOCABS = [111, 1000]
# FlashInfer's top-p / top-k "mask" tests make 1000 calls on a batch (5000 for plain sampling):
# here the batch is tiled into about this many rows of one call (so 1000 draws of each row for
# batch 1, 10 for batch 99, 1 for batch 989: fewer for the larger batches).
ROWS_PER_CALL = 1000


# ---------------------------------------------------------------------------------------------
# Inputs, as FlashInfer makes them


def seeded(seed: int = 42) -> torch.Generator:
    """FlashInfer seeds every test with torch.manual_seed(42); here a local generator."""
    return torch.Generator().manual_seed(seed)


def make_logits(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """FlashInfer's three logit distributions: normal with std 1 or 5, and what it calls
    gumbel(beta = 0.1), log(-log(U + 1e-20) + 1e-20) / beta for U uniform."""
    if kind == "normal1":
        return torch.randn(shape, generator=gen)
    if kind == "normal5":
        return torch.randn(shape, generator=gen) * 5
    if kind == "gumbel0.1":
        u = torch.rand(shape, generator=gen)
        return torch.log(-torch.log(u + 1e-20) + 1e-20) / 0.1
    raise AssertionError(f"unknown distribution {kind}")


DISTRIBUTIONS = ["normal1", "normal5", "gumbel0.1"]


def random_probs(batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """FlashInfer's uniform random rows, normalised by the caller."""
    raw = torch.rand(batch, vocab, generator=gen)
    return raw / raw.sum(dim=-1, keepdim=True)


def tiled(rows: torch.Tensor, times: int) -> torch.Tensor:
    """`rows` [batch, ...] repeated `times` times (row r of the result is rows[r % batch]), on
    the kernels' device: `times` independent draws of every row in one call."""
    return rows.repeat(times, *([1] * (rows.ndim - 1))).contiguous().to(DEVICE)


# ---------------------------------------------------------------------------------------------
# The filters, from their definitions (chapter 3's tie rule)


def top_k_kept(probs: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Rows [batch, V] -> bool [batch, V]: token j is kept iff fewer than k tokens are strictly
    more likely, i.e. p_j >= the k-th largest p (FlashInfer's `probs >= pivot` mask)."""
    k = torch.as_tensor(k).expand(probs.shape[0])
    kth = probs.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    return probs >= kth


def mass_strictly_above(probs: torch.Tensor) -> torch.Tensor:
    """Rows [batch, V] -> [batch, V] float64: for each token, the total probability of the
    tokens strictly more likely than it."""
    p = probs.double()
    ascending = p.sort(dim=-1).values
    cum = ascending.cumsum(dim=-1)
    # the tokens at most as likely as j end at position searchsorted(right) - 1 of `ascending`
    at_most = cum.gather(1, torch.searchsorted(ascending, p, right=True) - 1)
    return cum[:, -1:] - at_most


def top_p_kept(probs: torch.Tensor, top_p: float, slack: float = 0.0) -> torch.Tensor:
    """Rows [batch, V] -> bool [batch, V]: token j is kept iff the tokens strictly more likely
    hold less than top_p (+ slack) of the row's mass. Without ties this is FlashInfer's mask
    (ascending sort, cumulative sum > 1 - top_p); with ties it keeps them all."""
    total = probs.double().sum(dim=-1, keepdim=True)
    return mass_strictly_above(probs) < top_p * total + slack


def renormalised(probs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The kept tokens' probabilities, float64, summing to 1: FlashInfer's *_renorm_probs."""
    p = torch.where(kept, probs.double(), 0.0)
    return p / p.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# Frequencies: FlashInfer's cosine-similarity criterion, with enough draws for it


def samples_needed(target: torch.Tensor) -> int:
    """How many draws from `target` [V] a correct sampler needs so that the cosine similarity of
    its frequencies with `target` stays above COSINE_THRESHOLD, except with probability about
    FALSE_FAILURE.

    With n draws the frequencies are target + e, e ~ N(0, S / n) to first order, with
    S = diag(p) - p p^T. Then 1 - cos ~= |P e|^2 / (2 |p|^2), P the projection off p, and
    n |P e|^2 = sum_i l_i Z_i^2 over the eigenvalues l of P S P. Laurent and Massart's bound,
    P(sum l Z^2 >= sum l + 2 sqrt(x sum l^2) + 2 x max l) <= exp(-x), with x = log(1 / alpha),
    gives the n at which that quantile reaches the threshold's margin. (FlashInfer draws 5e6.)"""
    p = target.double() / target.double().sum()
    v = p.numel()
    unit = p / p.norm()
    off_p = torch.eye(v, dtype=torch.float64) - torch.outer(unit, unit)
    spread = torch.diag(p) - torch.outer(p, p)
    eig = torch.linalg.eigvalsh(off_p @ spread @ off_p).clamp(min=0.0)
    x = math.log(1.0 / FALSE_FAILURE)
    quantile = float(eig.sum() + 2 * torch.sqrt(x * (eig**2).sum()) + 2 * x * eig.max())
    n = quantile / (2 * float(p @ p) * (1 - COSINE_THRESHOLD))
    return max(1000, math.ceil(n))


def frequencies(samples: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(samples.cpu(), minlength=vocab).double() / samples.numel()


def assert_follows(samples: torch.Tensor, target: torch.Tensor, what: str) -> None:
    """FlashInfer's criterion: cosine similarity of the frequencies with `target` > 0.99."""
    assert samples.dtype == torch.int64, f"{what}: tokens must be int64, got {samples.dtype}"
    vocab = target.numel()
    assert bool(((samples >= 0) & (samples < vocab)).all()), (
        f"{what}: a token outside [0, {vocab}) was returned: {samples.min()}..{samples.max()}"
    )
    freq = frequencies(samples, vocab)
    cos = float(torch.nn.functional.cosine_similarity(freq, target.double(), dim=0))
    assert cos > COSINE_THRESHOLD, (
        f"{what}: the frequencies of {samples.numel()} draws have a cosine similarity of "
        f"{cos:.5f} with the expected distribution, not above FlashInfer's {COSINE_THRESHOLD}: "
        "the sampler does not draw from it"
    )


def assert_only_kept(samples: torch.Tensor, kept: torch.Tensor, what: str) -> None:
    """Row r of `samples` was drawn from row r % batch of `kept` [batch, V]."""
    batch = kept.shape[0]
    samples = samples.cpu()
    rows = torch.arange(samples.numel()) % batch
    assert bool(((samples >= 0) & (samples < kept.shape[1])).all()), (
        f"{what}: a token outside [0, {kept.shape[1]}) was returned"
    )
    bad = ~kept[rows, samples]
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        pytest.fail(
            f"{what}: draw {i} (of row {int(rows[i])}) is token {int(samples[i])}, which the "
            "filter drops: a filtered sampler must never return a token outside its kept set"
        )


# ---------------------------------------------------------------------------------------------
# softmax  (FlashInfer: test_softmax -> flashinfer.sampling.softmax)
# The course's softmax takes no temperature: the caller divides the logits by it first, which
# is what FlashInfer's reference does too. FlashInfer's `temperature_arr` variant (one
# temperature per row, all equal) is that same division, so it is not repeated.
# Shapes: FlashInfer runs every batch (1, 99, 989) with every vocabulary (111, 32000, 128256).
# Here the large vocabularies run at batch 1 only, at their full size (128256 with --runslow:
# 5 s for its 18 cases), and the large batch with a vocabulary of 1000.

SOFTMAX_SHAPES = [
    pytest.param(shape, marks=marks, id=f"{shape[0]}x{shape[1]}")
    for shape, marks in [
        ((1, 111), ()),
        ((99, 111), ()),
        ((989, 111), ()),
        ((1, 32000), ()),
        ((989, 1000), ()),
        ((1, 128256), pytest.mark.slow),
    ]
]


@pytest.mark.parametrize("neg_inf", [False, True], ids=["finite", "neg_inf"])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_softmax_matches_torch(shape, distribution, temperature, neg_inf):
    gen = seeded()
    logits = make_logits(distribution, shape, gen)
    if neg_inf:
        # As FlashInfer: a random number of random entries (up to nearly all) become -inf.
        n = int(torch.randint(0, logits.numel() - 1, (), generator=gen))
        logits.view(-1)[torch.randperm(logits.numel(), generator=gen)[:n]] = float("-inf")
        # A row of only -inf is outside the course's contract ("a row may hold -inf, never
        # only -inf"; torch's softmax is NaN there, and FlashInfer's allclose would fail on it
        # too): give such a row back one finite entry.
        empty = torch.isinf(logits).all(dim=-1)
        logits[empty, 0] = 0.0
    scaled = logits / temperature
    got = softmax(scaled.to(DEVICE)).cpu()
    expected = torch.softmax(scaled, dim=-1)
    assert got.dtype == scaled.dtype, f"softmax must keep the dtype {scaled.dtype}, got {got.dtype}"
    assert torch.allclose(got, expected, atol=1e-5), (
        f"softmax of {distribution} logits / {temperature} differs from torch.softmax by up to "
        f"{float((got - expected).abs().nan_to_num(float('inf')).max()):.3g} (FlashInfer allows "
        "1e-5)"
    )


# ---------------------------------------------------------------------------------------------
# Sampling from probabilities  (FlashInfer: test_sampling_freq, test_sampling ->
# sampling_from_probs; here sample_from_probs)


@pytest.mark.parametrize("zero_ratio", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("vocab", VOCABS)  # FlashInfer: 111, 32000, 128256
def test_sample_from_probs_frequencies(vocab, distribution, zero_ratio):
    gen = seeded()
    logits = make_logits(distribution, (1, vocab), gen)
    zeros = torch.randperm(vocab, generator=gen)[: int(vocab * zero_ratio)]
    logits[:, zeros] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    n = samples_needed(probs[0])  # FlashInfer: 5,000,000 draws
    samples = sample_from_probs(tiled(probs, n), seed=1)
    counts = torch.bincount(samples.cpu(), minlength=vocab)
    assert int(counts[zeros].sum()) == 0, (
        f"sample_from_probs drew {int(counts[zeros].sum())} tokens of probability 0 (their "
        "logits were -inf)"
    )
    assert_follows(samples, probs[0], f"sample_from_probs ({distribution}, {zero_ratio:.0%} zeros)")


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_sample_from_probs_stays_in_range(batch, vocab):
    # FlashInfer: 5000 calls on the batch; here ~5000 rows in one call, so batch 99 is drawn
    # 50 times and batch 989 5 times.
    probs = random_probs(batch, vocab, seeded())
    times = max(1, 5 * ROWS_PER_CALL // batch)
    samples = sample_from_probs(tiled(probs, times), seed=0)
    assert samples.shape == (batch * times,), f"one token per row, got shape {samples.shape}"
    assert bool(((samples >= 0) & (samples < vocab)).all()), (
        f"sample_from_probs returned a token outside [0, {vocab}): {samples.min()}..{samples.max()}"
    )


# ---------------------------------------------------------------------------------------------
# Sampling from logits  (FlashInfer: test_sampling_from_logits_freq, test_sampling_from_logits
# -> sampling_from_logits; here gumbel_sample with temperature 1)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("vocab", VOCABS)  # FlashInfer: 111, 32000, 128256
def test_gumbel_sample_frequencies(vocab, distribution):
    logits = make_logits(distribution, (1, vocab), seeded())
    probs = torch.softmax(logits, dim=-1)
    n = samples_needed(probs[0])  # FlashInfer: 5,000,000 draws
    samples = gumbel_sample(tiled(logits, n), temperature=1.0, seed=1)
    assert_follows(samples, probs[0], f"gumbel_sample ({distribution} logits)")


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_gumbel_sample_stays_in_range(batch, vocab):
    # FlashInfer: 5000 calls; here ~5000 rows in one call, as for sample_from_probs.
    logits = torch.randn(batch, vocab, generator=seeded())
    times = max(1, 5 * ROWS_PER_CALL // batch)
    samples = gumbel_sample(tiled(logits, times), seed=0)
    assert samples.shape == (batch * times,), f"one token per row, got shape {samples.shape}"
    assert bool(((samples >= 0) & (samples < vocab)).all()), (
        f"gumbel_sample returned a token outside [0, {vocab}): {samples.min()}..{samples.max()}"
    )


# ---------------------------------------------------------------------------------------------
# Top-p  (FlashInfer: test_top_p_sampling_freq, test_top_p_sampling ->
# top_p_sampling_from_probs; here top_k_top_p_sample(top_p=...))

# A vocabulary of 1000 needs up to 26,000 rows per case through the rejection rounds: about
# 20 s for the nine cases, so it runs with --runslow (FlashInfer: 32000, 128256).
FILTER_VOCABS = [111, pytest.param(1000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("vocab", FILTER_VOCABS)
def test_top_p_frequencies(vocab, distribution, top_p):
    probs = torch.softmax(make_logits(distribution, (1, vocab), seeded()), dim=-1)
    assert_filtered_frequencies(
        probs, top_p_kept(probs, top_p), f"top_p={top_p} ({distribution})", top_p=top_p, seed=2
    )


def assert_filtered_frequencies(probs, kept, what: str, **kwargs) -> None:
    """FlashInfer's frequency tests of a filter: enough draws of the one row `probs` [1, V]
    (`top_k_top_p_sample(..., **kwargs)`) stay in `kept` and follow `probs` renormalised
    over it."""
    target = renormalised(probs, kept)[0]
    n = samples_needed(target)  # FlashInfer: 5,000,000 draws
    samples = top_k_top_p_sample(tiled(probs, n), **kwargs)
    assert_only_kept(samples, kept, what)
    assert_follows(samples, target, what)


def mask_cases(values=(None,)):
    """(batch, vocab, value) for the mask tests: every batch at vocabulary 111; at 1000
    (FlashInfer: 32000, 128256) batch 99, and batches 1 and 989 with --runslow (about 10 s for
    each filter). A top-k of k >= vocab is left out, as FlashInfer skips it."""
    return [
        pytest.param(
            b,
            v,
            x,
            marks=pytest.mark.slow if v > 111 and b != 99 else (),
            id=f"{b}x{v}-{x}",
        )
        for v in VOCABS
        for b in BATCHES
        for x in values
        if not (isinstance(x, int) and x >= v)
    ]


@pytest.mark.parametrize("batch, vocab, top_p", mask_cases([0.1, 0.5, 0.9]))
def test_top_p_draws_only_from_the_nucleus(batch, vocab, top_p):
    probs = random_probs(batch, vocab, seeded())
    # FlashInfer's slack of 1e-4 on the mass (its mask: cdf > (1 - p) - 1e-4), for float32 sums.
    kept = top_p_kept(probs, top_p, slack=1e-4)
    times = max(1, ROWS_PER_CALL // batch)  # FlashInfer: 1000 calls on the batch
    samples = top_k_top_p_sample(tiled(probs, times), top_p=top_p, seed=3)
    assert_only_kept(samples, kept, f"top_p={top_p} on a batch of {batch}")


# ---------------------------------------------------------------------------------------------
# Top-k  (FlashInfer: test_top_k_sampling_freq, test_top_k_sampling,
# test_top_k_sampling_with_variable_k -> top_k_sampling_from_probs; here
# top_k_top_p_sample(top_k=...)). FlashInfer skips k >= vocab; those cases are left out.


def top_k_cases(vocabs):
    return [
        pytest.param(v, k, marks=marks, id=f"{v}-k{k}")
        for v, marks in vocabs
        for k in (10, 100, 500)
        if k < v
    ]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize(
    "vocab, k", top_k_cases([(111, ()), (1000, pytest.mark.slow)])
)  # FlashInfer: 111, 32000, 128256; 1000 is slow here for the reason given for top-p
def test_top_k_frequencies(vocab, k, distribution):
    probs = torch.softmax(make_logits(distribution, (1, vocab), seeded()), dim=-1)
    assert_filtered_frequencies(
        probs, top_k_kept(probs, k), f"top_k={k} ({distribution})", top_k=k, seed=4
    )


@pytest.mark.parametrize("batch, vocab, k", mask_cases([10, 100, 500]))
def test_top_k_draws_only_from_the_top_k(batch, vocab, k):
    probs = random_probs(batch, vocab, seeded())
    kept = top_k_kept(probs, k)
    times = max(1, ROWS_PER_CALL // batch)  # FlashInfer: 1000 calls on the batch
    samples = top_k_top_p_sample(tiled(probs, times), top_k=k, seed=5)
    assert_only_kept(samples, kept, f"top_k={k} on a batch of {batch}")


@pytest.mark.parametrize(
    "vocab, k",
    [
        (111, 10),
        (1000, 10),
        pytest.param(111, 100, marks=pytest.mark.slow),
        pytest.param(1000, 100, marks=pytest.mark.slow),
        pytest.param(1000, 500, marks=pytest.mark.slow),
    ],
)  # A k of up to 100 or 500 makes one call per distinct k (60 or more, 3 s and up): --runslow.
def test_top_k_with_a_k_per_row(vocab, k):
    # FlashInfer passes one k per row (1..k, drawn at random) in one call. The course's top_k
    # is one int for the batch: the rows that share a k go into one call each. Batch 99 (of
    # FlashInfer's 1, 99, 989: 1 is the test above, 989 would be ~k calls of 10 rows), with
    # 10 draws of each row (FlashInfer: 1000 calls).
    batch, times = 99, 10
    gen = seeded()
    probs = random_probs(batch, vocab, gen)
    ks = torch.randint(1, k + 1, (batch,), generator=gen)
    kept = top_k_kept(probs, ks)
    for value in ks.unique().tolist():
        rows = (ks == value).nonzero()[:, 0]
        samples = top_k_top_p_sample(tiled(probs[rows], times), top_k=value, seed=6)
        assert_only_kept(samples, kept[rows], f"top_k={value} on the rows given that k")


# ---------------------------------------------------------------------------------------------
# Top-k with top-p  (FlashInfer: test_top_k_top_p_joint_sampling_from_probs,
# test_top_k_top_p_joint_sampling_from_logits, ..._probs_logits_alignment). FlashInfer filters
# by both at once (or one after the other). The course refuses the pair: a learner picks one
# filter, as chapter 3's sampler does. FlashInfer's pairs of (k, p) are asked for, and refused.


@pytest.mark.parametrize("top_p", [0.1, 0.5])
@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_with_top_p_is_refused(vocab, top_p):
    k = int(vocab * (0.5 if top_p == 0.1 else 0.1))  # FlashInfer's pairing of k with p
    probs = random_probs(4, vocab, seeded()).to(DEVICE)
    with pytest.raises(ValueError, match="top_k.*top_p"):
        top_k_top_p_sample(probs, top_k=k, top_p=top_p, seed=0)


# ---------------------------------------------------------------------------------------------
# Parameters  (FlashInfer: test_check_tensor_param_top_p, test_check_tensor_param_top_k,
# test_tensor_validation_min_p). FlashInfer takes a scalar or a [batch] tensor and refuses a
# tensor of the wrong shape with a ValueError. The course takes scalars only: a scalar works,
# any tensor (FlashInfer's 0-d, 2-d and wrong-length cases alike) is a ValueError, and so is a
# value out of range.


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", [1, 99])  # FlashInfer: 1, 99, 989 (only shapes matter)
def test_filter_parameters_are_scalars(batch, vocab):
    probs = random_probs(batch, vocab, seeded()).to(DEVICE)
    assert top_k_top_p_sample(probs, top_k=10, seed=0).shape == (batch,)
    assert top_k_top_p_sample(probs, top_p=0.5, seed=0).shape == (batch,)
    refused = {
        "top_k": [torch.tensor(10), torch.full((batch,), 10), torch.full((batch, vocab), 10), -1],
        "top_p": [torch.tensor(0.5), torch.full((batch,), 0.5), -0.1, 1.5, float("nan")],
    }
    for name, values in refused.items():
        for value in values:
            try:
                top_k_top_p_sample(probs, seed=0, **{name: value})
            except ValueError:
                continue
            shown = tuple(value.shape) if isinstance(value, torch.Tensor) else value
            pytest.fail(
                f"top_k_top_p_sample accepted {name}={shown}: the course's {name} is one number "
                "in range for the whole batch, and anything else must be a ValueError"
            )


# ---------------------------------------------------------------------------------------------
# Seeds  (FlashInfer: test_sampling_from_probs_seed_offset_reproducibility,
# test_sampling_from_logits_seed_offset_reproducibility,
# test_sampling_different_seed_offset_produces_different_results). FlashInfer's seed 12345 and
# 67890; its offset has no counterpart (tl.rand's offset is the row, or row and column).


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_the_same_seed_gives_the_same_tokens(batch, vocab):
    gen = seeded()
    probs = random_probs(batch, vocab, gen).to(DEVICE)
    logits = torch.randn(batch, vocab, generator=gen).to(DEVICE)
    samplers = {
        "sample_from_probs": lambda seed: sample_from_probs(probs, seed=seed),
        "gumbel_sample": lambda seed: gumbel_sample(logits, seed=seed),
        "top_k_top_p_sample(top_p=0.9)": lambda seed: top_k_top_p_sample(
            probs, top_p=0.9, seed=seed
        ),
    }
    for name, sample in samplers.items():
        assert torch.equal(sample(12345), sample(12345)), (
            f"{name} gave different tokens for the same seed: the seed must decide every draw"
        )


@pytest.mark.parametrize("vocab", VOCABS)
def test_different_seeds_give_different_tokens(vocab):
    gen = seeded()
    probs = random_probs(1000, vocab, gen).to(DEVICE)  # FlashInfer's batch of 1000
    logits = torch.randn(1000, vocab, generator=gen).to(DEVICE)
    pairs = {
        "sample_from_probs": [sample_from_probs(probs, seed=s) for s in (12345, 67890)],
        "gumbel_sample": [gumbel_sample(logits, seed=s) for s in (12345, 67890)],
    }
    for name, (a, b) in pairs.items():
        match = float((a == b).double().mean())
        assert match < 1, f"{name} gave the same 1000 tokens for seeds 12345 and 67890"


def test_rejection_sample_follows_its_generator():
    # FlashInfer's chain_speculative_sampling takes a generator too; its test does not check it.
    gen = seeded()
    inputs = chain_inputs(99, 111, 3, onehot_target=False, gen=gen)
    target, draft, drafts = (t.to(DEVICE) for t in inputs)
    runs = [
        rejection_sample(target, draft, drafts, generator=torch.Generator().manual_seed(s))
        for s in (7, 7, 8)
    ]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), (
        "rejection_sample gave different results for generators with the same seed"
    )
    assert not torch.equal(runs[0][0], runs[2][0]), (
        "rejection_sample gave the same tokens for generators seeded 7 and 8: the uniforms must "
        "come from the generator"
    )


# ---------------------------------------------------------------------------------------------
# Outputs  (FlashInfer: test_int64_indices_sampling, whose output dtype follows `indices`).
# The course has no `indices`: every sampler returns int64 [batch]. Its joint and min-p cases
# have no counterpart (the joint one is refused above).


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_samplers_return_int64_tokens(batch, vocab):
    logits = torch.randn(batch, vocab, generator=seeded())
    probs = torch.softmax(logits, dim=-1).to(DEVICE)
    results = {
        "sample_from_probs": sample_from_probs(probs, seed=0),
        "gumbel_sample": gumbel_sample(logits.to(DEVICE), seed=0),
        "top_p=0.9": top_k_top_p_sample(probs, top_p=0.9, seed=0),
        f"top_k={min(100, vocab)}": top_k_top_p_sample(probs, top_k=min(100, vocab), seed=0),
    }
    for name, samples in results.items():
        assert samples.dtype == torch.int64, f"{name} must return int64, got {samples.dtype}"
        assert samples.shape == (batch,), f"{name} must return [batch], got {samples.shape}"
        assert bool(((samples >= 0) & (samples < vocab)).all()), (
            f"{name} returned a token outside [0, {vocab})"
        )


# ---------------------------------------------------------------------------------------------
# Rows with nothing to sample  (FlashInfer: test_sampling_nan_input). FlashInfer returns token
# 0 with valid = False for a NaN row. The course refuses the call: a ValueError naming every
# such row (all NaN, or all zeros), never a token -1, and the other rows sample as usual.


def empty_rows(batch: int) -> list[int]:
    """FlashInfer's rows to spoil: the first, the middle and the last."""
    return sorted({0, batch // 2, batch - 1})


def rows_named(error: ValueError) -> set[int]:
    return {int(n) for n in re.findall(r"\b\d+\b", str(error))}


EMPTY_SAMPLERS = {
    "sample_from_probs": lambda probs: sample_from_probs(probs, seed=0),
    "top_k_top_p_sample(top_k=50)": lambda probs: top_k_top_p_sample(probs, top_k=50, seed=0),
    "top_k_top_p_sample(top_p=0.9)": lambda probs: top_k_top_p_sample(probs, top_p=0.9, seed=0),
}


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("fill", [float("nan"), 0.0], ids=["nan", "zeros"])
@pytest.mark.parametrize("vocab", VOCABS)  # FlashInfer: 111, 32000
@pytest.mark.parametrize("batch", [1, 4, 19])
def test_rows_with_nothing_to_sample_are_refused(batch, vocab, fill):
    probs = random_probs(batch, vocab, seeded())
    spoilt = empty_rows(batch)
    probs[spoilt] = fill
    for name, sample in EMPTY_SAMPLERS.items():
        try:
            out = sample(probs.to(DEVICE))
        except ValueError as error:
            missing = set(spoilt) - rows_named(error)
            assert not missing, (
                f"{name}: the ValueError must name every row with nothing to sample "
                f"({spoilt}), it leaves out {sorted(missing)}: {error}"
            )
        else:
            pytest.fail(
                f"{name} returned {out[spoilt].tolist()} for rows {spoilt} of {fill}: a row with "
                "no positive probability has no token to give, and must be a ValueError"
            )
        good = [r for r in range(batch) if r not in spoilt]
        if good:
            out = sample(probs[good].to(DEVICE))
            assert bool(((out >= 0) & (out < vocab)).all()), (
                f"{name}: the ordinary rows must give ordinary tokens, got {out.tolist()}"
            )


# ---------------------------------------------------------------------------------------------
# Speculative decoding  (FlashInfer: test_chain_speculative_sampling ->
# chain_speculative_sampling; here rejection_sample). Both take a target of k + 1 positions and
# pad with -1. FlashInfer's (output, accepted_num, emitted_num): emitted_num is the number of
# drafts kept before the first rejection, which is `accepted.sum(1)` here; accepted_num also
# counts later drafts that would pass their own test, and has no counterpart.


def chain_inputs(batch, vocab, k, onehot_target, gen):
    """FlashInfer's inputs: random normalised draft rows, random draft tokens (not drawn from
    the draft), and a random normalised target, or a one-hot target on the drafts and then on a
    random bonus token."""
    draft = random_probs(batch * k, vocab, gen).reshape(batch, k, vocab)
    drafts = torch.randint(vocab, (batch, k), generator=gen)
    if onehot_target:
        chosen = torch.randint(vocab, (batch, k + 1), generator=gen)
        chosen[:, :k] = drafts
        target = torch.nn.functional.one_hot(chosen, vocab).float()
    else:
        target = random_probs(batch * (k + 1), vocab, gen).reshape(batch, k + 1, vocab)
    return target, draft, drafts


def assert_chain_layout(tokens, accepted, drafts, vocab, what):
    batch, k = drafts.shape
    assert tokens.shape == (batch, k + 1), f"{what}: tokens must be [batch, k + 1]"
    assert accepted.shape == (batch, k) and accepted.dtype == torch.bool, (
        f"{what}: accepted must be bool [batch, k], got {accepted.dtype} {tuple(accepted.shape)}"
    )
    assert bool(((tokens == -1) | ((tokens >= 0) & (tokens < vocab))).all()), (
        f"{what}: every token must be -1 or in [0, {vocab})"
    )
    n = accepted.sum(dim=1)
    prefix = torch.arange(k)[None, :] < n[:, None]
    assert torch.equal(accepted, prefix), (
        f"{what}: accepted must be True up to the first rejection and False after it"
    )
    assert torch.equal(tokens[:, :k][prefix], drafts[prefix]), (
        f"{what}: the accepted positions must hold the draft tokens"
    )
    # FlashInfer's check (the columns where the output differs from the drafts are contiguous,
    # and all after the first are -1), in the stronger form the course's `accepted` allows.
    cols = torch.arange(k + 1)[None, :]
    assert bool((tokens[cols > n[:, None]] == -1).all()), (
        f"{what}: after the main model's token at column n_accepted, every column must be -1"
    )
    # FlashInfer: emitted_num + 1 == the number of tokens that are not -1.
    assert torch.equal(n + 1, (tokens != -1).sum(dim=1)), (
        f"{what}: each row must hold its accepted drafts and exactly one more token"
    )


@pytest.mark.parametrize("onehot_target", [False, True], ids=["random", "onehot"])
@pytest.mark.parametrize("k", [1, 3, 5, 7])
@pytest.mark.parametrize("vocab", VOCABS)  # FlashInfer: 111, 32000, 128256
@pytest.mark.parametrize("batch", BATCHES)
def test_rejection_sample_chain(batch, vocab, k, onehot_target):
    gen = seeded()
    target, draft, drafts = chain_inputs(batch, vocab, k, onehot_target, gen)
    # FlashInfer repeats the call 10 times; here the batch is tiled (10 times, or 2 times for
    # 989 rows of a vocabulary of 1000, to keep the tensors small).
    times = 2 if batch * vocab > 100_000 else 10
    target, draft, drafts = (tiled(t, times) for t in (target, draft, drafts))
    tokens, accepted = rejection_sample(
        target, draft, drafts, generator=torch.Generator().manual_seed(k)
    )
    tokens, accepted, drafts = tokens.cpu(), accepted.cpu(), drafts.cpu()
    what = f"rejection_sample (k={k}, {'one-hot' if onehot_target else 'random'} target)"
    assert_chain_layout(tokens, accepted, drafts, vocab, what)
    if onehot_target:
        # p(draft) = 1 >= q(draft): every draft is kept, then the bonus token is certain.
        expected = target.argmax(dim=-1).cpu()
        assert torch.equal(tokens, expected), (
            f"{what}: with a one-hot target on the drafts every draft must be kept and the bonus "
            "token must be the target's last token"
        )


def test_rejection_sample_a_residual_of_zero_mass_draws_from_the_target():
    # Not in FlashInfer: the course's contract. The draft token x has q(x) > 0 = p(x), so it is
    # rejected for sure, and p equals q elsewhere: max(0, p - q) is zero everywhere (p sums to
    # 1 - q(x), within the course's 1e-3 of 1). The recovered token must then come from p.
    # (FlashInfer's ChainSpeculativeSampling then finds no token and writes its fallback
    # `last_valid_id`, which nothing sets in this case: not a draw from p.)
    vocab = 111
    q = torch.softmax(torch.randn(vocab, generator=seeded()), dim=-1)
    x = int(q.argmin())
    assert float(q[x]) < 1e-3, "the test needs a token of small draft probability"
    p = q.clone()
    p[x] = 0.0
    n = samples_needed(p)
    target = tiled(torch.stack([p, q])[None], n)  # [n, 2, V]; position 1 is never reached
    tokens, accepted = rejection_sample(
        target,
        tiled(q[None, None], n),
        tiled(torch.tensor([[x]]), n),
        generator=torch.Generator().manual_seed(3),
    )
    tokens, accepted = tokens.cpu(), accepted.cpu()
    assert not bool(accepted.any()), "a draft token of target probability 0 must be rejected"
    recovered = tokens[:, 0]
    assert bool((recovered >= 0).all()), (
        "after a rejection whose residual max(0, p - q) is all zero, rejection_sample returned -1:"
        " it must draw the token from p instead"
    )
    assert bool((recovered != x).all()), "the recovered token has target probability 0"
    assert bool((tokens[:, 1] == -1).all()), "after the recovered token, -1"
    assert_follows(recovered, p, "the token recovered after a residual of zero mass")
