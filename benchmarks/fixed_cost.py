"""The fixed cost of a decoding step: the course's fast sampler against chapter 4's and HF's.

    python benchmarks/fixed_cost.py [--model shakespeare] [--runs 5] [--threads T]

Greedy, one 1-token prompt, n_ctx - 1 new tokens (255 on the shipped model), every method
timed in one process, interleaved, after a warm-up that is left out of every timing (a compiled
step's first call compiles it). Prints one JSON object: tokens/s (medians over `--runs` runs),
ratios (the median over runs of the ratio within a run), what compiling cost (the first call's
seconds, dynamo's graphs and graph breaks, recompilations), and the goals of chapter 5, each
with its target and whether it is met. Every method must give HF's tokens (checked).

Methods:
- `hf_dynamic`: HF `generate`, its default dynamic cache, eager;
- `cached`: chapter 4's `CachedTransformerSampler`;
- `hf_static_compiled`: HF `generate(cache_implementation="static")` with the model's forward
  under `torch.compile(fullgraph=True)` in the default mode (HF's `llm_optims.md` pairs the static
  cache with `mode="reduce-overhead"`, which records CUDA graphs: on a CPU there is none to record);
- `fast_eager`, `fast_compiled`: `FastTransformerSampler` without and with `torch.compile`.

Against the arithmetic: a prefill position's cost is a forward pass over n_ctx positions divided
by n_ctx, the floor a one-position step could reach if it had no fixed cost. Against the memory:
a step multiplies one row by every weight matrix, and a one-row product runs at the speed of the
memory that feeds it (`weight_reads`: that speed, measured on the unembedding, and the time the
step's matrices take to read at it).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solutions.cached_sampling import CachedTransformerSampler
from solutions.fast_sampling import (
    FastTransformerSampler,
    compiled_step,
    decode_step,
    inductor_available,
)
from solutions.static_cache import StaticKeyValueCache
from solutions.step_cost import (
    Rates,
    fit_step_cost,
    profile_ops,
    step_bytes,
    step_cached,
    step_flops,
)
from utils.models import load_hf, load_model
from utils.records import add_record_options, emit, goal, machine, rate, us_each
from utils.timing import best_seconds, interleaved_runs, median_seconds, ratio_within_runs

PROMPT = "\n"  # one token

GOALS = {
    # name: (what is measured, target, at least (True) or at most (False))
    "fast_compiled_over_cached": (
        "FastTransformerSampler compiled / chapter 4's sampler",
        2.0,
        True,
    ),
    "fast_compiled_over_hf_static_compiled": (
        "FastTransformerSampler compiled / HF static cache with a compiled forward",
        1.3,
        True,
    ),
    "step_over_prefill_position": ("a decoding step / a prefill position", 3.0, False),
    "compile_seconds": ("the compiled step's first call, seconds", 60.0, False),
    "recompilations": ("recompilations over the timed generations", 0, False),
    "graph_breaks": ("graph breaks in the decoding step", 0, False),
}


def bench(model_name: str, runs: int) -> dict:
    model, tokenizer = load_model(model_name)
    model.eval()
    n_ctx = model.cfg.n_ctx
    ids = tokenizer.encode(PROMPT)
    new = n_ctx - len(ids)
    hf_dynamic = load_hf(model_name)[0].eval()
    hf_static = load_hf(model_name)[0].eval()
    for hf in (hf_dynamic, hf_static):
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = tokenizer.eos_token_id
    inductor, why_not = inductor_available()
    if inductor:
        hf_static.forward = torch.compile(hf_static.forward, fullgraph=True)
    prompt = torch.tensor([ids])

    def hf_generate(hf, **kw):
        with torch.inference_mode():
            out = hf.generate(prompt, max_new_tokens=new, do_sample=False, top_k=None, **kw)
        return out[0].tolist()

    cached = CachedTransformerSampler(model, tokenizer)
    fast_eager = FastTransformerSampler(model, tokenizer, compile=False)
    methods = {
        "hf_dynamic": lambda: hf_generate(hf_dynamic),
        "cached": lambda: cached.sample(ids, new, temperature=0.0, stop_at_eos=False).tolist(),
        "fast_eager": lambda: fast_eager.sample(ids, new, temperature=0.0).tolist(),
    }
    compiled: dict = {"inductor": inductor, "why_not": why_not}
    if inductor:
        torch._dynamo.reset()
        counters.clear()
        fast_compiled = FastTransformerSampler(model, tokenizer, compile=True)
        start = time.perf_counter()
        fast_compiled.sample(ids, 2, temperature=0.0)  # the first step compiles
        compiled["compile_seconds"] = round(time.perf_counter() - start, 1)
        methods["fast_compiled"] = lambda: fast_compiled.sample(ids, new, temperature=0.0).tolist()
        methods["hf_static_compiled"] = lambda: hf_generate(
            hf_static, cache_implementation="static"
        )

    times, same = interleaved_runs(methods, runs, reference="hf_dynamic")
    if inductor:
        # The decoding step's own entries in dynamo's cache: one per compilation of it (HF's
        # compiled forward has its own, and graph breaks anywhere are counted apart).
        entries = _debug_get_cache_entry_list(decode_step.__code__)
        compiled["recompilations"] = len(entries) - 1
        compiled["graph_breaks"] = sum(counters["graph_break"].values())

    # The floor: a forward pass over n_ctx positions, per position.
    tokens = torch.randint(
        0, model.cfg.d_vocab, (1, n_ctx), generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        pass_seconds = median_seconds(lambda: model(tokens), runs, calls=1)
    per_position = pass_seconds / n_ctx

    # The other floor: a step reads every weight matrix once for one row, and a one-row matrix
    # product is as fast as the memory that feeds it. Measured on the unembedding (the largest
    # matrix), then applied to all the bytes a step's matrix products read.
    w_u = model.unembed.W_U.detach()
    row = torch.randn(1, w_u.shape[0])
    one_row = median_seconds(lambda: row @ w_u, runs, calls=100)
    rates = Rates.from_times(model, pass_seconds, one_row)  # both floors, measured once
    bytes_per_s = rates.bytes_per_second
    read_per_step = step_bytes(model)  # chapter 5's count of the bytes a step reads

    def ratio(fast: str, slow: str) -> float | None:
        return ratio_within_runs(times, fast, slow)

    ratios = {
        "cached_over_hf_dynamic": ratio("cached", "hf_dynamic"),
        "fast_eager_over_cached": ratio("fast_eager", "cached"),
        "fast_compiled_over_cached": ratio("fast_compiled", "cached"),
        "hf_static_compiled_over_hf_dynamic": ratio("hf_static_compiled", "hf_dynamic"),
        "fast_compiled_over_hf_static_compiled": ratio("fast_compiled", "hf_static_compiled"),
    }
    step_us = {name: us_each(t, new, digits=None) for name, t in times.items()}
    best = "fast_compiled" if "fast_compiled" in step_us else "fast_eager"
    measured = {
        "fast_compiled_over_cached": ratios["fast_compiled_over_cached"],
        "fast_compiled_over_hf_static_compiled": ratios["fast_compiled_over_hf_static_compiled"],
        "step_over_prefill_position": round(step_us[best] / (1e6 * per_position), 2),
        "compile_seconds": compiled.get("compile_seconds"),
        "recompilations": compiled.get("recompilations"),
        "graph_breaks": compiled.get("graph_breaks"),
    }
    goals = {  # (more goals are added by main)
        name: goal(what, measured[name], target, at_least)
        for name, (what, target, at_least) in GOALS.items()
    }
    return {
        "new_tokens": new,
        "runs": runs,
        "tokens_per_s": {k: rate(new, t) for k, t in times.items()},
        "ratios": ratios,
        "us_per_token": {k: round(v, 1) for k, v in step_us.items()},
        "us_per_prefill_position": round(1e6 * per_position, 1),
        "weight_reads": {
            "one_row_matmul_gb_per_s": round(bytes_per_s / 1e9, 1),
            "mb_read_per_step": round(read_per_step / 1e6, 2),
            "us_per_step_at_that_rate": round(1e6 * read_per_step / bytes_per_s, 1),
        },
        "compiled": compiled,
        "goals": goals,
        "same_tokens_as_hf": same,
        "step": step_costs(model, runs) if inductor else None,
        "cost_model": cost_model(model, rates, positions=[8, 64, 128, 192, 240]),
        "int8": int8_figures(model, tokenizer),
    }


def step_costs(model, runs: int) -> dict:
    """One decoding step, alone: eager, compiled, and compiled without evaluating its guards
    (`skip_guard_eval_unsafe`: what checking the guards costs per call). The draft model's
    step against the main model's (chapter 6's c) is measured by benchmarks/speculative.py,
    eager and compiled on one cache in one process, beside the runs it explains."""
    eager, compiled = decode_step, compiled_step(True)
    slot, token = torch.tensor([100]), torch.tensor([[5]])
    cache = StaticKeyValueCache(model.cfg, batch=1)
    out = {}
    with torch.inference_mode():
        for name, fn in [("eager", eager), ("compiled", compiled)]:
            seconds = median_seconds(lambda f=fn: f(model, cache, token, slot, slot[None]), runs)
            out[f"main_{name}_us"] = round(1e6 * seconds, 1)
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            seconds = median_seconds(lambda: compiled(model, cache, token, slot, slot[None]), runs)
        out["main_compiled_no_guards_us"] = round(1e6 * seconds, 1)
    out["guards_us"] = round(out["main_compiled_us"] - out["main_compiled_no_guards_us"], 1)
    out["main_compiled_profile_us"] = compiled_profile(compiled, model, token, slot)
    return out


def compiled_profile(compiled, model, token, slot, calls: int = 50) -> dict:
    """Where a compiled step's time goes, per call, from `torch.profiler`'s own CPU time of each
    event: the matrix products (PyTorch's kernels, which Inductor calls), attention (PyTorch's
    kernel too), the code Inductor generated (its wrapper and fused loops), dynamo's guard checks
    (its cache lookup), and the rest. The profiler adds to each event: shares, not a timing."""
    cache = StaticKeyValueCache(model.cfg, batch=1)
    groups = {
        "matmul": ("aten::mm", "aten::addmm", "aten::bmm"),
        "attention": ("aten::_scaled_dot_product",),
        "inductor_code": ("## Call CompiledFxGraph",),
        "guards": ("TorchDynamo Cache Lookup",),
    }
    with torch.inference_mode():
        compiled(model, cache, token, slot, slot[None])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                compiled(model, cache, token, slot, slot[None])
    out = dict.fromkeys([*groups, "other"], 0.0)
    for event in prof.key_averages():
        group = next((g for g, keys in groups.items() if event.key.startswith(keys)), "other")
        out[group] += event.self_cpu_time_total / calls
    return {k: round(v, 1) for k, v in out.items()}


def cost_model(main, rates: Rates, positions: list[int]) -> dict:
    """Chapter 5's step-cost model: fitted on chapter 4's cached steps of `main` at `positions`
    (floors from `rates`, the run's own), then asked to predict the draft model's steps (each
    the fastest of 30 calls). Eager steps only: a compiled step's operations are fused kernels,
    not dispatches."""
    from solutions.cached_model import forward_with_cache

    draft = load_model("shakespeare-draft")[0]
    cfg = main.cfg
    tokens = torch.randint(
        0, cfg.d_vocab, (1, cfg.n_ctx), generator=torch.Generator().manual_seed(0)
    )

    def steps(m) -> dict[str, torch.Tensor]:
        cols: dict[str, list[float]] = {"n_ops": [], "floor": [], "cached": [], "seconds": []}
        with torch.inference_mode():
            for t in positions:
                _, cache = forward_with_cache(m, tokens[:, :t])

                def run(m=m, t=t, cache=cache):
                    return forward_with_cache(m, tokens[:, t : t + 1], cache)

                cols["n_ops"].append(profile_ops(run, repeats=2)[0])
                cols["floor"].append(float(rates.floor(step_flops(m.cfg, t), step_bytes(m))))
                cols["cached"].append(step_cached(m.cfg, t))
                cols["seconds"].append(best_seconds(run, 30))
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in cols.items()}

    measured = {"main": steps(main), "draft": steps(draft)}
    fit = fit_step_cost(*(measured["main"][k] for k in ("n_ops", "floor", "cached", "seconds")))
    out = {
        "positions": positions,
        "gflops_per_s": round(rates.flops_per_second / 1e9, 1),
        "gb_per_s": round(rates.bytes_per_second / 1e9, 1),
        "per_op_us": round(1e6 * fit.per_op, 3),
        "per_cached_ns": round(1e9 * fit.per_cached, 4),
    }
    for name, cols in measured.items():
        predicted = fit.predict(cols["n_ops"], cols["floor"], cols["cached"])
        out[f"{name}_n_ops"] = int(cols["n_ops"][0])
        out[f"{name}_us"] = [round(1e6 * v, 1) for v in cols["seconds"].tolist()]
        out[f"{name}_predicted_us"] = [round(1e6 * v, 1) for v in predicted.tolist()]
        out[f"{name}_max_error"] = round((predicted / cols["seconds"] - 1).abs().max().item(), 3)
        above = (cols["seconds"] - cols["floor"]).median().item()
        out[f"{name}_us_above_floor_per_op"] = round(1e6 * above / cols["n_ops"][0].item(), 3)
    return out


def int8_figures(model, tokenizer, batches: int = 16) -> dict:
    """Chapter 5's int8 weights: bytes against float32, and the held-out loss over `batches`
    batches of 16 windows of chapter 2's held-out plays (the corpus must be cached: `course
    corpus`)."""
    from torch.utils.data import DataLoader

    from solutions.dataset import TokenWindows
    from solutions.int8 import int8_model
    from solutions.train import evaluate
    from utils.corpus import CorpusUnavailable, load_plays, split_plays

    model8, int8_bytes = int8_model(model)
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"float32_mb": round(float_bytes / 1e6, 2), "int8_mb": round(int8_bytes / 1e6, 2)}
    out["smaller"] = round(float_bytes / int8_bytes, 2)
    try:
        held_out = split_plays(load_plays())[1]
    except CorpusUnavailable as error:
        return out | {"loss": None, "why_not": str(error)}
    ids = torch.tensor(tokenizer.encode("\n\n".join(held_out.values())))
    loader = DataLoader(TokenWindows(ids, model.cfg.n_ctx), batch_size=16)
    loss32 = evaluate(model, loader, max_batches=batches)
    loss8 = evaluate(model8, loader, max_batches=batches)
    return out | {
        "batches": batches,
        "loss_float32": round(loss32, 4),
        "loss_int8": round(loss8, 4),
        "loss_difference": round(loss8 - loss32, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="PyTorch intra-op threads")
    add_record_options(parser)
    args = parser.parse_args()
    if args.runs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--runs and --threads must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = bench(args.model, args.runs)
    more = {
        "cost_model_max_error": (
            "the step-cost model's largest error, both models (eager steps)",
            max(cpu["cost_model"]["main_max_error"], cpu["cost_model"]["draft_max_error"]),
            0.15,
            False,
        ),
        "int8_smaller": (
            "int8 weights: times fewer bytes than float32",
            cpu["int8"]["smaller"],
            3.5,
            True,
        ),
        "int8_loss_difference": (
            "int8 weights: held-out loss minus float32's, nats per token",
            cpu["int8"].get("loss_difference"),
            0.01,
            False,
        ),
    }
    for name, (what, value, target, at_least) in more.items():
        cpu["goals"][name] = goal(what, value, target, at_least)
    result = {"model": args.model, "machine": machine(), "cpu": cpu}
    emit(result, args)


if __name__ == "__main__":
    main()
