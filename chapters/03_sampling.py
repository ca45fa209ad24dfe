# %% [markdown]
# # Chapter 3 — Sampling and beam search
#
# A language model does not write text. At every position it hands you a vector of `d_vocab`
# numbers, its **logits**, one score for every token that could come next, and stops there.
# Everything that turns those scores into a sentence is a separate decision, made by code
# outside the model: which token to take, how adventurous to be, when to stop. That code is
# what this chapter is about, and the choices it makes change what a model "says" as much as
# its weights do.
#
# You write it yourself, in two parts.
#
# **Sampling, one token at a time** (`TransformerSampler`):
#
# - `greedy_search` and `apply_temperature`: always take the most likely token; make the
#   distribution sharper or flatter;
# - `apply_frequency_penalty`: make tokens the text has already used less likely;
# - `sample_basic`: draw a token at random from the model's distribution;
# - `filter_top_k` / `sample_top_k` and `filter_top_p` / `sample_top_p`: draw only from the
#   most likely tokens, cutting off the long tail of unlikely ones;
# - `TransformerSampler.sample`: the loop that calls the model, picks a token, appends it and
#   goes again, until it has enough tokens or the model says the text is over.
#
# **Beam search** (`Beams`, `beam_search`): instead of committing to one token at each step,
# follow the few most likely *sequences* and keep the best, with `banned_ngram_tokens` to stop
# it from repeating itself.
#
# Each of them is checked against something the course's own code did not compute: exact
# formulas for the deterministic pieces, Hugging Face `transformers` (its `generate` method and
# the small "logits processor" classes it uses internally) and, for anything random, the exact
# probabilities, by drawing thousands of samples and testing whether their frequencies fit.
#
# The model you sample from is the course's shipped Shakespeare model, `models/shakespeare`:
# a 4-layer GPT-2-style model trained with the chapter-2 code on 34 of Shakespeare's plays.
# `load_model("shakespeare")` reads it into the `DemoTransformer` of chapter 1 and returns it
# with its tokenizer. The model code is imported from `solutions`, the course's reference, so
# you do not need your own chapters 1 and 2 to work here.
#
# **Time:** about 3 hours. **You need:** PyTorch tensors and indexing (`topk`, `sort`,
# `gather`/`scatter`, `masked_fill`), and the idea of chapter 1: logits `[batch, posn, d_vocab]`
# at the last position are the model's guess for the next token.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it, which runs
# the graded tests for that exercise on what your notebook defines *right now*. From a terminal,
# `pytest -m sample_top_p` and `course grade 3` grade your saved notebook;
# `show_solution("filter_top_p")` prints the reference when you are truly stuck (try for a
# while with hints 1 and 2 first); `course reset 03` gives you a fresh notebook and keeps a
# backup of yours.
#
# Some cells hold **given code**, which you read and run but do not write: `sample_next_token`,
# which strings your sampling functions together in the right order (the sampling loop calls
# it), and the base classes and start functions that check arguments and keep the books for the
# sampler and for beam search. Exercise cells hold a few given lines too, around the part you
# write.
#
# Every sampling function in this chapter takes a **batch** of logits, `[batch, d_vocab]`, one
# row per sequence, and works on each row independently. That costs a little thought now and
# pays off three times: the tests draw 20,000 samples in one call, the plots below draw
# thousands at a time, and in chapter 4 you generate text for many prompts at once with the
# same functions.
#
# Run the setup cell below first.

# %% tags=["setup"]
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float, Int
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions import checks
from utils.check import check
from utils.display import show_solution

# %% [markdown]
# The course's own tests (`make test`) run this notebook from top to bottom with
# `COURSE_QUICK=1`: the demos then draw fewer samples and write shorter texts, so that the run
# stays short. On your machine `QUICK` is `False`. You never need to change it.

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)

# %% [markdown]
# ## The model
#
# `load_model` returns the model in evaluation mode and its tokenizer (the 4,096-token BPE
# vocabulary of chapter 2, trained on the training plays). Its context window, `n_ctx`, is 256
# tokens: it cannot read more than that at once, which will matter when the text we generate
# grows longer.

# %%
from utils.models import load_model

# "mine" samples from the model you trained and saved in chapter 2 instead (the numbers quoted
# in the text are the shipped model's).
MODEL = "shakespeare"
model, tokenizer = load_model(MODEL)

# %%
cfg = model.cfg
n_params = sum(p.numel() for p in model.parameters())
print(f"{cfg.n_layers} layers, d_model {cfg.d_model}, n_ctx {cfg.n_ctx}, d_vocab {cfg.d_vocab}")
print(f"{n_params:,} parameters (W_U counted separately from W_E)")
print(f"end of text: {tokenizer.eos_token!r}, id {tokenizer.eos_token_id}")

# %% [markdown]
# ## 1. Logits, probabilities and log-probabilities
#
# Feed the model a prompt of $n$ tokens and look at the logits at the last position: a vector
# $z \in \mathbb{R}^V$, with $V$ = `d_vocab`. Three views of it appear in this chapter.
#
# - **Logits** $z_i$: raw scores, any real number. Bigger means more likely, and that is all
#   you can read from one logit alone.
# - **Probabilities** $p_i = \operatorname{softmax}(z)_i = \dfrac{e^{z_i}}{\sum_j e^{z_j}}$:
#   positive and summing to 1. This is the distribution we sample from.
# - **Log-probabilities** $\log p_i = z_i - \log \sum_j e^{z_j}$, computed by `log_softmax`.
#   They are the logits minus one number, the *log-sum-exp* of the row.
#
# **Logits are only defined up to a constant.** Add the same $c$ to every logit of a row and
# the softmax does not change: $e^{z_i + c} / \sum_j e^{z_j + c}$, and the $e^c$ cancels. Only
# *differences* between logits mean anything: $z_i - z_j = \log(p_i / p_j)$. So a logit of 5
# says nothing by itself, and logits at two different positions cannot be compared. Log-probs
# are the logits with that constant fixed (so that the exponentials sum to 1), which is why
# they are what we add up and compare across positions. The same invariance is why
# implementations subtract each row's maximum before exponentiating: the result is the same,
# and `exp` never overflows.
#
# **Probabilities of sequences are products; we add logs instead.** By the chain rule of
# probability, the probability of a continuation $x_{n+1}, \dots, x_{n+m}$ is the product of
# what the model gave each token given everything before it:
#
# $$P(x_{n+1..n+m} \mid x_{1..n}) = \prod_{t=n+1}^{n+m} p(x_t \mid x_{<t}), \qquad
#   \log P = \sum_{t=n+1}^{n+m} \log p(x_t \mid x_{<t}).$$
#
# Products of many numbers below 1 shrink fast: 500 tokens of probability 0.1 each multiply to
# $10^{-500}$, far below the smallest float32 (about $10^{-45}$), so the product rounds to 0 and
# every long sequence looks equally impossible. The sum of their logs is $-1151.3$, a perfectly
# ordinary number. Beam search, at the end of this chapter, ranks sequences by exactly this sum.
#
# Let's look at the model's guess after a prompt. `logits[:, -1]` keeps the batch dimension:
# `[1, d_vocab]`, the shape every function in this chapter takes.

# %%
prompt = "OTHELLO.\nGood night, my"
ids = torch.tensor([tokenizer.encode(prompt)])
with torch.inference_mode():
    logits = model(ids)[:, -1]  # [1, d_vocab]: scores for the token after the prompt
probs = logits.softmax(dim=-1)
logprobs = logits.log_softmax(dim=-1)


def show_top(title: str, columns: dict[str, Tensor], by: Tensor, n: int = 8) -> None:
    """A rich table of the n tokens with the largest `by`, with one column per named row."""
    table = Table(title=title)
    table.add_column("token")
    for name in columns:
        table.add_column(name, justify="right")
    for token in by.topk(n).indices.tolist():
        # Three decimals for every score; counts are whole numbers.
        values = [
            f"{column[token].item():.0f}" if name == "count" else f"{column[token].item():.3f}"
            for name, column in columns.items()
        ]
        table.add_row(repr(tokenizer.decode([token])), *values)
    Console().print(table)


show_top(
    f"after {prompt!r}",
    {"logit": logits[0], "log-prob": logprobs[0], "probability": probs[0]},
    by=logits[0],
)
gap = logits - logprobs  # the same number for every token: the row's log-sum-exp
print(f"log-sum-exp of the row:    {logits.logsumexp(dim=-1).item():.4f}")
print(f"logit - log-prob:          from {gap.min().item():.4f} to {gap.max().item():.4f}")
print("softmax unchanged by +100:", torch.allclose((logits + 100).softmax(-1), probs))
print("0.1 ** 500 in float32:    ", (torch.tensor(0.1) ** 500).item())
print("500 * log(0.1):           ", 500 * math.log(0.1))

# %% tags=["claim"]
assert round(500 * math.log(0.1), 1) == -1151.3, "section 1 says the 500 logs sum to -1151.3"
assert round(math.log10(2.0**-149)) == -45, "section 1: the smallest float32 is about 1e-45"

# %% [markdown]
# Logits, log-probs and probabilities put the tokens in the same order: both maps are
# increasing. So "the most likely token" is the argmax of any of the three.
#
# ## 2. Greedy search
#
# The simplest way to write text: at each step take the single most likely token. It is
# deterministic (the same prompt always gives the same text), needs no random numbers, and
# is what chapter 2 used to show the model's progress during training.
#
# ### The task: `greedy_search`
#
# `greedy_search(logits)` takes logits `[batch, d_vocab]` and returns the id of the most likely
# token of each row, `[batch]`, as integers. If two tokens tie exactly for first place, return
# the lower id (which is what PyTorch's `argmax` does). You write it together with the next
# section's `apply_temperature`, in one cell at the end of section 3.
#
# ## 3. Temperature
#
# Greedy text is predictable in the worst sense: the model's first choice, every time, soon
# falls into a loop, and the same prompt always gives the same text. The obvious alternative is
# to **sample**: draw the next token at random, with the probabilities the model gives. Before
# we write that, a dial that makes those probabilities more or less adventurous: the
# **temperature** $T > 0$. Divide the logits by it before the softmax:
#
# $$p_i(T) = \frac{e^{z_i / T}}{\sum_j e^{z_j / T}}.$$
#
# - $T = 1$ leaves the distribution as the model made it.
# - $T < 1$ sharpens it: differences between logits grow, the likely tokens get likelier.
# - $T > 1$ flattens it: as $T \to \infty$ every $z_i / T \to 0$ and the distribution tends to
#   uniform, every token of the vocabulary equally likely.
#
# Another way to see it: $e^{z_i / T} = (e^{z_i})^{1/T}$, so temperature raises every
# probability to the power $1/T$ and renormalises. Two tokens whose probabilities are in the
# ratio 2 : 1 at $T = 1$ are in the ratio 4 : 1 at $T = 0.5$ and $\sqrt 2$ : 1 at $T = 2$.
# Temperature never changes the *order* of the tokens, only how far apart they are.
#
# **Why temperature 0 means greedy.** Let $z_{\max}$ be the largest logit, and divide the top
# and bottom of the fraction by $e^{z_{\max}/T}$:
#
# $$p_i(T) = \frac{e^{(z_i - z_{\max}) / T}}{\sum_j e^{(z_j - z_{\max}) / T}}.$$
#
# Every exponent is now $\le 0$. As $T \to 0^+$, an exponent with $z_j < z_{\max}$ goes to
# $-\infty$ and its term to 0; a term with $z_j = z_{\max}$ stays exactly 1. So in the limit all
# the probability sits on the argmax (split evenly if several tokens tie for first): sampling at
# a temperature close to 0 *is* greedy search. At $T = 0$ itself the division is undefined, so
# our sampler reads `temperature=0` as a request for greedy search and never divides by it, as
# vLLM does (its `SamplingParams`: "Zero means greedy sampling"). HF's `generate` spells the same
# request `do_sample=False`: asked to sample (`do_sample=True`) at `temperature=0.0`, it raises
# a `ValueError` that points there, and without sampling it ignores the temperature
# (`TemperatureLogitsWarper`, HF transformers 5.24).
#
# ### Exercise: `greedy_search` and `apply_temperature`
#
# Two short functions in one cell: `greedy_search` from section 2, and
# `apply_temperature(logits, temperature)`, which returns the logits divided by the
# temperature, a new tensor. The check that the temperature is positive is given.
#
# Common mistakes: taking the argmax over the wrong dimension (dimension 0 runs over the batch,
# not the vocabulary); returning the largest *logit* instead of the token's *index*;
# multiplying by $T$ instead of dividing (then low temperatures flatten, which is backwards);
# and dividing in place, `logits /= temperature`, which silently changes the caller's tensor
# too.
#
# The tests compare `greedy_search` with an argmax written out in plain Python, on a batch with
# an exact tie and on a batch of one row; check `apply_temperature` against the closed form,
# and that the logits you are given are left unchanged (`logits /= temperature` edits the
# caller's tensor and fails); and check that at $T = 10^{-3}$ the argmax gets essentially all
# the probability while every logit stays finite.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Greedy: you want the *index* of the largest logit, not the largest logit itself, along the
# vocabulary dimension of every row. Temperature: divide, don't multiply, and return a new
# tensor: the caller's logits must not change.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `Tensor.argmax(dim=...)` returns indices as int64, and at an exact tie the first one, that
#   is the lowest id. In `[batch, d_vocab]`, which `dim` is the vocabulary? The result must be
#   `[batch]`. (`max` returns values and indices; the values are not what you want.)
# - The temperature is one number for every logit of every row, so plain broadcasting does
#   it; the result is logits, `[batch, d_vocab]`, with no softmax. Avoid `/=`, which writes
#   into the caller's tensor. Check the direction: at $T = 0.5$ every gap between two logits
#   should double.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("greedy_search")` and
# `show_solution("apply_temperature")` in a new cell print the reference implementation. Read
# it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="greedy_and_temperature"
# solution: solutions.sampling.greedy_search
# solution: solutions.sampling.apply_temperature

