"""Generation with a KeyValueCache: one prefill of the prompt, then one position per token.

`CachedTransformerSampler` is chapter 3's sampler with the cache: same arguments, same tokens
under the same seed, a fraction of the work. Past `n_ctx` it slides the window: learned
positions are baked into every cached key and value, so moving the window means rebuilding
the cache from the tokens that stay in view.
"""

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from solutions import checks
from solutions.cached_model import forward_with_cache
from solutions.sampling import TransformerSampler


class CachedTransformerSampler(TransformerSampler):
    """`sampler.sample(prompt, max_tokens_generated, **kwargs)` as in chapter 3, with a cache.

    `window_shift` says what happens when the text outgrows the model's `n_ctx` positions:
    the cache is rebuilt from the last `n_ctx - window_shift + 1` tokens, so there is one
    rebuild every `window_shift` tokens. `window_shift=1` (the default) rebuilds at every
    step and gives exactly the tokens of the uncached sampler, which always reads the last
    `n_ctx` tokens; a larger shift is faster but reads a shorter context after each rebuild.
    """

    @torch.inference_mode()
    def sample(
        self,
        prompt: str | list[int] | Int[Tensor, "seq"],
        max_tokens_generated: int = 100,
        verbose: bool = False,
        progress: bool = False,
        seed: int | None = None,
        stop_at_eos: bool = True,
        window_shift: int = 1,
        **kwargs,
    ) -> str | Int[Tensor, "seq"]:
        n_ctx = self.cfg.n_ctx
        checks.integer(f"window_shift (n_ctx={n_ctx})", window_shift, low=1, high=n_ctx)
        input_ids, generator = self._start(prompt, max_tokens_generated, seed, kwargs)
        eos = self.tokenizer.eos_token_id
        cache = None
        # BEGIN SOLUTION
        for _ in tqdm(range(max_tokens_generated), disable=not progress, desc="sampling"):
            if cache is None:
                # Prefill: the whole prompt (its last n_ctx tokens) in one forward pass.
                logits, cache = forward_with_cache(self.model, input_ids[None, -n_ctx:])
            elif cache.length == n_ctx:
                # No room for the newest token: every position moves, so rebuild the cache.
                keep = n_ctx - window_shift + 1
                logits, cache = forward_with_cache(self.model, input_ids[None, -keep:])
            else:
                # The usual step: only the token sampled last is new to the model.
                logits, cache = forward_with_cache(self.model, input_ids[None, -1:], cache)
            next_token = self.sample_next_token(
                input_ids[None], logits[:, -1], generator=generator, **kwargs
            )
            input_ids = torch.cat([input_ids, next_token])
            if verbose:
                print(self.tokenizer.decode(next_token), end="", flush=True)
            if stop_at_eos and next_token.item() == eos:
                break
        # END SOLUTION
        return self._finish(prompt, input_ids, verbose)
