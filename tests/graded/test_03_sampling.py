"""Chapter 3: sampling and beam search, graded against HF `transformers` (`generate`, its
logits processors) and exact probabilities.

Statistical tests draw many samples in one batched call and compare their frequencies with the
exact probabilities by a chi-square test (tests/support.py); each states the probability
that a correct implementation fails it, and each runs under a fixed seed.

Every exercise gets the caller's own tensors, never a copy, and each test checks afterwards
that they are unchanged: an edit in place (`logits /= T`, `masked_fill_`) changes what the
caller still holds, and fails.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._oracles import (
    BEAM_SCORE_ATOL,
    IN_PLACE,
    PROMPTS,
    assert_untouched,
    crafted_logits,
    draw,
    hf_beam_search,
    hf_greedy,
    hf_kept,
    hf_window_greedy,
    rounded_top_p_cases_here,
)
from tests.support import assert_samples_follow
from utils import grading

CHAPTER = "03_sampling"


def assert_draws_follow_what_hf_keeps(sampler, logits, warper, what: str, **kwargs) -> None:
    """N_SAMPLES from `sampler` follow softmax(logits) renormalised over the tokens that HF's
    `warper` keeps: the distribution top-k and top-p sampling draw from.

    False failure for a correct implementation: ALPHA (1e-5).
    """
    samples = draw(sampler, logits, **kwargs)
    kept = hf_kept(warper, logits[None])[0]
    assert_samples_follow(samples, logits.softmax(-1) * kept, what)


GENERATOR_ROWS = 200


def assert_uses_the_generator(sampler, logits, probs, what: str, **kwargs) -> None:
    """`sampler` draws with the `generator` it is given, and nothing else random; `probs` is
    the distribution it draws from (exact, or from HF's warper).

    Three batches of GENERATOR_ROWS identical rows: two from generators seeded 7, one seeded 8.
    Those of seed 7 must be equal (a sampler that ignores the generator draws from the global
    random state, which has moved on between the calls: they differ). Those of seeds 7 and 8
    must differ: a correct sampler gives two seeds identical draws with probability at most
    (sum_i p_i^2)^GENERATOR_ROWS, which is asserted below to be under 1e-12.
    Before that, a batch of ONE row must give a tensor of shape [1].
    """
    bound = float(probs.double().square().sum()) ** GENERATOR_ROWS
    assert bound < 1e-12, f"test set-up: false-failure bound {bound:g} too large"
    row, before = logits[None], logits[None].clone()
    one = sampler(row, generator=torch.Generator().manual_seed(7), **kwargs)
    assert_untouched(row, before, what, IN_PLACE)
    assert one.shape == (1,), (
        f"{what}: a batch of one row must give one token, shape (1,), got shape "
        f"{tuple(one.shape)}. `squeeze()` without a dimension also drops the batch dimension "
        "when the batch has one row: squeeze only the sample dimension."
    )
    batch = logits.expand(GENERATOR_ROWS, -1).clone()  # the test's own batch, checked after
    a = sampler(batch, generator=torch.Generator().manual_seed(7), **kwargs)
    b = sampler(batch, generator=torch.Generator().manual_seed(7), **kwargs)
    c = sampler(batch, generator=torch.Generator().manual_seed(8), **kwargs)
    assert_untouched(batch, logits.expand(GENERATOR_ROWS, -1), what, IN_PLACE)
    assert torch.equal(a, b), (
        f"{what}: the same seeded generator must give the same samples, but two generators "
        "seeded alike gave different ones: the draws do not come from the generator you are "
        "given. Pass that generator on to whatever draws (sample_basic, "
        "torch.multinomial)."
    )
    assert not torch.equal(a, c), (
        f"{what}: generators seeded differently gave identical samples: is `generator` passed "
        "on to torch.multinomial (through sample_basic)?"
    )


# --------------------------------------------------------------------------- greedy_and_temperature


@pytest.mark.greedy_and_temperature
def test_greedy_search_picks_the_argmax_of_each_row(impl):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[3, 7] = logits[3, 11] = logits[3].max() + 1.0  # a tie: the lower id wins
    before = logits.clone()
    got = impl.greedy_search(logits)
    assert_untouched(logits, before, "greedy_search", IN_PLACE)
    expected = [max(range(50), key=lambda t, row=row: (row[t].item(), -t)) for row in logits]
    if got.shape == (50,):
        pytest.fail(
            "greedy_search gave 50 tokens for 6 rows: the argmax ran down the batch (dim=0), "
            "one per vocabulary entry. Take it over the LAST dimension, the vocabulary: one "
            "token per row."
        )
    if got.shape == (6, 1):
        pytest.fail(
            "one token per row, but shaped (6, 1): expected shape (6,). Drop the extra "
            "dimension (argmax without keepdim=True)."
        )
    assert got.shape == (6,), f"one token per row: expected shape (6,), got {tuple(got.shape)}"
    assert got.tolist() == expected, (
        f"expected {expected}, got {got.tolist()}. The most likely token is the argmax over "
        "the LAST dimension (the vocabulary), one per row."
    )
    one = impl.greedy_search(logits[3:4])
    assert one.shape == (1,) and one.tolist() == [7], (
        f"a batch of one row: expected tensor([7]) of shape (1,), got {one!r}"
    )


@pytest.mark.greedy_and_temperature
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_apply_temperature_divides_the_logits(impl, temperature):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    got = impl.apply_temperature(logits, temperature)
    assert_untouched(
        logits,
        before,
        "apply_temperature",
        "`logits /= temperature` divides the caller's "
        "logits in place: a division that makes a new tensor leaves them as they were.",
    )
    expected = before / temperature
    after_softmax = before.log_softmax(-1) - math.log(temperature)
    if not torch.allclose(got, expected, atol=1e-6) and torch.allclose(
        got, after_softmax, atol=1e-5
    ):
        pytest.fail(
            f"at temperature {temperature} your result is the log of the probabilities divided "
            "by T: the temperature was applied after the softmax, where it only shifts every "
            "log-probability by the same amount. It divides the logits themselves, before any "
            "softmax."
        )
    probabilities = (before / temperature).softmax(-1)
    if (
        got.shape == expected.shape
        and not torch.allclose(got, expected, atol=1e-6)
        and (
            torch.allclose(got, probabilities, atol=1e-6)
            or torch.allclose(got, before.softmax(-1) / temperature, atol=1e-6)
        )
    ):
        pytest.fail(
            f"at temperature {temperature} apply_temperature returned probabilities (each row "
            "is >= 0 and sums to 1): a softmax was taken. It returns LOGITS, the logits divided "
            "by T; the sampler takes the softmax later, once, after every logit processor has "
            "run (a penalty or a top-k filter on probabilities would not do what it says)."
        )
    if temperature != 1 and torch.allclose(got, before * temperature, atol=1e-6):
        pytest.fail(
            "logits at temperature T are the logits divided by T; yours are the logits times "
            "T (multiplying by T makes low temperatures flatter, which is backwards)."
        )
    assert torch.allclose(got, expected, atol=1e-6), (
        f"at temperature {temperature}: expected the logits divided by T, {expected[0, :4]} "
        f"..., got {got[0, :4]} ... (row 0). "
        f"{explain_difference(got, expected, ('row', 'token'), atol=1e-6, rtol=0)} "
        "Is each logit divided by the temperature, and "
        "nothing else done to it?"
    )


@pytest.mark.greedy_and_temperature
def test_temperature_near_zero_becomes_greedy(impl):
    logits = crafted_logits(3)
    logits[5] = logits.max() + 0.1  # the argmax leads by 0.1: at T=1e-3 that is e^100 to 1
    for temperature in [1e-2, 1e-3]:
        row, before = logits[None], logits[None].clone()
        scaled = impl.apply_temperature(row, temperature)
        assert_untouched(
            row, before, "apply_temperature", "Divide into a new tensor, not in place."
        )
        assert torch.isfinite(scaled).all(), f"temperature {temperature} gave non-finite logits"
        probs = scaled.softmax(-1)[0]
        assert probs[5] > 0.9999, (
            f"at temperature {temperature} the argmax should get nearly all the probability, got "
            f"{probs[5]:.4f}"
        )


# --------------------------------------------------------------------------- frequency penalty

IN_PLACE_LOGITS = (
    "The caller's logits changed: `logits -= ...` (or a loop writing into rows) writes into "
    "them; `logits - ...` makes a new tensor."
)
IN_PLACE_IDS = (
    "The caller's token ids changed: `input_ids += offsets` (or `add_`) writes into them; "
    "`input_ids + offsets` makes a new tensor."
)


@pytest.mark.apply_frequency_penalty
@pytest.mark.parametrize("penalty", [0.5, 2.0, -1.0])
def test_frequency_penalty_matches_the_closed_form(impl, penalty):
    # Row 0 repeats token 3 four times; row 1 never uses it: counts must not leak across rows.
    sequences = [[3, 1, 3, 3, 7, 3, 0], [5, 5, 9, 1, 0, 2, 2]]
    d_vocab = 12
    input_ids = torch.tensor(sequences)
    logits = torch.randn(2, d_vocab, generator=torch.Generator().manual_seed(4))
    original = logits.clone()
    try:
        got = impl.apply_frequency_penalty(input_ids, logits, penalty)
    except RuntimeError as err:
        if "invalid for input of size" in str(err):
            raise AssertionError(
                f"apply_frequency_penalty raised RuntimeError ({err}): the counts came out "
                f"with more bins than batch x d_vocab = {2 * d_vocab}, so a shifted id went "
                "past the last row's range. Row r's bins are r * d_vocab up to (r + 1) * "
                "d_vocab - 1: do the row offsets start at 0 for row 0, or one row too far on?"
            ) from err
        raise
    assert_untouched(logits, original, "apply_frequency_penalty", IN_PLACE_LOGITS)
    assert_untouched(input_ids, torch.tensor(sequences), "apply_frequency_penalty", IN_PLACE_IDS)
    # The known mistakes, recognised by what they return: counts are exact, by Counter.
    counts = torch.tensor([[Counter(seq)[t] for t in range(d_vocab)] for seq in sequences])
    counts = counts.to(original.dtype)

    def gives(wrong: torch.Tensor) -> bool:
        return got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-5)

    if not gives(original - penalty * counts):
        if gives(original + penalty * counts):
            pytest.fail(
                "the penalty was added to the logits instead of subtracted: a positive "
                "frequency penalty must make a token that was already used LESS likely "
                "(logit minus penalty times its count)."
            )
        if gives(original - penalty * (counts > 0).to(original.dtype)):
            pytest.fail(
                "row 0 holds token 3 four times, but its logit fell by the penalty only once: "
                "that is a presence penalty (used or not). A frequency penalty is subtracted "
                "once per occurrence: count how often each token occurs in the row."
            )
        batch_penalty = penalty * counts.sum(dim=0)  # one count over the whole batch
        first_row_only = original.clone()  # a flat bincount with no offsets lands in row 0
        first_row_only[0] -= batch_penalty
        if gives(original - batch_penalty) or gives(first_row_only):
            pytest.fail(
                "the counts are taken over the whole batch, not per row: row 0's logits fell "
                "for tokens that only row 1 holds. Each row counts its own tokens (with one "
                "bincount, give each row its own range of bins: shift row r's ids by "
                "r * d_vocab)."
            )
    for row, seq in enumerate(sequences):
        row_counts = Counter(seq)
        for token in range(d_vocab):
            expected = original[row, token].item() - penalty * row_counts[token]
            assert math.isclose(got[row, token].item(), expected, abs_tol=1e-5), (
                f"row {row}, token {token} occurs {row_counts[token]} times: expected logit "
                f"{expected:.4f}, got {got[row, token].item():.4f}. The penalty is subtracted "
                "once per occurrence, per row"
            )


@pytest.mark.apply_frequency_penalty
def test_frequency_penalty_counts_only_where_the_mask_is_true(impl):
    # Left padding with id 6 (not 0: a hard-coded pad id must not pass); row 1 has no padding.
    sequences = torch.tensor([[6, 6, 6, 3, 6, 3], [6, 2, 2, 4, 1, 6]])
    mask = torch.tensor([[False, False, False, True, True, True], [True] * 6])
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(5))
    original, original_ids, original_mask = logits.clone(), sequences.clone(), mask.clone()
    got = impl.apply_frequency_penalty(sequences, logits, 1.0, mask)
    assert_untouched(logits, original, "apply_frequency_penalty", IN_PLACE_LOGITS)
    assert_untouched(sequences, original_ids, "apply_frequency_penalty", IN_PLACE_IDS)
    assert_untouched(
        mask, original_mask, "apply_frequency_penalty", "The caller's attention mask changed."
    )
    for row in range(2):
        counts = Counter(sequences[row][mask[row]].tolist())
        expected = torch.tensor([original[row, t].item() - counts[t] for t in range(8)])
        assert torch.allclose(got[row], expected, atol=1e-5), (
            f"row {row}: with a mask, count only the positions where it is True (padding is "
            f"not text): expected {expected.tolist()}, got {got[row].tolist()}"
        )


@pytest.mark.apply_frequency_penalty
def test_frequency_penalty_makes_its_tensors_on_the_inputs_device(impl):
    """On a GPU, row offsets made with `torch.arange(batch)` sit on the CPU beside token ids on
    the GPU, and the addition fails. On a CPU nothing shows, and `bincount` cannot run on
    PyTorch's meta device, so the function's source is read (tests/graded/_device.py)."""
    assert_made_on_the_inputs_device(
        impl.apply_frequency_penalty, "apply_frequency_penalty", "the token ids and logits"
    )


# --------------------------------------------------------------------------- sample_basic


def why_multinomial_refused(sample_basic) -> str:
    """Which known mistake makes torch.multinomial refuse what `sample_basic` hands it, probed
    with one row of finite logits, some negative, and one of positive logits. Without a
    softmax, only the first is refused; log-probabilities (negative) are refused in both; a
    softmax down the batch of one row gives all ones, which it takes."""

    def refuses(row: list[float]) -> bool:
        try:
            sample_basic(torch.tensor([row]), generator=torch.Generator())
        except RuntimeError:
            return True
        except Exception:  # noqa: BLE001 - a probe: any other failure means "not this slip"
            return False
        return False

    if refuses([1.0, 0.5, 2.0, 3.0]):
        return (
            "on a batch whose token 0 has logit -inf, and on a single row of positive logits "
            "too: what reaches torch.multinomial "
            "is negative even there. Are those LOG-probabilities (a log_softmax)? "
            "torch.multinomial takes probabilities, finite and >= 0."
        )
    if refuses([-1.0, 0.5, 2.0, -3.0]):
        return (
            "on a batch whose token 0 has logit -inf, and on a single row of finite logits with "
            "some below 0 too, where a softmax is "
            "well defined: were the logits handed to torch.multinomial as they are? It takes "
            "probabilities (finite and >= 0); logits can be negative or -inf. Is the softmax "
            "over the vocabulary missing?"
        )
    return (
        "on a batch of identical rows whose token 0 has logit -inf (a banned token). "
        "torch.multinomial takes probabilities, finite and >= 0. Is the softmax taken over the "
        "batch (dim=0) instead of the vocabulary (dim=-1)? Down the batch, token 0's column is "
        "all -inf, and its softmax is 0/0 = nan."
    )


@pytest.mark.sample_basic
@pytest.mark.parametrize("seed", [0, 1])
def test_sample_basic_follows_the_softmax(impl, seed):
    # False failure for a correct implementation: ALPHA (1e-5) per seed.
    logits = crafted_logits(10 + seed)
    logits[0] = float("-inf")  # a banned token must never come out
    try:
        samples = draw(impl.sample_basic, logits, seed=seed, who="sample_basic")
    except NotImplementedError:
        raise
    except RuntimeError as err:  # torch.multinomial refuses inf, nan or a negative entry
        raise AssertionError(
            f"sample_basic raised {type(err).__name__} ({err}) "
            + why_multinomial_refused(impl.sample_basic)
        ) from err
    assert_samples_follow(samples, logits.softmax(-1), "sample_basic")


@pytest.mark.sample_basic
@pytest.mark.parametrize("shift", [1000.0, -1000.0])
def test_sample_basic_is_unchanged_by_shifting_every_logit(impl, shift):
    # False failure for a correct implementation: ALPHA (1e-5).
    # softmax(x + c) = softmax(x): the exact distribution is that of the shifted logits, in
    # float64. exp(x) overflows to inf above ~88 in float32, and underflows to 0 below ~-103.
    logits = crafted_logits(13) + shift
    why = (
        f"With every logit shifted by {shift:+g} the distribution is the same (softmax does "
        "not change when all logits move together), but exp(logits) "
        + ("overflows to inf" if shift > 0 else "underflows to 0")
        + " in float32. Which of PyTorch's functions turns logits into probabilities and "
        "subtracts the row's max first? "
        "do not hand exp(logits) (or exp(logits) / its sum) to torch.multinomial."
    )
    try:
        samples = draw(impl.sample_basic, logits, seed=3, who="sample_basic")
    except NotImplementedError:
        raise
    except RuntimeError as err:  # torch.multinomial refuses inf, nan or an all-zero row
        raise AssertionError(f"sample_basic raised {type(err).__name__} ({err}). {why}") from err
    assert_samples_follow(samples, logits.double().softmax(-1), f"sample_basic: {why}")


@pytest.mark.sample_basic
def test_sample_basic_uses_the_generator(impl):
    logits = crafted_logits(5)
    assert_uses_the_generator(impl.sample_basic, logits, logits.softmax(-1), "sample_basic")


@pytest.mark.sample_basic
def test_sample_basic_on_a_batch_of_one_row(impl):
    # Exact: one finite logit, so the token is certain.
    logits = torch.full((1, 30), float("-inf"))
    logits[0, 13] = 0.5
    got = impl.sample_basic(logits, generator=torch.Generator().manual_seed(0))
    assert got.shape == (1,), (
        f"a batch of one row must give shape (1,), got {tuple(got.shape)}: `squeeze()` without "
        "a dimension drops the batch dimension too; squeeze only the sample dimension"
    )
    assert got.tolist() == [13], f"token 13 is the only one possible, got {got.tolist()}"


# --------------------------------------------------------------------------- top-k


def top_k_cases():
    g = torch.Generator().manual_seed(20)
    cases = [(torch.randn(30, generator=g), k) for k in [1, 2, 5, 29, 30, 45]]
    tied = torch.tensor([3.0, 1.0, 2.0, 2.0, 2.0, 0.5, -1.0, 2.0])  # ties at the k-th value
    cases += [(tied, k) for k in [1, 2, 3, 5, 6]]
    dominant = torch.full((16,), -2.0)
    dominant[9] = 30.0
    cases += [(dominant, 1), (dominant, 4)]
    flat = torch.zeros(10)
    cases += [(flat, 3)]
    return cases


@pytest.mark.sample_top_k
def test_filter_top_k_keeps_what_hf_keeps(impl):
    for logits, k in top_k_cases():
        row, before = logits[None], logits[None].clone()
        got = impl.filter_top_k(row, k)[0]
        assert_untouched(row, before, "filter_top_k", IN_PLACE)
        kept = torch.isfinite(got)
        expected = hf_kept(TopKLogitsWarper(top_k=k), logits[None])[0]
        if (
            not torch.equal(kept, expected)
            and (got >= 0).all()
            and float(got.sum()) < 1 + 1e-4
            and bool((logits < 0).any())
        ):
            pytest.fail(
                f"top-k with k={k}: filter_top_k returned probabilities (each >= 0, summing to "
                "at most 1, where the logits have negatives): a softmax was taken. It returns "
                "LOGITS, the removed ones set to -inf; sample_basic takes the softmax. (A "
                "removed token at probability 0 becomes exp(0) = 1 there, as likely as any "
                "other.)"
            )
        if not torch.equal(kept, expected) and k <= len(logits):
            kth = logits.sort(descending=True).values[k - 1]
            if torch.equal(kept, logits > kth):
                pytest.fail(
                    f"top-k with k={k}: HF keeps {int(expected.sum())} tokens, you keep "
                    f"{int(kept.sum())}, only those ABOVE the k-th largest logit ({kth:.2f}). The "
                    "k-th largest itself stays, and so does every logit tied with it: remove "
                    "only the logits strictly below it, not those equal to it."
                )
        assert torch.equal(kept, expected), (
            f"top-k with k={k} on logits {[round(x, 2) for x in logits.tolist()]}: HF keeps "
            f"{expected.nonzero().flatten().tolist()}, you keep {kept.nonzero().flatten().tolist()}"
            ". Every token whose logit is >= the k-th largest stays (ties included), and k "
            "larger than the vocabulary keeps everything."
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


@pytest.mark.sample_top_k
def test_filter_top_k_works_row_by_row(impl):
    logits = torch.randn(4, 25, generator=torch.Generator().manual_seed(21))
    before = logits.clone()
    try:
        got = torch.isfinite(impl.filter_top_k(logits, 3))
    except RuntimeError as err:
        if "must match the size" not in str(err):
            raise
        pytest.fail(
            f"filter_top_k on 4 rows of 25 logits raised RuntimeError: {str(err).splitlines()[0]}"
            ". The threshold, one k-th largest logit per row, has shape [batch]: against "
            "[batch, d_vocab] broadcasting lines it up with the vocabulary, not with the rows. "
            "Keep a size-1 axis for the vocabulary."
        )
    assert_untouched(logits, before, "filter_top_k", IN_PLACE)
    expected = hf_kept(TopKLogitsWarper(top_k=3), logits)
    assert torch.equal(got, expected), "each row keeps its own top k (use dim=-1)"


@pytest.mark.sample_top_k
@pytest.mark.parametrize("k", [1, 4])
def test_sample_top_k_follows_the_renormalised_distribution(impl, k):
    # False failure for a correct implementation: ALPHA (1e-5).
    warper = TopKLogitsWarper(top_k=k)
    what = f"sample_top_k with k={k}"
    assert_draws_follow_what_hf_keeps(
        impl.sample_top_k, crafted_logits(22), warper, what, k=k, who="sample_top_k"
    )


@pytest.mark.sample_top_k
def test_sample_top_k_uses_the_generator(impl):
    logits = crafted_logits(23)
    kept = hf_kept(TopKLogitsWarper(top_k=6), logits[None])[0]
    probs = logits.softmax(-1) * kept
    assert_uses_the_generator(impl.sample_top_k, logits, probs / probs.sum(), "sample_top_k", k=6)


# --------------------------------------------------------------------------- top-p


def top_p_cases():
    g = torch.Generator().manual_seed(30)
    cases = []
    for i in range(40):  # random logits of many spreads, random top_p and min_tokens_to_keep
        logits = torch.randn(40, generator=g) * (0.5 + 3 * torch.rand(1, generator=g).item())
        top_p = round(torch.rand(1, generator=g).item(), 3)
        cases.append((logits, top_p, 1 if i % 3 else 1 + i % 7))
    dominant = torch.full((12,), 0.0)
    dominant[4] = 12.0  # ~0.9999 of the mass on token 4
    cases += [(dominant, 0.5, 1), (dominant, 0.9, 1), (dominant, 0.9, 3)]
    flat = torch.zeros(10)  # every token 0.1: top_p 0.35 needs 4 tokens
    cases += [(flat, 0.35, 1), (flat, 0.95, 1)]
    cases += [(torch.randn(20, generator=g), top_p, 1) for top_p in [0.0, 1.0]]
    two = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    cases += [(two, 0.49, 1), (two, 0.81, 1), (two, 0.96, 1)]
    return cases


def top_p_against_hf(impl, logits, top_p: float, min_keep: int):
    """(the learner's filtered row, the tokens it keeps, the tokens HF's TopPLogitsWarper
    keeps) for one logit vector, handed over as a batch of one and checked afterwards."""
    row, before = logits[None], logits[None].clone()
    got = impl.filter_top_p(row, top_p, min_keep)[0]
    assert_untouched(row, before, "filter_top_p", IN_PLACE)
    warper = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=min_keep)
    return got, torch.isfinite(got), hf_kept(warper, logits[None])[0]


def diagnose_top_p(logits, top_p: float, min_keep: int, kept, expected) -> None:
    """Fail with the known mistake whose kept set is the learner's `kept`, if one is."""
    n_kept, n_hf = int(kept.sum()), int(expected.sum())
    where = f"top_p={top_p}, min_tokens_to_keep={min_keep}: HF keeps {n_hf} tokens, you keep"
    if n_kept < min(min_keep, len(logits)):
        pytest.fail(
            f"{where} {n_kept}, fewer than min_tokens_to_keep={min_keep}: the first "
            "min_tokens_to_keep tokens (in sorted order) stay whatever their mass."
        )
    sorted_logits, order = logits.sort(descending=True)

    def kept_by(cumulative: torch.Tensor) -> torch.Tensor:
        """The kept set when `cumulative` (sorted order) is taken for the running total."""
        before = torch.cat([torch.zeros(1), cumulative[:-1]])
        remove = before >= top_p
        remove[:min_keep] = False
        return torch.zeros_like(remove).scatter(0, order, ~remove)

    if torch.equal(kept, kept_by(sorted_logits.cumsum(-1))):
        pytest.fail(
            f"{where} {n_kept}: the running total is one of the LOGITS, not of the "
            "probabilities. top_p is a probability mass: add up the probabilities (the "
            "softmax of the sorted logits), most likely first."
        )
    if torch.equal(kept, kept_by(sorted_logits.softmax(-1))):
        pytest.fail(
            f"{where} {n_kept}: each token was compared with the probability of the one just "
            "before it alone, not with the running total of all the tokens before it. Is the "
            "cumulative sum taken over the vocabulary (the last dimension)? Over the batch, a "
            "batch of one row, it changes nothing."
        )
    if n_kept == n_hf:
        pytest.fail(
            f"{where} {n_kept} too, but not the same ones. The mask is computed in sorted "
            "order: it must go back to each token's original order. `scatter` with the sort "
            "indices puts sorted entry i back at position order[i]; `gather` reads from "
            "position order[i], which applies the permutation the wrong way."
        )
    cumulative = logits.softmax(-1).sort(descending=True).values.cumsum(-1)
    if n_kept == max(min_keep, int((cumulative <= top_p).sum())):
        pytest.fail(
            f"{where} {n_kept}: you drop the token that crosses top_p. The kept set must "
            "REACH top_p, so the token that carries the running total past top_p stays: a "
            "token is removed only when the tokens before it already sum to top_p or more."
        )


@pytest.mark.sample_top_p
def test_filter_top_p_keeps_what_hf_keeps(impl):
    for logits, top_p, min_keep in top_p_cases():
        got, kept, expected = top_p_against_hf(impl, logits, top_p, min_keep)
        # Tied logits can be kept in either order: compare the kept logit values.
        same = sorted(logits[kept].tolist()) == sorted(logits[expected].tolist())
        probs = [round(p, 3) for p in logits.softmax(-1).sort(descending=True).values.tolist()]
        if not same:
            diagnose_top_p(logits, top_p, min_keep, kept, expected)
        assert same, (
            f"top_p={top_p}, min_tokens_to_keep={min_keep}, probabilities (sorted) "
            f"{probs[:12]}...: HF keeps {int(expected.sum())} tokens, you keep "
            f"{int(kept.sum())}. Keep the smallest set of most likely tokens whose total "
            "probability reaches top_p: a token is kept if the tokens more likely than it sum "
            "to LESS than top_p. Never fewer than min_tokens_to_keep."
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


def exact_top_p_cases():
    """(logits, top_p, min_tokens_to_keep) where top_p lands EXACTLY on a running total.

    Tied logits make every probability a power of two (1/2, 1/4, 1/8: exp(0) / n, exactly),
    so every running total is exact in float32, whichever way it is summed, and the float
    comparison at the boundary is exact too: the answer does not depend on rounding.
    """
    inf = float("inf")
    cases = [(torch.zeros(2), 0.5, 1)]  # 1/2 reaches 1/2: one token is enough
    cases += [(torch.zeros(4), p, 1) for p in [0.25, 0.5, 0.75]]
    cases += [(torch.full((8,), 3.0), p, 1) for p in [0.125, 0.375, 0.625, 0.875]]
    four = torch.tensor([0.0, -inf, 0.0, -inf, 0.0, 0.0, -inf, -inf])  # four tokens of 1/4
    cases += [(four, 0.5, 1), (four, 0.75, 1), (torch.zeros(4), 0.25, 3), (four, 0.5, 3)]
    return cases


@pytest.mark.sample_top_p
def test_filter_top_p_at_the_exact_boundary_matches_hf(impl):
    for logits, top_p, min_keep in exact_top_p_cases():
        got, kept, expected = top_p_against_hf(impl, logits, top_p, min_keep)
        n_kept, n_hf = int(kept.sum()), int(expected.sum())
        n_possible = int(torch.isfinite(logits).sum())
        assert n_kept == n_hf, (
            f"top_p={top_p}, min_tokens_to_keep={min_keep}, {n_possible} equally likely tokens "
            f"(each exactly 1/{n_possible}): HF keeps {n_hf}, you keep {n_kept}. "
            + (
                f"The first {n_hf} token(s) already reach exactly {top_p}: the next one is "
                "not needed. A token is removed when the tokens before it sum to "
                "AT LEAST top_p: reaching it exactly counts."
                if n_kept > n_hf
                else "A token is kept while the tokens before it sum to LESS than top_p (the "
                "token that reaches top_p stays), and never fewer than min_tokens_to_keep."
            )
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


@pytest.mark.sample_top_p
def test_filter_top_p_at_a_boundary_reached_through_rounding_matches_hf(impl):
    for probs, top_p in rounded_top_p_cases_here():
        logits = torch.tensor(probs).log()
        got, kept, expected = top_p_against_hf(impl, logits, top_p, 1)
        n_kept, n_hf = int(kept.sum()), int(expected.sum())
        assert n_kept == n_hf, (
            f"probabilities {probs}, top_p={top_p}: the {n_hf} most likely reach {top_p} "
            f"exactly (HF keeps {n_hf}), you keep {n_kept}. "
            + (
                "Is the mass before each token computed as `cumulative - p`? That subtraction "
                "rounds (0.89999998 - 0.09999999 is 0.79999995, under 0.8). Use the running "
                "total one place back: the sum of the tokens before each one, added up "
                "without a subtraction."
                if n_kept > n_hf
                else "A token is kept while the tokens before it sum to LESS than top_p."
            )
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


@pytest.mark.sample_top_p
def test_filter_top_p_works_row_by_row(impl):
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(31)) * 2
    before = logits.clone()
    got = torch.isfinite(impl.filter_top_p(logits, 0.7))
    assert_untouched(logits, before, "filter_top_p", IN_PLACE)
    expected = hf_kept(TopPLogitsWarper(top_p=0.7), logits)
    assert torch.equal(got, expected), (
        "each row keeps its own nucleus: sort along dim=-1, and map the mask back to each "
        "row's original order (scatter with the sort indices)"
    )


@pytest.mark.sample_top_p
@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_sample_top_p_follows_the_renormalised_distribution(impl, top_p):
    # False failure for a correct implementation: ALPHA (1e-5).
    warper = TopPLogitsWarper(top_p=top_p)
    what = f"sample_top_p with top_p={top_p}"
    assert_draws_follow_what_hf_keeps(
        impl.sample_top_p, crafted_logits(32), warper, what, top_p=top_p, who="sample_top_p"
    )


@pytest.mark.sample_top_p
def test_sample_top_p_uses_the_generator(impl):
    logits = crafted_logits(33)
    kept = hf_kept(TopPLogitsWarper(top_p=0.8), logits[None])[0]
    probs = logits.softmax(-1) * kept
    assert_uses_the_generator(
        impl.sample_top_p, logits, probs / probs.sum(), "sample_top_p", top_p=0.8
    )


# --------------------------------------------------------------------------- sample (the loop)


def assert_prompt_untouched(ids: torch.Tensor, tokenizer, prompt: str) -> None:
    assert_untouched(
        ids,
        torch.tensor(tokenizer.encode(prompt)),
        "TransformerSampler.sample",
        "Build the growing sequence with torch.cat, which makes a new tensor.",
    )


def diagnose_greedy(sampler, hf, ids, got: list[int], expected: list[int]) -> None:
    """Fail with the known mistake that explains a greedy run `got` (40 new tokens asked for)
    that differs from HF's `expected`, if one does."""
    n_new = len(expected) - len(ids)
    if got == expected[:-1]:
        pytest.fail(
            f"you generate {n_new - 1} new tokens, HF {n_new}: one token too few. Each of the "
            "max_tokens_generated steps adds one token."
        )
    with torch.no_grad():
        after_first = int(hf(ids[None, :1]).logits[0, -1].argmax())
    if len(got) == len(expected) and set(got[len(ids) :]) == {after_first}:
        pytest.fail(
            "every new token is the model's prediction after the prompt's FIRST token: you "
            "read the logits of the first position. The next token's logits are those of the "
            "last position (index -1 of the position dimension)."
        )
    again = sampler.sample(ids, n_new, temperature=0.0)
    if again.tolist() != got:
        pytest.fail(
            "temperature=0.0 is greedy and gives the same text every time, but two calls gave "
            "different text: the sampling options (temperature, top_k, ...) that sample gets "
            "as **kwargs did not reach sample_next_token. Pass them on."
        )


@pytest.mark.sample
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_sampling_equals_hf_generate(impl, shipped, hf, prompt):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(prompt))
    expected = hf_greedy(hf, ids, 40)
    sampler = impl.TransformerSampler(model, tokenizer)
    got = sampler.sample(ids, 40, temperature=0.0)
    assert_prompt_untouched(ids, tokenizer, prompt)
    assert isinstance(got, torch.Tensor), "given token ids, sample must return token ids"
    if got.tolist() != expected:
        diagnose_greedy(sampler, hf, ids, got.tolist(), expected)
    assert got.tolist() == expected, (
        f"greedy continuation differs from GPT2LMHeadModel.generate(do_sample=False):\n"
        f"HF:   {tokenizer.decode(expected[len(ids) :])!r}\n"
        f"you:  {tokenizer.decode(got[len(ids) :])!r}\n"
        "Does each step feed the WHOLE sequence so far and read the logits at the LAST position?"
    )


@pytest.mark.sample
def test_sample_returns_text_for_text(impl, shipped):
    model, tokenizer = shipped
    prompt = PROMPTS[0]
    text = impl.TransformerSampler(model, tokenizer).sample(prompt, 12, temperature=0.0)
    assert isinstance(text, str) and text.startswith(prompt), (
        "given a string, sample returns the prompt followed by its continuation, as a string"
    )
    n_new = len(tokenizer.encode(text)) - len(tokenizer.encode(prompt))
    assert 10 <= n_new <= 14, f"asked for 12 new tokens, got about {n_new}"


@pytest.mark.sample
def test_seeded_sampling_is_reproducible(impl, shipped):
    model, tokenizer = shipped
    sampler = impl.TransformerSampler(model, tokenizer)
    ids = torch.tensor(tokenizer.encode(PROMPTS[1]))
    a = sampler.sample(ids, 25, seed=3, temperature=1.0)
    b = sampler.sample(ids, 25, seed=3, temperature=1.0)
    c = sampler.sample(ids, 25, seed=4, temperature=1.0)
    assert a.tolist() == b.tolist(), (
        "the same seed must give the same text, but two runs with seed=3 differ: the draws "
        "do not come from the seeded generator. Pass it on to sample_next_token."
    )
    assert a.tolist() != c.tolist(), "different seeds gave the same 25 tokens: is seed used?"


class CoinFlip(torch.nn.Module):
    """Wraps a model's config: at every position, tokens `heads` and `tails` are equally likely
    and every other token is out (logit -1e4), whatever the text."""

    def __init__(self, model, heads: int, tails: int):
        super().__init__()
        self.cfg, self.heads, self.tails = model.cfg, heads, tails
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter: the sampler's device

    def forward(self, tokens):
        logits = torch.full((*tokens.shape, self.cfg.d_vocab), -1e4)
        logits[..., [self.heads, self.tails]] = 0.0
        return logits


@pytest.mark.sample
def test_each_step_draws_new_random_numbers(impl, shipped):
    model, tokenizer = shipped
    heads, tails, n_new = 100, 200, 24
    ids = torch.tensor(tokenizer.encode(PROMPTS[1]))
    got = impl.TransformerSampler(CoinFlip(model, heads, tails), tokenizer).sample(
        ids, n_new, seed=3, temperature=1.0
    )
    new = got[len(ids) :].tolist()
    # A fair coin at each of 24 independent steps gives one side only with probability 2^-23.
    assert len(set(new)) > 1, (
        f"with seed=3, a model whose next token is a fair coin between ids {heads} and {tails} "
        f"at every step gave {new}: the same token all {len(new)} times, a chance of 1 in 8 "
        "million for independent draws. Each step reuses the same random numbers: is a "
        "generator made and seeded again at every step? Seed one before the loop and let every "
        "step draw from it: its state moves on after each draw."
    )


class EosAfter(torch.nn.Module):
    """Wraps a model: once the sequence is `stop_len` long, the end-of-text token wins."""

    def __init__(self, model, stop_len: int, eos: int):
        super().__init__()
        self.model, self.cfg, self.stop_len, self.eos = model, model.cfg, stop_len, eos

    def forward(self, tokens):
        logits = self.model(tokens).clone()
        if tokens.shape[1] >= self.stop_len:
            logits[:, -1, self.eos] = 1e4
        return logits


@pytest.mark.sample
def test_sampling_stops_at_end_of_text(impl, shipped):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[0]))
    eos = tokenizer.eos_token_id
    fake = EosAfter(model, len(ids) + 5, eos)
    got = impl.TransformerSampler(fake, tokenizer).sample(ids, 30, temperature=1.0, seed=0)
    assert len(got) == len(ids) + 6 and got[-1].item() == eos, (
        f"the end-of-text token (id {eos}) comes 6th: generation should stop right after it, "
        f"with it as the last token; got {len(got) - len(ids)} new tokens"
    )


