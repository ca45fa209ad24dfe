"""Helpers the graded tests share with the machinery's and the peers' tests, declared once.

The graded tests' other helpers (`tests/graded/_*.py`: the oracles, the explainer, the checks
of one chapter) are private to `tests/graded` (an import-linter contract in pyproject.toml);
what a test outside it needs lives here, public, and the graded tests import it from here too
(`tests/graded/_oracles.py` re-exports the oracles below with its own).

- sampling statistics: a chi-square goodness-of-fit test with a stated false-failure
  probability (`ALPHA`, `assert_samples_follow`, `follows`, `assert_rows_independent`);
- tensors handed over: `assert_untouched`, `IN_PLACE`, and `N_SAMPLES` per distribution;
- HF's greedy `generate` on its static cache (`hf_static_greedy`);
- chapter 8's engine: the pool's invariants after a step, running an engine to its end, and
  greedy tokens against HF's with near-ties counted rather than hidden;
- the shipped models: the Llama model's name (`LLAMA_MODEL`) and what training recorded of a
  model (`model_metrics`); the mark of a test that needs Triton (`needs_triton`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
import warnings

import pytest
import torch

from utils.paths import MODELS_DIR
from utils.timing import patient

# --------------------------------------------------------------------------- sampling statistics

# A chi-square goodness-of-fit test with a stated false-failure probability.
#
# A correct sampler fails `assert_samples_follow` with probability about `alpha` (the chi-square
# approximation, valid because cells expecting fewer than 5 samples are pooled). Tests that make
# several comparisons add up their alphas (a union bound) and say so.

ALPHA = 1e-5  # per comparison; no graded test makes more than 10 -> at most 1e-4 per test


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square with df degrees of freedom (regularised upper gamma)."""
    return torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)
    ).item()


def chi2_critical(df: int, alpha: float) -> float:
    """The x with P(X > x) = alpha, by bisection."""
    low, high = 0.0, float(df) + 100.0 + 40.0 * df**0.5
    while chi2_sf(high, df) > alpha:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if chi2_sf(mid, df) > alpha:
            low = mid
        else:
            high = mid
    return high


def assert_token_ids(samples: torch.Tensor, v: int, what: str) -> None:
    """Every sample is a token id of a v-token distribution (before anything counts them)."""
    outside = (samples < 0) | (samples >= v)
    if outside.any():
        raise AssertionError(
            f"{what}: {int(outside.sum())} of {samples.numel()} samples are not token ids of "
            f"this distribution (for example {int(samples[outside][0])}; ids run from 0 to "
            f"{v - 1}). A -1 means that no token was chosen for that row."
        )


def assert_samples_follow(
    samples: torch.Tensor, probs: torch.Tensor, what: str, alpha: float = ALPHA
) -> None:
    """Fail (with a readable message) if `samples` (token ids) do not look drawn from `probs`.

    Tokens of probability 0 must never be drawn: that is checked exactly, not statistically.
    """
    probs = probs.double().cpu()
    probs = probs / probs.sum()
    samples = samples.flatten().cpu()
    n = samples.numel()
    assert_token_ids(samples, probs.numel(), what)
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    impossible = (probs == 0) & (counts > 0)
    if impossible.any():
        token = int(impossible.nonzero()[0])
        raise AssertionError(
            f"{what}: token {token} was sampled {int(counts[token])} times but should have "
            f"probability 0 (it is outside the kept set, or its logit is -inf)"
        )
    expected = probs * n
    big = expected >= 5
    obs_cells = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp_cells = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp_cells > 0
    obs_cells, exp_cells = obs_cells[keep], exp_cells[keep]
    df = obs_cells.numel() - 1
    if df < 1:
        return  # a single possible outcome, and no impossible token was drawn
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    critical = chi2_critical(df, alpha)
    if stat > critical:
        worst = ((obs_cells - exp_cells).abs() / exp_cells.sqrt()).argmax()
        raise AssertionError(
            f"{what}: the sampled frequencies do not match the expected probabilities "
            f"(chi-square {stat:.1f} > {critical:.1f} with {df} degrees of freedom; a correct "
            f"sampler fails this check with probability {alpha:g}). Largest deviation: "
            f"{int(obs_cells[worst])} samples where {float(exp_cells[worst]):.1f} were expected."
        )