# %%
check("greedy_and_temperature")

# %% [markdown]
# Here is one distribution, the model's guess after the prompt above, at several temperatures.
# The last rows show what happens to the rest: the **entropy** in bits (how unsure the
# distribution is: 0 for a certain outcome, $\log_2 V = 12$ for uniform over our 4,096 tokens)
# and the total probability of every token outside the top 8, the long **tail**.
#
# **Predict, then run.** At $T = 1$ the most likely token takes about 60%. What will it get at
# $T = 0.5$, and at $T = 2$? At $T = 2$, how much of the probability do you expect outside the
# top 8?
#
# <details><summary>What to expect</summary>
#
# At $T = 0.5$ every probability is squared before renormalising, so the favourite, `" lord"`,
# takes over 99% and the entropy drops to almost 0 bits: practically greedy. At $T = 2$ they are
# square-rooted instead: the favourite falls to about 4%, the entropy rises from about 4 bits to
# over 10 (of 12 at most), and more than 90% of the probability lies *outside* the top 8. Each
# of the thousands of tail tokens gains only a little, but there are so many of them that
# together they take almost everything. That is why high temperatures write nonsense.
#
# </details>

# %%
temperatures = [0.25, 0.5, 1.0, 1.5, 2.0]
by_temperature = {T: apply_temperature(logits, T).softmax(dim=-1)[0] for T in temperatures}


def entropy_bits(p: Tensor) -> float:
    """-sum p log2 p, with 0 log 0 = 0."""
    return (torch.special.entr(p).sum() / math.log(2)).item()


table = Table(title=f"probability of the next token after {prompt!r}")
table.add_column("token")
for T in temperatures:
    table.add_column(f"T = {T}", justify="right")
top8 = logits[0].topk(8).indices
for token in top8.tolist():
    row = [f"{by_temperature[T][token].item():.2%}" for T in temperatures]
    table.add_row(repr(tokenizer.decode([token])), *row)
table.add_section()
table.add_row("entropy (bits)", *[f"{entropy_bits(by_temperature[T]):.2f}" for T in temperatures])
tails = [f"{1 - by_temperature[T][top8].sum().item():.2%}" for T in temperatures]
table.add_row("outside the top 8", *tails)
Console().print(table)

# %% tags=["claim"]
assert tokenizer.decode(top8[:1]) == " lord", "section 3 says the favourite is ' lord'"
assert round(by_temperature[1.0][top8[0]].item(), 1) == 0.6, "section 3: about 60% at T = 1"
assert by_temperature[0.5][top8[0]] > 0.99, "section 3: over 99% at T = 0.5"
assert entropy_bits(by_temperature[0.5]) < 0.1, "section 3: almost 0 bits at T = 0.5"
assert round(by_temperature[2.0][top8[0]].item(), 2) == 0.04, "section 3: about 4% at T = 2"
assert round(entropy_bits(by_temperature[1.0])) == 4, "section 3: about 4 bits at T = 1"
assert entropy_bits(by_temperature[2.0]) > 10, "section 3: over 10 bits at T = 2"
assert 1 - by_temperature[2.0][top8].sum() > 0.9, "section 3: over 90% outside the top 8"

# %% [markdown]
# And the same distributions drawn: every token of the vocabulary, sorted from the most likely,
# with both axes on a log scale so that the tail shows. Temperature bends the curve around the
# first token: at low $T$ everything but the first few tokens drops out of sight; at high $T$
# the curve flattens, and the thousands of tokens in the tail, each unlikely but together far
# from negligible, get a real share.

# %%
from utils.plots import plot_temperature_curves

plot_temperature_curves(by_temperature)

# %% [markdown]
# ## 4. Frequency penalty
#
# Language models love to repeat themselves: once a phrase is in the context, copying it is an
# easy and often good prediction, and the copy makes the next copy more likely still. A
# **frequency penalty** pushes against that. Before sampling, each token's logit is lowered by
# the penalty $\alpha$ times the number of times the token already occurs in the sequence
# (prompt included):
#
# $$z_t \leftarrow z_t - \alpha \cdot \operatorname{count}(t).$$
#
# A token used three times loses $3\alpha$; a token never used is untouched. Because only
# differences of logits matter, this is a multiplicative discount of the probability: a token
# seen $c$ times has its probability, relative to an unseen token, multiplied by $e^{-\alpha c}$.
# A negative $\alpha$ *rewards* repetition, which is occasionally useful and usually a bad idea.
#
# OpenAI's API and vLLM have a `frequency_penalty` with the same formula but a different count:
# theirs counts only the tokens generated so far, ours counts the prompt's tokens too. OpenAI's
# documentation defines the count as how often the token "was sampled prior to the current
# position", and vLLM, which follows that definition, subtracts the penalty times the counts of
# the *output* tokens alone (the prompt's tokens feed only its `repetition_penalty`). So a
# prompt that uses "lord" three times costs "lord" $3\alpha$ here and nothing there, until the
# model writes it. HF has no frequency penalty; its `repetition_penalty` is another rule, which
# divides a positive logit by the penalty (and multiplies a negative one) once for every token
# already in the sequence, prompt included, however often it occurs. Nothing here uses it.
# Sources are listed at the end of the chapter.
#
# ### Exercise: `apply_frequency_penalty`
#
# `apply_frequency_penalty(input_ids, logits, freq_penalty, mask=None)` takes the sequences so
# far, `input_ids [batch, seq]`, and the logits for their next token, `[batch, d_vocab]`, and
# returns new logits with row `b` penalised by the counts of row `b`'s tokens. The optional
# `mask [batch, seq]` says which positions are text: chapter 4 pads short prompts to a common
# length, and padding is not text, so where a mask is given only the positions where it is
# `True` count. (`bincount` takes `weights`: a weight of 1 counts a position, 0 skips it.)
#
# The counting is done by `torch.bincount(x, minlength=d_vocab)`: for a 1-D tensor of
# non-negative integers, it returns a tensor whose entry `t` is the number of times `t` occurs
# in `x`. With `minlength=d_vocab` the result has exactly one entry per token, even if the
# largest ids never occur. But `bincount` only takes 1-D input, and each row must be counted on
# its own: counting the whole batch at once would penalise row 0 for the tokens of row 1. A
# loop over the rows is clear, and fast enough for the batch sizes of this course; a single
# `bincount` for the whole batch is possible too, if no two rows share a bin (the hints show
# how to arrange that).
#
# Common mistakes: counting over the whole batch; forgetting `minlength` (the counts are then
# shorter than the vocabulary and do not line up with the logits); and modifying `logits` in
# place (`logits -= ...`, or a loop that writes into its rows), which changes the caller's
# tensor too: the tests check that the input is left alone.
#
# The tests compare with the closed form above, computed with Python's `Counter`, for penalties
# 0.5, 2 and −1, on two rows with very different counts, and on two rows with a mask (one
# left-padded, one not); each time your logits, token ids and mask must come back unchanged.
# They also read your function's source: every tensor it makes must say which device it goes
# on, as on a GPU the token ids are there and a tensor made without `device=` is not.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Count, for each row on its own, how often each token id occurs in that row, and subtract
# `freq_penalty` times those counts from the row's logits. The trap: one count over the whole
# batch mixes the rows. To count every row in one call anyway, give each row a range of ids
# of its own, so that no two rows share a bin.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The counts you need are `[batch, d_vocab]`, laid out like the logits: entry `[b, t]` is how
#   often token `t` occurs in row `b`.
# - **A loop**: each row's `bincount` (with `minlength`) is `[d_vocab]`; `torch.stack` turns a
#   list of those into `[batch, d_vocab]`.
# - **One call**: what number must you add to every id of row `b` so that row 0's ids stay in
#   `[0, d_vocab)`, row 1's land in `[d_vocab, 2 d_vocab)`, and so on? Build those offsets as a
#   `[batch, 1]` tensor (on the ids' device) so that they broadcast over each row. How long must
#   the 1-D counts then be, and into what shape do you reshape them so that row `b` holds row
#   `b`'s counts?
# - **The mask** is laid out like the ids. As `weights` (floats, in the same 1-D order as the
#   ids you count), a weight of 0 skips a position and 1 counts it.
# - Subtract into a **new** tensor. With `weights`, `bincount` may return another float dtype
#   than the logits' (float64 for float16 weights): bring the counts to the logits' dtype.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("apply_frequency_penalty")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="apply_frequency_penalty"
# solution: solutions.sampling.apply_frequency_penalty

# %%
check("apply_frequency_penalty")

# %% [markdown]
# A prompt that repeats itself, and what a penalty of 1 does to the model's next guess. The
# `count` column is how often each token already occurs in the prompt: each occurrence costs one
# unit of logit, so a token used three times keeps $e^{-3} \approx 5\%$ of its weight relative
# to the tokens never used.

# %%
repetitive = "QUEEN.\nMy lord, my lord, my lord, my"
rep_ids = torch.tensor([tokenizer.encode(repetitive)])
with torch.inference_mode():
    rep_logits = model(rep_ids)[:, -1]
penalised = apply_frequency_penalty(rep_ids, rep_logits, 1.0)
counts = torch.bincount(rep_ids[0], minlength=cfg.d_vocab).float()
show_top(
    "before and after frequency_penalty=1.0",
    {
        "count": counts,
        "p before": rep_logits.softmax(-1)[0],
        "p after": penalised.softmax(-1)[0],
    },
    by=rep_logits[0],
)

