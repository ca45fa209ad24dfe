"""Timing that holds up on a shared machine: one PyTorch thread, the fastest of a few runs, and
time limits that a busy machine does not trip.

On a busy machine, a parallel operation waits for its slowest thread, and one noisy run says
more about the neighbours than about the code: the minimum of a few runs is the closest to what
the code costs. Chapters 4 and 6 time their demos with these.

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
