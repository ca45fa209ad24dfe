"""Many requests at once: chapter 8's engine against chapter 4's static batching, on a trace.

    python benchmarks/serving.py [--model shakespeare] [--requests 64] [--rate 40] [--batch 8]
                                 [--seats 32] [--threads 1] [--seed 0] [--runs 3] [--quick]
                                 [--hf] [--default-allocator] [--no-prefill-rate]
                                 [--qkv-made-once]

`--model`: the model served (a shipped model's name or a folder; the GPT-2 model by default).

A seeded trace (`poisson_trace`; it and both servers live in utils/serving.py): `--requests`
requests arriving as a Poisson process of `--rate` requests per second, prompts of 4-60 tokens
cut from the plays, answers of 16-160 tokens (greedy, no stop at end-of-text: every method writes
the same tokens, checked). Two ways to serve it, each run against the wall clock (a request
exists only from its arrival time):

- `static`: chapter 4's batching. Requests are taken in arrival order, `--batch` at a time; a
  batch starts when its last request has arrived and the batch before it has finished, is padded
  to its longest prompt and runs until its longest answer is written (finished rows keep
  computing padding). A request's first token comes after its batch's prefill; its answer is
  complete when its own last token is written.
- `engine`: chapter 8's `LLMEngine` (`--seats` requests at most, a budget of 512 tokens a step,
  blocks of 16, enough blocks for the whole trace), stepped whenever a request waits or runs.

Both are served `--runs` times, alternating, and the run whose throughput ratio is the median
is reported (every run's ratio is listed). Per method: throughput (answer tokens / the time from
the first arrival to the last token), time to first token (TTFT) and time per output token after
the first (TPOT), medians and 99th percentiles; and the KV memory each reserves against what it
uses, at its fullest step. Then the
prefix trace: every prompt a shared 128-token prefix and 4-30 tokens of its own, all arriving at
once, served by the engine with and without prefix caching: the prompt positions computed
against the positions not already cached, and TTFT. With `--hf`, HF transformers' continuous
batching serves the main trace too (its setup, the first request's, left out), then again under
cProfile in its own thread: the seconds of its steps, of its model's forward pass (attention and
the matrix products within it) and of the rest of a step.

Then `prefill_rate` (unless `--no-prefill-rate`): how near the engine's step comes to what the
machine does with a full forward pass. The probe workload: 64 greedy requests all present at
the start (prompt ids drawn uniformly from [50, 4000), 4-60 of them; answers of 16-160 tokens),
`max_num_seqs=64`, 512 tokens a step, 1,024 blocks of 16. The engine's answer tokens per second
on it against the same process's positions per second of chapter 1's forward over a batch of
8 x 256 positions, timed just before and just after each engine run (`--runs` runs, at least 3;
the median of the ratios within runs). Then one more engine run on the probe under cProfile:
where its steps' time goes (the gather of blocks, the attention function, the projections, the
MLP, the layer norms, the unembedding, the rest of the forward, and the engine outside it).

With a Llama-architecture `--model` (chapter 7's), one more section, `beside_gpt2`: the engine on
it and on the GPT-2 model, alternately (`--runs` times each), on the main trace's requests ALL
PRESENT AT THE START with the SAME bytes of KV cache, at two sizes: the bytes of the GPT-2 pool
that holds the whole trace, and a quarter of them (a pool too small for the GPT-2 model's 32
seats). All at once, the seats fill in the first steps on any machine, and who runs and who is
preempted does not depend on the clock: the same in every run and on every machine. (Served as
they arrive, a fast machine finishes requests almost as they come and never fills the seats: in
four runs on the idle 2-core machine, the GPT-2 engine ran at most 22 requests at once, in at
most 125 of the quarter's 133 blocks, and was never preempted; with each step slowed to twice
its time, 53 times.) Each model's pool gets the blocks those bytes hold
(`PagedKVCache.blocks_for_bytes`); its bytes per token are measured on the allocated cache. Per
budget and model: the preemptions, the most blocks in use after a step, the tokens the model
computed and those it found in the prefix cache, against the trace's tokens computed once each
(a preempted request's tokens are computed again or found again). Their tokens/s (the median of
the ratios within runs) and the pool's capacity in tokens are the two goals it adds.
Prints one JSON object with chapter 8's goals.

`--qkv-made-once` measures only this: the GPT-2 runner as it is (each layer's fused QKV matrix
made once, when the engine starts) against the same runner making it in every layer of every
step, alternately in one process (`--runs` runs, at least 3): the engine's tokens/s over static
batching's on the main trace, and its prefill rate on the probe.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import statistics
import time

import torch

from solutions.architectures import architecture_of
from solutions.checks import positions_read
from solutions.paged_attention import PagedKVCache, attend_strided, forward_paged
from utils.models import load_hf, load_model
from utils.records import add_record_options, emit, goal, machine, median_run, verdict
from utils.serving import (
    Served,
    all_at_once_trace,
    poisson_trace,
    serve_engine,
    serve_static,
    shared_prefix_trace,
)
from utils.timing import sig

PREFIX = 128  # the shared prefix of the prefix trace, in tokens
BLOCK_SIZE = 16  # serve_engine's default


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory. By default it hands a freed block of more than a few
    hundred KB back to the system, and the next allocation of it faults it back in page by
    page. The engine's step makes several such blocks (each layer's gathered keys and values,
    megabytes), and on this machine that cost a million page faults a run and halved the
    engine's throughput, varying with the allocator's state from run to run. The same setting
    holds for every method timed. Returns what was set."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "default (no glibc here)"
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
    ok = libc.mallopt(M_MMAP_THRESHOLD, 256 << 20) and libc.mallopt(M_TRIM_THRESHOLD, 512 << 20)
    return "glibc: mmap threshold 256 MiB, trim threshold 512 MiB" if ok else "default"


def serve_hf(tokenizer, requests, profiled: bool = False, model: str = "shakespeare") -> dict:
    """HF transformers' own continuous batching (`init_continuous_batching`: a paged cache and a
    scheduler in a background thread) on the same trace, greedy, each request's own length.
    `profiled`: a second pass, under cProfile (which slows it): where its steps' time goes."""
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    profile, timing, restore = step_profiler() if profiled else (None, None, lambda: None)
    hf = load_hf(model)[0].eval()
    longest = max(r.max_tokens for r in requests)
    config = GenerationConfig(do_sample=False, max_new_tokens=longest, eos_token_id=None,
                              pad_token_id=tokenizer.eos_token_id)  # fmt: skip
    manager = hf.init_continuous_batching(generation_config=config)
    manager.start()
    try:
        setup = time.perf_counter()
        manager.add_request(requests[0].prompt, request_id="warm-up", max_new_tokens=2)
        while (result := manager.get_result(timeout=1)) is None or not result.is_finished():
            pass  # its first request sets the manager up: left out of the timing
        setup = time.perf_counter() - setup
        if timing is not None:
            timing.set()  # profile the steps from here on
        start = time.perf_counter()
        pending, done = list(requests), {}
        while len(done) < len(requests):
            now = time.perf_counter() - start
            while pending and pending[0].arrival <= now:
                r = pending.pop(0)
                manager.add_request(r.prompt, request_id=r.request_id, max_new_tokens=r.max_tokens,
                                    record_timestamps=True)  # fmt: skip
            result = manager.get_result(timeout=0.001)
            if result is not None and result.is_finished():
                done[result.request_id] = result
    finally:
        manager.stop(block=True)
        restore()
    errors = [r.error for r in done.values() if r.error]
    if errors:
        raise RuntimeError(f"HF's continuous batching failed a request: {errors[0]}")
    served = Served(
        first={k: r.timestamps[0] - start for k, r in done.items()},
        last={k: r.timestamps[-1] - start for k, r in done.items()},
        tokens={k: r.generated_tokens for k, r in done.items()},
    )
    result = served.summary(requests)
    result["setup_seconds"] = round(setup, 1)
    if profiled:
        result["where_step_time_goes"] = where_time_goes(profile)
    return result, served.tokens


