# %% [markdown]
# # Chapter 6 — Speculative decoding
#
# Chapter 4 made each step cheap: one token through the model, reading the cache. It is still
# one step, one main-model pass, per token. **Speculative decoding** lets a big model emit
# several tokens per pass without changing *what* it samples: a cheap **drafter** guesses the
# next $k$ tokens, the main model scores all of them in one cached pass of $k + 1$ positions,
# and a **rejection sampler** decides how many of the guesses to keep. Whatever the drafter
# guesses, the text that comes out is distributed exactly as if the main model had sampled
# every token itself. The serving engines vLLM and TensorRT-LLM ship it, and so does HF
# `transformers` as "assisted generation" (sources under Further reading).
#
# What you write:
#
# - `rejection_sample_one` and `acceptance_rate`: rejection sampling for one distribution,
#   and the probability that it keeps the draft;
# - `rejection_sample`: the same for a batch of rows and $k$ positions at once: vLLM's layout
#   of the output tokens (padded with $-1$), and a mask of the accepted drafts;
# - `ngram_propose` and `ModelDrafter.accept`: two drafters, a lookup in the text so far and a
#   small model whose cache forgets the rejected guesses;
# - `speculative_round`: one round of draft, verify and decide for a batch, with the main
#   model's cache trimmed to what was accepted (the loop around it is given);
# - `gumbel_sample`: sampling as an argmax of noisy logits, the Gumbel-max trick;
# - `same_token_shared_gumbel`, `same_token_independent`, `same_token_rejection`: how often two
#   distributions pick the same token, under three ways of sharing their randomness;
# - `lookahead_layout`, `harvest`, `verify` and `lookahead_round`: lookahead decoding, where
#   the main model guesses for itself: the attention mask of a pass that guesses and checks at
#   once, the n-grams its guesses leave, their exact verification with shared noise, and the
#   pass with its cache.
#
# Then you measure when all this pays, on this machine, and see why the answer would differ on
# a GPU.
#
# As before, the ground truth comes from outside the course's code: exact probabilities (every
# sampler is checked with chi-square tests of stated false-failure probability), HF's
# `generate` for greedy text, HF's draft model for the drafter's cache, numerical integrals
# and simulations for the coupling formulas.
#
# **Time:** about 4 hours 40 minutes (the exercises' estimates below add up to it).
# **You need:** chapter 3's sampler (softmax, temperature, top-k,
# top-p) and chapter 4's `forward_with_cache`. Both are imported from `solutions`.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it.
# `pytest -m rejection_sample` and `course grade 6` grade your saved notebook;
# `show_solution("rejection_sample")` prints the reference when you are truly stuck.
#
# Run the setup cell below first.

# %% tags=["setup"]
import math
import os
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions import KeyValueCache, checks, forward_with_cache, left_pad
from solutions.sampling import (
    apply_temperature,
    check_sampling_args,
    filter_top_k,
    filter_top_p,
)
from solutions.speculative import check_rejection_args
from solutions.speculative_generation import trace_rounds
from utils.check import check
from utils.display import show_solution
from utils.models import load_model
from utils.plots import (
    plot_coupling,
    plot_lookahead_mask,
    plot_lookahead_window,
    plot_rejection_sampling,
    plot_speculative_rounds,
    plot_speedup,
)

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)

# %% [markdown]
# ## The two models
#
# The course ships two models trained on the same Shakespeare text with the same tokenizer:
# the **main** model of chapters 3 and 4 (4 layers, `d_model` 192) and a **draft** model
# (2 layers, `d_model` 128), with about a third of the main model's multiply-adds per token.
# Speculative decoding needs a small model that agrees with the big one often and costs much
# less per token; how much less this one costs on a CPU, section 7 measures.

# %%
MODEL = "shakespeare"  # "mine": chapter 2's model (the draft must share its tokenizer)
main, tokenizer = load_model(MODEL)
draft, _ = load_model("shakespeare-draft")
for name, m in [("main", main), ("draft", draft)]:
    n_params = sum(p.numel() for p in m.parameters())
    size = f"{m.cfg.n_layers} layers, d_model {m.cfg.d_model}"
    print(f"{name:5}: {size}, {n_params / 1e6:.2f} M parameters")

# %% tags=["claim"]
assert (main.cfg.n_layers, main.cfg.d_model, draft.cfg.n_layers, draft.cfg.d_model) == (
    4, 192, 2, 128), "the prose gives the two models' layers and d_model: fix it"  # fmt: skip
_mult = [sum(p.numel() for p in m.parameters() if p.dim() >= 2) - m.embed.W_E.numel()
         - m.pos_embed.W_pos.numel() for m in (main, draft)]  # fmt: skip
assert 0.3 < _mult[1] / _mult[0] < 0.4, "the prose says 'about a third of the multiply-adds'"
assert draft.cfg.d_vocab == 4096 and draft.unembed.W_U.numel() / _mult[1] > 0.5, (
    "section 7 says the unembedding onto 4,096 tokens is more than half the draft's"
)

# %% [markdown]
# ## 1. Rejection sampling, one distribution
#
# Start with one token. The main model's distribution for it is $p$, the **target**; the
# drafter's is $q$. We can afford to sample from $q$, and we want a sample from $p$. Rejection
# sampling turns one into the other:
#
# 1. Draw the draft token $x \sim q$.
# 2. Keep it with probability $\min\left(1, \frac{p(x)}{q(x)}\right)$: draw $u$ uniform in
#    $[0, 1)$ and keep $x$ if $u < p(x) / q(x)$.
# 3. Otherwise draw the token from the **residual** distribution
#    $r(y) = \frac{\max(0,\, p(y) - q(y))}{\sum_z \max(0,\, p(z) - q(z))}$.
#
# **Why the result is exactly $p$.** The token is $y$ in two ways: the draft was $y$ and was
# kept, with probability $q(y) \min(1, p(y)/q(y)) = \min(p(y), q(y))$; or a draft was rejected
# and the residual gave $y$. The first way gives $\min(p(y), q(y))$ of the mass $p(y)$ needs;
# the shortfall is $p(y) - \min(p(y), q(y)) = \max(0, p(y) - q(y))$, and that is exactly what
# the residual supplies. Check the amounts: a rejection happens with probability
# $1 - \sum_z \min(p(z), q(z)) = \sum_z \max(0, p(z) - q(z))$ (both distributions sum to 1),
# so the second way gives $y$ with probability
# $\sum_z \max(0, p(z) - q(z)) \cdot r(y) = \max(0, p(y) - q(y))$. Add the two:
# $\min(p, q) + \max(0, p - q) = p$. Nothing about $q$ survives: any drafter, good or bad,
# leaves the output distribution untouched. A bad drafter only gets rejected more often.
#
# **How often the draft is kept.** Summing the first way over $y$:
#
# $$\alpha = P(\text{keep}) = \sum_x q(x) \min\left(1, \frac{p(x)}{q(x)}\right)
#   = \sum_x \min(p(x), q(x)),$$
#
# the overlap of the two histograms: 1 when $q = p$, 0 when they share no token. Everything
# speculative decoding gains comes from $\alpha$.
#
# ### Exercise: `rejection_sample_one` and `acceptance_rate`
#
# *About 25 minutes.*
#
# `rejection_sample_one(target_probs, draft_probs, generator)` takes $p$ and $q$, 1-D
# `[d_vocab]` probability vectors, and returns `(token, kept)`: an `int` distributed as $p$,
# and whether the draft was kept. `acceptance_rate(target_probs, draft_probs)` returns
# $\sum_x \min(p(x), q(x))$ over the last dimension, for one pair `[d_vocab]` or a batch
# `[..., d_vocab]`. The argument checks are given.
#
# Common mistakes: drawing the draft from $p$ (then there is nothing to check); keeping with
# probability $p(x)$, forgetting $q(x)$; the ratio upside down; resampling from $p$ after a
# rejection instead of the residual (tokens that $q$ already covered then come out too often);
# $|p - q|$ instead of $\max(0, p - q)$; any random number drawn without `generator`.
#
# The tests draw 8,000 tokens for each of four pairs $(p, q)$ on six tokens: $q$ zero where $p$
# is not and the other way round, $p = q$, disjoint supports, a sharp $p$ under a flat $q$.
# They compare the tokens with $p$, the kept flags with $\alpha$, the kept tokens with
# $\min(p, q)$ and the others with the residual (chi-square tests; a correct solution fails
# one with probability at most $4 \times 10^{-5}$). `acceptance_rate` is compared with the
# sum written out. Your source is read too: a tensor you make must go on the probabilities'
# device (`device=`), as on a GPU they are there.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Three random numbers at most, each from `generator`: the draft, $u$, and (after a rejection
# only) the residual draw. The keep test $u < p(x) / q(x)$ divides by $q(x)$: what does it
# become when you multiply both sides by $q(x)$, which is positive for any token drawn from $q$?
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The draft: `torch.multinomial(probs, 1, generator=...)` draws one index from a 1-D row of
#   probabilities and returns it as a tensor of shape `[1]`; the function returns a Python
#   `int`.
# - $u$: `torch.rand` with the shape `()` and the generator gives one number in $[0, 1)$. A
#   kept draft is returned at once: the residual is needed only after a rejection.
# - The residual is section 1's formula: `clamp(min=0)` keeps the positive part of a tensor.
#   Scale it to sum to one before drawing from it. What if its sum is 0? The docstring says
#   where the token comes from then.
# - `acceptance_rate`: `torch.minimum` is the elementwise smaller of two tensors. Reduce over
#   the last dimension only, so that the same code serves one pair and a batch.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("rejection_sample_one")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="rejection_sample_one"
# solution: solutions.speculative.rejection_sample_one
# solution: solutions.speculative.acceptance_rate

# %%
check("rejection_sample_one")

# %% [markdown]
# **Predict, then run.** Below, $p$ and $q$ disagree on most tokens: $q$ puts nothing on token
# `a`, which $p$ likes most, and a fifth of its mass on token `f`, which $p$ rules out. What
# fraction of drafts will be kept, and what will the histogram of the output look like?
#
# <details><summary>What to expect</summary>
#
# $\alpha = \sum \min(p, q) = 0 + 0.1 + 0.2 + 0.1 + 0.1 + 0 = 0.5$: half the drafts are kept.
# The output histogram still matches $p$, token `a` included, although the drafter never
# proposes it: every `a` comes from the residual, after a rejection.
#
# </details>

# %%
p_demo = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.1, 0.0])
q_demo = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.2, 0.2])
g = torch.Generator().manual_seed(0)
n_demo = 2_000 if QUICK else 20_000
draws = [rejection_sample_one(p_demo, q_demo, g) for _ in range(n_demo)]
demo_tokens = torch.tensor([t for t, _ in draws])
kept_rate = sum(k for _, k in draws) / n_demo
alpha_demo = float(acceptance_rate(p_demo, q_demo))
print(f"kept {kept_rate:.3f} of the drafts; acceptance_rate says {alpha_demo:.3f}")
plot_rejection_sampling(
    p_demo, q_demo, demo_tokens, labels=list("abcdef"), title="Rejection sampling: the output is p"
)

# %% tags=["claim"]
assert abs(alpha_demo - 0.5) < 1e-6, "'What to expect' says alpha = 0.5 for this pair"

