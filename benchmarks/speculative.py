"""Speculative and lookahead decoding's speed: chapter 6's generators against chapter 4's.

    python benchmarks/speculative.py [--runs 3] [--ks 1,2,3,4,5,6] [--temperatures 0,0.7,1]
                                     [--lookahead 5,3,5/5,3,5,p/7,4,7,p] [--tokens 150]
                                     [--prompts 2]
                                     [--device cpu|cuda] [--threads 1] [--load N] [--quick]
                                     [--compiled]

Prints one JSON object:

- `workloads`: for each of `utils/speed.py`'s three workloads (open-ended text, greedy text that
  loops, an input-grounded task; `--prompts` prompts each, batch 1), what its greedy text is
  like (`repeat_rate`: the fraction of new tokens that end a 4-gram seen before; `copy_rate`:
  that end a 4-gram of the prompt), then for each temperature and method (drafter "model":
  the shakespeare-draft model; "ngram": prompt lookup; "lookahead": lookahead decoding with
  window W, n-gram N, G candidates, and with ",p" `pool_from_prompt=True`: the text's own
  n-grams in its pool too) the tokens/s against chapter 4's `CachedTransformerSampler`
  on the same prompts. `speedup` is the median over runs of the ratio within a run (both timed
  seconds apart, so a busy spell hits both). Also: main-model passes per token, tokens per
  pass, alpha (the fraction of tested drafts or candidate tokens kept), at T = 0 whether the
  tokens are the baseline's (`identical`), and the cost model's prediction.
- `batch4`: the first four prompts of the workloads in one call at T = 0, against chapter 4's
  `generate_batch` (the drafters only: lookahead decoding runs one text at a time).
- `cost_model`: the isolated timings (s1, a main-model step after 100 cached positions; c, the
  draft model's step over s1; v, a main pass of n tokens over s1 after 40 and 160 cached
  positions) and, per method and temperature, a round's cost measured inside real runs on a
  calibration prompt that is none of the workloads': drafting, the main pass, and the fixed
  rest f (the sampler, trimming caches, Python), in main steps. A configuration's prediction
  is b * tokens_per_pass / round_cost, with b the baseline's measured cost per token and the
  round cost rescaled (the pass, by v) to the workload's mean pass width and cached length;
  `predicted_speedup_iid` uses the textbook (1 - alpha^(k+1)) / ((1 - alpha) (c k + v_k))
  instead. `what_if`: the textbook formula at the model drafter's measured alpha with the
  measured c, and with c = 0.05 and v = 1 (a large model and a small draft on a GPU).
- `goals`: goal1, the best T = 0 configuration is >= 1.5 times as fast as the cached greedy
  sampler, with the same tokens; goal2, the model drafter's best k at T = 0 needs <= 0.5
  main-model passes per token; goal3, the measured speed-ups lie within 10 % of the
  predicted ones (the median relative error over configurations); goal4, lookahead decoding
  at T = 0 needs fewer main passes per token than the n-gram drafter on open-ended text (each
  at its best setting); goal5, every T = 0 run gives the baseline's tokens.

`--compiled` measures something else and prints only that: chapter 6's model drafter on chapter
5's static caches with compiled steps (`solutions/fast_speculative.py`: the draft model's step and
the main model's (k + 1)-token pass each compiled once), at each k and temperature, on the same
workloads, against chapter 4's sampler (goal 1's baseline) and against chapter 5's compiled
`FastTransformerSampler` (the fair one: the same compiled steps without speculation). Its
`costs` are the compiled steps' (s1, c, v_k at 100 cached positions); `textbook` is
(1 - alpha^(k+1)) / ((1 - alpha) (c k + v_k)) at each configuration's measured alpha, the
speed-up over the compiled sampler if a round cost nothing but its model calls. `goals`: goal1
as above, and goal1_compiled, the same target against the compiled sampler. Inductor's compile
time is left out of every timing (each method runs once first); without a C++ compiler the
steps are traced with dynamo and run eagerly (`compile` says which).

Every run generates `--tokens` new tokens per prompt (no stop at end-of-text), fewer if the
longest prompt plus the tokens plus the widest pass would not fit the model's n_ctx. The
default run takes minutes (its JSON records `wall_s`). `--quick` is a smoke test (k in
{1, 3}, T = 0, lookahead 5,3,5 and 5,3,5,p, one prompt per workload, 30 tokens, one run).
`--load N` starts N busy processes beside the benchmark (those of benchmarks/generate.py);
`--threads T` sets PyTorch's intra-op threads (default 1: the ratios then do not depend on how
busy the other core is).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from solutions.architectures import forward_static
from solutions.batched import generate_batch
from solutions.cached_sampling import CachedTransformerSampler
from solutions.fast_sampling import FastTransformerSampler, decode_step, inductor_available
from solutions.fast_speculative import FastSpeculativeGenerator
from solutions.lookahead import lookahead_generate
from solutions.speculative_generation import SpeculativeStats, speculative_generate
from solutions.static_cache import StaticKeyValueCache
from utils import speed
from utils.models import load_model
from utils.records import add_record_options, emit, machine, rate, verdict
from utils.timing import busy_processes, interleaved_runs, median_ratio, timed

DRAFTERS = ("model", "ngram")
BATCH = 4
NGRAM = 2  # the ngram drafter's n
GPU_LIKE = {"c": 0.05, "v": 1.0}  # the what-if: a small draft for a large model on a GPU


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def iid_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens per round when each draft is kept with probability alpha, independently:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return sum(alpha**i for i in range(k + 1))


def config_name(method: str, setting) -> str:
    if method != "lookahead":
        return f"k={setting}"
    return "W={},N={},G={}".format(*setting[:3]) + (",pool_from_prompt" if setting[3] else "")


class Methods:
    """Every method as a call: `call(method, setting, prompt, temperature, seed, n, stats)`
    returns the new token ids of one prompt (batch 1); "baseline" is chapter 4's sampler."""

    def __init__(self, main, draft, tokenizer):
        self.main, self.draft, self.tokenizer = main, draft, tokenizer
        self.sampler = CachedTransformerSampler(main, tokenizer)

    def call(self, method, setting, prompt, temperature, seed, n, stats=None):
        ids = self.tokenizer.encode(prompt)
        if method == "baseline":
            out = self.sampler.sample(ids, n, temperature=temperature, seed=seed, stop_at_eos=False)
            return out.tolist()[len(ids) :]
        common = dict(max_tokens_generated=n, temperature=temperature, seed=seed,
                      stop_at_eos=False, stats=stats, return_ids=True)  # fmt: skip
        if method == "lookahead":
            window, ngram, guesses, pool_from_prompt = setting
            out = lookahead_generate(self.main, self.tokenizer, [prompt], window=window,
                                     ngram=ngram, guesses=guesses,
                                     pool_from_prompt=pool_from_prompt, **common)  # fmt: skip
        else:
            out = speculative_generate(
                self.main, self.draft, self.tokenizer, [prompt], k=setting, drafter=method,
                ngram=NGRAM, **common,
            )  # fmt: skip
        return list(out[0])[len(ids) :]