def step_profiler():
    """cProfile on HF's generation steps, in the thread that runs them (a profiler sees only
    its own thread), from when the returned event is set. HF internals: None where they moved."""
    import cProfile
    import threading

    from transformers.generation.continuous_batching import continuous_api

    manager = continuous_api.ContinuousBatchingManager
    profile, timing = cProfile.Profile(), threading.Event()
    step = getattr(manager, "_generation_step", None)
    if step is None:
        return None, timing, lambda: None

    def profiled_step(self, *args, **kwargs):
        if not timing.is_set():
            return step(self, *args, **kwargs)
        profile.enable()
        try:
            return step(self, *args, **kwargs)
        finally:
            profile.disable()

    manager._generation_step = profiled_step
    return profile, timing, lambda: setattr(manager, "_generation_step", step)


def where_time_goes(profile) -> dict | None:
    """Seconds of HF's timed steps, and of what inside them: the model's forward, within it
    attention (SDPA) and the matrix products, and the rest of a step (scheduling the batch,
    preparing its inputs, sampling, bookkeeping)."""
    import pstats

    if profile is None:
        return None
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, ..., tottime, cumtime)

    def cumulative(match) -> float:
        return max((v[3] for k, v in stats.items() if match(*k)), default=0.0)

    def total(match) -> float:
        return sum(v[2] for k, v in stats.items() if match(*k))

    steps = cumulative(lambda f, _, name: name == "_generation_step")
    model = cumulative(lambda f, _, name: f.endswith(("modeling_gpt2.py", "modeling_llama.py"))
                       and name == "forward")  # fmt: skip
    attention = total(lambda f, _, name: "scaled_dot_product_attention" in name)
    matmuls = total(lambda f, _, name: any(op in name for op in ("addmm", "_nn.linear")))
    parts = {"steps": steps, "model_forward": model, "attention": attention,
             "matrix_products": matmuls, "rest_of_step": steps - model}  # fmt: skip
    return {k: sig(v, 3) for k, v in parts.items()}