# %% [markdown]
# ## 2. The batched sampler
#
# In speculative decoding, the drafter proposes $k$ tokens in a row, $x_1, \dots, x_k$, each
# drawn from its own distribution $q_i$ given the text and the drafts before it. The main model
# then runs **once** on the $k + 1$ positions and returns $p_1, \dots, p_{k+1}$: $p_i$ is its
# distribution for position $i$ given the text and $x_1, \dots, x_{i-1}$. The sampler walks
# along the drafts:
#
# - Test $x_1$ against $p_1$ and $q_1$ as in section 1. Kept: go on to $x_2$, and so on.
# - At the **first rejection**, at position $i$, emit a **recovered** token from the residual
#   of $p_i$ and $q_i$, and stop. Every later draft is thrown away, even one that would pass its
#   own test: it was drafted after $x_i$, a token the main model did not take, so $p_{i+1}$ and
#   $q_{i+1}$ are distributions for a text that does not exist.
# - If all $k$ drafts are kept, emit a **bonus** token drawn from $p_{k+1}$, which the main
#   model computed anyway (its last position).
#
# So a round emits between 1 and $k + 1$ tokens, never 0: even when every guess is wrong, the
# main model's pass produced one token, as an ordinary step would.
#
# Serving engines do this for a whole batch at once, without a Python loop. vLLM's sampler
# (`vllm/v1/sample/rejection_sampler.py`) returns one tensor of token ids, `[batch, k + 1]`:
# per row the accepted drafts, then the recovered or bonus token, then `-1` (its
# `PLACEHOLDER_TOKEN_ID`). The course's sampler returns those `tokens` and, as its own
# convention, `accepted` `[batch, k]`, `True` up to the first rejection only (vLLM leaves the
# caller to count the tokens that are not `-1`):
#
# ```
#   drafts          kept?             accepted        tokens
#   [7, 3, 9]       yes yes yes       [T, T, T]       [7, 3, 9, b]      b: bonus, from p_4
#   [7, 3, 9]       yes no  (yes)     [T, F, F]       [7, r, -1, -1]    r: recovered, at position 2
#   [7, 3, 9]       no  (yes) (yes)   [F, F, F]       [r, -1, -1, -1]
# ```
#
# (In brackets: tests that do not count, because an earlier draft was rejected.)
#
# ### Exercise: `rejection_sample`
#
# *About 40 minutes.*
#
# `rejection_sample(target_probs, draft_probs, draft_tokens, generator=None, greedy=False)`
# takes `target_probs` `[batch, k + 1, d_vocab]`, `draft_probs` `[batch, k, d_vocab]` and
# `draft_tokens` `[batch, k]`, and returns `(tokens, accepted)` as above. The given
# `check_rejection_args` (imported by the setup cell) checks the shapes, that every row is a
# probability distribution, that the ids are in range and, when sampling, that no draft token
# has $q = 0$.
#
# With `greedy=True` (what temperature 0 uses) there is no randomness: a draft is kept if it
# is the target's argmax at its position, and the recovered or bonus token is the target's
# argmax. (At temperature 0 both distributions are one-hot, and the rule of section 1 gives
# exactly this; the greedy mode just skips the arithmetic.)
#
# No loop over rows or positions: a batch of 64 rows with $k = 8$ should cost a handful of
# tensor operations, not 512 Python steps. The work splits into three parts, each done for the
# whole batch at once:
#
# 1. Every draft's own test, section 1's, at every position, as if no draft before it had been
#    rejected (one uniform number per row and position).
# 2. Only the run before the first rejection counts: from the tests, the `accepted` mask, and
#    per row the number of drafts kept, which is also the column of `tokens` that receives the
#    main model's token.
# 3. One token per row from the main model: from the residual at the first rejected position,
#    or from $p_{k+1}$ in a row that kept all $k$ drafts.
#
# One edge the definition leaves open: a residual with no mass at all. The checks accept rows
# that sum to 1 within $10^{-3}$, so $p = (0, 0.9995)$ and $q = (0.0005, 0.9995)$ are both
# valid; draft 0 is always rejected ($p = 0$ there), and $\max(0, p - q)$ is zero everywhere.
# $p \le q$ everywhere means the two are the same distribution up to rounding, so the rounding
# caused the rejection: draw the token from $p$ itself. (`torch.multinomial` on a row of zeros
# raises. Serving engines differ here, and their tests do not check the token's distribution:
# `tests/peers/README.md` says what vLLM and FlashInfer return.)
#
# Common mistakes: keeping drafts after the first rejection; a bonus token after a rejection;
# testing draft `i` against `target_probs[:, i + 1]` (`target_probs[:, i]` is the main
# model's distribution for `draft_tokens[:, i]`); the residual taken at the wrong position;
# rejected drafts left in `tokens` instead of `-1`; `u` drawn without the generator.
#
# The tests: for $k = 1, \dots, 4$ and 20,000 rows (two halves with different distributions
# at each position), the token at every position a row reaches follows $p$ of that position,
# bonus included; for $k = 2$ and 4, the keep rates follow $\sum \min(p, q)$ and the recovered
# tokens the residual (chi-square, at most $10^{-4}$ false failures per test); rows and
# positions draw independently; the layout is checked on
# every row, and exactly on inputs where every outcome is forced; a residual of zero mass;
# greedy mode on rows that fail at the first, second and last draft; the generator; and, read
# from your source, every tensor made on the probabilities' device.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Test every draft as if it were the first: the tests do not depend on each other, only their
# use does. "Kept, and every draft before it kept too" is a running product along the
# positions. And every row, whatever happened, gets exactly one token from the main model,
# right after its kept run.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The drafted tokens' probabilities: `Tensor.gather(dim, index)` picks along `dim` the
#   entries that `index` names, and `index` must have as many dimensions as the tensor, so give
#   the drafts a trailing axis of length 1 (and drop it afterwards). `target_probs` has
#   $k + 1$ positions and the drafts $k$: which positions go with the drafts? You get
#   `[batch, k]` for $p$ and for $q$; then `torch.rand` of that shape with the generator, and
#   section 1's test. Greedy: compare the drafts with $p$'s argmax at their positions.
# - `cumprod` along the positions turns the tests (as 0 and 1) into the kept run; `accepted`
#   is a bool tensor. Its count per row, $n$ `[batch]`, is where the next token goes.
# - In a row that rejected a draft, the residual comes from position $n$. A row that kept all
#   $k$ has no rejected position, yet the batch computes a residual for every row: which
#   position can it use, knowing that `torch.where` will swap that row's distribution for
#   $p_{k+1}$? To take one position per row, index with two tensors, the row numbers
#   (`torch.arange(batch)`) and the positions: `[batch, d_vocab]`. Then one
#   `torch.multinomial` for all rows. Keep the residual of zero mass (above) in mind. Greedy:
#   $p$'s argmax at position $n$.
# - `tokens` starts as -1 everywhere (`torch.full`); the drafts go where `accepted` is True,
#   and each row's new token at its column $n$ (the same two-tensor indexing, now to write).
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("rejection_sample")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="rejection_sample"
# solution: solutions.speculative.rejection_sample

# %%
check("rejection_sample")

# %% [markdown]
# The three rows of the table above, with one-hot distributions so that every test's outcome
# is forced: the main model agrees with the drafts where the table says "yes" and puts all its
# mass on token 5 where it says "no"; the bonus distribution is a sure token 4.

# %%
one_hot = torch.eye(6)
demo_drafts = torch.tensor([[1, 2, 3]] * 3)
agree = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 1, 1]])  # 1: the main model agrees there
demo_target = torch.where(agree[..., None].bool(), one_hot[demo_drafts], one_hot[5])
demo_target = torch.cat([demo_target, one_hot[4].expand(3, 1, 6)], dim=1)  # [3, k + 1, 6]
demo_out, demo_accepted = rejection_sample(demo_target, one_hot[demo_drafts], demo_drafts)
print("accepted:\n", demo_accepted)
print("tokens:\n", demo_out)

# %% [markdown]
# ## 3. Speculative generation
#
# Now the whole loop. A **round** turns the text so far into a longer one:
#
# ```
#  main cache: the text but its newest token      last = the newest token
#  drafter:    proposes d1 ... dk                 (its own model and cache, section below)
#  main model: ONE cached pass over [last, d1, ..., dk]
#              position 0 reads `last` and gives p for d1; position i reads d_i and gives p
#              for d_(i+1); position k reads dk and gives p for the bonus token
#  sampler:    rejection_sample -> n kept drafts and one token from the main model
#  caches:     keep `last` and d1 ... dn; the rejected drafts never happened
#  next round: last = the main model's token (recovered or bonus)
# ```
#
# One main-model pass emits $n + 1$ tokens, between 1 and $k + 1$. At temperature 0 the
# sampler keeps a draft only if it is the main model's argmax, so the text is token for token
# what greedy decoding gives, in fewer passes.
#
# **Rows that accept different numbers of drafts.** In a batch, row 0 may keep all $k$ drafts
# while row 1 keeps none. Nobody has to wait, thanks to chapter 4's mask: the rejected drafts
# are already in the cache (the pass computed their keys and values), so the round marks their
# columns as padding. `KeyValueCache.keep_only(mask)` (given, in `KeyValueCache`) does that and
# compacts the cache: each row's real positions keep their order and move right, so the rows
# stay left-padded, and the columns that are padding in every row are dropped. The positions of
# the next tokens count real tokens only (chapter 4's `positions_and_allowed`), so a row never
# notices the drafts it rejected. The alternative, rolling every row back to the shortest one
# and re-feeding what the others had accepted, costs a pass per round; trimming by mask costs a
# sort and a gather.
#
# Only a row's *last* positions may be forgotten this way (the keys and values of a later
# position were computed with the earlier ones in view), and rejected drafts are always last.

# %% [markdown]
# ### A drafter that costs nothing: n-gram prompt lookup
#
# *About 15 minutes.*
#
# A draft model costs half a main-model step or more per token on a CPU (section 7 measures
# it). Text often repeats itself: names, stage directions, refrains, code. **Prompt lookup**
# drafts with no model at all: find the most recent earlier place where the text's last $n$
# tokens occurred, and propose the $k$ tokens that followed them there. With the course's
# tokenizer and $n = 2$, $k = 3$:
#
# ```
#   text:    What is the news? What is the reason? What is
#   last 2:  " What", " is"; most recently they were followed by " the", " reason", "?"
#   drafts:  " the", " reason", "?"
# ```
#
# **Why a sure guess stays exact.** The lookup's proposal is not drawn from a distribution: it
# is a token the drafter is sure of, a one-hot $q$ with $q(x) = 1$. Section 1's rule still
# applies: keep $x$ with probability $\min(1, p(x) / 1) = p(x)$; otherwise draw from
# $\max(0, p - q)$, which is $p$ with token $x$ removed, renormalised. Together: $x$ comes out
# with probability $p(x)$, and any other $y$ with probability $(1 - p(x)) \cdot p(y) /
# (1 - p(x)) = p(y)$. Exact again, and $\alpha = p(x)$: the lookup pays when the main model
# agrees with the text's history. The batched sampler needs $k$ drafts in every row, so where
# the lookup finds fewer, the given `NgramDrafter` fills up with the last token it proposed, or
# with the text's last token when it found nothing (a guess like any other: exact, rarely
# right).
#
# #### Exercise: `ngram_propose`
#
# `ngram_propose(text, k, n=2)` takes a list of token ids and returns a list of at most $k$ ids:
# those that followed the most recent earlier occurrence of `text[-n:]`. The occurrence must
# start before the end's own (`text[-n:]` itself does not count) but may overlap it; nothing
# found (or a text no longer than $n$): `[]`.
#
# Common mistakes: taking the oldest match instead of the most recent; letting the end match
# itself (it is followed by nothing); returning one token too few; changing `text`.
#
# The tests: seven hand-made cases (most recent match, fewer than $k$ tokens after it, no
# match, an overlapping match, $n$ = 1 and 3, a short text) and 300 random texts over a
# four-token vocabulary against the definition written as a list comprehension.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Walk the possible start positions from the latest to the earliest and stop at the first
# whose $n$ tokens equal the last $n$.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The end's own occurrence starts at index `len(text) - n`. An earlier one may overlap it
#   but must start before it: which is the latest start allowed? The earliest is 0.
# - Walk the starts from the latest down (a `range` with a negative step; check that it is
#   empty when the text has $n$ tokens or fewer), and stop at the first whose $n$ tokens, a
#   slice, equal the text's last $n$.
# - For a match that starts at $s$, at which index do the tokens that followed it begin? Take
#   at most $k$ of them: a slice that runs past the end of a list is cut short, not an error,
#   which is exactly the case "fewer than $k$ tokens after it". A slice is a copy, so `text`
#   stays as it was.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("ngram_propose")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="ngram_propose"
# solution: solutions.drafters.ngram_propose

# %% tags=["source"]
# solution: solutions.drafters.NgramDrafter

# %%
check("ngram_propose")

# %% tags=["claim"]
_ids = tokenizer.encode("What is the news? What is the reason? What is")
assert [tokenizer.decode([t]) for t in _ids[-2:]] == [" What", " is"], "the lookup example"
assert [tokenizer.decode([t]) for t in ngram_propose(_ids, 3, 2)] == [" the", " reason", "?"], (
    "the prompt-lookup example in section 3 no longer matches the tokenizer: fix the prose"
)

