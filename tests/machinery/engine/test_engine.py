"""Chapter 8's engine (solutions/engine.py and the modules under it), checked from outside: HF's
logits and greedy `generate` on each prompt alone, chapter 3's sampler under each request's seed,
exact counts of the prompt positions computed with a prefix cache, and the pool's invariants
after every step over random traces (hypothesis). The chapter that teaches it will grade a
learner's versions; these tests keep the reference honest until then and after."""

import random

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from solutions.block_pool import BlockPool, hash_block_tokens
from solutions.engine import LLMEngine, generate
from solutions.paged_attention import (
    PagedKVCache,
    attend,
    attend_strided,
    attention_groups,
    forward_paged,
    prepare_inputs,
)
from solutions.sampling import TransformerSampler
from solutions.sampling_params import SamplingParams
from tests.support import (
    PROMPTS,
    check_invariants,
    hf_static_greedy,
    invariant_problems,
    uneven_chunks,
)
from tests.support import run_to_end as run_steps
from utils.models import load_hf, load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def shipped():
    return load_model("shakespeare")


@pytest.fixture(scope="module")
def draft():
    return load_model("shakespeare-draft")


def run_to_end(engine: LLMEngine, max_steps: int = 5000) -> dict:
    return run_steps(engine, max_steps, check=check_invariants)


@pytest.mark.parametrize("attention", [None, attend_strided], ids=["attend", "attend_strided"])
def test_paged_logits_are_hfs_through_scattered_blocks(shipped, attention):
    """Both of the runner's attention functions: the chapter's gather (`attend`) and the
    engine's (`attend_strided`). The first step of one token each attends two requests' queries
    in two groups (tables of 3 and 5 blocks)."""
    model, tokenizer = shipped
    hf = load_hf("shakespeare")[0].eval()
    texts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    block_size, num_blocks = 4, 40
    cache = PagedKVCache.allocate(model, num_blocks, block_size)
    order = list(range(num_blocks))
    random.Random(0).shuffle(order)  # block tables out of order, interleaved between requests
    tables = [order[i::3] for i in range(3)]
    # Uneven chunks: each step feeds each request a different number of its tokens.
    chunks = ([5, 1, 7], [3, 0, 9], [1, 1, 1], [1, 1, 1], [100, 0, 100], [0, 100, 0])
    for step in uneven_chunks([len(t) for t in texts], chunks):
        scheduled = [(texts[r], start, n, tables[r]) for r, start, n in step]
        inputs = prepare_inputs(scheduled, block_size)
        every_row = torch.arange(len(inputs.token_ids))
        groups = attention_groups(inputs, block_size)
        attended = torch.cat([g.rows.flatten() for g in groups]).sort().values
        assert torch.equal(attended, every_row), "every row is attended exactly once"
        with torch.inference_mode():
            logits = forward_paged(model, cache, inputs, every_row, attention)
        for i, (r, start, n) in enumerate(step):
            with torch.inference_mode():
                want = hf(torch.tensor([texts[r][: start + n]])).logits[0, start:]
            got = logits[inputs.query_start[i] : inputs.query_start[i + 1]]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_strided_attention_equals_the_gather_exactly():
    """The same blocks, read in the same order by the same attention function: the one copy
    fewer changes no number (the chapter's claim)."""
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 64, 4, 3, 8, generator=g)
    tables = torch.randperm(64, generator=g)[:15].view(3, 5)
    for Q in (1, 6):
        queries = torch.randn(3, Q, 3, 8, generator=g)
        positions = torch.randint(0, 20, (3, Q), generator=g)
        args = (queries, keys, values, tables, positions)
        assert torch.equal(attend(*args), attend_strided(*args))


def test_greedy_tokens_are_hfs_alone_with_chunks_and_preemption(shipped):
    model, tokenizer = shipped
    hf = load_hf("shakespeare")[0].eval()
    # A small pool and budget: prompts are read in chunks and requests are preempted.
    engine = LLMEngine(model, tokenizer, num_blocks=14, block_size=4, max_num_batched_tokens=12,
                       max_num_seqs=4)  # fmt: skip
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    outputs = run_to_end(engine)
    assert engine.stats.preemptions > 0, "the test meant to preempt"
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt)
        want = hf_static_greedy(hf, ids, GREEDY.max_tokens, stop_at_eos=False)[len(ids) :]
        last = outputs[str(i)][-1]
        assert last.finished and last.finish_reason == "length"
        assert last.output_token_ids == want, f"request {i}"
        streamed = [t for output in outputs[str(i)] for t in output.new_token_ids]
        assert streamed == want, "the step outputs' new tokens must add up to the output"


