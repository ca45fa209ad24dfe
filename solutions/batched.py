"""Batched generation: several prompts of different lengths in one forward pass per step.

The prompts are padded on the LEFT, so that every row's newest token sits in the last column
and one `logits[:, -1]` serves the whole batch. An attention mask (False at padding) keeps
padding out of every real token's attention, and each row counts its positions from its own
first real token, so a row computes what it would compute alone.
"""

import torch
from jaxtyping import Bool, Int
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.kv_cache import KeyValueCache
from solutions.sampling import check_sampling_args, sample_next_token


def left_pad(
    prompts: list[list[int]], pad_id: int
) -> tuple[Int[Tensor, "batch seq"], Bool[Tensor, "batch seq"]]:
    """The prompts as one tensor, each row right-aligned after `pad_id`s, and the mask that is
    True at real tokens."""
    # BEGIN SOLUTION
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if prompt:
            tokens[row, -len(prompt) :] = torch.tensor(prompt)
            mask[row, -len(prompt) :] = True
    return tokens, mask
    # END SOLUTION


@torch.inference_mode()
def generate_batch_tokens(
    model: nn.Module,
    tokens: Int[Tensor, "batch seq"],
    mask: Bool[Tensor, "batch seq"],
    max_tokens_generated: int,
    eos: int,
    generator: torch.Generator | None = None,
    stop_at_eos: bool = True,
    **kwargs,
) -> KeyValueCache:
    """Continue the left-padded prompts `tokens` (`mask`: True at real tokens) all at once, by
    up to `max_tokens_generated` tokens each. Returns the cache of the whole batch: its `tokens`
    and `mask` hold every row's text. A row is done after its `eos` (with `stop_at_eos`); from
    then on it is fed padding. `kwargs` go to `sample_next_token`."""
    # BEGIN SOLUTION
    logits, cache = forward_with_cache(model, tokens, attention_mask=mask)
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_tokens_generated):
        # The mask keeps padding out of the frequency penalty's counts.
        next_token = sample_next_token(
            cache.tokens, logits[:, -1], generator=generator, attention_mask=cache.mask, **kwargs
        )
        # A finished row keeps stepping (the batch moves together) but only on padding.
        next_token = torch.where(done, eos, next_token)
        logits, cache = forward_with_cache(
            model, next_token[:, None], cache, attention_mask=~done[:, None]
        )
        done = done | (stop_at_eos & (next_token == eos))
        if bool(done.all()):
            break
    # END SOLUTION
    return cache


def generate_batch(
    model: nn.Module,
    tokenizer,
    prompts: list[str],
    max_tokens_generated: int = 100,
    seed: int | None = None,
    stop_at_eos: bool = True,
    **kwargs,
) -> list[str]:
    """Continue every prompt at once, with a cache. Returns each prompt and its continuation,
    which stops after the end-of-text token (kept) or `max_tokens_generated` tokens.

    `kwargs` go to `sample_next_token` (temperature, top_k, top_p, frequency_penalty). One
    random generator serves the whole batch, so sampled text differs from one-prompt-at-a-time
    runs under the same seed (it follows the same distribution); greedy text is the same. The
    batch does not slide past `n_ctx`: the longest prompt plus `max_tokens_generated` must fit.
    """
    checks.prompt_texts(prompts)
    checks.integer("max_tokens_generated", max_tokens_generated, low=0)
    check_sampling_args(**kwargs)
    model.eval()
    n_ctx = model.cfg.n_ctx
    ids = [tokenizer.encode(p) for p in prompts]
    longest = max(len(p) for p in ids)
    if longest + max_tokens_generated > n_ctx:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_tokens_generated="
            f"{max_tokens_generated} passes n_ctx={n_ctx}; generate long texts one at a time"
        )
    device = next(model.parameters()).device
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    eos = tokenizer.eos_token_id
    tokens, mask = (t.to(device) for t in left_pad(ids, pad_id=eos))
    cache = generate_batch_tokens(
        model, tokens, mask, max_tokens_generated, eos, generator, stop_at_eos, **kwargs
    )
    # Each row: its real tokens (the mask), up to and including its first end-of-text.
    texts = []
    for row, row_mask, prompt in zip(cache.tokens, cache.mask, ids, strict=True):
        real = row[row_mask].tolist()
        new = real[len(prompt) :]
        if stop_at_eos and eos in new:
            new = new[: new.index(eos) + 1]
        texts.append(tokenizer.decode(prompt + new))
    return texts
