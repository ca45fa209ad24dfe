"""Hugging Face's tests of its temperature, top-k and top-p logits warpers, rewritten for
chapter 3's functions in `solutions/sampling.py`.

Source: huggingface/transformers, tests/generation/test_logits_process.py at commit
019af3ac65298aae51038a941c54a038a505bd57 (test_temperature_dist_warper, test_top_k_dist_warper,
test_top_p_dist_warper). The cases and numbers are theirs; the code is this course's own. These
tests check the course's reference code (`solutions`), not a learner's notebook: no `impl`.

What changed on the way (tests/peers/README.md says more):

- HF's warpers are objects called as `warper(input_ids, scores)` with a `filter_value`; the
  course's are functions of the logits alone, and a filtered logit is always -inf. HF's cases
  that use `filter_value=0.0` count the kept tokens here as the finite ones.
- `filter_top_k(logits, k)` has no `min_tokens_to_keep`: HF's TopKLogitsWarper only turns it
  into k = max(top_k, min_tokens_to_keep), so the port passes that k. (HF's `generate` uses
  min_tokens_to_keep = 1 when it samples, so the two agree on every `generate` call.)
- HF checks its arguments when a warper is built and raises ValueError; the course checks them
  in `apply_temperature` and `check_sampling_args` (which every sampler calls) and raises
  ValueError too. Two differences, both by design: the course takes an int temperature (HF
  wants a float), and top_k = 0 means "off" (as in HF's `generate`; HF's warper refuses it).
"""

from __future__ import annotations

import math

import pytest
import torch

from solutions.sampling import (
    apply_temperature,
    check_sampling_args,
    filter_top_k,
    filter_top_p,
    sample_next_token,
)
from tests.support import IN_PLACE, assert_untouched


def uniform_scores(batch: int, length: int) -> torch.Tensor:
    """HF's starting point for several warper tests: every logit equal to 1 / length."""
    return torch.full((batch, length), 1.0 / length)


def ramp(batch: int, length: int) -> torch.Tensor:
    """Logits 0, 1, ..., length - 1 in every row."""
    return torch.arange(length, dtype=torch.float32).repeat(batch, 1)


def assert_filtered_is_minus_inf(out: torch.Tensor, who: str) -> None:
    """Every logit a filter removed is -inf (HF's default filter_value): never +inf or NaN."""
    bad = torch.isnan(out) | torch.isposinf(out)
    assert not bad.any(), (
        f"{who} returned NaN or +inf logits: a removed logit must be -inf, and a kept one its "
        "input value."
    )


# ---------------------------------------------------------------------------------------------
# test_temperature_dist_warper


def test_temperature_sharpens_below_one_and_flattens_above():
    """HF: a uniform row stays uniform at any temperature; in a row with one peak and one
    valley, T = 0.5 raises the peak and lowers the valley, and T = 1.3 does the opposite."""
    length = 20
    scores = uniform_scores(2, length)
    scores[1, 5] = 1 / length + 0.1  # the peak of row 1
    scores[1, 10] = 1 / length - 0.4  # its valley
    before = scores.clone()
    probs = scores.softmax(dim=-1)

    sharp = apply_temperature(scores, 0.5).softmax(dim=-1)
    smooth_logits = apply_temperature(scores, 1.3)
    smooth = smooth_logits.softmax(dim=-1)

    for name, warped in (("T = 0.5", sharp), ("T = 1.3", smooth)):
        torch.testing.assert_close(
            warped[0],
            probs[0],
            rtol=1e-3,
            atol=1e-3,
            msg=f"apply_temperature at {name} changed a uniform distribution: equal logits "
            "divided by the same temperature must stay equal.",
        )
    assert sharp[1].max() > probs[1].max() and sharp[1].min() < probs[1].min(), (
        "apply_temperature at T = 0.5 did not sharpen the distribution: the peak must get more "
        "likely and the valley less likely. Are you dividing the logits by T (not multiplying)?"
    )
    assert smooth[1].max() < probs[1].max() and smooth[1].min() > probs[1].min(), (
        "apply_temperature at T = 1.3 did not flatten the distribution: the peak must get less "
        "likely and the valley more likely. Are you dividing the logits by T (not multiplying)?"
    )
    assert not torch.equal(smooth_logits, scores), (
        "apply_temperature at T = 1.3 returned its input unchanged: the logits must be divided "
        "by the temperature."
    )
    assert_untouched(scores, before, "apply_temperature", IN_PLACE)


