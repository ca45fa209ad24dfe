"""Chapter 3's given code and graded tests, checked from the outside.

- Every bad argument of the sampler and of beam search raises a ValueError that names it
  (this code is given to learners, so it is tested here rather than graded).
- The graded tests catch the classic mistakes: each sabotaged implementation below must fail
  the graded test written for it.
- The statistical tests pass on the solutions for 50 seeds (slow: `--runslow`).
"""

from __future__ import annotations

import types

import pytest
import torch

import solutions.beams as beams_mod
import solutions.sampling as sampling
from tests.graded import test_03_sampling as graded
from tests.support import N_SAMPLES, assert_samples_follow

# --------------------------------------------------------------------------- bad arguments

IDS = torch.zeros(1, 3, dtype=torch.long)
LOGITS = torch.zeros(1, 10)

# A graded test fails by an assert or, where it has recognised the mistake, by pytest.fail.
FAILED = (AssertionError, pytest.fail.Exception)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 1e-40}, "temperature must be 0 .greedy. or at least 1e-05"),
        ({"temperature": 9.9e-6}, "temperature must be 0 .greedy. or at least 1e-05"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": 5, "top_p": 0.9}, "top_k and top_p"),
        ({"min_tokens_to_keep": 0}, "min_tokens_to_keep"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"top_k": True}, "top_k"),
        ({"min_tokens_to_keep": True}, "min_tokens_to_keep"),
    ],
)
def test_sample_next_token_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sampling.sample_next_token(IDS, LOGITS, **kwargs)


def test_sample_next_token_rejects_float_ids_and_mismatched_shapes():
    with pytest.raises(ValueError, match="input_ids"):
        sampling.sample_next_token(IDS.float(), LOGITS)
    with pytest.raises(ValueError, match="batch"):
        sampling.sample_next_token(torch.zeros(2, 3, dtype=torch.long), LOGITS)


def test_filters_switched_off_the_hf_way():
    logits = torch.randn(1, 10)
    g = torch.Generator().manual_seed(0)
    base = sampling.sample_next_token(IDS, logits, generator=g)
    for off in [{"top_k": 0}, {"top_k": None}, {"top_p": 1.0}, {"top_p": None}]:
        g = torch.Generator().manual_seed(0)
        assert torch.equal(sampling.sample_next_token(IDS, logits, generator=g, **off), base)


