"""Generation with a KeyValueCache: one prefill of the prompt, then one position per token.

`CachedTransformerSampler` is chapter 3's sampler with the cache: same arguments, same tokens
under the same seed, a fraction of the work. Past `n_ctx` it slides the window: learned
positions are baked into every cached key and value, so moving the window means rebuilding
the cache from the tokens that stay in view.
"""

from jaxtyping import Float, Int
from torch import Tensor

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.kv_cache import KeyValueCache
from solutions.sampling import TransformerSampler


class CachedTransformerSampler(TransformerSampler):
    """`sampler.sample(prompt, max_tokens_generated, **kwargs)` as in chapter 3, with a cache.

    Chapter 3's loop asks `next_logits` for each step's logits; this class answers from a
    KeyValueCache and changes nothing else, so it gives the same tokens under the same seed.

    `window_shift` says what happens when the text outgrows the model's `n_ctx` positions:
    the cache is rebuilt from the last `n_ctx - window_shift + 1` tokens, so there is one
    rebuild every `window_shift` tokens. `window_shift=1` (the default) rebuilds at every
    step and gives exactly the tokens of the uncached sampler, which always reads the last
    `n_ctx` tokens; a larger shift is faster but reads a shorter context after each rebuild.
    """

    cache: KeyValueCache | None = None  # what the model has read of the current text
    window_shift: int = 1

    def sample(
        self,
        prompt: str | list[int] | Int[Tensor, "seq"],
        max_tokens_generated: int = 100,
        window_shift: int = 1,
        **kwargs,
    ) -> str | Int[Tensor, "seq"]:
        """Chapter 3's `sample` (same arguments: verbose, progress, seed, stop_at_eos, and the
        sampling options), plus `window_shift`."""
        n_ctx = self.cfg.n_ctx
        checks.integer(f"window_shift (n_ctx={n_ctx})", window_shift, low=1, high=n_ctx)
        self.window_shift = window_shift
        self.cache = None  # a new text: the first step is a prefill
        return super().sample(prompt, max_tokens_generated, **kwargs)

    def next_logits(self, input_ids: Int[Tensor, "seq"]) -> Float[Tensor, "1 d_vocab"]:
        """The logits for the token after `input_ids`, computing only what the cache lacks."""
        n_ctx = self.cfg.n_ctx
        # BEGIN SOLUTION
        if self.cache is None:
            # Prefill: the whole prompt (its last n_ctx tokens) in one forward pass.
            logits, self.cache = forward_with_cache(self.model, input_ids[None, -n_ctx:])
        elif self.cache.length == n_ctx:
            # No room for the newest token: every position moves, so rebuild the cache.
            keep = n_ctx - self.window_shift + 1
            logits, self.cache = forward_with_cache(self.model, input_ids[None, -keep:])
        else:
            # The usual step: only the token sampled last is new to the model.
            logits, self.cache = forward_with_cache(self.model, input_ids[None, -1:], self.cache)
        return logits[:, -1]
        # END SOLUTION