@pytest.mark.parametrize("temperature", [0.0, -0.5, math.nan])
def test_temperature_must_be_positive(temperature):
    """HF's TemperatureLogitsWarper raises ValueError for a temperature that is not > 0 (0 means
    greedy decoding, which is not a temperature); so does the course's apply_temperature."""
    with pytest.raises(ValueError):
        apply_temperature(torch.zeros(1, 4), temperature)


# ---------------------------------------------------------------------------------------------
# test_top_k_dist_warper


def test_top_k_keeps_the_three_largest_of_each_row():
    """HF: a ramp 0..9 keeps its last three tokens at k = 3; a second row whose first five
    logits are raised by 10 (so 10..14, then 5..9) keeps tokens 2, 3 and 4."""
    vocab = 10
    logits = ramp(2, vocab)
    logits[1:, : vocab // 2] += vocab
    before = logits.clone()

    out = filter_top_k(logits, 3)

    assert_filtered_is_minus_inf(out, "filter_top_k")
    removed = torch.isneginf(out)
    assert removed[0].tolist() == 7 * [True] + 3 * [False], (
        f"filter_top_k(k=3) on the ramp 0..9 should keep tokens 7, 8, 9 and set the rest to "
        f"-inf; it kept {(~removed[0]).nonzero().flatten().tolist()}."
    )
    assert removed[1].tolist() == 2 * [True] + 3 * [False] + 5 * [True], (
        f"filter_top_k(k=3) on the row 10..14, 5..9 should keep tokens 2, 3, 4 (logits 12, 13, "
        f"14); it kept {(~removed[1]).nonzero().flatten().tolist()}. Is each row filtered by "
        "its own k-th largest logit?"
    )
    kept = ~removed
    assert torch.equal(out[kept], logits[kept]), (
        "filter_top_k changed a logit it kept: kept logits must pass through unchanged."
    )
    assert_untouched(logits, before, "filter_top_k", IN_PLACE)


def test_top_k_never_filters_a_uniform_row():
    """HF's safety case: TopKLogitsWarper(top_k=1, min_tokens_to_keep=3) leaves a uniform row of
    5 tokens whole, because every token ties with the k-th largest. The course keeps ties too:
    at HF's effective k = max(1, 3) = 3, and at k = 1 as well."""
    logits = uniform_scores(2, 5)
    for k in (max(1, 3), 1):
        out = filter_top_k(logits, k)
        n_removed = torch.isneginf(out).sum(dim=-1).tolist()
        assert n_removed == [0, 0], (
            f"filter_top_k(k={k}) removed {n_removed} tokens from rows of 5 equal logits: every "
            "token ties with the k-th largest, and ties with it are all kept (compare with "
            "`<`, not `<=`, and do not cut the sorted order at position k)."
        )


def test_top_k_with_min_tokens_to_keep_keeps_three():
    """HF's safety case: TopKLogitsWarper(top_k=1, min_tokens_to_keep=3) on the ramp 0..4 keeps
    3 tokens and filters 2. The course has no min_tokens_to_keep for top-k: HF's warper uses
    k = max(top_k, min_tokens_to_keep), and so does this port."""
    out = filter_top_k(ramp(2, 5), max(1, 3))
    n_removed = torch.isneginf(out).sum(dim=-1).tolist()
    assert n_removed == [2, 2], (
        f"filter_top_k(k=3) on the ramp 0..4 should remove 2 tokens per row, it removed "
        f"{n_removed}."
    )


def test_top_k_larger_than_the_vocabulary_keeps_everything():
    """HF's warper clamps k to the vocabulary size (its 'safety check'): a k above it is no
    error and filters nothing. The course's filter_top_k does the same."""
    logits = ramp(2, 10)
    out = filter_top_k(logits, 50)
    assert torch.equal(out, logits), (
        "filter_top_k(k=50) on 10 tokens must keep all of them (k is clamped to the vocabulary "
        "size), not fail or remove any."
    )


# ---------------------------------------------------------------------------------------------
# test_top_p_dist_warper


def test_top_p_keeps_the_smallest_set_reaching_p():
    """HF: log-probabilities [0.3, 0.1, 0.1, 0.5] and [0.15, 0.3, 0.3, 0.25] at top_p = 0.8 keep
    {0.5, 0.3} (0.5 + 0.3 reaches 0.8 exactly) and {0.3, 0.3, 0.25}.

    The first row is the boundary case: the kept mass equals top_p, which float32 sums may land
    a hair under. By the definition (the smallest set whose mass is at least top_p) a third
    token must not be kept, and HF does not keep one."""
    dist = torch.log(torch.tensor([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]]))
    before = dist.clone()

    out = filter_top_p(dist, 0.8)

    assert_filtered_is_minus_inf(out, "filter_top_p")
    expected = torch.tensor([[0.3, 0.0, 0.0, 0.5], [0.0, 0.3, 0.3, 0.25]])
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [True, False, False, True], (
        f"filter_top_p(top_p=0.8) on probabilities [0.3, 0.1, 0.1, 0.5] kept tokens "
        f"{kept[0].nonzero().flatten().tolist()}, but 0.5 + 0.3 = 0.8 already reaches top_p: "
        "only tokens 3 and 0 belong to the smallest set. If a 0.1 was kept too, the running "
        "total landed just under 0.8 through rounding: compare the mass of the tokens BEFORE "
        "each one with top_p, not `cumulative - p`."
    )
    torch.testing.assert_close(
        out.exp(),
        expected,
        rtol=1e-3,
        atol=1e-3,
        msg="filter_top_p(top_p=0.8) should keep {0.5, 0.3} of the first row and {0.3, 0.3, "
        "0.25} of the second, with their logits unchanged, and set the others to -inf.",
    )
    assert_untouched(dist, before, "filter_top_p", IN_PLACE)


