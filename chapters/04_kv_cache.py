# %% [markdown]
# # Chapter 4 — The KV cache and batched generation
#
# Chapter 3's sampling loop runs the model over the whole text at every step. To write token
# 101 it reads 100 tokens; to write token 102 it reads 101, and 100 of them are the same as a
# step ago. The results for those 100 positions are the same too: in a causal transformer, no
# position looks at a later one, so nothing a position computed changes when the text grows.
# The loop throws that work away and does it again, every step.
#
# In this chapter you keep it. At every layer, attention needs the **keys** and **values** of
# all earlier positions, and that is all a new position needs from the past. Store them, a
# **KV cache**, and each step only has to push one token through the model. Then you use the
# same machinery to generate for many prompts at once, in one forward pass per step.
#
# What you write:
#
# - `causal_mask`: chapter 1's causal mask, for queries that come after a cache;
# - `attention_with_cache`: attention for the new positions only, reading the cached keys and
#   values;
# - `forward_with_cache`: the whole model on the new tokens, returning their logits and a
#   longer cache;
# - `CachedTransformerSampler.next_logits`: chapter 3's sampler with a cache, and what to do
#   when the text outgrows the model's context window;
# - `CachedBeams.generate`: chapter 3's beam search with a cache that follows the beams;
# - `left_pad`, `positions_and_allowed` and `generate_batch_tokens`: many prompts of different
#   lengths, padded, and generated together.
#
# Some pieces are **given**, each in a cell of its own: `KeyValueCache`, the container that
# holds the cached tensors; `start_forward`, which checks `forward_with_cache`'s arguments; and
# `generate_batch`, the wrapper around your batched loop. Some exercise cells hold given code
# around your part too, such as `CachedTransformerSampler.sample`. At the end you time the cached
# sampler and batched generation against chapter 3's uncached loop; a benchmark script
# (section 9) also compares them with Hugging Face's `generate`.
#
# As before, nothing is checked against the course's own code alone: your attention against
# the activations of the transformer-lens reference model, your forward pass against HF's
# `GPT2LMHeadModel` and against the uncached model in float64, your samplers against HF's
# `generate` and chapter 3's uncached sampler, your padding against HF's tokenizer.
#
# **Time:** about 3–5 hours. **You need:** chapter 1's attention (queries, keys, values, the
# causal mask, the `[batch, posn, ...]` shapes) and chapter 3's `TransformerSampler` and beam
# search. Both are imported from `solutions`, so your own versions need not work.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it, which runs
# the graded tests for that exercise on what your notebook defines *right now*. From a
# terminal, `pytest -m forward_with_cache` and `course grade 4` grade your saved notebook;
# `show_solution("causal_mask")` prints the reference when you are truly stuck (try for a while
# with hints 1 and 2 first); `course reset 04` gives you a fresh notebook and keeps a backup
# of yours.
#
# The exercises build on each other: `forward_with_cache` calls your `attention_with_cache`,
# which uses your `causal_mask`'s convention, and the samplers call your `forward_with_cache`
# (which calls your `positions_and_allowed` for padded batches, from section 8 on).
# Do them in order.
#
# Run the setup cell below first.

# %% tags=["setup"]
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions import Attention, Config, DemoTransformer, TransformerSampler, checks
from solutions.beams import Beams, beam_search, top_continuations
from solutions.sampling import check_sampling_args, sample_next_token
from utils.check import check
from utils.display import show_solution

# %% [markdown]
# The course's own tests (`make test`, which CI runs) execute this notebook from top to bottom
# with `COURSE_QUICK=1`: the demos and timings then generate only a few tokens, so that the run
# stays short on a small machine. On your machine `QUICK` is `False`. You never need to change
# it.

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)

# %% [markdown]
# ## The model
#
# The same model as in chapter 3: the course's shipped Shakespeare model, 4 layers, a residual
# stream of 192, 6 heads of 32 dimensions, a context window of `n_ctx = 256` tokens and a
# vocabulary of 4,096 tokens.

# %%
from utils.models import load_model

# "mine" samples from the model you trained and saved in chapter 2 instead (the numbers quoted
# in the text are the shipped model's).
MODEL = "shakespeare"
model, tokenizer = load_model(MODEL)
cfg = model.cfg
print(f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads of d_head {cfg.d_head}")
print(f"n_ctx {cfg.n_ctx}, d_vocab {cfg.d_vocab}")

# %% tags=["claim"]
shape = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_ctx, cfg.d_vocab)
assert shape == (4, 192, 6, 32, 256, 4096), "'The model' quotes the shipped model's shape"

# %% [markdown]
# ## 1. What a step recomputes, and what to keep
#
# A causal transformer computes, at every position, a function of that position's token and
# the tokens **before** it, never after. So when the text grows by one token, everything
# already computed for the earlier positions stays exactly as it was. Let's check: run the
# model on a text, then on the same text with one more token, and compare the logits at the
# positions they share.

# %%
text_ids = torch.tensor([tokenizer.encode("ROMEO.\nBut soft, what light through yonder window")])
with torch.inference_mode():
    shorter = model(text_ids[:, :-1])  # [1, n - 1, d_vocab]
    longer = model(text_ids)  # [1, n, d_vocab]
change = (longer[:, :-1] - shorter).abs().max().item()
print(f"{shorter.shape[1]} positions, then {longer.shape[1]}")
print(f"largest change of the logits at the first {shorter.shape[1]} positions: {change:.1e}")

# %% tags=["claim"]
assert change < 1e-4, "section 1 says the shared positions' logits change by rounding only"

# %% [markdown]
# The difference is zero, or a rounding error in the last digits of a float32 (matrix products
# of differently shaped inputs may add up their terms in a different order), nothing more.
#
# ### Design it first
#
# Before reading on, design the cache yourself: take five minutes and a sheet of paper. You
# know the model from chapter 1; the rest of this section and the next give the course's
# answers, and the details blocks give them in short.
#
# 1. A new position at step $t$: what does it need from the positions before it, layer by
#    layer? What can you store so that nothing is computed twice? Why not its queries?
# 2. In which layout would you store it, per layer? Think of the matrix product that reads
#    it.
# 3. Beam search (chapter 3) keeps $k$ beams. At each step it may continue one beam twice and
#    drop another. What must happen to the cache?
# 4. A batch of prompts of different lengths is padded so the rows line up. What must the
#    cache remember besides the tensors of question 1?
# 5. Should a step write into the cache, or return a new one?
#
# <details><summary>Answers</summary>
#
# 1. Positions meet only in attention, and there a new query reads the earlier positions'
#    **keys** and **values** at every layer: store those, one pair per layer. A query is read
#    only by its own position, once, so there is nothing to keep.
# 2. One tensor per layer for keys and one for values, `[batch, n_heads, pos, d_head]`: with
#    the heads before the positions, every head's scores are one batched `q @ k.T` over the
#    leading `[batch, n_heads]`, the layout `F.scaled_dot_product_attention` and HF use.
# 3. It follows the beams: row $i$ of the new cache is the row of the beam that beam $i$
#    continues, picked by an index tensor, repeats included (`cache[rows]` in section 2).
# 4. Which positions are padding (a mask `[batch, pos]`), so later steps keep hiding them and
#    count positions from each row's first real token; and the token ids, for checks and for
#    reading the texts back.
# 5. Either works. The course returns a new cache and leaves the old one valid: beams may
#    share one, and going back costs nothing. The price is a copy per step; HF's
#    `StaticCache` instead writes in place into a buffer of `max_cache_len` positions, which
#    `generate` sizes from the generation's `max_length` (section 2 gives the source).
#
# </details>
#
# ### What to keep
#
# Chapter 3's loop only ever uses the logits at the **last** position. What does the last
# position need from the others? Inside a block, layer norm, the MLP and the residual additions
# work on each position on its own. The one place where positions meet is attention, and there
# a position reads the others only through their **keys** (to decide how much to attend) and
# their **values** (what it reads). So the state to keep is, for every layer, the keys and
# values of every earlier position:
#
# ```
# step t: the text is x_0 ... x_t, and we want the logits at position t
#
#             the cache, from earlier steps                    new at this step
#             positions 0 ... t-1                              position t
#            +---------------------------------------------+    +---------------+
#   block 3  | K: k_0 k_1 ... k_t-1   V: v_0 v_1 ... v_t-1 | <- | q_t  k_t  v_t |
#   block 2  | K: k_0 k_1 ... k_t-1   V: v_0 v_1 ... v_t-1 | <- | q_t  k_t  v_t |
#   block 1  | K: k_0 k_1 ... k_t-1   V: v_0 v_1 ... v_t-1 | <- | q_t  k_t  v_t |
#   block 0  | K: k_0 k_1 ... k_t-1   V: v_0 v_1 ... v_t-1 | <- | q_t  k_t  v_t |
#            +---------------------------------------------+    +---------------+
#                                                               embed(x_t) + W_pos[t]
# ```
#
# At each block, the new position computes its own query, key and value. Its query is compared
# with the keys of positions 0 to t (the cached ones and its own), and it reads their values.
# Then its key and value join the cache, for the steps to come. Everything else (layer norms,
# MLPs, the unembedding) runs on position t alone.
#
# **Why not cache the queries?** A query is used once: by its own position, at the step that
# computed that position. Later positions use their own queries. Nobody reads an old query
# again, so there is nothing to gain by keeping it.
#
# **Why not cache more?** The residual stream, the MLP activations and the attention outputs
# of earlier positions are never read by a later position: attention reads only keys and
# values. (You could cache each layer's input instead, half the size, and recompute keys and
# values from it; but that means two matrix products per cached position per step, the very
# work the cache exists to avoid.)
#
# ### What it costs in memory
#
# For one sequence, the cache holds a key and a value vector per layer, per head and per
# position:
#
# $$\text{bytes} = 2 \times n_\text{layers} \times n_\text{heads} \times d_\text{head} \times
#   \text{positions} \times \text{bytes per number}.$$
#
# A batch of $B$ sequences needs $B$ times that. Here it is for our model and for GPT-2 small
# (`Config()`'s defaults are GPT-2 small's: 12 layers, 12 heads of 64, `n_ctx` 1024), in
# float32 (4 bytes a number), next to the size of the weights.