# %% [markdown]
# ### The draft model
#
# *About 20 minutes.*
#
# The draft model keeps its own cache, and the same bookkeeping applies to it. The given
# `ModelDrafterBase` has `start(tokens, mask)`, which prefills the prompts but their last
# token, and `propose(k, temperature, top_k, top_p, generator)`, which feeds the drafter's
# **pending** tokens (those of the text it has not read yet) and then its own drafts one at a
# time, sampling each from `sampling_probs` (chapter 3's temperature and top-k / top-p: both
# models shape their distributions the same way). It returns the drafts and their
# distributions $q$, and records in `self.fed` how many columns the round added to its cache:
# the pending ones, then drafts $1$ to $k - 1$ (draft $k$ is proposed, never fed).
#
# #### Exercise: `ModelDrafter.accept`
#
# `accept(accepted, drafts, next_token, done)` tells the drafter what the main model decided:
# `accepted` `[batch, k]`, the `drafts` `[batch, k]`, the main model's token `next_token`
# `[batch]`, and `done` `[batch]`, the rows that have finished (they keep nothing new). It
# must leave the drafter ready for the next `propose`:
#
# - **Forget** the rejected drafts it fed: of the `self.fed` last columns of `self.cache` (the
#   pending columns, then drafts $1$ to $k - 1$), keep the pending ones that were real
#   (`self.pending_mask`) and the fed drafts that were accepted, nothing of a finished row;
#   `self.cache.keep_only` does the rest.
# - **Queue** what it has not read: the main model's token always; before it, draft $k$ when
#   all $k$ were kept (proposed, never fed). So `self.pending` is `[batch, 2]`: draft $k$
#   (a padding column, `False` in `self.pending_mask`, where not all were kept), then
#   `next_token`. Finished rows: all `False`. When no row kept all $k$, drop the first column.
#
# Common mistakes: not rolling the cache back (the drafter then guesses for a text that does
# not exist: the output stays exact, the sampler sees to that, but the acceptance rate falls);
# forgetting draft $k$ when all were kept; matching the acceptance flags to the wrong fed
# columns (off by one: the pending columns come first).
#
# The tests run two rounds with the shipped draft model on a left-padded batch of three
# prompts (one row keeps 2 of 4 drafts, one all 4, one none) and on one row, and compare the
# drafter's next distribution with HF's draft model run on each row's accepted text.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The round's columns are the last `self.fed` of the cache, in the order they were fed: the
# pending ones first, then every draft but the last. Line the acceptance flags up with *those*
# columns. What goes into `pending` depends only on whether a row kept all its drafts.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - A keep mask for the round's columns, `[batch, self.fed]`: the pending mask, then the flags
#   of the fed drafts (which $k - 1$ of the $k$ flags?), joined along the positions
#   (`torch.cat`), and False everywhere in a finished row (`done` needs a trailing axis to
#   broadcast over the columns).
# - `keep_only` takes a bool mask shaped like the whole cache's mask, `[batch, cache length]`,
#   and returns the trimmed cache. Start from a copy of `self.cache.mask`, so that the earlier
#   columns stay as they are, and put your mask into its last `self.fed` columns.
# - What to feed next round: the last draft where a row kept all of them (it was proposed,
#   never fed), then the main model's token, which is always fed. `torch.stack` along a new
#   axis 1 builds the two columns, `Tensor.all(dim=1)` finds the rows that kept everything.
#   When no row kept everything, one column is enough.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("ModelDrafter")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.drafters.sampling_probs
# solution: solutions.drafters.ModelDrafterBase

# %% tags=["exercise"] exercise="model_drafter"
# solution: solutions.drafters.ModelDrafter

# %%
check("model_drafter")

# %% [markdown]
# ### Exercise: `speculative_round`
#
# *About 40 minutes.*
#
# `speculative_round(main, cache, last, drafter, k, sampling, generator, done)` runs one round
# for the batch. `cache` is the main model's cache (the text but its newest token), `last`
# `[batch]` the newest token, `sampling` the dict of `temperature`, `top_k`, `top_p`. The
# given first line asks the drafter for `drafts` `[batch, k]` and `draft_probs`
# `[batch, k, d_vocab]` (`None` from a drafter whose guesses are sure, the n-gram lookup:
# then $q$ is one-hot at each draft). You write the middle, and leave four names for the given
# lines after it: `tokens` and `accepted`, the sampler's outputs; `n_new` `[batch]`, the new
# tokens per row; and `cache`, trimmed.
#
# 1. One cached pass of the main model over `last` followed by the drafts, `[batch, k + 1]`.
# 2. The target distributions from the pass's logits, shaped the way the drafter shapes its
#    own (the given `sampling_probs`, with the `sampling` dict); $q$ one-hot at the drafts if
#    `draft_probs` is `None`; then `rejection_sample`, with the generator, in greedy mode at
#    temperature 0.
# 3. Trim the cache: of its last $k + 1$ columns keep `last` and the accepted drafts, nothing
#    of a finished row, with `keep_only`. A row's new tokens are its accepted drafts and the
#    main model's token.
#
# The given lines after yours tell the drafter (`accept`) and return `(tokens, n_new, cache)`.
# The given `speculative_generate` (after the exercise cell) runs rounds until every row has
# its tokens: it checks the arguments, pads and prefills, keeps the texts and the statistics.
#
# Common mistakes: feeding only the drafts (the main model then never reads `last`, and its
# first distribution is for the wrong position); keeping the rejected drafts in the cache;
# flags matched to the wrong columns (`last` comes first and is always kept); forgetting the
# main model's own token (`n_new` is the accepted count plus one); top-k / top-p applied to one
# model only.
#
# The tests: at temperature 0, for $k$ = 1 to 6 and both drafters, on one prompt and on a
# left-padded batch of four, the text equals HF's greedy `generate` on each prompt alone; at
# temperature 1, 1,500 copies of a prompt in one batch: the first new token follows the main
# model's distribution, and so does the second given the most common first (both drafters);
# at temperature 0.7 with top-p 0.8, the first token follows HF's top-p-warped distribution;
# the seed.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The main model's pass is chapter 4's chunk: several new tokens after a cache. Everything else
# is the sampler of section 2 and the same trimming as the drafter's, with `k + 1` columns.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `last` is `[batch]`: give it a position axis before joining it in front of the drafts.
#   `forward_with_cache(main, tokens, cache)` returns the logits `[batch, k + 1, d_vocab]` and
#   the longer cache: position $i$'s logits are the distribution for draft $i + 1$, the last
#   position's for the token after all of them.
# - `sampling_probs` takes logits of any leading shape, so one call gives all the targets. For
#   a sure drafter, `F.one_hot(drafts, d_vocab)` builds $q$; it returns integers, and the
#   sampler wants probabilities (floats).
# - The trimming is the one of `ModelDrafter.accept`: the pass added exactly $k + 1$ columns
#   at the end of the cache. Which flag belongs to `last`'s column, which no rejection can
#   remove?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("speculative_round")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.speculative_generation.SpeculativeStats

# %% tags=["exercise"] exercise="speculative_round"
# solution: solutions.speculative_generation.speculative_round

# %% tags=["source"]
# solution: solutions.speculative_generation.start_speculation
# solution: solutions.speculative_generation.speculative_generate

# %%
check("speculative_round")

# %% [markdown]
# **Predict, then run.** Greedy text from four prompts, by chapter 4's batched generator and by
# speculation with the draft model and $k = 4$. Will the texts be the same? How many tokens
# per main-model pass do you expect, if the draft agrees with the main model's argmax about
# three times in four?
#
# <details><summary>What to expect</summary>
#
# The same texts, token for token. With a keep rate $\alpha$ per draft, a round emits
# $1 + \alpha + \alpha^2 + \dots + \alpha^k = (1 - \alpha^{k+1}) / (1 - \alpha)$ tokens on
# average (if the keeps were independent): about 3 for $\alpha = 0.75$ and $k = 4$.
# `stats.acceptance` is $\alpha$ as measured: the kept drafts over the drafts the sampler tested
# (the ones after a rejection never are).
#
# </details>

# %% tags=["demo"]
from solutions.batched import generate_batch as ref_generate_batch

demo_prompts = [
    "ROMEO.\nBut soft, what light",
    "JULIET.\nO Romeo,",
    "HAMLET.\nTo be, or not to be,",
    "KING LEAR.\nBlow, winds,",
]
n_new = 30 if QUICK else 100
with torch.inference_mode():
    plain = ref_generate_batch(main, tokenizer, demo_prompts, n_new, temperature=0.0)
    stats = SpeculativeStats()
    fast = speculative_generate(
        main, draft, tokenizer, demo_prompts, k=4, max_tokens_generated=n_new,
        temperature=0.0, stats=stats,
    )  # fmt: skip
print("same texts as greedy decoding:", plain == fast)
print(f"drafts kept: {stats.acceptance:.2f}")
print(f"tokens per row per main pass: {stats.tokens_per_pass:.2f}")
print(f"rounds for the whole batch: {stats.main_passes} (each row needs {n_new} tokens)")
print(fast[0])

# %% [markdown]
# What the rounds looked like for the first prompt: green drafts were kept, the red one was
# the first rejection (greyed ones after it never counted), blue is the main model's token.

# %%
with torch.inference_mode():
    rounds = trace_rounds(main, draft, tokenizer, demo_prompts[0], k=4, n_rounds=6)
plot_speculative_rounds(rounds, k=4, title=f"Six rounds of k = 4 after {demo_prompts[0]!r}")

# %% [markdown]
# Both drafters on the same greedy texts. The n-gram drafter costs almost nothing per draft,
# so even a low keep rate can pay; whether it does is section 7's question.

# %%
with torch.inference_mode():
    for drafter_name in ["model", "ngram"]:
        stats = SpeculativeStats()
        texts = speculative_generate(
            main, draft, tokenizer, demo_prompts, k=4, max_tokens_generated=n_new,
            temperature=0.0, drafter=drafter_name, stats=stats,
        )  # fmt: skip
        print(
            f"{drafter_name:5} drafter: same texts {texts == plain}, drafts kept "
            f"{stats.acceptance:.2f}, tokens per main pass {stats.tokens_per_pass:.2f}"
        )

# %% [markdown]
# ## 4. The Gumbel-max trick
#
# Section 1 draws the draft and the target's token with separate random numbers. There is
# another way to sample, which separates the randomness from the distribution entirely: add
# independent **standard Gumbel** noise $G_i = -\log(-\log U_i)$, $U_i$ uniform in $(0, 1)$, to
# each logit, and take the argmax:
#
# $$\arg\max_i \left( \frac{z_i}{T} + G_i \right) \sim \mathrm{softmax}(z / T).$$
#
# Why: $\exp(-e^{-g})$ is the Gumbel distribution function, and the probability that term
# $i$ beats every other works out to $e^{z_i/T} / \sum_j e^{z_j/T}$ (the same calculation shows
# that exponential races, "who arrives first", pick $i$ with probability proportional to its
# rate). No softmax, no cumulative sum, no sort: one pass over the logits with an argmax. That
# is why chapter 10 has a Gumbel-max kernel, and a kernel that samples inside the matrix product
# that makes the logits, without ever holding a whole row of probabilities.
#
# **Temperature goes on the logits, not on the noise.** The classic bug is
# $\arg\max_i (z_i + G_i) / T$: dividing everything by $T > 0$ never changes an argmax, so that
# samples at temperature 1 whatever $T$ says. The correct form scales the logits only; as
# $T \to 0$ the logits dominate any noise and the argmax is greedy, and at $T = 0$ itself we
# return the argmax without drawing noise (or dividing by zero).
#
# ### Exercise: `gumbel_sample`
#
# *About 15 minutes.*
#
# `gumbel_sample(logits, temperature=1.0, generator=None)` takes logits `[batch, d_vocab]` and
# returns one token per row, `[batch]`, distributed as `softmax(logits / temperature)`; at
# temperature 0, the argmax. The argument checks are given.
#
# Common mistakes: $(z + G) / T$; exponential noise $-\log U$ instead of Gumbel; one noise
# vector shared by all rows; `torch.rand` without the generator; $\log 0$ when `rand` returns
# exactly 0 (clamp $U$ away from 0: `torch.finfo(dtype).tiny`); dividing in place.
#
# The tests sample 20,000 tokens per case and compare with `softmax(logits / T)` at T = 1, 0.5
# and 2 (chi-square; the message names the $(z + G)/T$ bug when the samples look like
# temperature 1), check that $T = 10^{-3}$ and $T = 0$ give the argmax, that `-inf` logits are
# never drawn, the generator, and that logits on PyTorch's `meta` device (shapes, no values)
# give tokens there: noise drawn without `device=` would sit on the CPU.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The section's formula is the whole algorithm. The traps are at its edges: where $T$ goes,
# what dividing by $T = 0$ would do, and what becomes of a uniform number that is exactly 0.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Temperature 0: return the greedy choice before any noise is drawn.
# - `torch.rand(shape, generator=..., device=...)` returns uniform numbers in $[0, 1)$: 0 can
#   come out, 1 cannot. Draw one per logit, `[batch, d_vocab]`, so that no two rows share
#   noise, and raise the zeros to a tiny positive number (`clamp`; `torch.finfo(dtype).tiny`
#   is the smallest positive normal number of a dtype).
# - Turn $U$ into $G$ as the section defines it (`torch.log`), combine it with the scaled
#   logits, and take `argmax` over the vocabulary: `[batch]`.
# - Build new tensors: an in-place division would change the caller's logits.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("gumbel_sample")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="gumbel_sample"
# solution: solutions.gumbel.gumbel_sample

# %%
check("gumbel_sample")

# %% [markdown]
# The bug, side by side with the right form: the probability of the most likely token after a
# prompt, at three temperatures, estimated from 5,000 draws each (1,000 in a quick run).

# %%
with torch.inference_mode():
    row = main(torch.tensor([tokenizer.encode("OTHELLO.\nGood night, my")]))[:, -1]
n_draws = 1_000 if QUICK else 5_000
rows = row.expand(n_draws, -1)
best = int(row.argmax())
g = torch.Generator().manual_seed(0)
for T in [0.5, 1.0, 2.0]:
    exact = float((row / T).softmax(-1)[0, best])
    right = float((gumbel_sample(rows, T, g) == best).float().mean())
    u = torch.rand(rows.shape, generator=g).clamp(min=1e-38)
    buggy = float((((rows - torch.log(-torch.log(u))) / T).argmax(-1) == best).float().mean())
    print(f"T = {T}: exact {exact:.3f}   gumbel_sample {right:.3f}   (z + G) / T {buggy:.3f}")