@pytest.mark.sample
def test_sampling_goes_on_past_end_of_text_without_stop_at_eos(impl, shipped, hf):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[1]))
    eos = tokenizer.eos_token_id
    fake = EosAfter(model, len(ids) + 5, eos)  # from the 6th new token on, EOS every time
    got = impl.TransformerSampler(fake, tokenizer).sample(
        ids, 9, temperature=0.0, stop_at_eos=False
    )
    assert_prompt_untouched(ids, tokenizer, PROMPTS[1])
    # Ground truth: HF's 5 greedy tokens (none of them EOS), then the wrapper's EOS, 4 times.
    expected = hf_greedy(hf, ids, 5) + [eos] * 4
    assert got.tolist() == expected, (
        f"with stop_at_eos=False, generation must go on past the end-of-text token (id {eos}) "
        f"for all 9 new tokens: expected {expected[len(ids) :]}, got {got[len(ids) :].tolist()}."
        " Stop early only when stop_at_eos is set and the new token is end-of-text."
    )


@pytest.mark.sample
def test_sampling_past_the_context_window_reads_the_last_n_ctx_tokens(impl, shipped, hf):
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    text = (PROMPTS[0] + " ") * 40
    ids = torch.tensor(tokenizer.encode(text))[: n_ctx - 3]
    got = impl.TransformerSampler(model, tokenizer).sample(ids, 8, temperature=0.0)
    # Ground truth: HF's logits on the most recent n_ctx tokens, step by step.
    expected = hf_window_greedy(hf, ids.tolist(), 8, lambda t, length: max(0, length - n_ctx))
    if len(got) == n_ctx and got.tolist() == expected[-n_ctx:]:
        pytest.fail(
            f"you return only the last {n_ctx} tokens of the {len(expected)}: the model reads "
            "at most n_ctx tokens, but sample returns the whole sequence, every token of the "
            "prompt included. Crop only what goes into the model."
        )
    short = hf_window_greedy(hf, ids.tolist(), 8, lambda t, length: max(0, length - n_ctx + 1))
    if got.tolist() == short != expected:
        pytest.fail(
            f"past {n_ctx} tokens your model reads the most recent {n_ctx - 1}, one token "
            f"fewer than it can: the window is n_ctx = {n_ctx} tokens long. Is the crop off "
            "by one?"
        )
    assert got.tolist() == expected, (
        f"past {n_ctx} tokens the model can only read the most recent n_ctx of them: at each "
        "step, crop what goes INTO the model to its last n_ctx tokens (the output keeps every "
        "token)"
    )


