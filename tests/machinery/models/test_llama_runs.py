"""Chapters 3-6's generators on chapter 7's model: the sampler and beam search (chapter 3), the
cached sampler, cached beams and batched generation (chapter 4), the fast sampler on a static
cache (chapter 5), speculative generation with a GPT-2 drafter and with prompt lookup, lookahead
decoding and speculation on static caches (chapter 6). Each is checked from outside: HF's
LlamaForCausalLM `generate` on the same weights, or chapter 3's own tokens where the generator's
promise is "the same tokens"."""

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solutions.architectures import forward_static
from solutions.batched import generate_batch
from solutions.beams import beam_search
from solutions.cached_beams import CachedBeams
from solutions.cached_sampling import CachedTransformerSampler
from solutions.fast_sampling import FastTransformerSampler, decode_step
from solutions.fast_speculative import FastSpeculativeGenerator
from solutions.lookahead import lookahead_generate
from solutions.sampling import TransformerSampler
from solutions.speculative_generation import SpeculativeStats, speculative_generate
from solutions.static_cache import StaticKeyValueCache
from utils.hf_oracles import hf_beam_search, hf_greedy
from utils.models import load_model

PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?"
PROMPTS = [PROMPT, "KING.\nWhat", "JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\nDeny"]


def test_greedy_sampling_and_the_cached_sampler_equal_hf_generate(llama):
    model, tokenizer, hf = llama
    ids = tokenizer.encode(PROMPT)
    expected = hf_greedy(hf, ids, 40)
    for sampler in (TransformerSampler, CachedTransformerSampler):
        got = sampler(model, tokenizer).sample(ids, 40, temperature=0.0)
        assert got.tolist() == expected, sampler.__name__


def test_the_cached_sampler_gives_chapter_3s_tokens_when_sampling_and_past_n_ctx(llama):
    model, tokenizer, _ = llama
    kwargs = {"temperature": 0.9, "top_k": 20, "seed": 7, "stop_at_eos": False}
    expected = TransformerSampler(model, tokenizer).sample(PROMPT, 30, **kwargs)
    assert CachedTransformerSampler(model, tokenizer).sample(PROMPT, 30, **kwargs) == expected
    # Past n_ctx the window slides: the cache is rebuilt from the tokens that stay in view, and
    # their positions (hence their keys' angles) start again from 0, as chapter 3's do.
    n_ctx = model.cfg.n_ctx
    long = (tokenizer.encode(PROMPT) * n_ctx)[: n_ctx - 4]
    expected = TransformerSampler(model, tokenizer).sample(long, 10, **kwargs)
    got = CachedTransformerSampler(model, tokenizer).sample(long, 10, **kwargs)
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("beams_class", [None, CachedBeams], ids=["beams", "cached-beams"])
def test_beam_search_equals_hf_generate(llama, beams_class):
    model, tokenizer, hf = llama
    ids = tokenizer.encode(PROMPT)
    expected = hf_beam_search(hf, ids, 3, 4, 10, no_repeat_ngram_size=2)
    kwargs = {} if beams_class is None else {"beams_class": beams_class}
    got = beam_search(model, tokenizer, PROMPT, 3, 4, 10, no_repeat_ngram_size=2, **kwargs)
    assert [t.tolist() for _, t in got] == [t.tolist() for _, t in expected]
    for (score, _), (hf_score, _) in zip(got, expected, strict=True):
        assert score == pytest.approx(hf_score, abs=1e-3)


