"""Serving a trace: requests that arrive over time, two ways to serve them, and what a user of
each feels (chapter 8's measurements, and `benchmarks/serving.py`'s). Measuring machinery, not
the course's reference code: it drives `solutions`' engine and chapter 4's batching against the
wall clock, and reads its prompts from the corpus.

A **trace** is a list of requests, each with its arrival time (seconds from the start), its
prompt's token ids and its answer's length. Both servers run against the wall clock: a request
exists only from its arrival.

- `serve_static`: chapter 4's batching. Requests are taken in arrival order, `batch` at a time;
  a batch starts when its last request has arrived and the batch before it has finished, is
  padded to its longest prompt and runs until its longest answer is written.
- `serve_engine`: chapter 8's `LLMEngine`, stepped whenever a request waits or runs.

What a user feels: the **time to first token** (TTFT: from arrival to the first token) and the
**time per output token** after the first (TPOT); what the operator pays for: **throughput**
(answer tokens per second of the whole run). Medians say what is typical, 99th percentiles what
the unluckiest one in a hundred waits.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.batched import left_pad
from solutions.engine import LLMEngine
from solutions.sampling_params import SamplingParams
from utils.corpus import load_plays
from utils.timing import sig

LLAMA_MODEL = "shakespeare-llama"  # chapter 7's model, served beside the GPT-2 one (a folder works)


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    arrival: float  # seconds from the trace's start
    prompt: list[int]
    max_tokens: int


@functools.cache
def play_tokens(tokenizer) -> list[int]:
    """The first 50,000 characters of the first play, as tokens: where prompts are cut from."""
    return tokenizer.encode(next(iter(load_plays().values()))[:50_000])


def poisson_trace(
    tokenizer, n: int, rate: float, seed: int, prompt_lens=(4, 60), answer_lens=(16, 160)
) -> list[TraceRequest]:
    """n requests arriving as a Poisson process of `rate` per second (the gaps between arrivals
    are exponential), prompts cut from the plays, lengths drawn uniformly from the ranges."""
    rng = random.Random(seed)
    text = play_tokens(tokenizer)
    requests, now = [], 0.0
    for i in range(n):
        now += rng.expovariate(rate)
        length, start = rng.randint(*prompt_lens), rng.randrange(len(text) - prompt_lens[1])
        prompt = text[start : start + length]
        requests.append(TraceRequest(str(i), now, prompt, rng.randint(*answer_lens)))
    return requests


def all_at_once_trace(
    n: int, seed: int, prompt_lens=(4, 60), answer_lens=(16, 160), ids=(50, 4000)
) -> list[TraceRequest]:
    """n requests, all present at the start, prompts of token ids drawn uniformly from `ids`
    (no text: the engine's speed, not its answers, is measured), lengths drawn uniformly from
    the ranges (benchmarks/serving.py's prefill-rate probe)."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = [rng.randrange(*ids) for _ in range(rng.randint(*prompt_lens))]
        requests.append(TraceRequest(str(i), 0.0, prompt, rng.randint(*answer_lens)))
    return requests


def shared_prefix_trace(
    tokenizer, n: int, seed: int, prefix: int = 128, answer_lens=(16, 64)
) -> list[TraceRequest]:
    """n requests, all at once, each prompt a shared `prefix`-token preamble (a system prompt)
    and 4 to 30 tokens of its own."""
    rng = random.Random(seed + 1)
    text = play_tokens(tokenizer)
    shared = text[:prefix]
    requests = []
    for i in range(n):
        start = rng.randrange(prefix, len(text) - 30)
        own = text[start : start + rng.randint(4, 30)]
        requests.append(TraceRequest(str(i), 0.0, shared + own, rng.randint(*answer_lens)))
    return requests


def percentiles(seconds: list[float]) -> dict:
    """Median and 99th percentile (the nearest-rank one), in milliseconds."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    # significant figures, not fixed decimals: a fast machine's 0.04 ms must not read as 0
    return {"median": sig(1e3 * statistics.median(ordered), 3), "p99": sig(1e3 * p99, 3)}


@dataclass
class Served:
    """What a server did with a trace: when each request's first and last tokens came (seconds
    from the start), its tokens, and the KV positions reserved and used at the fullest moment.
    `timeline`, `blocks_in_use`, `running` and `waiting`: the engine's steps (what each request
    computed, the blocks its running requests held, how many ran and how many waited after the
    step), for the chapter's figures."""

    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    kv_reserved: int = 0
    kv_used: int = 0
    kv_requests: int = 0  # the requests holding it
    timeline: list[dict[str, tuple[str, int]]] = field(default_factory=list)
    blocks_in_use: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    def record(self, outputs, now: float) -> list:
        """An engine step's outputs at `now`: a request's first and latest token times, and its
        tokens once it finishes. Returns the outputs of the requests that finished."""
        finished = []
        for output in outputs:
            if output.new_token_ids:
                self.first.setdefault(output.request_id, now)
                self.last[output.request_id] = now
            if output.finished:
                self.tokens[output.request_id] = output.output_token_ids
                finished.append(output)
        return finished

    def summary(self, requests: list[TraceRequest]) -> dict:
        """Throughput, TTFT and TPOT (medians and 99th percentiles) over the trace."""
        ttft = [self.first[r.request_id] - r.arrival for r in requests]
        tpot = [(self.last[r.request_id] - self.first[r.request_id]) / max(r.max_tokens - 1, 1)
                for r in requests]  # fmt: skip
        span = max(self.last.values()) - min(r.arrival for r in requests)
        return {
            "tokens_per_s": round(sum(r.max_tokens for r in requests) / span, 1),
            "ttft_ms": percentiles(ttft),
            "tpot_ms": percentiles(tpot),
            "seconds": round(span, 2),
        }