def hf_penalised_greedy(hf, ids: list[int], n_new: int, penalty: float, window: int, edit=None):
    """Greedy decoding by HF's logits on the last `window` tokens (optionally edited by `edit`),
    minus `penalty` times each token's exact count in the WHOLE sequence so far."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = hf(torch.tensor([ids[-window:]])).logits[0, -1]
            if edit is not None:
                logits = edit(logits)
            counts = torch.bincount(torch.tensor(ids), minlength=logits.shape[-1])
            ids.append(int((logits - penalty * counts).argmax()))
    return ids


@pytest.mark.sample
def test_frequency_penalty_reaches_the_loop(impl, shipped, hf):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[2]))
    penalty = 1.5
    got = impl.TransformerSampler(model, tokenizer).sample(
        ids, 12, temperature=0.0, frequency_penalty=penalty
    )
    expected = hf_penalised_greedy(hf, ids.tolist(), 12, penalty, model.cfg.n_ctx)
    assert got.tolist() == expected, (
        "with frequency_penalty, each token's logit falls by the penalty times its count in "
        "the whole sequence so far (prompt included): pass the kwargs on to sample_next_token "
        "with input_ids as a [1, seq] batch"
    )


class Favour(torch.nn.Module):
    """Wraps a model: `token`'s logit is set `lead` above the best logit of each position."""

    def __init__(self, model, token: int, lead: float):
        super().__init__()
        self.model, self.cfg, self.token, self.lead = model, model.cfg, token, lead

    def edit(self, logits):
        logits = logits.clone()
        logits[..., self.token] = logits.max(dim=-1).values + self.lead
        return logits

    def forward(self, tokens):
        return self.edit(self.model(tokens))