# %% [markdown]
# ## 5. Coupling: how often two samplers agree
#
# Speculative decoding gains when the draft's token and the main model's token are the same.
# How often that happens depends not only on $p$ and $q$ but on how the two draws share their
# randomness, their **coupling**. Three couplings:
#
# - **Independent** draws: $x \sim p$ and $y \sim q$ with separate random numbers agree with
#   probability $\sum_k p_k q_k$.
# - **Shared Gumbel noise**: $x = \arg\max(\log p + G)$ and $y = \arg\max(\log q + G)$ with the
#   *same* $G$. Both pick $k$ when $G_k - G_j \ge \log(p_j / p_k)$ and
#   $\ge \log(q_j / q_k)$ for every $j$: one Gumbel race with weights
#   $\max(p_j / p_k, q_j / q_k)$, which $k$ wins with probability
#   $1 / \sum_j \max(p_j / p_k, q_j / q_k)$. So
#   $P(x = y) = \sum_k 1 / \sum_j \max(p_j / p_k,\, q_j / q_k)$ (over the $k$ where both are
#   positive). It is always at least $\sum_k p_k q_k$ and at most $\sum_k \min(p_k, q_k)$;
#   section 6 uses shared noise to check lookahead decoding's guesses, for a reason the end of
#   this section gives.
# - **Rejection sampling** (section 1): $P(x = y) = \sum_k \min(p_k, q_k)$. No coupling can do
#   better: $x = y = k$ needs both $P(x = k) = p_k$ and $P(y = k) = q_k$, so it has probability
#   at most $\min(p_k, q_k)$.
#
# ### Exercise: `same_token_independent`, `same_token_shared_gumbel`, `same_token_rejection`
#
# *About 30 minutes.*
#
# Three functions of `p` and `q`, probability vectors `[..., d_vocab]`, each returning the
# probability `[...]` above. Careful with zeros: $\log 0 = -\infty$ never wins a race, so a
# token with $p_k = 0$ or $q_k = 0$ contributes nothing to the shared-noise sum, and the ratio
# $p_j / p_k$ must not be computed where $p_k = 0$ (0 / 0 is NaN).
#
# Common mistakes: $\min$ instead of $\max$ in the shared-noise formula; the two inner and
# outer sums over the wrong dimensions; NaN from zero probabilities; swapping the independent
# and rejection formulas.
#
# The tests: $p = q$ (1, 1 and $\sum p^2$), disjoint supports (0), zeros in either, batched and
# single inputs, the shared-noise formula against a numerical integral over the Gumbel
# density, and all three against simulations written in the test.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The independent and rejection probabilities are the section's formulas as they stand. The
# shared-noise one is a double sum over pairs $(k, j)$, a `[d_vocab, d_vocab]` matrix per row,
# and its trap is the zeros: which terms must vanish, and which divisions must never happen?
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - A bool mask of the tokens possible under both distributions, `[..., d_vocab]`.
# - The ratio matrices, `[..., d_vocab, d_vocab]` with $k$ along one axis and $j$ along the
#   other: give the numerators and the denominators a length-1 axis in two different places
#   (`None` in an index, or `unsqueeze`) and let broadcasting build the matrix. Keep track of
#   which axis is $j$'s: that is the one to sum over.
# - No denominator may be 0. The terms of an impossible $k$ are dropped at the end anyway:
#   what harmless number could stand in for $p_k$ and $q_k$ there? `torch.where(cond, x, y)`
#   takes a Python number for `x` or `y`.
# - `torch.maximum` is the elementwise larger of two tensors; the rest is the formula, read
#   from the inside out, with the impossible $k$ set to 0 before the sum over $k$. Check on
#   $p = q$: the answer must be 1.
# - All three reduce over the last dimension only, so that batches work.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("same_token_shared_gumbel")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="coupling"
# solution: solutions.gumbel.same_token_shared_gumbel
# solution: solutions.gumbel.same_token_independent
# solution: solutions.gumbel.same_token_rejection

# %%
check("coupling")

# %% [markdown]
# **Predict, then run.** The three probabilities for the shipped main and draft models, on
# real contexts, as the temperature grows. Which coupling is always on top? What happens to the
# independent one at high temperature, where both distributions spread over thousands of
# tokens?
#
# <details><summary>What to expect</summary>
#
# Rejection sampling is on top at every temperature (it is the maximum), shared Gumbel noise
# close below it, and independent draws far below once the distributions spread out: two
# independent draws from wide distributions rarely land on the same token, while shared noise
# and rejection keep agreeing as long as $p$ and $q$ are similar. At low temperature all three
# meet: both models are nearly greedy, and they agree exactly when their argmaxes do.
#
# </details>

# %%
context_text = "ROMEO.\nBut soft, what light through yonder window breaks?\nIt is the east"
ids = torch.tensor([tokenizer.encode(context_text)])
with torch.inference_mode():
    main_logits, draft_logits = main(ids)[0], draft(ids)[0]  # [pos, d_vocab]: every context
positions = range(0, ids.shape[1], 8 if QUICK else 1)
temperatures = [0.25, 0.5, 1.0, 2.0] if QUICK else [0.1, 0.2, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0]
curves = {"independent draws": [], "shared Gumbel noise": [], "rejection sampling": []}
for t in positions:
    rows = {name: [] for name in curves}
    for T in temperatures:
        p_t, q_t = (main_logits[t] / T).softmax(-1), (draft_logits[t] / T).softmax(-1)
        rows["independent draws"].append(float(same_token_independent(p_t, q_t)))
        rows["shared Gumbel noise"].append(float(same_token_shared_gumbel(p_t, q_t)))
        rows["rejection sampling"].append(float(same_token_rejection(p_t, q_t)))
    for name in curves:
        curves[name].append(rows[name])
plot_coupling(
    temperatures,
    {name: torch.tensor(values) for name, values in curves.items()},
    title="P(main and draft pick the same token), over the contexts of one text",
)

# %% [markdown]
# **What shared noise is for.** Rejection sampling is the best coupling, so why keep the
# other? Not to agree more often: when the guesses are *sure* (an n-gram from a lookup, a
# candidate from a pool: $q$ one-hot at the guess $c$), both keep $c$ with probability $p_c$,
# exactly. They differ in the work when several sure guesses compete for one position.
# Rejection sampling tests them one after another, each against what the rejections before it
# left of $p$ (section 6 spells this out). Shared noise draws one Gumbel vector per position
# and takes one argmax per candidate: a guess is kept when it matches its pick, and
# candidates that agree so far read the same text, so they make the same next pick
# automatically. Section 6 verifies lookahead decoding's candidates this way. With a draft
# *model*, whose $q$ is spread out, rejection sampling keeps more, as the plot shows.

# %% [markdown]
# ## 6. Lookahead decoding: no drafter at all
#
# Every drafter so far is a second source of guesses: a smaller model, or the text's own
# history. **Lookahead decoding** (Fu et al., ICML 2024) needs neither: the main model makes its
# own guesses, in the same pass that checks them (it can use the text's history too, as an
# option: the end of this section measures what that adds). It starts from an old idea.
#
# ### Jacobi iteration
#
# Greedy decoding solves $n$ equations, one per new position: $y_i = \arg\max p(\cdot \mid
# \text{prompt}, y_1, \dots, y_{i-1})$. Solve them like a linear system by Jacobi's method:
# guess all $n$ tokens, compute every right-hand side in ONE pass from the current guesses, make
# those the new guesses, repeat until nothing changes. The fixed point is greedy decoding's
# text (the first equation has no unknowns on its right, so $y_1$ is exact after one pass;
# then $y_2$ reads an exact $y_1$; and so on), so $n$ passes always suffice. The question is
# whether it is ever faster than that. `jacobi_step` is one pass (chapter 4's
# `forward_with_cache` over `[last, guesses]`, the cache read and thrown away);
# `jacobi_decode` iterates it.

# %% tags=["source"]
# solution: solutions.lookahead.jacobi_step
# solution: solutions.lookahead.jacobi_decode

# %% [markdown]
# **Predict, then run.** Jacobi iteration for 10 tokens after a prompt. After each pass, how
# many of the 10 guesses are already final (equal to the fixed point)? One more per pass, or
# several at once?
#
# <details><summary>What to expect</summary>
#
# Usually one more per pass, now and then two. A guess is computed from the guesses before it:
# while $y_{i-1}$ is wrong, $y_i$ is the model's prediction after a text that will not exist,
# and it is right only by luck (a word that follows almost anything, a fixed phrase). So
# correctness moves forward about one position per pass, and Jacobi iteration costs about as
# many passes as greedy decoding, each over $n$ tokens. What it does produce, pass after pass,
# is a *trajectory* per position: tokens the model wrote after plausible, nearly right texts.
#
# </details>

# %%
jacobi_prompt = tokenizer.encode("HAMLET.\nTo be, or not to be, that is the question")
history = jacobi_decode(main, jacobi_prompt, 10)
final = history[-1]
for step, guesses in enumerate(history):
    right = (guesses == final).int()
    leading = int(right.cumprod(0).sum())
    shown = tokenizer.decode(guesses.tolist()).replace("\n", "⏎")
    print(f"pass {step:2}: {leading:2} final from the start, {int(right.sum()):2} right  {shown!r}")

# %% [markdown]
# ### The lookahead window, the n-gram pool and the verification branch
#
# Lookahead decoding keeps the trajectories and uses them. One pass of the main model holds
# three things, after the cached text (everything but its newest token, `last`):
#
# - **`last`**, at offset 0.
# - **The lookahead branch**: a window of $W$ columns and $N - 1$ levels of past guesses.
#   Level $j$, column $i$ guesses the token at offset $i + j + 1$. Level 0 is the oldest; each
#   level is one Jacobi iteration newer than the one before it and one position further on, so
#   column $i$ read from level 0 to the newest level is a run of $N - 1$ consecutive
#   positions: a trajectory. The newest level's predictions become the next level; the oldest
#   is dropped.
# - **The verification branch**: up to $G$ candidate n-grams from the **pool** whose first
#   token is `last`; their other $N - 1$ tokens sit at offsets $1, \dots, N - 1$.
#
# Offsets count from `last`, whatever it is now. Each pass moves the window on by one level,
# whatever the pass emitted: when it emits several tokens, `last` jumps several positions and
# the window's guesses are simply read, from then on, as guesses for the positions after the
# new `last`. They are only guesses, so this costs their quality, never the output's
# correctness (the verification branch decides what is emitted).
#
# After the pass, each column's trajectory plus the token the pass just predicted after it is
# an n-gram of $N$ consecutive positions, written by the model itself: it goes into the pool,
# keyed on its first token. Candidates are checked like drafts: against the main model's
# prediction after `last`, then after each kept candidate token. With no draft model and
# nothing copied from the text, lookahead decoding emits several tokens whenever a pooled
# n-gram was right. (The pool can also take the text's own n-grams, prompt lookup's idea:
# `pool_from_prompt=True`, measured at the end of this section.)
#
# The attention mask makes one pass do all of it. Every token reads the cache and `last`. A
# window token at level $j$, column $i$ reads level 0 in the columns before its own (offsets
# $1, \dots, i$: the oldest guesses, one per position) and its own column up to itself
# (offsets $i + 1, \dots, i + j + 1$: its trajectory). A candidate token reads its own
# candidate up to itself. No token reads another branch: a window token that saw a candidate
# would be computed from a text nobody wrote, and a candidate that saw the window would be
# checked against the wrong text. Every token thus reads exactly one token per position before
# it, a whole text, and the model cannot tell it is in a crowd. Chapter 4's
# `forward_with_cache` takes this layout as `positions` (each token's position: the cache's
# length plus its offset) and `allowed` (`[new, cached + new]`).

