"""Training windows: a long token stream cut into (input, target) pairs for next-token loss."""

import torch
from jaxtyping import Int
from torch import Tensor
from torch.utils.data import Dataset


class TokenWindows(Dataset):
    """Windows of `n_ctx` tokens over one token stream, starting every `stride` tokens.

    Window `i` is `(x, y)` with `x = tokens[s : s + n_ctx]` and `y = tokens[s + 1 : s + n_ctx + 1]`
    where `s = i * stride`: the target at every position is the token that comes next.
    """

    def __init__(self, tokens: Int[Tensor, " n_tokens"], n_ctx: int, stride: int | None = None):
        stride = n_ctx if stride is None else stride
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if not isinstance(stride, int) or not 1 <= stride <= n_ctx:
            raise ValueError(f"stride must be an integer in [1, n_ctx={n_ctx}], got {stride!r}")
        if tokens.ndim != 1 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError("tokens must be a 1-D integer tensor")
        if len(tokens) < n_ctx + 1:
            raise ValueError(f"tokens must hold at least n_ctx + 1 = {n_ctx + 1} tokens")
        self.tokens = tokens
        self.n_ctx = n_ctx
        self.stride = stride

    def __len__(self) -> int:
        # BEGIN SOLUTION
        # The last window needs n_ctx inputs AND one more token for its last target.
        return (len(self.tokens) - self.n_ctx - 1) // self.stride + 1
        # END SOLUTION

    def __getitem__(self, i: int) -> tuple[Int[Tensor, " n_ctx"], Int[Tensor, " n_ctx"]]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} windows")
        # BEGIN SOLUTION
        start = (i % len(self)) * self.stride
        chunk = self.tokens[start : start + self.n_ctx + 1]
        # Targets are the inputs shifted left by one: position t predicts token t + 1.
        return chunk[:-1], chunk[1:]
        # END SOLUTION