@pytest.mark.sample
def test_frequency_penalty_counts_the_tokens_generated_so_far(impl, shipped, hf):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[2]))
    (crown,) = tokenizer.encode(" crown")
    assert crown not in ids.tolist()
    # The wrapper sets " crown" 2.5 above the best logit, and the prompt never holds it: with
    # penalty 1 it wins while it has been generated at most twice, then its count holds it back.
    fake, penalty, n_new = Favour(model, crown, 2.5), 1.0, 8
    got = impl.TransformerSampler(fake, tokenizer).sample(
        ids, n_new, temperature=0.0, frequency_penalty=penalty
    )
    expected = hf_penalised_greedy(hf, ids.tolist(), n_new, penalty, model.cfg.n_ctx, fake.edit)
    new_got, new_expected = got[len(ids) :].tolist(), expected[len(ids) :]
    if new_got.count(crown) > new_expected.count(crown) and new_got[:3] == [crown] * 3:
        pytest.fail(
            f"' crown' (id {crown}) is not in the prompt; a wrapped model puts it 2.5 above the "
            f"best logit at every step. With frequency_penalty {penalty} each time it is "
            f"generated its logit falls by {penalty} more, so it should win only "
            f"{new_expected.count(crown)} times: expected new tokens {new_expected}, got "
            f"{new_got} (' crown' {new_got.count(crown)} times). Does the penalty count only "
            "the prompt's tokens? The tokens generated so far are text too: at each step, "
            "count the whole sequence so far."
        )
    assert got.tolist() == expected, (
        "with frequency_penalty, each token's logit falls by the penalty times its count in "
        f"the whole sequence so far, the generated tokens included: expected new tokens "
        f"{new_expected}, got {new_got} (id {crown} is ' crown', favoured by a wrapped model)"
    )