# %% tags=["claim"]
assert counts[rep_logits.argmax()] == 3, "section 4: the favourite is a token used three times"
assert round(math.exp(-3), 2) == 0.05, "section 4: e^-3 is about 5%"

# %% [markdown]
# ## 5. Sampling from the distribution
#
# Now the random draw itself. `torch.multinomial(probs, num_samples=1)` takes a tensor of
# non-negative weights `[batch, d_vocab]` and draws one index per row, index `i` with
# probability proportional to `probs[b, i]`. It returns `[batch, 1]`.
#
# A logit of $-\infty$ becomes a probability of exactly 0 after the softmax, and a token of
# probability 0 is never drawn. Top-k and top-p below rely on this: they remove tokens by
# setting their logits to $-\infty$, and then sample from what is left with this very function.
#
# **Reproducible randomness.** Every sampling function takes an optional `generator`, a
# `torch.Generator`: a random-number stream of its own, seeded once. Passing it on to
# `torch.multinomial(..., generator=generator)` makes a run reproducible (the same seed gives the
# same tokens) without touching PyTorch's global random state, which other code in your program
# may rely on. `TransformerSampler.sample(..., seed=3)` will build one for you.
#
# ### Exercise: `sample_basic`
#
# `sample_basic(logits, generator=None)` returns one token per row, drawn from
# `softmax(logits)` of that row: `[batch]`, int64.
#
# Common mistakes: passing the *logits* to `torch.multinomial` (it needs non-negative weights;
# with negative logits it raises an error, and with positive ones it silently samples from the
# wrong distribution); forgetting the `generator`; returning `[batch, 1]` instead of `[batch]`.
# (`torch.distributions.Categorical(logits=...)` is a fine way to sample too, but its
# `.sample()` cannot take a generator.)
#
# The tests draw 20,000 tokens from a small crafted distribution, with one banned token of logit
# $-\infty$, and compare the counts with the exact probabilities by a chi-square test. A correct
# sampler fails such a test with a probability of $10^{-5}$, which the test states; a sampler
# that gives the likeliest token three percentage points too much fails it almost surely. They
# also check that the same seed gives the same samples and different seeds do not; that
# shifting every logit by +1000 or −1000 changes nothing (softmax does not mind, but `exp`
# overflows to inf or underflows to 0); that a batch of one row gives a tensor of shape `[1]`
# (`squeeze()` without a dimension gives a 0-d tensor); and that the logits you are given are
# left unchanged.
#
# <details><summary>Hint 1: a nudge</summary>
#
# `torch.multinomial` wants non-negative weights, not logits, and returns one more dimension
# than you want. Hand the generator on.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Two steps. First the weights: which function turns `[batch, d_vocab]` logits into
# non-negative numbers of the same shape, over which dimension, with a `-inf` logit becoming
# exactly 0? Then the draw: `torch.multinomial(weights, num_samples, generator=...)` returns
# `num_samples` indices per row, int64, so one sample per row is `[batch, 1]`. Which dimension
# must go to leave `[batch]`, and why must you name it? (Think of a batch of one row.)
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("sample_basic")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="sample_basic"
# solution: solutions.sampling.sample_basic

# %%
check("sample_basic")

# %% [markdown]
# ### Seeing the distribution
#
# Is the sampler right? One sample tells you nothing; many do. We take the model's logits after
# a prompt, draw `N` tokens from them in batched calls (every row of the batch a copy of the
# same logits), and compare how often each token came out with its exact probability.
#
# The batches hold 2,000 rows each rather than all `N` at once: a single batch of 20,000 rows of
# 4,096 logits is 330 MB per copy in float32, and the top-p filter makes several copies. Same
# samples, less memory.

# %%
from utils.plots import plot_sample_frequencies

N = 2_000 if QUICK else 20_000
dist_prompt = "ROMEO.\nI"
with torch.inference_mode():
    dist_logits = model(torch.tensor([tokenizer.encode(dist_prompt)]))[:, -1]  # [1, d_vocab]