def test_a_temperature_below_1e_5_is_greedy_as_in_vllm(shipped):
    """vLLM's SamplingParams treats a temperature below 1e-5 as greedy; at 1e-40 the logits
    divided by it overflow, and the step's probabilities would be NaN for the whole batch."""
    model, tokenizer = shipped
    for tiny in (1e-40, 5e-324, 9.9e-6):
        assert SamplingParams(temperature=tiny).temperature == 0.0
    assert SamplingParams(temperature=1e-5).temperature == 1e-5
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4)
    engine.add_request("tiny", PROMPTS[0], SamplingParams(temperature=1e-40, max_tokens=8))
    engine.add_request("greedy", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8))
    outputs = run_to_end(engine)
    assert outputs["tiny"][-1].output_token_ids == outputs["greedy"][-1].output_token_ids


def test_a_seeded_request_is_the_same_alone_in_a_crowd_and_in_chapter_3(shipped):
    model, tokenizer = shipped
    sampler = TransformerSampler(model, tokenizer)
    kinds = [dict(temperature=0.9), dict(temperature=1.1, top_k=30), dict(top_p=0.8),
             dict(temperature=0.7, frequency_penalty=0.6)]  # fmt: skip
    prompt = PROMPTS[2]
    crowd = LLMEngine(model, tokenizer, num_blocks=60, block_size=4, max_num_batched_tokens=20)
    rng = random.Random(1)
    for i in range(12):  # others with their own seeds and rules, arriving at once
        params = SamplingParams(max_tokens=rng.randint(5, 30), seed=100 + i, **kinds[i % 4])
        crowd.add_request(f"other{i}", PROMPTS[i % len(PROMPTS)], params)
    for k, kind in enumerate(kinds):
        params = SamplingParams(max_tokens=20, seed=k, ignore_eos=True, **kind)
        crowd.add_request(f"me{k}", prompt, params)
        alone = LLMEngine(model, tokenizer)
        mine = generate(alone, [prompt], params)[0].output_token_ids
        ids = tokenizer.encode(prompt)
        chapter_3 = sampler.sample(ids, 20, seed=k, stop_at_eos=False, **kind).tolist()[len(ids) :]
        assert mine == chapter_3, kind
    outputs = run_to_end(crowd)
    for k, kind in enumerate(kinds):
        alone = LLMEngine(model, tokenizer)
        params = SamplingParams(max_tokens=20, seed=k, ignore_eos=True, **kind)
        assert outputs[f"me{k}"][-1].output_token_ids == (
            generate(alone, [prompt], params)[0].output_token_ids
        ), kind


def test_prefix_cache_computes_exactly_the_positions_not_cached(shipped):
    model, tokenizer = shipped
    block_size = 4
    shared = tokenizer.encode(PROMPTS[4])[:18]  # 4 full blocks and 2 tokens
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=block_size)
    first = shared + [10, 11, 12]
    generate(engine, [first], GREEDY)
    computed = engine.stats.tokens_computed
    # Shares 4 full blocks (16 tokens) with the first prompt's; its own tokens are new.
    second = shared + [20, 21, 22, 23, 24]
    out = generate(engine, [second], GREEDY)[0]
    assert engine.stats.prompt_tokens_cached == 16
    # The prompt's 23 tokens less the 16 cached, then one token per later step.
    assert engine.stats.tokens_computed - computed == (len(second) - 16) + GREEDY.max_tokens - 1
    hf = load_hf("shakespeare")[0].eval()
    assert out.output_token_ids == hf_static_greedy(hf, second, 24, False)[len(second) :]
    # A prompt that is whole blocks of a cached one: its last token is computed anyway.
    engine.stats.prompt_tokens_cached = 0
    generate(engine, [shared[:16]], GREEDY)
    assert engine.stats.prompt_tokens_cached == 12


