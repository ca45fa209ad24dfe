"""Chapter 4: the KV cache, graded against transformer-lens activations, HF GPT-2's logits and
`generate`, HF's tokenizer padding, and (for sampling under a seed) chapter 3's uncached sampler,
itself graded against HF.

"Equal to the uncached model" is checked in float64, where rounding is ~1e-12 and a bound of
1e-5 leaves no room for a real mistake; against HF (float32) the bound is 1e-4 as in chapter 1.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.graded._oracles import (
    BATCH_PROMPTS,
    BEAM_SCORE_ATOL,
    PROMPT,
    assert_close_f32,
    hf_beam_search,
    hf_greedy,
    hf_window_greedy,
)

CHAPTER = "04_kv_cache"


def ids_of(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


# --------------------------------------------------------------------------- causal_mask


@pytest.mark.causal_mask
@pytest.mark.parametrize("n_query,n_key", [(1, 1), (4, 4), (1, 9), (3, 10), (5, 7)])
def test_causal_mask_hides_the_keys_after_each_query(impl, n_query, n_key):
    mask = impl.causal_mask(n_query, n_key)
    offset = n_key - n_query
    expected = torch.tensor(
        [[k > offset + q for k in range(n_key)] for q in range(n_query)], dtype=torch.bool
    )
    assert mask.shape == (n_query, n_key), (
        f"expected shape ({n_query}, {n_key}), got {tuple(mask.shape)}"
    )
    assert mask.dtype == torch.bool, f"expected a bool mask, got {mask.dtype}"
    if n_query < n_key and torch.equal(mask, torch.triu(torch.ones_like(mask), diagonal=1)):
        pytest.fail(
            "This is chapter 1's mask: with a cache, the queries are the LAST n_query positions, "
            "so query i sits at position n_key - n_query + i. Shift the diagonal."
        )
    assert torch.equal(mask, expected), (
        f"query i (at position {offset} + i) may see keys 0..{offset} + i and no later one"
    )


# --------------------------------------------------------------------------- attention


def head_first(t: torch.Tensor) -> torch.Tensor:
    """transformer-lens's [batch, pos, head, d_head] as the cache's [batch, head, pos, d_head]."""
    return t.transpose(1, 2)


@pytest.mark.attention_with_cache
@pytest.mark.parametrize("layer,n_past", [(0, 20), (2, 27), (3, 0)])
def test_attention_of_one_new_position_matches_reference(impl, shipped, ref_run, layer, n_past):
    _, _, acts = ref_run
    attn = shipped[0].blocks[layer].attn
    x = acts[f"blocks.{layer}.ln1.hook_out"]
    keys, values = (head_first(acts[f"blocks.{layer}.attn.hook_{n}"]) for n in "kv")
    with torch.no_grad():
        out, k, v = impl.attention_with_cache(
            attn, x[:, n_past : n_past + 1], keys[:, :, :n_past], values[:, :, :n_past]
        )
    assert k.shape == (1, attn.cfg.n_heads, n_past + 1, attn.cfg.d_head), (
        f"return the keys of ALL positions, past and new, as [batch, n_heads, pos, d_head]; "
        f"got {tuple(k.shape)}"
    )
    assert_close_f32(
        k, keys[:, :, : n_past + 1], "keys: the cached ones followed by the new position's"
    )
    assert_close_f32(
        v, values[:, :, : n_past + 1], "values: the cached ones followed by the new position's"
    )
    expected = acts[f"blocks.{layer}.hook_attn_out"][:, n_past : n_past + 1]
    assert_close_f32(out, expected, "attention output of the new position (vs transformer-lens)")


@pytest.mark.attention_with_cache
def test_attention_of_a_chunk_matches_reference(impl, shipped, ref_run):
    _, _, acts = ref_run
    attn = shipped[0].blocks[1].attn
    x = acts["blocks.1.ln1.hook_out"]
    keys, values = (head_first(acts[f"blocks.1.attn.hook_{n}"]) for n in "kv")
    n_past, n_new = 11, 6
    q_pos = torch.arange(n_past, n_past + n_new)[:, None]
    allowed = torch.arange(n_past + n_new)[None, :] <= q_pos  # the definition, written out
    with torch.no_grad():
        out, _, _ = impl.attention_with_cache(
            attn,
            x[:, n_past : n_past + n_new],
            keys[:, :, :n_past],
            values[:, :, :n_past],
            allowed,
        )
    expected = acts["blocks.1.hook_attn_out"][:, n_past : n_past + n_new]
    assert_close_f32(out, expected, "six new positions at once; did you pass `allowed` on?")


# --------------------------------------------------------------------------- forward_with_cache


@pytest.mark.forward_with_cache
def test_empty_cache_gives_the_uncached_logits(impl, shipped64, shipped):
    tokens = ids_of(shipped[1], PROMPT)
    with torch.no_grad():
        logits, cache = impl.forward_with_cache(shipped64, tokens)
        expected = shipped64(tokens)
    assert logits.shape == expected.shape, (
        f"expected {tuple(expected.shape)}, got {tuple(logits.shape)}"
    )
    assert (logits - expected).abs().max() <= 1e-5, "with no cache, compute exactly model(tokens)"
    assert cache.length == tokens.shape[1], "the returned cache must hold every position fed"
    assert torch.equal(cache.tokens, tokens), "the cache records the token ids it has seen"


@pytest.mark.forward_with_cache
@pytest.mark.parametrize("chunks", [[5] + [1] * 25, [3, 7, 1, 9, 2, 8]], ids=["steps", "chunks"])
def test_cached_logits_equal_uncached_logits(impl, shipped64, shipped, chunks):
    tokens = ids_of(shipped[1], PROMPT)[:, : sum(chunks)]
    with torch.no_grad():
        expected = shipped64(tokens)
        cache, start, got = None, 0, []
        for size in chunks:
            logits, cache = impl.forward_with_cache(
                shipped64, tokens[:, start : start + size], cache
            )
            assert logits.shape[1] == size, (
                f"return logits for the {size} NEW positions only, got {logits.shape[1]}"
            )
            got.append(logits)
            start += size
    diff = (torch.cat(got, dim=1) - expected).abs().amax(dim=-1)[0]
    if diff.max() > 1e-5:
        first_bad = int((diff > 1e-5).nonzero()[0])
        hint = (
            "The first position is already wrong: check the prefill."
            if first_bad < chunks[0]
            else "Positions after the first chunk are wrong: do the new tokens get positions "
            "cache.length, cache.length + 1, ... (not 0, 1, ...)? Does the mask let each new "
            "query see every cached key?"
        )
        pytest.fail(f"logits differ from the uncached model from position {first_bad} on. {hint}")
    assert cache.length == tokens.shape[1]


@pytest.mark.forward_with_cache
def test_cached_logits_match_hf(impl, shipped, hf):
    model, tokenizer = shipped
    tokens = ids_of(tokenizer, PROMPT)
    with torch.no_grad():
        expected = hf(tokens).logits
        logits, cache = impl.forward_with_cache(model, tokens[:, :10])
        steps = [logits]
        for t in range(10, tokens.shape[1]):
            logits, cache = impl.forward_with_cache(model, tokens[:, t : t + 1], cache)
            steps.append(logits)
    assert_close_f32(
        torch.cat(steps, 1), expected, "prefill of 10 then single steps, against GPT2LMHeadModel"
    )


@pytest.mark.forward_with_cache
def test_left_padded_batch_matches_each_prompt_alone(impl, shipped, hf):
    model, tokenizer = shipped
    rows = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    width = max(map(len, rows))
    pad = tokenizer.eos_token_id
    tokens = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    nxt = torch.tensor([[11], [12], [13]])
    with torch.no_grad():
        logits, cache = impl.forward_with_cache(model, tokens, attention_mask=mask)
        step, _ = impl.forward_with_cache(model, nxt, cache)
        for i, r in enumerate(rows):
            alone = hf(torch.tensor([r + [int(nxt[i])]])).logits[0]
            assert not logits[i].isnan().any(), (
                "NaN in a padded row: a padding query that may see no key at all gives a softmax "
                "of all -inf. Let every position see its own key."
            )
            assert_close_f32(
                logits[i, width - len(r) :],
                alone[:-1],
                f"prompt {i} padded on the left: its real positions must count from 0 and "
                "never attend to padding",
            )
            assert_close_f32(
                step[i, -1], alone[-1], f"prompt {i}: the step after the padded prefill"
            )


# --------------------------------------------------------------------------- cached sampling


@pytest.mark.cached_sample
@pytest.mark.parametrize("prompt", BATCH_PROMPTS)
def test_cached_greedy_equals_hf_generate(impl, shipped, hf, prompt):
    model, tokenizer = shipped
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    got = sampler.sample(tokenizer.encode(prompt), 40, temperature=0.0, stop_at_eos=False)
    assert got.tolist() == hf_greedy(hf, tokenizer.encode(prompt), 40)


@pytest.mark.cached_sample
@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=0.8), dict(top_k=12), dict(top_p=0.7), dict(frequency_penalty=1.2)],
    ids=["temperature", "top_k", "top_p", "frequency_penalty"],
)
def test_cached_sampling_equals_uncached_under_a_seed(impl, shipped, kwargs):
    model, tokenizer = shipped
    uncached = impl.TransformerSampler(model, tokenizer)
    cached = impl.CachedTransformerSampler(model, tokenizer)
    for seed in (0, 1):
        a = uncached.sample(BATCH_PROMPTS[0], 50, seed=seed, stop_at_eos=False, **kwargs)
        b = cached.sample(BATCH_PROMPTS[0], 50, seed=seed, stop_at_eos=False, **kwargs)
        assert a == b, (
            f"seed {seed}, {kwargs}: the cached sampler must draw exactly the uncached tokens. "
            "Does it pass the WHOLE text so far to sample_next_token (the penalty counts it)?"
        )


@pytest.mark.cached_sample
@pytest.mark.parametrize("shift", [1, 40])
def test_cached_sampling_past_n_ctx_slides_the_window(impl, shipped, hf, shift):
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.cfg.d_vocab, (n_ctx - 5,), generator=g).tolist()
    new = 60

    def window_start(t: int, length: int) -> int:
        # The documented rule: a full cache is rebuilt from the last n_ctx - shift + 1 tokens,
        # and then grows one position per step until it is full again.
        if length <= n_ctx:
            return 0
        overflow = length - n_ctx  # steps since the window first had to move
        last_rebuild = length - (overflow - 1) % shift  # text length at the last rebuild
        return last_rebuild - (n_ctx - shift + 1)

    expected = hf_window_greedy(hf, prompt, new, window_start)
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    got = sampler.sample(prompt, new, temperature=0.0, stop_at_eos=False, window_shift=shift)
    assert got.tolist() == expected, (
        f"past n_ctx with window_shift={shift}: rebuild the cache from the last "
        f"n_ctx - window_shift + 1 tokens when it is full"
    )


# --------------------------------------------------------------------------- cached beams


@pytest.mark.cached_beams
@pytest.mark.parametrize(
    "cfg",
    [
        dict(num_beams=3, num_return_sequences=3, max_new_tokens=15),
        dict(num_beams=4, num_return_sequences=2, max_new_tokens=12, no_repeat_ngram_size=2),
    ],
)
def test_cached_beam_search_equals_hf(impl, shipped, hf, cfg):
    model, tokenizer = shipped
    got = impl.beam_search(model, tokenizer, BATCH_PROMPTS[0], beams_class=impl.CachedBeams, **cfg)
    expected = hf_beam_search(hf, tokenizer.encode(BATCH_PROMPTS[0]), **cfg)
    assert [t.tolist() for _, t in got] == [t.tolist() for _, t in expected], (
        "beams differ from HF's: does each candidate's cache row follow its parent beam "
        "(cache[parents]) after filter?"
    )
    torch.testing.assert_close(
        torch.tensor([s for s, _ in got]),
        torch.tensor([s for s, _ in expected]),
        atol=BEAM_SCORE_ATOL,
        rtol=0,
    )


@pytest.mark.cached_beams
def test_cached_beam_search_past_n_ctx_equals_uncached(impl, shipped):
    model, tokenizer = shipped
    g = torch.Generator().manual_seed(3)
    words = torch.randint(0, model.cfg.d_vocab, (model.cfg.n_ctx - 4,), generator=g).tolist()
    prompt = tokenizer.decode(words)
    cfg = dict(num_beams=3, num_return_sequences=3, max_new_tokens=10)
    expected = impl.beam_search(model, tokenizer, prompt, **cfg)  # chapter 3's, graded vs HF
    got = impl.beam_search(model, tokenizer, prompt, beams_class=impl.CachedBeams, **cfg)
    assert [t.tolist() for _, t in got] == [t.tolist() for _, t in expected], (
        "past n_ctx the cached beams must read the same last n_ctx tokens as the uncached ones"
    )


# --------------------------------------------------------------------------- batches


@pytest.mark.left_pad
def test_left_pad_matches_hf_tokenizer_padding(impl, shipped):
    _, tokenizer = shipped
    tok = copy.deepcopy(tokenizer)
    tok.padding_side = "left"
    tok.pad_token = tok.eos_token
    texts = BATCH_PROMPTS + ["A"]
    expected = tok(texts, padding=True, return_tensors="pt")
    tokens, mask = impl.left_pad([tokenizer.encode(t) for t in texts], tok.pad_token_id)
    assert torch.equal(tokens, expected["input_ids"]), "each row: padding first, then the prompt"
    assert torch.equal(mask, expected["attention_mask"].bool()), (
        "the mask is True at real tokens, False at padding (as a bool tensor)"
    )


@pytest.mark.generate_batch
def test_batched_greedy_equals_hf_on_each_prompt(impl, shipped, hf):
    model, tokenizer = shipped
    texts = impl.generate_batch(
        model, tokenizer, BATCH_PROMPTS, 30, temperature=0.0, stop_at_eos=False
    )
    assert len(texts) == len(BATCH_PROMPTS), "one text per prompt, in the prompts' order"
    for text, prompt in zip(texts, BATCH_PROMPTS, strict=True):
        assert text == tokenizer.decode(hf_greedy(hf, tokenizer.encode(prompt), 30)), (
            f"prompt {prompt!r}: batched greedy text must equal the prompt generated alone"
        )


def eos_boosted(model, tokenizer, nats: float):
    """A copy of `model` on which end-of-text is `nats` more likely everywhere."""
    crafted = copy.deepcopy(model)
    with torch.no_grad():
        crafted.unembed.b_U[tokenizer.eos_token_id] += nats
    return crafted


@pytest.mark.generate_batch
def test_batched_frequency_penalty_counts_each_row_alone(impl, shipped):
    model, tokenizer = shipped
    # The padding id is end-of-text: made 5 nats more likely, greedy text ends within 25
    # tokens for the second and third prompts alone, and counting the 12 padding tokens of the
    # short second prompt as text (1.5 each) would stop its text ending.
    crafted = eos_boosted(model, tokenizer, 5.0)
    for m, stop in [(model, False), (crafted, True)]:
        sampler = impl.TransformerSampler(m, tokenizer)  # chapter 3's, graded vs closed form
        kwargs = dict(temperature=0.0, frequency_penalty=1.5, stop_at_eos=stop)
        texts = impl.generate_batch(m, tokenizer, BATCH_PROMPTS, 25, **kwargs)
        for text, prompt in zip(texts, BATCH_PROMPTS, strict=True):
            assert text == sampler.sample(prompt, 25, **kwargs), (
                "with a frequency penalty, count each row's own real tokens: not the other "
                "rows', not the padding (pass the cache's mask on as attention_mask)"
            )


@pytest.mark.generate_batch
def test_batched_rows_stop_at_their_own_end_of_text(impl, shipped):
    model, tokenizer = shipped
    # A crafted model: end-of-text made 5 nats more likely, so that greedy text ends after
    # 19 tokens for the first prompt, 6 for the second, and not within 30 for the third.
    crafted = eos_boosted(model, tokenizer, 5.0)
    sampler = impl.TransformerSampler(crafted, tokenizer)  # chapter 3's, graded vs HF
    expected = [sampler.sample(p, 30, temperature=0.0) for p in BATCH_PROMPTS]
    ends = [t.endswith(tokenizer.eos_token) for t in expected]
    assert ends == [True, True, False], f"test setup: expected two texts to end, got {ends}"
    got = impl.generate_batch(crafted, tokenizer, BATCH_PROMPTS, 30, temperature=0.0)
    for text, want in zip(got, expected, strict=True):
        assert text == want, (
            "stop each row after its own end-of-text token (keep that token), and let the "
            "other rows go on"
        )