# %% [markdown]
# ### One pass, by hand
#
# A toy, with words for tokens: $W = 3$ columns, $N = 3$ (two levels), $G = 2$. The text ends
# in `the`, which is `last`. Earlier passes left this window, and the pool holds two n-grams
# keyed on `the`: (`queen`, `is`) and (`king`, `is`). Offsets count from `last`:
#
# | offset | 0 | 1 | 2 | 3 | 4 |
# |---|---|---|---|---|---|
# | `last` | `the` | | | | |
# | level 0 | | `king` | `the` | `of` | |
# | level 1 | | | `is` | `king` | `the` |
#
# Level 0's three guesses sit at offsets 1, 2 and 3, level 1's at 2, 3 and 4: each column runs
# down a diagonal. The pass is 11 tokens, `last`, the two levels and the two candidates, at
# offsets 0 | 1 2 3 | 2 3 4 | 1 2 | 1 2. Suppose the model predicts what the steps below say.
#
# 1. **The lookahead branch.** Each level-1 token reads its own text and predicts the next
#    position. Column 0's `is` reads `the king is` (`last`, its column's `king`, itself) and
#    predicts `dead`, at offset 3. Column 1's `king` reads `the king the king` (`last`, level
#    0's `king` before its column, then its own column: `the`, `king`) and predicts `is`.
#    Column 2's `the` reads `the king the of the` and predicts `king`. Column 0's text happens
#    to be the one this pass will write (step 2); columns 1 and 2 read texts that nobody will
#    write. Their predictions go into the pool all the same: an n-gram only has to be right
#    after its own first token, wherever that token comes up later.
# 2. **The verification branch.** The model's prediction after `last` is `king`. Candidate 0,
#    `queen is`, fails at its first token: a run of 0. Candidate 1, `king is`: `king` matches;
#    the prediction after `the king` is `is`, which matches; the prediction after `the king
#    is` is `dead`, the bonus token. The pass emits `king is dead`, three tokens.
# 3. **The cache** keeps `the` and candidate 1's `king is` (the run). `dead`, emitted but not
#    yet read by the model, is the new `last`. Nothing of the window is kept.
# 4. **The pool.** The window is full ($N - 1$ levels), so each column plus its prediction is
#    an n-gram: `king is dead`, `the king is` and `of the king`, keyed on `king`, `the` and
#    `of`. The second is candidate 1 again: seen anew, it moves to the front of `the`'s list.
# 5. **The window** moves on by one level: level 1 becomes level 0 (`is`, `king`, `the`), the
#    predictions become level 1 (`dead`, `is`, `king`), and the oldest level is dropped. The
#    next pass reads them as guesses for offsets 1, 2, 3 and 2, 3, 4 after `dead`, although
#    `last` moved on by three positions: they are only guesses.
#
# The figure draws steps 1 and 4: each column's trajectory down its diagonal, the dashed box at
# its end the pass's prediction, and at the right the n-gram that goes into the pool.

# %%
plot_lookahead_window(
    "the", [["king", "the", "of"], ["is", "king", "the"]], new=["dead", "is", "king"],
    title="The toy pass: W = 3, N = 3",
)  # fmt: skip

# %% tags=["claim"]
# The pass worked by hand, replayed by the reference code: its offsets, its verification with
# a model that predicts what the steps say, and its harvest.
from solutions import lookahead as _reference

_words = ["the", "king", "of", "is", "dead", "queen"]


def _ids(text):
    return torch.tensor([_words.index(w) for w in text.split()])


def _predicts(text):  # logits whose greedy token is each word of `text`
    return F.one_hot(_ids(text), len(_words)).float()


_offsets, _allowed = _reference.lookahead_layout(2, 3, 2, 3)
assert _offsets.tolist() == [0, 1, 2, 3, 2, 3, 4, 1, 2, 1, 2], "the toy pass's offsets"
# Level 1's king (index 5) reads last, level 0's king and the, and itself; level 1's the
# (index 6) reads `the king the of the`; candidate 1's is (index 10) reads last and king is.
assert [_allowed[q].nonzero().flatten().tolist() for q in (5, 6, 10)] == [
    [0, 1, 2, 5], [0, 1, 2, 3, 6], [0, 9, 10]]  # fmt: skip
_emitted, _best, _run = _reference.verify(
    _predicts("king")[0], torch.stack([_predicts("is dead"), _predicts("is dead")]),
    torch.stack([_ids("queen is"), _ids("king is")]), 0.0, None,
)  # fmt: skip
assert ([_words[t] for t in _emitted], _best, _run) == (["king", "is", "dead"], 1, 2)
_grams = _reference.harvest(torch.stack([_ids("king the of"), _ids("is king the")]),
                            _ids("dead is king"))  # fmt: skip
assert [[_words[t] for t in (key, *rest)] for key, rest in _grams] == [
    ["king", "is", "dead"], ["the", "king", "is"], ["of", "the", "king"]]  # fmt: skip
_pool = _reference.NgramPool(3, 2)
for _cont in ["king is", "queen is", "king is"]:  # added in this order: queen, then king, first
    _pool.add(_words.index("the"), tuple(_ids(_cont).tolist()))
assert _pool.candidates(_words.index("the"))[0] == tuple(_ids("king is").tolist())

# %% [markdown]
# ### Exercise: `lookahead_layout`
#
# *About 30 minutes.*
#
# `lookahead_layout(n_levels, window, n_candidates, ngram)` returns `offsets` `[new]` and
# `allowed` `[new, new]` for the pass `[last, level 0, ..., level n_levels - 1, candidate 0,
# ...]` (each level `window` tokens, each candidate `ngram - 1`). `at(level, column)` gives a
# window token's index in the pass. Fill both tensors (the loops over levels, columns,
# candidates and their tokens are fine: the pass has a few dozen tokens).
#
# Common mistakes: offsets off by one (level 0 starts at offset 1, right after `last`; each
# level starts one further on); a window token that reads the candidates, or a candidate that
# reads the window; a window token reading its own level's earlier columns instead of level
# 0's (the newest level's guesses are not one text); forgetting that every token reads
# `last`.
#
# The tests: offsets against the definition; no row reads another branch; every row reads
# exactly one token at each offset up to its own, its own column included; and the real
# model run with your layout gives every token HF's logits on the text its row reads.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Fill one row at a time. For each token, ask: which offset am I at, and which tokens make up
# the text before me?
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Three kinds of rows: `last` (offset 0), the window's tokens and the candidates' tokens.
#   Every row reads `last`, column 0.
# - A window token: loop over levels and columns; `at(level, column)` gives its index. Its
#   offset is the position it guesses (the section says which). What it reads, in the
#   section's words: level 0 before its column, and its own column up to itself. Turn each
#   into a list of indices with `at`: indexing a row of `allowed` with a list of column indices
#   sets them all at once.
# - A candidate token: where in the pass does candidate $g$ begin (after `last` and the
#   levels), and where is its token $t$? Which position after `last` does token $t$ guess? It
#   reads its own candidate from its first token up to itself: a slice of the row.
# - Check a row by counting: it must read exactly one token at each offset from 0 up to its
#   own.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("lookahead_layout")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lookahead_layout"
# solution: solutions.lookahead.lookahead_layout

# %%
check("lookahead_layout")

# %% [markdown]
# Your mask, drawn: $N = 4$, $W = 5$, three levels (a full window) and two candidates. Each row
# is a token of the pass, each column a token it may read (the cached text, read by all, is
# left out). Look for level 0's causal triangle, the diagonals of the columns' trajectories, and
# the two small triangles of the candidates, alone in their corner.

# %%
offsets, allowed = lookahead_layout(3, 5, 2, 4)
plot_lookahead_mask(offsets, allowed, n_levels=3, window=5, ngram=4)

# %% [markdown]
# ### Exercise: `harvest`
#
# *About 10 minutes.*
#
# After a pass with a full window (`n_levels = ngram - 1`), the newest level's predictions
# `new` `[window]` complete one n-gram per column. `harvest(levels, new)` returns them as a list
# of `(key, continuation)`: the key is the n-gram's first token, the continuation a tuple of
# the other `ngram - 1`. The given `NgramPool` stores them by key (the newest first, at most
# $G$ per key); with `pool_from_prompt=True`, the given code also adds the text's own n-grams
# (the prompt's, then those the emitted tokens complete).
#
# Common mistakes: reading a level (a row) instead of a column; keying the n-gram on its last
# token, or on the new one (the verification branch looks n-grams up by `last`, the token
# *before* the guesses); leaving out `new`, or the oldest level.
#
# The tests: a window of known tokens, with 4-grams and with 2-grams.
#
# <details><summary>Hint 1: a nudge</summary>
#
# An n-gram is a *column* of the window, read from the oldest level down, with `new` as one
# more level at the bottom. A row of `levels` is not an n-gram.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `levels` is `[n_levels, window]` and `new` `[window]`: what must `new` become to join the
# levels as one more of them (`torch.cat` wants the same number of dimensions)? The result is
# `[ngram, window]`, one n-gram per column; iterating over a tensor walks its first axis, so
# turn it round first. Each n-gram splits into its first token, the key, and the rest. The
# return is plain Python: an `int` and a tuple of `int`s (`Tensor.tolist()` gives ints).
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("harvest")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lookahead_harvest"
# solution: solutions.lookahead.harvest

# %%
check("lookahead_harvest")

# %% tags=["source"]
# solution: solutions.lookahead.NgramPool
# solution: solutions.lookahead.gumbel_noise

# %% [markdown]
# ### Exercise: `verify`, exactly
#
# *About 25 minutes.*
#
# The pass gives the main model's logits after `last` (`first_logits`) and after every token
# of every candidate (`candidate_logits[g, k]`: after candidate $g$'s tokens $0..k$). At
# temperature 0 the rule is section 2's greedy mode, for each candidate: keep its leading run of
# tokens that equal the argmax, take the candidate with the longest run, then the argmax after
# it.
#
# Sampling needs care: can a pass that checks several candidates keep the model's
# distribution? The lookahead project's pull request 6 (closed unmerged) discussed Gumbel noise
# for it; the released code samples with SpecInfer's multi-candidate rejection sampling
# (`lade/decoding.py`, `jacobi_sample_multilevel`, at commit `eed010da` of
# `github.com/hao-ai-lab/LookaheadDecoding`). This course uses a rule built on section 4 that
# needs one argmax per candidate and position and no loop over the candidates. It gives the
# emitted tokens, and the number of candidate tokens kept, the same distribution as the
# rejection rule. Tokens per pass still differ in one case, a candidate kept whole: `verify`
# then adds the model's token after the candidate's $N - 1$ tokens, up to $N$ tokens per pass,
# while the released code draws no token after a fully kept candidate and emits at most
# $N - 1$ (its `LEVEL` is $N$; `jacobi_sample_multilevel` and `jacobi_greedy_search_multilevel`
# both check `GUESS_SIZE = LEVEL - 1` positions and stop there; same file and commit).
# Draw **one** vector of Gumbel noise per position, $z_0, \dots, z_{N-1}$, shared by every
# candidate, and let each candidate's pick at position $k$ be
# $\arg\max(\text{logits}_{g,k} / T + z_k)$. Keep each candidate's run of picks equal to its
# own tokens; emit the longest run, then that candidate's pick after it.
#
# **Why this is exact.** Candidates that agree on their first $k$ tokens read the same text,
# so they have the same logits at position $k$, and with the same $z_k$ they make the same
# pick: the emitted token at position $k$ is $\arg\max(\log p(\cdot \mid \text{text so far}) +
# z_k)$ for the text emitted so far. That text was decided by $z_0, \dots, z_{k-1}$ and the
# candidates, all independent of $z_k$; by the Gumbel-max trick the token follows
# $p(\cdot \mid \text{text so far})$. The candidates only decide *how many* positions one pass
# emits, never *which* token comes out. The noise of positions after the emitted ones is
# thrown away unseen.
#
# **The rejection rule, for comparison** (SpecInfer's, as `lade` runs it). At each position,
# the candidates still in the running are tested one after another: candidate $c$'s token $t$
# is kept with probability $r(t)$, where $r$ starts as $p$ and, after each rejected token, loses
# that token and is renormalised (section 1's residual, with sure drafts). A kept token leaves
# in the running only the candidates with that token, and the next position starts again from
# $p$ after it; when every test fails, the token is drawn from the last $r$. Each emitted token
# follows $p$ given the text before it, as with shared noise. The end of this section checks
# both rules on a small case.
#
# Write the part of `verify` between the given lines: `picks` `[n_cand, n + 1]`, each
# candidate's run, `best` (the chosen candidate's index) and `run` (its run's length), the names
# the given `return` reads.
#
# Common mistakes: noise drawn per candidate (`[n_cand, n + 1, d_vocab]`) instead of per
# position (the end of this section measures what that does); the run counted as all the
# matches rather than the leading ones; the temperature applied to the noise (it divides the
# logits only); no generator.
#
# The tests: greedy on handmade logits (the longest argmax run, no candidate, a rejected
# one); the generator; 6,000 draws of a handmade case where two candidates share their first
# token: the first token follows $p$, and the second follows the model after the first
# (chi-square).
#
# <details><summary>Hint 1: a nudge</summary>
#
# No loop over the candidates: the given `logits` `[n_cand, n + 1, d_vocab]` hold every
# candidate's positions, so one argmax gives all the picks. Everything that makes it exact is
# in the shape of the noise: one vector per position, shared by all candidates.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Temperature 0: no noise; the picks are the argmax over the vocabulary, `[n_cand, n + 1]`.
# - Otherwise `gumbel_noise(shape, generator, device)` (given above) draws the noise, on the
#   logits' device. Which shape gives one vector per position, the same for every candidate,
#   and broadcasts against `logits`?
#   The temperature divides the logits only (section 4); then the argmax.
# - A candidate's run: compare its $n$ tokens with the picks at the positions they occupy (the
#   picks have $n + 1$ columns: which $n$?), then count the leading matches, as
#   `rejection_sample` counted its kept run.
# - `best` is the candidate with the longest run and `run` its length, both plain `int`s: the
#   given `return` indexes and slices with them.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("verify")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lookahead_verify"
# solution: solutions.lookahead.verify