def test_a_request_that_shares_a_prompt_being_read_in_chunks_gets_hfs_tokens(shipped):
    model, tokenizer = shipped
    hf = load_hf("shakespeare")[0].eval()
    prompt = tokenizer.encode(PROMPTS[4])  # read 6 tokens a step: several steps of prefill
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4, max_num_batched_tokens=6)
    engine.add_request("first", prompt, GREEDY)
    engine.step()
    engine.step()  # 12 of its tokens computed
    engine.add_request("second", prompt + [30, 31], GREEDY)
    outputs = run_to_end(engine)
    for request_id, ids in [("first", prompt), ("second", prompt + [30, 31])]:
        want = hf_static_greedy(hf, ids, GREEDY.max_tokens, stop_at_eos=False)[len(ids) :]
        assert outputs[request_id][-1].output_token_ids == want, request_id


def test_requests_admitted_in_one_step_share_the_prefix_the_first_one_writes(shipped):
    model, tokenizer = shipped
    shared = tokenizer.encode(PROMPTS[4])[:16]  # 4 full blocks of 4
    prompts = [shared + [40 + i] * (i + 1) for i in range(4)]
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=4, max_num_batched_tokens=64)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    engine.step()  # all four admitted at once: the later three find the first one's blocks
    assert engine.stats.prompt_tokens_cached == 3 * 16
    assert engine.stats.tokens_computed == sum(map(len, prompts)) - 3 * 16
    outputs = run_to_end(engine)
    hf = load_hf("shakespeare")[0].eval()
    for i, prompt in enumerate(prompts):
        want = hf_static_greedy(hf, prompt, GREEDY.max_tokens, False)[len(prompt) :]
        assert outputs[str(i)][-1].output_token_ids == want, i


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_greedy_tokens_are_the_cpus_and_seeds_repeat(shipped):
    model, tokenizer = shipped
    gpu_model = load_model("shakespeare")[0].to("cuda")
    cpu = generate(LLMEngine(model, tokenizer, block_size=4), PROMPTS, GREEDY)
    gpu = generate(LLMEngine(gpu_model, tokenizer, block_size=4), PROMPTS, GREEDY)
    assert [o.output_token_ids for o in gpu] == [o.output_token_ids for o in cpu]
    # Seeded draws on a GPU come from the GPU's generator: not the CPU's numbers, but the same
    # numbers every time, whatever else runs.
    seeded = [SamplingParams(max_tokens=20, seed=i, top_k=40) for i in range(len(PROMPTS))]
    alone = [generate(LLMEngine(gpu_model, tokenizer), [PROMPTS[i]], [p])[0]
             for i, p in enumerate(seeded)]  # fmt: skip
    together = generate(LLMEngine(gpu_model, tokenizer, block_size=4), PROMPTS, seeded)
    assert [o.output_token_ids for o in together] == [o.output_token_ids for o in alone]


def test_freed_blocks_keep_their_names_and_are_evicted_least_recent_first():
    pool = BlockPool(num_blocks=4)
    a, b = pool.get_new_blocks(2)
    h1 = hash_block_tokens(None, (1, 2))
    h2 = hash_block_tokens(h1, (3, 4))
    pool.cache_full_block(a, h1)
    pool.cache_full_block(b, h2)
    pool.free_blocks([b, a])  # tail first
    assert pool.get_cached_block(h1) is a and pool.num_free_blocks == 4
    # The never-used blocks go first, then b (freed before a): a's name survives longest.
    got = pool.get_new_blocks(3)
    assert [x.block_id for x in got] == [2, 3, b.block_id]
    assert pool.get_cached_block(h2) is None and pool.get_cached_block(h1) is a
    assert hash_block_tokens(None, (3, 4)) != h2, "a block's name includes its parent's"
    with pytest.raises(ValueError, match="freed more times"):
        pool.free_blocks([a])