@pytest.mark.sample
def test_frequency_penalty_counts_tokens_the_model_no_longer_sees(impl, shipped, hf):
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    (crown,) = tokenizer.encode(" crown")
    text = tokenizer.encode((PROMPTS[2] + " ") * 30)[: n_ctx - 4]
    assert crown not in text
    # 30 " crown"s, then text: the model's window starts at the 27th " crown", so it sees 4 of
    # them. The wrapper sets " crown" 8 above the best logit: with all 30 counted (penalty 1) it
    # falls to 22 below, with only the 4 in the window counted it would win at once.
    ids = torch.tensor([crown] * 30 + text)
    fake, penalty = Favour(model, crown, 8.0), 1.0
    got = impl.TransformerSampler(fake, tokenizer).sample(
        ids, 3, temperature=0.0, frequency_penalty=penalty
    )
    expected = hf_penalised_greedy(hf, ids.tolist(), 3, penalty, n_ctx, fake.edit)
    assert got.tolist() == expected, (
        f"the frequency penalty counts every token of the sequence so far, also those that no "
        f"longer fit in the model's window of n_ctx={n_ctx} tokens: crop only what the model "
        f"reads, and give sample_next_token the WHOLE input_ids. New tokens: expected "
        f"{expected[len(ids) :]}, got {got[len(ids) :].tolist()} (id {crown} is ' crown', which "
        "only the first 30 tokens hold)"
    )