def bench_workloads(methods: Methods, configs, workloads, temperatures, tokens, runs, device):
    """Every workload's prompts, baseline and configurations interleaved (the order rotated),
    `runs` times. Returns, per (workload, temperature): seconds per run of each name, pooled
    statistics per configuration, and at T = 0 whether each one's tokens matched."""
    names = ["baseline", *configs]
    for temperature in temperatures:  # warm-up: one short call of each
        for name in names:
            method, setting = ("baseline", None) if name == "baseline" else name
            methods.call(method, setting, speed.CALIBRATION_PROMPT, temperature, 0, 10)
    results = {}
    for run in range(runs):
        progress(f"workloads: run {run + 1}/{runs}")
        for workload, prompts in workloads.items():
            for temperature in temperatures:
                result = results.setdefault((workload, temperature), {
                    "seconds": {name: [0.0] * runs for name in names},
                    "stats": {c: SpeculativeStats() for c in configs},
                    "identical": {c: True for c in configs},
                })  # fmt: skip
                for i, prompt in enumerate(prompts):
                    shift = (run * len(prompts) + i) % len(names)
                    outputs = {}
                    for name in names[shift:] + names[:shift]:
                        method, setting = ("baseline", None) if name == "baseline" else name
                        stats = result["stats"].get(name)
                        seed = 1000 * run + i
                        args = (method, setting, prompt, temperature, seed, tokens, stats)
                        call = lambda args=args: methods.call(*args)  # noqa: E731
                        seconds, outputs[name] = timed(call, device)
                        result["seconds"][name][run] += seconds
                    if temperature == 0:
                        for config in configs:
                            result["identical"][config] &= outputs[config] == outputs["baseline"]
    return results


