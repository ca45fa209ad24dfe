"""A model of what one decoding step costs: dispatches, arithmetic, and what grows with position.

Chapter 4's cached step computes one position yet costs several times a position's share of a
long forward pass. A three-term model says where the time goes:

    seconds = per_op * n_ops + per_flop * flops + per_cached * cached

- `n_ops`: the operations the step dispatches (counted by `torch.profiler`). Each costs about the
  same fixed time whatever its size: Python, PyTorch's dispatcher, a new tensor for its result.
- `flops`: the arithmetic (a multiply-add counts 2). `1 / per_flop` is the rate it runs at.
- `cached`: the numbers of the cache the step reads (keys and values of every earlier position,
  every layer, every row), which cost more than their arithmetic: they are read from memory, and
  chapter 4's cache also copies them to grow by one position.

Fitted on steps of one model at several batch sizes and positions (the batch moves the
arithmetic, the position the cache, the number of operations stays put), it predicts the steps
of another model from that model's own counts.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions import checks
from solutions.config import Config


def step_flops(cfg: Config, t: int, cached: bool = True, batch: int = 1) -> int:
    """Approximate floating-point operations of the step that computes the logits at position t,
    for `batch` rows: the matrix products of the layers and the unembedding, and attention."""
    n = 1 if cached else t + 1  # positions pushed through the layers
    pairs = t + 1 if cached else (t + 1) * (t + 2) // 2  # (query, key) pairs in attention
    d, layers = cfg.d_model, cfg.n_layers
    per_position = layers * 2 * (4 * d * d + 2 * d * cfg.d_mlp) + 2 * d * cfg.d_vocab
    attention = layers * pairs * 4 * cfg.n_heads * cfg.d_head
    return batch * (n * per_position + attention)


def step_cached(cfg: Config, t: int, batch: int = 1) -> int:
    """Numbers of the cache a cached step at position t reads: keys and values of the t earlier
    positions, in every layer, for every row."""
    return batch * 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * t


def step_bytes(model: nn.Module) -> int:
    """Bytes of weights a cached step reads: every parameter but the two embedding tables, of
    which it reads one row each."""
    skip = {"embed.W_E", "pos_embed.W_pos"}
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n not in skip)


@dataclass(frozen=True)
class Rates:
    """What this machine does at best, measured: arithmetic (floating-point operations per
    second of a long forward pass) and reading weights (bytes per second of a one-row product)."""

    flops_per_second: float
    bytes_per_second: float

    @classmethod
    def from_times(cls, model: nn.Module, pass_seconds: float, one_row_seconds: float) -> "Rates":
        """The two rates from two timings of `model` (the caller times them: a busy machine asks
        for the fastest of a few calls): a forward pass over `n_ctx` positions, and a product
        of one row with the unembedding matrix."""
        cfg, W_U = model.cfg, model.unembed.W_U
        return cls(
            flops_per_second=step_flops(cfg, cfg.n_ctx - 1, cached=False) / pass_seconds,
            bytes_per_second=W_U.numel() * W_U.element_size() / one_row_seconds,
        )

    def floor(self, flops, n_bytes) -> Float[Tensor, "steps"]:
        """The least time the arithmetic and the reads of steps can take: the slower of the two
        (a one-row product waits on memory, a long forward pass on arithmetic)."""
        flops, n_bytes = (torch.as_tensor(c, dtype=torch.float64) for c in (flops, n_bytes))
        return torch.maximum(flops / self.flops_per_second, n_bytes / self.bytes_per_second)


@dataclass(frozen=True)
class StepCost:
    """A step's seconds: its floor, plus `per_op` for each operation it dispatches, plus
    `per_cached` for each number of the cache it reads."""

    per_op: float
    per_cached: float

    def predict(self, n_ops, floor, cached) -> Float[Tensor, "steps"]:
        """Predicted seconds of steps with these counts (numbers or 1-d tensors alike)."""
        columns = [torch.as_tensor(c, dtype=torch.float64) for c in (n_ops, floor, cached)]
        n_ops, floor, cached = torch.broadcast_tensors(*columns)
        return floor + self.per_op * n_ops + self.per_cached * cached


def fit_step_cost(
    n_ops: Float[Tensor, "steps"],
    floor: Float[Tensor, "steps"],
    cached: Float[Tensor, "steps"],
    seconds: Float[Tensor, "steps"],
) -> StepCost:
    """The `StepCost` whose predictions are closest to the measured `seconds` in the least-
    squares sense: the time above each step's floor, split between its operations and the cache
    it reads. At least two steps, with counts that tell the two terms apart."""
    columns = [torch.as_tensor(c) for c in (n_ops, floor, cached, seconds)]
    if len({c.shape for c in columns}) != 1 or columns[0].ndim != 1:
        raise ValueError(
            "n_ops, floor, cached and seconds must be 1-d and of one length, got shapes "
            + ", ".join(str(tuple(c.shape)) for c in columns)
        )
    checks.integer("len(seconds)", len(columns[3]), low=2)
    # BEGIN SOLUTION
    # float64: the counts are ~1e3 to 1e6 and the seconds ~1e-3; float32 would lose digits.
    n_ops, floor, cached, seconds = (c.to(torch.float64) for c in columns)
    A = torch.stack([n_ops, cached], dim=1)  # [steps, 2]: one column per fitted term
    above = seconds - floor  # what the floor does not explain
    solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]
    per_op, per_cached = solution.tolist()
    # END SOLUTION
    return StepCost(per_op, per_cached)


def profile_ops(run, repeats: int = 10) -> tuple[float, list[tuple[str, float, float]]]:
    """Run `run()` `repeats` times under `torch.profiler`: the PyTorch operations one call
    dispatches (every `aten::` event, those that other operations call included), and per
    operation name `(name, calls per run, microseconds of its own CPU time per call)`, most time
    first. The profiler adds its own cost to each operation: use it to count, a clock to time."""
    checks.integer("repeats", repeats, low=1)
    run()  # warm-up: one-time costs are not a step's
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(repeats):
            run()
    rows = [
        (e.key, e.count / repeats, e.self_cpu_time_total / e.count)
        for e in prof.key_averages()
        if e.key.startswith("aten::")
    ]
    rows.sort(key=lambda row: -row[1] * row[2])
    return sum(calls for _, calls, _ in rows), rows