def draw(sampler, logits: Tensor, n: int, seed: int = 0, chunk: int = 2_000, **kwargs) -> Tensor:
    """n tokens from one row of logits, by `sampler` on batches of identical rows."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, n, chunk):
        rows = logits.expand(min(chunk, n - start), -1).clone()
        batches.append(sampler(rows, generator=generator, **kwargs))
    return torch.cat(batches)


basic_probs = dist_logits[0].softmax(-1)
samples = draw(sample_basic, dist_logits, N)
title = f"sample_basic after {dist_prompt!r}"
plot_sample_frequencies(samples, basic_probs, title, tokenizer, rank_by=basic_probs)
print(f"probability outside the 15 tokens shown: {1 - basic_probs.topk(15).values.sum():.0%}")

# %% tags=["claim"]
assert round(20_000 * cfg.d_vocab * 4 / 1e6, -1) == 330, "section 5: 330 MB per copy"

# %% [markdown]
# The bars should sit on the dots, give or take the noise of a finite sample: a frequency
# estimated from $N$ draws is off by about $\sqrt{p(1-p)/N}$, one *standard error*, and among
# 15 tokens the largest gap is typically one to three of them. A gap of ten would be a bug.
#
# Note how much of the probability lies *outside* the 15 tokens shown (the cell prints it): the
# tail. At temperature 1 the model draws from it all the time, and the tail is where the model
# is least reliable: each of those tokens is individually unlikely, and many are unlikely for
# good reason. The next two methods cut the tail off.
#
# ## 6. Top-k sampling
#
# **Top-k** sampling keeps the $k$ most likely tokens, sets every other logit to $-\infty$, and
# samples from what is left. The softmax renormalises the survivors automatically: their
# probabilities keep their ratios and now sum to 1. A common value is $k = 50$, the default of
# HF's `generate` when it samples (HF transformers 5.24). $k = 1$
# is greedy search again, except at an exact tie for first place: greedy takes the lowest id,
# while top-k keeps every token tied with the $k$-th (our rule below) and samples among them.
#
# We split it in two: `filter_top_k` does the cutting and returns logits (so you can look at
# and test the kept set), and `sample_top_k` samples from the result.
#
# **Ties.** What if several tokens tie with the $k$-th largest logit? We follow HF's
# `TopKLogitsWarper`, whose rule is "remove every token whose logit is *below* the $k$-th
# largest": tokens tied with the $k$-th are all kept, so a few more than $k$ can survive. And a
# $k$ larger than the vocabulary keeps everything.
#
# ### Exercise: `filter_top_k` and `sample_top_k`
#
# - `filter_top_k(logits, k)`: logits of the same shape, with every logit below the row's
#   $k$-th largest replaced by `-inf` and every other logit unchanged.
# - `sample_top_k(logits, k, generator=None)`: one token per row from the filtered logits.
#
# `logits.topk(k, dim=-1)` returns the `k` largest values of each row, in decreasing order, and
# their indices. `masked_fill(mask, value)` returns a copy with `value` wherever `mask` is true.
#
# Common mistakes: comparing the logits with a threshold of shape `[batch]` (it broadcasts
# against the *last* dimension, the vocabulary, not against the rows: wrong, or a shape error);
# removing the tokens *equal* to the threshold as well (which removes the $k$-th token itself);
# building the result by scattering the top-$k$ *indices* (which breaks ties differently from
# HF); and `topk` with a `k` larger than the vocabulary, which raises an error instead of
# keeping everything.
#
# The tests compare the kept set with `TopKLogitsWarper` on random logits, on logits with ties
# at the $k$-th place, and with $k$ = 45 on 30 tokens; then draw 20,000 samples and test them
# against the renormalised distribution; check that a seeded generator gives the same draws
# twice and another seed different ones, and that a batch of one row gives shape `[1]`; and
# check that your input logits are never changed (`masked_fill_` would change them).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Find each row's $k$-th largest logit and remove every logit strictly *below* it: ties with the
# $k$-th survive. `sample_top_k` needs nothing new.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The values `topk` returns are `[batch, k]`, in decreasing order. Which of the `k` is each
#   row's threshold? To compare it with every logit of its own row, what shape must it have:
#   `[batch]` or `[batch, 1]`? (Indexing with a slice keeps a dimension; with a single integer
#   it drops it.)
# - Which comparison with the threshold marks exactly the tokens to remove, given that the
#   tokens tied with it stay? That boolean mask, `[batch, d_vocab]`, is what `masked_fill`
#   takes; `-inf` as a Python number is `float("-inf")`.
# - What should `k` become when it is larger than the row, so that `topk` does not raise and
#   every token is kept?
# - `sample_top_k` needs nothing new: you have already written both of its steps. Remember the
#   generator.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("filter_top_k")` and `show_solution("sample_top_k")`,
# each in a new cell, print the reference implementations. Read them, then close them and write
# your own.
#
# </details>

# %% tags=["exercise"] exercise="sample_top_k"
# solution: solutions.sampling.filter_top_k
# solution: solutions.sampling.sample_top_k

# %%
check("sample_top_k")

# %% [markdown]
# The same prompt as above, with $k = 5$. The dots now show the *renormalised* distribution:
# the five kept tokens share all the probability, in the same ratios as before. We compute it
# with Hugging Face's `TopKLogitsWarper` rather than with your `filter_top_k`, so that the plot
# does not merely agree with itself.

# %%
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

k = 5
top_k_probs = TopKLogitsWarper(top_k=k)(None, dist_logits.clone())[0].softmax(-1)
samples = draw(sample_top_k, dist_logits, N, k=k)
plot_sample_frequencies(
    samples, top_k_probs, f"sample_top_k, k={k}", tokenizer, rank_by=basic_probs
)

# %% [markdown]
# Top-k has a weakness: $k$ is the same whatever the distribution looks like. When the model
# is sure of the next token, at the end of a line of verse for instance, where a line break is
# all but certain, keeping 40 tokens keeps 39 poor ones; in the middle of a line, where dozens
# of words would do, $k = 5$ cuts off most of them. Top-p adapts the cut to the distribution.
#
# ## 7. Top-p (nucleus) sampling
#
# **Top-p** sampling, also called **nucleus** sampling (Holtzman et al., 2019, *The Curious
# Case of Neural Text Degeneration*), keeps the **smallest set of most likely tokens whose
# probabilities add up to at least $p$**, and samples from that set, renormalised. With
# `top_p=0.9`: when the model is sure, one or two tokens already make 90% and the nucleus is
# tiny; when it is unsure, the nucleus can hold a hundred tokens or more.
#
# Work through an example: four tokens with probabilities 0.5, 0.3, 0.15, 0.05, already sorted.
# The running totals are 0.5, 0.8, 0.95, 1.0.
#
# | `top_p` | tokens kept | why |
# |---|---|---|
# | 0.49 | 1 | 0.5 alone reaches 0.49 |
# | 0.5 | 1 | 0.5 reaches 0.5 exactly: "at least", so that is enough |
# | 0.81 | 3 | 0.5 + 0.3 = 0.8 falls short; the third token brings 0.95 |
# | 0.96 | 4 | 0.95 falls short |
#
# The rule that decides each token on its own: **a token is kept if the tokens *more likely*
# than it add up to less than `top_p`.** In other words, it is kept while the set is still
# short of `top_p` before it joins. The token that takes the total over the line is kept; the
# next one is not. That is the "exclusive" running total: the cumulative sum one place back
# (the total of the tokens before it), 0 for the first token.
#
# Here is the rule on the model's distribution after `"ROMEO.\nI"`: the bars are the 20 most
# likely tokens in order, the line their running total, the dashed line `top_p = 0.9`. Blue
# tokens are kept, grey ones removed; where the line crosses 0.9 inside the figure, the blue
# token under the crossing is the one that takes the total over it, and a dotted line marks the
# cut. After this prompt the model hesitates: the 20 tokens drawn hold well under 0.9, so every
# bar is blue, and the title and the printed line say how many tokens the nucleus holds in all.

# %%
from utils.plots import plot_top_p_cut

plot_top_p_cut(dist_logits[0].softmax(-1), 0.9, tokenizer)

# %% tags=["claim"]
assert dist_logits[0].softmax(-1).topk(20).values.sum() < 0.8, "section 7: 20 tokens, under 0.9"

# %% [markdown]
# **`min_tokens_to_keep`**: never keep fewer than this many tokens, whatever `top_p` says (HF's
# option of the same name; default 1, so that something is always left to sample). With
# `top_p=0` only this many tokens survive.
#
# The plan, for every row at once: running totals only make sense in sorted order, so **sort**
# each row, most likely first, and **decide in sorted order** which tokens go; then **undo the
# sort**, so that each decision lands on the token it was made for, and set the removed logits
# to `-inf`, leaving the rest unchanged. Three tools do the work:
#
# - `logits.sort(dim=-1, descending=True)` returns the sorted values and `order`, the
#   permutation: `order[b, i]` is the original index of row `b`'s `i`-th most likely token.
# - `Tensor.cumsum(dim=-1)` returns the running totals along each row.
# - `Tensor.scatter(dim, index, src)` writes `src[b, i]` to position `index[b, i]` of row `b`
#   (along the last dimension); `Tensor.gather(dim, index)` reads the other way, entry `i` of
#   row `b` from position `index[b, i]`. One of them undoes the sort.
#
# Common mistakes: keeping one token too few, by testing the *inclusive* running total (which
# drops the token that reaches the line); keeping one too many, by keeping a token when the
# mass before it equals `top_p` exactly (the table's row for 0.5 keeps one token, not two), or
# by computing the mass before a token as its running total minus its own probability: on paper
# the same number, in float32 a subtraction that rounds. With probabilities 0.5, 0.3, 0.1, 0.1
# and `top_p = 0.8`, the running total after two tokens is 0.80000001 (the line is reached: the
# 0.1s go), but 0.89999998 - 0.09999999 rounds to 0.79999995, and a 0.1 slips in. Shift the
# running total instead: it is the very number that reached the line. Also: forgetting to undo
# the sort, so that the mask lands on the wrong tokens; and ignoring `min_tokens_to_keep`.
#
# HF's `TopPLogitsWarper` computes the same rule the other way round: it sorts in *increasing*
# order and removes tokens while the running total from the bottom is at most $1 - p$. On paper
# the two rules are the same. In floating point they can disagree about a token that sits
# exactly on the line (is 0.5 + 0.3 at least 0.8? it depends on the rounding), and tokens with
# tied logits may come out of the sort in another order, so on random logits the tests compare
# the kept logit *values*. The exact boundary is tested where rounding cannot blur it: with 2,
# 4 or 8 equally likely tokens every probability is a power of two and every running total is
# exact, and `top_p` is set exactly on one of them (two tokens of 1/2 with `top_p=0.5`: HF
# keeps one). Then the line reached *through* rounding: HF's own test case (0.3, 0.1, 0.1, 0.5
# with `top_p = 0.8`, where HF keeps two tokens) and seven more like it, each checked first
# against the sums done exactly in float64 (a case where HF's float32 sum lands on the other
# side of the line on your CPU is left out, two at most). They also run 40 random cases with
# many spreads, `top_p` values and `min_tokens_to_keep`, plus the cases of the table (with
# 0.49, 0.81 and 0.96), `top_p` of 0 and 1, and a distribution with almost all its mass on one
# token; then 20,000 samples at `top_p` 0.5 and 0.9, and the generator and batch-of-one checks
# of top-k.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Decide in sorted order, then map the decisions back to the original order. A token stays when
# the tokens *more likely* than it add up to less than `top_p`: the exclusive running total, not
# the inclusive one. Never drop the first `min_tokens_to_keep`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Every tensor below is `[batch, d_vocab]`.
#
# 1. Sort, keeping the permutation `order`. The running totals are those of the *probabilities*
#    of the sorted logits, not of the logits themselves.
# 2. The mass before the token in sorted column `i` is the running total at column `i - 1`,
#    and 0 for column 0. How do you build that tensor from the running totals without
#    subtracting anything (see the common mistakes above)? `torch.cat` joins tensors along a
#    dimension, and `torch.zeros_like` makes a column of zeros of the right dtype and device.
# 3. Which comparison of that mass with `top_p` marks the tokens to remove, given the table's
#    row for `top_p=0.5`? Then make sure the first `min_tokens_to_keep` columns of that boolean
#    tensor say "keep".
# 4. The decisions are in sorted order, and `order` says where each came from. Which of
#    `scatter` and `gather` puts the decision of sorted column `i` at original position
#    `order[b, i]`? Try both on one short row whose order you know.
# 5. `masked_fill` with `-inf` where the mapped-back mask says "remove".
#
# `sample_top_p` needs nothing new, as with top-k.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("filter_top_p")` and `show_solution("sample_top_p")`,
# each in a new cell, print the reference implementations. Read them, then close them and write
# your own.
#
# </details>

# %% tags=["exercise"] exercise="sample_top_p"
# solution: solutions.sampling.filter_top_p
# solution: solutions.sampling.sample_top_p

# %%
check("sample_top_p")

# %% [markdown]
# Your filter on the table's example, then the model's distribution with `top_p=0.9` (the dots:
# HF's `TopPLogitsWarper`, renormalised), and how many tokens the nucleus holds at a few values
# of `top_p` for two prompts, one where the model is unsure and one where it is not.
#
# **Predict, then run.** The last table counts the tokens in the nucleus after `"ROMEO.\nI"`,
# where many words could follow, and at the end of a line of Macbeth's, where a line break is
# all but certain. How do you expect each column to grow from `top_p=0.5` to `0.99`?
#
# <details><summary>What to expect</summary>
#
# The example prints 1, 1, 3 and 4 kept tokens, as in the table above. After `"ROMEO.\nI"` the
# favourite has only about 11%: the nucleus holds about 10 tokens at 0.5, over a hundred at 0.9
# and over a thousand at 0.99. At the end of Macbeth's line the line break alone has about 90%:
# the nucleus is that single token up to `top_p=0.9`, then jumps to about 20 tokens at 0.95 and
# a few hundred at 0.99, once it has to cover part of the remaining 10%. A fixed $k$ could not
# serve both prompts; that is the point of top-p.
#
# </details>

# %%
example = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
for top_p in [0.49, 0.5, 0.81, 0.96]:
    kept = torch.isfinite(filter_top_p(example, top_p)).sum().item()
    print(f"top_p={top_p}: keeps {kept} of 4")

top_p = 0.9
top_p_probs = TopPLogitsWarper(top_p=top_p)(None, dist_logits.clone())[0].softmax(-1)
samples = draw(sample_top_p, dist_logits, N, top_p=top_p)
title = f"sample_top_p, top_p={top_p}"
plot_sample_frequencies(samples, top_p_probs, title, tokenizer, rank_by=basic_probs)

sure_prompt = "MACBETH.\nIs this a dagger which I see before me,"
with torch.inference_mode():
    sure_logits = model(torch.tensor([tokenizer.encode(sure_prompt)]))[:, -1]
for name, lg in [(dist_prompt, dist_logits), (sure_prompt, sure_logits)]:
    print(f"{name!r} -> {tokenizer.decode(lg.argmax(-1))!r}", end=" ")
    print(f"with probability {lg.softmax(-1).max().item():.0%}")
table = Table(title="tokens in the nucleus")
table.add_column("top_p", justify="right")
table.add_column(f"after {dist_prompt!r}", justify="right")
table.add_column("at the end of Macbeth's line", justify="right")
nucleus = {}  # top_p -> [size after dist_prompt, size after sure_prompt]
for top_p in [0.5, 0.8, 0.9, 0.95, 0.99]:
    nucleus[top_p] = [
        torch.isfinite(filter_top_p(lg, top_p)).sum().item() for lg in (dist_logits, sure_logits)
    ]
    table.add_row(str(top_p), *[str(size) for size in nucleus[top_p]])
Console().print(table)

# %% tags=["claim"]
assert [1, 1, 3, 4] == [
    torch.isfinite(filter_top_p(example, p)).sum().item() for p in [0.49, 0.5, 0.81, 0.96]
], "section 7's table and 'What to expect': 1, 1, 3 and 4 kept tokens"
assert round(dist_logits.softmax(-1).max().item(), 2) == 0.11, "the favourite after ROMEO: 11%"
assert tokenizer.decode(sure_logits.argmax(-1)) == "\n", "Macbeth's line ends with a line break"
assert round(sure_logits.softmax(-1).max().item(), 1) == 0.9, "the line break has about 90%"
assert 5 <= nucleus[0.5][0] <= 15, "'What to expect': about 10 tokens at 0.5"
assert 100 < nucleus[0.9][0] < 1000 and nucleus[0.99][0] > 1000, "over 100 at 0.9, 1000 at 0.99"
assert nucleus[0.5][1] == nucleus[0.8][1] == nucleus[0.9][1] == 1, "one token up to 0.9"
assert 10 <= nucleus[0.95][1] <= 30, "'What to expect': about 20 tokens at 0.95"
assert 100 <= nucleus[0.99][1] < 1000, "'What to expect': a few hundred at 0.99"
# The float32 numbers of section 7's "Common mistakes" (probabilities 0.5, 0.3, 0.1, 0.1):
assert "0.50000000 0.30000001 0.09999999 0.09999999" == " ".join(
    f"{x:.8f}" for x in torch.tensor([0.5, 0.3, 0.1, 0.1]).log().softmax(-1).tolist()
), "section 7's float32 probabilities"
assert "0.50000000 0.80000001 0.89999998 1.00000000" == " ".join(
    f"{x:.8f}" for x in torch.tensor([0.5, 0.3, 0.1, 0.1]).log().softmax(-1).cumsum(-1).tolist()
), "section 7's float32 running totals"
assert ["0.79999995"] == [  # the third token's running total minus its probability
    f"{(probs.cumsum(-1)[2] - probs[2]).item():.8f}"
    for probs in [torch.tensor([0.5, 0.3, 0.1, 0.1]).log().softmax(-1)]
], "section 7: in float32, 0.89999998 - 0.09999999 rounds to 0.79999995"

# %% [markdown]
# ## 8. Putting the pieces together: `sample_next_token`
#
# Here is the given function that turns one batch of logits into one batch of next tokens,
# with everything above as options. Read it before you go on: the sampling loop you write next
# calls it. The order of the steps is that of HF's `generate`, which applies its penalties
# before the temperature and the temperature before top-k and top-p (`_get_logits_processor` in
# `transformers/generation/utils.py`, HF transformers 5.24):
#
# 1. **The frequency penalty** first, on the raw logits. Order matters. Applied first, the
#    penalty is divided by the temperature like every other logit difference: a penalty of
#    $\alpha$ at temperature $T$ moves a logit by $\alpha/T$ in the end, so it weighs against
#    the model's preferences the same way at every temperature. Applied after the temperature,
#    it would move the logit by $\alpha$ whatever $T$ is: relatively weaker at low temperatures,
#    stronger at high ones.
# 2. **Temperature 0 means greedy**, and stops there: nothing below would change the argmax.
# 3. **The temperature**, then **top-k or top-p**, then the draw. Filtering *after* the
#    temperature means the nucleus is measured on the distribution you actually sample from: at
#    a high temperature the probabilities are flatter, and `top_p=0.9` keeps more tokens.
#
# Top-k and top-p together are refused here to keep the behaviour obvious (HF would apply both,
# top-k first). `top_k=0` or `None` and `top_p=1.0` or `None` switch them off, as in HF.
# Everything is checked first, with an error message that says what is wrong: a typo such as
# `temperature=-1` or `top_p=90` should fail loudly, not produce strange text.

# %% tags=["source"]
# solution: solutions.sampling.check_sampling_args
# solution: solutions.sampling.sample_next_token

# %% [markdown]
# ## 9. The sampling loop
#
# A model call gives the next token's logits; text takes a loop. At each step:
#
# 1. Run the model on the sequence so far and take the logits at the **last** position: they
#    are the guess for the token after it. (The logits at the other positions are guesses for
#    tokens we already have.)
# 2. Choose the next token with `sample_next_token`.
# 3. Append it to the sequence and go again.
#
# Note what this costs: step $t$ runs the model over the *whole* sequence, recomputing what the
# previous step had already computed for every earlier position. That waste is the subject of
# chapter 4. Here, correctness first.
#
# ### Exercise: `TransformerSampler.sample`
#
# `TransformerSampler(model, tokenizer).sample(prompt, max_tokens_generated, ...)` is given
# except for the loop. The code around it already turns the prompt into a 1-D tensor of token
# ids `input_ids` (the prompt may be a string or token ids), moves it to the model's device,
# builds `generator` from `seed`, and finds `eos`, the id of `<|endoftext|>`; after your loop it
# decodes the result (a string in, a string out; token ids in, token ids out). You write two
# pieces:
#
# - **`next_logits(input_ids)`**: one model call, the logits `[1, d_vocab]` for the token after
#   the text so far. The model has `n_ctx` learned positions and refuses longer input: once the
#   text is longer than that, feed it the **most recent** `n_ctx` tokens (`n_ctx` is
#   `self.cfg.n_ctx`). Crop what the model *reads*, never what you *return*: the output keeps
#   every token. The model takes `[batch, posn]`, with a batch of 1 here. Chapter 4's faster
#   sampler replaces this method (with one that keeps a cache) and keeps your loop.
# - **The loop in `sample`**, for at most `max_tokens_generated` steps, each adding one token
#   chosen by the given `self.sample_next_token`, which takes `input_ids [batch, seq]` and
#   `logits [batch, d_vocab]` and returns one token per row, `[batch]`.
# - **Options.** Pass `generator=generator` and every other keyword argument (`**kwargs`:
#   temperature, top_k, top_p, frequency_penalty...) on to `self.sample_next_token`. Give it the
#   **whole** sequence so far, not the cropped window: the penalty counts every token the text
#   has used, including those that have scrolled out of the model's view.
# - **The end of the text.** The model was trained with `<|endoftext|>` between plays, so it
#   can say "the text ends here". If the new token is `eos` and `stop_at_eos` is true, append
#   it and stop.
# - **`verbose`**: print each new token as it comes, `print(text, end="", flush=True)`, so you
#   can watch the text being written. **`progress`**: wrap the range in
#   `tqdm(..., disable=not progress)` for a progress bar.
#
# Common mistakes: feeding only the last token (the model then sees one token of context and
# writes nonsense; remembering the rest is chapter 4's cache); reading the logits at position 0
# instead of -1; cropping the returned sequence instead of the model's input; passing the
# cropped window to the frequency penalty; stopping *before* appending the end-of-text token.
#
# The tests compare your greedy text, token for token, with `GPT2LMHeadModel.generate` of
# Hugging Face on the same weights, for three prompts from the held-out plays; check that a
# string gives a string and the same seed the same text; wrap the model so that its sixth new
# token is `<|endoftext|>` and check that you stop right after it, and that with
# `stop_at_eos=False` you go on to the last token asked for; start 3 tokens short of `n_ctx`
# and compare 8 greedy steps with HF's logits on the last `n_ctx` tokens; and recompute greedy
# runs with a frequency penalty from HF's logits and exact counts, also on a prompt longer than
# `n_ctx` whose first tokens the model no longer reads but the penalty still counts, and with a
# wrapped model that favours a token the prompt lacks (the tokens you generate count too). A
# model whose every step is a fair coin between two tokens checks that each step draws new
# random numbers.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Each step feeds the model the text so far (cropped to what it can read), samples one token,
# appends it, and stops right *after* an end-of-text token when asked to. Crop what the model
# reads, never what you return.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `next_logits` goes from a 1-D `input_ids` of any length to `[1, d_vocab]`. Which slice of
#   a 1-D tensor is its last `n` tokens, and what does it give when the tensor is shorter than
#   `n`? Indexing with `None` adds a dimension of size 1: where must it go to make `[1, posn]`?
#   The model returns `[1, posn, d_vocab]`: which position holds the guess for the next token,
#   and how do you pick it without losing the batch dimension?
# - Each step of the loop needs the next logits, then one token from `self.sample_next_token`.
#   What does that function take as its first argument, the whole text or the window the model
#   reads, and in what shape? What else must it be given so that `seed` and the sampling
#   options reach it?
# - The token comes back as `[1]`, and `input_ids` is 1-D: `torch.cat` joins two 1-D tensors
#   into one. To compare the token with `eos`, an `int`, `.item()` turns a one-element tensor
#   into a Python number.
# - In which order do you append, print and stop, so that an `<|endoftext|>` token ends up in
#   the output? To print a token, decode it with `self.tokenizer`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("TransformerSampler")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% [markdown]
# The given part first: `SamplerBase` holds the model and the tokenizer, checks every argument
# before the first token (`prompt_ids` turns a string or token ids into a checked 1-D tensor),
# and returns the result in the prompt's form. Your `TransformerSampler` inherits all of it.

# %% tags=["source"]
# solution: solutions.sampling.prompt_ids
# solution: solutions.sampling.SamplerBase

# %% tags=["exercise"] exercise="sample"
# solution: solutions.sampling.TransformerSampler

# %%
check("sample")

# %% [markdown]
# Watch it write, with `verbose=True`. Run the cell a few times with other seeds, or none.

# %%
sampler = TransformerSampler(model, tokenizer)
n_tokens = 30 if QUICK else 120
demo_prompt = "ROMEO.\nWhat light"
print(demo_prompt, end="")  # verbose prints only the new tokens
text = sampler.sample(demo_prompt, n_tokens, verbose=True, seed=1, temperature=0.8)

# %% [markdown]
# ### One prompt, many settings
#
# The best way to get a feel for these options is to read what they produce. Below, one prompt
# continued under ten settings, all with the same seed. The column "distinct 3-grams" is a
# crude measure of repetition: the share of the continuation's three-token sequences that
# occur only once. Text that loops scores low; varied text scores close to 100%.
#
# What to look for:
#
# - **Greedy** soon repeats itself: the same line, or the same few words, round and round.
#   Once a loop has started, each repetition makes the next one more likely.
# - **Low temperature** draws mostly the model's favourite tokens, but it still draws at random:
#   one draw other than the favourite and the text leaves greedy's path. **High temperature**
#   draws more and more from the tail, and words, grammar and finally spelling fall apart.
# - **Top-k and top-p** at temperature 1 keep the variety of sampling but avoid the worst draws
#   from the tail. Small `k` or small `top_p` drift back towards greedy.
# - **The frequency penalty** breaks greedy's loops, at the cost of steering away from words
#   the text legitimately needs again (names, "the", the speaker's name before every speech).

# %%
settings = {
    "greedy": dict(temperature=0.0),
    "T = 0.5": dict(temperature=0.5),
    "T = 1.0": dict(temperature=1.0),
    "T = 1.5": dict(temperature=1.5),
    "top-k 5": dict(top_k=5),
    "top-k 40": dict(top_k=40),
    "top-p 0.5": dict(top_p=0.5),
    "top-p 0.9": dict(top_p=0.9),
    "greedy, penalty 1.0": dict(temperature=0.0, frequency_penalty=1.0),
    "top-p 0.9, penalty 0.5": dict(top_p=0.9, frequency_penalty=0.5),
}
table_prompt = "KING HENRY.\nOnce more unto the breach, dear friends, once more;"
n_tokens = 25 if QUICK else 60


def distinct_ngrams(tokens: list[int], n: int = 3) -> float:
    """The share of the n-grams of `tokens` that occur exactly once (1.0: no repeats)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 1.0
    return sum(grams.count(g) == 1 for g in grams) / len(grams)


