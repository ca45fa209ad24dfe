"""Hugging Face transformers' tests of its continuous batching (`generate_batch`,
`ContinuousBatchingManager`, the paged cache `PagedAttentionCache` and its schedulers), rewritten
for chapter 8's engine: `solutions/engine.py` (`LLMEngine`, `generate`), with the scheduler,
KV-cache manager and paged attention under it, on the shipped model.

Sources (the cases, and the contracts they check, are theirs; the code is this course's own):

- huggingface/transformers, tests/generation/test_continuous_batching.py at commit
  1e385bb829d59a1a1ca13c7eb2e7559d04837077. That version was read from the index's copy of
  the mirror AUTHENSOR/transformers; the index's copy of huggingface/transformers itself holds
  an older version of the file, at f9d7065f3d340dbda920c1ed70a1671b1b24d2bd, with the parity,
  streaming, prefix-sharing and num_return_sequences cases only (the same cases there).
- huggingface/transformers, tests/generation/test_scheduler.py at commit
  a87908bfdfb476d1be6784ae5c322fc266849f1d.
- huggingface/transformers, tests/generation/test_paged_attention.py at commit
  2b6c089d5a0b18d59a08c36b91404ece60915cf3.

They check the course's reference code (`solutions`), not a learner's notebook: no `impl`.

What changed on the way (tests/peers/README.md says more):

- The model. HF's tests download TinyLlama, Qwen2.5-0.5B, Llama-3.2-3B or Gemma and run on a GPU;
  these run the shipped 2.6M-parameter GPT-2 ("shakespeare") on the CPU, with no network. HF's
  oracle, `model.generate`, is HF's `GPT2LMHeadModel` loaded from the shipped model's folder.
  Prompts are Shakespeare's lines, tokenized as they are (HF's are chat-templated questions).
- Sizes are scaled to a context of 256 positions: blocks of 4 to 32 positions, where HF's are 32
  to 512, and pools of 8 to 64 blocks (2 to 128 in the scheduler's cases, which run no model).
- Greedy parity is exact (token for token), as in HF's tests: float32 on both sides.
- `generate_batch(inputs)` is `generate(engine, prompts, params)`; `manager.add_request` and
  `request_id_iter` are `engine.add_request` and `engine.step()`; `cancel_request` is
  `abort_request`; HF's soft reset and CPU offloading (a request that loses its cache) are the
  course's preemption (its blocks are freed; it is computed again from its tokens later).
- HF's per-request `temperature`, `top_k`, `top_p` are `SamplingParams`; the course refuses top-k
  and top-p together, so one request has each.
- The model's end-of-text token never comes up in its greedy text, so the eos test names ","
  the end token, on the engine's side and on HF's `generate` alike.
- Not ported: everything about CUDA graphs, torch.compile, async batching, FlashAttention and
  the other attention kernels, sliding-window and hybrid models, multimodal inputs and their
  embeddings cache, log-probabilities, the memory-footprint predictor, tensor parallelism and
  its distributed helper, the output router and its async handlers. HF's scheduler test uses
  its prefill-first option; the course's scheduler is first come, first served, like HF's
  default (FIFOScheduler), so that test keeps its contract but not its order.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch

from solutions.engine import LLMEngine, generate
from solutions.kv_cache_manager import KVCacheManager
from solutions.paged_attention import attend, prepare_inputs
from solutions.request import Request, RequestStatus
from solutions.sampling_params import SamplingParams
from solutions.scheduler import Scheduler
from tests.support import run_to_end
from utils.models import load_hf, load_model

# Five prompts of different lengths (19, 1, 17, 18 and 12 tokens). HF's parity tests use three
# questions, test_paged_attention five prompts.
PROMPTS = [
    "ROMEO.\nBut soft, what light through yonder window breaks?",
    "\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "KING LEAR.\nMeantime we shall express our darker purpose.",
    "HAMLET.\nTo be, or not to be",
]
# A prompt of 45 tokens: one full block of 32 and a partial one (HF's block-sharing test wants
# 32 <= length < 64 with blocks of 32).
LONG_PROMPT = (
    "HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to "
    "suffer\nThe slings and arrows of outrageous fortune,"
)
# A prompt of 47 tokens, read in chunks.
CHUNKED_PROMPT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
)
ORACLE_TOKENS = 80  # HF's longest parity run (test_continuous_batching_long_generate)


def greedy(max_tokens: int) -> SamplingParams:
    # The shipped model's end-of-text never comes up greedily; ignore_eos says so explicitly.
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def hf_generate(hf, prompts: list[list[int]], max_new_tokens: int, eos: int | None = None):
    """HF's `generate`, greedy, on one left-padded batch with its attention mask (as HF's parity
    test calls it): each row's new tokens, up to and including its first `eos` (the padding
    after it dropped)."""
    pad = 0 if eos is None else eos
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            top_k=None, eos_token_id=eos, pad_token_id=pad,
        )  # fmt: skip
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def shipped():
    return load_model("shakespeare")


@pytest.fixture(scope="module")
def hf():
    return load_hf("shakespeare")[0].eval()


@pytest.fixture(scope="module")
def prompt_ids(shipped):
    _, tokenizer = shipped
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def oracle(hf, prompt_ids):
    """HF's greedy tokens for the five prompts, 80 of each (a shorter greedy run is a prefix)."""
    return hf_generate(hf, prompt_ids, ORACLE_TOKENS)


