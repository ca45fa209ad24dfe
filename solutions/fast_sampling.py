"""FastTransformerSampler: chapter 3's `sample`, with the fixed cost of a step taken out.

Chapter 4's cached step computes one position, yet costs several times a position's share of a
long forward pass: most of a step is not arithmetic but dispatching a few hundred small
operations, allocating the tensors of a cache that grows, and Python. This sampler removes what
it can of that, in gpt-fast's order (pytorch-labs/gpt-fast, `generate.py`):

- a static cache (`StaticKeyValueCache`): every step the same shapes, written in place;
- a loop that never waits for the device inside a step: the next token stays a tensor, the
  end of text is a mask, and the host reads the tokens only every `sync_every` steps;
- the decoding step compiled (`torch.compile(fullgraph=True)`): one graph, with slot and
  position passed as tensors so that it is compiled once for the whole generation.

The sampling rules are chapter 3's own functions, called in the same order with the same
generator: under the same seed this sampler gives chapter 3's tokens.
"""

import shutil

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions import checks
from solutions.architectures import forward_static  # chapter 5's pass, for any model
from solutions.sampling import SamplerBase, sample_next_token
from solutions.static_cache import StaticKeyValueCache


def inductor_available() -> tuple[bool, str]:
    """Whether torch.compile's default backend can build code here, and if not, why. Inductor
    writes C++ for a CPU and needs a C++ compiler to build it (Triton for a GPU)."""
    from torch._inductor import config

    compiler = config.cpp.cxx[0] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
    candidates = [c for c in (compiler, "g++", "clang++", "c++", "cl") if c]
    if any(shutil.which(c) for c in candidates):
        return True, ""
    return False, (
        "torch.compile's default backend (Inductor) builds C++ for the CPU and found no C++ "
        "compiler (looked for " + ", ".join(dict.fromkeys(candidates)) + "). Install one "
        "(Debian/Ubuntu: `apt install g++`; macOS: `xcode-select --install`; Windows: the "
        "Build Tools for Visual Studio), or pass compile=False, or compile='eager' to trace "
        "the step with dynamo without building anything"
    )


def decode_step(
    model: nn.Module,
    cache: StaticKeyValueCache,
    token: Int[Tensor, "batch 1"],
    slot: Int[Tensor, "1"],
    position: Int[Tensor, "batch 1"],
) -> Float[Tensor, "batch d_vocab"]:
    """One decoding step: the logits after `token`, which goes to `slot` at `position`. Slot and
    position are tensors, not Python ints: a compiled step would otherwise be specialised to
    each value and compiled again at every step."""
    return forward_static(model, token, cache, slot, position)[:, -1]


def compiled_step(compile: bool | str, step=decode_step):
    """`step` (`decode_step` unless told), compiled as `compile` asks: False leaves it eager,
    True uses the default backend (Inductor), a string names a backend ("eager": dynamo's
    graph, run as is). One graph (`fullgraph`), specialised to its shapes (`dynamic=False`)."""
    if compile is False:
        return step
    if compile is True:
        ok, why = inductor_available()
        if not ok:
            raise RuntimeError(why)
        return torch.compile(step, fullgraph=True, dynamic=False)
    return torch.compile(step, fullgraph=True, dynamic=False, backend=compile)