table_ids = torch.tensor(tokenizer.encode(table_prompt))
table = Table(title=f"{table_prompt!r} + {n_tokens} tokens, seed 0", show_lines=True)
table.add_column("setting")
table.add_column("distinct 3-grams", justify="right")
table.add_column("continuation")
for name, kwargs in settings.items():
    out = sampler.sample(table_ids, n_tokens, seed=0, **kwargs)
    new = out[len(table_ids) :].tolist()
    table.add_row(name, f"{distinct_ngrams(new):.0%}", tokenizer.decode(new))
Console().print(table)

# %% [markdown]
# Rows that share a seed share their random numbers, so they often start alike and part ways
# at the first step where their settings disagree, typically the first draw that one of them
# would take from the tail and the other has cut off.
#
# There is no best row: the right setting depends on what the text is for. Something close to
# greedy suits tasks with one right answer (code, arithmetic, extracting a fact); creative text
# wants variety, and top-p around 0.9, sometimes with a slight penalty, is a common default.
# Try your own prompts and settings: a speaker's name in capitals, a full stop and a line break
# is how most speeches in the training data begin (a few plays, *Hamlet* among them, give a
# short form instead: `Hor.`).
#
# ## 10. Beam search
#
# Greedy search takes the best *token* at each step, but we usually want the best *sequence*,
# and the two differ: a first token of probability 0.4 followed by one of 0.9 (total 0.36)
# beats a first token of 0.5 followed by one of 0.3 (total 0.15), yet greedy takes the 0.5.
# Finding the single most likely sequence of $m$ tokens exactly would mean comparing $V^m$
# sequences, $4096^{10} \approx 10^{36}$ for ten tokens: out of the question.
#
# **Beam search** is the standard compromise. It keeps the `num_beams` best partial sequences
# (the **beams**), each with its score, the sum of its tokens' log-probabilities. At each step:
#
# 1. **Expand**: extend every beam by its most likely next tokens; each extension's score is
#    the beam's score plus the new token's log-probability.
# 2. **Prune**: keep the `num_beams` best of all those candidates, across every beam. A beam
#    whose continuations all score badly dies out; a good beam can take several places.
# 3. **Finish**: a candidate that ends with `<|endoftext|>` is a complete text. It leaves the
#    race and is set aside with its score, and the next best running candidates take its place.
#
# It stops when the best finished sequences can no longer be beaten (more on that below) or
# after `max_new_tokens` tokens, and returns the best finished sequences. With `num_beams=1` it
# is greedy search; larger beams look further for a sequence the greedy path missed.
#
# Three properties of the score to keep in mind:
#
# - A log-probability is never positive, so **a sequence's score can only go down** as it
#   grows. That makes beam search prefer short texts: every extra token costs something.
#   HF's `generate` corrects for this by default with a `length_penalty` that divides each
#   finished sequence's score by a power of its length; we use plain sums, which is HF's
#   `length_penalty=0.0`, and the tests ask HF for exactly that.
# - Beam search is a search for *likely* text, and likely text is often dull or repetitive: it
#   is deterministic, and its output tends to be the safe, common phrase. It shines where there
#   is one right answer (translation, summaries); for open-ended writing, sampling usually reads
#   better. The comparisons at the end of this section show both sides.
# - Being deterministic and greedy-ish, it loops like greedy does. The usual cure is a hard
#   rule that forbids repeating any $n$-gram: your next exercise.
#
# ### Exercise: `banned_ngram_tokens`
#
# `banned_ngram_tokens(tokens, ngram_size, d_vocab)`: for each beam (a row of
# `tokens [beam, seq]`), which next tokens would repeat an $n$-gram that already occurs in the
# row, prompt included? Returns a boolean mask `[beam, d_vocab]` (`banned` is created for you,
# all `False`). This is HF's `no_repeat_ngram_size`.
#
# The rule: with $n$ = `ngram_size`, the next token would complete the $n$-gram made of the
# row's last $n-1$ tokens followed by it. So look at every $n$-gram already in the row; if its
# first $n-1$ tokens equal the row's last $n-1$ tokens, its last token is banned.
#
# An example with $n = 3$ and the sequence `5 8 2 9 5 8`: its 3-grams are `5 8 2`, `8 2 9`,
# `2 9 5`, `9 5 8`. The last two tokens are `5 8`; the 3-gram `5 8 2` starts with them, so
# token `2` is banned. Everything else is allowed. With $n = 1$ the prefix is empty and matches
# every 1-gram: no token in the row may occur again.
#
# It can be done without a Python loop: `tokens.unfold(dimension=1, size=n, step=1)` returns
# every $n$-gram of every row at once, `[beam, seq - n + 1, n]` (and raises an error if the row
# is shorter than $n$).
#
# Common mistakes: a prefix of $n$ tokens instead of $n - 1$; an off-by-one that misses the
# $n$-gram at the very start or at the very end of the row; not handling a row shorter than $n$
# (there is no complete $n$-gram yet, so nothing is banned); a Python loop that mixes up beams.
#
# The tests compare your mask with HF's `NoRepeatNGramLogitsProcessor` for $n$ = 1 to 4 on
# random rows of many lengths over a 6-token vocabulary, where repeats are common, and read your
# source: the mask must be made on the tokens' device.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The next token would complete an $n$-gram whose first $n - 1$ tokens are the row's last
# $n - 1$ tokens. Find every $n$-gram of the row that starts with that prefix, and ban its last
# token. A row shorter than $n$ has no $n$-gram yet and bans nothing.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The $n$-grams from `unfold` are `[beam, n_ngrams, n]`. Which part of each $n$-gram is
#   compared with the prefix, and which part is the token that may get banned?
# - The prefix is the last $n - 1$ tokens of each row, `[beam, n - 1]`. Careful with $n = 1$:
#   a slice that starts at `-(n - 1)` starts at `-0`, which is 0, and takes the **whole** row
#   instead of nothing. Where does the prefix start, counted from the front of a row of
#   length `seq`?
# - To compare every $n$-gram of a row with that row's prefix, where must the prefix gain a
#   dimension of size 1 to broadcast against the $n$-grams? An $n$-gram matches when *all* its
#   compared tokens are equal (`Tensor.all` over one dimension): the matches are a boolean
#   `[beam, n_ngrams]`.
# - `nonzero(as_tuple=True)` returns one index tensor per dimension: here the beam and the
#   $n$-gram of every match. With those two you can read each match's last token out of the
#   $n$-grams, and then set `banned` at all the (beam, token) pairs in one assignment: indexing
#   a 2-D tensor with two index tensors of the same length picks one element per pair.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("banned_ngram_tokens")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="no_repeat_ngram"
# solution: solutions.beams.banned_ngram_tokens

