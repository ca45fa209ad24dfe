"""Chapter 6's lookahead decoding: its given code checked from the outside (bad arguments and a
bad layout raise a ValueError that says what is wrong; the learner does not write these, so
they are tested here rather than graded). Its exercises are graded in
tests/graded/test_06_lookahead.py, and its learner-style mutants live in
tests/machinery/mutants/ch06_lookahead.py."""

from __future__ import annotations

import pytest
import torch

import solutions.cached_model as cached_model
from solutions.lookahead import NgramPool, jacobi_decode, lookahead_generate
from utils.hf_oracles import hf_greedy


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"window": 0}, "window"),
        ({"ngram": 1}, "ngram"),
        ({"guesses": -1}, "guesses"),
        ({"temperature": -0.5}, "temperature"),
        ({"max_tokens_generated": -1}, "max_tokens_generated"),
        ({"max_tokens_generated": 230, "window": 10, "guesses": 10}, "widest pass"),
        ({"pool_from_prompt": 1}, "pool_from_prompt"),
    ],
)
def test_lookahead_generate_rejects_bad_arguments(shipped, kwargs, message):
    with pytest.raises(ValueError, match=message):
        lookahead_generate(*shipped, ["ROMEO."], **{"max_tokens_generated": 3, **kwargs})


def test_the_widest_pass_that_fits_runs(shipped):
    # The n_ctx check is exact enough: a run that just fits must not fail inside the cache.
    model, tokenizer = shipped
    prompt = "ROMEO."
    room = model.cfg.n_ctx - len(tokenizer.encode(prompt)) - 2 * (5 + 5)
    out = lookahead_generate(model, tokenizer, [prompt], max_tokens_generated=room,
                             temperature=0.0, stop_at_eos=False, return_ids=True)  # fmt: skip
    assert len(out[0]) == len(tokenizer.encode(prompt)) + room


def test_jacobi_reaches_greedy_decoding(shipped, hf):
    model, tokenizer = shipped
    prompt = tokenizer.encode("HAMLET.\nTo be, or not to be,")
    history = jacobi_decode(model, prompt, 8)
    assert history[-1].tolist() == hf_greedy(hf, prompt, 8)[len(prompt) :]
    assert len(history) <= 9, "n iterations always suffice"


def test_the_pool_keeps_the_newest_continuations_per_key():
    pool = NgramPool(ngram=3, size=2)
    pool.add_text([1, 2, 3, 1, 4, 5, 1, 2, 3, 1, 6, 7])
    assert pool.candidates(1) == [(6, 7), (2, 3)], "newest first, at most `size`, no repeats"
    assert pool.candidates(9) == []


@pytest.mark.parametrize(
    "positions,allowed,message",
    [
        (torch.tensor([5, 6]), None, "give both"),
        (torch.tensor([5, 6, 7]), torch.ones(2, 7, dtype=torch.bool), "positions must be"),
        (torch.tensor([5, 300]), torch.ones(2, 7, dtype=torch.bool), "n_ctx"),
        (torch.tensor([5, 6]), torch.ones(2, 6, dtype=torch.bool), "allowed must be"),
        (torch.tensor([5, 6]), torch.zeros(2, 7, dtype=torch.bool), "its own key"),
    ],
)
def test_forward_with_cache_checks_an_explicit_layout(shipped, positions, allowed, message):
    model, _ = shipped
    cache = cached_model.forward_with_cache(model, torch.arange(1, 6)[None])[1]
    with pytest.raises(ValueError, match=message):
        cached_model.forward_with_cache(
            model, torch.tensor([[7, 8]]), cache, positions=positions, allowed=allowed
        )
