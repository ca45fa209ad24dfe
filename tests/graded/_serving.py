"""Checks shared by chapter 8's graded tests and the engine's machinery tests: the pool's
invariants after a step, running an engine to its end, and greedy tokens against HF's with
near-ties counted rather than hidden."""

from __future__ import annotations

import math
import warnings

import torch

from tests.graded._oracles import hf_static_greedy

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
    for request in engine.requests.values():
        if request.is_finished and request.block_ids:
            problems.append(f"finished request {request.request_id} still holds blocks")
    return problems


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
