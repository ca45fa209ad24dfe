"""Timing that holds up on a shared machine: one PyTorch thread, the fastest of a few runs.

On a busy machine, a parallel operation waits for its slowest thread, and one noisy run says
more about the neighbours than about the code: the minimum of a few runs is the closest to what
the code costs. Chapters 4 and 6 time their demos with these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one PyTorch thread, then restore the previous setting."""
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
