"""What speculative and lookahead decoding cost, and the speed-up a cost model predicts from it.

Chapter 6's section 7 and `benchmarks/speculative.py` both use this module, so that the notebook
and the benchmark measure the same things the same way:

- the workloads: open-ended text, greedy text that loops, and an input-grounded task;
- a main-model step `s1` (one token after a cache), `c` (a draft-model step over s1), `v(n)`
  (a main-model pass over n new tokens over s1), each the median of interleaved timings;
- the per-round fixed cost `f`: everything a round does that is not a forward pass or the
  n-gram lookup (the sampler, trimming the caches, Python), measured by timing a run and the
  forward passes inside it, on a calibration prompt that is none of the workloads' prompts;
- the prediction: a round costs c k + v(k + 1) + f main steps (lookahead: v(its width) + f),
  and emits `tokens_per_pass` tokens; against a baseline whose token costs `b` main steps,
  the speed-up is b * tokens_per_pass / round_cost.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch

from solutions import drafters, lookahead, speculative_generation
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from utils.timing import interleaved_medians

WORKLOADS: dict[str, dict] = {
    "open-ended": {
        "prompts": ["ROMEO.\n", "KING LEAR.\nBlow, winds,"],
        "about": "of the prompts tried, the two whose greedy text repeats itself least",
    },
    "looping": {
        "prompts": [
            "ROMEO.\nBut soft, what light",
            "OTHELLO.\nIt is the cause, it is the cause, my soul.",
        ],
        "about": 'greedy text that falls into a loop of short lines ("I am not so.")',
    },
    "input-grounded": {
        "prompts": [
            "HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the "
            "mind to suffer\nThe slings and arrows of outrageous fortune,\n\nHORATIO.\nSay it "
            "again, my lord.\n\nHAMLET.\nTo be,",
            "PORTIA.\nThe quality of mercy is not strain'd,\nIt droppeth as the gentle rain "
            "from heaven\nUpon the place beneath.\n\nNERISSA.\nSay it again, madam.\n\nPORTIA."
            "\nThe quality",
        ],
        "about": "a passage, then a cue to say it again: the text to write is in the prompt",
    },
}
"""Three kinds of text. Greedy text from the shipped model loops on most prompts; sampled at a
temperature above 0, the text of these prompts hardly repeats itself (`repeat_rate`)."""

CALIBRATION_PROMPT = "MACBETH.\nIs this a dagger which I see before me,"
CACHE_LEN = 100  # cached positions behind the timed steps


def repeat_rate(ids: list[int], start: int, n: int = 4) -> float:
    """The fraction of the tokens after `start` that end an n-gram seen earlier in `ids`: about
    0 for text that never repeats, near 1 for a loop."""
    seen, hits = set(), 0
    for end in range(n, len(ids) + 1):
        gram = tuple(ids[end - n : end])
        hits += end > start and gram in seen
        seen.add(gram)
    return hits / max(len(ids) - start, 1)


def copy_rate(ids: list[int], start: int, n: int = 4) -> float:
    """The fraction of the tokens after `start` that end an n-gram of the prompt `ids[:start]`:
    how much of the continuation is copied from the prompt."""
    grams = {tuple(ids[i : i + n]) for i in range(start - n + 1)}
    return sum(tuple(ids[end - n : end]) in grams for end in range(start + 1, len(ids) + 1)) / max(
        len(ids) - start, 1
    )


@torch.inference_mode()
def step_costs(
    main, draft, text: list[int], widths: list[int], cache_lens=(40, 160), reps: int = 30
) -> dict:
    """s1 (seconds: one main-model token after CACHE_LEN cached positions), c (the draft
    model's step over s1) and v[cache_len][n] (a main-model pass over n new tokens after
    cache_len cached positions, over s1) on the tokens of `text`. A pass's cost grows with the
    cache it reads: the prediction interpolates between the two cache lengths."""
    longest = max(max(cache_lens), CACHE_LEN) + max(widths)
    if len(text) < longest:
        raise ValueError(f"text must hold at least {longest} tokens, got {len(text)}")
    steps = {}
    for cache_len in sorted({CACHE_LEN, *cache_lens}):
        cache = forward_with_cache(main, torch.tensor([text[:cache_len]]))[1]
        for n in sorted({1, *widths}):
            feed = torch.tensor([text[cache_len : cache_len + n]])
            steps[(cache_len, n)] = partial(forward_with_cache, main, feed, cache)
    draft_cache = forward_with_cache(draft, torch.tensor([text[:CACHE_LEN]]))[1]
    feed = torch.tensor([text[CACHE_LEN : CACHE_LEN + 1]])
    steps["draft"] = partial(forward_with_cache, draft, feed, draft_cache)
    seconds = interleaved_medians(steps, reps)
    s1 = seconds[(CACHE_LEN, 1)]
    v = {L: {n: seconds[(L, n)] / s1 for n in sorted({1, *widths})} for L in cache_lens}
    return {"s1": s1, "c": seconds["draft"] / s1, "v": v}


def ngram_cost(text: list[int], k: int, s1: float, n: int = 2, reps: int = 5) -> float:
    """c for the n-gram drafter: one `ngram_propose` of k tokens over k, in main steps, averaged
    over every prefix of `text` longer than 20 tokens."""
    prefixes = [text[:end] for end in range(20, len(text) + 1)]
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        for prefix in prefixes:
            drafters.ngram_propose(prefix, k, n)
        runs.append((time.perf_counter() - start) / len(prefixes))
    return statistics.median(runs) / k / s1


def _interpolate(points: dict[float, float], x: float) -> float:
    """Linear through the two nearest points (beyond the ends: the two end points' line)."""
    xs = sorted(points)
    low, high = xs[0], xs[1]
    for a, b in zip(xs, xs[1:], strict=False):
        low, high = a, b
        if x <= b:
            break
    return points[low] + (points[high] - points[low]) * (x - low) / (high - low)


def v_at(costs: dict, width: float, cache_len: float) -> float:
    """v for a pass of `width` new tokens (a mean: not a whole number) after `cache_len` cached
    positions, interpolated between the measured widths and cache lengths."""
    by_cache = {L: _interpolate(v, width) for L, v in costs["v"].items()}
    return _interpolate(by_cache, cache_len)


@contextmanager
def model_clock(main, namespace: dict | None = None) -> Iterator[dict[str, float]]:
    """Within the block, the seconds the course's generators spend in the main model's forward
    passes ("main"), in other models' ("draft") and in the n-gram lookup ("lookup") add up in
    the yielded dict. A notebook's generators read `forward_with_cache` and `ngram_propose`
    from the notebook's own globals: pass them as `namespace` to clock those too."""
    spent = {"main": 0.0, "draft": 0.0, "lookup": 0.0}

    def clocked(fn, kind=None):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = kind or ("main" if args[0] is main else "draft")
                spent[key] += time.perf_counter() - start

        return run

    originals = [(m, "forward_with_cache", m.forward_with_cache, None)
                 for m in (drafters, lookahead, speculative_generation)]  # fmt: skip
    originals.append((drafters, "ngram_propose", drafters.ngram_propose, "lookup"))
    saved = {}
    try:
        for m, name, fn, kind in originals:
            setattr(m, name, clocked(fn, kind))
        for name, kind in (("forward_with_cache", None), ("ngram_propose", "lookup")):
            if namespace is not None and name in namespace:
                saved[name] = namespace[name]
                namespace[name] = clocked(saved[name], kind)
        yield spent
    finally:
        for m, name, fn, _ in originals:
            setattr(m, name, fn)
        if namespace is not None:
            namespace.update(saved)


def round_costs(
    run: Callable[[object], object],
    stats_factory,
    main,
    s1: float,
    repeats: int = 3,
    namespace: dict | None = None,
) -> dict:
    """What a round costs, measured inside real runs, in main steps (medians of `repeats` runs
    after a warm-up): "drafting" (the draft model's passes, or the n-gram lookup), "pass" (the
    main model's pass), "f" (the rest: the sampler, trimming caches, Python); with the run's
    mean pass width and mean cached length, for scaling the pass to another text.
    `run(stats)` generates once, counting into `stats`; `namespace`: see `model_clock`."""
    run(stats_factory())
    parts = {"drafting": [], "pass": [], "f": []}
    for _ in range(repeats):
        stats = stats_factory()
        with model_clock(main, namespace) as spent:
            start = time.perf_counter()
            run(stats)
            total = time.perf_counter() - start
        rounds = stats.main_passes * s1
        drafting = spent["draft"] + spent["lookup"]
        parts["drafting"].append(drafting / rounds)
        parts["pass"].append(spent["main"] / rounds)
        parts["f"].append((total - drafting - spent["main"]) / rounds)
    costs = {name: statistics.median(values) for name, values in parts.items()}
    return {**costs, "width": stats.mean_width, "tokens": stats.tokens}


def predicted_round_cost(calibrated: dict, costs: dict, width: float, cache_len: float,
                         calibration_cache_len: float) -> float:  # fmt: skip
    """A round's cost on another text: drafting and f as calibrated; the main model's pass
    scaled by the isolated timings v from the calibration's (width, cached length) to this
    text's."""
    scale = v_at(costs, width, cache_len) / v_at(costs, calibrated["width"], calibration_cache_len)
    return calibrated["drafting"] + calibrated["pass"] * scale + calibrated["f"]


def predicted_speedup(
    baseline_steps_per_token: float, tokens_per_pass: float, cost: float
) -> float:
    """b * tokens per pass / round cost: the baseline's cost per token over the method's."""
    return baseline_steps_per_token * tokens_per_pass / cost
