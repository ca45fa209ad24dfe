"""Speculative generation: each round, a drafter guesses k tokens per row, the main model scores
all k + 1 positions in one cached pass, and `rejection_sample` decides. The text comes out
distributed exactly as the main model's own sampling (token for token the same at temperature
0), in fewer main-model passes.

Rows of a batch accept different numbers of tokens. Nobody waits: the rejected drafts become
padding in the main model's cache (chapter 4's mask), and `KeyValueCache.keep_only` compacts it
so that every row's real tokens stay right-aligned, as left padding.
"""

from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Int
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.batched import left_pad
from solutions.drafters import ModelDrafter, NgramDrafter, sampling_probs
from solutions.kv_cache import KeyValueCache
from solutions.sampling import check_sampling_args
from solutions.speculative import rejection_sample


@dataclass
class SpeculativeStats:
    """What a run cost: main-model passes (the prefill not counted) and tokens generated."""

    main_passes: int = 0
    tokens: int = 0
    drafted: int = 0
    tested: int = 0  # drafts the sampler tested: up to and including the first rejection
    accepted: int = 0
    per_round: list[int] = field(default_factory=list)  # new tokens of one row in one round
    fed: int = 0  # tokens the main model's passes read, over all passes (its pass widths)

    @property
    def acceptance(self) -> float:
        """alpha: the fraction of tested drafts kept (drafts after a rejection are not tested:
        counting them would make the drafter look worse the larger k is)."""
        return self.accepted / max(self.tested, 1)

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per row per main-model pass (1 without speculation)."""
        return sum(self.per_round) / max(len(self.per_round), 1)

    @property
    def mean_width(self) -> float:
        """Tokens per main-model pass, on average: what a pass costs depends on it."""
        return self.fed / max(self.main_passes, 1)

    @property
    def passes_per_token(self) -> float:
        return 1 / max(self.tokens_per_pass, 1e-9)


def speculative_round(
    main: nn.Module,
    cache: KeyValueCache,
    last: Int[Tensor, "batch"],
    drafter,
    k: int,
    sampling: dict,
    generator: torch.Generator | None,
    done: Bool[Tensor, "batch"],
) -> tuple[Int[Tensor, "batch k_plus_1"], Int[Tensor, "batch"], KeyValueCache]:
    """One round: drafts, one main-model pass over [last, drafts], the sampler's decision, and
    the main cache trimmed to what was accepted. Returns the sampler's `tokens` [batch, k + 1]
    (-1 after each row's new tokens), the number of new tokens per row, and the cache."""
    temperature = sampling["temperature"]
    drafts, draft_probs = drafter.propose(k, generator=generator, **sampling)
    # BEGIN SOLUTION
    # One pass of the main model over the newest token and the k drafts: position i's logits
    # are the main model's distribution for draft i + 1; the last position's, for the bonus.
    feed = torch.cat([last[:, None], drafts], dim=1)  # [batch, k + 1]
    logits, cache = forward_with_cache(main, feed, cache)
    target = sampling_probs(logits, **sampling)  # [batch, k + 1, d_vocab]
    if draft_probs is None:  # a sure guess: q is one-hot at the draft
        draft_probs = torch.nn.functional.one_hot(drafts, target.shape[-1]).float()
    tokens, accepted = rejection_sample(
        target, draft_probs, drafts, generator=generator, greedy=temperature == 0
    )
    # The rejected drafts never happened: turn them into padding (finished rows keep nothing).
    keep = torch.cat([torch.ones_like(accepted[:, :1]), accepted], dim=1) & ~done[:, None]
    mask = cache.mask.clone()
    mask[:, -(k + 1) :] &= keep
    cache = cache.keep_only(mask)
    n_new = accepted.sum(dim=1) + 1
    # END SOLUTION
    if not bool(((n_new >= 1) & (n_new <= k + 1)).all()):
        raise ValueError(
            f"n_new must count each row's new tokens, from 1 (no draft accepted: the main "
            f"model's own token only) to k + 1 = {k + 1}; got {n_new.tolist()}"
        )
    next_token = tokens.gather(1, (n_new - 1)[:, None])[:, 0]
    drafter.accept(accepted=accepted, drafts=drafts, next_token=next_token, done=done)
    return tokens, n_new, cache


def start_speculation(
    main: nn.Module,
    draft: nn.Module | None,
    texts: list[list[int]],
    pad_id: int,
    drafter: str = "model",
    ngram: int = 2,
) -> tuple[KeyValueCache, ModelDrafter | NgramDrafter, Int[Tensor, "batch"]]:
    """The main model's cache of the left-padded prompts but their last token, the drafter
    (started), and the last tokens: the state before the first round. The drafter reads
    `texts`, the generator's own lists, as they grow."""  # fmt: skip
    device = next(main.parameters()).device
    tokens, mask = (t.to(device) for t in left_pad(texts, pad_id=pad_id))
    cache = KeyValueCache.new_empty(main.cfg, len(texts), device, main.embed.W_E.dtype)
    if tokens.shape[1] > 1:  # the last prompt token goes with the first round's drafts
        _, cache = forward_with_cache(main, tokens[:, :-1], attention_mask=mask[:, :-1])
    if drafter == "model":
        helper = ModelDrafter(draft.eval())
        helper.start(tokens, mask)
    else:
        helper = NgramDrafter(ngram)
        helper.start(texts, device)
    return cache, helper, tokens[:, -1]


class _Recorder:
    """A drafter that remembers its last proposal (for `trace_rounds`)."""

    def __init__(self, inner):
        self.inner, self.drafts = inner, None

    def propose(self, k, **kwargs):
        self.drafts, probs = self.inner.propose(k, **kwargs)
        return self.drafts, probs

    def accept(self, **outcome):
        self.inner.accept(**outcome)


@torch.inference_mode()
def trace_rounds(
    main: nn.Module, draft: nn.Module, tokenizer, prompt: str, k: int = 4, n_rounds: int = 6
) -> list[dict]:
    """The first greedy rounds on one prompt, for a picture: per round the drafts (as
    strings), how many were kept, and the main model's token."""
    texts = [tokenizer.encode(prompt)]
    cache, helper, last = start_speculation(main, draft, texts, tokenizer.eos_token_id)
    recorder, done = _Recorder(helper), torch.zeros(1, dtype=torch.bool)
    sampling = {"temperature": 0.0, "top_k": None, "top_p": None}
    rounds = []
    for _ in range(n_rounds):
        tokens, n_new, cache = speculative_round(
            main, cache, last, recorder, k, sampling, None, done
        )
        n = int(n_new[0]) - 1
        main_token = int(tokens[0, n])
        rounds.append({
            "drafts": [tokenizer.decode([t]) for t in recorder.drafts[0].tolist()],
            "accepted": n,
            "main": tokenizer.decode([main_token]),
        })  # fmt: skip
        texts[0] += tokens[0, : n + 1].tolist()
        last = tokens[:, n]
    return rounds


@torch.inference_mode()
def speculative_generate(
    main: nn.Module,
    draft: nn.Module | None,
    tokenizer,
    prompts: list[str],
    k: int = 4,
    max_tokens_generated: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_at_eos: bool = True,
    drafter: str = "model",
    ngram: int = 2,
    stats: SpeculativeStats | None = None,
    return_ids: bool = False,
) -> list[str] | list[list[int]]:
    """Continue every prompt, k drafted tokens per round, as `generate_batch` does (each prompt
    and its continuation, up to its first end-of-text with `stop_at_eos`). `drafter` is "model"
    (the `draft` model) or "ngram" (prompt lookup of the last `ngram` tokens; `draft` unused).
    Pass a `SpeculativeStats` to learn how many main-model passes it took; `return_ids` gives
    token ids (prompt and continuation) instead of texts."""
    checks.prompt_texts(prompts)
    checks.integer("k", k, low=1, high=16)
    checks.integer("max_tokens_generated", max_tokens_generated, low=0)
    check_sampling_args(temperature, top_k, top_p)
    if drafter not in ("model", "ngram"):
        raise ValueError(f'drafter must be "model" or "ngram", got {drafter!r}')
    if drafter == "model" and draft is None:
        raise ValueError('drafter="model" needs a draft model')
    if drafter == "model" and draft.cfg.d_vocab != main.cfg.d_vocab:
        raise ValueError(
            f"the draft model's vocabulary ({draft.cfg.d_vocab}) must be the main model's "
            f"({main.cfg.d_vocab}): they must share a tokenizer"
        )
    ids = [tokenizer.encode(p) for p in prompts]
    longest = max(map(len, ids))
    n_ctx = min(main.cfg.n_ctx, draft.cfg.n_ctx if drafter == "model" else main.cfg.n_ctx)
    if longest + max_tokens_generated + k + 1 > n_ctx:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_tokens_generated="
            f"{max_tokens_generated} plus k + 1 = {k + 1} passes n_ctx={n_ctx}"
        )
    main.eval()
    stats = stats if stats is not None else SpeculativeStats()
    device = next(main.parameters()).device
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    eos = tokenizer.eos_token_id

    texts = [list(p) for p in ids]
    cache, helper, last = start_speculation(main, draft, texts, eos, drafter, ngram)
    batch = len(ids)
    new = [[] for _ in ids]
    done = torch.tensor([max_tokens_generated == 0] * batch, device=device)
    while not bool(done.all()):
        out, n_new, cache = speculative_round(
            main, cache, last, helper, k, sampling, generator, done
        )
        stats.main_passes += 1
        stats.fed += k + 1
        for row in range(batch):
            if done[row]:
                continue
            got = out[row, : int(n_new[row])].tolist()
            stats.drafted += k
            stats.accepted += len(got) - 1
            stats.tested += min(len(got), k)  # the kept ones, and the rejected one if any
            stats.per_round.append(len(got))
            new[row] += got
            texts[row] += got
            if stop_at_eos and eos in new[row]:
                new[row] = new[row][: new[row].index(eos) + 1]
                done[row] = True
            if len(new[row]) >= max_tokens_generated:
                new[row] = new[row][:max_tokens_generated]
                done[row] = True
        last = out.gather(1, (n_new - 1)[:, None])[:, 0]
    stats.tokens += sum(map(len, new))
    if return_ids:
        return [p + n for p, n in zip(ids, new, strict=True)]
    return [tokenizer.decode(p + n) for p, n in zip(ids, new, strict=True)]