# --------------------------------------------------------------------------- no-repeat n-grams


def ngram_bans(row: list[int], n: int, skip_last: bool = False, ban_first: bool = False):
    """The tokens a known mistake bans in one row: with `skip_last`, the row's last n-gram is
    not counted; with `ban_first`, the first token of a matching n-gram is banned instead of its
    last. Used to name the mistake only; HF's processor is the ground truth."""
    if len(row) < n:
        return set()
    prefix = row[len(row) - (n - 1) :]
    grams = [row[i : i + n] for i in range(len(row) - n + 1)]
    grams = grams[:-1] if skip_last else grams
    return {gram[0] if ban_first else gram[-1] for gram in grams if gram[:-1] == prefix}


@pytest.mark.no_repeat_ngram
@pytest.mark.parametrize("ngram_size", [1, 2, 3, 4])
def test_banned_ngram_tokens_match_hf(impl, ngram_size):
    g = torch.Generator().manual_seed(40 + ngram_size)
    d_vocab = 6  # a small vocabulary, so that n-grams repeat
    raised = None  # the first error, reported after the other lengths had their say
    for seq_len in [1, 2, 3, 5, 9, 17]:
        tokens = torch.randint(0, d_vocab, (4, seq_len), generator=g)
        before = tokens.clone()
        try:
            got = impl.banned_ngram_tokens(tokens, ngram_size, d_vocab)
        except NotImplementedError:
            raise
        except (RuntimeError, IndexError) as err:
            raised = raised or (seq_len, err)
            continue
        assert_untouched(tokens, before, "banned_ngram_tokens", "Leave `tokens` as it is.")
        hf = NoRepeatNGramLogitsProcessor(ngram_size)(tokens, torch.zeros(4, d_vocab))
        expected = torch.isinf(hf)
        assert got.dtype == torch.bool and got.shape == (4, d_vocab)
        for row in range(4):
            seq, banned = tokens[row].tolist(), set(got[row].nonzero().flatten().tolist())
            if not torch.equal(got[row], expected[row]):
                if banned == ngram_bans(seq, ngram_size, skip_last=True):
                    pytest.fail(
                        f"ngram_size={ngram_size}, sequence {seq}: HF bans "
                        f"{expected[row].nonzero().flatten().tolist()}, you ban "
                        f"{sorted(banned)}: the last n-gram of the row (the one that ends at "
                        "its last token) was not counted. Every n-gram of the row counts."
                    )
                if banned == ngram_bans(seq, ngram_size, ban_first=True):
                    pytest.fail(
                        f"ngram_size={ngram_size}, sequence {seq}: HF bans "
                        f"{expected[row].nonzero().flatten().tolist()}, you ban "
                        f"{sorted(banned)}: the first token of each matching n-gram. Ban its "
                        "LAST token: the one that would follow the prefix again."
                    )
            assert torch.equal(got[row], expected[row]), (
                f"ngram_size={ngram_size}, sequence {tokens[row].tolist()}: HF bans "
                f"{expected[row].nonzero().flatten().tolist()}, you ban "
                f"{got[row].nonzero().flatten().tolist()}. A token is banned if the last "
                f"{ngram_size - 1} tokens followed by it already occur in the sequence."
            )
    if raised is not None:
        seq_len, err = raised
        hint = (
            " With ngram_size=1 the prefix to match is empty, so every token already in the "
            "row is banned. Is the prefix taken as tokens[:, -(ngram_size - 1):]? For "
            "ngram_size=1 that is tokens[:, -0:], and -0 is 0: the whole row, not an empty "
            "slice."
            if ngram_size == 1
            else f" A row of {seq_len} tokens holds no complete n-gram of {ngram_size}: "
            "nothing can be repeated yet, so no token is banned (all False). A window longer "
            "than the row is an error to unfold and an empty slice to indexing."
            if seq_len < ngram_size
            else ""
        )
        raise AssertionError(
            f"banned_ngram_tokens raised {type(err).__name__} ({err}) with "
            f"ngram_size={ngram_size} on 4 sequences of {seq_len} tokens.{hint}"
        ) from err


@pytest.mark.no_repeat_ngram
def test_banned_ngram_tokens_makes_its_tensors_on_the_tokens_device(impl):
    """On a GPU, a `banned` table made without `device=` sits on the CPU beside tokens on the
    GPU; `nonzero` cannot run on PyTorch's meta device, so the source is read instead."""
    assert_made_on_the_inputs_device(impl.banned_ngram_tokens, "banned_ngram_tokens", "the tokens")


# --------------------------------------------------------------------------- Beams


class FakeTokenizer:
    eos_token_id = 0

    def decode(self, tokens):
        return " ".join(str(int(t)) for t in tokens)


def make_beams(impl, shipped, scores, last_tokens):
    model, _ = shipped
    tokens = torch.tensor([[5, 6, t] for t in last_tokens])
    return impl.Beams(model, FakeTokenizer(), torch.tensor(scores), tokens)


@pytest.mark.beams
@pytest.mark.parametrize("ngram_size", [None, 2])
def test_generate_extends_each_beam_with_its_best_tokens(impl, shipped, hf, ngram_size):
    model, tokenizer = shipped
    rows = [tokenizer.encode(p)[:10] for p in PROMPTS]
    tokens = torch.tensor(rows)
    sums = torch.tensor([-1.0, -2.5, -0.5])
    beams = impl.Beams(model, tokenizer, sums, tokens)
    k = 4
    new = beams.generate(k, no_repeat_ngram_size=ngram_size)
    hint = "generate returns NEW beams and leaves the old ones (and their tensors) as they are."
    assert_untouched(sums, torch.tensor([-1.0, -2.5, -0.5]), "Beams.generate", hint)
    assert_untouched(tokens, torch.tensor(rows), "Beams.generate", hint)
    assert len(new.tokens) == 3 * k, f"3 beams x {k} continuations = 12 beams, got {len(new)}"
    with torch.no_grad():
        logprobs = hf(tokens).logits[:, -1].log_softmax(-1)
    if ngram_size:
        banned = torch.isinf(
            NoRepeatNGramLogitsProcessor(ngram_size)(tokens, torch.zeros_like(logprobs))
        )
        logprobs = logprobs.masked_fill(banned, float("-inf"))
    top = logprobs.topk(k)
    if new.tokens.shape == (3 * k, tokens.shape[1] + 1) and torch.equal(
        new.tokens[:, :-1], tokens.repeat(k, 1)
    ):
        pytest.fail(
            "the new beams' prefixes cycle through the parents (beam 0, 1, 2, 0, 1, ...), so "
            "continuations are glued to the wrong parent. Beam b's k continuations come "
            "together, each after its own parent: each parent repeats k times in a row, not "
            "the whole list of parents k times over."
        )
    got_last = new.tokens[:, -1] if new.tokens.shape == (3 * k, tokens.shape[1] + 1) else None
    if got_last is not None and not torch.equal(got_last, top.indices.flatten()):
        if torch.equal(got_last, top.indices.T.flatten()):
            pytest.fail(
                "the new tokens come rank by rank (every beam's best token, then every beam's "
                "second best, ...) while the prefixes come beam by beam, so continuations are "
                "glued to the wrong parent. The [beam, k] table of top tokens must be flattened "
                "row by row: beam 0's k tokens first, then beam 1's."
            )
        with torch.no_grad():
            down_the_beams = hf(tokens).logits[:, -1].float().log_softmax(0)
        if not ngram_size and torch.equal(got_last, down_the_beams.topk(k).indices.flatten()):
            pytest.fail(
                "your new tokens are the top k of a log_softmax taken over the BEAMS (dim 0), "
                "each token normalised against the other beams' logits for it. A beam's "
                "log-probabilities are normalised over the vocabulary, its last dimension."
            )
    for b in range(3):
        for j in range(k):
            i = b * k + j
            assert new.tokens[i, :-1].tolist() == rows[b], (
                f"new beam {i} should be continuation {j} of beam {b}, after its parent's "
                "tokens: new beams must come in order, beam 0's continuations first, then beam "
                "1's..."
            )
            assert new.tokens[i, -1].item() == top.indices[b, j].item(), (
                f"beam {b}, continuation {j}: expected token {top.indices[b, j].item()}, got "
                f"{new.tokens[i, -1].item()} (the k most likely, best first"
                + (", after banning repeated n-grams)" if ngram_size else ")")
            )
    diagnose_new_scores(new.logprob_sums, hf, tokens, sums, k, ngram_size)
    for b in range(3):
        for j in range(k):
            i = b * k + j
            expected = (sums[b] + top.values[b, j]).item()
            assert math.isclose(new.logprob_sums[i].item(), expected, abs_tol=1e-3), (
                "a new beam's score is its parent's logprob sum plus the LOG-probability "
                "(log_softmax, not the raw logit) of the new token"
            )