# %%
def cache_bytes(cfg: Config, positions: int, bytes_per_number: int = 4) -> int:
    """Memory of the keys and values of one sequence: every layer, every head, every position."""
    return 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * positions * bytes_per_number


gpt2_small = Config()  # the defaults: GPT-2 small, 124M parameters
table = Table(title="KV cache size, float32, one sequence")
for column in ["model", "per token", "at n_ctx", "batch of 8 at n_ctx", "the weights"]:
    table.add_column(column, justify="left" if column == "model" else "right")
n_params = sum(p.numel() for p in model.parameters())
for name, c, params in [("shakespeare", cfg, n_params), ("GPT-2 small", gpt2_small, 124e6)]:
    table.add_row(
        f"{name} (n_ctx {c.n_ctx})",
        f"{cache_bytes(c, 1) / 2**10:.0f} KiB",
        f"{cache_bytes(c, c.n_ctx) / 2**20:.1f} MiB",
        f"{8 * cache_bytes(c, c.n_ctx) / 2**20:.0f} MiB",
        f"{params * 4 / 2**20:.0f} MiB",
    )
Console().print(table)

# %% tags=["claim"]
assert cache_bytes(gpt2_small, gpt2_small.n_ctx) == 72 * 2**20, "the prose says 72 MiB"
assert 8 * cache_bytes(gpt2_small, gpt2_small.n_ctx) > 124e6 * 4, "batch of 8 > the weights"
assert round(n_params * 4 / 2**20) == 13, "section 9 says the weights are 13 MiB"
assert cache_bytes(gpt2_small, 1024, 2) == 36 * 2**20, "check your understanding: 36 MiB"

# %% [markdown]
# For our small model the cache is tiny. For GPT-2 small a full context costs 72 MiB per
# sequence, and a batch of 8 long texts already needs more memory for the cache than for the
# weights. For large models with long contexts, the cache, not the weights, is what limits the
# batch size. That is why newer models share keys and values between heads (multi-query and
# grouped-query attention), and why serving systems store the cache in 16 or even 8 bits and
# allocate it in pages (vLLM's PagedAttention); the further reading at the end gives sources.
#
# ### What it saves in computation
#
# Count the floating-point operations of one step, at position $t$ (the text has $t + 1$
# tokens). Per token and per layer, the four attention projections and the MLP cost about
# $2 \times (4 d_\text{model}^2 + 2 d_\text{model} d_\text{mlp})$ operations, and the
# unembedding $2 d_\text{model} d_\text{vocab}$. Attention itself costs about
# $4 \, n_\text{heads} d_\text{head}$ per (query, key) pair: a dot product for the score and a
# weighted sum of the value.
#
# - **Without a cache**, the step runs all $t + 1$ positions through every layer (cost
#   $\propto t$) and attention over all $(t+1)(t+2)/2$ causal pairs (cost $\propto t^2$).
#   Writing $m$ tokens costs $\propto m^2$ in the layers and $\propto m^3$ in attention.
# - **With a cache**, the step runs one position through every layer (cost independent of $t$)
#   and attention of one query over $t + 1$ keys (cost $\propto t$). Writing $m$ tokens costs
#   $\propto m$ in the layers and $\propto m^2$ in attention.


# %% tags=["source"]
# solution: solutions.step_cost.step_flops

# %%
table = Table(title="floating-point operations of one step, shakespeare model")
for column in ["position t", "without cache", "with cache", "ratio"]:
    table.add_column(column, justify="right")
for t in [0, 15, 63, 255]:
    full, cached = step_flops(cfg, t, cached=False), step_flops(cfg, t, cached=True)
    table.add_row(str(t), f"{full / 1e6:,.1f} M", f"{cached / 1e6:,.1f} M", f"{full / cached:.0f}x")
Console().print(table)

# %% tags=["claim"]
assert round(step_flops(cfg, 255, False) / step_flops(cfg, 255, True), -1) == 240, "about 240"
assert round(step_flops(cfg, 255, False) / 1e9, 1) == 1.4, "sections 9, 10: 1.4 billion"
assert round(step_flops(cfg, 255, True) / 1e6) == 6, "section 9: about 6 million"

# %% [markdown]
# At the end of the context, a cached step does about 240 times less arithmetic. Keep that
# number in mind: the measured speed-up at the end of this chapter is much smaller, and the
# reason why says a lot about where the time of a small model actually goes.
#
# ## 2. The cache: `KeyValueCache` (given)
#
# `KeyValueCache` is a small, immutable container. Read it before you go on: every exercise
# below takes one, returns one, or both.
#
# - `keys` and `values`: tuples with one tensor per layer, each
#   `[batch, n_heads, pos, d_head]`.
# - `tokens` `[batch, pos]`: the token ids of the cached positions.
# - `mask` `[batch, pos]`: `False` where a row holds **padding** rather than a real token. You
#   need it from section 8 on, for batches of prompts of different lengths; for one prompt it is
#   all `True`.
# - `cfg`: the config of the model that made it.
# - `KeyValueCache.new_empty(cfg, batch)`: a cache of length 0. `.batch` and `.length` are the
#   number of sequences and of cached positions.
# - `cache[rows]`: the cache of some of the sequences, picked by an index tensor. Beam search
#   uses it to make the cache follow the beams it keeps.
# - `keep_only(mask)`: the cache with some of each row's last positions turned into padding,
#   compacted. Chapter 6 uses it to forget the guesses its main model rejected; not needed here.
# - `check_next(cfg, tokens)`: raises a `ValueError` with a clear message when `tokens` cannot
#   be the next tokens of these sequences. `forward_with_cache` calls it first. It catches a
#   cache made for a model of another shape (layers, heads, `d_head`, `n_ctx`), a batch of the
#   wrong size, a text that would grow past `n_ctx`, and the most common slip of all: feeding
#   the whole text again instead of only the new tokens.
#
# **The layout, heads first.** Chapter 1's attention worked with `[batch, posn, n_heads,
# d_head]`. The cache puts the heads before the positions: `[batch, n_heads, pos, d_head]`.
# That way each head's keys are one `[pos, d_head]` matrix, and the scores of every head of
# every sequence are one batched matrix product, `q @ k.transpose(-2, -1)`, over the leading
# `[batch, n_heads]` dimensions. It is the layout PyTorch's `F.scaled_dot_product_attention`
# expects and the one HF's caches use.
#
# **Immutable.** The dataclass is frozen: nothing changes a cache in place. A forward pass
# returns a new, longer cache and leaves the old one valid. That makes beam search simple (many
# beams can share one cache) and going back free (keep the old cache). The price is a copy:
# each step concatenates the new keys and values onto the old ones, which copies the whole
# cache. That costs about as much memory traffic as attention, which reads the whole cache
# anyway, so for us it is fine. HF does both (transformers 5.24, `cache_utils.py`): its default
# cache, `DynamicCache`, also concatenates (`torch.cat` in `DynamicLayer.update`), while its
# `StaticCache` preallocates `[batch, n_heads, max_cache_len, d_head]` tensors and writes the
# new positions into them in place (`index_copy_` in `StaticLayer.update`). When `generate`
# makes a static cache it sets `max_cache_len` to the generation's `max_length` minus one
# (`generation/utils.py`): the last token generated is never fed back.

# %% tags=["source"]
# solution: solutions.kv_cache.KeyValueCache

# %% [markdown]
# An empty cache for two sequences, and what indexing does with it:

# %%
empty = KeyValueCache.new_empty(cfg, batch=2)
print("batch", empty.batch, "length", empty.length)
print("keys per layer:", len(empty.keys), "each", tuple(empty.keys[0].shape))
print("rows [1, 1, 0]:", tuple(empty[torch.tensor([1, 1, 0])].keys[0].shape))

# %% [markdown]
# ## 3. The causal mask, after a cache
#
# In chapter 1, attention ran on a whole sequence at once: $n$ queries and $n$ keys, query $i$
# and key $i$ at the same position $i$. The mask hid every key above the diagonal,
# `torch.triu(ones, diagonal=1)`.
#
# With a cache, the queries are only the **new** positions, and the keys are all positions,
# cached and new. With 5 keys and 3 queries, the queries sit at positions 2, 3 and 4: the last
# three. Query $i$ (counting the queries from 0) sits at position $\text{offset} + i$, with
# $\text{offset} = n_\text{key} - n_\text{query}$, the number of cached positions, and may see
# keys $0, \dots, \text{offset} + i$. The mask (`x`: hidden) is chapter 1's mask, shifted to the
# right by the offset:
#
# ```
#                        key:  0  1  2  3  4
#   query 0 (position 2)       .  .  .  x  x
#   query 1 (position 3)       .  .  .  .  x
#   query 2 (position 4)       .  .  .  .  .
# ```
#
# Two cases you will meet all the time: with no cache (offset 0), this is chapter 1's mask;
# with one new token (one query, at the last position), nothing is hidden at all.
#
# ### Exercise: `causal_mask`
#
# `causal_mask(n_query, n_key, device=None)` returns a bool tensor `[n_query, n_key]`, `True`
# where the key comes **after** the query (where attention must not look), with the queries
# being the last `n_query` of the `n_key` positions.
#
# Common mistakes: chapter 1's mask as it was, which forgets the offset (every new query then
# sees almost none of the cache); a diagonal one column off, which either hides each query's
# own key or lets it see the key after its own; returning `True` where attention is
# *allowed*. This course's `causal_mask` marks what is hidden, like chapter 1's; PyTorch's
# attention function wants the opposite (section 4 takes care of that).
#
# The tests compare your mask with the definition, written out position by position (key
# position $>$ query position), for shapes with and without a cache, one query and many.
#
# <details><summary>Hint 1: a nudge</summary>
#
# It is chapter 1's mask moved to the right by the number of cached positions: query $i$ sits at
# position $\text{offset} + i$ and may see every key up to and including that position.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# The keys are the cached positions, then the queries: the two sizes give the offset.
# `torch.triu(ones, diagonal=d)` keeps `True` where column $\ge$ row $+ d$; which $d$ hides
# exactly the keys after position $\text{offset} + i$ in row $i$? Check your answer on the
# picture: 3 queries and 5 keys must hide keys 3 and 4 in row 0 and nothing in row 2. Create
# `ones` as a bool tensor `[n_query, n_key]` on `device`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("causal_mask")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="causal_mask"
# solution: solutions.cached_model.causal_mask

