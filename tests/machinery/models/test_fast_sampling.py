"""The static cache and FastTransformerSampler (solutions/static_cache.py, fast_sampling.py),
checked from outside: HF `generate` with its own static cache, chapter 4's cache, chapter 3's
sampler, and dynamo's own counters. The chapter that teaches them (chapter 5) grades a learner's
versions; these tests keep the reference honest until then and after."""

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solutions.cached_model import forward_with_cache
from solutions.fast_sampling import FastTransformerSampler, decode_step
from solutions.sampling import TransformerSampler
from solutions.static_cache import StaticKeyValueCache, forward_static
from tests.graded.test_05_fixed_cost import ReadCounter
from utils.models import load_model

PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?"


@pytest.fixture(scope="module")
def shipped():
    return load_model("shakespeare")


def test_static_steps_give_chapter_4s_logits(shipped):
    model, tokenizer = shipped
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    n = ids.shape[1]
    cache = StaticKeyValueCache(model.cfg, 1)
    slots = torch.arange(n)
    static = forward_static(model, ids, cache, slots, slots[None])
    expected, grown = forward_with_cache(model, ids)
    torch.testing.assert_close(static, expected, atol=1e-4, rtol=1e-4)
    for step, token in enumerate([17, 250, 3]):
        slot = torch.tensor([n + step])
        got = decode_step(model, cache, torch.tensor([[token]]), slot, slot[None])
        want, grown = forward_with_cache(model, torch.tensor([[token]]), grown)
        torch.testing.assert_close(got, want[:, -1], atol=1e-4, rtol=1e-4)


def test_the_cache_is_written_in_place(shipped):
    model, tokenizer = shipped
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    cache = StaticKeyValueCache(model.cfg, 1)
    where = [t.data_ptr() for t in cache.keys + cache.values]
    slots = torch.arange(ids.shape[1])
    forward_static(model, ids, cache, slots, slots[None])
    slot = torch.tensor([ids.shape[1]])
    decode_step(model, cache, torch.tensor([[5]]), slot, slot[None])
    assert [t.data_ptr() for t in cache.keys + cache.values] == where
    assert all(k.shape[2] == model.cfg.n_ctx for k in cache.keys)
    assert int(cache.mask.sum()) == ids.shape[1] + 1


def test_a_left_padded_batch_gives_each_rows_own_logits(shipped):
    model, tokenizer = shipped
    rows = [tokenizer.encode(PROMPT), tokenizer.encode("KING.\nWhat")]
    width = max(map(len, rows))
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    real = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    positions = (real.cumsum(dim=1) - 1).clamp(min=0)
    cache = StaticKeyValueCache(model.cfg, 2)
    logits = forward_static(model, tokens, cache, torch.arange(width), positions, real)
    for b, row in enumerate(rows):
        alone = model(torch.tensor([row]))[0, -1]
        torch.testing.assert_close(logits[b, -1], alone, atol=1e-4, rtol=1e-4)
    # One step more for both rows: each at its own next position, in the shared next slot.
    nxt = torch.tensor([[7], [9]])
    slot = torch.tensor([width])
    step = forward_static(model, nxt, cache, slot, positions[:, -1:] + 1)
    for b, row in enumerate(rows):
        alone = model(torch.tensor([row + [int(nxt[b])]]))[0, -1]
        torch.testing.assert_close(step[b, -1], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": 1.0, "seed": 3},
        {"temperature": 0.8, "top_k": 10, "seed": 1},
        {"temperature": 1.0, "top_p": 0.9, "seed": 2},
        {"temperature": 1.0, "frequency_penalty": 1.5, "seed": 4},
        {"temperature": 1.0, "seed": 5, "stop_at_eos": False},
    ],
)
def test_fast_sampling_gives_chapter_3s_tokens(shipped, kwargs):
    model, tokenizer = shipped
    fast = FastTransformerSampler(model, tokenizer, compile=False)
    expected = TransformerSampler(model, tokenizer).sample(PROMPT, 80, **kwargs)
    assert fast.sample(PROMPT, 80, **kwargs) == expected


def test_greedy_tokens_are_hf_generates_with_its_static_cache(shipped):
    from transformers import GPT2LMHeadModel

    from utils.models import model_dir

    model, tokenizer = shipped
    hf = GPT2LMHeadModel.from_pretrained(model_dir("shakespeare")).eval()
    ids = tokenizer.encode(PROMPT)
    expected = hf.generate(
        torch.tensor([ids]), max_new_tokens=60, do_sample=False, cache_implementation="static",
        pad_token_id=tokenizer.eos_token_id, eos_token_id=None,
    )[0].tolist()  # fmt: skip
    fast = FastTransformerSampler(model, tokenizer, compile=False)
    got = fast.sample(ids, 60, temperature=0.0, stop_at_eos=False).tolist()
    assert got == expected


def test_the_loop_reads_the_device_once_every_sync_every_tokens(shipped, monkeypatch):
    model, tokenizer = shipped
    fast = FastTransformerSampler(model, tokenizer, compile=False, sync_every=16)
    counts = []
    with monkeypatch.context() as patch:
        counter = ReadCounter(patch)
        for n_tokens in (64, 128):
            counter.reads = 0
            fast.sample(tokenizer.encode(PROMPT), n_tokens, temperature=0.0, stop_at_eos=True)
            counts.append(counter.reads)
    # 64 more tokens cost 64 / 16 more reads (is every text done?), and not one per token.
    assert counts[1] - counts[0] == 64 // 16, counts


def test_a_compiled_step_is_one_graph_compiled_once_for_a_whole_generation(shipped):
    model, tokenizer = shipped
    torch._dynamo.reset()
    counters.clear()
    fast = FastTransformerSampler(model, tokenizer, compile="eager")
    first = fast.sample(PROMPT, 100, temperature=1.0, seed=3, stop_at_eos=False)
    fast.sample("KING.\nWhat", 50, temperature=0.0)
    # One entry in dynamo's cache for the step: compiled once, for both texts and every slot.
    assert len(_debug_get_cache_entry_list(decode_step.__code__)) == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    expected = TransformerSampler(model, tokenizer).sample(
        PROMPT, 100, temperature=1.0, seed=3, stop_at_eos=False
    )
    assert first == expected


def test_bad_input_is_refused_with_the_arguments_name(shipped):
    model, tokenizer = shipped
    fast = FastTransformerSampler(model, tokenizer, compile=False)
    n_ctx = model.cfg.n_ctx
    with pytest.raises(ValueError, match="n_ctx"):
        fast.sample([5] * 10, n_ctx)
    with pytest.raises(ValueError, match="sync_every"):
        FastTransformerSampler(model, tokenizer, compile=False, sync_every=0)
    with pytest.raises(ValueError, match="compile"):
        FastTransformerSampler(model, tokenizer, compile=None)
    cache = StaticKeyValueCache(model.cfg, 2)
    with pytest.raises(ValueError, match="batch"):
        cache.check_step(model, torch.tensor([[1, 2]]), torch.arange(2))
    with pytest.raises(ValueError, match="dtype"):
        StaticKeyValueCache(model.cfg, 1, dtype=torch.float64).check_step(
            model, torch.tensor([[1]]), torch.arange(1)
        )
    with pytest.raises(ValueError, match="dtype"):
        StaticKeyValueCache(model.cfg, 1, dtype=torch.long)
