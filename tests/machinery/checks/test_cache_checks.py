"""Chapter 4's given code and graded tests, checked from the outside.

- Misuse of the cache and bad arguments raise a ValueError that says what is wrong (this code
  is given to learners, so it is tested here rather than graded).
- The classic mistakes are learner-style mutants (tests/machinery/mutants/ch04.py), each of
  which must fail a graded test: `pytest tests/graded --mutants`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import solutions.batched as batched
import solutions.cached_model as cached_model
import solutions.cached_sampling as cached_sampling
import solutions.sampling as sampling
from solutions.config import Config
from solutions.kv_cache import KeyValueCache


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