# %%
check("causal_mask")

# %%
from utils.plots import plot_masks

print("3 queries after 2 cached positions:\n", causal_mask(3, 5).int())
print("one new token after 4 cached positions:\n", causal_mask(1, 5).int())
plot_masks(
    {
        "no cache: 4 queries, 4 keys": causal_mask(4, 4),
        "3 queries after 2 cached": causal_mask(3, 5),
        "1 query after 4 cached": causal_mask(1, 5),
    },
    "Your causal_mask: dark where a query may not look",
)

# %% [markdown]
# ## 4. Attention with a cache
#
# Now chapter 1's attention, for the new positions only. `attention_with_cache(attn, x,
# past_keys, past_values, allowed)` takes
#
# - `attn`: one of the model's `Attention` modules, whose weights you read: `attn.W_Q`,
#   `attn.W_K`, `attn.W_V` `[n_heads, d_model, d_head]`, `attn.W_O` `[n_heads, d_head, d_model]`,
#   the biases `attn.b_Q`, `attn.b_K`, `attn.b_V` `[n_heads, d_head]` and `attn.b_O` `[d_model]`;
# - `x` `[batch, new, d_model]`: the new positions' residual stream, already layer-normed (the
#   input of chapter 1's `Attention.forward`);
# - `past_keys`, `past_values` `[batch, n_heads, past, d_head]`: this layer's cache (`past` may
#   be 0);
# - `allowed`: which keys each query may read, `True` where it may, or `None` for all of them.
#
# It returns the attention output for the new positions, `[batch, new, d_model]`, and this
# layer's keys and values for **all** positions, past and new, `[batch, n_heads, past + new,
# d_head]`: the caller stores them in the next cache.
#
# The steps:
#
# 1. **Project** the new positions to queries, keys and values, straight into the heads-first
#    layout `[batch, n_heads, new, d_head]`. Mind the cost. The shortest way gives `x` a head
#    axis of size 1, `[batch, 1, new, d_model]`, and lets `@` broadcast it against `W_Q`
#    `[n_heads, d_model, d_head]`. It is right, but for a batch PyTorch materialises the
#    broadcast weights, one copy of `W_Q` per sequence. Making every position of every
#    sequence a row of one matrix, `[batch * new, d_model]`, avoids the copies: `@ W_Q` then
#    broadcasts those rows to every head. Either way passes the tests; the solution takes the
#    second (section 9 times a batch).
# 2. **Append** the new keys and values to the cached ones, along the position axis. The old
#    positions cost nothing here: they are read, not recomputed.
# 3. **Attend**: `F.scaled_dot_product_attention` takes the queries, keys and values
#    heads-first and a boolean mask, its `attn_mask` argument, and computes
#    $\operatorname{softmax}\left(q k^T / \sqrt{d_\text{head}}\right) v$ for every head, with a
#    score of $-\infty$ wherever the mask is `False`. That is chapter 1's attention (scores,
#    mask, softmax, weighted sum of the values) in one call, with the same
#    $1/\sqrt{d_\text{head}}$ scale; on a GPU it may pick a fused kernel (FlashAttention-2 or
#    memory-efficient attention, says PyTorch's documentation of the function). Its output is
#    `z` `[batch, n_heads, new, d_head]`. Note the convention: for PyTorch, a boolean mask is
#    `True` where attention is **allowed**, the opposite of `causal_mask`.
# 4. **Project out**: each head writes through its own `W_O` `[n_heads, d_head, d_model]` and
#    the heads' outputs add up: the output sums over both the heads and `d_head`, as chapter
#    1's attention did, and then adds `b_O`. (A batched `@` followed by a sum over the heads
#    gives the same numbers, with the same weight copies as above.)
#
# Common mistakes: forgetting a bias, or adding `b_Q` without the extra axis (it then lines
# up its heads with the positions: an error, or, when they happen to be as many, a silent
# mistake); concatenating along the wrong dimension; returning only the new keys and values;
# passing `causal_mask(...)` itself as `attn_mask`, which allows exactly what should be
# hidden; and `is_causal=True` in `F.scaled_dot_product_attention`: with fewer queries than
# keys PyTorch aligns that mask to the **top left** (the function's documentation builds it as
# `torch.ones(L, S).tril()`), so one new query sees only key 0.
#
# The tests take the reference model's activations on a prompt (transformer-lens's
# `ln1.hook_out`, `attn.hook_k`, `attn.hook_v` and `hook_attn_out`), split the prompt into
# cached and new positions, and compare your keys, values and output with the reference's, for
# one new position after 0, 20 and 27 cached ones and for six new positions at once. A batch of
# two different rows (three new positions after five cached ones, every axis a different length)
# is compared with the same attention written out by hand: at batch 1 a reshape that should have
# been a transpose gives the right numbers by luck.
#
# <details><summary>Hint 1: a nudge</summary>
#
# It is chapter 1's attention with two changes: the new keys and values are appended to the
# cached ones *before* attending, and everything is heads-first,
# `[batch, n_heads, pos, d_head]`. For PyTorch's attention, a boolean mask is `True` where
# attention is **allowed**.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# 1. `Tensor.flatten` merges neighbouring axes into one and `Tensor.unflatten` splits one
#    back. Merged batch and positions make `[batch * new, d_model]`; times `W_Q`, that is
#    `[n_heads, batch * new, d_head]`. The bias is `[n_heads, d_head]`: which size-1 axis must
#    it gain so that its heads line up with the heads, not with the rows? Split the rows back
#    into batch and positions, then swap two axes to reach `[batch, n_heads, new, d_head]`. The
#    same for k and v: a small helper function saves writing it three times.
# 2. `torch.cat` the past and the new: which of the four axes of
#    `[batch, n_heads, pos, d_head]` grows? The result is
#    `[batch, n_heads, past + new, d_head]`.
# 3. `allowed` goes to `F.scaled_dot_product_attention` as it is (`None` masks nothing); z
#    comes back `[batch, n_heads, new, d_head]`.
# 4. z is `[batch, n_heads, new, d_head]` and `W_O` is `[n_heads, d_head, d_model]`: which axes
#    survive, and which are summed over? `torch.einsum`, or `einops.einsum` as in chapter 1,
#    writes that with one name per axis. Add `b_O`: `[batch, new, d_model]`. Return it with
#    the full keys and values.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("attention_with_cache")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="attention_with_cache"
# solution: solutions.cached_model.attention_with_cache

# %%
check("attention_with_cache")

# %% [markdown]
# With an empty cache and the causal mask, your function is chapter 1's attention; with the
# first 5 positions cached, the other positions come out the same (up to float32 rounding).

# %%
attn, ln1 = model.blocks[0].attn, model.blocks[0].ln1
with torch.inference_mode():
    x = ln1(model.embed(text_ids) + model.pos_embed(text_ids))  # block 0's attention input
    n = x.shape[1]
    expected = attn(x)  # chapter 1's attention, all positions at once
    no_past = torch.empty(1, cfg.n_heads, 0, cfg.d_head)
    whole, keys, values = attention_with_cache(attn, x, no_past, no_past, ~causal_mask(n, n))
    rest, _, _ = attention_with_cache(
        attn, x[:, 5:], keys[:, :, :5], values[:, :, :5], ~causal_mask(n - 5, n)
    )
print("empty cache, whole prompt:", (whole - expected).abs().max().item())
print("5 positions cached, the rest:", (rest - expected[:, 5:]).abs().max().item())

# %% tags=["claim"]
assert (whole - expected).abs().max() < 1e-5 and (rest - expected[:, 5:]).abs().max() < 1e-5