# %%
check("lookahead_verify")

# %% tags=["source"]
# solution: solutions.lookahead.verify_naive
# solution: solutions.lookahead.LookaheadState

# %% [markdown]
# ### Exercise: `lookahead_round`
#
# *About 30 minutes.*
#
# One pass, all of it. The given lines look up the candidates for `last` in the pool, build the
# layout and the pass `feed` (`last`, the window's levels, the candidates), and note `past`
# (the cache's length) and `first` (the pass's index of the first candidate token). You write:
#
# 1. `allowed` `[new, past + new]`: the cached columns are readable by all, then your layout;
#    one `forward_with_cache` of `feed` (a batch of one row) with each token's position (the
#    cache's length plus its offset) as `positions` and that mask as `allowed`.
# 2. `candidate_logits` `[n_cand, ngram - 1, d_vocab]` from the rows of the candidates; call
#    `verifier` (it is `verify` unless the caller asks for the naive one). The given lines
#    after yours read `logits` (the pass's `[new, d_vocab]`, without the batch dimension) and
#    `emitted`.
# 3. Trim the cache with `keep_only`: keep the cached text, `last`, and the kept run of the
#    chosen candidate. Nothing of the window: its keys and values were computed from guesses.
#
# The given lines after yours advance the window (the newest level's argmax is the next level;
# a full window is harvested into the pool and drops its oldest level) and return the emitted
# tokens. `lookahead_generate` (given, after the exercise) runs rounds for each prompt.
#
# Common mistakes: keeping the window in the cache (the next pass then reads guesses as text);
# keeping the run of candidate 0 instead of the chosen one; positions without `past`; a mask
# without the cached columns (the pass forgets the prompt).
#
# The tests: at temperature 0, for four $(W, N, G)$, with and without `pool_from_prompt`, and
# prompts of 6, 18 and 20 tokens, the tokens equal HF's greedy `generate`, in fewer passes than
# tokens; greedy, the first pass keeps the longest run of the prompt's n-grams that greedy
# decoding confirms (with `pool_from_prompt`) or none (without); sampling, 1,200 copies of a
# prompt whose last token starts three of its own 3-grams (with `pool_from_prompt`, so that the
# first pass checks them): the first and second new tokens follow the main model (chi-square);
# the seed; and, read from your source, every tensor made on the window's device.
#
# <details><summary>Hint 1: a nudge</summary>
#
# This is `speculative_round` with the main model's pass built from a layout instead of
# `[last, drafts]`, and one candidate's columns kept instead of the first $k + 1$.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The mask: a block of True for the cached columns, `[new, past]`, in front of the layout's
#   `allowed` (`torch.cat` along the columns).
# - After the pass, drop the batch dimension. The candidates' rows start at `first`, in the
#   order of `feed`, `ngram - 1` rows per candidate: `reshape` them to
#   `[n_cand, ngram - 1, d_vocab]`. The prediction after `last` is row 0. `verifier` returns
#   `(emitted, best, run)`.
# - The cache now has `past + new` columns: the cached ones, then the pass's tokens in the
#   order of `feed`. Keep the cached text and `last`, then `run` columns from where candidate
#   `best`'s first token sits: at which column is that? `keep_only` takes a bool mask shaped
#   like the cache's, `[1, past + new]`, and returns the trimmed cache.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("lookahead_round")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lookahead_round"
# solution: solutions.lookahead.lookahead_round

# %% tags=["source"]
# solution: solutions.lookahead.start_lookahead
# solution: solutions.lookahead.lookahead_generate

# %%
check("lookahead_round")

# %% [markdown]
# The same with the model's own tokens: your `lookahead_round`, greedy, ten passes after the
# first lines of *Coriolanus* ($W = 4$, $N = 3$, $G = 4$). Each line is a pass: `last`, how many
# pooled candidates it checked, what it emitted, and the n-grams it harvested (from the second
# pass on: the first starts from one level of prompt tokens and adds the second). The figure
# draws the fifth pass's window. Read each column down its diagonal. Then find a pass that
# emits more than one token, and the earlier pass that harvested the n-gram it kept: the pool
# keeps an n-gram until `last` is its key, which may be many passes later, or never.

# %%
window_prompt = tokenizer.encode(
    "FIRST CITIZEN.\nBefore we proceed any further, hear me speak.\n\nALL.\nSpeak, speak.\n\n"
    "FIRST CITIZEN.\n"
)
window_state = start_lookahead(main, window_prompt, window=4, ngram=3, guesses=4)
emitted_per_pass = []
for pass_number in range(1, 11):
    levels, last = window_state.levels.clone(), window_state.last
    emitted, checked = lookahead_round(main, window_state, ngram=3, guesses=4, temperature=0.0,
                                       generator=None)  # fmt: skip
    new = window_state.levels[-1]  # this pass's predictions, now the newest level
    full = len(levels) == 2  # N - 1 levels: this pass harvested
    grams = [tokenizer.decode([key, *rest]) for key, rest in harvest(levels, new)] if full else []
    emitted_per_pass.append(len(emitted))
    print(f"pass {pass_number:2}: last {tokenizer.decode([last])!r}, {checked} checked, emitted "
          f"{tokenizer.decode(emitted)!r}")  # fmt: skip
    if grams:
        print("         harvested", "  ".join(map(repr, grams)))
    if pass_number == 5:
        drawn = (last, levels, new)

last, levels, new = drawn
plot_lookahead_window(
    tokenizer.decode([last]), [[tokenizer.decode([t]) for t in level] for level in levels.tolist()],
    new=[tokenizer.decode([t]) for t in new.tolist()], title="Pass 5: W = 4, N = 3, G = 4",
)  # fmt: skip

# %% tags=["claim"]
assert max(emitted_per_pass) >= 2, "the prose asks for a pass that emits more than one token"

# %% [markdown]
# **Predict, then run.** Greedy text from the four prompts of section 3, by chapter 4's
# generator and by lookahead decoding for a few $(W, N, G)$. Same texts? How many tokens per
# main pass, compared with the n-gram drafter's?
#
# <details><summary>What to expect</summary>
#
# The same texts, token for token, for every setting. Tokens per pass grow with the setting
# (a wider window, longer n-grams, more candidates): more trajectories, more n-grams to try.
# Each pass is also much wider (up to $1 + (N - 1)(W + G)$ tokens): whether that pays is
# section 7's question.
#
# </details>

# %%
with torch.inference_mode():
    for window, ngram, guesses in [(5, 3, 5), (7, 4, 7), (10, 5, 10)]:
        stats = SpeculativeStats()
        texts = lookahead_generate(
            main, tokenizer, demo_prompts, max_tokens_generated=n_new, window=window,
            ngram=ngram, guesses=guesses, temperature=0.0, stats=stats,
        )  # fmt: skip
        width = 1 + (ngram - 1) * (window + guesses)
        print(
            f"W={window:2}, N={ngram}, G={guesses:2}: same texts {texts == plain}, tokens per "
            f"main pass {stats.tokens_per_pass:.2f}, pass of up to {width} tokens"
        )

# %% [markdown]
# **The pool, with and without the text.** By default the pool holds only n-grams the
# lookahead branch wrote, as in the original implementation (there `POOL_FROM_PROMPT` is off
# unless set: `lade/decoding.py` at commit `eed010da`, although the repository's `minimal.py`
# example sets it). `pool_from_prompt=True` also puts the text's own n-grams into the pool: the
# prompt's before the first pass, then those that each pass's emitted tokens complete, which
# is prompt lookup inside lookahead decoding. The next cell counts tokens per pass, greedy,
# both ways, on the three kinds of text that section 7 times, with the n-gram drafter of
# section 3 ($k = 4$) beside them.

# %%
from utils import speed

pool_tokens = 40 if QUICK else 120
with torch.inference_mode():
    for workload, spec in speed.WORKLOADS.items():
        prompts = spec["prompts"][:1] if QUICK else spec["prompts"]
        per_pass = {}
        for pool_from_prompt in [False, True]:
            stats = SpeculativeStats()
            lookahead_generate(
                main, tokenizer, prompts, max_tokens_generated=pool_tokens, window=5, ngram=3,
                guesses=5, temperature=0.0, stop_at_eos=False, stats=stats,
                pool_from_prompt=pool_from_prompt,
            )  # fmt: skip
            per_pass[pool_from_prompt] = stats.tokens_per_pass
        stats = SpeculativeStats()
        speculative_generate(
            main, draft, tokenizer, prompts, k=4, max_tokens_generated=pool_tokens,
            temperature=0.0, stop_at_eos=False, drafter="ngram", stats=stats,
        )  # fmt: skip
        print(
            f"{workload:14} tokens per pass: lookahead (5, 3, 5) {per_pass[False]:.2f}, with "
            f"pool_from_prompt {per_pass[True]:.2f}; n-gram drafter {stats.tokens_per_pass:.2f}"
        )

# %% [markdown]
# ### Fresh noise per candidate: the bias
#
# The first version one writes checks each candidate with its *own* noise and keeps the
# longest run: `verify_naive`. It is biased.
#
# **Why.** Look at the first position, and let each candidate's check be a fresh draw
# $x_g \sim p$ that confirms candidate $g$ when $x_g$ is its token $c_g$. One candidate alone is
# exact: $c_0$ comes out with probability $p(c_0)$, and when it does not, the draw $x_0$ that
# rejected it is a sample of $p$ without $c_0$, section 1's residual, and that is what comes
# out. A second candidate breaks this. After candidate 0's rejection the position should be
# one draw of the residual; instead candidate 1 gets a fresh draw of its own from the whole of
# $p$, and only when that fails too does $x_0$ come out. Candidate 1's token has two chances,
# its own draw and $x_0$, where it should have one. So independent checks are biased whenever
# two or more candidates are checked, whatever their tokens: a failed check hands the position
# to another candidate's fresh draw. (With longer candidates it gets worse: the longest run
# wins, so another candidate's draws can even overrule a check that succeeded.)
#
# An example: $p = (0.3, 0.3, 0.2, 0.1, 0.1)$ on the tokens A to E, and two one-token
# candidates, A then B. A still comes out with probability 0.3 (its check comes first). B
# comes out when $x_0 \ne A$ and $x_1 = B$, or when $x_0 = B$ and $x_1 \ne B$:
# $0.7 \cdot 0.3 + 0.3 \cdot 0.7 = 0.42$ instead of 0.3; C, D and E lose what B gains
# (0.14, 0.07 and 0.07 instead of 0.2, 0.1 and 0.1). When the candidates share their first
# token $c$, it comes out when any of the $G$ checks picks it: $1 - (1 - p_c)^G$ instead of
# $p_c$.
#
# The exact rules spend one draw per position on all the candidates: shared noise (one argmax,
# one pick), or the rejection rule above (A is kept with probability 0.3; after its rejection, B
# with probability $0.3 / 0.7$, what is left of $p$; after both, a draw from C, D and E). The
# next cell computes the three rules exactly on this example, and draws from `verify` and
# `verify_naive`.

# %%
p_toy = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])  # tokens A, B, C, D, E
A, B = 0, 1  # candidate 0 is (A,), candidate 1 is (B,)
# Fresh noise: two independent draws. Candidate 0 is kept if x0 = A, else candidate 1 if
# x1 = B; else the run is empty and the model's own pick for candidate 0, x0, comes out.
naive_exact = torch.zeros(5)
for x0 in range(5):
    for x1 in range(5):
        token = A if x0 == A else B if x1 == B else x0
        naive_exact[token] += p_toy[x0] * p_toy[x1]
# The rejection rule: test A, then B against what is left of p, then draw from the rest.
rejection_exact, residual, left = torch.zeros(5), p_toy.clone(), 1.0
for c in (A, B):
    rejection_exact[c] += left * residual[c]
    left *= 1 - float(residual[c])
    residual[c] = 0
    residual /= residual.sum()
rejection_exact += left * residual
# The two verifiers on the same case (the logits after the candidates do not matter here).
n_toy = 4_000 if QUICK else 40_000
toy_logits, toy_candidates = p_toy.log(), torch.tensor([[A], [B]])
g = torch.Generator().manual_seed(0)
drawn = {}
for name, verifier in [("verify", verify), ("verify_naive", verify_naive)]:
    firsts = [verifier(toy_logits, toy_logits.expand(2, 1, 5), toy_candidates, 1.0, g)[0][0]
              for _ in range(n_toy)]  # fmt: skip
    drawn[name] = torch.bincount(torch.tensor(firsts), minlength=5) / n_toy
print("first token:                     A      B      C      D      E")
for name, row in [
    ("p", p_toy),
    ("fresh noise, exactly", naive_exact),
    ("rejection rule, exactly", rejection_exact),
    (f"verify, {n_toy} draws", drawn["verify"]),
    (f"verify_naive, {n_toy} draws", drawn["verify_naive"]),
]:
    print(f"{name:28}" + "".join(f"{float(x):7.3f}" for x in row))