# %%
check("no_repeat_ngram")

# %% [markdown]
# The example above, and a second row, with $n$ = 1, 2 and 3:

# %%
toy = torch.tensor([[5, 8, 2, 9, 5, 8], [1, 1, 1, 3, 1, 1]])
for n in [1, 2, 3]:
    banned = banned_ngram_tokens(toy, n, d_vocab=10)
    print(f"n={n}:", [row.nonzero().flatten().tolist() for row in banned])

# %% [markdown]
# ### Exercise: `Beams`
#
# `Beams` holds a set of beams of equal length: `tokens [beam, seq]` and their scores,
# `logprob_sums [beam]`, along with the model and tokenizer. Indexing it, `beams[indices]`,
# gives the `Beams` picked by a tensor of indices. The given `BeamsBase` it inherits from (the
# cell below) adds `len(beams)`, `to_list()` (score and tokens of each beam) and `print`, which
# shows them as a table. Write its two steps:
#
# **`generate(k, no_repeat_ngram_size=None)`**: every beam's `k` most likely one-token
# continuations, as a new `Beams` of `k * len(self)` beams. `generate` itself is given: it runs
# the model on every beam at once (the beams are already a batch), reading at most the last
# `n_ctx` tokens, and hands the logits of the last position to **`top_continuations`**, which
# you write. (Keeping the model call apart lets chapter 4 swap in a cached one.)
#
# - Turn them into **log-probabilities**, computed in float32. Scores add log-probs; adding raw
#   logits would add a different constant for every step and beam (section 1), and the scores
#   would mean nothing.
# - With `no_repeat_ngram_size`, set the log-probs of banned tokens to `-inf` *after* the
#   softmax, as HF does: the other tokens keep their log-probabilities, nothing is renormalised.
# - Each beam's `k` best tokens become `k` new beams. A new beam's score is its parent's score
#   plus the new token's log-prob; its tokens are its parent's followed by the new token.
# - **Order**: beam 0's `k` continuations first (best first), then beam 1's, and so on: the
#   parents in the order 0, 0, ..., 1, 1, ..., not 0, 1, ..., 0, 1, ....
#
# **`filter(num_beams)`**: rank all the beams by score, best first, and split them.
#
# - `continuing`: the best `num_beams` beams that do **not** end in `<|endoftext|>`, in order.
# - `finished`: the beams that **do** end in it, but only those ranked among the best
#   `num_beams` of *all* the beams. An ended sequence that is not even as good as the
#   `num_beams` best candidates of this step is dropped. (That is HF's rule, and the tests
#   compare with HF token for token, so we follow it exactly.)
#
# An example with `num_beams=3`, scores and last tokens (0 is the end of text):
# `-0.5 (9), -0.75 (11), -1.0 (EOS), -2.0 (8), -2.5 (EOS), -3.0 (7)`. `continuing` is the beams
# at -0.5, -0.75 and -2.0: the EOS beam at -1.0 left the race and the next best took its place.
# `finished` is the beam at -1.0 only: the EOS beam at -2.5 ranks fifth, outside the top 3.
#
# Common mistakes: probabilities instead of log-probabilities; forgetting the parent's score;
# cycling through the parents (0, 1, 0, 1, ...) instead of giving each its `k` children in a
# row; ranking worst first (a sort in increasing order, the default of `sort` and `argsort`);
# taking the top `num_beams` *first* and then dropping the EOS beams from them, which leaves
# fewer than `num_beams` running.
#
# The tests run `generate` on three beams with `k=4`, with and without a 2-gram ban, and
# compare the tokens and scores with log-softmax of HF's logits (and HF's n-gram processor);
# and check `filter` on the example above with one more EOS beam, at -4.0; `generate` and
# `filter` must leave the beams they are called on unchanged.
#
# <details><summary>Hint 1: a nudge</summary>
#
# `top_continuations`: scores add log-probabilities, so convert to them first, ban after
# that, take each row's best $k$, and lay out beam 0's children first. `filter`: rank *all*
# the beams once, then split; do not take the best `num_beams` first and drop the EOS beams from
# them.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# **`top_continuations`**
#
# - `Tensor.log_softmax(dim)` gives the log-probabilities, `[beam, d_vocab]`; `Tensor.float()`
#   converts to float32. Your `banned_ngram_tokens` returns a mask of the same shape, and
#   `masked_fill` returns a copy with `-inf` where it is true.
# - `topk(k, dim=-1)` gives values and indices, both `[beam, k]`: entry `[b, j]` is beam `b`'s
#   `j`-th best child. What shape must the parents' scores `[beam]` take to be added to every
#   child of their own row? Flattening a `[beam, k]` tensor reads it row by row: beam 0's `k`
#   children first, exactly the order asked for, `[beam * k]`.
# - The new tokens are `[beam * k, seq + 1]`: row `b * k + j` is parent `b`'s tokens followed by
#   its `j`-th best token. Two tensor methods repeat rows, `repeat` and `repeat_interleave`: try
#   both on a tensor of two rows to see which gives the order 0, 0, 1, 1. The new tokens are one
#   more column, `[beam * k, 1]`, joined to the repeated rows with `torch.cat` along the
#   sequence dimension.
#
# **`filter`**
#
# - `argsort` ranks the scores; it sorts in increasing order unless told otherwise. Pass
#   `stable=True` too: two candidates with equal scores then keep their current order, the
#   tie-break the tests expect.
# - For every ranked beam, two yes-or-no questions: does it end in `eos`, and is its rank below
#   `num_beams`? Each is a boolean tensor as long as the ranking. Indexing the ranking with a
#   boolean mask keeps the chosen beams in rank order.
# - Continuing and finished are then each one such selection of the ranking: which of the two
#   questions does each need, and which one still needs cutting to `num_beams`? `self[indices]`
#   turns a tensor of indices into a `Beams`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("top_continuations")` and `show_solution("Beams")`,
# each in a new cell, print the reference implementations. Read them, then close them and write
# your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.beams.BeamsBase

# %% tags=["exercise"] exercise="beams"
# solution: solutions.beams.top_continuations
# solution: solutions.beams.Beams

# %%
check("beams")

# %% [markdown]
# Two steps of beam search by hand: start from the prompt as a single beam of score 0, expand it
# into its 4 best continuations, expand each of those into 4 more, and keep the best 3.

# %%
start_ids = torch.tensor([tokenizer.encode("ROMEO.\nWhat light")])
beams = Beams(model, tokenizer, torch.zeros(1), start_ids)
first = beams.generate(4)
first.print("after one step: 4 candidates")
second = first.generate(4)
continuing, finished = second.filter(3)
print(f"the second step made {len(second)} candidates; {len(finished)} of the best 3 finished")
continuing.print("after two steps: the 3 best of 16 candidates")