# %% [markdown]
# ## 5. The forward pass with a cache
#
# `forward_with_cache(model, tokens, cache=None, attention_mask=None)` runs the whole model on
# the **new** tokens `[batch, new]`, given the cache of everything before them, and returns
# the new tokens' logits `[batch, new, d_vocab]` and the longer cache. With `cache=None` it
# starts from an empty cache, and the logits are those of `model(tokens)`.
#
# `new` may be anything from 1 to what fits in `n_ctx`. Three uses:
#
# - **Prefill**: the whole prompt at once, `cache=None`. One forward pass, like chapter 3's
#   first step.
# - **Decoding**: one token, the one just sampled. The usual step.
# - **Chunks** of several tokens after a cache: chapter 6's speculative decoding checks
#   several guessed tokens in one pass this way.
#
# It reads the weights of the model's chapter-1 modules, `model.embed`, `model.pos_embed.W_pos`
# `[n_ctx, d_model]`, `model.blocks[i]` (with `.ln1`, `.attn`, `.ln2`, `.mlp`), `model.ln_final`
# and `model.unembed`, and does what `DemoTransformer.forward` does, with three changes.
#
# **1. Positions.** Chapter 1 gave the positions $0, 1, \dots$ to the tokens it was given. Here
# the new tokens come after `cache.length` cached ones: their positions are `cache.length`,
# `cache.length + 1`, and so on. Their embeddings are those rows of `model.pos_embed.W_pos`,
# picked by indexing it with a tensor of the positions; `model.pos_embed(tokens)` would give
# positions from 0.
#
# **2. The mask, built once.** All layers use the same `allowed`, so build it once, before the
# loop: `True` where one of the `new` queries may read one of the `all = cache.length + new`
# keys, the causal rule of section 3 (whose `causal_mask` marks the opposite). With one new
# token, pass `allowed = None`: the new token may read every key, and the attention function
# skips masking altogether. That is the usual decoding step, so it is worth the special case.
#
# **3. The loop keeps the keys and values.** Each block does what chapter 1's block does,
# except that its attention is your `attention_with_cache`, given the block's layer-normed
# input (its `ln1`), this layer's cached keys and values, and `allowed`. Collect the keys and
# values it returns, one tensor per layer, in order, in two lists named `keys` and `values`.
# After the blocks, the final layer norm and the unembedding give `logits`. The given code
# after your part builds the new cache from `keys`, `values` and the token ids, and returns it
# with `logits`.
#
# The function has two slots. The first computes `positions` and `allowed` (changes 1 and 2);
# the second runs the model (change 3). The given `start_forward` (in the cell before yours,
# beside `explicit_layout`, which checks the positions and mask that chapter 6's lookahead
# decoding passes) checks every argument and returns the cache to extend (an empty one for
# `cache=None`) and `mask` `[batch, all]`, `True` at every real token, cached or new. It is
# all `True` here. A batch of prompts of different lengths has padding, where it is `False`;
# the given branch hands that case to `positions_and_allowed`, an exercise of section 8, where
# batching needs it. Until then it stays unimplemented, and the tests of this section use no
# padding.
#
# Common mistakes: positions from 0 at every step (the first new token is still right, since it
# comes from the prefill, whose positions do start at 0, but greedy text from the shipped model
# goes wrong within a few tokens and soon loops: see "Check your understanding"); giving
# `attention_with_cache` the raw residual stream instead of the block's layer norm of it;
# feeding the MLP the residual stream from before the attention was added; no mask for a chunk
# of several new tokens (a prefill then reads the future); a mask per layer instead of one.
#
# The tests compare your logits with the uncached model in float64 (a copy of the model in
# double precision, where a correct cache's rounding errors lie many orders of magnitude below
# the bound of $10^{-5}$) for a prefill followed by single steps and for chunks of mixed sizes,
# and with HF's `GPT2LMHeadModel` for a prefill of 10 tokens and single steps.
#
# <details><summary>Hint 1: a nudge</summary>
#
# It is `DemoTransformer.forward` with three changes: positions start after the cache, one
# `allowed` mask is built before the loop, and each block's attention goes through
# `attention_with_cache`, whose keys and values you collect.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - **Positions** `[new]`: the integers from `cache.length` to `all - 1` (the given lines
#   call `new` and `all` `n_new` and `n_all`). `torch.arange` takes a start, an end (not
#   included) and a `device` (the tokens'). Indexing `W_pos`
#   `[n_ctx, d_model]` with them gives `[new, d_model]`; the token embeddings are
#   `[batch, new, d_model]`. What does broadcasting do when you add the two?
# - **Mask**: `None` for one new token; otherwise `[new, all]`, built from section 3's
#   `causal_mask` on the tokens' device. It marks what is hidden: what turns it into what is
#   allowed?
# - **Blocks**: `zip` walks `model.blocks`, `cache.keys` and `cache.values` side by side, one
#   layer at a time. In chapter 1's block, which residual stream does the MLP's layer norm
#   read: the one from before the attention output was added, or after?
# - **Logits**: `[batch, new, d_vocab]`, from the residual stream after the last block.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("forward_with_cache")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.cached_model.start_forward
# solution: solutions.cached_model.explicit_layout

# %% tags=["exercise"] exercise="forward_with_cache"
# solution: solutions.cached_model.forward_with_cache

# %%
check("forward_with_cache")

# %% [markdown]
# Watch the cache grow: prefill a prompt, then feed three tokens one at a time (the greedy
# choice each time), and compare each step's logits with the uncached model on the whole text.

# %%
with torch.inference_mode():
    ids = torch.tensor([tokenizer.encode("JULIET.\nO Romeo, Romeo, wherefore art thou")])
    logits, cache = forward_with_cache(model, ids)
    print(f"prefill: cache.length {cache.length}, keys[0] {tuple(cache.keys[0].shape)}")
    for _ in range(3):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [1, 1]
        ids = torch.cat([ids, next_token], dim=1)
        logits, cache = forward_with_cache(model, next_token, cache)
        gap = (logits[:, -1] - model(ids)[:, -1]).abs().max().item()
        print(
            f"+ {tokenizer.decode(next_token[0])!r:10} cache.length {cache.length}, "
            f"keys[0] {tuple(cache.keys[0].shape)}, largest gap to uncached {gap:.1e}"
        )

# %% [markdown]
# And the mistakes the cache catches, each with its message. The first is the classic one:
# the loop has just sampled a token, and feeds the whole text, as chapter 3's loop did,
# instead of only that token.

# %%
next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
whole_text = torch.cat([ids, next_token], dim=1)  # what chapter 3's loop fed the model
too_long = torch.zeros(1, cfg.n_ctx, dtype=torch.long)
gpt2_cache = KeyValueCache.new_empty(gpt2_small, batch=1)
mistakes = {
    "the whole text instead of the new token": lambda: forward_with_cache(model, whole_text, cache),
    "two sequences after a cache of one": lambda: forward_with_cache(model, ids[:, :2].T, cache),
    "past n_ctx": lambda: forward_with_cache(model, too_long, cache),
    "a cache made for GPT-2 small": lambda: forward_with_cache(model, next_token, gpt2_cache),
}
for name, mistake in mistakes.items():
    try:
        mistake()
        print(f"{name}: no error (?)")
    except ValueError as err:
        print(f"{name}:\n    {err}")

# %% [markdown]
# ## 6. Sampling with a cache
#
# `CachedTransformerSampler` is chapter 3's `TransformerSampler` with a cache. Chapter 3's loop
# gets each step's logits from one method, `next_logits(input_ids)`, and that is the only
# thing this class changes: it inherits everything else (the argument checks, the loop,
# `sample_next_token`, turning the prompt into ids and the result back into text). Its given
# `sample` takes one more argument, `window_shift`, stores it in `self.window_shift`, starts
# each text with `self.cache = None` and calls chapter 3's `sample`. Under the same seed it
# must produce **exactly** chapter 3's tokens.
#
# You write `next_logits`: it receives the whole text so far, one token longer than at the
# previous call, and returns the logits `[1, d_vocab]` for the token after it, keeping
# `self.cache` up to date. Three cases:
#
# 1. **The first step, a prefill** (there is no cache yet): run `forward_with_cache` on the
#    prompt, at most its last `n_ctx` tokens, as a batch of one.
# 2. **The usual step**: run it on the one token sampled last, with the cache. Everything
#    before it is in the cache already.
# 3. **The cache is full** (it holds `n_ctx` positions): there is no room for the new token.
#    See below.
#
# Keep the cache that `forward_with_cache` returns in `self.cache`, and return the logits at
# the last position. The loop around it is chapter 3's, so the frequency penalty still counts
# the whole text, even the part out of the model's view.
#
# ### Past the context window
#
# The model has `n_ctx` learned positions. Chapter 3's sampler, once the text is longer than
# that, reads the last `n_ctx` tokens: at every step the window slides by one token. Can the
# cache slide with it, dropping its oldest position and appending the newest?
#
# No. The position embedding is added to the residual stream at the start, so **every cached
# key and value was computed for a token at a given position**: after the slide, each token
# sits one position earlier, and its cached numbers are wrong. Worse, from layer 1 on, a
# position's keys and values depend on the earlier tokens it attended to, and the slide has
# just removed one of them. Every number in the cache is stale. The only exact way forward is
# to **rebuild** the cache: a prefill on the tokens still in view.
#
# Rebuilding at every step costs a full forward pass of `n_ctx` tokens per step, no faster
# than chapter 3. `window_shift` offers a trade: when the cache is full, rebuild it from the
# last `n_ctx - window_shift + 1` tokens only. That leaves room for `window_shift - 1` cheap
# steps before the next rebuild, so there is one rebuild every `window_shift` tokens.
#
# - `window_shift=1` (the default): rebuild from the last `n_ctx` tokens at every step. Exact:
#   the same tokens as chapter 3's sampler, which always reads the last `n_ctx` tokens.
# - `window_shift=32`: one rebuild every 32 tokens, from the last 225. Faster, but right after
#   each rebuild the model reads a shorter context than it could, so the text can differ from
#   chapter 3's.
#
# (Models with relative positions, such as rotary embeddings, have the same problem in a
# milder form: the positions are fine after a slide, but the cached keys and values above
# layer 0 still carry what their tokens read from the dropped one. Some long-context methods
# keep the stale cache anyway and accept the approximation: StreamingLLM, for one, keeps the
# cached keys and values of the first few tokens and of the most recent ones, without
# recomputing them; see the further reading.)
#
# Common mistakes: passing the whole text to `forward_with_cache` at every step (the cache
# rejects it with a clear message) or forgetting the batch dimension; a prefill of a long
# prompt without cropping it to `n_ctx`; rebuilding from the wrong number of tokens; keeping
# the new cache in a local variable instead of `self.cache` (every step is then a prefill).
#
# The tests compare your greedy text with HF's `generate` for three prompts; your sampled text
# with chapter 3's uncached sampler under two seeds each with a temperature, top-k, top-p and a
# frequency penalty (the same seed must give the same tokens); and, starting 5 tokens short of
# `n_ctx` and writing 60 tokens with `window_shift` 1 and 40, with HF's logits on exactly the
# window the rule above describes. A wrong text is reported at its first wrong token, with the
# likely cause where it can be recognised (the cache not passed, positions restarting at 0).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Three cases on `self.cache`: none yet (a prefill), full (a rebuild from fewer tokens), or the
# usual step (one token). Every branch keeps the cache it gets back in `self.cache`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `input_ids` is `[seq]`, and `forward_with_cache` wants `[batch, new]`: how do you turn a
# slice of `input_ids` into a batch of one? Then, for each case, ask which tokens are new to
# the model, and whether there is a cache they come after:
#
# - No cache: the prompt, cropped to `n_ctx` tokens (the given line defines `n_ctx`). Which end
#   do you keep?
# - Full: every cached number is stale, so the old cache is no help. How many tokens does the
#   rule above keep, and from which end?
# - Otherwise: how many of the tokens in `input_ids` has the model not read yet?
#
# Each branch is one call of `forward_with_cache`, and its cache goes to `self.cache`. It
# returns `[1, new, d_vocab]` logits; `next_logits` returns `[1, d_vocab]`, the last
# position's.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("CachedTransformerSampler")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="cached_sample"
# solution: solutions.cached_sampling.CachedTransformerSampler

# %%
check("cached_sample")