class FastTransformerSampler(SamplerBase):
    """`sampler.sample(prompt, max_tokens_generated, **kwargs)` as in chapter 3, on a static
    cache with a loop that does not wait and, with `compile`, a compiled decoding step.

    The prompt and its continuation must fit the model's `n_ctx` positions (the static cache
    holds that many); past them, chapter 4's `CachedTransformerSampler` slides the window.
    `host_reads` counts the times the last `sample` call waited for the device's results."""

    def __init__(
        self, model: nn.Module, tokenizer, compile: bool | str = True, sync_every: int = 16
    ):
        super().__init__(model, tokenizer)
        if not isinstance(compile, bool | str):
            raise ValueError(f"compile must be True, False or a backend's name, got {compile!r}")
        self.sync_every = checks.integer("sync_every", sync_every, low=1)
        self.step = compiled_step(compile)
        self.cache: StaticKeyValueCache | None = None
        self.host_reads = 0

    def _cache_for(self, device: torch.device) -> StaticKeyValueCache:
        """The cache, made once and reused: a compiled step keeps reading the same buffers."""
        dtype = self.model.embed.W_E.dtype
        cache = self.cache
        if cache is None or cache.batch != 1 or cache.device != device or cache.dtype != dtype:
            cache = self.cache = StaticKeyValueCache(self.cfg, 1, device, dtype)
        cache.reset()
        return cache

    @torch.inference_mode()
    def sample(
        self,
        prompt: str | list[int] | Int[Tensor, "seq"],
        max_tokens_generated: int = 100,
        verbose: bool = False,
        progress: bool = False,
        seed: int | None = None,
        stop_at_eos: bool = True,
        **kwargs,
    ) -> str | Int[Tensor, "seq"]:
        """Chapter 3's `sample`: the same arguments, the same result. `verbose` prints each
        token as it comes, which reads it from the device at every step."""
        input_ids, generator = self._start(prompt, max_tokens_generated, seed, kwargs)
        n_prompt, n_ctx = len(input_ids), self.cfg.n_ctx
        too_long = checks.context_problem(n_prompt, max_tokens_generated, n_ctx,
                                          "max_tokens_generated")  # fmt: skip
        if too_long is not None:
            raise ValueError(
                f"{too_long}, which the static cache holds. Chapter 4's CachedTransformerSampler "
                "slides the window past n_ctx"
            )
        self.host_reads = 0
        if max_tokens_generated == 0:
            return self._finish(prompt, input_ids, verbose)
        device = input_ids.device
        penalty = kwargs.pop("frequency_penalty", 0.0)
        eos = self.tokenizer.eos_token_id
        cache = self._cache_for(device)
        slots = torch.arange(n_prompt, device=device)  # the prompt's slots and positions
        cache.check_step(self.model, input_ids[None], slots)
        # BEGIN SOLUTION
        # Prefill, eager (its shape is the prompt's).
        logits = forward_static(self.model, input_ids[None], cache, slots, slots[None])[:, -1]
        # Every buffer the loop writes exists before it starts: the text, the penalty's counts.
        text = torch.full((n_prompt + max_tokens_generated,), eos, device=device)
        text[:n_prompt] = input_ids
        if penalty:
            counts = torch.bincount(input_ids, minlength=self.cfg.d_vocab).float()[None]
            one = torch.ones(1, 1, device=device)
        done = torch.zeros(1, dtype=torch.bool, device=device)
        slot = torch.tensor([n_prompt], device=device)  # the next token's slot and position
        n_new, printed_end = 0, False
        for i in tqdm(range(max_tokens_generated), disable=not progress, desc="sampling"):
            # Chapter 3's rules in chapter 3's order; the penalty from running counts, so that
            # no step counts a text whose length changes.
            scores = logits.float() - penalty * counts if penalty else logits
            token = sample_next_token(input_ids[None], scores, generator=generator, **kwargs)
            if stop_at_eos:  # a finished text writes end-of-text; no branch on the device
                token = torch.where(done, eos, token)
                done |= token == eos
            text[n_prompt + i : n_prompt + i + 1] = token
            if penalty:
                counts.index_add_(1, token, one)
            n_new = i + 1
            if verbose and not printed_end:  # the text ends at its first end-of-text
                self.host_reads += 1
                word = int(token)
                print(self.tokenizer.decode([word]), end="", flush=True)
                printed_end = stop_at_eos and word == eos
            if n_new == max_tokens_generated:
                break
            if stop_at_eos and n_new % self.sync_every == 0:
                self.host_reads += 1  # the one wait: every sync_every tokens
                if bool(done):
                    break
            logits = self.step(self.model, cache, token[None], slot, slot[None])
            slot += 1
        # END SOLUTION
        self.host_reads += 1  # the tokens, read once at the end
        new = text[n_prompt : n_prompt + n_new].cpu()
        if stop_at_eos and bool((new == eos).any()):
            new = new[: int((new == eos).nonzero()[0]) + 1]
        return self._finish(prompt, torch.cat([input_ids.cpu(), new]), verbose)