def test_a_left_padded_batch_equals_hf_generate_on_the_same_batch(llama):
    model, tokenizer, hf = llama
    eos = tokenizer.eos_token_id
    rows = [tokenizer.encode(p) for p in PROMPTS]
    width = max(map(len, rows))
    tokens = torch.tensor([[eos] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    with torch.no_grad():  # HF counts each row's positions from its first real token too
        out = hf.generate(
            tokens, attention_mask=mask.long(), max_new_tokens=25, do_sample=False, top_k=None,
            pad_token_id=eos, eos_token_id=None,
        )  # fmt: skip
    expected = [tokenizer.decode(r + out[i, width:].tolist()) for i, r in enumerate(rows)]
    got = generate_batch(model, tokenizer, PROMPTS, 25, temperature=0.0, stop_at_eos=False)
    assert got == expected


def test_the_static_forward_gives_the_cached_forwards_logits_on_a_padded_batch(llama):
    from solutions.architectures import forward_with_cache

    model, tokenizer, _ = llama
    eos = tokenizer.eos_token_id
    rows = [tokenizer.encode(p) for p in PROMPTS[:2]]
    width = max(map(len, rows))
    tokens = torch.tensor([[eos] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = StaticKeyValueCache(model.cfg, 2)
    assert cache.keys[0].shape == (2, model.cfg.n_kv_heads, model.cfg.n_ctx, model.cfg.d_head)
    slots = torch.arange(width)
    with torch.no_grad():
        static = forward_static(model, tokens, cache, slots, positions, mask)
        cached, grown = forward_with_cache(model, tokens, attention_mask=mask)
        torch.testing.assert_close(static[mask], cached[mask], atol=1e-4, rtol=1e-4)
        for step, token in enumerate([[17, 250]]):
            slot = torch.tensor([width + step])
            position = positions[:, -1:] + 1 + step
            got = decode_step(model, cache, torch.tensor(token)[:, None], slot, position)
            want, grown = forward_with_cache(model, torch.tensor(token)[:, None], grown)
            torch.testing.assert_close(got, want[:, -1], atol=1e-4, rtol=1e-4)


def test_the_fast_sampler_equals_hf_and_compiles_once_for_a_whole_generation(llama):
    model, tokenizer, hf = llama
    ids = tokenizer.encode(PROMPT)
    expected = hf_greedy(hf, ids, 40)
    torch._dynamo.reset()
    counters.clear()
    fast = FastTransformerSampler(model, tokenizer, compile="eager")
    assert fast.sample(ids, 40, temperature=0.0).tolist() == expected
    kwargs = {"temperature": 0.9, "top_p": 0.9, "seed": 3, "stop_at_eos": False}
    sampled = fast.sample("KING.\nWhat", 30, **kwargs)
    # One entry in dynamo's cache for the step: compiled once, for both texts and every slot.
    assert len(_debug_get_cache_entry_list(decode_step.__code__)) == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert sampled == TransformerSampler(model, tokenizer).sample("KING.\nWhat", 30, **kwargs)


@pytest.fixture(scope="module")
def draft():
    return load_model("shakespeare-draft")[0]  # GPT-2's architecture, the same tokenizer


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_speculative_generation_equals_greedy_on_the_llama_model(llama, draft, drafter):
    model, tokenizer, _ = llama
    draft = draft if drafter == "model" else None
    expected = generate_batch(model, tokenizer, PROMPTS, 30, temperature=0.0)
    stats = SpeculativeStats()
    got = speculative_generate(
        model, draft, tokenizer, PROMPTS, k=3, max_tokens_generated=30, temperature=0.0,
        drafter=drafter, stats=stats,
    )  # fmt: skip
    assert got == expected
    assert stats.main_passes <= 30  # every pass gives each row at least one token


def test_lookahead_and_the_fast_speculative_generator_run_on_the_llama_model(llama, draft):
    model, tokenizer, _ = llama
    prompts = PROMPTS[:2]
    expected = generate_batch(model, tokenizer, prompts, 30, temperature=0.0)
    got = lookahead_generate(model, tokenizer, prompts, 30, temperature=0.0, pool_from_prompt=True)
    assert got == expected
    # Chapter 6's speculation on chapter 5's static caches: the Llama main model's pass and the
    # GPT-2 drafter's step both through forward_static.
    fast = FastSpeculativeGenerator(model, draft, tokenizer, k=3, compile="eager")
    assert [tokenizer.decode(fast.generate(p, 30, temperature=0.0)) for p in prompts] == expected
    sampled = speculative_generate(
        model, draft, tokenizer, prompts[:1], k=3, max_tokens_generated=30, seed=5,
        return_ids=True,
    )[0]  # fmt: skip
    assert fast.generate(prompts[0], 30, seed=5).tolist() == sampled