def diagnose_new_scores(got, hf, tokens, sums, k: int, ngram_size: int | None) -> None:
    """Fail with the known mistake whose scores are `got` (the new beams' logprob sums), if
    one is: each candidate is computed from HF's logits, the ground truth."""
    with torch.no_grad():
        raw = hf(tokens).logits[:, -1].float()
    banned = torch.zeros_like(raw, dtype=torch.bool)
    if ngram_size:
        banned = torch.isinf(
            NoRepeatNGramLogitsProcessor(ngram_size)(tokens, torch.zeros_like(raw))
        )
    logprobs = raw.log_softmax(-1).masked_fill(banned, float("-inf"))

    def gives(scores: torch.Tensor) -> bool:
        wrong = scores.flatten()
        return got.shape == wrong.shape and torch.allclose(got.float(), wrong, atol=1e-3)

    if gives(sums[:, None] + logprobs.topk(k).values):
        return  # right
    if gives(logprobs.topk(k).values):
        pytest.fail(
            "a new beam's score is its own token's log-probability only: the parent's score "
            "was forgotten. A beam's score is the sum over all its new tokens: the parent's "
            "logprob sum plus the new token's log-probability."
        )
    if gives(sums[:, None] + raw.masked_fill(banned, float("-inf")).topk(k).values):
        pytest.fail(
            "the new beams' scores add up raw logits: a score is a sum of LOG-probabilities. "
            "Take log_softmax of the logits first (raw logits are not comparable across beams)."
        )
    if ngram_size and gives(sums[:, None] + logprobs.log_softmax(-1).topk(k).values):
        pytest.fail(
            "the log-probabilities were renormalised after the n-gram ban (a log_softmax over "
            "the tokens left): HF bans after the softmax, so the other tokens keep their "
            "log-probabilities. Set the banned ones to -inf and stop there."
        )


@pytest.mark.beams
def test_filter_keeps_the_best_continuing_and_the_finished(impl, shipped):
    scores = [-3.0, -1.0, -2.0, -0.5, -4.0, -2.5, -0.75]
    last = [7, 0, 8, 9, 0, 0, 11]  # 0 is the end-of-text token
    beams = make_beams(impl, shipped, scores, last)
    continuing, finished = beams.filter(3)
    # By hand: ranking -0.5(9) -0.75(11) -1.0(EOS) -2.0(8) -2.5(EOS) -3.0(7) -4.0(EOS)
    kept = continuing.logprob_sums.tolist()
    if len(kept) > 1 and kept == sorted(kept):
        pytest.fail(
            f"continuing: your beams come worst first (scores {kept}): rank them by score in "
            "descending order, best first, and keep the best ones."
        )
    if continuing.tokens[:, -1].tolist() == [9, 11]:
        pytest.fail(
            "continuing: only 2 beams continue, not 3. The beam ending in EOS among the best 3 "
            "(-1.0) is set aside as finished, and the next best running beams take their "
            "places: num_beams beams keep running."
        )
    assert continuing.tokens[:, -1].tolist() == [9, 11, 8], (
        "continuing: the 3 best beams that do NOT end in EOS, best first. Beams ending in EOS "
        "are set aside, so the next best running beams take their places"
    )
    assert continuing.logprob_sums.tolist() == [-0.5, -0.75, -2.0]
    assert finished.tokens[:, -1].tolist() == [0] and finished.logprob_sums.tolist() == [-1.0], (
        "finished: only the EOS beams ranked among the best 3 overall (-1.0); the EOS beams at "
        "-2.5 and -4.0 were not good enough"
    )
    assert beams.logprob_sums.tolist() == scores and beams.tokens[:, -1].tolist() == last, (
        "filter changed the beams it was called on (sorted them in place?): return new Beams"
    )


@pytest.mark.beams
def test_beams_make_their_tensors_on_the_beams_device(impl):
    for fn, what in [(impl.top_continuations, "top_continuations"), (impl.Beams.filter, "filter")]:
        assert_made_on_the_inputs_device(fn, what, "the beams' tensors")


# --------------------------------------------------------------------------- beam_search


def as_pairs(beams, who: str) -> list[tuple[float, list[int]]]:
    """(score, token ids) pairs from a list of (score, tokens) such as beam_search returns."""
    try:
        return [(float(score), [int(t) for t in tokens]) for score, tokens in beams]
    except (TypeError, ValueError) as err:
        raise AssertionError(
            f"{who} must return a list of (score, tokens) pairs, best first, where tokens is "
            f"a 1-D tensor of ids: got {type(beams).__name__} ({err})"
        ) from err


def show(tokenizer, token: int | None) -> str:
    if token is None:
        return "(the sequence has ended)"
    return f"{tokenizer.decode([token])!r} (id {token})"


def repeats_an_ngram(tokens: list[int], n: int) -> bool:
    ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(ngrams)) < len(ngrams)


class HFBeams:
    """HF's beam search on one prompt (`expected`), and the same search with one setting
    changed (`rerun`): the output of a known mistake, made on purpose, to recognise it.

    A rerun only happens on failure, and only while half of the graded test's time budget is
    left (utils/grading.py): on a slow machine the diagnosis gets shorter, never the verdict.
    """

    def __init__(self, hf, ids: torch.Tensor, **setting):
        self.hf, self.ids, self.setting = hf, ids, setting
        self.started = time.monotonic()
        self.expected = hf_beam_search(hf, ids, **setting)
        self.cost = time.monotonic() - self.started

    def rerun(self, **changes) -> list[tuple[float, list[int]]] | None:
        left = grading.test_budget_s() / 2 - (time.monotonic() - self.started)
        if 1.5 * self.cost > left:
            return None
        return as_pairs(hf_beam_search(self.hf, self.ids, **{**self.setting, **changes}), "HF")


STOPPING_RULE = {
    True: "With early_stopping=True, HF stops as soon as num_beams sequences have finished",
    False: "With early_stopping=False, HF stops once the best running beam cannot beat the "
    "worst of the num_beams finished sequences",
}

SAME_AS_OTHER_EARLY_STOPPING = {
    # keyed by the early_stopping that HF was given to reproduce the learner's output
    True: "your output is exactly HF's with early_stopping=True: you stop as soon as num_beams "
    "sequences have finished, although a running beam could still beat the worst of them. Is "
    "early_stopping read the wrong way round, or does the stopping test use a finished score "
    "that is not the worst (keep `finished` sorted best first and cut to num_beams, and compare "
    "with finished[-1])?",
    False: "your output is exactly HF's with early_stopping=False: you go on searching after "
    "num_beams sequences have finished. Is early_stopping read the wrong way round, or does "
    "`finished` grow past num_beams (cut it back to the best num_beams after every step: past "
    "num_beams, a count that must equal num_beams is never equal again)?",
}


def known_mistake(got, hf: HFBeams, n_prompt: int) -> str | None:
    """The known mistake whose HF output is exactly `got`, trying only those that fit it."""
    early_stopping = hf.setting["early_stopping"]
    n_new = hf.setting["max_new_tokens"]
    ngram = hf.setting.get("no_repeat_ngram_size")
    longest = max((len(t) - n_prompt for _, t in got), default=0)
    variants = [
        (SAME_AS_OTHER_EARLY_STOPPING[not early_stopping], {"early_stopping": not early_stopping})
    ]
    if longest == n_new - 1:
        variants.append(
            (
                f"your output is exactly HF's with max_new_tokens={n_new - 1}: one new token "
                "too few (max_new_tokens steps, each adding one token to every beam)",
                {"max_new_tokens": n_new - 1},
            )
        )
    if ngram and any(repeats_an_ngram(t, ngram) for _, t in got):
        variants.append(
            (
                f"your output is exactly HF's without the n-gram ban (a {ngram}-gram repeats): "
                "pass no_repeat_ngram_size on to `generate`",
                {"no_repeat_ngram_size": None},
            )
        )
    got_seqs = [t for _, t in got]
    for mistake, changes in variants:
        output = hf.rerun(**changes)
        if output is not None and [t for _, t in output] == got_seqs:
            return mistake
    return None