# %% [markdown]
# ### Exercise: `beam_search`
#
# `beam_search(model, tokenizer, prompt, num_return_sequences, num_beams, max_new_tokens,
# no_repeat_ngram_size=None, early_stopping=False, verbose=False)` returns the
# `num_return_sequences` best sequences as `(score, tokens)` pairs, best first: `tokens` holds
# the prompt and the continuation, `score` the sum of the continuation's log-probabilities. The
# argument checks and the start are given (`start_beam_search`, in the cell before yours):
# `beams` is the prompt as one beam of score 0, and `finished` an empty list of
# `(score, tokens)` pairs. Write the loop, one step per new token:
#
# 1. **Expand**: every running beam offers its `num_beams + 1` best continuations (under the
#    $n$-gram ban, if one is asked for), not `num_beams`. Why one more? At most one of a beam's
#    continuations can be `<|endoftext|>` (it is one token), so `num_beams + 1` continuations
#    always include at least `num_beams` that keep running. With only `num_beams`, a beam whose
#    top continuations include EOS would offer one running candidate too few, and that missing
#    candidate could have been among the best. (HF does the same thing differently: it takes the
#    best `2 * num_beams` candidates over all beams together.)
# 2. **Prune**: the best `num_beams` running candidates become the new `beams`, and the ended
#    ones among the best `num_beams` candidates finish: the split your `filter` makes.
# 3. **Collect**: after every step, `finished` holds the best `num_beams` finished sequences
#    found so far, as `(score, tokens)` pairs, best first.
# 4. With `verbose`, show the running beams after every step with their `print` method, one
#    table per step, with a title that names the step (the tree after the walk-through below
#    is drawn from these tables).
# 5. **Stop?** Only once `num_beams` sequences have finished, and then by one of two rules,
#    HF's settings `True` and `False` of `early_stopping`:
#    - `early_stopping=True`: stop right away.
#    - `early_stopping=False`: stop once the best running beam cannot beat the worst of the
#      finished sequences, that is once its score is `<=` the worst finished score. Since
#      scores only go down, a running beam that is already behind can never catch up, so this
#      rule gives up nothing.
#
#    HF accepts a third setting, `early_stopping="never"`, which you need not write: in
#    transformers 5.24.0 (`_check_early_stop_heuristic` in `generation/utils.py`) it differs
#    from `False` only under a positive length penalty, so with `length_penalty=0.0` it stops
#    exactly where `False` does.
#
# If the loop runs out of tokens without stopping, the beams still running are complete too:
# they compete with the finished sequences for the `num_beams` places. (A `for ... else:` block
# runs exactly when the loop was not left by `break`.) The given last line returns the best
# `num_return_sequences`.
#
# Common mistakes: expanding with `num_beams` continuations; stopping as soon as *one* sequence
# finishes; forgetting the running beams at the end; keeping more than `num_beams` finished
# sequences (a worse one would then be the "worst finished" in the stopping rule, and you would
# stop too early); comparing with the *best* finished score instead of the worst.
#
# The tests compare your sequences and scores with `GPT2LMHeadModel.generate(num_beams=...,
# length_penalty=0.0)` on four configurations of beams, returned sequences and n-gram bans; and,
# since our model rarely ends a text within a dozen tokens, on a crafted model whose logits make
# `<|endoftext|>` common, with `early_stopping=True` and with `False`, so that every stopping
# rule is exercised, including a table where five sequences finish within three steps with four
# beams, so HF stops with the best four. When your output differs, the message shows where the
# first differing sequence departs from HF's, both lists with their scores, and the likely
# mistake; where your output is exactly HF's under a known mistake (the other `early_stopping`,
# one token too few, no n-gram ban), it says so.
#
# <details><summary>Hint 1: a nudge</summary>
#
# One step is: expand (`num_beams + 1` per beam), prune, collect the finished, maybe stop. Stop
# only once `num_beams` sequences have finished. If the loop runs out of tokens instead, the
# beams still running compete with the finished ones.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Your `Beams` already does steps 1 and 2: which method expands, with which `k` (and which
#   other argument), and which one prunes, with which number? What does the pruning return?
# - `finished` is a plain Python list of `(score, tokens)` pairs, and `to_list()` turns `Beams`
#   into such pairs. Python's `sorted` takes a `key` function: what do you sort the pairs by,
#   and in which direction? A slice then keeps the best `num_beams`. In a list sorted best
#   first, where is the worst finished score?
# - The best running score is the largest of `beams.logprob_sums`; `.item()` makes it a Python
#   number to compare with the scores in `finished`.
# - The stop test has two parts: have `num_beams` sequences finished, *and* does the rule of
#   the `early_stopping` setting say stop? Leave the loop with `break`.
# - A `for ... else:` block runs only when the loop ended without `break`: the place to let the
#   running beams join `finished`, kept to the best `num_beams` exactly as in step 3.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("beam_search")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% [markdown]
# The given start, `start_beam_search`, checks every argument and returns the prompt as one beam:

# %% tags=["source"]
# solution: solutions.beams.start_beam_search

# %% tags=["exercise"] exercise="beam_search"
# solution: solutions.beams.beam_search

# %%
check("beam_search")

# %% [markdown]
# ### A walk through beam search
#
# With `verbose=True`, `beam_search` shows the running beams after every step. Watch how the
# beams change places: a beam that led after one step can fall behind, and two beams can share
# their first tokens and split later.

# %%
walk_prompt = "ROMEO.\nWhat light"
Beams.printed.clear()  # every table `print` shows is also kept here
walk = beam_search(
    model, tokenizer, walk_prompt, 3, num_beams=3, max_new_tokens=4 if QUICK else 8, verbose=True
)
for score, tokens in walk:
    print(f"{score:8.3f}  {tokenizer.decode(tokens)!r}")

# %% [markdown]
# The same run as a tree, drawn from the tables your `beam_search` printed: one column per
# step, the best beam at the top, an edge from each beam to the beam it grew from. A beam with
# no edge to the next column was pruned there.

# %%
from utils.plots import beam_tree_steps, plot_beam_tree

plot_beam_tree(beam_tree_steps(Beams.printed, tokenizer), f"beam search after {walk_prompt!r}")

# %% [markdown]
# ### Greedy search against beam search
#
# Does the wider search find more likely text? Below, the same prompt continued greedily and by
# beam search with 3 and 8 beams, each with its score, the sum of the log-probabilities of its
# new tokens. We recompute every score from scratch, with one forward pass over the finished
# text: `log_softmax` at each position, the log-probability of the token that actually came
# next, summed over the continuation. That is section 1's formula, and it should give the
# score that beam search reported.
#
# Beam search with a single beam takes the best token each time, like greedy search: its
# output should equal greedy's, which is a good check that your two implementations agree.


# %%
@torch.inference_mode()
def continuation_logprob(tokens: Tensor, n_prompt: int) -> float:
    """The sum of log p(token | everything before it) over tokens[n_prompt:]."""
    logprobs = model(tokens[None])[0].log_softmax(dim=-1)  # [seq, d_vocab]
    # The logits at position t predict token t + 1.
    picked = logprobs[:-1].gather(-1, tokens[1:, None])[:, 0]
    return picked[n_prompt - 1 :].sum().item()


compare_prompt = "KING HENRY.\nOnce more unto the breach, dear friends, once more;"
compare_ids = torch.tensor(tokenizer.encode(compare_prompt))
n_new = 15 if QUICK else 40
greedy_tokens = sampler.sample(compare_ids, n_new, temperature=0.0)
rows = [("greedy", None, greedy_tokens)]
for num_beams in [1, 3] if QUICK else [1, 3, 8]:
    score, tokens = beam_search(model, tokenizer, compare_prompt, 1, num_beams, n_new)[0]
    rows.append((f"{num_beams} beam{'s' * (num_beams > 1)}", score, tokens))

table = Table(title=f"{compare_prompt!r} + up to {n_new} tokens", show_lines=True)
for column in ["method", "beam score", "recomputed", "continuation"]:
    table.add_column(column, justify="left" if column in ("method", "continuation") else "right")
for name, score, tokens in rows:
    recomputed = continuation_logprob(tokens, len(compare_ids))
    shown = "" if score is None else f"{score:.2f}"
    table.add_row(name, shown, f"{recomputed:.2f}", tokenizer.decode(tokens[len(compare_ids) :]))
Console().print(table)
print("1 beam == greedy:", rows[1][2].tolist() == greedy_tokens.tolist())

# %% tags=["claim"]
assert rows[1][2].tolist() == greedy_tokens.tolist(), "section 10: one beam gives greedy's text"
assert all(
    abs(score - continuation_logprob(tokens, len(compare_ids))) < 2e-3
    for _, score, tokens in rows[1:]
), "section 10: the recomputed scores are beam search's"

# %% [markdown]
# A wider beam usually finds a higher score (scores are negative: closer to 0 is more likely),
# but it is not guaranteed to: it keeps more candidates, yet it can still drop a path that a
# narrower search happened to follow. Whether the more likely text is *better* text is another
# matter. Read the continuations: the likeliest text a small model knows is often its safest
# phrase, said again and again.
#
# ### Repetition, and `no_repeat_ngram_size`
#
# Beam search hunts for likely text, and few things are as likely as words the model has just
# read. Here are longer beam searches, for two prompts, with and without a ban on repeated
# 3-grams. The "distinct 3-grams" column is the one from the sampling table; "tokens" counts
# the new tokens, which is less than the maximum when the text ended with `<|endoftext|>`.

# %%
n_new = 20 if QUICK else 60
table = Table(title=f"5 beams, up to {n_new} new tokens", show_lines=True)
for column in ["prompt", "no_repeat_ngram_size", "score", "tokens", "distinct 3-grams"]:
    table.add_column(column, justify="left" if column == "prompt" else "right")
table.add_column("continuation")
for rep_prompt in ["ROMEO.\nWhat light", "FIRST CITIZEN.\nWe are accounted poor citizens,"]:
    n_prompt = len(tokenizer.encode(rep_prompt))
    for ngram in [None, 3]:
        score, tokens = beam_search(
            model, tokenizer, rep_prompt, 1, 5, n_new, no_repeat_ngram_size=ngram
        )[0]
        new = tokens[n_prompt:].tolist()
        table.add_row(
            repr(rep_prompt),
            str(ngram),
            f"{score:.2f}",
            str(len(new)),
            f"{distinct_ngrams(new):.0%}",
            tokenizer.decode(new),
        )
Console().print(table)

# %% [markdown]
# Where both searches write the same number of tokens, the ban costs log-probability (it
# forbids some of the likeliest continuations) and buys variety. Where a search ends early
# with `<|endoftext|>` (watch the "tokens" column), compare the scores with care: a shorter
# text has fewer tokens to pay for, so its score is not comparable with that of a full-length
# one: that is the length bias from the start of this section. The ban can also change
# *which* endings are kept at all: an ended sequence only counts if it ranks among the
# `num_beams` best candidates of its step, and banning some of its rivals can let it in. Once
# in, its short, high score can beat every long text written after it.
#
# The ban is also a blunt tool: it also forbids repeats that the text needs. A speaker's heading
# (a line break, the name, a full stop, a line break) is several tokens long, so once a
# character has spoken, the ban forbids announcing them again in the same way; the same goes
# for any phrase the prompt already used, names included. The ban suits short outputs (a
# summary, a title) better than long ones.
#
# ## 11. How we know it is right
#
# Every test of this chapter compares your code with something independent of it:
#
# - **Exact formulas** for the deterministic pieces: `greedy_search` against an argmax written
#   in plain Python, `apply_temperature` against `logits / T`, `apply_frequency_penalty`
#   against counts from Python's `Counter`.
# - **Hugging Face's logits processors**, the small classes that `generate` chains together
#   to implement these same options: `TopKLogitsWarper` and `TopPLogitsWarper` decide which
#   tokens your `filter_top_k` and `filter_top_p` must keep, and `NoRepeatNGramLogitsProcessor`
#   which tokens `banned_ngram_tokens` must ban.
# - **Hugging Face's `GPT2LMHeadModel.generate`** on the same weights (the shipped model is
#   saved in HF's GPT-2 format, so HF loads it as it is): greedy generation token for token,
#   and beam search sequence for sequence and score for score, with `length_penalty=0.0`.
# - **Exact probabilities** for everything random: 20,000 samples, compared with the exact
#   distribution by a chi-square test with a stated false-failure probability of $10^{-5}$ per
#   comparison, under a fixed seed. A sampler that is slightly wrong (a temperature off by 20%,
#   a nucleus with one token too many) fails; a correct one passes for any seed, with that
#   small probability of bad luck.
#
# You can make the same comparisons here. The cell below loads the model a second time, as
# HF's `GPT2LMHeadModel`, and checks your greedy generation, your top-k and top-p filters on
# the model's own logits, and your beam search against it.

# %%
# The HF ground truths the graded tests use: greedy `generate`, the tokens a warper keeps, and
# beam search with its sequences cut after <|endoftext|> as yours are.
from utils.hf_oracles import hf_beam_search, hf_greedy, hf_kept
from utils.models import load_hf

hf_model, _ = load_hf("shakespeare")
n_new = 10 if QUICK else 30