def calibrate(methods: Methods, configs, temperatures, tokens, costs, repeats) -> dict:
    """Per (configuration, temperature): a round's cost measured inside runs on the calibration
    prompt (speed.round_costs), in main steps."""
    calibrated = {}
    for config in configs:
        for temperature in temperatures:
            method, setting = config

            def run(stats, method=method, setting=setting, temperature=temperature):
                methods.call(method, setting, speed.CALIBRATION_PROMPT, temperature, 0, tokens,
                             stats)  # fmt: skip

            calibrated[(config, temperature)] = speed.round_costs(
                run, SpeculativeStats, methods.main, costs["s1"], repeats
            )
    return calibrated


def text_shapes(methods: Methods, workloads, tokens) -> dict:
    """Each workload's greedy text: how much it repeats itself, and copies its prompt."""
    shapes = {}
    for workload, prompts in workloads.items():
        repeats, copies = [], []
        for prompt in prompts:
            ids = methods.tokenizer.encode(prompt)
            new = methods.call("baseline", None, prompt, 0.0, 0, tokens)
            repeats.append(speed.repeat_rate(ids + new, len(ids)))
            copies.append(speed.copy_rate(ids + new, len(ids)))
        shapes[workload] = {
            "about": speed.WORKLOADS[workload]["about"],
            "prompt_tokens": [len(methods.tokenizer.encode(p)) for p in prompts],
            "greedy_repeat_rate": round(statistics.mean(repeats), 3),
            "greedy_copy_rate": round(statistics.mean(copies), 3),
        }
    return shapes


def report_workloads(results, calibrated, costs, configs, workloads, tokenizer, tokens, runs):
    """Tokens/s, speed-ups, statistics and both predictions, per workload and temperature."""
    s1 = costs["s1"]
    report = {}
    for (workload, temperature), result in results.items():
        prompts = workloads[workload]
        n_tokens = tokens * len(prompts)
        base = result["seconds"]["baseline"]
        b = statistics.median(base) / n_tokens / s1  # the baseline's token, in main steps
        cache_len = statistics.mean(len(tokenizer.encode(p)) for p in prompts) + tokens / 2
        part = {"baseline_tokens_per_s": rate(n_tokens, base),
                "baseline_steps_per_token": round(b, 3)}  # fmt: skip
        for config in configs:
            method, setting = config
            stats, seconds = result["stats"][config], result["seconds"][config]
            cal = calibrated[(config, temperature)]
            cal_len = len(tokenizer.encode(speed.CALIBRATION_PROMPT)) + cal["tokens"] / 2
            cost = speed.predicted_round_cost(cal, costs, stats.mean_width, cache_len, cal_len)
            predicted = speed.predicted_speedup(b, stats.tokens_per_pass, cost)
            speedup = median_ratio(base, seconds)
            row = {
                "tokens_per_s": rate(n_tokens, seconds),
                "speedup": round(speedup, 3),
                "passes_per_token": round(stats.passes_per_token, 3),
                "tokens_per_pass": round(stats.tokens_per_pass, 3),
                "alpha": round(stats.acceptance, 3),
                "mean_pass_width": round(stats.mean_width, 2),
                "round_cost": round(cost, 3),
                "predicted_speedup": round(predicted, 3),
                "measured_over_predicted": round(speedup / predicted, 3),
                "within_10pct": abs(speedup / predicted - 1) <= 0.10,
            }
            if method != "lookahead":
                c = costs["c"] if method == "model" else costs["c_ngram"][setting]
                v = speed.v_at(costs, setting + 1, speed.CACHE_LEN)
                iid = iid_tokens_per_pass(min(stats.acceptance, 0.999), setting)
                row["predicted_speedup_iid"] = round(iid / (c * setting + v), 3)
            if temperature == 0:
                row["identical"] = result["identical"][config]
            part.setdefault(method, {})[config_name(method, setting)] = row
        report.setdefault(workload, {})[f"T={temperature:g}"] = part
    return report