def request_stream(engine: LLMEngine, max_steps: int = 2000) -> dict[str, list]:
    """Step to the end; every output of each request, in order."""
    return run_to_end(engine, max_steps)


def assert_pool_is_free(engine: LLMEngine) -> None:
    pool = engine.kv.pool
    assert pool.num_free_blocks == len(pool.blocks), "blocks still held after every request ended"
    assert all(block.ref_cnt == 0 for block in pool.blocks)


# ---------------------------------------------------------------------------------------------
# tests/generation/test_continuous_batching.py: parity with `generate`


@pytest.mark.parametrize(
    ("prefix_caching", "max_tokens"), [(False, 20), (True, 20), (True, ORACLE_TOKENS)]
)
def test_generate_gives_hfs_generate_tokens(
    shipped, prompt_ids, oracle, prefix_caching, max_tokens
):
    """HF's `test_continuous_batching_fast` and `test_continuous_batching_config_combinations_
    no_compile` (its `allow_block_sharing` off and on) through `_test_continuous_batching_parity`,
    and `test_continuous_batching_long_generate` (80 new tokens): three prompts, greedy; each
    request's tokens are those of HF's `generate` on a padded batch. Also HF's
    `test_continuous_batching_no_accelerators` (one non-empty output per input, on the CPU)."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=16,
                       enable_prefix_caching=prefix_caching)  # fmt: skip
    outputs = generate(engine, prompt_ids[:3], greedy(max_tokens))
    assert len(outputs) == 3
    for i, output in enumerate(outputs):
        assert output.finished and output.finish_reason == "length"
        assert output.output_token_ids == oracle[i][:max_tokens], f"prompt {i}"
    assert_pool_is_free(engine)


def test_few_blocks_preempt_and_still_give_hfs_tokens(shipped, prompt_ids, oracle):
    """HF's `test_continuous_batching_few_blocks` (and `test_cpu_offloading_parity`,
    `test_cpu_offloading_disabled_when_zero`): a pool so small that a request must lose its
    cache at some point (HF: 4 blocks of 32; here 16 blocks of 4, about one request's worth),
    the three prompts each repeated 4 times, block sharing on, 30 new tokens. HF spies on its
    offloading method and wants it called; the port spies on the scheduler's preemption. Every
    request still gets `generate`'s tokens."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=16, block_size=4, max_num_batched_tokens=64)
    prompts = prompt_ids[:3] * 4
    with patch.object(Scheduler, "_preempt", autospec=True, side_effect=Scheduler._preempt) as spy:
        outputs = generate(engine, prompts, greedy(30))
    assert spy.called, "the pool was meant to be too small: no request was preempted"
    for i, output in enumerate(outputs):
        assert output.output_token_ids == oracle[i % 3][:30], f"request {i}"
    assert_pool_is_free(engine)


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "max_num_batched_tokens"), [(64, 4, 16), (32, 8, 32), (16, 16, 64)]
)
def test_every_cache_shape_gives_the_same_tokens(
    shipped, prompt_ids, oracle, num_blocks, block_size, max_num_batched_tokens
):
    """HF's `test_generate_batch_consistency` (test_paged_attention.py): five prompts, 50 new
    tokens, under each (num_blocks, block_size, max_batch_tokens) of HF's: (64, 128, 64),
    (32, 256, 128), (16, 512, 256), with block sizes divided by 32 and budgets by 4 (a context of
    256, not 8192). HF compares with fixed expected texts of Llama-3.2-3B; the port with HF's
    `generate`. HF's four attention implementations have no counterpart: one shape each."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=num_blocks, block_size=block_size,
                       max_num_batched_tokens=max_num_batched_tokens)  # fmt: skip
    outputs = generate(engine, prompt_ids, greedy(50))
    assert [o.output_token_ids for o in outputs] == [row[:50] for row in oracle]
    assert_pool_is_free(engine)


def test_a_chunked_prompt_gives_hfs_tokens_within_the_token_budget(shipped, hf, prompt_ids, oracle):
    """HF's `test_multimodal_parity_chunked_prefill` (text only: the course has no images): a
    small `max_batch_tokens` splits a long prompt over several prefill chunks, and the output is
    still `generate`'s. The port also checks the budget: no step computes more than 8 tokens,
    and the prompt's first token comes after ceil(47 / 8) steps, less what a neighbour takes."""
    model, tokenizer = shipped
    long_ids = tokenizer.encode(CHUNKED_PROMPT)
    want = hf_generate(hf, [long_ids], 20)[0]
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4, max_num_batched_tokens=8)
    plans = []
    schedule = engine.scheduler.schedule

    def spy():
        plans.append(schedule())
        return plans[-1]

    engine.scheduler.schedule = spy
    engine.add_request("long", long_ids, greedy(20))
    engine.add_request("short", prompt_ids[1], greedy(20))  # gets the budget the chunks leave
    outputs = request_stream(engine)
    assert all(plan.num_tokens <= 8 for plan in plans), [plan.num_tokens for plan in plans]
    first = next(i for i, o in enumerate(outputs["long"]) if o.new_token_ids)
    assert first >= math.ceil(len(long_ids) / 8) - 1, "the prompt was not read in chunks"
    assert outputs["long"][-1].output_token_ids == want
    assert outputs["short"][-1].output_token_ids == oracle[1][:20]