# %% tags=["claim"]
assert torch.allclose(naive_exact, torch.tensor([0.3, 0.42, 0.14, 0.07, 0.07])), "see prose"
assert torch.allclose(rejection_exact, p_toy), "the rejection rule must give p exactly"

# %% [markdown]
# Now on the shipped model. The prompt below ends in " is", and with `pool_from_prompt=True`
# its own 3-grams give three candidates that all start with " the". Let $p$ be the model's
# probability of " the" after it. Exact verification emits " the" with probability $p$; the
# naive one whenever any of the three checks picks it, $1 - (1 - p)^3$. In section 5's terms,
# the checks are samplers of the same $p$: shared noise couples them completely
# (`same_token_shared_gumbel(p, p)` = 1, one draw), while independent checks are separate
# draws. With two of them, " the" comes out with probability $1 - (1 - p)^2 = p + (1 - p)\,p$:
# the gain $(1 - p)\,p$ is the chance that the first check fails and the second, fresh one
# picks " the".
#
# **Predict, then run.** With $p$ printed below, how often will each verifier's first token be
# " the" over many copies of the prompt?

# %%
naive_prompt = "CLOWN.\nWhat is the matter? What is the news? What is the reason? What is"
naive_ids = tokenizer.encode(naive_prompt)
the = tokenizer.encode(" the")[0]
with torch.inference_mode():
    p_the = float(main(torch.tensor([naive_ids]))[0, -1].softmax(-1)[the])
n_copies = 300 if QUICK else 2000
measured = {}
with torch.inference_mode():
    for name, verifier in [("exact", verify), ("naive", verify_naive)]:
        rows = lookahead_generate(
            main, tokenizer, [naive_prompt] * n_copies, max_tokens_generated=1, window=4,
            ngram=3, guesses=4, temperature=1.0, seed=0, stop_at_eos=False, return_ids=True,
            verifier=verifier, pool_from_prompt=True,
        )  # fmt: skip
        measured[name] = sum(r[len(naive_ids)] == the for r in rows) / n_copies
spread = 2 * math.sqrt(p_the * (1 - p_the) / n_copies)
print(f"p(' the') = {p_the:.3f}; naive, predicted 1 - (1 - p)^3 = {1 - (1 - p_the) ** 3:.3f}")
for name, value in measured.items():
    print(f"{name:5} verifier: ' the' first in {value:.3f} of {n_copies} copies (± {spread:.3f})")

# %% tags=["claim"]
_grams = {tuple(naive_ids[i + 1 : i + 3]) for i in range(len(naive_ids) - 2)
          if naive_ids[i] == naive_ids[-1]}  # fmt: skip
assert len(_grams) == 3 and {g[0] for g in _grams} == {the}, "three 3-grams after ' is', ' the'"

# %% [markdown]
# The naive verifier is biased towards whatever the candidates propose: the model's own
# guesses, and with `pool_from_prompt` the text's n-grams, so at a temperature above 0 towards
# repeating the text. Greedy, both verifiers are the same (no noise to share). The exact one
# draws less noise than the naive one (one vector per position, not one per candidate and
# position), and it is the one `lookahead_generate` uses by default.

# %% [markdown]
# ## 7. When does it pay?
#
# Say each draft is kept with probability $\alpha$, independently. A round emits
# $1 + \alpha + \dots + \alpha^k$ tokens on average:
#
# $$E[\text{tokens per round}] = \frac{1 - \alpha^{k+1}}{1 - \alpha}.$$
#
# A round costs $k$ drafter steps, each $c$ times a main-model step (one token, with a cache),
# one main-model pass over $k + 1$ tokens, $v_k$ times a one-token step, and a **fixed cost**
# $f$: everything a round does that is not a forward pass (the sampler, trimming the caches,
# Python's bookkeeping). The textbook takes $v_k = 1$ and $f = 0$: on a GPU, a few more tokens
# in one pass cost almost nothing, because a one-token step is bound by reading the weights,
# not by arithmetic. Whether that holds on this machine, the cells below measure. Against a
# baseline whose token costs $b$ main steps:
#
# $$\text{speed-up} = \frac{b\,(1 - \alpha^{k+1})}{(1 - \alpha)(c\,k + v_k + f)}.$$
#
# Lookahead decoding has no drafter ($c = 0$), a much wider pass ($v$ of
# $1 + (N - 1)(W + G)$ tokens at most), and tokens per pass that only a run can tell.
#
# Larger $k$ means more tokens per round when guesses are good, and more wasted drafting when
# they are not: the best $k$ balances $\alpha$ against $c$, $v_k$ and $f$. What text is being
# written matters as much. The course times three kinds (`utils/speed.py`):
#
# - **open-ended** text: of the prompts tried, those whose greedy continuation repeats itself
#   least (sampled at a temperature above 0, the texts here hardly repeat themselves: the last
#   timing cell prints how much);
# - **looping** greedy text: the small model often settles into a loop of short lines, and a
#   loop is made of n-grams the text already holds, exactly what prompt lookup finds;
# - an **input-grounded** task: a passage, then a cue to say it again. This is what prompt
#   lookup was designed for (summaries, code edits, answers that quote their input): the text
#   to write is in the prompt. Whether the model copies it is the question.
#
# All timings use one thread and the fastest of a few runs (see chapter 4's section 9).

# %% tags=["demo"]
import statistics

from solutions.cached_sampling import CachedTransformerSampler
from utils import speed
from utils.timing import best_seconds, one_thread

baseline = CachedTransformerSampler(main, tokenizer)
shape_tokens = 40 if QUICK else 120
with torch.inference_mode():
    for workload, spec in speed.WORKLOADS.items():
        prompt = spec["prompts"][0]
        ids = tokenizer.encode(prompt)
        new = baseline.sample(ids, shape_tokens, temperature=0.0, stop_at_eos=False).tolist()
        text = tokenizer.decode(new[len(ids) :])
        print(
            f"{workload}: repeats itself {speed.repeat_rate(new, len(ids)):.0%}, copies its "
            f"prompt {speed.copy_rate(new, len(ids)):.0%} (new tokens that end a 4-gram seen "
            f"before / in the prompt)\n  {prompt[-40:]!r} -> {text[:110]!r}\n"
        )

# %% [markdown]
# **Predict, then run.** The next cell measures $c$ and $v_k$ on this machine. Will $v_k$ stay
# near 1, as on a GPU, or grow with $k$? Will the draft model, half the main model's layers and
# two thirds of its width, cost half a step, or much less?

# %% tags=["demo"]
ks = [1, 4] if QUICK else [1, 2, 3, 4, 5, 6]
repeats = 1 if QUICK else 3  # timed runs per measurement: the fastest counts
n_time = 24 if QUICK else 150
look = (5, 3, 5)  # lookahead decoding's W, N, G
look_width = 1 + (look[1] - 1) * (look[0] + look[2])
calibration = tokenizer.encode(speed.CALIBRATION_PROMPT)
with one_thread(), torch.inference_mode():
    cal_text = baseline.sample(calibration, 240, temperature=0.0, stop_at_eos=False).tolist()
    widths = sorted({k + 1 for k in ks} | {2, 8, 16, look_width})
    costs = speed.step_costs(main, draft, cal_text, widths, reps=5 if QUICK else 20)
    costs["c_ngram"] = {k: speed.ngram_cost(cal_text, k, costs["s1"]) for k in ks}
v_k = {k: speed.v_at(costs, k + 1, speed.CACHE_LEN) for k in ks}
print(f"main model, one cached step (s1): {1e3 * costs['s1']:.2f} ms")
print(f"c: draft model {costs['c']:.2f}, n-gram lookup {costs['c_ngram'][ks[-1]]:.4f}")
print("v_k:", {k: round(x, 2) for k, x in v_k.items()})
print(f"v of lookahead's widest pass ({look_width} tokens): "
      f"{speed.v_at(costs, look_width, speed.CACHE_LEN):.2f}")  # fmt: skip

# %% [markdown]
# **Predict, then run.** The next cell prints, for each drafter and $k$, the fraction $\alpha$ of
# tested drafts that were kept, then the tokens per pass. Before you read the tokens per pass,
# put its $\alpha$ into $E[\text{tokens per round}] = 1 + \alpha + \dots + \alpha^k$: will
# the run match the formula, and for which $k$ must it?
#
# <details><summary>What to expect</summary>
#
# At $k = 1$ they must agree: a round tests one draft, so it emits $1 + \alpha$ tokens on
# average whatever the text. For larger $k$ the formula assumes that every draft is kept with
# the same probability, independently of the ones before it, and a real text is not like that
# (a loop is easy to guess all the way through, a new line is not): the cell prints the
# formula's value beside each measurement, so you see how far your run is from it.
#
# </details>
#
# Now the real thing, greedy, on the chapter's timing prompt (the looping kind): both drafters
# for each $k$, and lookahead decoding with and without `pool_from_prompt`, against chapter
# 4's cached sampler. Each prediction
# uses the measured tokens per pass and a round's cost measured inside a real run on a
# calibration prompt (`speed.round_costs`: the drafting, the main pass and the fixed rest $f$),
# rescaled to this text's pass width and cache length. The dashed lines are the predictions.

# %% tags=["demo"]
greedy_kwargs = dict(temperature=0.0, stop_at_eos=False)
timing_prompt = demo_prompts[0]
timing_ids = tokenizer.encode(timing_prompt)


def run_method(method, setting, prompt, n, stats=None, temperature=0.0):
    common = dict(max_tokens_generated=n, temperature=temperature, stop_at_eos=False,
                  stats=stats, seed=0)  # fmt: skip
    if method == "lookahead":
        W, N, G, pool_from_prompt = setting
        return lookahead_generate(main, tokenizer, [prompt], window=W, ngram=N, guesses=G,
                                  pool_from_prompt=pool_from_prompt, **common)  # fmt: skip
    return speculative_generate(main, draft, tokenizer, [prompt], k=setting, drafter=method,
                                **common)  # fmt: skip


def time_method(method, setting, prompt, n, base_seconds, temperature=0.0):
    """Measured and predicted speed-up of one configuration, and its statistics."""
    stats = SpeculativeStats()
    run_method(method, setting, prompt, n, stats, temperature)
    seconds = best_seconds(lambda: run_method(method, setting, prompt, n, None, temperature),
                           repeats)  # fmt: skip
    calibrated = speed.round_costs(
        lambda st: run_method(method, setting, speed.CALIBRATION_PROMPT, n, st, temperature),
        SpeculativeStats, main, costs["s1"], repeats=1, namespace=globals(),
    )  # fmt: skip
    b = base_seconds / n / costs["s1"]
    cache_len = len(tokenizer.encode(prompt)) + n / 2
    cost = speed.predicted_round_cost(
        calibrated, costs, stats.mean_width, cache_len, len(calibration) + n / 2
    )
    predicted = speed.predicted_speedup(b, stats.tokens_per_pass, cost)
    return base_seconds / seconds, predicted, stats, calibrated


measured, predicted, rounds = {}, {}, {}
with one_thread(), torch.inference_mode():
    base = best_seconds(lambda: baseline.sample(timing_ids, n_time, **greedy_kwargs), repeats)
    for name in ["model", "ngram"]:
        measured[name], predicted[name] = [], []
        for k in ks:
            m, p, stats, calibrated = time_method(name, k, timing_prompt, n_time, base)
            measured[name].append(m)
            predicted[name].append(p)
            rounds[(name, k)] = (stats, calibrated)
            iid = sum(stats.acceptance**i for i in range(k + 1))  # 1 + a + ... + a^k
            print(f"{name:5} k={k}: alpha {stats.acceptance:.2f}, tokens per pass "
                  f"{stats.tokens_per_pass:.2f} (the formula says {iid:.2f}), measured "
                  f"{m:.2f}x, predicted {p:.2f}x")  # fmt: skip
    for pool_from_prompt in [False, True]:
        name = "lookahead + text" if pool_from_prompt else "lookahead"
        setting = (*look, pool_from_prompt)
        m, p, stats, calibrated = time_method("lookahead", setting, timing_prompt, n_time, base)
        measured[name], predicted[name] = [m] * len(ks), [p] * len(ks)  # no k: flat lines
        rounds[(name, look)] = (stats, calibrated)
        print(f"{name} W,N,G={look}: tokens per pass {stats.tokens_per_pass:.2f}, measured "
              f"{m:.2f}x, predicted {p:.2f}x")  # fmt: skip
labels = {"model": "model drafter", "ngram": "ngram drafter", "lookahead": "lookahead (no k)",
          "lookahead + text": "lookahead, pool_from_prompt (no k)"}  # fmt: skip
plot_speedup(
    ks,
    {labels[n]: v for n, v in measured.items()},
    {labels[n]: v for n, v in predicted.items()},
    title=f"Greedy, {n_time} tokens, one thread: against chapter 4's cached sampler",
)

# %% tags=["claim"]
for _name in ["model", "ngram"]:  # "What to expect": at k = 1, tokens per pass is 1 + alpha
    _stats = rounds[(_name, 1)][0]
    assert abs(_stats.tokens_per_pass - 1 - _stats.acceptance) < 1e-9, _name