def follows(samples: torch.Tensor, probs: torch.Tensor, alpha: float = ALPHA) -> bool:
    """Whether `samples` pass `assert_samples_follow` against `probs`. Used only to word a
    failure message (to recognise a known mistake), never to decide whether a test fails."""
    try:
        assert_samples_follow(samples, probs, "", alpha)
    except AssertionError:
        return False
    return True


# Row distances at which two rows' random numbers could collide through a wrong offset: next
# rows (a row stride too small: `row + i` for `row * rounds + i`), and the distances around
# powers of two where programs of many rows meet (`program_id + arange` for
# `program_id * BLOCK + arange`).
PAIR_SHIFTS = (1, 2, 3, 4, 5, 7, 8, 9) + tuple(
    s for b in (16, 32, 64, 128, 256, 512, 1024) for s in (b - 1, b, b + 1)
)


def assert_rows_independent(
    samples: torch.Tensor, probs: torch.Tensor, what: str, alpha: float = ALPHA
) -> None:
    """Rows with the same input must draw independently: for each distance s of PAIR_SHIFTS,
    the tokens of rows i and i + s, as pairs, follow probs x probs (chi-square). The pairs of
    one distance are disjoint (row i is paired with i + s when i // s is even), so under
    independence they are independent samples; `alpha` is split over the distances (a union
    bound): a correct sampler fails with probability at most `alpha`."""
    probs = probs.double().cpu()
    probs = probs / probs.sum()
    samples = samples.flatten().cpu()
    v, n = probs.numel(), samples.numel()
    assert_token_ids(samples, v, what)
    shifts = [s for s in PAIR_SHIFTS if 4 * s <= n]
    joint = torch.outer(probs, probs).flatten()
    for s in shifts:
        i = torch.arange(n - s)
        i = i[(i // s) % 2 == 0]
        assert_samples_follow(
            samples[i] * v + samples[i + s],
            joint,
            f"{what}: the tokens of rows i and i + {s} (same input) are not independent, "
            "as pairs. Does each row get its own random numbers? (a row's offset into the "
            "random stream must not overlap another row's)",
            alpha=alpha / len(shifts),
        )


# --------------------------------------------------------------------------- tensors handed over

N_SAMPLES = 20_000  # per distribution: enough to expose a temperature off by 20%


def assert_untouched(tensor: torch.Tensor, before: torch.Tensor, who: str, hint: str) -> None:
    """`tensor`, which the test handed to `who`, still equals `before` (a copy taken first)."""
    assert torch.equal(tensor, before), (
        f"{who} changed its input in place: the tensor the caller passed in is no longer what "
        f"it was. {hint} Return a new tensor and leave the argument alone: the caller may still "
        "need it (samplers chain these functions and reuse their inputs)."
    )


IN_PLACE = (
    "`logits /= ...`, `logits -= ...`, `masked_fill_` (with the underscore) and "
    "`logits[mask] = ...` write into the caller's tensor; `logits / ...`, `logits - ...` and "
    "`masked_fill` (no underscore) return a new one."
)

# --------------------------------------------------------------------------- HF's static cache


def hf_static_greedy(hf, ids: list[int], n: int, stop_at_eos: bool) -> list[int]:
    """HF's greedy `generate` on ITS static cache (transformers' StaticCache)."""
    eos = hf.generation_config.eos_token_id
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, top_k=None,
            cache_implementation="static", pad_token_id=eos,
            eos_token_id=eos if stop_at_eos else None,
        )  # fmt: skip
    return out[0].tolist()


# --------------------------------------------------------------------------- chapter 8's engine

PROMPTS = [  # a one-token prompt among them; the longest needs several chunks
    "ROMEO.\nBut soft, what light through yonder window breaks?",
    "\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "KING LEAR.\nMeantime we shall express our darker purpose.",
    "HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler",
]


def uneven_chunks(lengths: list[int], chunks) -> list[list[tuple[int, int, int]]]:
    """The steps of a paged forward that feeds request r `chunk[r]` more of its `lengths[r]`
    tokens per step (what is left, at its end): per step, `(r, num_computed, num_new)` of each
    request fed. Steps that would feed nothing are left out."""
    computed, steps = [0] * len(lengths), []
    for chunk in chunks:
        step = []
        for r, length in enumerate(lengths):
            n = min(chunk[r], length - computed[r])
            if n:
                step.append((r, computed[r], n))
                computed[r] += n
        if step:
            steps.append(step)
    return steps


NEAR_TIE = 1e-4
"""Two logits closer than this (float32 rounding of a sum of a few hundred terms, with room)
are a near-tie: a different batch shape may round them the other way."""


def invariant_problems(engine) -> list[str]:
    """What is wrong with the engine's pool after a step (empty when nothing is): each block's
    count is its holders, the free queue is exactly the unheld blocks, every name points at its
    block, a running request's table covers its computed tokens with less than one block to
    spare, a waiting one holds none, at most `max_num_seqs` run, a finished one holds none."""
    pool, size = engine.kv.pool, engine.block_size
    running, waiting = engine.scheduler.running, list(engine.scheduler.waiting)
    problems = []
    holders = {block.block_id: 0 for block in pool.blocks}
    for request in running:
        table = request.block_ids  # the one block table
        if request.status.name != "RUNNING":
            problems.append(f"running request {request.request_id} has status {request.status}")
        if len(set(table)) != len(table):
            problems.append(f"request {request.request_id} holds a block twice")
        if len(table) != math.ceil(request.num_computed_tokens / size):
            problems.append(
                f"request {request.request_id} holds {len(table)} blocks of {size} for "
                f"{request.num_computed_tokens} computed tokens"
            )
        for block_id in table:
            holders[block_id] += 1
    for request in waiting:
        if request.block_ids:
            problems.append(f"waiting request {request.request_id} still holds blocks")
        if request.num_computed_tokens != 0:
            problems.append(f"waiting request {request.request_id} keeps computed tokens")
    for block in pool.blocks:
        if block.ref_cnt != holders[block.block_id]:
            problems.append(
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by "
                f"{holders[block.block_id]} requests"
            )
        if (block.block_id in pool.free_queue) != (block.ref_cnt == 0):
            problems.append(
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                f"{'in' if block.block_id in pool.free_queue else 'not in'} the free queue"
            )
    for block_hash, block in pool.cached.items():
        if block.block_hash != block_hash:
            problems.append(f"a name in pool.cached points at block {block.block_id}, not named so")
    if len(running) > engine.scheduler.max_num_seqs:
        problems.append(
            f"{len(running)} requests run, max_num_seqs is {engine.scheduler.max_num_seqs}"
        )
    queued = {id(request) for request in running + waiting}
    for request in engine.requests.values():
        if request.is_finished and request.block_ids:
            problems.append(f"finished request {request.request_id} still holds blocks")
        if not request.is_finished and id(request) not in queued:
            problems.append(
                f"request {request.request_id} is not finished, yet neither waiting nor running "
                f"(status {request.status.name}): it left the queue without being admitted, and "
                "no step will ever serve it. Is the head of the queue taken off (popleft) "
                "before allocate_slots has said yes?"
            )
    return problems


def settle(async_engine) -> list[str]:
    """Wait until the engine has nothing left to run, then the pool's invariants (read in the
    loop, between two steps), every block free and no stream's record kept: what a server owes
    after every request it answered, refused or lost, whatever the request was."""
    deadline = time.monotonic() + patient(20)
    while async_engine.call(lambda e: e.has_unfinished_requests()).result(patient(10)):
        assert time.monotonic() < deadline, "the engine still runs requests nobody waits for"
        time.sleep(0.02)

    def problems(engine):
        pool = engine.kv.pool
        held = [b.block_id for b in pool.blocks if b.ref_cnt]
        found = invariant_problems(engine)
        kept = list(async_engine.processor.states)  # the one record of a request, its stream's
        return (
            found
            + ([f"blocks {held} are still held by no request"] if held else [])
            + ([f"the server still keeps the ended requests {kept}"] if kept else [])
        )

    return async_engine.call(problems).result(patient(10))


def scheduler_problems(scheduler) -> list[str]:
    """What is wrong with a scheduler's requests and pool right after `schedule()` (empty when
    nothing is): a request left waiting holds no blocks, and each block's count is its holders
    (running and waiting requests alike), so that a block given to a request not admitted shows
    twice."""
    pool = scheduler.kv.pool
    problems = []
    holders = {block.block_id: 0 for block in pool.blocks}
    for request in scheduler.running:
        for block_id in request.block_ids:
            holders[block_id] += 1
    for request in scheduler.waiting:
        if request.block_ids:
            problems.append(
                f"request {request.request_id!r} is left waiting (not admitted in this step) "
                f"and holds blocks {list(request.block_ids)}: a request that stays in the queue "
                "holds no blocks, or they are lost to every other request until it runs. Was it "
                "given blocks before a check that then turned it away?"
            )
        for block_id in request.block_ids:
            holders[block_id] += 1
    for block in pool.blocks:
        if block.ref_cnt != holders[block.block_id]:
            problems.append(
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by "
                f"{holders[block.block_id]} requests' tables"
            )
    return problems


def check_invariants(engine) -> None:
    """Fail, naming every problem, unless the engine's pool holds its invariants now."""
    problems = invariant_problems(engine)
    assert not problems, "; ".join(problems)


def run_to_end(engine, max_steps: int = 5000, check=None) -> dict:
    """Step until nothing is left; every output of each request, in order. `check(engine)` runs
    after every step."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        if check is not None:
            check(engine)
    raise AssertionError(
        f"requests still unfinished after {max_steps} steps: does every scheduled request make "
        "progress, and is a request that cannot get blocks preempted rather than skipped?"
    )


def greedy_difference(hf, ids: list[int], got: list[int], n: int) -> tuple[list[int], str | None]:
    """HF's greedy continuation of `ids` (n tokens, past end-of-text), and what is wrong with
    `got`: None if equal, or equal up to a near-tie of HF's own logits at the first token where
    they part (rounding may decide it either way; reported by the caller, not hidden)."""
    want = hf_static_greedy(hf, ids, n, stop_at_eos=False)[len(ids) :]
    if got == want:
        return want, None
    step = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if step is None:
        return want, f"{len(got)} tokens where {len(want)} were asked for"
    with torch.inference_mode():
        logits = hf(torch.tensor([ids + want[:step]])).logits[0, -1]
    top2 = logits.topk(2).values
    if float(top2[0] - top2[1]) < NEAR_TIE and got[step] == int(logits.topk(2).indices[1]):
        warnings.warn(
            f"a near-tie at token {step} decided the other way (reported, allowed)", stacklevel=2
        )
        return want, None
    return want, f"token {step} is {got[step]} where HF's greedy token is {want[step]}"


# --------------------------------------------------------------------------- the shipped models

LLAMA_MODEL = "shakespeare-llama"
"""The shipped Llama-architecture model (chapter 7; HF LlamaForCausalLM format)."""


def model_metrics(name: str) -> dict:
    """What training recorded of a shipped model (models/NAME/metrics.json)."""
    return json.loads((MODELS_DIR / name / "metrics.json").read_text())


# Chapter 10's kernels, their compiler and their benchmark need Triton, a Linux-only dependency.
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="chapter 10 needs Triton (Linux)"
)