def test_eos_stops_each_request_where_hfs_generate_stops(shipped, hf, prompt_ids, oracle):
    """HF's parity tests stop each request at the end token (`generate` pads the rows that
    stopped; HF's test strips that padding), and test_paged_attention passes `eos_token_id`.
    The shipped model never says its end-of-text greedily, so "," is the end token here, on both
    sides: requests stop after different numbers of tokens (or run to max_tokens), each where
    `generate` stops, the end token included. A request with `ignore_eos` runs on."""
    model, tokenizer = shipped
    comma = tokenizer.encode(",")[0]
    stops_at_comma = SimpleNamespace(encode=tokenizer.encode, eos_token_id=comma)
    engine = LLMEngine(model, stops_at_comma, num_blocks=64, block_size=4)
    want = hf_generate(hf, prompt_ids, 30, eos=comma)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    for i, ids in enumerate(prompt_ids):
        engine.add_request(str(i), ids, params)
    engine.add_request("ignore", prompt_ids[0], greedy(30))
    outputs = request_stream(engine)
    reasons = []
    for i in range(len(prompt_ids)):
        last = outputs[str(i)][-1]
        assert last.output_token_ids == want[i], f"prompt {i}"
        reason = "stop" if want[i][-1] == comma else "length"
        assert last.finish_reason == reason, f"prompt {i}"
        reasons.append(reason)
    assert {"stop", "length"} <= set(reasons), "the case was meant to have both endings"
    ignored = outputs["ignore"][-1]
    assert ignored.finish_reason == "length" and ignored.output_token_ids == oracle[0][:30]
    assert comma in ignored.output_token_ids
    assert_pool_is_free(engine)


# ---------------------------------------------------------------------------------------------
# tests/generation/test_continuous_batching.py: streaming, block sharing, several requests


