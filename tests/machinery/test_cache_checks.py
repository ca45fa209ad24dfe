"""Chapter 4's given code and graded tests, checked from the outside.

- Misuse of the cache and bad arguments raise a ValueError that says what is wrong (this code
  is given to learners, so it is tested here rather than graded).
- The graded tests catch the classic mistakes: each sabotaged implementation below must fail
  the graded test written for it.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import solutions.batched as batched
import solutions.beams as beams_mod
import solutions.cached_beams as cached_beams
import solutions.cached_model as cached_model
import solutions.cached_sampling as cached_sampling
import solutions.sampling as sampling
from solutions.config import Config
from solutions.kv_cache import KeyValueCache
from tests.graded import test_04_kv_cache as graded


def prefix_cache(model, n: int = 5, batch: int = 1) -> KeyValueCache:
    tokens = torch.arange(1, n + 1).repeat(batch, 1)
    return cached_model.forward_with_cache(model, tokens)[1]


# --------------------------------------------------------------------------- misuse


def test_batch_size_that_does_not_match_the_cache(shipped):
    model, _ = shipped
    with pytest.raises(ValueError, match="holds 2 sequences but tokens has batch size 1"):
        cached_model.forward_with_cache(model, torch.tensor([[7]]), prefix_cache(model, batch=2))


def test_cache_from_another_model(shipped):
    model, _ = shipped
    other = dataclasses.replace(model.cfg, n_layers=2)
    cache = KeyValueCache.new_empty(other, batch=1)
    with pytest.raises(ValueError, match="cache was made for another model"):
        cached_model.forward_with_cache(model, torch.tensor([[7]]), cache)


def test_growing_past_n_ctx(shipped):
    model, _ = shipped
    n_ctx = model.cfg.n_ctx
    cache = prefix_cache(model, n=n_ctx - 2)
    with pytest.raises(ValueError, match=f"would pass n_ctx={n_ctx}"):
        cached_model.forward_with_cache(model, torch.tensor([[7, 8, 9]]), cache)


def test_feeding_the_whole_sequence_again(shipped):
    model, _ = shipped
    cache = prefix_cache(model, n=5)
    again = torch.cat([cache.tokens, torch.tensor([[9]])], dim=1)
    with pytest.raises(ValueError, match=r"pass only the new tokens, tokens\[:, cache.length:\]"):
        cached_model.forward_with_cache(model, again, cache)


def test_a_new_token_equal_to_the_cached_one_is_fine(shipped):
    """One repeated token ("\\n" after "\\n") is a normal step, not the misuse above."""
    model, _ = shipped
    cache = cached_model.forward_with_cache(model, torch.tensor([[5]]))[1]
    logits, cache = cached_model.forward_with_cache(model, torch.tensor([[5]]), cache)
    assert cache.length == 2


@pytest.mark.parametrize(
    "tokens,mask,message",
    [
        (torch.tensor([[1.0, 2.0]]), None, "integer tensor"),
        (torch.tensor([1, 2]), None, "integer tensor"),
        (torch.zeros(1, 0, dtype=torch.long), None, "at least one new position"),
        (torch.tensor([[1, 99999]]), None, "d_vocab"),
        (torch.tensor([[1, 2]]), torch.tensor([[1, 1]]), "attention_mask must be a bool"),
        (torch.tensor([[1, 2]]), torch.tensor([[True]]), "attention_mask must be a bool"),
    ],
)
def test_bad_tokens_and_masks(shipped, tokens, mask, message):
    with pytest.raises(ValueError, match=message):
        cached_model.forward_with_cache(shipped[0], tokens, attention_mask=mask)


def test_new_empty_needs_a_batch():
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        KeyValueCache.new_empty(Config(d_model=8, d_head=4, n_heads=2, n_layers=1), batch=0)


@pytest.mark.parametrize("shift", [0, -1, 257, 1.5])
def test_window_shift_range(shipped, shift):
    sampler = cached_sampling.CachedTransformerSampler(*shipped)
    message = r"window_shift \(n_ctx=256\) must be an integer in \[1, 256\]"
    with pytest.raises(ValueError, match=message):
        sampler.sample("ROMEO.", 3, window_shift=shift)


def test_cached_sampler_checks_its_arguments_as_chapter_3_does(shipped):
    sampler = cached_sampling.CachedTransformerSampler(*shipped)
    with pytest.raises(ValueError, match="temperature"):
        sampler.sample("ROMEO.", 3, temperature=-1.0)
    with pytest.raises(ValueError, match="prompt must not be empty"):
        sampler.sample([], 3)


@pytest.mark.parametrize(
    "prompts,kwargs,message",
    [
        ([], {}, "non-empty list"),
        ("ROMEO.", {}, "non-empty list"),
        (["ROMEO.", ""], {}, "every prompt must be a non-empty string"),
        (["ROMEO."], {"max_tokens_generated": 300}, "passes n_ctx=256"),
        (["ROMEO."], {"max_tokens_generated": -1}, "max_tokens_generated"),
        (["ROMEO."], {"frequency_penalty": "high"}, "frequency_penalty"),
        (["ROMEO."], {"top_p": 2.0}, "top_p"),
    ],
)
def test_generate_batch_rejects_bad_arguments(shipped, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        batched.generate_batch(*shipped, prompts, **{"max_tokens_generated": 3, **kwargs})


def test_cached_generation_is_much_less_work(shipped):
    """The point of the cache, counted rather than timed: positions pushed through the model."""
    model, tokenizer = shipped
    seen = []
    hook = model.embed.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        cached_sampling.CachedTransformerSampler(model, tokenizer).sample(
            "ROMEO.\n", 50, temperature=0.0, stop_at_eos=False
        )
        cached_work = sum(seen)
        seen.clear()
        sampling.TransformerSampler(model, tokenizer).sample(
            "ROMEO.\n", 50, temperature=0.0, stop_at_eos=False
        )
        uncached_work = sum(seen)
    finally:
        hook.remove()
    prompt = len(tokenizer.encode("ROMEO.\n"))
    assert cached_work == prompt + 49  # one prefill, then one position per step
    assert uncached_work == sum(range(prompt, prompt + 50))


# --------------------------------------------------------------------------- sabotage


def impl_with(**overrides):
    """The solutions as an `impl`, with some objects replaced by broken versions."""
    names = {}
    for module in (sampling, beams_mod, cached_model, cached_sampling, cached_beams, batched):
        names.update(vars(module))
    return types.SimpleNamespace(**{**names, **overrides})


def test_chapter_1_mask_fails():
    impl = impl_with(
        causal_mask=lambda q, k, device=None: torch.ones(q, k, dtype=torch.bool).triu(1)
    )
    with pytest.raises(pytest.fail.Exception, match="chapter 1's mask"):
        graded.test_causal_mask_hides_the_keys_after_each_query(impl, 3, 10)


def test_positions_that_restart_at_zero_fail(shipped, shipped64):
    """A cached forward that forgets the position offset: every chunk starts at position 0."""

    def no_offset(model, tokens, cache=None, attention_mask=None):
        cfg = model.cfg
        original = model.pos_embed.W_pos
        start = 0 if cache is None else cache.length
        with torch.no_grad():
            shifted = torch.roll(original, shifts=start, dims=0)  # row `start` now holds row 0
            model.pos_embed.W_pos.data, saved = shifted, original.data.clone()
            try:
                return cached_model.forward_with_cache(model, tokens, cache, attention_mask)
            finally:
                model.pos_embed.W_pos.data = saved
        del cfg

    impl = impl_with(forward_with_cache=no_offset)
    with pytest.raises(pytest.fail.Exception, match="positions cache.length"):
        graded.test_cached_logits_equal_uncached_logits(impl, shipped64, shipped, [5] + [1] * 25)


def test_beams_whose_cache_does_not_follow_them_fail(shipped, hf):
    """Beam i reads cache row i (mod the rows there are) instead of its parent's row."""

    class StaleCacheBeams(cached_beams.CachedBeams):
        def generate(self, k, no_repeat_ngram_size=None):
            if self.parents is not None:
                self = dataclasses.replace(self, parents=torch.arange(len(self)) % self.cache.batch)
            new = super().generate(k, no_repeat_ngram_size)
            return StaleCacheBeams(
                **{f.name: getattr(new, f.name) for f in dataclasses.fields(new)}
            )

        def __getitem__(self, index):
            new = super().__getitem__(index)
            return StaleCacheBeams(
                **{f.name: getattr(new, f.name) for f in dataclasses.fields(new)}
            )

    impl = impl_with(CachedBeams=StaleCacheBeams)
    cfg = dict(num_beams=3, num_return_sequences=3, max_new_tokens=15)
    with pytest.raises(AssertionError):
        graded.test_cached_beam_search_equals_hf(impl, shipped, hf, cfg)


