"""KeyValueCache: what a DemoTransformer has already computed for the positions it has seen.

At every layer, attention reads the keys and values of all earlier positions. Those never
change once computed (a position only attends backwards), so a generator can keep them and
compute keys and values for the new tokens only. The cache is immutable: a forward pass
returns a new, longer cache, and indexing picks rows (beams) without touching the original.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions import checks
from solutions.config import Config


@dataclass(frozen=True)
class KeyValueCache:
    # One tensor per layer, each [batch, n_kv_heads, pos, d_head]: heads first, so that every
    # head's keys are one matrix (the layout PyTorch's attention functions and HF use). GPT-2
    # has a key/value head per query head (n_kv_heads == n_heads); chapter 7's model fewer.
    keys: tuple[Float[Tensor, "batch n_kv_heads pos d_head"], ...]
    values: tuple[Float[Tensor, "batch n_kv_heads pos d_head"], ...]
    tokens: Int[Tensor, "batch pos"]  # the token ids these positions came from
    mask: Bool[Tensor, "batch pos"]  # False where a row is padding (batched generation)
    cfg: Config

    @classmethod
    def new_empty(
        cls,
        cfg: Config,
        batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> "KeyValueCache":
        """A cache holding no positions yet, for `batch` sequences."""
        checks.integer("batch", batch, low=1)
        empty = torch.empty(batch, cfg.n_kv_heads, 0, cfg.d_head, device=device, dtype=dtype)
        return cls(
            keys=(empty,) * cfg.n_layers,
            values=(empty,) * cfg.n_layers,
            tokens=torch.empty(batch, 0, dtype=torch.long, device=device),
            mask=torch.empty(batch, 0, dtype=torch.bool, device=device),
            cfg=cfg,
        )

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        """Positions cached so far (padding included)."""
        return self.tokens.shape[1]

    def __getitem__(self, rows) -> "KeyValueCache":
        """The cache of the sequences picked by `rows` (an index tensor or a slice): beam
        search uses this to make the cache follow the beams it keeps."""
        return KeyValueCache(
            keys=tuple(k[rows] for k in self.keys),
            values=tuple(v[rows] for v in self.values),
            tokens=self.tokens[rows],
            mask=self.mask[rows],
            cfg=self.cfg,
        )

    def keep_only(self, mask: Bool[Tensor, "batch pos"]) -> "KeyValueCache":
        """The cache with every position where `mask` is False turned into padding, then
        compacted: each row's real positions keep their order and move right, and the columns
        that are padding in every row are dropped. Speculative decoding uses this to forget the
        draft tokens the main model rejected. Forget only a row's LAST positions: the keys and
        values of a later position were computed with the earlier ones in view."""
        if mask.shape != self.mask.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor shaped like the cache's {tuple(self.mask.shape)}, "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        mask = mask & self.mask
        width = int(mask.sum(dim=1).max())
        if not bool(mask[:, width:].any()) and torch.equal(mask[:, :width], self.mask[:, :width]):
            # Every row forgets the same last columns (always so for one row): a slice will do.
            return KeyValueCache(
                keys=tuple(k[:, :, :width] for k in self.keys),
                values=tuple(v[:, :, :width] for v in self.values),
                tokens=self.tokens[:, :width],
                mask=mask[:, :width],
                cfg=self.cfg,
            )
        # A stable sort of 0/1 puts each row's padding first and its real positions last, both
        # in their order; the last `width` columns then hold every real position of every row.
        cols = torch.sort(mask.int(), dim=1, stable=True).indices[:, self.length - width :]

        def pick(t):  # [batch, heads, pos, d_head] -> [batch, heads, width, d_head]
            index = cols[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
            return t.gather(2, index)

        return KeyValueCache(
            keys=tuple(pick(k) for k in self.keys),
            values=tuple(pick(v) for v in self.values),
            tokens=self.tokens.gather(1, cols),
            mask=mask.gather(1, cols),
            cfg=self.cfg,
        )

    def check_next(self, cfg: Config, tokens: Int[Tensor, "batch new"]) -> None:
        """A clear ValueError if `tokens` cannot be the next tokens of these sequences."""
        mine = (self.cfg.n_layers, self.cfg.n_kv_heads, self.cfg.d_head, self.cfg.n_ctx)
        theirs = (cfg.n_layers, cfg.n_kv_heads, cfg.d_head, cfg.n_ctx)
        if mine != theirs:
            raise ValueError(
                "cache was made for another model: (n_layers, n_kv_heads, d_head, n_ctx) is "
                f"{mine} for the cache and {theirs} for this model"
            )
        if tokens.shape[0] != self.batch:
            raise ValueError(
                f"cache holds {self.batch} sequences but tokens has batch size {tokens.shape[0]}"
            )
        if self.length + tokens.shape[1] > cfg.n_ctx:
            raise ValueError(
                f"cache holds {self.length} positions; {tokens.shape[1]} more would pass "
                f"n_ctx={cfg.n_ctx}. Slide the window: rebuild the cache from the last tokens"
            )
        # The classic slip: feeding the whole sequence again instead of the new tokens only.
        if 0 < self.length < tokens.shape[1] and torch.equal(
            tokens[:, : self.length], self.tokens.to(tokens.device)
        ):
            raise ValueError(
                f"tokens starts with the {self.length} positions already in the cache: "
                "pass only the new tokens, tokens[:, cache.length:]"
            )