@pytest.mark.parametrize("mode", ["streaming", "non-streaming", "both"])
def test_streamed_outputs_grow_one_token_a_step(shipped, prompt_ids, oracle, mode):
    """HF's `test_streaming_request`, `test_non_streaming_request` and
    `test_streaming_and_non_streaming_requests_can_alternate` (3 new tokens): a streamed request
    (the engine's step outputs) shows 1, then 2, then 3 tokens; a non-streamed one (`generate`)
    comes back once, with all 3; the two can follow each other on one engine."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=16)
    if mode in ("non-streaming", "both"):
        [output] = generate(engine, [prompt_ids[0]], greedy(3))
        assert output.finished and output.output_token_ids == oracle[0][:3]
    if mode in ("streaming", "both"):
        engine.add_request("streamed", prompt_ids[0], greedy(3))
        chunks = request_stream(engine)["streamed"]
        assert [len(c.output_token_ids) for c in chunks] == [1, 2, 3]
        assert [len(c.new_token_ids) for c in chunks] == [1, 1, 1]
        assert [c.finished for c in chunks] == [False, False, True]
        assert chunks[-1].output_token_ids == oracle[0][:3]


def test_outputs_are_snapshots(shipped, prompt_ids):
    """HF's `test_generation_outputs_are_snapshots`: an output handed out at one step keeps its
    tokens when the request grows later (HF: a streamed RequestState's `to_generation_output`)."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=16)
    engine.add_request("r", prompt_ids[0], greedy(3))
    kept, seen = [], []
    while engine.has_unfinished_requests():
        for output in engine.step():
            kept.append(output)
            seen.append(copy.deepcopy(output))
    assert [len(o.output_token_ids) for o in seen] == [1, 2, 3]
    assert kept == seen, "an output changed after it was handed out"


def test_a_repeated_prompt_reuses_its_cached_block(shipped, hf):
    """HF's `test_prefix_sharing` (`_test_block_sharing`, full attention only): blocks of 32, a
    prompt of 32 to 63 tokens (here 45), 32 new tokens. After the first request, two blocks are
    named (one filled by the prompt, one by the decode) and nothing was found cached. The same
    prompt again finds its first 32 tokens cached, names no new block, and gets the same tokens,
    which are `generate`'s. (The course's last sampled token is never fed, so the second block
    fills only if the prompt has at least 33 tokens.)"""
    model, tokenizer = shipped
    ids = tokenizer.encode(LONG_PROMPT)
    assert 33 <= len(ids) < 64, len(ids)
    engine = LLMEngine(model, tokenizer, num_blocks=8, block_size=32)
    first = generate(engine, [ids], greedy(32))[0]
    assert len(engine.kv.pool.cached) == 2
    assert engine.stats.prompt_tokens_cached == 0
    second = generate(engine, [ids], greedy(32))[0]
    assert len(engine.kv.pool.cached) == 2, "block reuse: no new name"
    assert engine.stats.prompt_tokens_cached == 32
    assert first.output_token_ids == second.output_token_ids
    assert first.output_token_ids == hf_generate(hf, [ids], 32)[0]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_two_requests_for_one_prompt_get_the_same_tokens(
    shipped, prompt_ids, oracle, prefix_caching
):
    """HF's `test_num_return_sequences` (`allow_block_sharing` on and off): HF forks one request
    into two (`num_return_sequences = 2`), greedy, 30 tokens, and wants the same tokens twice.
    The course has no `n`: the port sends the same prompt twice in one step. With prefix
    caching, the second shares the first one's full prompt blocks, as HF's fork does (19 tokens
    in blocks of 4: the 4 full blocks before the last token)."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4,
                       enable_prefix_caching=prefix_caching)  # fmt: skip
    a, b = generate(engine, [prompt_ids[0], prompt_ids[0]], greedy(30))
    assert a.output_token_ids == b.output_token_ids == oracle[0][:30]
    assert engine.stats.prompt_tokens_cached == (16 if prefix_caching else 0)


def test_per_request_sampling_params_in_one_batch(shipped, hf, prompt_ids):
    """HF's `test_per_request_logits_processors`: two requests for one prompt, in one batch, each
    with its own temperature, top-k and top-p (HF: top_k 10 and 50, top_p 0.9 and 0.99). HF
    compares each with `generate` under the same processors, and wants the two to differ. The
    course refuses top-k with top-p, so one request has top_k 10, the other top_p 0.9, and each
    draws from its own seed. Each gets the tokens it gets alone; each token is in HF's top 10,
    or HF's 0.9 nucleus, of the logits at its position; the two differ."""
    model, tokenizer = shipped
    ids = prompt_ids[0]
    params = {
        "top_k": SamplingParams(temperature=1.0, top_k=10, max_tokens=20, seed=1, ignore_eos=True),
        "top_p": SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=2, ignore_eos=True),
    }
    together = LLMEngine(model, tokenizer, num_blocks=64, block_size=4)
    outs = dict(zip(params, generate(together, [ids, ids], list(params.values())), strict=True))
    tokens = {}
    for name, p in params.items():
        tokens[name] = outs[name].output_token_ids
        alone = generate(LLMEngine(model, tokenizer, num_blocks=64, block_size=4), [ids], p)[0]
        assert tokens[name] == alone.output_token_ids, f"{name}: not its tokens alone"
    assert tokens["top_k"] != tokens["top_p"]
    for name, out in tokens.items():
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1]
        for position, (row, token) in enumerate(zip(logits, out, strict=True)):
            if name == "top_k":  # tokens with a clearly larger logit (1e-4: float32 rounding)
                assert (row > row[token] + 1e-4).sum() < 10, f"top_k: token {position}"
            else:  # the mass of the tokens clearly more likely than it
                probs = row.softmax(-1)
                assert probs[probs > probs[token] + 1e-6].sum() < 0.9 + 1e-4, f"top_p: {position}"