def what_if(report: dict, costs: dict, ks: list[int]) -> dict | None:
    """The textbook formula at the model drafter's measured alpha (greedy, looping text; k = 4,
    or the largest k below it that ran), with the measured c and v_k, and with a GPU-like pair
    (c = 0.05, v_k = 1)."""
    k = max([x for x in ks if x <= 4] or ks)
    row = report.get("looping", {}).get("T=0", {}).get("model", {}).get(f"k={k}")
    if row is None:
        return None
    alpha = min(row["alpha"], 0.999)
    gain = iid_tokens_per_pass(alpha, k)
    v = speed.v_at(costs, k + 1, speed.CACHE_LEN)
    return {
        "k": k,
        "alpha": row["alpha"],
        "measured_c_and_v": {
            "c": round(costs["c"], 3),
            "v_k": round(v, 3),
            "speedup": round(gain / (costs["c"] * k + v), 3),
        },  # fmt: skip
        "gpu_like": {**GPU_LIKE, "speedup": round(gain / (GPU_LIKE["c"] * k + GPU_LIKE["v"]), 3)},
    }


def check_goals(report: dict) -> dict:
    """The five goals, from the workloads' report."""
    rows = [
        {"workload": w, "greedy": t == "T=0", "method": m, "config": c, **row}
        for w, by_t in report.items()
        for t, part in by_t.items()
        if t.startswith("T=")
        for m, configs in part.items()
        if isinstance(configs, dict)
        for c, row in configs.items()
    ]
    greedy = [r for r in rows if r["greedy"]]
    goals = {}
    if greedy:
        best = max(greedy, key=lambda r: r["speedup"])
        goals["goal1"] = verdict(
            best["speedup"] >= 1.5 and best["identical"],
            target=">= 1.5x the cached greedy sampler, same tokens",
            best=f"{best['method']} {best['config']} on {best['workload']} text",
            speedup=best["speedup"],
        )
        model = [r for r in greedy if r["method"] == "model"]
        if model:
            best = max(model, key=lambda r: r["speedup"])
            goals["goal2"] = verdict(
                best["passes_per_token"] <= 0.5,
                target="<= 0.5 main passes per token at the model drafter's best k",
                at=f"{best['config']} on {best['workload']} text",
                passes_per_token=best["passes_per_token"],
            )
    errors = [abs(r["measured_over_predicted"] - 1) for r in rows]
    goals["goal3"] = verdict(
        statistics.median(errors) <= 0.10,
        target="measured speed-up within 10 % of predicted (median over configurations)",
        median_relative_error=round(statistics.median(errors), 3),
        within_10pct=f"{sum(e <= 0.10 for e in errors)} of {len(errors)}",
        by_method={
            m: round(
                statistics.median(
                    abs(r["measured_over_predicted"] - 1) for r in rows if r["method"] == m
                ),
                3,
            )  # fmt: skip
            for m in sorted({r["method"] for r in rows})
        },
    )
    open_greedy = [r for r in greedy if r["workload"] == "open-ended"]
    look = [r["passes_per_token"] for r in open_greedy if r["method"] == "lookahead"]
    ngram = [r["passes_per_token"] for r in open_greedy if r["method"] == "ngram"]
    if look and ngram:
        goals["goal4"] = verdict(
            min(look) < min(ngram),
            target="lookahead at T = 0 needs fewer main passes per token than the n-gram "
            "drafter on open-ended text (each at its best setting)",
            lookahead=min(look),
            ngram=min(ngram),
        )
    goals["goal5"] = verdict(
        all(r["identical"] for r in greedy),
        target="every T = 0 run gives the baseline's tokens",
        identical=f"{sum(r['identical'] for r in greedy)} of {len(greedy)}",
    )
    return goals


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


