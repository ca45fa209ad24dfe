"""Chapter 8's engine on chapter 7's Llama model (solutions/llama_paged.py), checked from outside:
HF's LlamaForCausalLM on the same weights (its logits, its cached keys, its greedy `generate` on
each prompt alone), the pool's invariants after every step, and the pool's bytes counted on the
cache's own tensors."""

import copy
import random

import pytest
import torch

from solutions.architectures import model_runner
from solutions.engine import LLMEngine, generate
from solutions.llama_paged import LlamaModelRunner
from solutions.model_runner import GPT2ModelRunner
from solutions.paged_attention import PagedKVCache, attention_groups, prepare_inputs
from solutions.sampling_params import SamplingParams
from tests.support import (
    PROMPTS,
    check_invariants,
    greedy_difference,
    run_to_end,
    uneven_chunks,
)
from utils.models import load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_the_engine_picks_the_runner_of_the_models_architecture(llama):
    model, tokenizer, _ = llama
    assert isinstance(LLMEngine(model, tokenizer).runner, LlamaModelRunner)
    assert isinstance(LLMEngine(load_model("shakespeare")[0], tokenizer).runner, GPT2ModelRunner)
    with pytest.raises(ValueError, match="model must be one of"):
        model_runner(torch.nn.Linear(2, 2))


def test_paged_logits_and_rotated_keys_are_hfs_through_scattered_blocks(llama):
    """Three prompts fed in uneven chunks through shuffled, interleaved block tables: each
    chunk's logits are HF's, and each block holds HF's cached keys, which are the rotated ones
    (each turned by its position in its own request) for the 2 key/value heads."""
    model, tokenizer, hf = llama
    texts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    block_size, num_blocks = 4, 40
    cache = PagedKVCache.allocate(model, num_blocks, block_size)
    order = list(range(num_blocks))
    random.Random(0).shuffle(order)
    tables = [order[i::3] for i in range(3)]
    chunks = ([5, 1, 7], [3, 0, 9], [1, 1, 1], [1, 1, 1], [100, 0, 100], [0, 100, 0])
    runner = model_runner(model)
    for step in uneven_chunks([len(t) for t in texts], chunks):
        inputs = prepare_inputs([(texts[r], s, n, tables[r]) for r, s, n in step], block_size)
        every_row = torch.arange(len(inputs.token_ids))
        groups = attention_groups(inputs, block_size)
        assert sorted(torch.cat([g.rows.flatten() for g in groups]).tolist()) == every_row.tolist()
        with torch.inference_mode():
            logits = runner.forward(cache, inputs, every_row)
        for i, (r, start, n) in enumerate(step):
            with torch.inference_mode():
                want = hf(torch.tensor([texts[r][: start + n]])).logits[0, start:]
            got = logits[inputs.query_start[i] : inputs.query_start[i + 1]]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for r, text in enumerate(texts):
        with torch.inference_mode():
            hf_keys = hf(torch.tensor([text]), use_cache=True).past_key_values.layers[0].keys
        slots = [tables[r][p // block_size] * block_size + p % block_size for p in range(len(text))]
        stored = cache.keys[0].flatten(0, 1)[slots]  # [positions, n_kv_heads, d_head]
        torch.testing.assert_close(stored, hf_keys[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_greedy_tokens_are_hfs_per_request_with_chunks_a_shared_prefix_and_preemption(llama):
    """Requests of different lengths (one token to several chunks), two of them sharing a prefix
    of whole blocks, in a pool and a budget small enough that prompts are read in chunks and
    requests are preempted; the invariants after every step; each request's greedy tokens
    against HF's `generate` on its prompt alone."""
    model, tokenizer, hf = llama
    shared = tokenizer.encode(PROMPTS[4])[:16]  # 4 full blocks of 4
    prompts = [tokenizer.encode(p) for p in PROMPTS] + [shared + [40, 41], shared + [50]]
    engine = LLMEngine(model, tokenizer, num_blocks=16, block_size=4, max_num_batched_tokens=12,
                       max_num_seqs=4)  # fmt: skip
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, GREEDY)
    outputs = run_to_end(engine, check=check_invariants)
    assert engine.stats.preemptions > 0, "the test meant to preempt"
    assert engine.stats.prompt_tokens_cached > 0, "the test meant to hit the prefix cache"
    assert max(map(len, prompts)) > 12, "the test meant to read a prompt in chunks"
    assert engine.kv.pool.num_free_blocks == 16, "blocks leaked"
    for i, ids in enumerate(prompts):
        last = outputs[str(i)][-1]
        assert last.finished and last.finish_reason == "length"
        _, problem = greedy_difference(hf, ids, last.output_token_ids, GREEDY.max_tokens)
        assert problem is None, f"request {i}: {problem}"


def test_a_block_holds_n_kv_heads_and_the_same_bytes_hold_n_heads_over_n_kv_heads_the_tokens(
    llama,
):
    model, tokenizer, _ = llama
    gpt2 = load_model("shakespeare")[0]
    block_size, num_blocks = 16, 10
    for m in (gpt2, model):
        cache = LLMEngine(m, tokenizer, num_blocks=num_blocks, block_size=block_size).cache
        cfg = m.cfg
        assert cache.keys[0].shape == (num_blocks, block_size, cfg.n_kv_heads, cfg.d_head)
        measured = sum(t.nbytes for t in (*cache.keys, *cache.values))
        assert measured == num_blocks * PagedKVCache.bytes_per_block(m, block_size)
    # 2 (keys, values) x 4 layers x 16 positions x heads x 32 numbers x 4 bytes
    assert PagedKVCache.bytes_per_block(gpt2, block_size) == 2 * 4 * 16 * 6 * 32 * 4
    assert PagedKVCache.bytes_per_block(model, block_size) == 2 * 4 * 16 * 2 * 32 * 4
    kv_bytes = 100 * PagedKVCache.bytes_per_block(gpt2, block_size)
    assert PagedKVCache.blocks_for_bytes(gpt2, kv_bytes, block_size) == 100
    assert PagedKVCache.blocks_for_bytes(model, kv_bytes, block_size) == 300


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_llama_models_greedy_tokens_are_the_cpus(llama):
    model, tokenizer, _ = llama
    gpu_model = copy.deepcopy(model).to("cuda").eval()
    cpu = generate(LLMEngine(model, tokenizer, block_size=4), PROMPTS, GREEDY)
    gpu = generate(LLMEngine(gpu_model, tokenizer, block_size=4), PROMPTS, GREEDY)
    assert [o.output_token_ids for o in gpu] == [o.output_token_ids for o in cpu]
