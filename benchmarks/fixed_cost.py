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
  under `torch.compile` (HF's documented recipe for a compiled static cache);
- `fast_eager`, `fast_compiled`: `FastTransformerSampler` without and with `torch.compile`.

Against the arithmetic: a prefill position's cost is a forward pass over n_ctx positions divided
by n_ctx, the floor a one-position step could reach if it had no fixed cost. Against the memory:
a step multiplies one row by every weight matrix, and a one-row product runs at the speed of the
memory that feeds it (`weight_reads`: that speed, measured on the unembedding, and the time the
step's matrices take to read at it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solutions.cached_sampling import CachedTransformerSampler
from solutions.fast_sampling import FastTransformerSampler, inductor_available
from solutions.static_cache import decode_step
from utils.models import load_hf, load_model

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

    outputs = {name: fn() for name, fn in methods.items()}  # warm-up, and the tokens to check
    times: dict[str, list[float]] = {name: [] for name in methods}
    for run in range(runs):
        names = list(methods)
        for name in names[run % len(names) :] + names[: run % len(names)]:
            start = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - start)
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
        model(tokens)
        prefill = []
        for _ in range(max(runs, 3)):
            start = time.perf_counter()
            model(tokens)
            prefill.append(time.perf_counter() - start)
    per_position = statistics.median(prefill) / n_ctx

    # The other floor: a step reads every weight matrix once for one row, and a one-row matrix
    # product is as fast as the memory that feeds it. Measured on the unembedding (the largest
    # matrix), then applied to all the bytes a step's matrix products read.
    w_u = model.unembed.W_U.detach()
    row = torch.randn(1, w_u.shape[0])
    reads = []
    for _ in range(max(runs, 3)):
        start = time.perf_counter()
        for _ in range(100):
            row @ w_u
        reads.append((time.perf_counter() - start) / 100)
    bytes_per_s = w_u.numel() * w_u.element_size() / statistics.median(reads)
    matrices = [
        p for name, p in model.named_parameters() if p.ndim >= 2 and "pos_embed" not in name
    ]
    matrices = [p for p in matrices if p is not model.embed.W_E]  # embedding: one row read
    step_bytes = sum(p.numel() * p.element_size() for p in matrices)

    tps = {name: new / statistics.median(t) for name, t in times.items()}

    def ratio(fast: str, slow: str) -> float | None:
        if fast not in times or slow not in times:
            return None
        per_run = [ts / tf for tf, ts in zip(times[fast], times[slow], strict=True)]
        return round(statistics.median(per_run), 2)

    ratios = {
        "cached_over_hf_dynamic": ratio("cached", "hf_dynamic"),
        "fast_eager_over_cached": ratio("fast_eager", "cached"),
        "fast_compiled_over_cached": ratio("fast_compiled", "cached"),
        "hf_static_compiled_over_hf_dynamic": ratio("hf_static_compiled", "hf_dynamic"),
        "fast_compiled_over_hf_static_compiled": ratio("fast_compiled", "hf_static_compiled"),
    }
    step = {name: statistics.median(t) / new for name, t in times.items()}
    best = "fast_compiled" if "fast_compiled" in step else "fast_eager"
    measured = {
        "fast_compiled_over_cached": ratios["fast_compiled_over_cached"],
        "fast_compiled_over_hf_static_compiled": ratios["fast_compiled_over_hf_static_compiled"],
        "step_over_prefill_position": round(step[best] / per_position, 2),
        "compile_seconds": compiled.get("compile_seconds"),
        "recompilations": compiled.get("recompilations"),
        "graph_breaks": compiled.get("graph_breaks"),
    }
    goals = {}
    for name, (what, target, at_least) in GOALS.items():
        value = measured[name]
        met = None if value is None else (value >= target if at_least else value <= target)
        goals[name] = {"what": what, "measured": value, "target": target, "met": met}
    expected = outputs["hf_dynamic"]
    return {
        "device": platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "new_tokens": new,
        "runs": runs,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "ratios": ratios,
        "us_per_token": {k: round(1e6 * v, 1) for k, v in step.items()},
        "us_per_prefill_position": round(1e6 * per_position, 1),
        "weight_reads": {
            "one_row_matmul_gb_per_s": round(bytes_per_s / 1e9, 1),
            "mb_of_matrices_per_step": round(step_bytes / 1e6, 2),
            "us_per_step_at_that_rate": round(1e6 * step_bytes / bytes_per_s, 1),
        },
        "compiled": compiled,
        "goals": goals,
        "same_tokens_as_hf": {name: out == expected for name, out in outputs.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="PyTorch intra-op threads")
    args = parser.parse_args()
    if args.runs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--runs and --threads must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"model": args.model, "torch": torch.__version__, "cpu": bench(args.model, args.runs)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
