"""Speculative decoding on static caches with compiled steps (solutions/fast_speculative.py),
checked from outside: greedy tokens against HF `generate` on its static cache, seeded sampling
against chapter 6's `speculative_generate` (the same random calls in the same order), dynamo's
own cache of compiled versions, and the errors it owes bad input."""

import copy

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from solutions.architectures import forward_static
from solutions.fast_speculative import FastSpeculativeGenerator
from solutions.speculative_generation import SpeculativeStats, speculative_generate
from tests.support import hf_static_greedy
from utils.models import load_hf, load_model

PROMPTS = ["ROMEO.\nBut soft, what light through yonder window breaks?", "\n"]


@pytest.fixture(scope="module")
def models():
    main, tokenizer = load_model("shakespeare")
    draft, _ = load_model("shakespeare-draft")
    return main, draft, tokenizer


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_tokens_are_hfs(models, k):
    main, draft, tokenizer = models
    hf = load_hf("shakespeare")[0].eval()
    generator = FastSpeculativeGenerator(main, draft, tokenizer, k=k, compile=False)
    stats = SpeculativeStats()
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        got = generator.generate(ids, 40, temperature=0.0, stop_at_eos=False, stats=stats)
        assert got.tolist() == hf_static_greedy(hf, ids, 40, stop_at_eos=False), prompt
    assert stats.tokens == 80 and stats.main_passes < 80  # drafts were kept, passes saved


@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 40}, {"top_p": 0.9}]
)
def test_seeded_tokens_are_chapter_6s(models, sampling):
    main, draft, tokenizer = models
    generator = FastSpeculativeGenerator(main, draft, tokenizer, k=3, compile=False)
    for seed, prompt in enumerate(PROMPTS):
        expected = speculative_generate(
            main, draft, tokenizer, [prompt], k=3, max_tokens_generated=40, seed=seed,
            stop_at_eos=False, return_ids=True, **sampling,
        )[0]  # fmt: skip
        got = generator.generate(prompt, 40, seed=seed, stop_at_eos=False, **sampling)
        assert got.tolist() == expected, (prompt, sampling)


def test_stops_at_the_first_end_of_text_as_chapter_6_does(models):
    main, draft, tokenizer = models
    # The shipped model seldom ends a text: a tokenizer whose end-of-text is the newline makes
    # both generators stop within a line or two.
    newline = tokenizer.encode("\n")[0]
    ends_lines = copy.copy(tokenizer)
    ends_lines.eos_token_id = newline
    generator = FastSpeculativeGenerator(main, draft, ends_lines, k=4, compile=False)
    for seed in range(3):
        expected = speculative_generate(
            main, draft, ends_lines, ["ROMEO."], k=4, max_tokens_generated=100, seed=seed,
            return_ids=True,
        )[0]  # fmt: skip
        got = generator.generate("ROMEO.", 100, seed=seed).tolist()
        assert got == expected and got[-1] == newline and len(got) < 100


def test_one_compiled_version_per_k_over_whole_generations(models):
    main, draft, tokenizer = models
    torch._dynamo.reset()
    for k in (2, 3):
        generator = FastSpeculativeGenerator(main, draft, tokenizer, k=k, compile="eager")
        for prompt in PROMPTS:  # every slot of a generation, twice over
            generator.generate(prompt, 30, temperature=0.0, stop_at_eos=False)
    assert len(_debug_get_cache_entry_list(forward_static.__code__)) == 2  # one per k


def test_bad_input_is_refused_by_name(models):
    main, draft, tokenizer = models
    with pytest.raises(ValueError, match="k"):
        FastSpeculativeGenerator(main, draft, tokenizer, k=0)
    with pytest.raises(ValueError, match="compile"):
        FastSpeculativeGenerator(main, draft, tokenizer, compile=3)
    generator = FastSpeculativeGenerator(main, draft, tokenizer, k=4, compile=False)
    with pytest.raises(ValueError, match="n_ctx"):
        generator.generate("\n", main.cfg.n_ctx)
    with pytest.raises(ValueError, match="temperature"):
        generator.generate("\n", 5, temperature=-1.0)
    with pytest.raises(ValueError, match="at least one token"):
        generator.generate([], 5)
