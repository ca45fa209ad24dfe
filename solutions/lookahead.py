"""Lookahead decoding: several tokens per main-model pass, with no drafter at all.

Jacobi iteration guesses the next n tokens at once and refines every guess in parallel, each
from the guesses before it. It rarely fixes more than one token per pass, but its guesses leave
a trail: column by column, the tokens it tried form n-grams the model itself produced.
Lookahead decoding keeps that trail as a 2-D window (the lookahead branch), collects its
n-grams into a pool, and checks up to G pooled n-grams that start with the newest token (the
verification branch), all in ONE forward pass of the main model. The attention mask keeps the
branches apart; it is the whole idea.

Layout of one pass, after the cache (the text but its newest token, `last`):

    last | level 0 (W tokens) | ... | level L-1 (W tokens) | candidate 0 (N-1) | ... | cand. G'-1

Level j, column i guesses the token at position i + j + 1 after `last`. A window token reads
`last`, level 0 before its column, and its own column up to its level: a full text of guesses.
Candidate g's k-th token sits at k + 1 after `last` and reads `last` and candidate g up to
itself. Nothing reads across branches.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.kv_cache import KeyValueCache
from solutions.speculative_generation import SpeculativeStats


@torch.inference_mode()
def jacobi_step(
    main: nn.Module, cache: KeyValueCache, last: int, guesses: Int[Tensor, "n"]
) -> Int[Tensor, "n"]:
    """One Jacobi iteration for one text: the main model's greedy token at each of the n
    positions after `last`, each read from the CURRENT guesses before it (not yet updated)."""
    feed = torch.cat([guesses.new_tensor([last]), guesses])[None]  # [1, n + 1]
    logits, _ = forward_with_cache(main, feed, cache)  # the cache is read, not kept
    # The logits at `last` predict position 1; those at guess i, position i + 1. The last
    # guess's prediction falls outside the n positions.
    return logits[0, :-1].argmax(dim=-1)


@torch.inference_mode()
def jacobi_decode(
    main: nn.Module, prompt: list[int], n: int, start: Int[Tensor, "n"] | None = None
) -> list[Int[Tensor, "n"]]:
    """Jacobi iteration from `start` (default: n copies of the prompt's last token) to its fixed
    point, which is greedy decoding's next n tokens. Returns every iterate, the start first."""
    checks.integer("n", n, low=1)
    device = next(main.parameters()).device
    cache = None
    if len(prompt) > 1:
        _, cache = forward_with_cache(main, torch.tensor([prompt[:-1]], device=device))
    guesses = torch.full((n,), prompt[-1], device=device) if start is None else start
    history = [guesses]
    for _ in range(n):  # position i is exact after i iterations at most: n always suffice
        guesses = jacobi_step(main, cache, prompt[-1], guesses)
        if torch.equal(guesses, history[-1]):
            break
        history.append(guesses)
    return history


def lookahead_layout(
    n_levels: int, window: int, n_candidates: int, ngram: int
) -> tuple[Int[Tensor, "new"], Bool[Tensor, "new new"]]:
    """One pass's `offsets` (each token's position after `last`, which is at 0) and `allowed`
    (True where the token of row q may read the token of column k) for `last`, then `n_levels`
    levels of `window` guesses, then `n_candidates` candidates of ngram - 1 tokens."""
    W, L, C = window, n_levels, ngram - 1
    n_new = 1 + L * W + n_candidates * C
    offsets = torch.zeros(n_new, dtype=torch.long)
    allowed = torch.zeros(n_new, n_new, dtype=torch.bool)

    def at(level: int, column: int) -> int:  # the pass's index of window token (level, column)
        return 1 + level * W + column

    # BEGIN SOLUTION
    allowed[:, 0] = True  # every token follows `last`
    for j in range(L):
        for i in range(W):
            q = at(j, i)
            offsets[q] = 1 + i + j
            # Positions 1 .. i: level 0 before this column (the oldest guesses, one per position).
            allowed[q, [at(0, c) for c in range(i)]] = True
            # Positions i + 1 .. i + j + 1: this column's trajectory, oldest first, then itself.
            allowed[q, [at(level, i) for level in range(j + 1)]] = True
    first = 1 + L * W
    for g in range(n_candidates):
        for k in range(C):
            q = first + g * C + k
            offsets[q] = 1 + k
            allowed[q, first + g * C : q + 1] = True  # its own candidate, up to itself
    # END SOLUTION
    return offsets, allowed


def harvest(
    levels: Int[Tensor, "n_levels window"], new: Int[Tensor, "window"]
) -> list[tuple[int, tuple[int, ...]]]:
    """The n-grams a full window completes: column i's trajectory levels[0, i], ...,
    levels[-1, i], then new[i], the token this pass predicted after it (n = n_levels + 1
    consecutive positions). Each as (key, continuation): its first token, then the rest."""
    # BEGIN SOLUTION
    grams = torch.cat([levels, new[None]], dim=0).T  # [window, ngram]: one n-gram per column
    return [(int(g[0]), tuple(g[1:].tolist())) for g in grams]
    # END SOLUTION


class NgramPool:
    """n-grams seen so far, by first token: up to `size` continuations (ngram - 1 tokens) per
    key, the most recently seen first."""

    def __init__(self, ngram: int, size: int):
        self.ngram, self.size = ngram, size
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def add(self, key: int, continuation: tuple[int, ...]) -> None:
        entries = self.table.setdefault(key, [])
        if continuation in entries:
            entries.remove(continuation)
        entries.insert(0, continuation)
        del entries[self.size :]

    def add_text(self, text: list[int], start: int = 0) -> None:
        """The n-grams of `text` that begin at index `start` or later (the text's own n-grams
        are candidates too: a continuation often repeats its prompt)."""
        for i in range(start, len(text) - self.ngram + 1):
            self.add(text[i], tuple(text[i + 1 : i + self.ngram]))

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        return list(self.table.get(key, []))


def gumbel_noise(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | None = None
) -> Tensor:
    """Standard Gumbel noise, -log(-log U) (U kept above 0, where log would be -inf), on
    `device` (by default the generator's, or the CPU without one)."""
    if device is None:
        device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(shape, generator=generator, device=device)
    u = u.clamp(min=torch.finfo(torch.float32).tiny)
    return -torch.log(-torch.log(u))


def verify(
    first_logits: Float[Tensor, "d_vocab"],
    candidate_logits: Float[Tensor, "n_cand n d_vocab"],
    candidates: Int[Tensor, "n_cand n"],
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[list[int], int, int]:
    """Which candidate n-gram the main model keeps, and how much of it. `first_logits` is the
    model's prediction after `last`; candidate_logits[g, k] its prediction after candidate g's
    tokens 0..k. Returns the emitted tokens (the kept run of one candidate, then the model's
    own token after it), that candidate's index and the run's length. Exact: every emitted
    token follows softmax(logits / temperature) given the tokens before it."""
    if candidates.shape[0] == 0:  # nothing to check: the model's own token only
        candidates = candidates.new_zeros(1, 0)
        candidate_logits = candidate_logits.new_zeros(1, 0, first_logits.shape[-1])
    n_cand, n = candidates.shape
    # logits[g, k]: the model's distribution at candidate g's position k (the last one, k = n,
    # is the token after a fully kept candidate). Position 0 reads `last` alone, for every g.
    logits = torch.cat([first_logits.expand(n_cand, 1, -1), candidate_logits], dim=1).float()
    # BEGIN SOLUTION
    if temperature == 0:
        picks = logits.argmax(dim=-1)  # [n_cand, n + 1]
    else:
        # ONE draw of noise per position, shared by every candidate: candidates that agree so
        # far have the same logits there, so they pick the same token; that token is a sample
        # of the model's distribution given the text so far (the Gumbel-max trick).
        noise = gumbel_noise((n + 1, logits.shape[-1]), generator, logits.device)
        picks = (logits / temperature + noise).argmax(dim=-1)
    matches = picks[:, :n] == candidates  # [n_cand, n]
    runs = matches.int().cumprod(dim=1).sum(dim=1)  # each candidate's kept run
    best = int(runs.argmax())
    run = int(runs[best])
    # END SOLUTION
    return candidates[best, :run].tolist() + [int(picks[best, run])], best, run


def verify_naive(
    first_logits: Float[Tensor, "d_vocab"],
    candidate_logits: Float[Tensor, "n_cand n d_vocab"],
    candidates: Int[Tensor, "n_cand n"],
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[list[int], int, int]:
    """`verify` with FRESH noise for every candidate, the longest run kept: what one might write
    first. Greedy it is the same; sampling, it is biased (the notebook measures how much)."""
    if candidates.shape[0] == 0 or temperature == 0:
        return verify(first_logits, candidate_logits, candidates, temperature, generator)
    n_cand, n = candidates.shape
    logits = torch.cat([first_logits.expand(n_cand, 1, -1), candidate_logits], dim=1).float()
    # One draw of noise per candidate:
    noise = gumbel_noise((n_cand, n + 1, logits.shape[-1]), generator, logits.device)
    picks = (logits / temperature + noise).argmax(dim=-1)
    runs = (picks[:, :n] == candidates).int().cumprod(dim=1).sum(dim=1)
    best = int(runs.argmax())
    run = int(runs[best])
    return candidates[best, :run].tolist() + [int(picks[best, run])], best, run


@dataclass
class LookaheadState:
    """What one text carries from pass to pass."""

    cache: KeyValueCache  # the main model's cache of the text but its newest token
    last: int  # the newest token
    levels: Int[Tensor, "n_levels window"]  # the lookahead window, oldest level first
    pool: NgramPool


@torch.inference_mode()
def lookahead_round(
    main: nn.Module,
    state: LookaheadState,
    ngram: int,
    guesses: int,
    temperature: float,
    generator: torch.Generator | None,
    verifier=verify,
) -> tuple[list[int], int]:
    """One pass of the main model: the lookahead branch's Jacobi step and the verification of
    up to `guesses` pooled n-grams that start with `last`. Updates `state` (cache, last,
    window, pool); returns the emitted tokens and the number of candidates checked."""
    n_levels, window = state.levels.shape
    device = state.levels.device  # the model's (start_lookahead put the window there)
    found = state.pool.candidates(state.last)[:guesses]
    candidates = torch.tensor(found, dtype=torch.long, device=device)
    candidates = candidates.reshape(len(found), ngram - 1)
    offsets, allowed_new = lookahead_layout(n_levels, window, len(found), ngram)
    offsets, allowed_new = offsets.to(device), allowed_new.to(device)
    last = torch.tensor([state.last], device=device)
    feed = torch.cat([last, state.levels.flatten(), candidates.flatten()])
    past = state.cache.length
    first = 1 + n_levels * window  # the pass's index of candidate 0's first token
    # BEGIN SOLUTION
    # Every token of the pass reads the whole cache, then what the layout allows.
    read_cache = torch.ones(len(feed), past, dtype=torch.bool, device=device)
    allowed = torch.cat([read_cache, allowed_new], dim=1)
    logits, cache = forward_with_cache(
        main, feed[None], state.cache, positions=past + offsets, allowed=allowed
    )
    logits = logits[0]
    candidate_logits = logits[first:].reshape(len(found), ngram - 1, logits.shape[-1])
    emitted, best, run = verifier(logits[0], candidate_logits, candidates, temperature, generator)
    # The cache keeps `last` and the kept run of the chosen candidate, nothing of the window:
    # those keys were computed from guesses. The run's keys read only `last` and the run itself.
    keep = torch.zeros(cache.length, dtype=torch.bool, device=device)
    keep[: past + 1] = True
    start = past + first + best * (ngram - 1)
    keep[start : start + run] = True
    state.cache = cache.keep_only(keep[None])
    # END SOLUTION
    # The lookahead branch: the newest level's predictions are the next level (one Jacobi step
    # for every column). A full window first gives up its n-grams and its oldest level.
    new = logits[first - window : first].argmax(dim=-1)
    if n_levels == ngram - 1:
        for key, continuation in harvest(state.levels, new):
            state.pool.add(key, continuation)
        state.levels = torch.cat([state.levels[1:], new[None]])
    else:
        state.levels = torch.cat([state.levels, new[None]])
    state.last = emitted[-1]
    return emitted, len(found)


def start_lookahead(
    main: nn.Module,
    prompt: list[int],
    window: int,
    ngram: int,
    guesses: int,
    pool_from_prompt: bool = False,
) -> LookaheadState:
    """The state before the first pass: the prompt but its last token cached, a window of one
    level of prompt tokens (any start will do: it only decides which n-grams come first), and
    an empty pool, or with `pool_from_prompt` one that holds the prompt's own n-grams."""
    device = next(main.parameters()).device
    cache = KeyValueCache.new_empty(main.cfg, 1, device, main.embed.W_E.dtype)
    if len(prompt) > 1:
        _, cache = forward_with_cache(main, torch.tensor([prompt[:-1]], device=device))
    # Prompt tokens picked by a generator of its own: the caller's seed is for the samples.
    picks = torch.randint(len(prompt), (window,), generator=torch.Generator().manual_seed(0))
    levels = torch.tensor(prompt)[picks][None].to(device)  # [1, window], the model's device
    pool = NgramPool(ngram, guesses)
    if pool_from_prompt:
        pool.add_text(prompt)
    return LookaheadState(cache=cache, last=prompt[-1], levels=levels, pool=pool)


@torch.inference_mode()
def lookahead_generate(
    main: nn.Module,
    tokenizer,
    prompts: list[str],
    max_tokens_generated: int = 100,
    window: int = 5,
    ngram: int = 3,
    guesses: int = 5,
    temperature: float = 1.0,
    seed: int | None = None,
    stop_at_eos: bool = True,
    stats: SpeculativeStats | None = None,
    return_ids: bool = False,
    verifier=verify,
    pool_from_prompt: bool = False,
) -> list[str] | list[list[int]]:
    """Continue every prompt (one at a time) with lookahead decoding: each prompt and its
    continuation, up to its first end-of-text with `stop_at_eos`, as `speculative_generate`
    gives them. `window` W columns, n-grams of `ngram` N tokens (the window keeps N - 1
    levels), up to `guesses` G candidates checked per pass. Pass a `SpeculativeStats` to count
    main-model passes (`drafted` / `accepted` count candidate tokens); `return_ids` gives token
    ids. `verifier=verify_naive` runs the biased variant (for measuring it).

    The pool holds the n-grams the lookahead branch wrote. `pool_from_prompt=True` also puts in
    the text's own n-grams: the prompt's before the first pass, then those that each pass's
    emitted tokens complete (prompt lookup's idea, inside lookahead decoding). Off by default,
    as `POOL_FROM_PROMPT` is in the original implementation (hao-ai-lab/LookaheadDecoding,
    `lade/decoding.py`), where the same switch covers both."""
    checks.prompt_texts(prompts)
    checks.integer("max_tokens_generated", max_tokens_generated, low=0)
    checks.integer("window", window, low=1, high=64)
    checks.integer("ngram", ngram, low=2, high=16)
    checks.integer("guesses", guesses, low=0, high=64)
    checks.number("temperature", temperature, low=0.0)
    if not isinstance(pool_from_prompt, bool):
        raise ValueError(f"pool_from_prompt must be True or False, got {pool_from_prompt!r}")
    ids = [tokenizer.encode(p) for p in prompts]
    longest = max(map(len, ids))
    # The last pass reads the cache (up to the prompt and max_tokens_generated - 1 tokens) and
    # up to 1 + (ngram - 1) * (window + guesses) tokens of its own: all must fit in n_ctx.
    widest = (ngram - 1) * (window + guesses)
    if longest + max_tokens_generated + widest > main.cfg.n_ctx:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_tokens_generated="
            f"{max_tokens_generated} plus the widest pass's (ngram - 1) * (window + guesses) = "
            f"{widest} tokens passes n_ctx={main.cfg.n_ctx}"
        )
    main.eval()
    stats = stats if stats is not None else SpeculativeStats()
    device = next(main.parameters()).device
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    eos = tokenizer.eos_token_id
    out = []
    for prompt in ids:
        state = start_lookahead(main, prompt, window, ngram, guesses, pool_from_prompt)
        text, new = list(prompt), []
        while len(new) < max_tokens_generated and not (stop_at_eos and eos in new):
            window_tokens = state.levels.numel()  # the pass's lookahead branch
            emitted, n_checked = lookahead_round(
                main, state, ngram, guesses, temperature, generator, verifier
            )
            stats.main_passes += 1
            stats.fed += 1 + window_tokens + n_checked * (ngram - 1)
            stats.per_round.append(len(emitted))
            if n_checked:
                stats.drafted += ngram - 1
                stats.tested += min(len(emitted), ngram - 1)
                stats.accepted += len(emitted) - 1
            if pool_from_prompt:  # the n-grams that end in the emitted tokens
                state.pool.add_text(text + emitted, start=max(len(text) - ngram + 1, 0))
            text += emitted
            new += emitted
        if stop_at_eos and eos in new:
            new = new[: new.index(eos) + 1]
        new = new[:max_tokens_generated]
        stats.tokens += len(new)
        out.append(prompt + new)
    if return_ids:
        return out
    return [tokenizer.decode(t) for t in out]
