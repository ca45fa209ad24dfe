"""Speculative decoding's speed: chapter 5's `speculative_generate` against chapter 4's samplers.

    python benchmarks/speculative.py [--runs 3] [--ks 1,2,3,4,5,6] [--temperatures 0,0.7,1]
                                     [--tokens 200] [--prompts 4] [--device cpu|cuda]
                                     [--threads 1] [--load N] [--quick]

Prints one JSON object with four parts:

- `batch1`: for each temperature, drafter ("model": the shakespeare-draft model; "ngram":
  prompt lookup) and k, the tokens/s of `speculative_generate` on each of the first `--prompts`
  prompts in turn (batch 1), against chapter 4's `CachedTransformerSampler` at the same
  temperature on the same prompts (greedy at T = 0). `speedup` is the median over runs of the
  ratio within a run (both timed seconds apart, so a busy spell hits both). Also: main-model
  passes per token, tokens per pass, alpha (the fraction of tested drafts kept: drafts after a
  rejection are not tested), and at T = 0 whether the tokens are the baseline's (`identical`).
- `batch4`: the first four prompts in one call at T = 0, against chapter 4's `generate_batch`.
- `cost_model`: c (a drafted token's cost in main-model steps: the draft model's cached
  one-token step over the main model's, both with a cache of `cache_len` positions; for the
  ngram drafter, its `propose` call over k, `ngram_propose` inside) and v_k (a main-model pass
  over k + 1 new tokens over a pass over 1). Each batch-1 configuration gets the predicted
  speed-up (1 - alpha^(k+1)) / ((1 - alpha) (c k + v_k)), which assumes every draft is kept
  with the same probability alpha, independently of the others, and that the baseline costs
  one main-model step per token; `predicted_speedup_from_tpp` puts the measured tokens per
  pass in place of the i.i.d. formula, and `round_cost_measured` (a round's seconds in
  main-model steps) stands beside the modeled c k + v_k, to tell the assumptions apart.
- `goals`: goal1, the best T = 0 configuration is >= 1.5 times as fast as the cached greedy
  sampler, with the same tokens; goal2, the model drafter's best k at T = 0 needs <= 0.5
  main-model passes per token; goal3, the measured speed-ups lie within 15 % of the predicted
  ones (the median relative error over configurations).

Every run generates `--tokens` new tokens per prompt (no stop at end-of-text), fewer if the
longest prompt plus the tokens plus k + 1 would not fit the model's n_ctx. The default run takes
about 8 minutes on a quiet 2-core CPU (11 with `--prompts 6`). `--quick` is a smoke test (k in
{1, 3}, T = 0, one prompt, 40 tokens: 15 s). `--load N` starts N busy processes beside the
benchmark (those of benchmarks/generate.py); `--threads T` sets PyTorch's intra-op threads
(default 1: the ratios then do not depend on how busy the other core is).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial

import torch

from solutions.batched import generate_batch
from solutions.cached_model import forward_with_cache
from solutions.cached_sampling import CachedTransformerSampler
from solutions.drafters import NgramDrafter
from solutions.speculative_generation import SpeculativeStats, speculative_generate
from utils.models import load_model

try:  # python -m benchmarks.speculative, from the repository root
    from benchmarks.generate import load, timed
except ModuleNotFoundError:  # python benchmarks/speculative.py: this folder is on sys.path
    from generate import load, timed

PROMPTS = [
    "HAMLET.\nTo be, or not to be,",
    "ROMEO.\n",
    "JULIET.\nO Romeo,",
    "KING LEAR.\nBlow, winds,",
    "PORTIA.\nThe quality of mercy",
    "PROSPERO.\nWe are such stuff as dreams",
]
DRAFTERS = ("model", "ngram")
BATCH = 4
NGRAM = 2  # the ngram drafter's n
CACHE_LEN = 100  # cached positions for the cost model's timings


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def iid_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens per round when each draft is kept with probability alpha, independently:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return sum(alpha**i for i in range(k + 1))


def bench_batch1(main, draft, tokenizer, drafters, prompts, ks, temperatures, tokens, runs):
    """Chapter 4's cached sampler and every (drafter, k), prompt after prompt, interleaved.
    Returns, per temperature: each method's seconds per run (summed over the prompts), the
    pooled statistics of each (drafter, k), and at T = 0 whether each one's tokens matched."""
    sampler = CachedTransformerSampler(main, tokenizer)
    device = next(main.parameters()).device
    ids = [tokenizer.encode(p) for p in prompts]
    configs = [(d, k) for d in drafters for k in ks]

    def method(name, prompt_index, temperature, seed, stats=None, n=tokens):
        if name == "baseline":
            return lambda: sampler.sample(
                ids[prompt_index], n, temperature=temperature, seed=seed, stop_at_eos=False
            ).tolist()
        drafter, k = name
        return lambda: speculative_generate(
            main, draft, tokenizer, [prompts[prompt_index]], k=k, max_tokens_generated=n,
            temperature=temperature, seed=seed, stop_at_eos=False, drafter=drafter,
            ngram=NGRAM, stats=stats, return_ids=True,
        )[0]  # fmt: skip

    names = ["baseline", *configs]
    for temperature in temperatures:  # warm-up: one short call of each
        for name in names:
            method(name, 0, temperature, 0, n=min(tokens, 20))()
    results = {
        t: {
            "seconds": {name: [0.0] * runs for name in names},
            "stats": {c: SpeculativeStats() for c in configs},
            "identical": {c: True for c in configs},
        }
        for t in temperatures
    }
    for run in range(runs):
        progress(f"batch 1: run {run + 1}/{runs}")
        for temperature in temperatures:
            result = results[temperature]
            for i in range(len(prompts)):
                shift = (run * len(prompts) + i) % len(names)
                outputs = {}
                for name in names[shift:] + names[:shift]:  # rotate the order
                    stats = result["stats"].get(name)
                    call = method(name, i, temperature, seed=1000 * run + i, stats=stats)
                    seconds, outputs[name] = timed(call, device)
                    result["seconds"][name][run] += seconds
                if temperature == 0:
                    for config in configs:
                        same = outputs[config] == outputs["baseline"]
                        result["identical"][config] &= same
    return results