def prefill_positions_per_s(model, batch: int = 8, length: int = 256, seed: int = 0) -> float:
    """Positions per second of chapter 1's forward over a full [batch, length] batch of token
    ids (every position computed at once: what the machine does at its best)."""
    ids = torch.randint(0, model.cfg.d_vocab, (batch, length),
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    with torch.inference_mode():
        start = time.perf_counter()
        model(ids)
        return ids.numel() / (time.perf_counter() - start)


MODULE_FILES = ("mlp.py", "layernorm.py", "unembed.py")  # GPT-2's MLP, norms and unembedding

PROBE = {"num_blocks": 1024, "max_num_batched_tokens": 512, "max_num_seqs": 64}


def prefill_rate(model, tokenizer, runs: int, seed: int, quick: bool = False) -> dict:
    """The engine on the probe workload against the same process's full forward, interleaved
    (a forward, the engine, a forward: a ratio within one run is fair on a shared machine), and
    one more engine run profiled: where its steps' time goes."""
    n, longest = (8, 32) if quick else (64, 160)
    probe = all_at_once_trace(n, seed, answer_lens=(16, longest))
    serve_engine(model, tokenizer, probe[:4], **PROBE)  # warm-up
    prefill_positions_per_s(model)
    rows = []
    for _ in range(runs):
        before = prefill_positions_per_s(model)
        served, engine_run = serve_engine(model, tokenizer, probe, **PROBE)
        after = prefill_positions_per_s(model)
        engine, prefill = served.summary(probe)["tokens_per_s"], (before + after) / 2
        rows.append({"engine_tokens_per_s": engine, "prefill_positions_per_s": round(prefill, 1),
                     "ratio": engine / prefill})  # fmt: skip
    ratio = statistics.median(r["ratio"] for r in rows)
    for r in rows:
        r["ratio"] = round(r["ratio"], 3)
    return {
        "workload": {
            "requests": n,
            "prompt_tokens": "4-60, ids in [50, 4000)",
            "answer_tokens": sum(r.max_tokens for r in probe),
            **PROBE,
            "block_size": BLOCK_SIZE,
        },  # fmt: skip
        "prefill_batch": [8, 256],
        # No request arrives after the start: as the short answers end, the steps shrink (the
        # longest answers finish alone). A step's tokens, on average:
        "engine_steps": engine_run.stats.steps,
        "tokens_per_step": round(engine_run.stats.tokens_computed / engine_run.stats.steps, 1),
        "runs": rows,
        "median_ratio": round(ratio, 3),
        "where_step_time_goes": engine_profile(model, tokenizer, probe),
    }


def engine_profile(model, tokenizer, probe) -> dict:
    """One engine run on the probe under cProfile (which slows it; the shares are what count):
    seconds of its steps, of the model's forward within them, and within that of the gather of
    blocks (`index_select`), the attention function, the projections, the MLP, the layer norms,
    the unembedding and the rest (embeddings, the cache writes, grouping the requests); and the
    engine outside the forward (scheduling, preparing the inputs, sampling, bookkeeping)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()  # the whole run; the steps' share is read from their calls
    profile.runcall(serve_engine, model, tokenizer, probe, **PROBE)
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, ..., tottime, cumtime)

    def cumulative(file: str, name: str) -> float:
        return max((v[3] for k, v in stats.items() if k[0].endswith(file) and k[2] == name),
                   default=0.0)  # fmt: skip

    def total(name: str) -> float:
        return sum(v[2] for k, v in stats.items() if name in k[2])

    llama = architecture_of(model).hf_model_type == "llama"
    forward = cumulative("", "forward_paged_llama" if llama else "forward_paged")
    steps = cumulative("engine.py", "step")
    mlp, norm, unembed = ("swiglu.py", "rmsnorm.py", "train.py") if llama else MODULE_FILES
    parts = {
        "gather_blocks": total("index_select"),  # gather_blocks' one copy
        "attention": total("scaled_dot_product_attention"),
        # the fused addmm (GPT-2); chapter 7's four einsums a layer (Llama: q, k, v and W_O)
        "qkv_and_out_projections": total("addmm") + total("einsum"),
        "mlp": cumulative(mlp, "forward"),
        "layer_norms": cumulative(norm, "forward"),
        "unembed": cumulative(unembed, "forward"),
    }
    if llama:  # what chapter 7's block adds: the key/value heads repeated, the rotations
        parts["expand_kv"] = total("repeat_interleave")
        parts["rope"] = cumulative("rope.py", "apply_rope") + cumulative("rope.py", "rope_cos_sin")
    parts = {"steps": steps, "model_forward": forward, **parts,
             "rest_of_forward": forward - sum(parts.values()),
             "engine_outside_forward": steps - forward}  # fmt: skip
    return {k: sig(v, 3) for k, v in parts.items()}


def pool(engine) -> dict:
    """The engine's pool as allocated: its blocks, the tokens they hold and their bytes, counted on
    the cache's own tensors."""
    cache = engine.cache
    kv_bytes = sum(t.nbytes for t in (*cache.keys, *cache.values))
    tokens = cache.keys[0].shape[0] * cache.block_size
    return {"num_blocks": cache.keys[0].shape[0], "tokens": tokens, "bytes": kv_bytes,
            "bytes_per_token": kv_bytes // tokens}  # fmt: skip


def beside_gpt2(model, tokenizer, requests, runs: int, seats: int) -> dict:
    """The engine on `model` and on the GPT-2 model, alternately, on the trace's requests all
    present at the start, with the same KV bytes (those of the GPT-2 pool that holds the whole
    trace, and a quarter of them)."""
    gpt2 = load_model("shakespeare")[0].eval()
    models = {"gpt2": gpt2, "llama": model}
    # All at once: the seats fill whatever the machine's speed (see the module's docstring).
    requests = [dataclasses.replace(r, arrival=0.0) for r in requests]
    whole = sum(-(-(len(r.prompt) + r.max_tokens) // BLOCK_SIZE) for r in requests)
    per_block = PagedKVCache.bytes_per_block(gpt2, BLOCK_SIZE)
    budgets = {"whole_trace": whole * per_block, "a_quarter": (whole // 4) * per_block}
    once_each = sum(positions_read(len(r.prompt), r.max_tokens) for r in requests)
    result = {"requests": "the main trace's, all present at the start", "seats": seats}
    for budget, kv_bytes in budgets.items():
        blocks = {k: PagedKVCache.blocks_for_bytes(m, kv_bytes, BLOCK_SIZE)
                  for k, m in models.items()}  # fmt: skip
        rows, pools, tokens, schedule = [], {}, {}, {}
        for _ in range(runs):
            row = {}
            for name, m in models.items():
                served, engine = serve_engine(m, tokenizer, requests, max_num_seqs=seats,
                                              num_blocks=blocks[name])  # fmt: skip
                row[name] = served.summary(requests)["tokens_per_s"]
                tokens.setdefault(name, served.tokens)
                pools[name] = pool(engine)
                stats = engine.stats
                run = {"preemptions": stats.preemptions,
                       "most_blocks_in_use": max(served.blocks_in_use),
                       "tokens_computed": stats.tokens_computed,
                       "tokens_found_in_prefix_cache": stats.prompt_tokens_cached}  # fmt: skip
                schedule.setdefault(name, run)
                assert served.tokens == tokens[name], "a model's tokens changed between runs"
                assert run == schedule[name], "the schedule changed between runs: it should not"
            row["ratio"] = round(row["llama"] / row["gpt2"], 3)
            rows.append(row)
        result[budget] = {
            "kv_bytes": kv_bytes,
            "pool": pools,
            "preemptions": {name: s.pop("preemptions") for name, s in schedule.items()},
            "schedule": {"tokens_once_each": once_each, **schedule},
            "runs": rows,
            "median_ratio": round(statistics.median(r["ratio"] for r in rows), 3),
        }
    cfg = model.cfg
    capacity = result["whole_trace"]["pool"]["llama"]["tokens"] / result["whole_trace"]["pool"][
        "gpt2"]["tokens"]  # fmt: skip
    result["goals"] = {
        "llama_tokens_per_s_at_least_gpt2s": goal(
            "the engine's tokens/s on the Llama model / on the GPT-2 model, same trace, same KV "
            "bytes (a pool that holds the whole trace for GPT-2)",
            result["whole_trace"]["median_ratio"], 1.0, at_least=True,
        ),
        "llama_pool_tokens_for_the_same_bytes": verdict(
            capacity == gpt2.cfg.n_kv_heads / cfg.n_kv_heads,
            what="the Llama pool's tokens / the GPT-2 pool's, same bytes (expected: the GPT-2 "
            "model's key/value heads per layer over the Llama model's)",
            measured=round(capacity, 3),
            expected=gpt2.cfg.n_kv_heads / cfg.n_kv_heads,
        ),
    }  # fmt: skip
    return result


def qkv_made_once(model, tokenizer, requests, runs: int, seed: int, quick: bool) -> dict:
    """The GPT-2 runner as it is (each layer's fused QKV made once, when the engine starts)
    against the same runner making them in every layer of every step (as `forward_paged` does
    when it is given none), alternately in this process: the engine's tokens/s over static
    batching's on the main trace, and over the full forward's positions/s on the probe."""
    from solutions.engine import LLMEngine
    from solutions.model_runner import GPT2ModelRunner

    class EveryStepRunner(GPT2ModelRunner):
        """The runner that makes each layer's fused QKV in every step."""

        def forward(self, cache, inputs, logits_at):
            return forward_paged(self.model, cache, inputs, logits_at, attend_strided)

    class EveryStepEngine(LLMEngine):
        """The engine on that runner (a variant of its own: nothing is patched)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.runner = EveryStepRunner(self.model)

    n, longest = (8, 32) if quick else (64, 160)
    probe = all_at_once_trace(n, seed, answer_lens=(16, longest))
    rows = []
    for _ in range(runs):
        static = serve_static(model, tokenizer, requests, 8).summary(requests)["tokens_per_s"]
        row = {}
        for name, engine_cls in (("made_once", LLMEngine), ("every_step", EveryStepEngine)):
            engine = serve_engine(model, tokenizer, requests, engine_cls=engine_cls)[0].summary(
                requests
            )
            before = prefill_positions_per_s(model)
            on_probe = serve_engine(model, tokenizer, probe, engine_cls=engine_cls,
                                    **PROBE)[0].summary(probe)  # fmt: skip
            after = prefill_positions_per_s(model)
            row[name] = {
                "engine_over_static": round(engine["tokens_per_s"] / static, 3),
                "prefill_rate": round(on_probe["tokens_per_s"] / ((before + after) / 2), 3),
            }
        rows.append(row)

    def median(name, what):
        return statistics.median(r[name][what] for r in rows)

    return {
        "runs": rows,
        "median": {name: {what: median(name, what) for what in ("engine_over_static",
                                                                 "prefill_rate")}
                   for name in ("made_once", "every_step")},
    }  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="shakespeare", help="the model served: a shipped name or a folder"
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=40.0, help="arrivals per second")
    parser.add_argument("--batch", type=int, default=8, help="static batching's batch size")
    parser.add_argument("--seats", type=int, default=32, help="the engine's max_num_seqs")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3, help="static and engine, alternating")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke test: 8 requests of up to 32 tokens"
    )
    parser.add_argument(
        "--hf", action="store_true", help="also HF's continuous batching (its setup: ~30 s)"
    )
    parser.add_argument(
        "--default-allocator", action="store_true", help="leave glibc's malloc settings alone"
    )
    parser.add_argument(
        "--no-prefill-rate", action="store_true", help="skip the engine's prefill-rate probe"
    )
    parser.add_argument(
        "--qkv-made-once",
        action="store_true",
        help="only: GPT-2's fused QKV made once against made every step, alternately",
    )
    add_record_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.runs = 8, 1
    if args.requests < 2 or args.rate <= 0 or min(args.batch, args.seats, args.runs) < 1:
        parser.error("--requests >= 2, --rate > 0, --batch, --seats and --runs >= 1")
    return args


def static_against_engine(model, tokenizer, requests, args) -> dict:
    """Both servers, `--runs` times, alternating; the run with the median throughput ratio is
    reported (a shared machine's speed drifts within minutes: a ratio within one run is fair)."""
    pairs = []
    for _ in range(args.runs):
        static_run = serve_static(model, tokenizer, requests, args.batch)
        engine_run, _ = serve_engine(model, tokenizer, requests, max_num_seqs=args.seats)
        static, engine = static_run.summary(requests), engine_run.summary(requests)
        pairs.append((engine["tokens_per_s"] / static["tokens_per_s"], static_run, engine_run))
    _, static_run, engine_run = median_run(pairs, key=lambda p: p[0])
    static = static_run.summary(requests)
    static["kv_positions"] = {"reserved": static_run.kv_reserved, "used": static_run.kv_used}
    engine = engine_run.summary(requests)
    engine["kv_positions"] = {"reserved": engine_run.kv_reserved, "used": engine_run.kv_used,
                              "one_block_each": BLOCK_SIZE * engine_run.kv_requests}  # fmt: skip
    return {
        "throughput_ratio_per_run": [round(p[0], 2) for p in pairs],
        "static": static, "engine": engine,
        "same_tokens": all(p[1].tokens == p[2].tokens for p in pairs),
        "engine_tokens": engine_run.tokens,
    }  # fmt: skip


def hf_continuous_batching(tokenizer, requests, model_name, engine_tokens) -> dict:
    """HF's continuous batching on the main trace, then again under cProfile."""
    hf, hf_tokens = serve_hf(tokenizer, requests, model=model_name)
    hf["same_tokens"] = hf_tokens == engine_tokens
    profiled = serve_hf(tokenizer, requests, profiled=True, model=model_name)[0]
    hf["where_step_time_goes"] = profiled["where_step_time_goes"]
    return hf


def prefix_trace(model, tokenizer, args, longest: int) -> tuple[dict, int]:
    """The prefix trace served with and without prefix caching, and the prompt positions that
    caching must compute: the first request the prefix's full blocks, every later one only what
    is not in them (its own tokens, and the prefix's partial last block if any)."""
    shared = shared_prefix_trace(tokenizer, max(args.requests // 2, 4), args.seed, PREFIX,
                                 answer_lens=(16, min(longest, 64)))  # fmt: skip
    runs = {}
    for caching in (False, True):
        served, run = serve_engine(model, tokenizer, shared, max_num_seqs=args.seats,
                                   enable_prefix_caching=caching)  # fmt: skip
        result = served.summary(shared)
        result["prompt_tokens_computed"] = run.stats.prompt_tokens_computed
        result["prompt_tokens_cached"] = run.stats.prompt_tokens_cached
        runs["caching" if caching else "no_caching"] = result
    full = (PREFIX // BLOCK_SIZE) * BLOCK_SIZE
    expected = sum(len(r.prompt) for r in shared) - full * (len(shared) - 1)
    return {"requests": len(shared), "shared_prefix": PREFIX, **runs}, expected


def serving_goals(main: dict, prefix: dict, expected: int, near_limit: dict | None) -> dict:
    """Chapter 8's goals, from the main trace's median run, the prefix trace and the probe."""
    static, engine = main["static"], main["engine"]
    throughput = engine["tokens_per_s"] / static["tokens_per_s"]
    ttft = engine["ttft_ms"]["median"] / static["ttft_ms"]["median"]
    kv = engine["kv_positions"]
    caching = prefix["caching"]
    prefix_ttft = prefix["no_caching"]["ttft_ms"]["median"] / caching["ttft_ms"]["median"]
    goals = {
        "throughput_1_5x_static": goal(
            "the engine's tokens/s / static batching's", round(throughput, 2), 1.5, at_least=True
        ),
        "throughput_2x_static": goal(
            "the engine's tokens/s / static batching's", round(throughput, 2), 2.0, at_least=True
        ),
        "median_ttft_half_of_static": goal(
            "the engine's median time to first token / static batching's", round(ttft, 3), 0.5,
            at_least=False,
        ),
        "kv_reserved_at_most_used_plus_a_block_each": verdict(
            kv["reserved"] <= kv["used"] + kv["one_block_each"], measured=kv
        ),
        "prefix_positions_computed_exactly_the_uncached": verdict(
            caching["prompt_tokens_computed"] == expected,
            measured=caching["prompt_tokens_computed"], expected=expected,
        ),
        "prefix_median_ttft_2x_better": goal(
            "median time to first token without prefix caching / with it", round(prefix_ttft, 2),
            2.0, at_least=True,
        ),
    }  # fmt: skip
    if near_limit is not None:
        goals["engine_0_6x_prefill_rate"] = goal(
            "the engine's answer tokens/s, all requests at once / the [8, 256] forward's "
            "positions/s", near_limit["median_ratio"], 0.6, at_least=True,
        )  # fmt: skip
    return goals


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    allocator = "default" if args.default_allocator else keep_freed_memory()
    model, tokenizer = load_model(args.model)
    model.eval()
    longest = 32 if args.quick else 160
    requests = poisson_trace(tokenizer, args.requests, args.rate, args.seed,
                             answer_lens=(16, longest))  # fmt: skip
    warm = [dataclasses.replace(r, arrival=0.0) for r in requests[:4]]
    serve_engine(model, tokenizer, warm, max_num_seqs=args.seats)  # warm-up: first calls allocate
    if args.qkv_made_once:
        runs = 1 if args.quick else max(args.runs, 3)
        emit(qkv_made_once(model, tokenizer, requests, runs, args.seed, args.quick), args)
        return
    main_trace = static_against_engine(model, tokenizer, requests, args)
    engine_tokens = main_trace.pop("engine_tokens")
    hf = None
    if args.hf:
        hf = hf_continuous_batching(tokenizer, requests, args.model, engine_tokens)
    prefix, expected = prefix_trace(model, tokenizer, args, longest)
    near_limit = None
    if not args.no_prefill_rate:
        near_limit = prefill_rate(model, tokenizer, 1 if args.quick else max(args.runs, 3),
                                  args.seed, args.quick)  # fmt: skip
    beside = None
    if architecture_of(model).hf_model_type == "llama":
        beside = beside_gpt2(model, tokenizer, requests, 1 if args.quick else args.runs, args.seats)
    goals = serving_goals(main_trace, prefix, expected, near_limit)
    if beside is not None:
        goals.update(beside.pop("goals"))
    emit({
        "model": {"name": str(args.model), "architecture": type(model).__name__},
        "machine": {**machine(), "allocator": allocator},
        "trace": {"requests": args.requests, "rate_per_s": args.rate, "seed": args.seed,
                  "answer_tokens": sum(r.max_tokens for r in requests)},
        **main_trace,
        "hf_continuous_batching": hf,
        "prefix_trace": prefix,
        "prefill_rate": near_limit,
        "beside_gpt2": beside,
        "goals": goals,
    }, args)  # fmt: skip


if __name__ == "__main__":
    main()
