"""Training windows: a long token stream cut into (input, target) pairs for next-token loss."""

from jaxtyping import Int
from torch import Tensor
from torch.utils.data import Dataset

from solutions import checks


class TokenWindows(Dataset):
    """Windows of `n_ctx` tokens over one token stream, starting every `stride` tokens.

    Window `i` starts at token `i * stride` and is a pair `(x, y)`: `x` holds the `n_ctx`
    tokens from its start on, `y` the `n_ctx` tokens one further on, so the target at every
    position is the token that comes next. A window needs `n_ctx + 1` tokens from its start.
    """

    def __init__(self, tokens: Int[Tensor, " n_tokens"], n_ctx: int, stride: int | None = None):
        stride = n_ctx if stride is None else stride
        checks.integer("n_ctx", n_ctx, low=1)
        checks.integer(f"stride (n_ctx={n_ctx})", stride, low=1, high=n_ctx)
        checks.token_ids("tokens", tokens, ndim=1)
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