def test_padding_that_sees_no_key_fails(shipped, hf):
    """Padding hidden from every query, its own included, with chapter 1's explicit softmax:
    a padding query's scores are all -inf, its softmax is NaN, and NaN spreads to real rows
    through 0 * NaN in the next layer. (PyTorch's fused attention happens to return 0 for such
    rows; a hand-written softmax does not, so the solutions never rely on it.)"""

    def no_own_key(model, tokens, cache=None, attention_mask=None):
        original = cached_model.attention_with_cache
        full_mask = attention_mask if cache is None else None

        def strict(attn, x, past_keys, past_values, allowed=None):
            _, keys, values = original(attn, x, past_keys, past_values, allowed)
            if allowed is not None and full_mask is not None:
                allowed = allowed & full_mask[:, None, None, :]
            q = x[:, None] @ attn.W_Q + attn.b_Q[:, None]
            scores = q @ keys.transpose(-1, -2) / attn.cfg.d_head**0.5
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            z = scores.softmax(dim=-1) @ values
            return (z @ attn.W_O).sum(dim=1) + attn.b_O, keys, values

        cached_model.attention_with_cache = strict
        try:
            return cached_model.forward_with_cache(model, tokens, cache, attention_mask)
        finally:
            cached_model.attention_with_cache = original

    impl = impl_with(forward_with_cache=no_own_key)
    with pytest.raises(AssertionError, match="NaN in a padded row"):
        graded.test_left_padded_batch_matches_each_prompt_alone(impl, shipped, hf)


@pytest.mark.parametrize("bug", ["whole batch", "ignored", "padding counted"])
def test_frequency_penalty_not_counted_per_row_fails(shipped, bug):
    def buggy(model, tokenizer, prompts, max_tokens_generated=100, **kwargs):
        original = batched.sample_next_token

        def counted_wrong(input_ids, logits, frequency_penalty=0.0, attention_mask=None, **kw):
            if bug == "padding counted":  # the mask not passed on
                return original(input_ids, logits, frequency_penalty=frequency_penalty, **kw)
            if bug == "whole batch":  # one count over every row's tokens
                counts = torch.bincount(input_ids.flatten(), minlength=logits.shape[-1])
                logits = logits - frequency_penalty * counts
            return original(input_ids, logits, **kw)  # and the penalty itself never applied

        batched.sample_next_token = counted_wrong
        try:
            return batched.generate_batch(model, tokenizer, prompts, max_tokens_generated, **kwargs)
        finally:
            batched.sample_next_token = original

    impl = impl_with(generate_batch=buggy)
    with pytest.raises(AssertionError, match="count each row's own"):
        graded.test_batched_frequency_penalty_counts_each_row_alone(impl, shipped)
