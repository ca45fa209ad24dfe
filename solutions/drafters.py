"""Drafters for speculative decoding: who guesses the next k tokens.

Any guess keeps speculative decoding exact (the rejection sampler sees to that); a good guess
makes it fast. Two drafters:

- `ModelDrafter`: a small model with its own KV cache, sampling k tokens one at a time with the
  same temperature / top-k / top-p as the main model. After each round its cache must forget
  the drafts the main model rejected.
- `NgramDrafter`: no model at all. It looks up the last n tokens earlier in the text and
  proposes what followed them there (prompt lookup). Its guess is a sure thing, a one-hot q.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.kv_cache import KeyValueCache
from solutions.sampling import apply_temperature, filter_top_k, filter_top_p


def sampling_probs(
    logits: Float[Tensor, "... d_vocab"],
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Float[Tensor, "... d_vocab"]:
    """The distribution chapter 3's sampler draws from: logits / temperature, then top-k or
    top-p, then softmax. Temperature 0 is greedy: all the mass on the argmax."""
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1]).float()
    if temperature == 0:
        return F.one_hot(flat.argmax(dim=-1), shape[-1]).float().reshape(shape)
    flat = apply_temperature(flat, temperature)
    if top_k:
        flat = filter_top_k(flat, top_k)
    if top_p is not None and top_p < 1.0:
        flat = filter_top_p(flat, top_p)
    return flat.softmax(dim=-1).reshape(shape)


def ngram_propose(text: list[int], k: int, n: int = 2) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the text's last n
    tokens (the occurrence may overlap the end, but must start before it). [] if the last n
    tokens occur nowhere earlier (or the text is shorter than n + 1)."""
    # BEGIN SOLUTION
    pattern = text[-n:]
    # Most recent first: the latest earlier start is len(text) - n - 1 (none if the text is
    # no longer than n).
    for start in range(len(text) - n - 1, -1, -1):
        if text[start : start + n] == pattern:
            return text[start + n : start + n + k]
    return []
    # END SOLUTION


class NgramDrafter:
    """Prompt lookup: per row, the k tokens after the last earlier match of its last n tokens,
    filled up with the row's last token where the lookup proposes fewer (any filler keeps the
    sampling exact; it is just unlikely to be accepted)."""

    def __init__(self, n: int = 2):
        self.n = checks.integer("ngram n", n, low=1)

    def start(self, texts: list[list[int]], device: torch.device | str | None = None) -> None:
        self.texts = texts  # the generator's own lists: they grow as the text does
        self.device = device

    def propose(self, k: int, **_sampling) -> tuple[Int[Tensor, "batch k"], None]:
        rows = []
        for text in self.texts:
            guess = ngram_propose(text, k, self.n)
            rows.append(guess + [guess[-1] if guess else text[-1]] * (k - len(guess)))
        return torch.tensor(rows, device=self.device), None  # q: one-hot at the proposals

    def accept(self, **_outcome) -> None:
        pass  # nothing to forget: the next lookup reads the texts as they are now


class ModelDrafterBase:
    """A small model with its own cache (given: `start` and `propose`). `pending` holds the
    tokens of the text it has not fed yet: the last prompt token at the start, then after each
    round the main model's token (and the last draft, when all k were accepted: the drafter
    proposed it without feeding it). `pending_mask` is False where a row's pending column is
    padding. `fed` is the number of columns the last `propose` added to the cache."""

    def __init__(self, model: nn.Module):
        self.model = model

    def start(self, tokens: Int[Tensor, "batch seq"], mask: Bool[Tensor, "batch seq"]) -> None:
        """Prefill all but the last column (the main model feeds that one with the drafts)."""
        cfg = self.model.cfg
        batch = tokens.shape[0]
        device = tokens.device
        dtype = self.model.embed.W_E.dtype
        self.cache = KeyValueCache.new_empty(cfg, batch, device, dtype)
        if tokens.shape[1] > 1:
            _, self.cache = forward_with_cache(
                self.model, tokens[:, :-1], attention_mask=mask[:, :-1]
            )
        self.pending, self.pending_mask = tokens[:, -1:], mask[:, -1:]

    def propose(
        self, k: int, temperature: float, top_k, top_p, generator
    ) -> tuple[Int[Tensor, "batch k"], Float[Tensor, "batch k d_vocab"]]:
        """k draft tokens per row and the distributions they were drawn from."""
        feed, feed_mask = self.pending, self.pending_mask
        drafts, probs = [], []
        for i in range(k):
            logits, self.cache = forward_with_cache(self.model, feed, self.cache, feed_mask)
            q = sampling_probs(logits[:, -1], temperature, top_k, top_p)  # [batch, d_vocab]
            if temperature == 0:
                token = q.argmax(dim=-1)
            else:
                token = torch.multinomial(q, 1, generator=generator)[:, 0]
            drafts.append(token)
            probs.append(q)
            if i < k - 1:  # the last draft is proposed, not fed
                feed, feed_mask = token[:, None], torch.ones_like(token[:, None], dtype=torch.bool)
        self.fed = self.pending.shape[1] + k - 1  # columns this round added to the cache
        return torch.stack(drafts, dim=1), torch.stack(probs, dim=1)


class ModelDrafter(ModelDrafterBase):
    """The model drafter, with what it does after the main model's decision."""

    def accept(
        self,
        accepted: Bool[Tensor, "batch k"],
        drafts: Int[Tensor, "batch k"],
        next_token: Int[Tensor, "batch"],
        done: Bool[Tensor, "batch"],
        **_outcome,
    ) -> None:
        """Forget the rejected drafts this round fed, and queue what the drafter has not seen."""
        # BEGIN SOLUTION
        k = accepted.shape[1]
        # This round fed the pending tokens, then drafts 1 .. k-1: keep the accepted ones. A
        # finished row keeps nothing new.
        keep = torch.cat([self.pending_mask, accepted[:, : k - 1]], dim=1) & ~done[:, None]
        mask = self.cache.mask.clone()
        mask[:, -self.fed :] &= keep
        self.cache = self.cache.keep_only(mask)
        # Not yet fed: the last draft if all k were accepted, then the main model's token.
        all_kept = accepted.all(dim=1)
        self.pending = torch.stack([drafts[:, -1], next_token], dim=1)
        self.pending_mask = torch.stack([all_kept, torch.ones_like(all_kept)], dim=1)
        self.pending_mask &= ~done[:, None]
        if not bool(all_kept.any()):  # nobody needs the first column
            self.pending, self.pending_mask = self.pending[:, 1:], self.pending_mask[:, 1:]
        # END SOLUTION