def diagnose_beams(got, hf: HFBeams, eos: int, n_prompt: int) -> str:
    """The likely mistake, as a tutor would name it, when the learner's sequences `got` differ
    from HF's. First the symptoms that name themselves (a count, an order, an EOS), then an
    exact match with HF's output under a known mistake, else the way the first differing
    sequence went wrong: better than HF's (HF stopped before it) or worse (HF found better)."""
    early_stopping = hf.setting["early_stopping"]
    expected = as_pairs(hf.expected, "HF")
    got_seqs, hf_seqs = [t for _, t in got], [t for _, t in expected]
    if len(got) < len(expected):
        return (
            f"you return {len(got)} sequence(s), HF {len(expected)} (num_return_sequences). Did "
            "the search stop before num_beams sequences had finished, or end without letting "
            "the running beams fill the places left (out of tokens, they compete with the "
            "finished ones)?"
        )
    if len(got) > len(expected):
        return f"you return {len(got)} sequences, not num_return_sequences={len(expected)}"
    scores = [score for score, _ in got]
    for per, lengths in [
        ("new token", [max(len(t) - n_prompt, 1) for _, t in got]),
        ("token", [len(t) for _, t in got]),
    ]:
        means = [score / n for score, n in zip(scores, lengths, strict=True)]
        if scores != sorted(scores, reverse=True) and means == sorted(means, reverse=True):
            return (
                f"your sequences are ranked by their mean log-probability per {per} (scores "
                f"{[round(x, 3) for x in scores]}, not best first): a length normalisation. "
                "Here a sequence's score is the SUM of its tokens' log-probabilities, and the "
                "ranking (of finished sequences, of beams, of the result) uses that sum, as HF "
                "does with length_penalty=0"
            )
    if sorted(got_seqs) == sorted(hf_seqs):
        return "the right sequences in the wrong order: return them best first (highest score)"
    for seq in got_seqs:
        if eos in seq[n_prompt:-1]:
            return (
                "a beam went on after <|endoftext|>: a beam whose last token is EOS has "
                "finished; set it aside (`filter`), never extend it"
            )
        if seq + [eos] in hf_seqs:
            return "a finished sequence lost its final <|endoftext|>: keep it as the last token"
    if any(score > 1e-6 for score, _ in got):
        return "a score above 0 cannot be a sum of log-probabilities: use log_softmax"
    mistake = known_mistake(got, hf, n_prompt)
    if mistake is not None:
        return mistake
    rank = next(r for r in range(len(got)) if got_seqs[r] != hf_seqs[r])
    score, hf_score = got[rank][0], expected[rank][0]
    candidates = (
        "Each beam needs num_beams + 1 continuations (one of them may be <|endoftext|>), and "
        "only the EOS beams among the best num_beams candidates finish."
    )
    if score > hf_score + BEAM_SCORE_ATOL:
        return (
            f"HF never reached your sequence {rank} (score {score:.3f}, better than HF's "
            f"{hf_score:.3f}): your search went on after HF's had stopped, or kept candidates "
            f"HF dropped. {STOPPING_RULE[early_stopping]}; cut `finished` back to the best "
            f"num_beams after every step. {candidates}"
        )
    if score < hf_score - BEAM_SCORE_ATOL:
        return (
            f"HF found a better sequence {rank} (score {hf_score:.3f}) than yours "
            f"({score:.3f}): your search stopped too early or dropped a candidate HF kept. "
            f"{STOPPING_RULE[early_stopping]}"
            + ("" if early_stopping else " (finished[-1] of a list sorted best first)")
            + f". {candidates} Out of tokens, the running beams compete with the finished ones."
        )
    return (
        "a different sequence with the same score: two candidates tie, and you broke the tie "
        "differently (rank with a stable sort, best first, continuations in beam order)"
    )


def assert_same_beams(got, hf: HFBeams, tokenizer, context: str) -> None:
    """`got` (the learner's beam_search) equals HF's search, best first, token for token and
    score for score. If not, the message names the likely mistake, then shows where the first
    differing sequence departs from HF's, and both lists with their scores."""
    n_prompt = len(hf.ids)
    got = as_pairs(got, "beam_search")
    expected = as_pairs(hf.expected, "HF")
    got_seqs, hf_seqs = [t for _, t in got], [t for _, t in expected]
    if got_seqs == hf_seqs:
        for rank, ((score, tokens), (hf_score, _)) in enumerate(zip(got, expected, strict=True)):
            assert math.isclose(score, hf_score, abs_tol=BEAM_SCORE_ATOL), (
                f"{context}, sequence {rank}: the tokens are HF's but the score is {score:.4f}, "
                f"HF's {hf_score:.4f}. A score is the sum of the generated tokens' "
                "log-probabilities (log_softmax of the logits, the prompt's tokens excluded, no "
                f"length normalisation); this sequence has {len(tokens) - n_prompt} of them."
            )
        return
    why = diagnose_beams(got, hf, tokenizer.eos_token_id, n_prompt)
    lines = [f"{context}: {why}" + ("" if why.endswith((".", "?")) else ".")]
    rank = next((r for r in range(min(len(got), len(expected))) if got_seqs[r] != hf_seqs[r]), None)
    if rank is not None:
        mine, theirs = got_seqs[rank][n_prompt:], hf_seqs[rank][n_prompt:]
        step = 0
        while step < min(len(mine), len(theirs)) and mine[step] == theirs[step]:
            step += 1
        lines.append(
            f"Sequence {rank} (0 = best) first differs at new token {step + 1}: HF has "
            f"{show(tokenizer, theirs[step] if step < len(theirs) else None)}, you have "
            f"{show(tokenizer, mine[step] if step < len(mine) else None)}."
        )
    for who, beams in [("HF ", expected), ("you", got)]:
        for r, (score, tokens) in enumerate(beams):
            text = tokenizer.decode(tokens[n_prompt:])
            lines.append(
                f"{who} {r}: score {score:8.3f}  {len(tokens) - n_prompt:2d} new  {text!r}"
            )
    raise AssertionError("\n".join(lines))


@pytest.mark.beam_search
@pytest.mark.parametrize(
    ("prompt", "num_beams", "n_return", "ngram"),
    [
        (PROMPTS[0], 3, 2, None),
        (PROMPTS[1], 4, 4, None),
        (PROMPTS[2], 3, 3, 2),
        (PROMPTS[0], 5, 3, 3),
    ],
)
def test_beam_search_equals_hf_generate(impl, shipped, hf, prompt, num_beams, n_return, ngram):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(prompt))
    n_new = 12
    expected = HFBeams(
        hf, ids, num_return_sequences=n_return, num_beams=num_beams, max_new_tokens=n_new,
        no_repeat_ngram_size=ngram, early_stopping=False,
    )  # fmt: skip
    got = impl.beam_search(
        model, tokenizer, prompt, n_return, num_beams, n_new, no_repeat_ngram_size=ngram
    )
    context = f"beam search ({num_beams} beams, no_repeat_ngram_size={ngram}) differs from HF"
    assert_same_beams(got, expected, tokenizer, context)


class BigramTable(torch.nn.Module):
    """Crafted logits that depend only on the last token (mod 8), for both sides of a test.

    Each row has one strong favourite that leads to the next row, so some paths cost almost
    nothing to extend, and an end-of-text logit that competes with that favourite: far ahead
    in some rows, behind in others. Beams finish at different steps, which is where beam search
    implementations (and the two stopping rules) differ.
    """

    def __init__(self, cfg, eos: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.table = torch.randn(8, cfg.d_vocab, generator=g) * 2
        for row in range(8):
            favourite = 8 * (17 + row) + (row + 1) % 8  # a token whose row is the next one
            self.table[row, favourite] += 4.0 + 4.0 * torch.rand(1, generator=g).item()
        offsets = torch.randn(8, generator=g) * 2.5 - 1.0
        self.table[:, eos] = self.table.max(dim=-1).values + offsets
        self.weight = torch.nn.Parameter(torch.zeros(1))  # for next(model.parameters())

    def forward(self, tokens):
        return self.table[tokens % 8]


class TableProcessor(LogitsProcessor):
    """Replaces HF's log-probabilities with those of the table, so HF searches the same tree."""

    def __init__(self, table: BigramTable):
        self.table = table

    def __call__(self, input_ids, scores):
        return self.table(input_ids[:, -1:])[:, -1].log_softmax(-1)


def check_crafted_beam_search(impl, shipped, hf, seed, prompt, num_beams, early_stopping):
    """beam_search on a BigramTable equals HF's search of the same tree (TableProcessor)."""
    model, tokenizer = shipped
    table = BigramTable(model.cfg, tokenizer.eos_token_id, seed)
    expected = HFBeams(
        hf, torch.tensor(tokenizer.encode(prompt)), num_return_sequences=num_beams,
        num_beams=num_beams, max_new_tokens=10, early_stopping=early_stopping,
        logits_processor=LogitsProcessorList([TableProcessor(table)]),
    )  # fmt: skip
    got = impl.beam_search(
        table, tokenizer, prompt, num_beams, num_beams, 10, early_stopping=early_stopping
    )
    context = (
        f"beam search on crafted logits ({num_beams} beams, early_stopping={early_stopping}) "
        "differs from HF"
    )
    assert_same_beams(got, expected, tokenizer, context)


@pytest.mark.beam_search
@pytest.mark.parametrize("early_stopping", [True, False])
@pytest.mark.parametrize("seed", [1, 3, 12, 14])  # tables where beams finish at different steps
def test_beam_search_end_of_text_and_stopping_rules(impl, shipped, hf, early_stopping, seed):
    check_crafted_beam_search(impl, shipped, hf, seed, PROMPTS[seed % 3], 3, early_stopping)


@pytest.mark.beam_search
def test_beam_search_keeps_only_num_beams_finished_sequences(impl, shipped, hf):
    # With this table, prompt and 4 beams, one sequence finishes at step 1, two at step 2 and
    # two at step 3: five, and HF (early_stopping=True) stops there with the best 4. A search
    # that keeps all five never has exactly 4 finished, goes on, and returns a 4th found later
    # (score -8.83; HF's 4th scores -8.85).
    check_crafted_beam_search(impl, shipped, hf, 26, PROMPTS[0], 4, True)