def report_batch4(seconds: dict, stats: dict, identical: dict, drafters, ks, n_tokens: int):
    """Tokens/s and speed-ups over `generate_batch`, with the statistics (alpha pooled over the
    rows, passes per token per row)."""
    base = seconds["generate_batch"]
    batch4 = {"generate_batch_tokens_per_s": rate(n_tokens, base)}
    for drafter in drafters:
        batch4[drafter] = {
            f"k={k}": {
                "tokens_per_s": rate(n_tokens, seconds[(drafter, k)]),
                "speedup": round(median_ratio(base, seconds[(drafter, k)]), 3),
                "passes_per_token": round(stats[(drafter, k)].passes_per_token, 3),
                "alpha": round(stats[(drafter, k)].acceptance, 3),
                "identical": identical[(drafter, k)],
            }
            for k in ks
        }
    return batch4


def ngram_works(main, tokenizer) -> str | None:
    """None if the ngram drafter runs on the main model's device, else the error."""
    try:
        speculative_generate(
            main, None, tokenizer, [speed.CALIBRATION_PROMPT], k=2, max_tokens_generated=4,
            temperature=0.0, stop_at_eos=False, drafter="ngram",
        )  # fmt: skip
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}"
    return None


def benchmark(args, main, draft, tokenizer) -> dict:
    workloads = {w: spec["prompts"][: args.prompts] for w, spec in speed.WORKLOADS.items()}
    n_ctx = min(main.cfg.n_ctx, draft.cfg.n_ctx)
    everything = [p for ps in workloads.values() for p in ps] + [speed.CALIBRATION_PROMPT]
    longest = max(len(tokenizer.encode(p)) for p in everything)
    widest = max([k + 1 for k in args.ks] + [(n - 1) * (w + g) for w, n, g, _ in args.lookahead])
    tokens = min(args.tokens, n_ctx - longest - widest)
    if tokens < 1:
        raise SystemExit(f"no room: the longest prompt is {longest} tokens, n_ctx {n_ctx}")
    drafters, skipped = list(DRAFTERS), {}
    if (error := ngram_works(main, tokenizer)) is not None:
        drafters.remove("ngram")
        skipped["ngram"] = error
    configs = [(d, k) for d in drafters for k in args.ks]
    configs += [("lookahead", tuple(setting)) for setting in args.lookahead]
    methods = Methods(main, draft, tokenizer)

    progress("cost model")
    calibration = tokenizer.encode(speed.CALIBRATION_PROMPT)
    text = methods.call("baseline", None, speed.CALIBRATION_PROMPT, 0.0, 0, 240)
    text = calibration + text
    widths = sorted({k + 1 for k in args.ks} | {1 + (n - 1) * (w + g) for w, n, g, _ in
                                                args.lookahead} | {2, 8, 16})  # fmt: skip
    costs = speed.step_costs(main, draft, text, widths, reps=10 if args.quick else 30)
    costs["c_ngram"] = {k: speed.ngram_cost(text, k, costs["s1"], NGRAM) for k in args.ks}
    calibrated = calibrate(methods, configs, args.temperatures, tokens, costs,
                           repeats=1 if args.quick else 3)  # fmt: skip
    shapes = text_shapes(methods, workloads, tokens)

    results = bench_workloads(methods, configs, workloads, args.temperatures, tokens, args.runs,
                              next(main.parameters()).device)  # fmt: skip
    report = report_workloads(results, calibrated, costs, configs, workloads, tokenizer, tokens,
                              args.runs)  # fmt: skip
    for workload, shape in shapes.items():
        report[workload] = {"text": shape, **report[workload]}
    first4 = [p for ps in workloads.values() for p in ps][:BATCH]
    batched = bench_batch4(main, draft, tokenizer, drafters, first4, args.ks, tokens, args.runs)
    batch4 = report_batch4(*batched, drafters, args.ks, len(first4) * tokens)

    cost_model = {
        "cache_len": speed.CACHE_LEN,
        "main_step_ms": round(1e3 * costs["s1"], 4),
        "c_model": round(costs["c"], 3),
        "c_ngram": {f"k={k}": round(c, 4) for k, c in costs["c_ngram"].items()},
        "v": {
            f"cache={L}": {f"n={n}": round(x, 3) for n, x in v.items()}
            for L, v in costs["v"].items()
        },  # fmt: skip
        "calibrated_round": {
            f"{m} {config_name(m, s)} T={t:g}": {k: round(x, 3) for k, x in cal.items()}
            for ((m, s), t), cal in calibrated.items()
        },
    }
    return {
        "prompts_per_workload": args.prompts,
        "new_tokens_per_prompt": tokens,
        "ks": args.ks,
        "lookahead": [list(x) for x in args.lookahead],
        "temperatures": args.temperatures,
        "skipped": skipped,
        "workloads": report,
        f"batch{len(first4)}": batch4,
        "cost_model": cost_model,
        "what_if": what_if(report, costs, args.ks),
        "goals": check_goals(report),
    }