# ---------------------------------------------------------------------------------------------
# tests/generation/test_continuous_batching.py: losing the cache, and cancelling


def test_a_preempted_request_keeps_its_tokens_and_stops_at_max_tokens(shipped, hf, prompt_ids):
    """HF's `test_streaming_output_after_soft_reset_does_not_shorten_generation`: a request that
    has 2 of its 5 tokens is reset (its cache dropped, its prompt now prompt + those tokens);
    it then accepts exactly 3 more, and its stream goes on from the 2. The course's preemption
    is that reset. Two prompts of 8 tokens, 12 new tokens each, 8 blocks of 4: the newer one is
    preempted with some of its tokens; it keeps them, is computed again from all its tokens,
    streams on without losing or repeating one, and ends with exactly 12: `generate`'s."""
    model, tokenizer = shipped
    prompts = [prompt_ids[0][:8], prompt_ids[2][:8]]
    want = hf_generate(hf, prompts, 12)
    engine = LLMEngine(model, tokenizer, num_blocks=8, block_size=4, max_num_batched_tokens=64)
    resets, original = [], Scheduler._preempt

    def preempt(scheduler, request):
        kept = list(request.output_token_ids)
        original(scheduler, request)
        assert request.output_token_ids == kept and request.num_computed_tokens == 0
        assert request.all_token_ids == request.prompt_token_ids + kept
        resets.append((request.request_id, len(kept)))

    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, greedy(12))
    with patch.object(Scheduler, "_preempt", autospec=True, side_effect=preempt):
        outputs = request_stream(engine)
    assert resets and all(0 < n < 12 for _, n in resets), resets
    for i in range(2):
        stream, previous = outputs[str(i)], []
        for output in stream:
            assert output.output_token_ids == previous + output.new_token_ids
            previous = output.output_token_ids
        assert len(previous) == 12 and previous == want[i], f"request {i}"
    assert_pool_is_free(engine)