# %% [markdown]
# The same prompt and seed with chapter 3's sampler and with yours.
#
# **Predict, then run.** Will the two texts be the same? Section 1 counted up to 240 times less
# arithmetic per step at the end of the context: how many times faster do you expect the cached
# sampler to be, for 150 tokens after a short prompt?
#
# <details><summary>What to expect</summary>
#
# The same text (`same text: True`): the cache changes how the logits are computed, not what
# they are (up to rounding in the last digits), and under the same seed every draw is the same.
# But the speed-up is far smaller than the arithmetic suggests: several times, not hundreds (the
# cell prints what your machine does). Most of these steps are far from the end of the context,
# where the saving is smaller, and much of a step of this small model is fixed costs that the
# cache does not remove: section 9 measures where the time goes.
#
# </details>

# %% tags=["demo"]
uncached_sampler = TransformerSampler(model, tokenizer)
cached_sampler = CachedTransformerSampler(model, tokenizer)
n_tokens = 30 if QUICK else 150
demo_prompt = "ROMEO.\nWhat light"
times, texts = {}, {}
for name, sampler in [("uncached", uncached_sampler), ("cached", cached_sampler)]:
    start = time.perf_counter()
    texts[name] = sampler.sample(demo_prompt, n_tokens, seed=1, top_p=0.9, stop_at_eos=False)
    times[name] = time.perf_counter() - start
    print(f"{name:9} {n_tokens / times[name]:6.0f} tokens/s")
print("same text:", texts["uncached"] == texts["cached"])
print(texts["cached"])

# %% tags=["claim"]
assert texts["uncached"] == texts["cached"], "'What to expect' says the same text"

# %% [markdown]
# Now past the context window. We first let the model write a text that almost fills it, then
# write more with chapter 3's sampler and with yours, with `window_shift` 1 and 32. All three
# are greedy, so any difference in the tokens comes from what the model read.

# %%
long_prompt = cached_sampler.sample(
    "HAMLET.\n", cfg.n_ctx - 8, seed=0, top_p=0.9, stop_at_eos=False
)
long_ids = torch.tensor(tokenizer.encode(long_prompt))
n_more = 12 if QUICK else 80
print(f"prompt: {len(long_ids)} tokens; n_ctx {cfg.n_ctx}; writing {n_more} more")

runs = {
    "chapter 3, uncached": lambda: uncached_sampler.sample(long_ids, n_more, temperature=0.0),
    "cached, window_shift=1": lambda: cached_sampler.sample(long_ids, n_more, temperature=0.0),
    "cached, window_shift=32": lambda: cached_sampler.sample(
        long_ids, n_more, temperature=0.0, window_shift=32
    ),
}
table = Table(title="greedy past n_ctx")
for column in ["method", "tokens/s", "same tokens as uncached"]:
    table.add_column(column, justify="left" if column == "method" else "right")
outputs = {}
for name, run in runs.items():
    start = time.perf_counter()
    outputs[name] = run()
    seconds = time.perf_counter() - start
    same = outputs[name].tolist() == outputs["chapter 3, uncached"].tolist()
    table.add_row(name, f"{n_more / seconds:.0f}", str(same))
Console().print(table)

# %% tags=["claim"]
assert torch.equal(outputs["cached, window_shift=1"], outputs["chapter 3, uncached"]), (
    "section 6 says window_shift=1 gives exactly chapter 3's tokens"
)

# %% [markdown]
# With `window_shift=1` the cache buys almost nothing once the text is past `n_ctx`: every step
# is a rebuild, a full forward pass of `n_ctx` tokens, as in chapter 3 (the table may still show
# it somewhat faster: the few steps before the cache fills are cheap, and `forward_with_cache`'s
# full pass is not the same code as chapter 3's `model(tokens)`). With 32 most steps are cheap
# again. Whether its tokens differ from the exact ones depends on the text: the model reads at
# least 225 tokens, and often that is enough context to choose the same token.
#
# ## 7. Beam search with a cache
#
# Chapter 3's `Beams.generate` runs the model on every beam's whole text at every step. With a
# cache, each beam needs only its newest token, plus **its own** cache row. The difficulty is
# bookkeeping: beams are born, die and multiply at every step, and the cache rows must follow.
#
# One step of chapter 3's beam search, with 2 beams and `k = 3` continuations each:
#
# ```
#  beams (and their cache rows)     generate(3): 6 candidates      filter(2): the best 2
#  row 0: "... a fair"              0: "... a fair day"            "... a fair day"   (parent 0)
#  row 1: "... a foul"              1: "... a fair night"          "... a foul day"   (parent 1)
#                                   2: "... a fair sight"
#                                   3: "... a foul day"
#                                   4: "... a foul night"
#                                   5: "... a foul deed"
# ```
#
# `top_continuations` lays the candidates out parent by parent: candidate $j$ continues beam
# $j \,//\, k$. After `filter`, the survivors are candidates 0 and 3, so the next step needs
# cache rows 0 and 1. Had both survivors come from beam 0, it would need row 0 twice, and row 1
# not at all.
#
# `CachedBeams` (a subclass of chapter 3's `Beams`) adds two fields:
#
# - `cache`: the cache computed by the step that made these beams, one row per beam of *that*
#   step (the parents);
# - `parents` `[beam]`: for each beam, the row of `cache` it continues.
#
# Its `__getitem__` is given: `filter` picks beams by indexing, and indexing picks their
# `parents` along with their tokens and scores, but **does not touch the cache**. The many
# candidates that `filter` throws away therefore cost no copy. You write `generate`:
#
# 1. **Gather** one cache row per beam, the row its entry of `parents` names (section 2 shows
#    how a cache picks rows). Then row $i$ of the cache is beam $i$'s past. (On the first step
#    there is no cache yet.)
# 2. **Run the model**. If there is no cache (the prompt, a single beam) or it is full
#    (it holds `n_ctx` positions), prefill from the last `n_ctx` tokens of each beam, which is
#    exactly what the uncached beams read. Otherwise run only the newest token of each beam,
#    with the cache: it holds every token of the beam but the one `top_continuations`
#    appended last step.
# 3. **Expand** with chapter 3's `top_continuations`, on the logits at the last position, as
#    chapter 3's `Beams.generate` does.
# 4. **Record the parents**: candidate $j$ continues row $j \,//\, k$ of the new cache, one
#    entry per candidate, on the tokens' device. Return a new `CachedBeams` that holds the new
#    scores, tokens, cache and parents.
#
# HF's `generate` does the same bookkeeping: after each beam step it reorders every layer's
# cached keys and values by the indices of the beams it kept (`cache.reorder_cache(beam_idx)`,
# an `index_select` along the batch dimension; transformers 5.24, `generation/utils.py` and
# `CacheLayerMixin.reorder_cache` in `cache_utils.py`).
#
# Common mistakes: repeating the list of beam indices as a whole, k times over, where each
# index must come k times in a row (the parents then cycle through the beams, which is not
# the order `top_continuations` uses); forgetting to gather, so that the cache still has one
# row per *old* beam (`check_next` raises about the batch size) or, worse, the right number of
# rows in the wrong order (wrong text, no error); feeding the last two tokens, or the whole
# beam, instead of the last one.
#
# You use it through chapter 3's `beam_search`, which takes the kind of beams to search with:
# `beam_search(model, tokenizer, prompt, ..., beams_class=CachedBeams)`.
#
# The tests compare your cached beam search with HF's `generate(num_beams=...)`, sequences and
# scores, with and without a no-repeat n-gram ban; and, starting 4 tokens short of `n_ctx`,
# with chapter 3's uncached beam search, which must read the same windows.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Before running the model, give every beam its own past: gather its parent's cache row. After
# expanding, record which row each candidate continues: candidate $j$ continues beam
# $j \,//\, k$.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Gather: beam $i$ needs the row of the cache that `parents[i]` names. Section 2's cache
#   picks rows with an index tensor, repeats included. The result has one row per beam.
#   (On the first step `self.cache` is `None`: nothing to gather.)
# - Model: a prefill or a single step, as in the sampler's `next_logits`, but on
#   `self.tokens` `[beam, seq]`: each beam's last `n_ctx` tokens without a cache (also when
#   the cache is full: beams have no `window_shift`), or each beam's newest token,
#   `[beam, 1]`, with the gathered cache.
# - Expand: `top_continuations` wants the logits of the next token, `[beam, d_vocab]`. It
#   returns `[beam * k]` scores and `[beam * k, seq + 1]` tokens.
# - Parents `[beam * k]`: write them out by hand for 3 beams and `k = 2` first.
#   `torch.arange` gives the beam indices; `Tensor.repeat_interleave` repeats each element
#   several times in a row, while `Tensor.repeat` repeats the whole tensor.
# - Return: the given `__getitem__` shows how to build a `CachedBeams`, field by field.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("CachedBeams")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="cached_beams"
# solution: solutions.cached_beams.CachedBeams

# %%
check("cached_beams")

# %% [markdown]
# The same search, uncached and cached: the same sequences and scores.

# %%
beam_prompt = "KING HENRY.\nOnce more unto the breach, dear friends, once more;"
n_new = 8 if QUICK else 30
results = {}
for name, beams_class in [("uncached", Beams), ("cached", CachedBeams)]:
    start = time.perf_counter()
    results[name] = beam_search(model, tokenizer, beam_prompt, 3, 4, n_new, beams_class=beams_class)
    print(f"{name:9} {time.perf_counter() - start:.2f} s")
same = [t.tolist() for _, t in results["uncached"]] == [t.tolist() for _, t in results["cached"]]
print("same sequences:", same)
for score, tokens in results["cached"]:
    print(f"{score:8.3f}  {tokenizer.decode(tokens[len(tokenizer.encode(beam_prompt)) :])!r}")

# %% tags=["claim"]
assert same, "section 7 says cached and uncached beam search find the same sequences"