def bench_compiled(args, main, draft, tokenizer) -> dict:
    """--compiled: chapter 6's model drafter on static caches with compiled steps, against
    chapter 4's sampler and chapter 5's compiled sampler (see the module's docstring)."""
    compile = True if inductor_available()[0] else "eager"
    device = next(main.parameters()).device
    workloads = {w: spec["prompts"][: args.prompts] for w, spec in speed.WORKLOADS.items()}
    n_ctx = min(main.cfg.n_ctx, draft.cfg.n_ctx)
    everything = [p for ps in workloads.values() for p in ps] + [speed.CALIBRATION_PROMPT]
    longest = max(len(tokenizer.encode(p)) for p in everything)
    tokens = min(args.tokens, n_ctx - longest - max(args.ks) - 1)
    cached = CachedTransformerSampler(main, tokenizer)
    fast = FastTransformerSampler(main, tokenizer, compile=compile)
    generators = {k: FastSpeculativeGenerator(main, draft, tokenizer, k, compile) for k in args.ks}

    def call(name, ids, temperature, seed, n, stats=None):
        if name in ("cached", "fast"):
            sampler = cached if name == "cached" else fast
            out = sampler.sample(ids, n, temperature=temperature, seed=seed, stop_at_eos=False)
        else:
            out = generators[name].generate(ids, n, temperature=temperature, seed=seed,
                                            stop_at_eos=False, stats=stats)  # fmt: skip
        return out.tolist()[len(ids) :]

    names = ["cached", "fast", *args.ks]
    calibration = tokenizer.encode(speed.CALIBRATION_PROMPT)
    warm_up = {}
    for name in names:  # compiles each step (k: the draft step and the (k + 1)-token pass)
        start = time.perf_counter()
        for temperature in args.temperatures:
            call(name, calibration, temperature, 0, 10)
        warm_up[str(name)] = round(time.perf_counter() - start, 1)
    results = {}
    for run in range(args.runs):
        progress(f"compiled: run {run + 1}/{args.runs}")
        for workload, prompts in workloads.items():
            for temperature in args.temperatures:
                result = results.setdefault((workload, temperature), {
                    "seconds": {name: [0.0] * args.runs for name in names},
                    "stats": {k: SpeculativeStats() for k in args.ks},
                    "identical": {name: True for name in names[1:]},
                })  # fmt: skip
                for i, prompt in enumerate(prompts):
                    ids, seed = tokenizer.encode(prompt), 1000 * run + i
                    shift = (run * len(prompts) + i) % len(names)
                    outputs = {}
                    for name in names[shift:] + names[:shift]:
                        stats = result["stats"].get(name)
                        fn = lambda a=(name, ids, temperature, seed, tokens, stats): call(*a)  # noqa: E731
                        seconds, outputs[name] = timed(fn, device)
                        result["seconds"][name][run] += seconds
                    if temperature == 0:
                        for name in names[1:]:
                            result["identical"][name] &= outputs[name] == outputs["cached"]

    # The compiled steps alone, after 100 cached positions of the calibration text.
    # Each input is a view of an [1, n_ctx] buffer, as in the generators: dynamo guards strides,
    # and a view of another tensor would time a second compiled version.
    text = call("cached", calibration, 0.0, 0, speed.CACHE_LEN + max(args.ks) + 1)
    text = torch.tensor([calibration + text], device=device)
    text = torch.nn.functional.pad(text, (0, n_ctx - text.shape[1]))
    steps = {}
    for label, model in [("main", main), ("draft", draft)]:
        cache = StaticKeyValueCache(model.cfg, 1, device, model.embed.W_E.dtype)
        slots = torch.arange(speed.CACHE_LEN, device=device)
        forward_static(model, text[:, : speed.CACHE_LEN], cache, slots, slots[None])
        slot = torch.tensor([speed.CACHE_LEN], device=device)
        token = text[:, speed.CACHE_LEN : speed.CACHE_LEN + 1]  # as the generators feed it
        if label == "main":
            token = text[0, speed.CACHE_LEN : speed.CACHE_LEN + 1][None]  # as the sampler does
        step = fast.step if label == "main" else generators[args.ks[0]].draft_step
        steps[label] = lambda s=step, m=model, c=cache, t=token, sl=slot: s(m, c, t, sl, sl[None])
        # The same step eager, on the same cache, in the same interleaved runs: c eager and
        # compiled from one measurement (two records once disagreed: 0.29 and 0.548 compiled).
        steps[f"{label}_eager"] = lambda m=model, c=cache, t=token, sl=slot: decode_step(
            m, c, t, sl, sl[None]
        )
        if label == "main":
            for k, generator in generators.items():
                wide = torch.arange(speed.CACHE_LEN, speed.CACHE_LEN + k + 1, device=device)
                feed = text[:, speed.CACHE_LEN : speed.CACHE_LEN + k + 1]
                steps[k] = lambda g=generator, c=cache, f=feed, w=wide: g.verify(
                    main, f, c, w, w[None]
                )
    times, _ = interleaved_runs(steps, 10 if args.quick else 30)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    s1 = seconds["main"]
    c, v = seconds["draft"] / s1, {k: seconds[k] / s1 for k in args.ks}
    c_by_run = {  # c within each run: its spread says how far one run's c can be trusted
        mode: [d / m for d, m in zip(times[f"draft{tail}"], times[f"main{tail}"], strict=True)]
        for mode, tail in [("compiled", ""), ("eager", "_eager")]
    }

    report = {}
    for (workload, temperature), result in results.items():
        secs = result["seconds"]
        part = {
            "tokens_per_s": {
                str(name): round(len(workloads[workload]) * tokens * args.runs / sum(secs[name]), 1)
                for name in names
            },
            "fast_over_cached": round(median_ratio(secs["cached"], secs["fast"]), 3),
        }
        for k in args.ks:
            stats = result["stats"][k]
            alpha = stats.acceptance
            row = {
                "over_cached": round(median_ratio(secs["cached"], secs[k]), 3),
                "over_fast": round(median_ratio(secs["fast"], secs[k]), 3),
                "passes_per_token": round(stats.passes_per_token, 3),
                "alpha": round(alpha, 3),
                "textbook_over_fast": round(iid_tokens_per_pass(alpha, k) / (c * k + v[k]), 3),
            }
            if temperature == 0:
                row["identical"] = result["identical"][k]
            part[f"k={k}"] = row
        if temperature == 0:
            part["fast_identical"] = result["identical"]["fast"]
        report.setdefault(workload, {})[f"T={temperature:g}"] = part

    greedy = [
        (workload, k, by_t["T=0"][f"k={k}"])
        for workload, by_t in report.items()
        if "T=0" in by_t
        for k in args.ks
    ]
    goals = {}
    for goal, key, against in [
        ("goal1", "over_cached", "chapter 4's cached greedy sampler"),
        ("goal1_compiled", "over_fast", "chapter 5's compiled greedy sampler"),
    ]:
        if greedy:
            workload, k, best = max(greedy, key=lambda g, key=key: g[2][key])
            goals[goal] = verdict(
                best[key] >= 1.5 and best["identical"],
                target=f">= 1.5x {against}, same tokens",
                best=f"model k={k} on {workload} text",
                speedup=best[key],
            )
    return {
        "compiled": {
            "compile": "inductor" if compile is True else "dynamo traced, run eagerly",
            "prompts_per_workload": args.prompts,
            "new_tokens_per_prompt": tokens,
            "ks": args.ks,
            "temperatures": args.temperatures,
            "warm_up_seconds": warm_up,
            "costs": {
                "cache_len": speed.CACHE_LEN,
                "main_step_ms": round(1e3 * s1, 4),
                "main_step_eager_ms": round(1e3 * seconds["main_eager"], 4),
                "c": round(c, 3),
                "c_eager": round(seconds["draft_eager"] / seconds["main_eager"], 3),
                "c_within_runs": {
                    mode: {
                        "median": round(statistics.median(cs), 3),
                        "min": round(min(cs), 3),
                        "max": round(max(cs), 3),
                    }
                    for mode, cs in c_by_run.items()
                },
                "v": {f"n={k + 1}": round(x, 3) for k, x in v.items()},
            },
            "textbook_best_over_fast": max(
                (
                    (row["textbook_over_fast"], f"k={k} on {workload} text, {t}")
                    for workload, by_t in report.items()
                    for t, part in by_t.items()
                    for k in args.ks
                    for row in [part[f"k={k}"]]
                ),
                default=None,
            ),
            "workloads": report,
            "goals": goals,
        }
    }