def bench_batch4(main, draft, tokenizer, drafters, prompts, ks, tokens, runs):
    """Chapter 4's `generate_batch` and every (drafter, k) on all `prompts` in one call, greedy.
    Returns each method's seconds per run, statistics and whether the texts matched."""
    device = next(main.parameters()).device
    configs = [(d, k) for d in drafters for k in ks]
    names = ["generate_batch", *configs]

    def method(name, stats=None, n=tokens):
        if name == "generate_batch":
            return lambda: generate_batch(
                main, tokenizer, prompts, n, stop_at_eos=False, temperature=0.0
            )
        drafter, k = name
        return lambda: speculative_generate(
            main, draft, tokenizer, prompts, k=k, max_tokens_generated=n, temperature=0.0,
            stop_at_eos=False, drafter=drafter, ngram=NGRAM, stats=stats,
        )  # fmt: skip

    for name in names:
        method(name, n=min(tokens, 20))()
    seconds = {name: [] for name in names}
    stats = {c: SpeculativeStats() for c in configs}
    identical = {c: True for c in configs}
    for run in range(runs):
        progress(f"batch {len(prompts)}: run {run + 1}/{runs}")
        outputs = {}
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed, outputs[name] = timed(method(name, stats.get(name)), device)
            seconds[name].append(elapsed)
        for config in configs:
            identical[config] &= outputs[config] == outputs["generate_batch"]
    return seconds, stats, identical


@torch.inference_mode()
def cost_model(main, draft, text, prompt_len, ks, reps):
    """c and v_k from cached forward steps with a cache of CACHE_LEN positions (medians of
    `reps` interleaved steps), and the ngram drafter's c per k from its `propose` calls over
    every prefix of `text` (a greedy text) past the prompt."""
    device = next(main.parameters()).device
    context = torch.tensor([text[:CACHE_LEN]], device=device)
    main_cache = forward_with_cache(main, context)[1]
    draft_cache = forward_with_cache(draft, context)[1]
    widths = {1, *(k + 1 for k in ks)}
    feeds = {n: torch.tensor([text[CACHE_LEN : CACHE_LEN + n]], device=device) for n in widths}
    steps = {("main", n): partial(forward_with_cache, main, feed, main_cache)
             for n, feed in feeds.items()}  # fmt: skip
    steps[("draft", 1)] = partial(forward_with_cache, draft, feeds[1], draft_cache)
    seconds = {name: [] for name in steps}
    for _ in range(reps + 5):  # the first 5: warm-up
        for name, step in steps.items():
            seconds[name].append(timed(step, device)[0])
    step = {name: statistics.median(s[5:]) for name, s in seconds.items()}
    main_step = step[("main", 1)]

    # The ngram drafter: what a round's `propose` costs, averaged over the text's lengths.
    drafter = NgramDrafter(NGRAM)
    prefixes = [text[:n] for n in range(prompt_len, len(text) + 1)]
    ngram_seconds = {}
    for k in ks:
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for prefix in prefixes:
                drafter.start([prefix])
                drafter.propose(k)
            runs.append((time.perf_counter() - start) / len(prefixes))
        ngram_seconds[k] = statistics.median(runs)
    return {
        "main_step_s": main_step,
        "draft_step_s": step[("draft", 1)],
        "c_model": step[("draft", 1)] / main_step,
        "v": {k: step[("main", k + 1)] / main_step for k in ks},
        "ngram_s": ngram_seconds,
        "c_ngram": {k: ngram_seconds[k] / k / main_step for k in ks},
    }