def _wait_until(start: float, moment: float) -> None:
    while time.perf_counter() - start < moment:
        time.sleep(0.0005)


@torch.inference_mode()
def serve_static(model, tokenizer, requests: list[TraceRequest], batch: int) -> Served:
    """Chapter 4's batching, greedy, every answer its own length (a finished row keeps
    computing: the batch runs until its longest answer is written)."""
    served, start = Served(), time.perf_counter()
    for b in range(0, len(requests), batch):
        group = requests[b : b + batch]
        _wait_until(start, group[-1].arrival)  # the batch waits for its last request
        ids, mask = left_pad([r.prompt for r in group], pad_id=tokenizer.eos_token_id)
        steps = max(r.max_tokens for r in group)
        # The padded batch's cache holds every row for the longest prompt and answer; its
        # requests use their own prompt and answer. Kept for the batch that reserves most.
        reserved = len(group) * checks.positions_read(ids.shape[1], steps)
        if reserved > served.kv_reserved:
            served.kv_reserved, served.kv_requests = reserved, len(group)
            served.kv_used = sum(checks.positions_read(len(r.prompt), r.max_tokens) for r in group)
        logits, cache = forward_with_cache(model, ids, attention_mask=mask)
        for r in group:
            served.tokens[r.request_id] = []
        for step in range(steps):
            token = logits[:, -1].argmax(dim=-1)
            now = time.perf_counter() - start
            for row, r in enumerate(group):
                if step < r.max_tokens:
                    served.tokens[r.request_id].append(int(token[row]))
                    served.first.setdefault(r.request_id, now)
                    served.last[r.request_id] = now
            if step < steps - 1:
                logits, cache = forward_with_cache(model, token[:, None], cache)
    return served


def serve_engine(
    model,
    tokenizer,
    requests: list[TraceRequest],
    block_size: int = 16,
    engine_cls=LLMEngine,
    **engine_args,
) -> tuple[Served, LLMEngine]:
    """An engine (`engine_cls`: the chapter's, or yours), greedy. Unless `num_blocks` is given,
    the pool holds the whole trace at once; a budget of 512 tokens a step and 32 seats unless
    given."""
    needed = sum(math.ceil((len(r.prompt) + r.max_tokens) / block_size) for r in requests)
    engine_args = {"num_blocks": needed, "max_num_batched_tokens": 512, "max_num_seqs": 32,
                   **engine_args}  # fmt: skip
    engine = engine_cls(model, tokenizer, block_size=block_size, **engine_args)
    served, start = Served(), time.perf_counter()
    pending = list(requests)
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
            engine.add_request(r.request_id, r.prompt, params)
        if not engine.has_unfinished_requests():
            time.sleep(0.0005)
            continue
        served.record(engine.step(), time.perf_counter() - start)
        stats = engine.stats  # the engine's report, after the step
        served.timeline.append(dict(stats.last_step))  # the step's plan, as counted
        served.running.append(stats.running)
        served.waiting.append(stats.waiting)
        served.blocks_in_use.append(stats.running_table_blocks)
        reserved = block_size * stats.running_table_blocks
        if reserved > served.kv_reserved:
            served.kv_reserved = reserved
            served.kv_used = stats.running_computed_tokens
            served.kv_requests = stats.running
    return served, engine