# %% [markdown]
# ## 8. Many prompts at once
#
# A cached step for one sequence is a tiny amount of work: one row through each matrix. Much
# of its time goes to fixed costs, Python and the dispatch of each operation, and to reading
# the weights from memory. Eight rows through the same matrices share those costs, so they
# should take far less than eight times as long as one (section 9 measures it). So the next
# step is to generate for many prompts at once: one forward pass per step for the whole batch.
#
# Prompts have different lengths, and a tensor needs rows of equal length, so the short
# prompts are **padded**. The question is on which side.
#
# ```
#  right padding                            left padding
#  R O M E O . \n pad pad pad               pad pad pad R O M E O . \n
#  J U L I E T . \n O ,                     J U L I E T . \n O ,
#                   ^ each row's last                          ^ every row's last
#                     token: another column                      token: the last column
# ```
#
# With **left** padding, the newest token of every row is in the last column. One
# `logits[:, -1]` gives every row's next-token logits, and the new tokens are appended as one
# new column, for every row at once. With right padding, each row's last token sits in a
# different column: you would have to gather each row's logits from its own column and write
# each new token into its own column, leaving holes in the cache. HF asks for the same when
# you generate for a batch: when `generate` detects right padding in a decoder-only model, it
# warns and asks for a tokenizer with `padding_side='left'` (transformers 5.24,
# `generation/utils.py`).
#
# Two exercises make padding work: `left_pad` builds the padded batch and its mask, and
# `positions_and_allowed` makes each row compute what its prompt computes alone. Padding uses
# the end-of-text token as its id (any id would do: the mask hides it).
#
# ### Exercise: `left_pad`
#
# `left_pad(prompts, pad_id)` takes a list of prompts as lists of token ids and returns
# `tokens` `[batch, longest]`, each row right-aligned after `pad_id`s, and `mask`
# `[batch, longest]`, a bool tensor `True` at real tokens.
#
# Common mistakes: padding on the right; a mask that is `True` at padding; a mask of 0s and 1s
# instead of bools; and an empty prompt: slicing a row's last `len(prompt)` columns with a
# negative start gives, for a length of 0, a start of `-0`, which is `0`: the **whole** row,
# not an empty slice.
#
# The test compares your tokens and mask with HF's tokenizer with `padding_side="left"`,
# padding with id 1000 (neither 0 nor end-of-text), on five prompts of 18, 6, 18, 1 and 0
# tokens (one of them empty); the mask must be a bool tensor.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Start from a whole block of padding and a mask of `False`, then write each prompt into the
# *right* end of its row. Beware the empty prompt: `-0` is `0`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# The width is the longest prompt's length. Start from two `[batch, width]` tensors:
# `torch.full` fills one with `pad_id` (give it `dtype=torch.long`), and `torch.zeros` with
# `dtype=torch.bool` makes a mask of `False`. For a prompt of length $n$, right-aligned, which
# columns of its row does it occupy? Write its ids there and set the mask `True` there. For
# the empty prompt, either skip it or compute the first column from the width, which is right
# for a length of 0 too. Return `(tokens, mask)`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("left_pad")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="left_pad"
# solution: solutions.batched.left_pad

# %%
check("left_pad")

# %%
pad_demo, pad_mask = left_pad([[11, 12, 13], [21], [31, 32]], pad_id=0)
print(pad_demo)
print(pad_mask)

# %% [markdown]
# ### Exercise: `positions_and_allowed`
#
# `forward_with_cache` (section 5) hands a batch with padding to
# `positions_and_allowed(mask, n_new)`. `mask` `[batch, all]` covers every position, cached
# and new, `True` at real tokens; the new tokens are its last `n_new` columns. It returns the
# new tokens' `positions` `[batch, new]` and `allowed` `[batch, 1, new, all]`, which keys each
# new query may read (the `1` broadcasts over the heads).
#
# ```
#   column:      0    1    2    3    4    5
#   row 0:       H    A    M    L    E    T      mask  1 1 1 1 1 1    positions  0 1 2 3 4 5
#   row 1:      pad  pad  pad   P    U    C      mask  0 0 0 1 1 1    positions  0 0 0 0 1 2
# ```
#
# (One letter per token, for the picture.) Row 1 must compute exactly what its prompt would
# compute alone. Two things make sure of that:
#
# - **Positions count real tokens only.** Row 1's first real token is in column 3, but it is
#   the row's position 0. A token's position is the number of real tokens before it in its
#   row. Left padding has no real token before it and gets position 0 (nobody reads what
#   padding computes, and a position of -1 would index the *last* row of `W_pos`). Return the
#   positions of the last `n_new` columns. Without padding this gives `cache.length`,
#   `cache.length + 1`, ..., section 5's positions.
# - **No real token attends to padding.** `allowed` keeps section 3's causal rule and also
#   hides every padding key. Rows differ in their padding, so it is one `[new, all]` mask per
#   row: `[batch, 1, new, all]`, where the `1` broadcasts over the heads.
#
# One trap remains. A padding *query* in column 0 has no real key before it, so with padding
# hidden it sees no key at all: its row of scores is all $-\infty$. Chapter 1's softmax turns
# such a row into `0/0 = NaN`. (`F.scaled_dot_product_attention` returns zeros for such a row
# since PyTorch 2.5, pytorch/pytorch pull request 131863; older versions returned NaN.)
# You might think a NaN there harmless, since nobody uses the output at a padding position.
# But NaN spreads. It enters the residual stream at that position, the next layer computes a
# NaN key and value from it, and a real query's weighted sum of values includes
# `0 * NaN = NaN`, although its weight on that position is exactly 0. So do not depend on the
# attention function's choice: let every query see its **own** key, padding or not. A padding
# query then attends to itself (a harmless, finite result), and real queries still never see
# padding. So a new query may read a key when the key is not after it, and the key is either a
# real token or in the query's own column.
#
# Common mistakes: counting padding in the positions; left padding at position -1;
# taking the *first* `n_new` columns instead of the last (right for a prefill, wrong for every
# step after it); hiding padding keys from padding queries too (NaN with a hand-written
# softmax); taking the queries' own columns from the first `n_new` columns, so that after a
# cache a query sees column 0; forgetting the causal part once padding is handled.
#
# The tests compare your positions at real tokens with HF's convention (each real token's
# position is the number of real tokens before it, which `generate` computes for GPT-2 from the
# attention mask, with padding set to 0: transformers 5.24,
# `_prepare_position_ids_for_generation` in `generation/utils.py`) and your `allowed` with the
# rule written out as a loop, for a prefill and for one and three new tokens after a padded
# cache; then, through your `forward_with_cache`, a left-padded batch of three prompts (padded
# with id 1000, neither 0 nor end-of-text) and one step after it against HF run on each prompt
# alone. At the padding positions, the logits and cached keys and values must be finite and
# equal what the padding token computes alone at position 0 (HF on that one token): that is
# what a padding query computes when it sees its own key, and only it.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Both outputs are about the *last* `n_new` columns of `mask`. The positions come from a running
# count of real tokens; `allowed` is three conditions combined: causal, key is real, or key is
# the query's own column.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - **Positions** `[batch, new]`: `torch.cumsum` of the bool mask along a row counts the real
#   tokens up to *and including* each column. What turns that into the number of real tokens
#   *before* a real token? At left padding the same arithmetic falls below 0, where padding's
#   position is 0 (`Tensor.clamp` has a `min`). Keep the last `n_new` columns.
# - **Causal** `[new, all]`: from section 3's `causal_mask`, as in `forward_with_cache`, on
#   the mask's device (`all` is the mask's width).
# - **Own key** `[new, all]`: `True` at `[i, j]` when key column `j` is new query `i`'s
#   column, and new query `i` sits in column `all - n_new + i`. Comparing a column of the
#   queries' columns `[new, 1]` with a row of all the key columns `[1, all]` (`torch.arange`)
#   broadcasts to `[new, all]`.
# - **Real keys** `[batch, 1, 1, all]`: `mask` with two size-1 axes, for the heads and the
#   queries.
# - **Combine** the three with `&` and `|`, following the rule above: the result broadcasts to
#   `[batch, 1, new, all]`. Return `(positions, allowed)`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("positions_and_allowed")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="positions_and_allowed"
# solution: solutions.cached_model.positions_and_allowed

# %%
check("positions_and_allowed")

# %% [markdown]
# **Predict, then run.** The prefill of the padded batch above: which positions does each row
# get, and what may each row's queries read?
#
# <details><summary>What to expect</summary>
#
# Row 0 (no padding) gets 0, 1, 2 and the plain causal mask. Row 1 (two padding columns) gets
# 0, 0, 0: the two padding columns are clamped to 0, and its one real token is its position 0.
# Its real query sees only its own column, and each padding query only itself. Row 2 gets
# 0, 0, 1, and its second real token sees both real tokens, not the padding.
#
# </details>

# %%
n = pad_mask.shape[1]
pad_positions, pad_allowed = positions_and_allowed(pad_mask, n)
print("positions:")
print(pad_positions)
plot_masks(
    {f"row {r}": ~pad_allowed[r, 0] for r in range(3)},
    "Left padding: dark where a query may not look",
)

# %% tags=["claim"]
assert pad_positions.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]], "'What to expect' above"

