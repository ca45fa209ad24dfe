"""The fixed cost of a decoding step on a GPU: launches, and what CUDA graphs do about them.

    python benchmarks/cuda_graphs.py [--model shakespeare] [--runs 5] [--skip-hf-compiled]

Needs a CUDA GPU (it says so and exits with status 2 without one). Greedy, one 1-token prompt,
n_ctx - 1 new tokens (255 on the shipped model), float32, every method timed in one process,
interleaved, after a warm-up that is left out of every timing (compiling and recording happen
there). Prints one JSON object: tokens/s (medians over `--runs` runs), ratios (the median over
runs of the ratio within a run), one step alone (µs per call, and the GPU kernels one call
launches, counted by `torch.profiler`), a prefill position's share of a forward pass over
n_ctx positions, what compiling cost, and chapter 5's GPU goal. Every method must give HF's
tokens; `same_tokens_as_hf` says whether it did (float32 everywhere: a difference would be a
near-tie between two logits, or a bug).

Methods:
- `hf_dynamic`: HF `generate`, its default dynamic cache, eager;
- `cached`: chapter 4's `CachedTransformerSampler`, the eager cached loop;
- `fast_eager`: `FastTransformerSampler`, static cache and no-wait loop, eager step;
- `fast_graphed`: the same loop, its step replayed from a CUDA graph recorded by hand
  (`solutions.cuda_graphs.GraphedStep`);
- `fast_compiled`: the step under `torch.compile(fullgraph=True)` (Inductor writes Triton);
- `fast_reduce_overhead`: the step under `torch.compile(mode="reduce-overhead")`, which
  records the compiled step as a CUDA graph itself. It may record only when every tensor the
  step writes stays at one address: the cache's buffers are marked so with
  `torch._dynamo.mark_static_address` (gpt-fast registers its cache as module buffers for the
  same reason). `cudagraph_skips` says whether Inductor refused to record, and why;
- `hf_static_compiled`: HF `generate(cache_implementation="static")` with the forward under
  `torch.compile(fullgraph=True)`, in the mode `--hf-mode` names (default: "default"; HF's
  documented recipe names "reduce-overhead", which failed here: see the comment in `bench`).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch._dynamo.utils import counters

from solutions.cached_sampling import CachedTransformerSampler
from solutions.cuda_graphs import GraphedStep
from solutions.fast_sampling import FastTransformerSampler, decode_step
from solutions.static_cache import StaticKeyValueCache
from utils.models import load_hf, load_model
from utils.records import add_record_options, emit, goal, machine, rate, us_each
from utils.timing import interleaved_runs, median_seconds, ratio_within_runs

PROMPT = "\n"  # one token
GOAL = ("fast_graphed_over_cached", "the CUDA-graph loop / chapter 4's eager cached loop", 3.0)


def step_alone(step, model, cache, calls: int = 200, runs: int = 5) -> float:
    """Median over `runs` of the mean µs of one call of `step`, `calls` calls in a row."""
    token = torch.tensor([[5]], device=cache.device)
    slot = torch.tensor([100], device=cache.device)
    with torch.inference_mode():
        seconds = median_seconds(
            lambda: step(model, cache, token, slot, slot[None]),
            runs, calls, warmup=3, device=cache.device,
        )  # fmt: skip
    return round(1e6 * seconds, 1)


def kernels_per_call(step, model, cache, calls: int = 20) -> float | None:
    """The GPU kernels one call of `step` launches (a CUDA graph's replay counts its kernels)."""
    token = torch.tensor([[5]], device=cache.device)
    slot = torch.tensor([100], device=cache.device)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    try:
        with torch.inference_mode(), torch.profiler.profile(activities=activities) as prof:
            for _ in range(calls):
                step(model, cache, token, slot, slot[None])
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = [e for e in kernels if "memcpy" not in e.name.lower()]
        return round(len(kernels) / calls, 1)
    except Exception as error:  # the profiler's CUDA support varies by build: report, go on
        print(f"kernel count failed: {error!r}", file=sys.stderr)
        return None


def bench(
    model_name: str, runs: int, hf_compiled: bool, hf_mode: str = "default", device: str = "cuda"
) -> dict:
    gpu = torch.device(device)
    model, tokenizer = load_model(model_name)
    model = model.to(gpu).eval()
    n_ctx = model.cfg.n_ctx
    ids = tokenizer.encode(PROMPT)
    new = n_ctx - len(ids)
    prompt = torch.tensor([ids], device=gpu)

    def hf_model():
        hf = load_hf(model_name)[0].to(gpu).eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = tokenizer.eos_token_id
        return hf

    def hf_generate(hf, **kw):
        with torch.inference_mode():
            out = hf.generate(prompt, max_new_tokens=new, do_sample=False, top_k=None, **kw)
        return out[0].tolist()

    hf_dynamic = hf_model()
    cached = CachedTransformerSampler(model, tokenizer)
    fast_eager = FastTransformerSampler(model, tokenizer, compile=False)
    fast_graphed = FastTransformerSampler(model, tokenizer, compile=False)
    # The graph is recorded on the sampler's own cache, before any prefill writes it.
    fast_graphed.step = GraphedStep(model, fast_graphed._cache_for(gpu))

    def sample(sampler):
        return lambda: sampler.sample(ids, new, temperature=0.0).tolist()

    methods = {
        "hf_dynamic": lambda: hf_generate(hf_dynamic),
        "cached": lambda: cached.sample(ids, new, temperature=0.0, stop_at_eos=False).tolist(),
        "fast_eager": sample(fast_eager),
        "fast_graphed": sample(fast_graphed),
    }
    compiled: dict = {}

    def first_call(name, sampler):
        torch.cuda.synchronize()
        start = time.perf_counter()
        sampler.sample(ids, 3, temperature=0.0)  # compiles (and records) the step
        torch.cuda.synchronize()
        compiled[f"{name}_compile_seconds"] = round(time.perf_counter() - start, 1)
        methods[name] = sample(sampler)

    torch._dynamo.reset()
    counters.clear()
    fast_compiled = FastTransformerSampler(model, tokenizer, compile=True)
    first_call("fast_compiled", fast_compiled)

    fast_ro = FastTransformerSampler(model, tokenizer, compile=False)
    cache = fast_ro._cache_for(gpu)
    for buffer in [*cache.keys, *cache.values, cache.mask, cache.causal]:
        torch._dynamo.mark_static_address(buffer)
    fast_ro.step = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)
    first_call("fast_reduce_overhead", fast_ro)
    compiled["cudagraph_skips"] = dict(counters["inductor"].get("cudagraph_skips", {}) or {})
    compiled["graph_breaks"] = sum(counters["graph_break"].values())

    if hf_compiled:
        # HF's recipe asks for mode="reduce-overhead"; with transformers 5.17 on torch 2.11
        # its static cache then failed in generate ("accessing tensor output of CUDAGraphs that
        # has been overwritten by a subsequent run"). `--hf-mode` chooses; a failure is
        # recorded, and the default mode tried after it.
        for mode in dict.fromkeys((hf_mode, "default")):
            hf_static = hf_model()
            hf_static.forward = torch.compile(hf_static.forward, mode=mode, fullgraph=True)
            try:
                torch.cuda.synchronize()
                start = time.perf_counter()
                hf_generate(hf_static, cache_implementation="static")
                hf_generate(hf_static, cache_implementation="static")
            except Exception as error:
                compiled[f"hf_static_compiled_{mode}_error"] = (
                    f"{type(error).__name__}: " + (str(error).splitlines()[0][:200])
                )
                continue
            compiled["hf_static_compiled_mode"] = mode
            compiled["hf_static_compiled_first_generates_seconds"] = round(
                time.perf_counter() - start, 1
            )
            methods["hf_static_compiled"] = lambda hf=hf_static: hf_generate(
                hf, cache_implementation="static"
            )
            break

    times, same = interleaved_runs(
        methods, runs, reference="hf_dynamic", device=gpu,
        progress=lambda line: print(line, file=sys.stderr),
    )  # fmt: skip

    def ratio(fast: str, slow: str) -> float | None:
        return ratio_within_runs(times, fast, slow)

    # One step alone, and the kernels it launches.
    step_cache = StaticKeyValueCache(model.cfg, batch=1, device=gpu)
    graphed = GraphedStep(model, step_cache)
    compiled_step = fast_compiled.step
    # The compiled steps were recorded on their samplers' caches: each is timed on its own.
    step_us = {
        "eager": step_alone(decode_step, model, step_cache, runs=runs),
        "graphed": step_alone(graphed, model, step_cache, runs=runs),
        "compiled": step_alone(compiled_step, model, fast_compiled.cache, runs=runs),
        "reduce_overhead": step_alone(fast_ro.step, model, fast_ro.cache, runs=runs),
    }
    launches = {
        "eager": kernels_per_call(decode_step, model, step_cache),
        "graphed": kernels_per_call(graphed, model, step_cache),
        "compiled": kernels_per_call(compiled_step, model, fast_compiled.cache),
    }

    # A prefill position's share of a forward pass over n_ctx positions.
    tokens = torch.randint(0, model.cfg.d_vocab, (1, n_ctx), device=gpu)
    with torch.inference_mode():
        prefill = median_seconds(lambda: model(tokens), runs, calls=1, device=gpu)
    per_position_us = 1e6 * prefill / n_ctx

    name, what, target = GOAL
    measured = ratio("fast_graphed", "cached")
    return {
        "machine": machine(gpu),
        "new_tokens": new,
        "runs": runs,
        "tokens_per_s": {k: rate(new, t) for k, t in times.items()},
        "us_per_token": {k: us_each(t, new) for k, t in times.items()},
        "ratios": {
            "cached_over_hf_dynamic": ratio("cached", "hf_dynamic"),
            "fast_eager_over_cached": ratio("fast_eager", "cached"),
            "fast_graphed_over_cached": measured,
            "fast_graphed_over_fast_eager": ratio("fast_graphed", "fast_eager"),
            "fast_compiled_over_cached": ratio("fast_compiled", "cached"),
            "fast_reduce_overhead_over_cached": ratio("fast_reduce_overhead", "cached"),
            "fast_graphed_over_hf_static_compiled": ratio("fast_graphed", "hf_static_compiled"),
        },
        "step_alone_us": step_us,
        "kernels_per_step": launches,
        "us_per_prefill_position": round(per_position_us, 2),
        "step_over_prefill_position": {
            k: round(v / per_position_us, 1) for k, v in step_us.items()
        },
        "compiled": compiled,
        "goals": {name: goal(what, measured, target, at_least=True)},
        "same_tokens_as_hf": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--skip-hf-compiled", action="store_true", help="leave out HF's compiled static cache"
    )
    parser.add_argument(
        "--hf-mode", default="default", help="torch.compile mode of HF's forward (default)"
    )
    add_record_options(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/cuda_graphs.py needs a CUDA GPU; none is visible", file=sys.stderr)
        sys.exit(2)
    result = bench(
        args.model, args.runs, hf_compiled=not args.skip_hf_compiled, hf_mode=args.hf_mode
    )
    emit(result, args)


if __name__ == "__main__":
    main()