@pytest.mark.parametrize(
    ("prompt", "kwargs", "name"),
    [
        ("", {}, "empty"),
        ([], {}, "empty"),
        (torch.tensor([], dtype=torch.long), {}, "empty"),
        (torch.tensor([1.0, 2.0]), {}, "integer"),
        ([1, 2.5], {}, "integer"),
        ([1, 10**6], {}, "d_vocab"),
        ([-1, 3], {}, "d_vocab"),
        (3, {}, "prompt"),
        ("ROMEO.", {"max_tokens_generated": -1}, "max_tokens_generated"),
        ("ROMEO.", {"temperature": -1.0}, "temperature"),
        ("ROMEO.", {"top_p": 2.0}, "top_p"),
    ],
)
def test_sampler_rejects_bad_arguments(shipped, prompt, kwargs, name):
    sampler = sampling.TransformerSampler(*shipped)
    with pytest.raises(ValueError, match=name):
        sampler.sample(prompt, **{"max_tokens_generated": 3, **kwargs})


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_k": -2}, {"top_p": 90}])
def test_arguments_are_checked_even_when_no_token_is_asked_for(shipped, kwargs):
    from solutions import CachedTransformerSampler, generate_batch

    for sampler in (sampling.TransformerSampler(*shipped), CachedTransformerSampler(*shipped)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            sampler.sample("ROMEO.", max_tokens_generated=0, **kwargs)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        generate_batch(*shipped, ["ROMEO."], max_tokens_generated=0, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_beams": 0}, "num_beams"),
        ({"num_return_sequences": 4}, "num_return_sequences"),
        ({"num_return_sequences": 0}, "num_return_sequences"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"no_repeat_ngram_size": 0}, "no_repeat_ngram_size"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_beam_search_rejects_bad_arguments(shipped, kwargs, name):
    model, tokenizer = shipped
    args = {"prompt": "ROMEO.", "num_return_sequences": 2, "num_beams": 3, "max_new_tokens": 4}
    with pytest.raises(ValueError, match=name):
        beams_mod.beam_search(model, tokenizer, **{**args, **kwargs})


def test_sampler_writes_shakespeare_shaped_text(shipped):
    text = sampling.TransformerSampler(*shipped).sample("ROMEO.\n", 40, seed=0, temperature=0.8)
    assert text.startswith("ROMEO.\n") and len(text) > 60


# --------------------------------------------------------------------------- sabotage


def impl_with(**overrides):
    """The solutions as an `impl`, with some objects replaced by broken versions."""
    names = {**vars(sampling), **vars(beams_mod)}
    return types.SimpleNamespace(**{**names, **overrides})


def sampling_at_a_temperature_follows_softmax_of_scaled_logits(impl, temperature):
    """The statistical check `sample_next_token` (given) must pass at a temperature: the
    frequencies of 20,000 draws against softmax(logits / T), false failure ALPHA."""
    logits = graded.crafted_logits(2)

    def sample(batch, generator):
        return impl.sample_next_token(
            torch.zeros(batch.shape[0], 1, dtype=torch.long), batch, temperature,
            generator=generator,
        )  # fmt: skip

    samples = graded.draw(sample, logits, who="sample_next_token")
    assert_samples_follow(
        samples, (logits / temperature).softmax(-1), f"sampling at temperature {temperature}"
    )


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_the_given_sampler_follows_softmax_of_scaled_logits(temperature):
    sampling_at_a_temperature_follows_softmax_of_scaled_logits(impl_with(), temperature)


def buggy_temperature_after_noise(
    input_ids, logits, temperature=1.0, top_k=None, top_p=None, generator=None, **kwargs
):
    """Gumbel-max with the classic bug: (logits + g) / T picks the same token whatever T is."""
    uniform = torch.rand(logits.shape, generator=generator)
    gumbel = -torch.log(-torch.log(uniform))
    return ((logits + gumbel) / temperature).argmax(dim=-1)


def test_gumbel_with_temperature_after_the_noise_fails():
    impl = impl_with(sample_next_token=buggy_temperature_after_noise)
    with pytest.raises(AssertionError, match="do not match"):
        sampling_at_a_temperature_follows_softmax_of_scaled_logits(impl, 0.5)


def test_a_correct_gumbel_sampler_passes():
    """The same Gumbel-max trick, temperature applied before the noise: a correct sampler."""

    def gumbel(input_ids, logits, temperature=1.0, generator=None, **kwargs):
        uniform = torch.rand(logits.shape, generator=generator)
        return (logits / temperature - torch.log(-torch.log(uniform))).argmax(dim=-1)

    sampling_at_a_temperature_follows_softmax_of_scaled_logits(
        impl_with(sample_next_token=gumbel), 0.5
    )


def test_temperature_multiplied_fails():
    impl = impl_with(apply_temperature=lambda logits, t: logits * t)
    with pytest.raises(FAILED, match="yours are the logits times T"):
        graded.test_apply_temperature_divides_the_logits(impl, 0.5)


def test_top_k_without_ties_fails():
    def exactly_k(logits, k):
        idx = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, True)
        return logits.masked_fill(~keep, float("-inf"))

    with pytest.raises(AssertionError, match="ties included"):
        graded.test_filter_top_k_keeps_what_hf_keeps(impl_with(filter_top_k=exactly_k))


def test_top_p_without_the_crossing_token_fails():
    def too_few(logits, top_p, min_tokens_to_keep=1):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative > top_p  # drops the token that crosses top_p
        remove[:, :min_tokens_to_keep] = False
        return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))

    with pytest.raises(FAILED, match="drop the token that crosses top_p"):
        graded.test_filter_top_p_keeps_what_hf_keeps(impl_with(filter_top_p=too_few))


def test_top_p_unsorted_back_fails():
    def not_unsorted(logits, top_p, min_tokens_to_keep=1):
        sorted_logits, _ = logits.sort(dim=-1, descending=True)
        before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        remove = before >= top_p
        remove[:, :min_tokens_to_keep] = False
        return logits.masked_fill(remove, float("-inf"))  # mask in sorted order: wrong tokens

    with pytest.raises(FAILED):
        graded.test_filter_top_p_keeps_what_hf_keeps(impl_with(filter_top_p=not_unsorted))