ours = sampler.sample(compare_ids, n_new, temperature=0.0)
print("greedy generation equals HF's:", ours.tolist() == hf_greedy(hf_model, compare_ids, n_new))

for k in [1, 5, 40]:
    kept = torch.isfinite(filter_top_k(dist_logits, k))
    same = torch.equal(kept, hf_kept(TopKLogitsWarper(top_k=k), dist_logits))
    print(f"top-k {k}: same tokens kept as TopKLogitsWarper: {same}")
for top_p in [0.5, 0.9, 0.99]:
    kept = torch.isfinite(filter_top_p(dist_logits, top_p))
    same = torch.equal(kept, hf_kept(TopPLogitsWarper(top_p=top_p), dist_logits))
    print(f"top-p {top_p}: same tokens kept as TopPLogitsWarper: {same}")

num_beams = 4
ours = beam_search(model, tokenizer, compare_prompt, num_beams, num_beams, n_new)
theirs = hf_beam_search(hf_model, compare_ids, num_beams, num_beams, n_new)
table = Table(title=f"beam search, {num_beams} beams: yours and HF's")
for column in ["rank", "your score", "HF score", "same tokens"]:
    table.add_column(column, justify="right")
for rank, ((score, tokens), (hf_score, hf_tokens)) in enumerate(zip(ours, theirs, strict=True)):
    same = str(tokens.tolist() == hf_tokens.tolist())
    table.add_row(str(rank), f"{score:.4f}", f"{hf_score:.4f}", same)
Console().print(table)

# %% tags=["claim"]
assert all(
    t.tolist() == hf_t.tolist() and abs(s - hf_s) < 2e-3
    for (s, t), (hf_s, hf_t) in zip(ours, theirs, strict=True)
), "section 11: the beam search is HF's, sequence for sequence and score for score"
assert sampler.sample(compare_ids, n_new, temperature=0.0).tolist() == hf_greedy(
    hf_model, compare_ids, n_new
), "section 11: the greedy generation is HF's"

# %% [markdown]
# ## Check your understanding
#
# - Adding 10 to every logit of a row changes nothing that this chapter computes. Multiplying
#   every logit by 2 changes something: what, and which earlier setting does it amount to?
#
# <details><summary>Answer</summary>
#
# Multiplying by 2 doubles every difference between logits, so every probability is squared and
# renormalised: the distribution gets sharper. That is exactly temperature $T = 0.5$, since
# $2z = z / 0.5$. The order of the tokens is unchanged, so greedy search and the top-$k$ set are
# the same, but the sampled probabilities, the top-p nucleus and beam search's log-probabilities
# all change.
#
# </details>
#
# - At temperature 0.5, how much more likely than token B is a token A that was three times as
#   likely at temperature 1? At temperature 3?
#
# <details><summary>Answer</summary>
#
# Temperature raises each probability to the power $1/T$ before renormalising, and the ratio
# with it: at $T = 0.5$ the ratio is $3^2 = 9$; at $T = 3$ it is $3^{1/3} \approx 1.44$.
#
# </details>
#
# - Why is `temperature=0` a special case in code, when the formula is continuous as $T \to 0$?
#   What does sampling at $T \to 0$ do when two tokens tie for the largest logit?
#
# <details><summary>Answer</summary>
#
# The limit exists, but the formula cannot be evaluated at $T = 0$: dividing by zero gives
# $\pm\infty$ or `nan` (for a logit of 0), and the softmax of such a row is `nan`. So the code
# reads 0 as "greedy" and never divides. At a tie, the limit distribution puts probability 1/2
# on each of the two tokens: sampling at a tiny $T$ picks either at random, whereas greedy
# search (our `temperature=0`) always takes the lower id. The limit and the special case differ
# only at exact ties.
#
# </details>
#
# - Top-k with $k=1$, top-p with `top_p=0`, temperature 0: which of these are the same as
#   greedy search?
#
# <details><summary>Answer</summary>
#
# Temperature 0 *is* greedy search in our sampler. `top_p=0` removes every token whose "mass
# before" is $\ge 0$, that is all of them, and then `min_tokens_to_keep=1` puts back the first
# token in sorted order: one token, the argmax, so greedy too, except that at an exact tie it is
# whichever tied token `sort` puts first, not necessarily the lowest id. Top-k with $k = 1$
# keeps every token tied with the largest logit and samples among them: greedy unless there is
# an exact tie for first place, where it draws at random.
#
# </details>
#
# - With probabilities 0.4, 0.3, 0.2, 0.1 (sorted), how many tokens does `top_p=0.65` keep?
#   And `top_p=0.75`? Which token does `min_tokens_to_keep=3` add at `top_p=0.65`?
#
# <details><summary>Answer</summary>
#
# The masses before each token are 0, 0.4, 0.7 and 0.9, and a token is kept while that mass is
# below `top_p`. At 0.65: the first two (0 and 0.4 are below 0.65; 0.7 is not), which together
# hold 0.7. At 0.75: three (0.7 < 0.75), holding 0.9. With `min_tokens_to_keep=3` at 0.65 the
# third token, of probability 0.2, is kept as well.
#
# </details>
#
# - Our frequency penalty counts every token of the sequence, also those that have scrolled out
#   of the model's `n_ctx`-token window. What would change if it counted only the window?
#
# <details><summary>Answer</summary>
#
# A token's count would fall as its earlier occurrences scroll out of view, so the penalty would
# forget: once a phrase had left the last `n_ctx` tokens, the text could repeat it freely. In a
# text shorter than `n_ctx` nothing changes; in a long one the penalty only stops repetition
# within the window. Counting the whole text penalises what the *text* has used, which is the
# point of the option.
#
# </details>
#
# - Why does beam search add log-probabilities rather than multiply probabilities? Why does its
#   score favour short texts, and how does HF's `length_penalty` push back?
#
# <details><summary>Answer</summary>
#
# A product of many probabilities underflows: 500 tokens of probability 0.1 multiply to
# $10^{-500}$, which is 0 in float32, so every long sequence would score 0 and could not be
# ranked. The log is increasing, so sums of log-probs rank sequences the same way, with ordinary
# numbers. Every token adds a log-probability $\le 0$, so a longer text can only score lower,
# and a text that ends early stops paying. HF divides a finished sequence's score by its number
# of new tokens to the power `length_penalty` (default 1.0: the mean log-prob per token), which
# lifts long texts; we use 0.0, the plain sum.
#
# </details>
#
# - Why does `beam_search` ask each beam for `num_beams + 1` continuations? Construct a case
#   where `num_beams` would lose the best sequence.
#
# <details><summary>Answer</summary>
#
# At most one of a beam's continuations is `<|endoftext|>`, so `num_beams + 1` continuations
# always include at least `num_beams` that keep running, enough to fill every place even if all
# the best candidates come from one beam. A case: `num_beams=2`, first step (one beam, the
# prompt), whose best two tokens are `<|endoftext|>` and "the", the third "my". With 2
# continuations only "the" keeps running, and the search goes on with one beam instead of two;
# if the best text starts with "my", it is lost. With 3, "the" and "my" both run.
#
# </details>
#
# - With `early_stopping=False`, why is it safe to stop as soon as the best running score is no
#   better than the worst finished one?
#
# <details><summary>Answer</summary>
#
# Scores only go down: every extension adds a log-probability $\le 0$. So every sequence that a
# running beam could still become scores at most the best running score, which is already no
# better than the worst of the `num_beams` finished sequences. None of them could enter the set
# of the `num_beams` best, so stopping gives up nothing. (The argument needs plain sums: with a
# length penalty, a longer text can score higher, and HF's `early_stopping=False` then
# estimates the best reachable score with a heuristic, which its own docstring says may be
# wrong.)
#
# </details>
#
# - A statistical test with 100 samples, or one without a fixed seed: what is wrong with each?
#
# <details><summary>Answer</summary>
#
# With 100 samples the test has no power: a frequency near 0.3 is only known to about
# $\sqrt{0.3 \times 0.7 / 100} \approx 0.046$, so a sampler that is off by a few percentage
# points (a temperature off by 20%, a nucleus one token too large) passes easily. Without a
# fixed seed the test is flaky: a correct implementation fails at random with the test's
# false-failure probability, and a failure cannot be reproduced to debug it. A fixed seed makes
# the outcome the same on every run.
#
# </details>
#
# - Generating 100 tokens after a 50-token prompt, how many token positions does your sampling
#   loop push through the model in total? How many are new at each step?
#
# <details><summary>Answer</summary>
#
# Step $t$ (from 0 to 99) runs the model on $50 + t$ tokens, all within `n_ctx` = 256, so the
# total is $50 + 51 + \dots + 149 = 9{,}950$ positions. Only one of them is new at each step,
# the token appended at the previous step (at the first step, the whole prompt is new). With a
# cache, the same text needs a prefill of 50 positions and 99 single ones: 149.
#
# </details>

# %% tags=["claim"]
assert 0.4 * 0.9 > 0.5 * 0.3 and round(0.4 * 0.9, 2) == 0.36, "section 10: 0.36 beats 0.15"
assert round(10 * math.log10(4096)) == 36, "section 10: 4096^10 is about 10^36"
assert round(3 ** (1 / 3), 2) == 1.44, "check your understanding: 3^(1/3) is about 1.44"
assert round(math.sqrt(0.3 * 0.7 / 100), 3) == 0.046, "check your understanding: about 0.046"
assert sum(range(50, 150)) == 9950, "check your understanding: 9,950 positions"

# %% [markdown]
# ## What's next
#
# The last question is chapter 4's starting point. Your loop runs the model over the whole
# sequence at every step, so generating $m$ tokens costs on the order of $m^2$ positions of
# computation, although each step only adds one new position. In **chapter 4** you store the
# keys and values that attention computed for earlier positions, a **KV cache**, so that each
# step processes one token; then you generate for many prompts at once, which is where the
# batched functions of this chapter pay off, and you measure the speed against HF's `generate`.
#
# ## Sources
#
# - Top-p sampling: A. Holtzman, J. Buys, L. Du, M. Forbes, Y. Choi, *The Curious Case of Neural
#   Text Degeneration*, 2019, arXiv:1904.09751 (ICLR 2020).
# - Hugging Face `transformers` 5.24.0 (the version this course installs):
#   `transformers/generation/logits_process.py` for `TemperatureLogitsWarper` (the
#   `temperature=0.0` error), `RepetitionPenaltyLogitsProcessor`, `TopKLogitsWarper`,
#   `TopPLogitsWarper` and `NoRepeatNGramLogitsProcessor`; `transformers/generation/utils.py`
#   for the order of the processors (`_get_logits_processor`) and beam search (`_beam_search`:
#   processors applied to the log-softmax, `2 * num_beams` candidates per step with one
#   end-of-text id, the `length_penalty` division); `GenerationConfig` for the defaults
#   (`top_k=50`, `length_penalty=1.0`, `early_stopping=False`).
# - OpenAI's frequency and presence penalties: the "parameter details" of the OpenAI API
#   documentation (`https://platform.openai.com/docs/api-reference/parameter-details`, the page
#   vLLM's code cites), where the count is how often the token "was sampled prior to the current
#   position".
# - vLLM (`vllm-project/vllm`, main branch): `apply_penalties` in
#   `vllm/model_executor/layers/utils.py` at commit `00358600ed52` (`logits -=
#   frequency_penalties * output_bin_counts`; the prompt's tokens feed only the repetition
#   penalty), and `SamplingParams` in `vllm/sampling_params.py` at commit `00388f6573cc`
#   (frequency penalty: "based on their frequency in the generated text so far"; temperature:
#   "Zero means greedy sampling"). The penalties came in with pull request #95 (May 2023),
#   "following the definition in OpenAI API reference".