# %% [markdown]
# ### Exercise: `generate_batch`
#
# `generate_batch(model, tokenizer, prompts, max_tokens_generated, seed, stop_at_eos, **kwargs)`
# continues every prompt of a list of strings at once and returns one text per prompt: the
# prompt and its continuation, up to and including its first `<|endoftext|>` (with
# `stop_at_eos`) or `max_tokens_generated` new tokens. It is given (the cell below): it checks
# the arguments, pads the prompts with `left_pad` (the padding id is `eos`), builds `generator`
# from the seed, calls the function you write, and reads each row's text from the returned
# cache, keeping the columns where `cache.mask` is `True`.
#
# You write `generate_batch_tokens(model, tokens, mask, max_tokens_generated, eos, generator,
# stop_at_eos, **kwargs)`, the loop, and return the final cache:
#
# 1. **Prefill** the padded prompts with `forward_with_cache`, with `mask` as its
#    `attention_mask`.
# 2. At each step, choose every row's next token from the logits at the last position with
#    chapter 3's `sample_next_token`. Give it the tokens so far, `cache.tokens`, the
#    `generator`, the sampling options (`kwargs`) and its `attention_mask` argument,
#    `cache.mask`: the mask keeps padding out of the frequency penalty (below).
# 3. **Feed the new column** back, one token per row, `[batch, 1]`, with the cache, and with
#    an `attention_mask` that is `False` for rows that are already finished.
# 4. **Finished rows.** A row that has written `<|endoftext|>` is done, but the batch moves
#    together: one forward pass for all rows. Keep a `done` vector `[batch]`. A done row's new
#    token is padding: the padding id, `eos`, in place of what was sampled, fed with the mask
#    `False`, so that it is left out of the row's text and hidden from its attention. Mark a
#    row done after the step that wrote its end-of-text, which is fed as a real token, so the
#    text keeps it. Stop when every row is done.
#
# Every sampled token is fed to the model, the last one too, so that it lands in `cache.tokens`
# where `generate_batch` reads the texts from.
#
# **The frequency penalty** (`frequency_penalty`, one of the `kwargs`) counts each row's tokens,
# and `cache.tokens` holds padding too: the padding id is the end-of-text token, so without a
# mask short prompts would have their end of text penalised. Your chapter-3
# `apply_frequency_penalty` takes a mask for this reason, and `sample_next_token` hands it
# `attention_mask`: pass `cache.mask`, which is `False` at padding.
#
# **One generator for the batch.** All rows draw from the same random stream, in one call per
# step, so the random numbers a row gets depend on the other rows of the batch: sampled text
# differs from generating each prompt alone under the same seed. It follows the same
# distribution, which is what matters. Greedy text uses no random numbers and is the same.
#
# **No sliding window.** A batch does not slide past `n_ctx`: that would mean rebuilding each
# row's cache from its own last tokens, padded again, and we keep the loop simple instead. The
# given checks refuse a longest prompt plus `max_tokens_generated` longer than `n_ctx`, with a
# message that says so; generate long texts one at a time.
#
# Common mistakes: forgetting `attention_mask` at the prefill (the padding then becomes part of
# every short prompt); penalising padding; letting a finished row keep writing real tokens;
# stopping when the *first* row finishes; not feeding the last token (the text then lacks it).
#
# The tests compare greedy batched text with HF's `generate` on each prompt alone; check that
# the same seed gives the same sampled texts whatever torch's global random state, and that
# different seeds give different ones; draw the first token of 400 rows with
# `temperature=0.8, top_k=40` and compare the frequencies with HF's probabilities (a chi-square
# test that a correct implementation fails with probability at most 2·10⁻⁵); compare a greedy
# run with a frequency penalty with chapter 3's sampler on each prompt alone (which catches a
# penalty on padding); and, with a crafted model whose end-of-text is 5 nats more likely, so
# that rows end at different steps: that each text equals HF's on its prompt alone, ending
# after its own end-of-text; that with `stop_at_eos=False` every row writes all its tokens; and
# that your `generate_batch_tokens` returns a cache in which a finished row holds only padding
# after its end-of-text (the end-of-text id, with the mask `False`).
#
# <details><summary>Hint 1: a nudge</summary>
#
# One prefill with the mask, then one forward pass per step for the whole batch. A finished row
# keeps stepping, but only on padding. Feed every sampled token, the last one too, and stop when
# *every* row is done.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `done`: a bool tensor `[batch]`, all `False` at first, on the tokens' device.
# - Each step, `sample_next_token` returns one token per row, `[batch]`.
#   `torch.where(cond, a, b)` takes `a` where `cond` is `True` and `b` elsewhere (`a` may be a
#   plain number): it puts `eos` in the finished rows.
# - Feeding: tokens `[batch, 1]` and an `attention_mask` `[batch, 1]`. What must the mask be in
#   a finished row, and in a running one?
# - After feeding: which rows become done at this step, and what if `stop_at_eos` is `False`?
#   Leave the loop once every row is done. The given `return cache` after your part returns
#   the variable `cache`: keep the latest cache in it.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("generate_batch_tokens")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.batched.generate_batch

# %% tags=["exercise"] exercise="generate_batch"
# solution: solutions.batched.generate_batch_tokens

# %%
check("generate_batch")

# %% [markdown]
# Four prompts of different lengths, greedy, in one left-padded batch and one at a time.
#
# **Predict, then run.** Will the batched texts equal the texts written one at a time? Would
# they still, if both sampled with `temperature=1.0` and the same seed?
#
# <details><summary>What to expect</summary>
#
# Greedy: the same texts (`same as one at a time: True`). Positions count real tokens only, no
# real query sees a padding key, and greedy draws no random numbers, so each row computes what
# its prompt computes alone (up to float32 rounding in the last digits, far too small to change
# an argmax here). Sampled: in general, no. All rows draw from one random stream, so the numbers
# a row gets depend on the other rows of the batch. Each row still follows the right
# distribution, which is what matters.
#
# </details>

# %%
batch_prompts = [
    "ROMEO.\n",
    "JULIET.\nO Romeo,",
    "HAMLET.\nTo be, or not to be,",
    "PROSPERO.\nWe are such stuff as dreams",
]
n_tokens = 15 if QUICK else 40
batched = generate_batch(model, tokenizer, batch_prompts, n_tokens, temperature=0.0)
alone = [cached_sampler.sample(p, n_tokens, temperature=0.0) for p in batch_prompts]
print("same as one at a time:", batched == alone)
for text in batched:
    print(repr(text))

# %% tags=["claim"]
assert batched == alone, "'What to expect' says greedy batched text equals one at a time"

# %% [markdown]
# ## 9. How fast is it?
#
# Time to measure. The cells below use the reference implementations from `solutions`, under
# other names, so that the numbers do not depend on your code being right (or fast). Every
# method writes the same number of new tokens per prompt greedily, without stopping at the end
# of text, so all of them do the same work per prompt.
#
# Two precautions make the numbers hold up on a busy machine. Each time is the **fastest of
# three runs**: other programs can only add time, so the minimum is the closest to what the
# code itself costs. And the timings run on **one thread**: this model's operations are small,
# so a second thread has little to split, and when other programs keep the cores busy, a
# parallel operation waits for its slowest thread. (`python benchmarks/generate.py --load 2`,
# with and without `--threads 1`, measures what that costs on your machine.) Both precautions
# live in `utils/timing.py`: `one_thread()` and `best_seconds(run)`.

# %% tags=["demo"]
from functools import partial

from solutions.batched import generate_batch as ref_generate_batch
from solutions.cached_model import forward_with_cache as ref_forward_with_cache
from solutions.cached_sampling import CachedTransformerSampler as RefCachedSampler
from utils.timing import best_seconds, one_thread

n_new = 16 if QUICK else 200
prompts_8 = batch_prompts * 2
greedy = dict(temperature=0.0, stop_at_eos=False)
uncached_ref, cached_ref = TransformerSampler(model, tokenizer), RefCachedSampler(model, tokenizer)
batch_of_8 = partial(ref_generate_batch, model, tokenizer, prompts_8, n_new, **greedy)
methods = {  # name: (batch size, the call to time)
    "uncached (chapter 3)": (1, partial(uncached_ref.sample, "\n", n_new, **greedy)),
    "cached": (1, partial(cached_ref.sample, "\n", n_new, **greedy)),
    "batched, 8 prompts": (8, batch_of_8),
}
table = Table(title=f"{n_new} new tokens per prompt, greedy, one thread, best of 3 runs")
for column in ["method", "batch", "seconds", "tokens/s", "vs uncached"]:
    table.add_column(column, justify="left" if column == "method" else "right")


rates = {}
with one_thread():
    for name, (batch, run) in methods.items():
        seconds = best_seconds(run)
        rates[name] = batch * n_new / seconds
        ratio = rates[name] / rates["uncached (chapter 3)"]
        table.add_row(name, str(batch), f"{seconds:.2f}", f"{rates[name]:.0f}", f"{ratio:.1f}x")
Console().print(table)

# %% [markdown]
# Where does the time go? Below, the time of one step at each position $t$ of the context:
# without a cache, the model on the first $t + 1$ tokens; with a cache, one token after a cache
# of $t$ positions. Since caches are immutable, one pass through the text gives us the cache at
# every position we want to time.

# %% tags=["demo"]
positions = [0, 64, 128, 255] if QUICK else [*range(0, cfg.n_ctx, 8), cfg.n_ctx - 1]
repeats = 3 if QUICK else 5
g = torch.Generator().manual_seed(0)
bench_tokens = torch.randint(0, cfg.d_vocab, (1, cfg.n_ctx), generator=g)  # content is irrelevant