def ngram_works(main, tokenizer) -> str | None:
    """None if the ngram drafter runs on the main model's device, else the error."""
    try:
        speculative_generate(
            main, None, tokenizer, [PROMPTS[0]], k=2, max_tokens_generated=4, temperature=0.0,
            stop_at_eos=False, drafter="ngram",
        )  # fmt: skip
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}"
    return None


def median_ratio(slow: list[float], fast: list[float]) -> float:
    """The median over runs of slow / fast seconds: a speed-up measured within each run."""
    return statistics.median(s / f for s, f in zip(slow, fast, strict=True))


def report_batch1(single: dict, costs: dict, drafters, ks, n_tokens: int, runs: int) -> dict:
    """Tokens/s, speed-ups, statistics and the cost model's predictions, per temperature."""
    main_step = costs["main_step_s"]
    batch1 = {}
    for temperature, result in single.items():
        base = result["seconds"]["baseline"]
        base_per_token = statistics.median(base) / n_tokens
        part = {
            "baseline_tokens_per_s": round(1 / base_per_token, 1),
            # The cost model counts one main-model step per baseline token: is it so?
            "baseline_s_per_token_over_main_step": round(base_per_token / main_step, 3),
        }
        for drafter in drafters:
            part[drafter] = {}
            for k in ks:
                stats, seconds = result["stats"][(drafter, k)], result["seconds"][(drafter, k)]
                alpha = stats.acceptance
                c = costs["c_model"] if drafter == "model" else costs["c_ngram"][k]
                round_cost = c * k + costs["v"][k]  # in main-model steps
                predicted = iid_tokens_per_pass(alpha, k) / round_cost
                speedup = median_ratio(base, seconds)
                row = {
                    "tokens_per_s": round(n_tokens / statistics.median(seconds), 1),
                    "speedup": round(speedup, 3),
                    "passes_per_token": round(stats.passes_per_token, 3),
                    "tokens_per_pass": round(stats.tokens_per_pass, 3),
                    "alpha": round(alpha, 3),
                    "predicted_speedup": round(predicted, 3),
                    "predicted_speedup_from_tpp": round(stats.tokens_per_pass / round_cost, 3),
                    "measured_over_predicted": round(speedup / predicted, 3),
                    "within_15pct": abs(speedup / predicted - 1) <= 0.15,
                    "round_cost_modeled": round(round_cost, 3),
                    "round_cost_measured": round(
                        statistics.median(seconds) / (stats.main_passes / runs) / main_step, 3
                    ),
                }
                if temperature == 0:
                    row["identical"] = result["identical"][(drafter, k)]
                part[drafter][f"k={k}"] = row
        batch1[f"T={temperature:g}"] = part
    return batch1


def report_batch4(seconds: dict, stats: dict, identical: dict, drafters, ks, n_tokens: int):
    """Tokens/s and speed-ups over `generate_batch`, with the statistics (alpha pooled over the
    rows, passes per token per row)."""
    base = seconds["generate_batch"]
    batch4 = {"generate_batch_tokens_per_s": round(n_tokens / statistics.median(base), 1)}
    for drafter in drafters:
        batch4[drafter] = {
            f"k={k}": {
                "tokens_per_s": round(n_tokens / statistics.median(seconds[(drafter, k)]), 1),
                "speedup": round(median_ratio(base, seconds[(drafter, k)]), 3),
                "passes_per_token": round(stats[(drafter, k)].passes_per_token, 3),
                "alpha": round(stats[(drafter, k)].acceptance, 3),
                "identical": identical[(drafter, k)],
            }
            for k in ks
        }
    return batch4


def check_goals(batch1: dict) -> dict:
    """The three goals, from the batch-1 report."""
    rows = [
        {"drafter": drafter, "k": int(k[2:]), "greedy": temperature == "T=0", **row}
        for temperature, part in batch1.items()
        for drafter, configs in part.items()
        if isinstance(configs, dict)
        for k, row in configs.items()
    ]
    greedy = [r for r in rows if r["greedy"]]
    goals = {}
    if greedy:
        best = max(greedy, key=lambda r: r["speedup"])
        goals["goal1"] = {
            "passed": best["speedup"] >= 1.5 and best["identical"],
            "target": ">= 1.5x the cached greedy sampler, same tokens",
            "best": f"{best['drafter']} k={best['k']}",
            "speedup": best["speedup"],
            "identical": best["identical"],
        }
        model = [r for r in greedy if r["drafter"] == "model"]
        if model:
            best = max(model, key=lambda r: r["speedup"])
            goals["goal2"] = {
                "passed": best["passes_per_token"] <= 0.5,
                "target": "<= 0.5 main passes per token at the model drafter's best k",
                "k": best["k"],
                "passes_per_token": best["passes_per_token"],
                "fewest_passes_per_token": min(r["passes_per_token"] for r in model),
            }
    errors = [abs(r["measured_over_predicted"] - 1) for r in rows]
    goals["goal3"] = {
        "passed": statistics.median(errors) <= 0.15,
        "target": "measured speed-up within 15 % of predicted (median over configurations)",
        "median_relative_error": round(statistics.median(errors), 3),
        "within_15pct": f"{sum(e <= 0.15 for e in errors)} of {len(errors)}",
    }
    return goals