def test_an_aborted_request_stops_early_and_frees_its_blocks(shipped, prompt_ids, oracle):
    """HF's `test_continuous_batching_tp_cancellation` (`_tp_cancellation_worker`; one device
    here, no tensor parallelism): a streamed request of 200 new tokens is cancelled after its
    third chunk, and generation stops well before 200. HF's scheduler frees a cancelled
    request's blocks (`clear_cancelled_requests`); the course frees them at once, and the next
    step reports the abort. A neighbour goes on to `generate`'s tokens."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4)
    engine.add_request("long", prompt_ids[0], greedy(200))
    engine.add_request("other", prompt_ids[2], greedy(20))
    chunks = []
    while len(chunks) < 3:
        chunks += [o for o in engine.step() if o.request_id == "long"]
    free = engine.kv.pool.num_free_blocks
    engine.abort_request("long")
    assert engine.kv.pool.num_free_blocks == free + math.ceil((len(prompt_ids[0]) + 2) / 4)
    outputs = request_stream(engine)
    assert [(o.finished, o.finish_reason, o.new_token_ids) for o in outputs["long"]] == [
        (True, "abort", [])
    ], "after the abort, one output says so and nothing more comes"
    assert len(outputs["long"][0].output_token_ids) == 3 < 200
    assert outputs["other"][-1].output_token_ids == oracle[2][:20]
    assert_pool_is_free(engine)


# ---------------------------------------------------------------------------------------------
# tests/generation/test_continuous_batching.py: the paged cache's own cases


@pytest.mark.parametrize(
    ("num_requested_blocks", "num_full_attention_groups", "num_free_blocks", "expected"),
    [(2, 1, 10, True), (5, 2, 5, False), (3, 2, 6, True), (0, 1, 0, True)],
)
def test_allocation_succeeds_iff_the_free_blocks_suffice(
    num_requested_blocks, num_full_attention_groups, num_free_blocks, expected
):
    """HF's `test_continuous_batching_will_allocation_be_successful`, its full-attention cases
    (1, 2, 7 and 9): n blocks for each of g full-attention layer groups succeed iff n * g <= the
    free blocks. The course keeps one block table for every layer, so g groups ask for n * g
    blocks; the port asks `allocate_slots` for that many blocks' worth of tokens, in a pool of 16
    blocks of 16 of which `num_free_blocks` are free. A refused allocation changes nothing."""
    kv = KVCacheManager(num_blocks=16, block_size=16)
    filler = Request("filler", [1] * ((16 - num_free_blocks) * 16), SamplingParams())
    assert kv.allocate_slots(filler, len(filler.prompt_token_ids)) is not None
    assert kv.pool.num_free_blocks == num_free_blocks
    request = Request("r", [2] * 16, SamplingParams())
    needed = num_requested_blocks * num_full_attention_groups
    table = kv.allocate_slots(request, needed * 16)
    assert (table is not None) == expected
    if expected:
        assert len(table) == needed and kv.pool.num_free_blocks == num_free_blocks - needed
    else:
        assert kv.pool.num_free_blocks == num_free_blocks and request.block_ids == []


@pytest.mark.parametrize(
    ("block_size", "block_table", "past_length", "query_length"),
    [
        (32, [0, 1, 2], 0, 16),
        (32, [0, 1, 2], 0, 64),
        (32, [0, 1, 2], 16, 16),
        (32, [0, 1, 2], 31, 2),
        (32, [0, 3, 6], 0, 64),
        (32, [2, 5, 8], 60, 10),
        (16, [0, 1, 2, 3], 14, 4),
        (64, [0, 1], 60, 10),
    ],
)
def test_slots_follow_the_block_table(block_size, block_table, past_length, query_length):
    """HF's `test_full_attention_get_indices` (its eight cases): position i of a request lives at
    physical row block_table[i // block_size] * block_size + i % block_size. The query's keys are
    written at the rows of positions [past, past + query) (`slot_mapping`); attention reads the
    rows of [0, past + query) through the step's block table and context length."""

    def reference(start: int, end: int) -> list[int]:
        return [
            block_table[i // block_size] * block_size + i % block_size for i in range(start, end)
        ]

    end = past_length + query_length
    step = prepare_inputs([(list(range(end)), past_length, query_length, block_table)], block_size)
    assert step.slot_mapping.tolist() == reference(past_length, end)
    assert step.positions.tolist() == list(range(past_length, end))
    [length] = step.context_lens.tolist()
    table = step.block_tables[0].tolist()
    read = [table[i // block_size] * block_size + i % block_size for i in range(length)]
    assert read == reference(0, end)


@pytest.mark.parametrize(
    ("cumulative_seqlens_q", "cumulative_seqlens_k", "mask_lines"),
    [
        ([0, 4], [0, 4], ["1000", "1100", "1110", "1111"]),
        ([0, 3], [0, 5], ["11100", "11110", "11111"]),
        ([0, 3, 6], [0, 3, 6], ["100000", "110000", "111000", "000100", "000110", "000111"]),
    ],
)
def test_attention_reads_what_hfs_mask_allows(
    cumulative_seqlens_q, cumulative_seqlens_k, mask_lines
):
    """HF's `test_attention_mask`, its cases without a sliding window: for a flattened batch
    (cumulative query and key lengths), query row i may read key column j iff HF's mask has a 1
    there: its own request's keys, up to its own position. The course builds no flattened mask:
    `attend` reads each request's keys through its blocks. The port scatters the keys over
    blocks of 2 and checks that `attend` equals softmax attention under HF's mask."""
    gen = torch.Generator().manual_seed(0)
    n_heads, d_head, block_size = 2, 4, 2
    num_q, num_k = cumulative_seqlens_q[-1], cumulative_seqlens_k[-1]
    q = torch.randn(num_q, n_heads, d_head, generator=gen)
    k = torch.randn(num_k, n_heads, d_head, generator=gen)
    v = torch.randn(num_k, n_heads, d_head, generator=gen)
    allowed = torch.tensor([[c == "1" for c in line] for line in mask_lines])
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d_head)
    want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, -math.inf).softmax(-1), v)

    keys = torch.zeros(16, block_size, n_heads, d_head)
    values = torch.zeros_like(keys)
    free = iter([9, 2, 14, 5, 11, 0, 7, 3])  # blocks out of order
    for r in range(len(cumulative_seqlens_q) - 1):
        k0, k1 = cumulative_seqlens_k[r], cumulative_seqlens_k[r + 1]
        q0, q1 = cumulative_seqlens_q[r], cumulative_seqlens_q[r + 1]
        table = [next(free) for _ in range(math.ceil((k1 - k0) / block_size))]
        for p in range(k1 - k0):
            keys[table[p // block_size], p % block_size] = k[k0 + p]
            values[table[p // block_size], p % block_size] = v[k0 + p]
        # The request's queries are its last q1 - q0 positions.
        positions = torch.arange(k1 - k0 - (q1 - q0), k1 - k0)
        got = attend(q[None, q0:q1], keys, values, torch.tensor([table]), positions[None])[0]
        torch.testing.assert_close(got, want[q0:q1], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# tests/generation/test_scheduler.py


def make_request(request_id: str, num_tokens: int) -> Request:
    return Request(request_id, list(range(10, 10 + num_tokens)), SamplingParams(max_tokens=10))


def run_step(scheduler: Scheduler, out, token: int = 0) -> None:
    """The engine's side of a step, without a model (as in the vLLM port)."""
    for request, num_new in out.scheduled:
        request.num_computed_tokens += num_new
        if request.num_computed_tokens == request.num_tokens:
            request.output_token_ids.append(token)


def test_a_waiting_request_is_admitted_beside_a_decoding_one():
    """HF's `test_prefill_first_scheduler_waiting_added_before_decoding_when_cache_allows`: 128
    blocks of 16, a decoding request (prompt of 8) and a pending one (prompt of 4), a budget of
    64: both are scheduled in one step. HF's prefill-first scheduler puts the pending one first;
    the course's scheduler is first come, first served (HF's default, FIFOScheduler): the decoding
    one first, then the newcomer's whole prompt."""
    scheduler = Scheduler(KVCacheManager(num_blocks=128, block_size=16), 64, 16)
    decoding, pending = make_request("decoding", 8), make_request("pending", 4)
    scheduler.add_request(decoding)
    run_step(scheduler, scheduler.schedule())
    scheduler.add_request(pending)
    out = scheduler.schedule()
    assert out.scheduled == [(decoding, 1), (pending, 4)]


def test_a_step_that_preempts_admits_no_new_request():
    """HF's `test_prefill_first_scheduler_waiting_blocked_when_block_new_requests_is_true`: with
    `block_new_requests` set (HF's manager sets it when the cache runs short), a waiting request
    is not admitted and only the decoding one is scheduled. The course's counterpart is a rule:
    a step that preempted admits nobody. 2 blocks of 4, 4 tokens a step: A (prompt 1) decodes
    while B (prompt 5) is read in chunks. B's second chunk needs a second block, so B, the
    newest, preempts itself. Its block is free again and B would fit at once (computing the
    same 3 tokens again, every step); it waits a step, as HF's pending request does."""
    scheduler = Scheduler(KVCacheManager(num_blocks=2, block_size=4), 4, 16)
    a, b = make_request("A", 1), make_request("B", 5)
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert out.scheduled == [(a, 1), (b, 3)]
    run_step(scheduler, out)
    out = scheduler.schedule()
    assert out.preempted == [b] and out.scheduled == [(a, 1)]
    assert list(scheduler.waiting) == [b] and b.status == RequestStatus.WAITING
    assert scheduler.kv.pool.num_free_blocks == 1
    run_step(scheduler, out)
    out = scheduler.schedule()  # no preemption in this step: B is admitted again
    assert out.scheduled == [(a, 1), (b, 3)]
