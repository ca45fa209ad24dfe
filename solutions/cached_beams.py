"""Beam search with a KeyValueCache that follows the beams.

Each beam is a row of the cache. When `filter` keeps some beams and drops others, the cache
rows must follow: a kept beam's next step reads the keys and values of the beam it came from.
`CachedBeams` records that parent row for every beam (`parents`) and gathers the rows only
when it next runs the model, so the many candidates `filter` throws away never copy a cache.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.beams import Beams, top_continuations
from solutions.kv_cache import KeyValueCache


@dataclass
class CachedBeams(Beams):
    """`Beams` with a cache. `cache` has one row per beam of the step that made these beams;
    beam i continues row `parents[i]`. Use it as `beam_search(..., beams_class=CachedBeams)`."""

    cache: KeyValueCache | None = None
    parents: Int[Tensor, "beam"] | None = None

    def __getitem__(self, index) -> "CachedBeams":
        # The cache is shared, not copied: only the record of which row each beam reads moves.
        parents = None if self.parents is None else self.parents[index]
        return CachedBeams(
            self.model,
            self.tokenizer,
            self.logprob_sums[index],
            self.tokens[index],
            self.cache,
            parents,
        )

    @torch.inference_mode()
    def generate(self, k: int, no_repeat_ngram_size: int | None = None) -> "CachedBeams":
        n_ctx = self.model.cfg.n_ctx
        # BEGIN SOLUTION
        cache = None if self.cache is None else self.cache[self.parents]
        if cache is None or cache.length == n_ctx:
            # First step, or the window is full: (re)build from the last n_ctx tokens, which
            # is exactly what the uncached beams read.
            logits, cache = forward_with_cache(self.model, self.tokens[:, -n_ctx:])
        else:
            # The cache holds every token but the last one each beam just added.
            logits, cache = forward_with_cache(self.model, self.tokens[:, -1:], cache)
        logprob_sums, tokens = top_continuations(
            self.logprob_sums, self.tokens, logits[:, -1], k, no_repeat_ngram_size
        )
        # Candidate j continues beam j // k: the order top_continuations lays them out in.
        parents = torch.arange(len(self), device=tokens.device).repeat_interleave(k)
        return CachedBeams(self.model, self.tokenizer, logprob_sums, tokens, cache, parents)
        # END SOLUTION