def test_frequency_penalty_counted_over_the_batch_fails():
    def whole_batch(input_ids, logits, freq_penalty):
        counts = torch.bincount(input_ids.flatten(), minlength=logits.shape[-1])
        return logits - freq_penalty * counts

    with pytest.raises(FAILED, match="per row|whole batch"):
        graded.test_frequency_penalty_matches_the_closed_form(
            impl_with(apply_frequency_penalty=whole_batch), 0.5
        )


def test_sampling_that_ignores_the_generator_fails():
    def no_generator(logits, generator=None):
        return torch.multinomial(logits.softmax(-1), 1).squeeze(-1)

    with pytest.raises(AssertionError, match="same seeded generator"):
        graded.test_sample_basic_uses_the_generator(impl_with(sample_basic=no_generator))


def test_sampling_without_the_context_crop_fails(shipped, hf):
    class NoCrop(sampling.TransformerSampler):
        def sample(self, prompt, max_tokens_generated=100, **kwargs):
            ids = sampling.prompt_ids(prompt, self.tokenizer, self.cfg.d_vocab)
            for _ in range(max_tokens_generated):
                logits = self.model(ids[None])[:, -1]  # past n_ctx: the model refuses
                ids = torch.cat([ids, sampling.sample_next_token(ids[None], logits, **kwargs)])
            return ids

    with pytest.raises((AssertionError, ValueError)):
        graded.test_sampling_past_the_context_window_reads_the_last_n_ctx_tokens(
            impl_with(TransformerSampler=NoCrop), shipped, hf
        )


def test_beam_filter_that_shrinks_the_beam_fails(shipped, hf):
    """A common simplification: split the top num_beams into running and finished, so the
    beam narrows whenever a beam finishes. HF keeps num_beams running beams."""

    class ShrinkingBeams(beams_mod.Beams):
        def generate(self, k, no_repeat_ngram_size=None):
            new = super().generate(k, no_repeat_ngram_size)
            return ShrinkingBeams(self.model, self.tokenizer, new.logprob_sums, new.tokens)

        def filter(self, num_beams):
            top = self.logprob_sums.topk(min(num_beams, len(self))).indices
            ends = self.tokens[top, -1] == self.tokenizer.eos_token_id
            return self[top[~ends]], self[top[ends]]

        def __getitem__(self, index):
            return ShrinkingBeams(
                self.model, self.tokenizer, self.logprob_sums[index], self.tokens[index]
            )

    def shrinking_search(model, tokenizer, prompt, *args, **kwargs):
        return beams_mod.beam_search(
            model, tokenizer, prompt, *args, beams_class=ShrinkingBeams, **kwargs
        )

    impl = impl_with(beam_search=shrinking_search)
    for seed in (1, 3, 12, 14):
        with pytest.raises((AssertionError, RuntimeError)):
            graded.test_beam_search_end_of_text_and_stopping_rules(impl, shipped, hf, True, seed)


def test_beam_search_that_ignores_early_stopping_fails(shipped, hf):
    def never_early(*args, early_stopping=False, **kwargs):
        return beams_mod.beam_search(*args, early_stopping=False, **kwargs)

    impl = impl_with(beam_search=never_early)
    with pytest.raises(AssertionError):
        graded.test_beam_search_end_of_text_and_stopping_rules(impl, shipped, hf, True, 12)


# --------------------------------------------------------------------------- many seeds


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(50))
def test_statistical_tests_pass_on_solutions_for_many_seeds(seed):
    """The chi-square checks of the graded tests, with fresh random draws for each seed."""
    logits = graded.crafted_logits(100 + seed)
    g = torch.Generator().manual_seed(seed)
    n = N_SAMPLES
    batch = logits.expand(n, -1).clone()
    assert_samples_follow(sampling.sample_basic(batch, g), logits.softmax(-1), "basic")
    for temperature in (0.5, 2.0):
        samples = sampling.sample_next_token(
            torch.zeros(n, 1, dtype=torch.long), batch, temperature, generator=g
        )
        assert_samples_follow(samples, (logits / temperature).softmax(-1), "temperature")
    for k in (1, 4):
        kept = torch.isfinite(sampling.filter_top_k(logits[None], k))[0]
        samples = sampling.sample_top_k(batch, k, g)
        assert_samples_follow(samples, logits.softmax(-1) * kept, "top-k")
    for top_p in (0.5, 0.9):
        kept = torch.isfinite(sampling.filter_top_p(logits[None], top_p))[0]
        samples = sampling.sample_top_p(batch, top_p, generator=g)
        assert_samples_follow(samples, logits.softmax(-1) * kept, "top-p")
