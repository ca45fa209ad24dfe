"""Argument checks, one line where they are used. Each raises a ValueError that names the
argument, says what is allowed and shows what it got, so that a wrong call fails at the door
with a sentence, not deep inside torch with a shape error or, worse, not at all.

    checks.integer("num_beams", num_beams, low=1)
    checks.number("top_p", top_p, low=0.0, high=1.0)
    checks.token_ids("tokens", tokens, d_vocab=cfg.d_vocab, ndim=2)
    checks.probability_pair("p", p, "q", q)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _range(low, high) -> str:
    if high is None or high == math.inf:
        return f">= {low}" if low is not None and low != -math.inf else "any value"
    if low is None or low == -math.inf:
        return f"<= {high}"
    return f"in [{low}, {high}]"


def integer(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """`value`, an int in [low, high] (either end may be open). A bool is refused: `True` is not
    a count, however Python treats it."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        raise ValueError(f"{name} must be an integer {_range(low, high)}, got {value!r}")
    return value


def number(name: str, value, low: float = -math.inf, high: float = math.inf) -> float:
    """`value`, a real number (int or float, not bool, not NaN) in [low, high]."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and not math.isnan(value) and low <= value <= high
    if not ok:
        what = (
            "a number" if (low, high) == (-math.inf, math.inf) else f"a number {_range(low, high)}"
        )
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def positive(name: str, value) -> float:
    """`value`, a real number > 0 (a scale, an epsilon: zero would divide by zero)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and value > 0):  # NaN fails too
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return value


MIN_TEMPERATURE = 1e-5
"""The smallest temperature sampled at: vLLM's `_SAMPLING_EPS` (vllm/sampling_params.py), below
which vLLM samples greedily. At 1e-40 the logits divided by it overflow and softmax makes NaNs."""


def temperature(value) -> float:
    """A temperature: 0 (greedy) or a number of at least `MIN_TEMPERATURE`."""
    number("temperature", value, low=0.0)
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {value!r}: "
            "dividing the logits by less overflows them, and the probabilities become NaN"
        )
    return value


def token_ids(
    name: str, ids: Tensor, d_vocab: int | None = None, ndim: int | None = None
) -> Tensor:
    """`ids`, an integer tensor (of `ndim` dimensions) whose values lie in [0, d_vocab) (or are
    at least not negative, when the vocabulary size is not known here)."""
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int32, torch.int64):
        got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor of token ids, got {got}")
    if ndim is not None and ids.ndim != ndim:
        raise ValueError(
            f"{name} must be an integer tensor with {ndim} dimensions, got shape {tuple(ids.shape)}"
        )
    high = math.inf if d_vocab is None else d_vocab
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < high:
        allowed = f"[0, d_vocab={d_vocab})" if d_vocab else ">= 0"
        raise ValueError(
            f"{name} must hold token ids {allowed}, got values in "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )
    return ids


def probabilities(name: str, probs: Tensor, ndim: int | None = None, atol: float = 1e-3) -> Tensor:
    """`probs`, a floating tensor (of `ndim` dimensions) whose last dimension holds probability
    distributions: finite, never negative, each summing to 1 (within `atol`)."""
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        got = probs.dtype if isinstance(probs, Tensor) else type(probs).__name__
        raise ValueError(f"{name} must be a floating tensor of probabilities, got {got}")
    if ndim is not None and probs.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(probs.shape)}")
    if probs.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(probs.shape)}")
    # One check, one sync with the device: samplers call this at every step.
    sums = probs.sum(dim=-1, dtype=torch.float64)
    bad = (~torch.isfinite(probs)).any() | (probs < 0).any() | ((sums - 1).abs() > atol).any()
    if not bool(bad):
        return probs
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError(f"{name} must hold finite, non-negative probabilities")
    raise ValueError(
        f"each row of {name} must sum to 1 (a softmax, not logits), got a row summing to "
        f"{float(sums.flatten()[(sums - 1).abs().argmax()]):.4g}"
    )


def probability_pair(
    p_name: str, p: Tensor, q_name: str, q: Tensor, ndim: int | None = None
) -> tuple[Tensor, Tensor]:
    """Two tensors of probability distributions (see `probabilities`) of the same shape: the
    two distributions a sampler or a coupling compares, token by token."""
    probabilities(p_name, p, ndim)
    probabilities(q_name, q, ndim)
    if p.shape != q.shape:
        raise ValueError(
            f"{p_name} {tuple(p.shape)} and {q_name} {tuple(q.shape)} must have the same shape: "
            "distributions over the same vocabulary"
        )
    return p, q


def prompt_texts(prompts) -> list[str]:
    """`prompts`, a non-empty list (or tuple) of non-empty strings: a batch to generate from."""
    if not isinstance(prompts, list | tuple) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("every prompt must be a non-empty string")
    return list(prompts)


def positions_read(n_prompt: int, max_tokens: int) -> int:
    """The positions a model reads to write `max_tokens` tokens after an `n_prompt`-token prompt:
    the last token sampled is never fed back, so n_prompt + max_tokens - 1."""
    return n_prompt + max_tokens - 1


def context_problem(
    n_prompt: int, max_tokens: int, n_ctx: int, name: str = "max_tokens"
) -> str | None:
    """Why a prompt of `n_prompt` tokens and `max_tokens` new ones (the argument called `name`)
    do not fit a model's `n_ctx` positions, or None when they do. A sentence, not an error: the
    engine reports it in a request's output, the samplers raise it."""
    needed = positions_read(n_prompt, max_tokens)
    if needed <= n_ctx:
        return None
    return (
        f"the prompt ({n_prompt} tokens) and {name}={max_tokens} need {needed} positions, more "
        f"than the model's n_ctx={n_ctx}"
    )
