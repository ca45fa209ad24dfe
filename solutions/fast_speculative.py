"""Chapter 6's speculative decoding on chapter 5's static caches, with compiled steps.

Speculation pays when a draft step is cheap next to a main-model step (the cost ratio c) and a
pass over k + 1 tokens costs about one step. On this CPU, chapter 4's cached steps are mostly
fixed cost, so a draft step costs a large share of a main one and speculation barely paid.
Chapter 5 took much of that fixed cost out; this generator asks what is left for speculation:
one text at a time, the draft model's steps compiled (`decode_step`), the main model's
(k + 1)-token pass compiled once for each k (`forward_static`), both caches static.

A static cache needs no trimming after a rejection. The main model writes [last, d_1 .. d_k] to
slots L-1 .. L+k-1; with a of the drafts accepted, the text grows to L + a + 1 tokens and the
cache's valid slots end at L + a - 1. The slots after it hold rejected drafts, but no query reads
them (each query reads only the slots up to its own), and the next round writes its k + 1
tokens from slot L + a on, over all of them. The same holds for the draft model's cache.

The random numbers are drawn by the same calls, in the same order, as chapter 6's
`speculative_generate` on one prompt: under the same seed, the same tokens (the float rounding
of the two cache layouts aside).
"""

import functools

import torch
from jaxtyping import Int
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import forward_static  # chapter 5's pass, for any model
from solutions.drafters import sampling_probs
from solutions.fast_sampling import compiled_step
from solutions.sampling import check_sampling_args
from solutions.speculative import rejection_sample
from solutions.speculative_generation import SpeculativeStats
from solutions.static_cache import StaticKeyValueCache


@functools.cache
def _compiled(compile: bool | str):
    """The draft step and the main model's pass, compiled as `compile` asks. Made once per
    setting and shared by every generator, so that dynamo keeps one compiled version of each
    shape (one per k for the pass), not one per generator."""
    return compiled_step(compile), compiled_step(compile, forward_static)


class FastSpeculativeGenerator:
    """`generate(prompt, max_tokens_generated, ...)`: speculative decoding of one text with the
    `draft` model guessing k tokens per round, on static caches, its steps compiled as `compile`
    asks (False, True for Inductor, or a backend's name, as `FastTransformerSampler`)."""

    def __init__(self, main: nn.Module, draft: nn.Module, tokenizer, k: int = 4, compile=True):
        if not isinstance(compile, bool | str):
            raise ValueError(f"compile must be True, False or a backend's name, got {compile!r}")
        self.k = checks.integer("k", k, low=1, high=16)
        if draft.cfg.d_vocab != main.cfg.d_vocab:
            raise ValueError(
                f"the draft model's vocabulary ({draft.cfg.d_vocab}) must be the main model's "
                f"({main.cfg.d_vocab}): they must share a tokenizer"
            )
        self.main, self.draft, self.tokenizer = main.eval(), draft.eval(), tokenizer
        self.draft_step, self.verify = _compiled(compile)
        device = next(main.parameters()).device
        self.main_cache = StaticKeyValueCache(main.cfg, 1, device, main.embed.W_E.dtype)
        self.draft_cache = StaticKeyValueCache(draft.cfg, 1, device, draft.embed.W_E.dtype)
        self.device = device

    @torch.inference_mode()
    def generate(
        self,
        prompt: str | list[int],
        max_tokens_generated: int = 100,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_at_eos: bool = True,
        stats: SpeculativeStats | None = None,
    ) -> Int[Tensor, "seq"]:
        """The prompt's ids and its continuation (up to its first end-of-text with
        `stop_at_eos`), as chapter 6's `speculative_generate` gives them for one prompt."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        checks.integer("max_tokens_generated", max_tokens_generated, low=0)
        check_sampling_args(temperature, top_k, top_p)
        if not ids:
            raise ValueError("prompt must have at least one token")
        k, n_ctx = self.k, min(self.main.cfg.n_ctx, self.draft.cfg.n_ctx)
        if len(ids) + max_tokens_generated + k + 1 > n_ctx:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) plus max_tokens_generated="
                f"{max_tokens_generated} plus k + 1 = {k + 1} passes n_ctx={n_ctx}"
            )
        stats = stats if stats is not None else SpeculativeStats()
        device = self.device
        generator = None if seed is None else torch.Generator(device).manual_seed(seed)
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        eos = self.tokenizer.eos_token_id
        # The text lives in one buffer: every token a step reads is a view of it with the same
        # strides (dynamo guards strides too: a slice of a growing tensor would recompile).
        text = torch.full((1, n_ctx), eos, device=device)
        text[0, : len(ids)] = torch.tensor(ids, device=device)
        main_cache, draft_cache = self.main_cache, self.draft_cache
        main_cache.reset()
        draft_cache.reset()
        # Both models read the prompt but its last token, eagerly (its length varies).
        if len(ids) > 1:
            slots = torch.arange(len(ids) - 1, device=device)
            forward_static(self.main, text[:, : len(ids) - 1], main_cache, slots, slots[None])
            forward_static(self.draft, text[:, : len(ids) - 1], draft_cache, slots, slots[None])
        length, drafted = len(ids), len(ids) - 1  # the text's tokens; the draft cache's
        slot_of = torch.arange(n_ctx, device=device)[:, None]  # slot_of[s]: slot s as [1]
        new: list[int] = []
        while len(new) < max_tokens_generated:
            # The draft model reads what it has not read (1 or 2 tokens), then guesses k,
            # written after the text (the main model's decision overwrites them).
            step = self.draft_step
            for slot in range(drafted, length):
                logits = step(self.draft, draft_cache, text[:, slot : slot + 1], slot_of[slot],
                              slot_of[slot][None])  # fmt: skip
            draft_probs = []
            for i in range(k):
                q = sampling_probs(logits, **sampling)  # [1, d_vocab]
                if temperature == 0:
                    token = q.argmax(dim=-1)
                else:
                    token = torch.multinomial(q, 1, generator=generator)[:, 0]
                text[:, length + i] = token
                draft_probs.append(q)
                if i < k - 1:  # the last draft is proposed, not read
                    slot = length + i
                    logits = step(self.draft, draft_cache, text[:, slot : slot + 1],
                                  slot_of[slot], slot_of[slot][None])  # fmt: skip
            # The main model scores [last, d_1 .. d_k] in one pass.
            slots = slot_of[length - 1 : length + k, 0]
            feed = text[:, length - 1 : length + k]
            logits = self.verify(self.main, feed, main_cache, slots, slots[None])
            target = sampling_probs(logits, **sampling)  # [1, k + 1, d_vocab]
            tokens, accepted = rejection_sample(
                target, torch.stack(draft_probs, dim=1), feed[:, 1:].clone(),
                generator=generator, greedy=temperature == 0,
            )  # fmt: skip
            n_new, *row = torch.cat([accepted.sum(dim=1) + 1, tokens[0]]).tolist()  # one read
            got = row[:n_new]
            stats.main_passes += 1
            stats.fed += k + 1
            stats.drafted += k
            stats.accepted += n_new - 1
            stats.tested += min(n_new, k)
            stats.per_round.append(n_new)
            text[0, length : length + n_new] = tokens[0, :n_new]
            drafted = length + min(n_new - 1, k - 1)  # the accepted drafts the draft model read
            length += n_new
            new += got
            if stop_at_eos and eos in got:
                new = new[: new.index(eos) + 1]
                break
        new = new[:max_tokens_generated]
        stats.tokens += len(new)
        return torch.tensor(ids + new)