def test_top_p_min_tokens_to_keep_on_extreme_logits():
    """HF: the ramp -5..4 at top_p = 0.9 keeps 3 tokens; the same ramp times 100 would keep only
    its top token, but min_tokens_to_keep = 2 keeps 2."""
    logits = ramp(2, 10) - 5
    logits[1] = logits[1] * 100.0

    out = filter_top_p(logits, 0.9, min_tokens_to_keep=2)

    assert_filtered_is_minus_inf(out, "filter_top_p")
    n_kept = torch.isfinite(out).sum(dim=-1).tolist()
    assert n_kept == [3, 2], (
        f"filter_top_p(top_p=0.9, min_tokens_to_keep=2) should keep 3 tokens of the ramp -5..4 "
        f"and 2 of the ramp -500..400 (whose top token alone holds all the mass), but kept "
        f"{n_kept}. Is min_tokens_to_keep applied to the most likely tokens, after the cut?"
    )


def test_top_p_draws_only_kept_tokens():
    """HF's top-p case, sampled: sample_next_token with top_p = 0.8 on [0.3, 0.1, 0.1, 0.5]
    never draws a token outside {0.5, 0.3} (2,000 draws, seeded)."""
    n = 2000
    logits = torch.log(torch.tensor([0.3, 0.1, 0.1, 0.5])).repeat(n, 1)
    input_ids = torch.zeros(n, 1, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    tokens = sample_next_token(input_ids, logits, top_p=0.8, generator=generator)
    drawn = sorted(set(tokens.tolist()))
    assert set(drawn) <= {0, 3}, (
        f"sample_next_token(top_p=0.8) on [0.3, 0.1, 0.1, 0.5] drew tokens {drawn}: only tokens "
        "0 and 3 (0.3 and 0.5, which reach 0.8 together) may ever be drawn."
    )


# ---------------------------------------------------------------------------------------------
# Arguments HF's constructors refuse with ValueError


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"top_p": -0.1}, "top_p must lie in [0, 1]"),
        ({"top_p": 1.1}, "top_p must lie in [0, 1]"),
        ({"top_p": 0.9, "min_tokens_to_keep": 0}, "min_tokens_to_keep must be >= 1"),
        ({"top_k": -1}, "top_k must not be negative"),
        ({"temperature": -1.0}, "a temperature must not be negative"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, why):
    """HF raises ValueError for each of these when the warper is built; the course's
    check_sampling_args (and so every sampler) raises ValueError too."""
    with pytest.raises(ValueError):
        check_sampling_args(**kwargs)
    with pytest.raises(ValueError):
        sample_next_token(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 4), **kwargs)


def test_top_k_zero_and_top_p_one_mean_off():
    """Where the course follows HF's `generate` rather than its warpers: top_k = 0 and
    top_p = 1.0 switch those filters off (HF's TopKLogitsWarper itself refuses top_k = 0,
    but `generate` never builds one for it)."""
    assert check_sampling_args(top_k=0, top_p=1.0) == (False, False), (
        "check_sampling_args(top_k=0, top_p=1.0) should say that neither filter is on: 0 and "
        "1.0 are HF generate's values for 'off'."
    )