def number_list(kind):
    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x.strip()]

    return parse


def lookahead_list(text: str) -> list[tuple[int, int, int, bool]]:
    """ "5,3,5/7,4,7,p" -> [(5, 3, 5, False), (7, 4, 7, True)]: (window, ngram, guesses,
    pool_from_prompt) settings; a trailing ",p" turns pool_from_prompt on."""
    settings = []
    for part in filter(None, text.split("/")):
        fields = part.split(",")
        pool = fields[-1].strip() == "p"
        try:
            numbers = tuple(int(x) for x in fields[: -1 if pool else None])
        except ValueError:
            numbers = ()
        if len(numbers) != 3 or numbers[0] < 1 or numbers[1] < 2 or numbers[2] < 0:
            raise argparse.ArgumentTypeError(
                "W,N,G triples (optionally W,N,G,p) with W >= 1, N >= 2, G >= 0"
            )
        settings.append((*numbers, pool))
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ks", type=number_list(int), default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--temperatures", type=number_list(float), default=[0.0, 0.7, 1.0])
    parser.add_argument(
        "--lookahead",
        type=lookahead_list,
        default=[(5, 3, 5, False), (5, 3, 5, True), (7, 4, 7, True)],
    )
    parser.add_argument("--tokens", type=int, default=150, help="new tokens per prompt")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per workload (1 or 2)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="a smoke test: k 1 and 3, T = 0")
    parser.add_argument(
        "--compiled", action="store_true", help="only the model drafter on compiled steps"
    )
    add_record_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.ks, args.temperatures, args.tokens, args.prompts = [1, 3], [0.0], 30, 1
        args.lookahead, args.runs = [(5, 3, 5, False), (5, 3, 5, True)], 1
    if args.runs < 1 or args.load < 0 or args.threads < 1 or args.tokens < 1:
        parser.error("--runs, --threads and --tokens must be >= 1, --load >= 0")
    if not 1 <= args.prompts <= 2:
        parser.error("--prompts: 1 or 2")
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
        "machine": {**machine(device), "load": args.load},
        "runs": args.runs,
    }
    with busy_processes(args.load), torch.inference_mode():
        run = bench_compiled if args.compiled else benchmark
        result.update(run(args, main_model, draft_model, tokenizer))
    result["wall_s"] = round(time.perf_counter() - start, 1)
    emit(result, args)


if __name__ == "__main__":
    main()