def benchmark(args, main, draft, tokenizer) -> dict:
    prompts = PROMPTS[: args.prompts]
    n_ctx = min(main.cfg.n_ctx, draft.cfg.n_ctx)
    longest = max(len(tokenizer.encode(p)) for p in PROMPTS)
    tokens = min(args.tokens, n_ctx - longest - max(args.ks) - 1)
    if tokens < 1:
        raise SystemExit(f"no room: the longest prompt is {longest} tokens, n_ctx {n_ctx}")
    drafters, skipped = list(DRAFTERS), {}
    if (error := ngram_works(main, tokenizer)) is not None:
        drafters.remove("ngram")
        skipped["ngram"] = error

    progress("cost model")
    first = tokenizer.encode(PROMPTS[0])
    greedy = CachedTransformerSampler(main, tokenizer).sample(
        first, max(tokens, CACHE_LEN + max(args.ks) + 1), temperature=0.0, stop_at_eos=False
    )
    reps = 50 if args.quick else 200
    costs = cost_model(main, draft, greedy.tolist(), len(first), args.ks, reps)

    single = bench_batch1(
        main, draft, tokenizer, drafters, prompts, args.ks, args.temperatures, tokens, args.runs
    )
    batch1 = report_batch1(single, costs, drafters, args.ks, len(prompts) * tokens, args.runs)
    batched = bench_batch4(
        main, draft, tokenizer, drafters, PROMPTS[:BATCH], args.ks, tokens, args.runs
    )
    batch4 = report_batch4(*batched, drafters, args.ks, BATCH * tokens)

    costs = {
        "cache_len": CACHE_LEN,
        "main_step_ms": round(1e3 * costs["main_step_s"], 4),
        "draft_step_ms": round(1e3 * costs["draft_step_s"], 4),
        "c_model": round(costs["c_model"], 3),
        "v": {f"k={k}": round(v, 3) for k, v in costs["v"].items()},
        "ngram_propose_us": {f"k={k}": round(1e6 * t, 2) for k, t in costs["ngram_s"].items()},
        "c_ngram": {f"k={k}": round(c, 4) for k, c in costs["c_ngram"].items()},
    }
    return {
        "prompts": len(prompts),
        "new_tokens_per_prompt": tokens,
        "ks": args.ks,
        "temperatures": args.temperatures,
        "skipped": skipped,
        "batch1": batch1,
        f"batch{BATCH}": batch4,
        "cost_model": costs,
        "goals": check_goals(batch1),
    }


def number_list(kind):
    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x.strip()]

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ks", type=number_list(int), default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--temperatures", type=number_list(float), default=[0.0, 0.7, 1.0])
    parser.add_argument("--tokens", type=int, default=200, help="new tokens per prompt")
    parser.add_argument(
        "--prompts", type=int, default=4, help=f"batch-1 prompts (1 to {len(PROMPTS)})"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="a smoke test: k 1 and 3, T = 0")
    args = parser.parse_args()
    if args.quick:
        args.ks, args.temperatures, args.tokens, args.prompts = [1, 3], [0.0], 40, 1
    if args.runs < 1 or args.load < 0 or args.threads < 1 or args.tokens < 1:
        parser.error("--runs, --threads and --tokens must be >= 1, --load >= 0")
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts: 1 to {len(PROMPTS)}")
    if not args.ks or not all(1 <= k <= 16 for k in args.ks):
        parser.error("--ks: k from 1 to 16")
    if not args.temperatures or any(t < 0 for t in args.temperatures):
        parser.error("--temperatures must be >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    main_model, tokenizer = load_model("shakespeare")
    draft_model, _ = load_model("shakespeare-draft")
    main_model, draft_model = main_model.to(device).eval(), draft_model.to(device).eval()

    start = time.perf_counter()
    result = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load": args.load,
        },
        "runs": args.runs,
    }
    with load(args.load):
        result.update(benchmark(args, main_model, draft_model, tokenizer))
    result["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