# %% [markdown]
# What your run says, in numbers: the next cell writes it out from the measurements above (the
# timing prompt's greedy text, and a round's parts in main steps).

# %% tags=["demo"]
loop_line = tokenizer.decode(
    baseline.sample(timing_ids, n_time, **greedy_kwargs).tolist()[len(timing_ids) :]
).split("\n")
top_line = max(set(loop_line) - {""}, key=loop_line.count)
ratio = {name: (min(measured[name]), max(measured[name])) for name in ["model", "ngram"]}
errors = [  # every configuration once (each lookahead line is one)
    abs(m / p - 1)
    for name in ["model", "ngram"]
    for m, p in zip(measured[name], predicted[name], strict=True)
] + [abs(measured[n][0] / predicted[n][0] - 1) for n in ["lookahead", "lookahead + text"]]
k4 = 4  # in ks, quick or not
stats4, cal4 = rounds[("model", k4)]
alpha4 = min(stats4.acceptance, 0.999)
gain = (1 - alpha4 ** (k4 + 1)) / (1 - alpha4)
print(
    f"On this machine the draft model ran at {ratio['model'][0]:.2f}-{ratio['model'][1]:.2f}x "
    f"the cached sampler, the n-gram drafter at {ratio['ngram'][0]:.2f}-{ratio['ngram'][1]:.2f}x "
    f"and lookahead decoding at {measured['lookahead'][0]:.2f}x "
    f"({measured['lookahead + text'][0]:.2f}x with pool_from_prompt). The timed text is a loop: "
    f"{top_line!r} is {loop_line.count(top_line)} of its {len(loop_line)} lines, which is why "
    f"prompt lookup finds its guesses there.\n"
    f"A draft-model step costs c = {costs['c']:.2f} main steps; v_k went from "
    f"{v_k[ks[0]]:.2f} (k = {ks[0]}) to {v_k[ks[-1]]:.2f} (k = {ks[-1]}); a round's fixed rest f "
    f"was {cal4['f']:.2f} main steps with the draft model at k = {k4}. With f, the predictions "
    f"missed the measurements by a median {statistics.median(errors):.0%}.\n"
    f"What if: at the measured alpha = {stats4.acceptance:.2f} and k = {k4}, the textbook "
    f"formula gives {gain / (costs['c'] * k4 + v_k[k4]):.2f}x with this machine's c and v_k, "
    f"but {gain / (0.05 * k4 + 1):.2f}x with c = 0.05 and v_k = 1, a GPU-like pair."
)

# %% [markdown]
# **At a temperature above 0.** The same timing prompt at $T = 0.7$: the drafters at $k = 4$ and
# lookahead decoding both ways, against the cached sampler at the same temperature (each
# method's text is its own sample, fixed by its seed). **Predict, then run:** which method's
# guesses suffer most once the text is sampled?
#
# <details><summary>What to expect</summary>
#
# The n-gram drafter's: its guesses come from the text's history, and a sampled text rarely
# repeats it, so its $\alpha$ falls close to 0. The draft model's guesses are samples
# of a $q$ close to $p$, kept with probability $\sum \min(p, q)$ (section 5's plot), which need
# not fall. Lookahead decoding's guesses are greedy n-grams, each token kept with probability
# $p$ of that token: less than 1 once the model samples.
#
# </details>

# %% tags=["demo"]
T_sampled = 0.7
sampled_kwargs = dict(temperature=T_sampled, stop_at_eos=False, seed=0)
with one_thread(), torch.inference_mode():
    sampled = baseline.sample(timing_ids, n_time, **sampled_kwargs).tolist()
    print(f"T = {T_sampled}: {speed.repeat_rate(sampled, len(timing_ids)):.0%} of the cached "
          "sampler's new tokens end a 4-gram seen before (greedy, the text loops)")  # fmt: skip
    base_sampled = best_seconds(lambda: baseline.sample(timing_ids, n_time, **sampled_kwargs),
                                repeats)  # fmt: skip
    for name, setting in [("model", 4), ("ngram", 4), ("lookahead", (*look, False)),
                          ("lookahead", (*look, True))]:  # fmt: skip
        m, p, stats, _ = time_method(name, setting, timing_prompt, n_time, base_sampled, T_sampled)
        print(f"{name:9} {setting}: alpha {stats.acceptance:.2f}, tokens per pass "
              f"{stats.tokens_per_pass:.2f}, measured {m:.2f}x, predicted {p:.2f}x")  # fmt: skip

# %% [markdown]
# Read the plot with those sentences. With the draft model, $c$ is far from 0: every draft costs
# a large part of a main step, so a kept draft saves little and a rejected one wastes a lot.
# The n-gram lookup costs almost nothing, so its gain is set by $\alpha$, $v_k$ and $f$; it
# gains where the text repeats itself, and at a temperature above 0 its $\alpha$ falls (the
# last cell): the main model's sample rarely repeats the text's history. Lookahead decoding
# guesses with the model itself (section 6's last cell compares its tokens per pass with the
# n-gram drafter's on all three kinds of text), but each pass reads a few dozen tokens, and on
# a CPU that is arithmetic paid for in full ($v$ of the wide pass). A smaller model also saves
# less on a CPU than its size suggests: the draft model does about a third of the main model's
# multiply-adds per token (more than half of its own are the unembedding onto 4,096 tokens);
# compare that with the $c$ printed above. The rest of a step is fixed cost: Python, and one
# dispatch per operation.
#
# Chapter 5 took much of that fixed cost out, but out of both models' steps alike, so their
# ratio $c$ hardly falls. `python benchmarks/speculative.py --compiled` runs this chapter's
# draft model on chapter 5's static caches with compiled steps (`solutions/fast_speculative.py`,
# the same tokens under a seed); the README quotes its recorded run: $c$ stays above one half,
# and speculation still does not pay on this CPU.
#
# Where a real pair pays (reasoning: no GPU has run this chapter): a large model on a GPU reads
# billions of weights per step, so a step over a few more tokens costs about the same
# ($v_k \approx 1$), and a draft with a small fraction of its weights costs a small fraction of
# a step ($c$ of a few hundredths). What the papers measured: Leviathan et al. (2023) 2 to 3
# times T5-XXL's speed (batch 1, one TPU-v4; T5-small was among their drafts); Chen et al.
# (2023) 2 to 2.5 times Chinchilla 70B's with a 4B draft, in a distributed setup; the lookahead
# paper (Fu et al., 2024) up to 1.8 times on MT-Bench, and up to 4 times for code completion
# with its pass spread over several GPUs. (The speed-ups are from each paper's abstract.)
#
# `benchmarks/speculative.py` measures all of this over the three workloads, three
# temperatures and every $k$. One run on the course's 2-core CPU is quoted in the README's
# "Benchmarks" section, with its machine: read it after your own.
#
# ## Check your understanding
#
# - Why may the sampler not keep a draft that passes its own test after an earlier draft was
#   rejected?
#
# <details><summary>Answer</summary>
#
# Draft $i + 1$ was drawn given draft $i$, and $p_{i+1}$ was computed given draft $i$. Once
# draft $i$ is replaced by a recovered token, the text is different, and both distributions
# are for a text that does not exist. Keeping the later draft would emit a token drawn for the
# wrong context.
#
# </details>
#
# - Why can the bonus token be drawn from $p_{k+1}$ without any test?
#
# <details><summary>Answer</summary>
#
# When all $k$ drafts are kept, the text is exactly what the main model would have produced,
# and $p_{k+1}$ is the main model's own distribution for the next token given that text: drawing
# from it is ordinary sampling. The main model's pass computed it anyway.
#
# </details>
#
# - A drafter proposes garbage: random tokens. What happens to the output and to the speed?
#
# <details><summary>Answer</summary>
#
# The output is still distributed exactly as the main model's sampling (the proof of section
# 1 holds for any $q$). Nearly every draft is rejected, nearly every round emits one token
# (the recovered one), and the drafting time is wasted: slower than no speculation.
#
# </details>
#
# - At temperature 0, why is speculative decoding's text identical to greedy decoding's, and
#   what could still make them differ in practice?
#
# <details><summary>Answer</summary>
#
# The greedy sampler keeps a draft only if it is the main model's argmax, and emits the argmax
# otherwise, so every emitted token is the main model's argmax given the text before it. In
# practice a pass over $k + 1$ tokens adds up its floating-point sums in a different order than
# a one-token step; at an exact or near tie of the top two logits, the argmax can flip. HF's
# test of assisted generation against greedy search allows for this: it accepts different
# tokens where the scores up to the first mismatch are nearly equal
# (`_check_similar_generate_outputs`, `tests/generation/test_utils.py` at commit `cf63921b`).
#
# </details>
#
# - Why is the maximal coupling $\sum_k \min(p_k, q_k)$ an upper bound for *any* way of drawing
#   $x \sim p$ and $y \sim q$ together?
#
# <details><summary>Answer</summary>
#
# $P(x = y = k) \le P(x = k) = p_k$ and $\le P(y = k) = q_k$, so $P(x = y) = \sum_k P(x = y = k)
# \le \sum_k \min(p_k, q_k)$. Rejection sampling reaches it: it keeps the draft $k$ with
# probability exactly $\min(p_k, q_k)$.
#
# </details>
#
# - In a batch, row 0 keeps all 4 drafts and row 1 none. What does the main model's cache look
#   like after the round, before and after `keep_only`?
#
# <details><summary>Answer</summary>
#
# Before: both rows have 5 new columns (`last` and 4 drafts); row 0's are all real, row 1's
# only the first. After: row 0 is unchanged; row 1's 4 rejected columns become padding and its
# real positions move 4 columns to the right, so row 1 has 4 more columns of left padding than
# before. Only columns that are padding in every row are dropped: none of the 5 new ones (row 0
# needs them all), and at the left only as many as both rows now pad.
#
# </details>
#
# - Lookahead decoding keeps nothing of the window in the cache, not even a guess that turned
#   out right. Why not keep the guesses that match the emitted text?
#
# <details><summary>Answer</summary>
#
# A window token's key and value were computed from the text its row of the mask let it read:
# level 0's guesses and its own column, not the emitted text. Even when its own token is right,
# the tokens it read may not be, and a later pass would read a key computed from a text that
# never existed. The candidates' runs are different: a kept run read exactly `last` and the
# run before it, which is the emitted text.
#
# </details>
#
# ## Further reading
#
# - Leviathan, Kalman and Matias, *Fast Inference from Transformers via Speculative Decoding*,
#   ICML 2023 (arXiv:2211.17192); Chen et al., *Accelerating Large Language Model Decoding with
#   Speculative Sampling*, 2023 (arXiv:2302.01318): the rejection sampler and its proof, and
#   measured speed-ups for large models on accelerators.
# - Fu, Bailis, Stoica and Zhang, *Break the Sequential Dependency of LLM Inference Using
#   Lookahead Decoding*, ICML 2024 (arXiv:2402.02057), and its code,
#   `github.com/hao-ai-lab/LookaheadDecoding`, read at commit `eed010da` (main, March 2025):
#   `lade/decoding.py`'s `jacobi_sample_multilevel` samples with SpecInfer-style rejection
#   sampling ("algorithm modified from specinfer"), and `POOL_FROM_PROMPT` (off unless
#   `lade.config_lade` sets it) puts the text's n-grams in the pool. Its pull request 6, closed
#   unmerged, is the discussion of Gumbel noise for sampling; section 5's shared-noise formula
#   is worked out there.
# - Santilli et al., *Accelerating Transformer Inference for Translation via Parallel
#   Decoding*, ACL 2023 (arXiv:2305.10427): Jacobi decoding.
# - Miao et al., *SpecInfer*, ASPLOS 2024 (arXiv:2305.09781): many candidates checked at once
#   as a token tree, with multi-candidate rejection sampling.
# - vLLM's rejection sampler, `vllm/v1/sample/rejection_sampler.py` (read at commit
#   `0097a7bb`: it returns `output_token_ids` `[batch, max_spec_len + 1]`, padded with
#   `PLACEHOLDER_TOKEN_ID = -1`), and its tests, ported in this repository's `tests/peers/`;
#   prompt lookup decoding, `github.com/apoorvumang/prompt-lookup-decoding`.
# - Speculative decoding in serving and libraries: TensorRT-LLM's "Speculative Sampling" page
#   (`nvidia.github.io/TensorRT-LLM/advanced/speculative-decoding.html`), HF `transformers`'
#   "Assisted decoding" guide (`huggingface.co/docs/transformers/assisted_decoding`).
#
# ## What's next
#
# Chapter 8 serves many requests at once: a paged cache, continuous batching and prefix caching,
# the core of a serving engine such as vLLM. Chapter 10 writes the sampling steps of chapters 3
# and 6 as GPU kernels in Triton: Gumbel-max sampling fused into the unembedding's matrix product
# (no row of probabilities ever stored), top-k and top-p without sorting, and this chapter's
# rejection sampler, each checked against exact probabilities and against the PyTorch versions
# of chapters 3 and 6.