def best_ms(fn, *args, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn(*args)`, in milliseconds."""
    return 1e3 * best_seconds(lambda: fn(*args), repeats)


with torch.inference_mode(), one_thread():
    caches, cache = {0: None}, None  # caches[t]: the cache of the first t tokens
    for t in range(1, max(positions) + 1):
        _, cache = ref_forward_with_cache(model, bench_tokens[:, t - 1 : t], cache)
        if t in positions:
            caches[t] = cache
    uncached_ms, cached_ms = [], []
    for t in positions:
        uncached_ms.append(best_ms(model, bench_tokens[:, : t + 1], repeats=repeats))
        new_token = bench_tokens[:, t : t + 1]
        cached_ms.append(
            best_ms(ref_forward_with_cache, model, new_token, caches[t], repeats=repeats)
        )

# %% [markdown]
# (The cache "of the first $t$ tokens" at $t = 0$ is `None`: the step at position 0 is the
# prefill of one token.)

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(positions, uncached_ms, "o-", markersize=3, label="without cache: model(tokens[:, :t+1])")
ax.plot(positions, cached_ms, "o-", markersize=3, label="with cache: one token after t cached")
ax.set_xlabel("position t of the new token")
ax.set_ylabel("time of one step (ms)")
ax.set_ylim(bottom=0)
ax.legend()
plt.show()
last = positions[-1]
fewer = step_flops(cfg, last, cached=False) / step_flops(cfg, last, cached=True)
print(
    f"at t = {last}: {uncached_ms[-1]:.1f} ms without cache, {cached_ms[-1]:.2f} ms with: "
    f"{uncached_ms[-1] / cached_ms[-1]:.0f} times faster, for {fewer:.0f} times fewer operations"
)
rate = step_flops(cfg, last, cached=False) / (uncached_ms[-1] / 1e3)  # operations per second
arithmetic_ms = 1e3 * step_flops(cfg, last, cached=True) / rate
print(
    f"the uncached step computed {rate / 1e9:.0f} billion operations per second; at that rate the "
    f"cached step's arithmetic takes {arithmetic_ms:.2f} ms of its {cached_ms[-1]:.2f} ms"
)

# %% [markdown]
# Without a cache, the time of a step grows with the position: the model processes more and
# more tokens, and writing a whole text costs the area under that line, which grows with the
# square of its length. With a cache, the step time is almost flat: one token through the
# layers, plus attention over the cache, which grows with $t$ but is small at this size.
#
# The first line compares the speed-up you measured with the ratio of operations from
# section 1. If yours is far below it, the second line says why: a cached step of this model is
# about 6 million operations, and at the rate your CPU reached on the uncached step (its 1.4
# billion operations divided by its time) they take only part of the cached step's time. Most
# of the rest is fixed cost: a Python call for each operation of the forward pass (about 200
# PyTorch operations for this model), PyTorch dispatching each one and allocating its result,
# and reading the weights (13 MiB) from memory. The cache removes arithmetic; the fixed costs
# stay. That is also why batching pays: 8 rows share the same fixed costs.
#
# **The careful benchmark.** These timings come from a few runs each, on whatever else your
# machine is doing. `python benchmarks/generate.py` (from the repository's root, in the course
# environment) measures more carefully: it interleaves the methods over several runs (5 by
# default), reports medians and per-run ratios as JSON, reports whether all of them wrote the
# same tokens, and adds HF's `GPT2LMHeadModel.generate` (with its own cache) on the same
# weights, for one prompt and for a batch of 8, each writing new tokens up to the end of the
# context. Unlike the cells above, it uses PyTorch's default number of threads unless you pass
# `--threads 1`. The README's benchmark section records runs of it, with the machine and the
# options of each. Your numbers will differ, and even the ratios move from run to run.

# %% [markdown]
# ## 10. Why a GPU should gain less from the cache (reasoning, not a measurement)
#
# No GPU has run this course's timings yet, so this section is an argument, not a result:
# `python benchmarks/generate.py --device cuda` measures it where a GPU is at hand.
#
# The arithmetic the cache saves is the same on a GPU; what changes is what that arithmetic
# costs. A data-centre GPU is rated at tens of trillions of float32 operations per second
# (67 trillion for NVIDIA's H100 SXM, by its datasheet): at that rate the 1.4 billion operations
# of an uncached step at position 255 would take some tens of microseconds. But a step of this
# model is a kernel launch for most of its 200 or so operations, each launch costing a few
# microseconds of CPU and driver time (NVIDIA's "Getting Started with CUDA Graphs"), on top of
# Python's and PyTorch's cost of issuing it, and those costs are the same for 1 position as for
# 256. So the fixed costs should weigh even more than on a CPU, and the cache should save a
# smaller share of a step's time: for a small model on a GPU, it mostly saves work the GPU had
# to spare.
#
# The cache matters on a GPU too, for large models and long texts, where the arithmetic of
# recomputing the context is real. There the limit of a cached step becomes **memory
# bandwidth**: each step reads all the weights, and the whole cache, from GPU memory to do a
# little arithmetic with each number. The cures for both problems are the same kind of idea:
# give each kernel launch and each byte read more work to do. **Batching** does (the same
# weights serve many rows); **CUDA graphs** record a step's kernels once and replay them with
# one launch; **fused kernels** do several operations in one launch without writing the
# intermediate results to memory. Chapter 10 writes fused sampling kernels in Triton.

# %% [markdown]
# ## Check your understanding
#
# - Why does the cache hold keys and values but no queries? Why not the residual stream?
#
# <details><summary>Answer</summary>
#
# A query is used only by its own position, at the step that computes it; later positions
# read earlier ones only through attention, which reads their keys and values. The residual
# stream of an earlier position is never read by a later one, except through the keys and
# values computed from it.
#
# </details>
#
# - How much memory does the cache of GPT-2 small need for a batch of 16 texts of 1,024
#   tokens, in 16-bit numbers?
#
# <details><summary>Answer</summary>
#
# $2 \times 12 \times 12 \times 64 \times 1024 \times 2$ bytes $= 36$ MiB per text, $576$ MiB
# for 16: more than twice the weights in 16 bits (about 250 MB).
#
# </details>
#
# - With a cache, which parts of a step grow with the position $t$, and which do not?
#
# <details><summary>Answer</summary>
#
# Attention grows with $t$: one query against $t + 1$ keys, and a weighted sum of $t + 1$
# values (and our `torch.cat` copies the cache, also $\propto t$). The projections, the MLP, the
# layer norms and the unembedding run on one position and do not grow.
#
# </details>
#
# - Why may `forward_with_cache` pass no mask at all for one new token?
#
# <details><summary>Answer</summary>
#
# The one new query is the last position, and every key is at or before it: `causal_mask(1, n)`
# hides nothing. (With padding it is different: then padding keys must be hidden.)
#
# </details>
#
# - Suppose your new tokens always got positions from 0. Would the text be nonsense?
#
# <details><summary>Answer</summary>
#
# Yes, and quickly. The first new token comes from the prefill, whose positions do start at 0,
# so it is the correct model's. Every later one is embedded as if it stood at position 0, and
# its logits are off. In greedy runs of the shipped model on six of the course's prompts (40 new
# tokens each, compared with the correct cache), the first wrong token was new token 2 on four
# prompts and new token 3 or 4 on the other two, and the text then fell into a loop, a block of
# one to seven tokens repeated at least three times in a row (`I have I have I have`,
# `'st'st'st`), starting between new tokens 7 and 19; the correct runs had no such loop within
# their 40 tokens. The bug shows in the text, but the tests do not rely on that: they compare
# logits at every position.
#
# </details>
#
# - In a left-padded batch, why must a padding query be allowed to see its own key?
#
# <details><summary>Answer</summary>
#
# Otherwise a padding query with no real key before it sees no key at all, and a softmax over
# a row of $-\infty$ is NaN (a hand-written softmax gives NaN; `F.scaled_dot_product_attention`
# returns zeros for such a row since PyTorch 2.5, but older versions gave NaN). The NaN enters
# the residual stream at that position, becomes a NaN key and value in the next layer, and
# reaches real positions as `0 * NaN = NaN` in their weighted sums of values, although their
# weight on the padding is 0.
#
# </details>
#
# - Why does the cache have to be rebuilt when the text slides past `n_ctx`, instead of
#   dropping its oldest position?
#
# <details><summary>Answer</summary>
#
# Every cached key and value was computed with the token's position embedding, and, from
# layer 1 on, from attention over the tokens before it. After a slide by one, every token has
# moved one position, and the first token has gone from every later token's context. All of
# it is stale.
#
# </details>
#
# - In cached beam search, why is the cache gathered in `generate` rather than in `filter`?
#
# <details><summary>Answer</summary>
#
# `filter` is called on all `k * num_beams` candidates and keeps a few; `generate` gathers one
# row per surviving beam, once per step. Indexing only moves the small `parents` vector, so
# discarded candidates never copy a cache.
#
# </details>
#
# - Why does batched sampling under a seed give different text from one prompt at a time,
#   when greedy text is the same?
#
# <details><summary>Answer</summary>
#
# All rows draw from one random stream, so the numbers a row gets depend on the other rows in
# the batch. Each row still samples from the right distribution. Greedy decoding draws no
# random numbers.
#
# </details>
#
# - The cache cuts the arithmetic of a step at position 255 by about 240 times. Why is the
#   measured speed-up much smaller, and why should it be smaller still on a GPU?
#
# <details><summary>Answer</summary>
#
# Much of a step of a small model is fixed costs: Python, dispatching and launching each
# operation, reading the weights. The cache removes arithmetic, not those. On a GPU the
# arithmetic is cheap to begin with and each kernel launch adds a fixed cost, so the cache
# should save an even smaller share (section 10's reasoning; no GPU has measured it here).
#
# </details>

# %% [markdown]
# ## Further reading
#
# - Hugging Face transformers 5.24, `src/transformers/cache_utils.py`: `DynamicLayer.update`
#   (`torch.cat`), `StaticLayer` (preallocated `[batch, heads, max_cache_len, head_dim]`
#   tensors, `index_copy_`), `CacheLayerMixin.reorder_cache` (`index_select`); and
#   `src/transformers/generation/utils.py`: the static cache's size (`max_length - 1`), the
#   position ids of a padded batch (`_prepare_position_ids_for_generation`), the right-padding
#   warning, and the cache reordered after each beam-search step.
# - PyTorch's documentation of `torch.nn.functional.scaled_dot_product_attention`: the boolean
#   mask's convention, `is_causal`'s top-left mask, the fused kernels; pytorch/pytorch pull
#   request 131863: zeros, not NaN, for a fully masked row (PyTorch 2.5).
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need*, 2019
#   (arXiv:1911.02150): multi-query attention. Ainslie et al., *GQA: Training Generalized
#   Multi-Query Transformer Models from Multi-Head Checkpoints*, 2023 (arXiv:2305.13245).
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving with
#   PagedAttention*, SOSP 2023 (arXiv:2309.06180): the cache as what limits the batch, and
#   paged allocation (vLLM); vLLM's documentation, "Quantized KV Cache": an FP8 cache.
# - Xiao et al., *Efficient Streaming Language Models with Attention Sinks*, ICLR 2024
#   (arXiv:2309.17453): StreamingLLM, a sliding window that keeps the stale cache.
# - NVIDIA, "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs): launch
#   overhead and CUDA graphs; NVIDIA's H100 datasheet: 67 teraFLOPS in float32 (SXM).
#
# ## What's next
#
# Section 9 found that most of a cached step of this model is fixed cost, not arithmetic.
# **Chapter 5** measures where that time goes and removes it: a static cache written in place,
# a loop that never waits for its results, and the step compiled into one graph.
#
# And each cached step still produces one token for one full pass through the model. In
# **chapter 6**, speculative decoding, a small **draft** model (`models/shakespeare-draft`,
# 2 layers, the same tokenizer) guesses several tokens cheaply, one cached step each, and the
# main model checks all the guesses in **one** forward pass: `forward_with_cache` on a chunk of
# several new tokens after its cache. Both models keep a cache, and where the main model
# rejects a guess, both must forget it: `keep_only` (section 2) turns the rejected positions
# into padding. Done right, the text follows exactly the main model's distribution, in fewer
# main-model passes.
