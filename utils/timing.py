"""Timing that holds up on a shared machine: one PyTorch thread, the fastest of a few runs, and
time limits that a busy machine does not trip.

On a busy machine, a parallel operation waits for its slowest thread, and one noisy run says
more about the neighbours than about the code: the minimum of a few runs is the closest to what
the code costs. Chapters 4 and 6 time their demos with these. The benchmarks' helpers live here
too (a call timed on a GPU, the median of many short calls, methods timed in interleaved runs,
ratios within runs, busy processes): one home for each. What a record says of its figures (the
machine, rates, goals' verdicts) and the writing of it are utils/records.py's.

A time limit in a test is there to catch a hang, not to measure speed. Every limit the tests
set (pytest-timeout's, a subprocess's, the grader's per-test budget, an elapsed-time assertion)
is written for an idle machine and passed through `patient`, which multiplies it by one
setting, COURSE_TIME_SCALE (default 1: a learner's `check()` and `pytest` keep the budgets
they always had). `make test` sets it, since a loaded 2-core machine ran the suite 5.6 times
slower than an idle one (56 minutes against 10). A limit that waits on an inner one is the
longer of the two at every scale, since both are scaled alike.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TIME_SCALE_VARIABLE = "COURSE_TIME_SCALE"


def time_scale() -> float:
    """How many times longer than on an idle machine a time limit allows (COURSE_TIME_SCALE)."""
    raw = os.environ.get(TIME_SCALE_VARIABLE, "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{TIME_SCALE_VARIABLE} must be a number >= 1, got {raw!r}") from None
    if not scale >= 1:
        raise ValueError(f"{TIME_SCALE_VARIABLE} must be a number >= 1, got {raw!r}")
    return scale


def patient(seconds: float) -> float:
    """A time limit written for an idle machine, stretched for this one (`time_scale`)."""
    return seconds * time_scale()


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one PyTorch thread, then restore the previous setting."""
    import torch  # here, not at the top: the time limits above serve torch-free processes too

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def best_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    """The fastest of `repeats` timed calls, after one warm-up call (one-time costs)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


# --------------------------------------------------------------------------- measuring helpers
# One home for each, used by the chapters, the benchmarks and the tests alike.


def _synchronize(device) -> None:
    """Drain the GPU's queue before a clock is read (a CPU needs nothing)."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device=None) -> tuple[float, object]:
    """(seconds, result) of one call of `fn`; on a GPU, what it queued is finished first."""
    _synchronize(device)
    start = time.perf_counter()
    out = fn()
    _synchronize(device)
    return time.perf_counter() - start, out


def median_seconds(
    run: Callable[[], object], runs: int = 5, calls: int = 50, warmup: int = 1, device=None
) -> float:
    """The median over `runs` (at least 3) of a call's mean time over `calls` calls in a row,
    after `warmup` untimed calls. For a call too short to time alone (one decoding step)."""
    for _ in range(warmup):
        run()
    means = []
    for _ in range(max(runs, 3)):
        seconds, _ = timed(lambda: [run() for _ in range(calls)], device)
        means.append(seconds / calls)
    return statistics.median(means)


def interleaved_runs(
    methods: dict[str, Callable[[], object]],
    runs: int,
    reference: str | None = None,
    progress: Callable[[str], None] | None = None,
    device=None,
) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """Each method called `runs` times, in a rotated order each run (a busy spell of the machine
    hits all of them), after one untimed call each. Returns each method's seconds per run and,
    with a `reference`, whether every call gave what `reference`'s first call gave (`==`)."""
    first = {name: fn() for name, fn in methods.items()}  # warm-up
    expected = first[reference] if reference is not None else None
    same = {name: reference is None or out == expected for name, out in first.items()}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for run in range(runs):
        names = list(methods)
        for name in names[run % len(names) :] + names[: run % len(names)]:
            seconds, out = timed(methods[name], device)
            times[name].append(seconds)
            same[name] &= reference is None or out == expected
        if progress is not None:
            progress(f"run {run + 1} of {runs} done")
    return times, same


def interleaved_medians(methods: dict, runs: int, device=None) -> dict:
    """Each method's median seconds over `interleaved_runs` (for calls whose outputs need no
    comparing: steps of a model)."""
    times, _ = interleaved_runs(methods, runs, device=device)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def median_ratio(slow: list[float], fast: list[float]) -> float:
    """The median over runs of slow / fast seconds: a speed-up measured within each run, so that
    a busy spell, which slows both alike, cancels."""
    return statistics.median(s / f for s, f in zip(slow, fast, strict=True))


def ratio_within_runs(times: dict[str, list[float]], fast: str, slow: str) -> float | None:
    """`median_ratio` of two of `interleaved_runs`' methods, to 2 decimals (None if either was
    not timed)."""
    if fast not in times or slow not in times:
        return None
    return round(median_ratio(times[slow], times[fast]), 2)


def sig(x: float, digits: int = 4) -> float:
    """x to `digits` significant digits: a time or a ratio of 0.0004 must not be recorded as 0.0
    (a figure rounded to fixed decimals reads 0 on a machine fast enough)."""
    return float(f"{x:.{digits}g}")


def _busy(stop) -> None:
    """A stand-in for another job: small and large matrix products, until told to stop."""
    import torch

    small, large = torch.randn(64, 192), torch.randn(512, 512)
    while not stop.is_set():
        for _ in range(50):
            small @ small.T
        large @ large


@contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """`n` busy processes for the duration of the block, to see what a shared machine does to a
    measurement (spawned: a fork would inherit torch's thread pool in a state it cannot use)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    workers = [ctx.Process(target=_busy, args=(stop,), daemon=True) for _ in range(n)]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