def test_the_scheduler_alone_advances_stops_and_finishes_a_request(shipped):
    """One owner of a request's progress (nano-vllm's `postprocess`): each step's plan names who
    was admitted; the engine's stats and its record of the step read that plan; the scheduler's
    `update` advances the computed tokens, appends the token and finishes, status included."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=32, block_size=4, max_num_batched_tokens=8)
    prompt = tokenizer.encode(PROMPTS[0])  # longer than the budget: read in chunks of 8
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("a", prompt, params)
    plans, schedule = [], engine.scheduler.schedule
    engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    request, steps = engine.requests["a"], []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        steps.append((request.num_computed_tokens, dict(engine.stats.last_step), outputs))
    assert [p.admitted for p in plans] == [[request]] + [[]] * (len(plans) - 1)
    chunks = [min(8, len(prompt) - 8 * i) for i in range(-(-len(prompt) // 8))]
    want = [("prefill", n) for n in chunks] + [("decode", 1)] * 2
    assert [last["a"] for _, last, _ in steps] == want
    read = [sum(chunks[: i + 1]) for i in range(len(chunks))]
    assert [computed for computed, _, _ in steps] == read + [len(prompt) + 1, len(prompt) + 2]
    assert [len(o[0].new_token_ids) for _, _, o in steps] == [0] * (len(chunks) - 1) + [1, 1, 1]
    assert request.is_finished and request.finish_reason == "length"
    assert request.block_ids == [] and engine.scheduler.running == []
    assert engine.stats.prompt_tokens_computed == len(prompt) and engine.stats.steps == len(steps)


def test_abort_frees_at_once_and_the_others_go_on(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=30, block_size=4)
    for i in range(3):
        engine.add_request(str(i), PROMPTS[i], GREEDY)
    engine.step()
    held = len(engine.kv.pool.free_queue)
    engine.abort_request("1")
    assert len(engine.kv.pool.free_queue) > held  # before any further step
    outputs = run_to_end(engine)
    assert outputs["1"][-1].finish_reason == "abort" and outputs["1"][-1].finished
    assert [outputs[r][-1].finish_reason for r in "02"] == ["length", "length"]


def test_requests_it_cannot_serve_fail_alone_with_a_reason(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=8, block_size=4)
    engine.add_request("long", [5] * 250, SamplingParams(max_tokens=10))
    engine.add_request("pool", [5] * 30, SamplingParams(max_tokens=10))
    engine.add_request("empty", [], SamplingParams())
    engine.add_request("vocab", [5, 99999], SamplingParams())
    engine.add_request("fine", PROMPTS[1], GREEDY)
    outputs = run_to_end(engine)
    assert "n_ctx=256" in outputs["long"][-1].error
    assert "num_blocks=8" in outputs["pool"][-1].error
    assert "empty" in outputs["empty"][-1].error and "d_vocab" in outputs["vocab"][-1].error
    assert all(outputs[r][-1].finish_reason == "error" for r in ["long", "pool", "empty"])
    assert outputs["fine"][-1].finish_reason == "length"
    engine.add_request("fine", PROMPTS[1], GREEDY)  # a finished request's id may be reused
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("fine", PROMPTS[1], GREEDY)  # not an unfinished one's


def test_a_server_engine_forgets_each_request_once_its_end_is_reported(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=30, block_size=4, keep_finished=False)
    for i in range(3):
        engine.add_request(str(i), PROMPTS[i], GREEDY)
    engine.step()
    engine.add_request("bad", [], GREEDY)  # its error is reported by the next step
    engine.abort_request("1")
    outputs = run_to_end(engine)
    assert {r: o[-1].finish_reason for r, o in outputs.items()} == {
        "0": "length", "1": "abort", "2": "length", "bad": "error"}  # fmt: skip
    assert engine.requests == {} and not invariant_problems(engine)
    engine.abort_request("1")  # an abort that comes late (a client gone) changes nothing
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("argument", "value"),
    [("num_blocks", 0), ("block_size", -1), ("max_num_batched_tokens", 0),
     ("max_num_seqs", 1.5), ("enable_prefix_caching", "yes"), ("keep_finished", 0)],
)  # fmt: skip
def test_a_bad_configuration_is_refused_by_name(shipped, argument, value):
    model, tokenizer = shipped
    with pytest.raises(ValueError, match=argument):
        LLMEngine(model, tokenizer, **{argument: value})


@pytest.mark.parametrize(
    ("argument", "value"),
    [("temperature", -0.5), ("top_p", 1.5), ("top_k", -2), ("max_tokens", 0), ("seed", -1),
     ("ignore_eos", "no"), ("frequency_penalty", float("nan"))],
)  # fmt: skip
def test_bad_sampling_params_are_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=argument):
        SamplingParams(**{argument: value})


trace = st.lists(
    st.tuples(
        st.integers(0, 2),  # steps before it arrives
        st.integers(1, 24),  # prompt tokens
        st.integers(1, 16),  # max_tokens
        st.booleans(),  # shares the common prefix
        st.sampled_from([None, None, None, 2, 6]),  # aborted this many steps after arriving
    ),
    min_size=4,
    max_size=12,
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    trace=trace,
    num_blocks=st.integers(8, 14),
    block_size=st.sampled_from([2, 4, 4, 8]),
    budget=st.integers(4, 40),
    seats=st.integers(1, 6),
    caching=st.booleans(),
)
def test_invariants_hold_after_every_step_of_random_traces(
    draft, trace, num_blocks, block_size, budget, seats, caching
):
    model, tokenizer = draft
    engine = LLMEngine(model, tokenizer, num_blocks=num_blocks, block_size=block_size,
                       max_num_batched_tokens=budget, max_num_seqs=seats,
                       enable_prefix_caching=caching)  # fmt: skip
    prefix = list(range(100, 116))
    arrivals, aborts, finished = [], {}, {}
    step = 0
    for i, (wait, length, max_tokens, shares, abort_after) in enumerate(trace):
        step += wait
        prompt = (prefix + list(range(length)))[:length] if shares else [7 + i] * length
        arrivals.append((step, str(i), prompt, max_tokens))
        if abort_after is not None:
            aborts[step + abort_after] = str(i)
    params = {}
    for now in range(2000):
        for when, request_id, prompt, max_tokens in arrivals:
            if when == now:
                params[request_id] = SamplingParams(max_tokens=max_tokens, seed=now)
                engine.add_request(request_id, prompt, params[request_id])
        if now in aborts:
            engine.abort_request(aborts[now])
        for output in engine.step():
            if output.finished:
                assert output.request_id not in finished, "a request finished twice"
                finished[output.request_id] = output
            assert len(output.output_token_ids) <= params[output.request_id].max_tokens
        check_invariants(engine)
        if now > max(w for w, *_ in arrivals) and not engine.has_unfinished_requests():
            break
    reasons = {output.finish_reason for output in finished.values()}
    event(f"finished by {sorted(reasons)}")  # hypothesis's statistics: what the traces did
    event(f"preempted: {engine.stats.preemptions > 0}")
    event(f"prefix cache hits: {engine.stats.prompt_tokens_cached > 0}")
    assert set(finished) == {request_id for _, request_id, _, _ in arrivals}, "unfinished"
    for request_id, output in finished.items():
        if output.finish_reason == "length":
            assert len(output.output_token_ids) == params[request_id].max_tokens
    assert engine.kv.pool.num_free_blocks == num_blocks, "blocks leaked"


def test_the_report_is_what_the_scheduler_and_the_pool_hold_after_every_change(
    shipped, monkeypatch
):
    """`engine.stats`, what a benchmark or a server reads instead of the engine's insides: after
    an add, an abort and every step it says what the scheduler and the pool hold; it counts the
    blocks handed out again after being freed (counted here by a spy on the pool) and the prefix
    cache's queries, which bound its hits. A pool of 12 blocks of 4 for five requests preempts."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=12, block_size=4, max_num_batched_tokens=12,
                       max_num_seqs=4)  # fmt: skip
    scheduler, pool = engine.scheduler, engine.kv.pool
    handed, reused = set(), [0]
    get_new_blocks = pool.get_new_blocks

    def spy(n):
        blocks = get_new_blocks(n)
        reused[0] += sum(b.block_id in handed for b in blocks)
        handed.update(b.block_id for b in blocks)
        return blocks

    monkeypatch.setattr(pool, "get_new_blocks", spy)

    def agrees(engine: LLMEngine) -> None:
        s = engine.stats
        assert (s.running, s.waiting) == (len(scheduler.running), len(scheduler.waiting))
        assert s.blocks_free == pool.num_free_blocks
        assert s.blocks_in_use == sum(b.ref_cnt > 0 for b in pool.blocks) == 12 - s.blocks_free
        assert s.running_table_blocks == sum(len(r.block_ids) for r in scheduler.running)
        assert s.running_computed_tokens == sum(r.num_computed_tokens for r in scheduler.running)
        assert s.blocks_reused == reused[0]

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
        agrees(engine)
    engine.add_request("gone", PROMPTS[0], params)
    engine.abort_request("gone")
    agrees(engine)
    run_steps(engine, 5000, check=agrees)
    stats = engine.stats
    assert stats.preemptions > 0 and stats.blocks_reused > 0, "the test meant to reuse blocks"
    assert stats.running == stats.waiting == stats.blocks_in_use == 0
    assert stats.blocks_free == 12
    assert 0 < stats.prompt_tokens_cached <= stats.prompt_tokens_queried
