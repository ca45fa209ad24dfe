# %% [markdown]
# # Chapter 7 — Today's transformer
#
# The model you built in chapter 1 is GPT-2's, from 2019. Open the code of a later open model
# (Llama, SmolLM2) and you find the same skeleton: tokens in, a residual stream, a stack of
# pre-norm blocks, each an attention layer and an MLP, logits out. Four parts of the block have
# changed. Llama (Touvron et al., 2023) brought the first three together; grouped-query
# attention (Ainslie et al., 2023) came after. SmolLM2-135M has all four (section 3 reads its
# config):
#
# - **RMSNorm** instead of LayerNorm: divide by the root mean square, subtract no mean, add no
#   bias;
# - **rotary position embeddings (RoPE)** instead of learned positions: a position turns each
#   query and key, two coordinates at a time, by an angle that grows with the position, so
#   attention scores depend on how far apart two tokens are;
# - **SwiGLU** instead of the GELU MLP: one branch, through SiLU, gates another;
# - **grouped-query attention (GQA)**: fewer key/value heads than query heads, each shared by a
#   group of query heads, so the KV cache of chapter 4 shrinks by the group size.
#
# And no biases anywhere. In this chapter you write each of them, check each against Hugging
# Face's own Llama modules (`LlamaRMSNorm`, `LlamaRotaryEmbedding` with `apply_rotary_pos_emb`,
# `LlamaMLP`, `LlamaAttention`) **on the same weights**, put them together into a model whose
# logits equal `LlamaForCausalLM`'s, and give it chapter 4's KV cache.
#
# What you write:
#
# - `RMSNorm`;
# - `rope_cos_sin` and `apply_rope`: the angles of each position, and the rotation;
# - `SwiGLU`;
# - `expand_kv` and `GroupedQueryAttention`'s `rotated_qkv` and `attend`;
# - `LlamaBlock` and `LlamaTransformer`'s forward passes;
# - `llama_forward_with_cache`: chapter 4's `forward_with_cache` for this model.
#
# The course ships a second model for this chapter, `shakespeare-llama`: trained by chapter 2's
# code on the same plays with the same tokenizer and the same recipe as the GPT-2 model of
# chapters 1 to 6, at (nearly) the same number of parameters. At the end you compare the two.
#
# **Time:** about 4 hours: section 1 takes 10 minutes, RMSNorm 20, RoPE 60, SwiGLU 20, GQA
# 45, the whole model 30, the cache 45. **You need:** chapter 1's blocks and attention, and
# chapter 4's `forward_with_cache` and `KeyValueCache`. Everything earlier is imported from
# `solutions`, so your own versions need not work.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it, which runs
# the graded tests for that exercise on what your notebook defines *right now*. From a
# terminal, `pytest -m rope` and `course grade 7` grade your saved notebook;
# `show_solution("rope_cos_sin")` prints the reference of one function or class when you are
# truly stuck (try hints 1 and 2 first); `course reset 07` gives you a fresh notebook and keeps
# a backup of yours.
#
# The exercises build on each other: `GroupedQueryAttention` calls your `rope_cos_sin`,
# `apply_rope` and `expand_kv`; the model calls all of your modules. Do them in order.

# %% tags=["setup"]
import json
import math
import os
from types import SimpleNamespace

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

from solutions import checks
from solutions.cached_model import explicit_layout, positions_and_allowed, start_forward
from solutions.embed import Embed
from solutions.kv_cache import KeyValueCache
from solutions.llama_config import LlamaConfig
from solutions.train import TiedUnembed
from utils.check import check
from utils.display import show_solution

# %% [markdown]
# The course's own tests run this notebook from top to bottom with `COURSE_QUICK=1`, which
# shortens the demos. On your machine `QUICK` is `False`.

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)

# %% [markdown]
# ## 1. Two models, one recipe (10 minutes)
#
# `load_model` reads a folder in HF's format and builds the course's model for it: a
# `DemoTransformer` for a GPT-2 checkpoint, a `LlamaTransformer` (this chapter's) for a Llama
# one. `load_hf` gives the same weights as Hugging Face's own model class, `LlamaForCausalLM`:
# the implementation nobody here wrote, and the one every check below compares with. Both
# shipped models were trained with the same data, tokenizer, steps and learning rates; the
# Llama model's MLP is 624 wide (not 4 × 192) so that the two have nearly the same number of
# parameters.

# %%
from utils.models import load_hf, load_model, model_dir


def count_of(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


LLAMA = "shakespeare-llama"
GPT2 = "shakespeare"
llama_model, tokenizer = load_model(LLAMA)
hf_llama, _ = load_hf(LLAMA)
gpt2_model, _ = load_model(GPT2)
cfg = llama_model.cfg
print(cfg)
n_llama = sum(p.numel() for p in llama_model.parameters())
# Chapter 1's DemoTransformer keeps its own copy of the unembedding (and a bias of zeros); the
# checkpoint ties it to the embedding, as the Llama model does: it is not counted twice.
n_gpt2 = sum(p.numel() for p in gpt2_model.parameters()) - count_of(gpt2_model.unembed)
print(f"parameters: {LLAMA} {n_llama:,}, {GPT2} {n_gpt2:,}")

# %% tags=["claim"]
assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head) == (4, 192, 6, 2, 32)
assert (cfg.d_mlp, cfg.rope_theta, cfg.rms_norm_eps) == (624, 10000.0, 1e-5)
assert (n_llama, n_gpt2) == (2_619_072, 2_615_424), "sections 1 and 4 quote both counts"

# %% [markdown]
# The config says what this chapter is about: 4 layers of width 192 as before, **6 query heads
# but only 2 key/value heads** (each shared by 3 query heads), a gated MLP 624 wide, the base
# of the rotary angles `rope_theta` = 10,000, and RMSNorm's epsilon. There is no `n_ctx` worth
# of learned positions: `n_ctx` = 256 is only the longest text the model was trained on. The
# two models have 2,619,072 and 2,615,424 parameters.
#
# ## 2. RMSNorm (20 minutes)
#
# Chapter 1's LayerNorm does four things to each position's residual vector $x$ (of $d$
# numbers): subtract its mean, divide by its standard deviation, multiply by a weight $w$, add a
# bias $b$. RMSNorm (Zhang & Sennrich, 2019) keeps only the division and the weight:
#
# $$\operatorname{RMSNorm}(x) = w \odot \frac{x}{\sqrt{\frac{1}{d}\sum_i x_i^2 + \varepsilon}}.$$
#
# The root mean square $\sqrt{\frac1d \sum_i x_i^2}$ is the standard deviation without the mean
# taken out. Dividing by it still puts every position's vector on the same scale, which is what
# keeps the residual stream's growing vectors from swamping the layers that read them; the
# paper's hypothesis, borne out by its experiments, is that re-centring (subtracting the mean)
# is the part LayerNorm can do without. What it saves: one reduction over $d$ instead of two
# (no mean to compute before the variance), no bias, and $d$ fewer parameters per norm. The
# paper reports 7% to 64% less running time across its models.
#
# Two details that every implementation must get right, because checkpoints were trained with
# them:
#
# - $\varepsilon$ is added to the mean square **inside** the square root (as in chapter 1's
#   LayerNorm); the model's is `cfg.rms_norm_eps`.
# - The mean square is taken in **float32** even when the model runs in 16 bits. HF's
#   `LlamaRMSNorm` casts its input to float32, normalises, casts back to the input's dtype and
#   only then multiplies by $w$. Squares overflow float16 early: $300^2 = 90{,}000$ is more than
#   float16's largest number, 65,504, and residual streams of large models hold values that
#   large.
#
# ### Exercise: `RMSNorm`
#
# `RMSNorm(cfg).forward(residual)` takes `[batch, posn, d_model]` and returns the same shape.
# The weight is `self.w` `[d_model]`; the epsilon is `self.cfg.rms_norm_eps`.
#
# Common mistakes: subtracting the mean (that is LayerNorm without its bias: a residual vector
# with a non-zero mean comes out different); $\varepsilon$ outside the square root, $x /
# (\sqrt{\cdot} + \varepsilon)$; forgetting the weight; squaring in the input's dtype, which
# overflows float16; a float32 result for 16-bit input (the cast back forgotten), or the weight
# applied before the cast; an axis counted from the front (2-D input has no axis 2); a sum
# where the mean belongs; an in-place product on `residual.float()`, which for float32 input is
# the caller's residual stream itself, not a copy (the tests check that the input is unchanged).
#
# The tests compare your module with HF's `LlamaRMSNorm` holding the same weight: on the
# shipped model's weights with a residual whose mean is far from zero and an epsilon of
# $10^{-2}$ (large enough that its place matters); on float16 and bfloat16 inputs with a weight
# of the same dtype, as in a model loaded in 16 bits (the result must keep the input's dtype,
# and the order of the cast and the product shows in the last bit); and on 2-D input
# `[tokens, d_model]`, which is how chapter 8's model runner calls the final norm.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Three steps: the mean of the squares over the last axis, the reciprocal square root of it
# plus epsilon, and the products with the input and the weight. Do the first two in float32.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Make a float32 copy of the input first (`Tensor.float`). Square it and average over the last
# axis, counted from the end so that 2-D input works too, keeping that axis with size 1 so the
# result lines up with every coordinate (`keepdim`). Add epsilon and take the reciprocal square
# root (`torch.rsqrt`). Scale the float32 copy by it, cast the result back to the input's dtype
# (`Tensor.to`), and only then multiply by the weight, in that order, as HF does.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("RMSNorm")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="rmsnorm"
# solution: solutions.rmsnorm.RMSNorm

# %%
check("rmsnorm")

# %% [markdown]
# **Predict, then run.** A residual vector with a large mean: what do LayerNorm and RMSNorm
# (both with weight 1 and no bias) make of it? Which one keeps the mean?

# %%
from solutions.config import Config
from solutions.layernorm import LayerNorm

x = torch.tensor([[[5.0, 6.0, 4.0, 5.0]]])  # one position, d_model 4, mean 5
rms = RMSNorm(LlamaConfig(d_model=4, n_heads=1, n_kv_heads=1, d_head=2))
ln = LayerNorm(Config(d_model=4, n_heads=1, d_head=4))
with torch.no_grad():
    print("input    ", x[0, 0].tolist())
    print("RMSNorm  ", [round(v, 3) for v in rms(x)[0, 0].tolist()])
    print("LayerNorm", [round(v, 3) for v in ln(x)[0, 0].tolist()])

# %% [markdown]
# RMSNorm only rescales: the vector keeps its direction, mean included (all four numbers stay
# near 1). LayerNorm takes the mean away first, so only the differences between coordinates
# survive. A network trained with RMSNorm learns with that: nothing forces its residual
# stream to have mean zero, and nothing needs to.
#
# ## 3. Rotary position embeddings (60 minutes)
#
# GPT-2 adds a learned vector `W_pos[p]` to the residual stream at position $p$, once, before
# the first block. Attention then has to find positions inside the content. RoPE (Su et al.,
# 2021) puts position where attention reads it: in the queries and keys of every layer. It
# cuts each head's $d_\text{head}$ coordinates into $d_\text{head}/2$ **pairs**, treats each
# pair as a point in the plane, and turns it about the origin by an angle proportional to the
# position. Pair $i$ at position $p$ turns by
#
# $$\phi_{p,i} = p \cdot \theta^{-2i/d_\text{head}}, \qquad i = 0, 1, \dots,
#   d_\text{head}/2 - 1,$$
#
# with $\theta$ = `rope_theta` (10,000 for our model and the original Llama; the base is a
# choice made before training). Pair 0 turns by one radian per position; the last pair, the
# slowest, by $\theta^{-(d_\text{head} - 2)/d_\text{head}}$ of a radian: fast pairs tell
# neighbours apart, slow pairs tell far-apart tokens apart.
#
# **Why turning works.** The score of query $q$ at position $m$ and key $k$ at position $n$
# is a sum of dot products of pairs. Turning both points of a pair changes their dot product
# only by the *difference* of their angles: $R(\alpha)a \cdot R(\beta)b = a \cdot
# R(\beta - \alpha)b$. So the rotated score is a function of $q$, $k$ and $n - m$ alone: the
# offset, never the absolute positions. That is the "explicit relative position dependency" the
# paper's abstract claims for RoPE, and you will check it below.
#
# Only queries and keys turn. Values are what a query reads, not where; they are left alone.
#
# **Which coordinates form a pair?** Two layouts exist, and a checkpoint only works with its
# own:
#
# - **interleaved**: pair $i$ is coordinates $(2i, 2i+1)$: the RoFormer paper's and Meta's
#   original Llama code (which treats each pair as one complex number and multiplies it by
#   $e^{i\phi}$);
# - **half-split**: pair $i$ is coordinates $(i, i + d_\text{head}/2)$: HF's Llama code, and
#   this course. Rotating a pair $(a, b)$ by $\phi$ gives $(a\cos\phi - b\sin\phi,\;
#   b\cos\phi + a\sin\phi)$. Written for all pairs at once, with $x_1$ the first half of the
#   coordinates and $x_2$ the second:
#   $x \cos\phi + \operatorname{rotate\_half}(x) \sin\phi$, where
#   $\operatorname{rotate\_half}(x_1, x_2) = (-x_2, x_1)$ and the cosines and sines are laid
#   out the same way, each angle twice: $(\phi_0, \dots, \phi_{d/2-1}, \phi_0, \dots,
#   \phi_{d/2-1})$.
#
# Section 3.2 shows what the layout means for a checkpoint's weights. First, the rotation.
#
# `rotate_half` is given:

# %% tags=["source"]
# solution: solutions.rope.rotate_half

# %% [markdown]
# ### Exercise: `rope_cos_sin` and `apply_rope`
#
# - `rope_cos_sin(positions, d_head, theta)` takes integer positions of any shape
#   `[*batch, posn]` and returns `cos` and `sin`, each `[*batch, posn, d_head]`, in the
#   half-split layout: column $i$ and column $i + d_\text{head}/2$ both hold pair $i$'s angle.
# - `apply_rope(x, cos, sin)` turns `x` `[batch, heads, posn, d_head]` (queries or keys,
#   heads first) by the angles of `cos` and `sin` `[batch, posn, d_head]`: every head of a
#   position turns by the same angles. The result has `x`'s dtype: `rope_cos_sin` computes in
#   float32, and a model in bfloat16 turns its bfloat16 queries and keys with those angles cast
#   to bfloat16, as HF's `LlamaRotaryEmbedding` does (its `forward` returns `cos` and `sin` in
#   the input's dtype).
#
# Common mistakes: the exponent $i / d_\text{head}$ instead of $2i / d_\text{head}$ (every pair
# after the first turns too fast); the angles repeated in the interleaved layout
# ($\phi_0, \phi_0, \phi_1, \phi_1, \dots$) where the half-split one is wanted; $\theta$
# written as 10,000 instead of read from the argument (our model uses 10,000, SmolLM2-135M
# 100,000); the frequencies made on the CPU when the positions are on a GPU
# (`torch.arange` without `device=`); turning the wrong way (the sign of the sine);
# `cos` and `sin` lined up with the heads axis instead of the positions; the angles computed in
# float16, which keeps about three significant digits, too few for the angles of far positions;
# float32 cosines multiplying bfloat16 queries as they are, which makes the queries and keys
# float32 while the values stay bfloat16, and the attention refuses to mix them.
#
# The tests compare your cosines and sines with HF's `LlamaRotaryEmbedding` for positions that
# do not start at 0 and differ between the rows of a batch, at $\theta$ = 10,000 and 500,000,
# and for positions `[posn]` with no batch axis (the plot below passes them so), and your
# rotation with HF's `apply_rotary_pos_emb`, in float32 and on bfloat16 queries (the result
# keeps their dtype); a property test checks that a rotated query's score with a rotated key
# depends only on the offset between their positions; and `rope_cos_sin` runs on PyTorch's
# `meta` device to catch a tensor made on the CPU.
#
# <details><summary>Hint 1: a nudge</summary>
#
# One frequency per pair, $\theta^{-2i/d_\text{head}}$; the angles are positions times
# frequencies (an outer product over a new last axis); the half-split layout writes the
# $d_\text{head}/2$ angles twice, one copy after the other. The rotation is one line with the
# given `rotate_half`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `torch.arange` with a step of 2, made on the positions' device, gives $2i$ for every pair;
#   divide by `d_head` as floats. The frequencies are one over $\theta$ to that power.
# - The positions, as float32, with a new last axis of size 1, times the frequencies
#   `[d_head/2]`, broadcast to `[*batch, posn, d_head/2]`. `torch.cat` along the last axis:
#   twice the same tensor, or each angle twice in a row (`repeat_interleave`)? Which one puts
#   pair $i$'s angle in columns $i$ and $i + d_\text{head}/2$?
# - `apply_rope`: `cos` is `[batch, posn, d_head]` and `x` is `[batch, heads, posn, d_head]`.
#   Where must `cos` gain an axis of size 1 to broadcast over the heads? Cast `cos` and `sin`
#   to `x`'s dtype (`Tensor.to`), then the formula above, with `rotate_half(x)`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("rope_cos_sin")` and `show_solution("apply_rope")`.
#
# </details>

# %% tags=["exercise"] exercise="rope"
# solution: solutions.rope.rope_cos_sin
# solution: solutions.rope.apply_rope

# %%
check("rope")

# %% [markdown]
# Your angles, read back from your cosines and sines (the left panel goes once round the
# colour wheel per turn): pair 0 turns every $2\pi \approx 6.3$ positions, the slowest pairs
# have not turned a quarter after the model's 256 positions.

# %%
from utils.plots import plot_rope_angles

cos, sin = rope_cos_sin(torch.arange(cfg.n_ctx), cfg.d_head, cfg.rope_theta)
plot_rope_angles(cos, sin, cfg.rope_theta)
slowest = torch.atan2(sin[-1, cfg.d_head // 2 - 1], cos[-1, cfg.d_head // 2 - 1]).item()
print(f"the slowest pair's angle at position {cfg.n_ctx - 1}: {slowest:.3f} radians")

# %% tags=["claim"]
assert 0 < slowest < math.pi / 2, "the text says the slowest pairs turn less than a quarter"

# %% [markdown]
# **Predict, then run.** A query and a key, both random. Rotate them for positions $(m, n)$ and
# take their dot product, for several pairs of positions. Which of these scores are equal?

# %%
g = torch.Generator().manual_seed(0)
q, k = torch.randn(2, 1, 1, 1, cfg.d_head, generator=g)  # [batch, heads, posn, d_head] each


def rotated_score(m: int, n: int) -> float:
    cos_m, sin_m = rope_cos_sin(torch.tensor([[m]]), cfg.d_head, cfg.rope_theta)
    cos_n, sin_n = rope_cos_sin(torch.tensor([[n]]), cfg.d_head, cfg.rope_theta)
    return (apply_rope(q, cos_m, sin_m) * apply_rope(k, cos_n, sin_n)).sum().item()


pairs = [(3, 0), (10, 7), (200, 197), (3, 1), (5, 5), (100, 100)]
scores = {pair: rotated_score(*pair) for pair in pairs}
for (m, n), score in scores.items():
    print(f"query at {m:3}, key at {n:3} (offset {m - n}): score {score:+.5f}")

# %% tags=["claim"]
assert (
    abs(scores[(3, 0)] - scores[(200, 197)]) < 1e-4
    and abs(scores[(5, 5)] - scores[(100, 100)]) < 1e-4
)
assert abs(scores[(3, 0)] - scores[(3, 1)]) > 1e-3

# %% [markdown]
# The same offset gives the same score, wherever the two tokens sit; a different offset gives
# a different score. Two consequences you will meet again:
#
# - Positions counted from 1 instead of 0, or from any other origin, give the *same* scores,
#   hence the same logits. (So no comparison of logits can tell a model whose positions start
#   at 1 from one whose positions start at 0. It shows where two origins meet, as in a cache
#   whose new token is placed by one rule and whose cached keys by another, and wherever the
#   rotated keys themselves are compared: section 7's tests compare your cached keys with HF's.)
# - A key rotated once, by its own position, never needs rotating again: later queries bring
#   their own angles. That is why the cache of section 7 stores keys **after** rotation.
#
# ### 3.2 The layout is part of the checkpoint
#
# Meta released Llama with the interleaved layout. Hugging Face's model uses the half-split
# one, which computes the same thing with `rotate_half` instead of complex numbers, on the
# same weights **after** reordering them: HF's conversion script
# (`src/transformers/models/llama/convert_llama_weights_to_hf.py` in the transformers
# repository) applies a `permute` to every layer's query and key projection weights (not to
# the values', which never turn), so that within each head the coordinates $0, 2, 4, \dots$
# come first and $1, 3, 5, \dots$ after them. Pair $(2i, 2i+1)$ of Meta's layout becomes pair
# $(i, i + d/2)$ of HF's.
#
# The given `apply_rope_interleaved` is Meta's rotation (complex numbers);
# `interleaved_to_half_split` is the reordering of one head's coordinates:

# %% tags=["source"]
# solution: solutions.rope.apply_rope_interleaved
# solution: solutions.rope.interleaved_to_half_split

# %% [markdown]
# **Predict, then run.** Three scores of the same query and key at positions 9 and 4: Meta's
# rotation on the vectors as they are; your half-split rotation on the reordered vectors (what
# the conversion does to the weights that make them); your rotation on the vectors as they are
# (a checkpoint read in the wrong layout). Which agree?

# %%
order = interleaved_to_half_split(cfg.d_head)
print("a head's coordinates in the half-split order:", order.tolist())
pos_q, pos_k = torch.tensor([[9]]), torch.tensor([[4]])
cq, sq = rope_cos_sin(pos_q, cfg.d_head, cfg.rope_theta)
ck, sk = rope_cos_sin(pos_k, cfg.d_head, cfg.rope_theta)
meta = (apply_rope_interleaved(q, pos_q, cfg.rope_theta)
        * apply_rope_interleaved(k, pos_k, cfg.rope_theta)).sum().item()  # fmt: skip
converted = (apply_rope(q[..., order], cq, sq) * apply_rope(k[..., order], ck, sk)).sum().item()
wrong_layout = (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()
print(f"Meta's layout, Meta's weights:         {meta:+.5f}")
print(f"HF's layout, reordered weights:        {converted:+.5f}")
print(f"HF's layout, weights not reordered:    {wrong_layout:+.5f}")

# %% tags=["claim"]
assert abs(meta - converted) < 1e-4 and abs(meta - wrong_layout) > 1e-3

# %% [markdown]
# The reordered weights give Meta's scores exactly; the same weights read in the other layout
# give another number, at every layer: another model (section 6 measures what it does to the
# shipped model's loss). Nothing in a checkpoint's tensors says which layout they were
# trained with: the code that reads them must know. (Some configs say it in words: SmolLM2's
# `config.json` carries `"rope_interleaved": false`.)
#
# **Where is $\theta$?** In the config, under a name that moved. Older configs keep
# `rope_theta` at the top level: SmolLM2-135M's `config.json` has `"rope_theta": 100000`.
# Transformers 5 writes `rope_parameters = {"rope_type": "default", "rope_theta": ...}`, which
# is what the shipped model's config holds. `utils.convert.rope_theta_of` reads both, and
# refuses the scaled variants (`"llama3"`, which came with Llama 3.1's configs, `"linear"`,
# `"yarn"`, ...) that change the angles in ways this chapter's `rope_cos_sin` does not compute.

# %%
from utils.convert import rope_theta_of

print("shipped model:", hf_llama.config.rope_parameters, "->", rope_theta_of(hf_llama.config))
older = SimpleNamespace(rope_theta=100000.0, rope_scaling=None)  # the older key, SmolLM2's
print("an older config:", {"rope_theta": older.rope_theta}, "->", rope_theta_of(older))
try:
    rope_theta_of(SimpleNamespace(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}))
except ValueError as err:
    print("Llama 3.1's scaled RoPE:", err)

# %% [markdown]
# ## 4. SwiGLU (20 minutes)
#
# Chapter 1's MLP is $\operatorname{GELU}(x W_\text{in} + b_\text{in}) W_\text{out} +
# b_\text{out}$. The gated MLP of today's models (Shazeer, 2020, "GLU Variants Improve
# Transformer") has two input projections of the same width, and multiplies them element by
# element, one of them passed through SiLU (also called Swish, $\operatorname{SiLU}(z) =
# z \sigma(z)$) first:
#
# $$\operatorname{SwiGLU}(x) = \bigl(\operatorname{SiLU}(x W_\text{gate}) \odot x W_\text{up}\bigr)
#   W_\text{down}.$$
#
# The SiLU branch is the **gate**: near zero it shuts the up branch off, for large inputs it
# lets it through. No biases. HF's `LlamaMLP` names the three `gate_proj`, `up_proj` and
# `down_proj`; the course keeps chapter 1's `[in, out]` layout, `x @ W`.
#
# **Its size.** Three matrices of $d_\text{model} \times d_\text{mlp}$ instead of two, so at the
# same hidden width the MLP has 1.5 times the parameters. Shazeer's paper keeps the parameter
# count (and the computation) of the two-matrix MLP by shrinking the hidden width by a factor of
# $\frac23$; the Llama paper uses the same $d_\text{mlp} = \frac23 \cdot 4 d_\text{model}$
# ("instead of $4d$ as in PaLM"). The shipped model takes 624, more than
# $\frac23 \cdot 768 = 512$, to spend there what it saves elsewhere (no biases, no learned
# positions, fewer key/value weights: section 5). The cell after the exercise counts both
# models' parameters, part by part.
#
# ### Exercise: `SwiGLU`
#
# `SwiGLU(cfg).forward(x)` takes `[batch, posn, d_model]` (the block's `ln2` of the residual
# stream) and returns the same shape. The weights are `W_gate` and `W_up` `[d_model, d_mlp]` and
# `W_down` `[d_mlp, d_model]`.
#
# Common mistakes: SiLU on the up branch instead of the gate (the two are trained for their
# roles: the numbers come out different); SiLU on the product; GELU where SiLU belongs;
# the weights read transposed (with `[in, out]` matrices, `x @ W`).
#
# The tests compare your module with HF's `LlamaMLP` holding the same weights: the shipped
# model's second layer, and a random MLP whose widths differ (42 in, 72 hidden), in float32 and
# in bfloat16 (the result keeps the input's dtype).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Two products of the input, one through SiLU, multiplied element by element, then the down
# projection. Which of `W_gate` and `W_up` goes through SiLU?
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Each weight is `[in, out]`, so a projection is the input times the matrix (`@`). Project
# the input twice to `d_mlp` wide, once with the gate's weight and once with the up weight;
# only the gate's projection goes through SiLU (`F.silu`). Multiply the two element by element,
# then project the product back down to `d_model` with the down weight.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("SwiGLU")`.
#
# </details>

# %% tags=["exercise"] exercise="swiglu"
# solution: solutions.swiglu.SwiGLU

# %%
check("swiglu")

# %%
table = Table(title="parameters, part by part")
for column in ["part", GPT2, LLAMA]:
    table.add_column(column, justify="left" if column == "part" else "right")


rows = {
    "embedding (tied with the unembedding)": (
        count_of(gpt2_model.embed),
        count_of(llama_model.embed),
    ),
    "learned positions": (count_of(gpt2_model.pos_embed), 0),
    "attention, per layer": (
        count_of(gpt2_model.blocks[0].attn),
        count_of(llama_model.blocks[0].attn),
    ),
    "MLP, per layer": (count_of(gpt2_model.blocks[0].mlp), count_of(llama_model.blocks[0].mlp)),
    "norms, per layer": (
        count_of(gpt2_model.blocks[0].ln1) + count_of(gpt2_model.blocks[0].ln2),
        count_of(llama_model.blocks[0].ln1) + count_of(llama_model.blocks[0].ln2),
    ),
    "whole model": (n_gpt2, n_llama),
}
for part, (a, b) in rows.items():
    table.add_row(part, f"{a:,}", f"{b:,}")
Console().print(table)

# %% [markdown]
# The Llama model spends what it saves on learned positions, biases and key/value heads on a
# wider MLP.
#
# ## 5. Grouped-query attention (45 minutes)
#
# In chapter 1 every head had its own queries, keys and values. Chapter 4's cache stores the keys
# and values of every head of every layer for every position of every text in the batch: with
# enough long texts at once, more memory than the weights. **Multi-query attention** (Shazeer,
# 2019) keeps one key head and one value head for all the query heads; **grouped-query attention**
# (Ainslie et al., 2023) is the range in between: `n_kv_heads` key/value heads, each read by a
# group of `n_heads // n_kv_heads` query heads. `n_kv_heads == n_heads` is chapter 1's multi-head
# attention, `n_kv_heads == 1` multi-query attention. The GQA paper finds quality close to
# multi-head attention at a speed close to multi-query attention.
#
# Which query heads share? HF's Llama (`repeat_kv`) gives each group of **consecutive** query
# heads one key/value head: query heads $0 \dots g-1$ read key/value head 0, the next $g$ read
# head 1, and so on. A checkpoint's weights were trained with that pairing; another pairing is
# another model.
#
# ### Exercise: `expand_kv`
#
# `expand_kv(kv, group_size)` takes keys or values `[batch, n_kv_heads, pos, d_head]` and
# returns `[batch, n_kv_heads * group_size, pos, d_head]`, each key/value head repeated for the
# query heads of its group.
#
# Common mistake: the copies in the wrong order, $[k_0, k_1, k_0, k_1, \dots]$ instead of
# $[k_0, k_0, k_0, k_1, k_1, k_1]$: query head 1 then reads key/value head 1, which belongs to
# the second group. The tests compare your function with HF's `repeat_kv` for 2 key/value heads
# in groups of 3, and at both ends (groups of 1, one key/value head for all).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Repeat along the heads axis (axis 1), keeping each head's copies next to each other.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `Tensor.repeat` tiles the whole axis, `Tensor.repeat_interleave` repeats each element in
# place. Which order does HF's `repeat_kv` produce? Try both on `torch.arange(2)` first.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("expand_kv")`.
#
# </details>

# %% tags=["exercise"] exercise="expand_kv"
# solution: solutions.gqa.expand_kv

# %%
check("expand_kv")

# %% [markdown]
# Which key/value head each query head reads, as your `expand_kv` has it (each key/value head
# replaced by its number, then expanded):

# %%
from utils.plots import plot_kv_groups

kv_numbers = torch.arange(cfg.n_kv_heads, dtype=torch.float32).reshape(1, -1, 1, 1)
reads = expand_kv(kv_numbers, cfg.group_size).flatten().long().tolist()
print("query head -> key/value head:", dict(enumerate(reads)))
plot_kv_groups(
    reads, cfg.n_kv_heads, f"{LLAMA}: {cfg.n_heads} query heads, {cfg.n_kv_heads} key/value heads"
)

# %% [markdown]
# `expand_kv` makes the sharing plain to see, and HF's eager attention does the same
# (`repeat_kv`), but it copies: the expanded keys and values take the bytes of a key/value head
# for every query head, for as long as the attention runs. The attention function can read the
# shared heads in place instead: `F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`
# takes `k` and `v` with `n_kv_heads` heads and lets each group of query heads read its own.
# Chapter 8's engine reads its paged cache that way.
#
# ### Exercise: `GroupedQueryAttention`
#
# Two methods, with the given `forward` calling both:
#
# - `rotated_qkv(x, positions)`: the queries `[batch, n_heads, posn, d_head]`, keys and values
#   `[batch, n_kv_heads, posn, d_head]` of `x` `[batch, posn, d_model]`, heads first, with the
#   queries and keys turned by `positions` `[batch, posn]` (your `rope_cos_sin` and
#   `apply_rope`, with `self.cfg.d_head` and `self.cfg.rope_theta`). `W_Q` is
#   `[n_heads, d_model, d_head]`; `W_K` and `W_V` are `[n_kv_heads, d_model, d_head]`. There are
#   no biases.
# - `attend(q, keys, values, allowed)`: chapter 4's attention with the key/value heads expanded
#   for their groups. `keys` and `values` may be longer than `q` (a cache, in section 7);
#   `allowed` is `True` where a query may read a key, or `None` for all. It returns
#   `[batch, new, d_model]`: each head's output through its own `W_O` `[n_heads, d_head,
#   d_model]`, summed over the heads.
#
# Common mistakes: rotating the values, or forgetting the keys; rotating after the scores
# (there is nothing left to rotate: the scores must be computed from rotated queries and keys);
# scaling the scores by $1/\sqrt{d_\text{model}}$ instead of $1/\sqrt{d_\text{head}}$; expanding
# keys and values in the wrong order (that is `expand_kv`'s test's business, but it shows
# here too); a causal mask of your own (`is_causal=True`) in place of `allowed`, which the
# given `forward` cannot tell apart but a cache can.
#
# The tests compare `rotated_qkv`'s three tensors with HF's `LlamaAttention`'s projections
# rotated by HF's `apply_rotary_pos_emb`, and `forward` with HF's `LlamaAttention` (eager, causal
# mask) on the same weights: the shipped model's first layer with positions starting at 3, and
# random layers with 6 query heads and 6, 2 and 1 key/value heads at $\theta$ = 500,000. One
# more calls `attend` alone as the cache of section 7 will: two new queries, seven keys, and an
# `allowed` with padding and a key hidden from one query, against HF's
# `eager_attention_forward` with the same mask. The layer also runs in bfloat16 (every tensor
# keeps that dtype), `rotated_qkv` is called twice with different positions (each call turns by
# its own), and the tests read `rotated_qkv` and `attend` for a tensor made without a device.
#
# <details><summary>Hint 1: a nudge</summary>
#
# `rotated_qkv` is chapter 4's projection (heads first) plus two calls of `apply_rope`;
# `attend` is chapter 4's `F.scaled_dot_product_attention` call on expanded keys and values,
# then chapter 1's output projection.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `rotated_qkv`: project the input with each of `W_Q`, `W_K` and `W_V`, straight into the
#   heads-first layout `[batch, heads, posn, d_head]`; an `einops.einsum` that names the axes
#   can put the heads in front (chapter 4 did the same). Compute the cosines and sines once,
#   from the positions with the config's head size and $\theta$; turn the queries and the
#   keys, not the values.
# - `attend`: expand the keys and the values with your `expand_kv`, by the config's group size
#   (the query heads per key/value head). Then chapter 4's call of
#   `F.scaled_dot_product_attention`, with `allowed` as its attention mask; its default scale
#   is the right one. Its output is `[batch, n_heads, new, d_head]`, and `W_O` is
#   `[n_heads, d_head, d_model]`: the output projection sums over two axes, the heads and
#   `d_head`. An einsum that names them does it in one call.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("GroupedQueryAttention")`.
#
# </details>

# %% tags=["exercise"] exercise="gqa"
# solution: solutions.gqa.GroupedQueryAttention

# %%
check("gqa")

# %% [markdown]
# ## 6. The whole model (30 minutes)
#
# GPT-2's model with the new parts: token embeddings and **no** position embedding, a stack of
# `LlamaBlock`s (RMSNorm, attention with positions, RMSNorm, SwiGLU, each added to the residual
# stream), a final RMSNorm, and the unembedding, tied to the embedding as in chapter 2 (a model
# with untied embeddings has its own, given here):

# %% tags=["source"]
# solution: solutions.llama.LlamaUnembed

# %% [markdown]
# ### Exercise: `LlamaBlock` and `LlamaTransformer`
#
# - `LlamaBlock.forward(resid_pre, positions)`: chapter 1's pre-norm block, with the positions
#   handed to the attention.
# - `LlamaTransformer.forward(tokens)`: logits `[batch, posn, d_vocab]` for tokens
#   `[batch, posn]` (the given lines check them). The positions are $0, 1, \dots$ for every row,
#   `[batch, posn]` on the tokens' device.
#
# Common mistakes: the MLP's norm reading the residual stream from before the attention was
# added; no final norm; the two norms swapped; the block's output added to the residual
# stream again in the model (the block already returns the whole stream); logits made from
# `W_E` by hand instead of `self.unembed`, which is wrong for an untied model; the positions
# made on the CPU (`torch.arange` without `device=`); positions `[posn]` instead of
# `[batch, posn]`.
#
# The tests compare your logits with HF's `LlamaForCausalLM` on the shipped weights (a batch of
# two texts, and one position alone), on a random untied model at $\theta$ = 500,000 with
# RMSNorm weights far from 1 (an unembedding of your own, made from `W_E`, shows there: use
# `self.unembed`), and with the shipped weights in bfloat16 against `LlamaForCausalLM` in
# bfloat16 (within twice the distance of HF's own bfloat16 logits from its float32 ones); they
# also read your two `forward`s' source for a tensor made without a device. Where the logits
# differ, the message says which part's output first departs from HF's.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Chapter 1's `TransformerBlock` and `DemoTransformer`, with positions made once, before the
# blocks, and handed to each.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Make the positions once, before the blocks: a range as long as the text, on the tokens'
# device, then given a row for every text without copying (`Tensor.expand`). The block reads
# the residual stream through `ln1` into the attention, with the positions, and adds what comes
# out to the residual stream; the MLP then reads that sum through `ln2`, and its output is added
# too. The model: the embeddings, each block in turn, the final norm, then `self.unembed`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("LlamaBlock")` and `show_solution("LlamaTransformer")`.
#
# </details>

# %% tags=["exercise"] exercise="llama"
# solution: solutions.llama.LlamaBlock
# solution: solutions.llama.LlamaTransformer

# %%
check("llama")

# %% [markdown]
# Your model, with the shipped weights loaded into it, against HF's `LlamaForCausalLM` on the
# same text:

# %%
from utils.convert import hf_to_llama

mine = LlamaTransformer(cfg, tie_embeddings=True)
mine.load_state_dict(hf_to_llama(hf_llama.state_dict(), cfg))
mine.eval()
ids = torch.tensor([tokenizer.encode("MACBETH.\nIs this a dagger which I see before me,")])
with torch.no_grad():
    gap = (mine(ids) - hf_llama(ids).logits).abs().max().item()
print(f"{ids.shape[1]} tokens: largest difference from LlamaForCausalLM's logits {gap:.1e}")

# %% tags=["claim"]
assert gap < 1e-4

# %% [markdown]
# **Predict, then run.** Two experiments on your model. (1) Shift every position by 100: the
# blocks get positions $100, 101, \dots$ instead of $0, 1, \dots$. (2) Read the query and key
# weights in the other layout: reorder each head's coordinates as if the checkpoint had been
# Meta's interleaved one. What happens to the logits and to the loss on the text?


# %%
def run_blocks(model, ids, positions):
    residual = model.embed(ids)
    for block in model.blocks:
        residual = block(residual, positions)
    return model.unembed(model.ln_final(residual))


def loss_of(logits, ids):
    return F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()


positions = torch.arange(ids.shape[1]).expand(ids.shape)
other_layout = LlamaTransformer(cfg, tie_embeddings=True).eval()
state = mine.state_dict()
back = torch.argsort(interleaved_to_half_split(cfg.d_head))  # half-split -> interleaved order
for name in state:
    if name.endswith(("attn.W_Q", "attn.W_K")):
        state[name] = state[name][..., back]
other_layout.load_state_dict(state)
with torch.no_grad():
    at_0 = run_blocks(mine, ids, positions)
    at_100 = run_blocks(mine, ids, positions + 100)
    wrong = run_blocks(other_layout, ids, positions)
shift_gap = (at_0 - at_100).abs().max().item()
print(f"(1) positions shifted by 100: largest change of the logits {shift_gap:.1e}")
print(f"    loss on the text: {loss_of(at_0, ids):.3f} -> {loss_of(at_100, ids):.3f}")
print(f"(2) the other layout: loss {loss_of(at_0, ids):.3f} -> {loss_of(wrong, ids):.3f}")

# %% tags=["claim"]
assert shift_gap < 1e-3, "section 6 says a shift of every position changes nothing"
assert loss_of(wrong, ids) > loss_of(at_0, ids), "section 6 says the wrong layout raises the loss"

# %% [markdown]
# (1) changes nothing but rounding: the scores depend on offsets only. (2) raises the loss:
# the same numbers, paired differently, are another model.
#
# ### The two models side by side
#
# Both were trained by `course train` with the same recipe; each folder's `metrics.json` holds
# the held-out loss (three plays the training never saw). The cell reads and prints them.

# %%
table = Table(title="held-out loss (Macbeth, Twelfth Night, Henry V)")
for column in ["model", "parameters", "steps", "nats per token", "bits per character"]:
    table.add_column(column, justify="left" if column == "model" else "right")
metrics = {}
for name in (GPT2, LLAMA):
    metrics[name] = json.loads((model_dir(name) / "metrics.json").read_text(encoding="utf-8"))
    m = metrics[name]
    loss, bits = m["val_loss_nats_per_token"], m["val_bits_per_char"]
    table.add_row(name, f"{m['n_parameters']:,}", str(m["training"]["n_steps"]), f"{loss:.4f}",
                  f"{bits:.3f}")  # fmt: skip
Console().print(table)

# %% [markdown]
# Read the two losses as one run of each, at 2.6 million parameters: the course has not
# measured how far another seed would move either, so a small gap is no ranking. What today's
# block gives for certain is structural: a cache a third of the size (next section), positions
# that are not a table of `n_ctx` learned rows, and no parameters spent on biases.
#
# ## 7. The KV cache for today's model (45 minutes)
#
# Chapter 4's cache, with two changes.
#
# **Fewer heads.** The cache holds `n_kv_heads` key/value heads per layer, not `n_heads`:
# `[batch, n_kv_heads, pos, d_head]`. `KeyValueCache.new_empty` reads `n_kv_heads` from the
# config (`Config.n_kv_heads` is `n_heads` for GPT-2).
#
# **Rotated keys.** A key is turned once, by its own position, when it is computed, and cached
# as turned. Each new query is turned by its own position, so every score in a later step
# sees the right offset. Two consequences:
#
# - the new positions' angles come from where they sit in their row: after the cached
#   positions, and counting real tokens only in a left-padded batch, which is exactly chapter
#   4's `positions_and_allowed` (the given lines compute `positions` `[batch, new]` and
#   `allowed` with it). Chapter 6's lookahead decoding passes positions of its own instead,
#   one layout for the whole batch: `positions` `[new]` and `allowed` `[new, past + new]`;
# - caching the keys *before* rotation would force rotating every cached key again at every
#   step; caching them rotated by the wrong angles (from 0 again after the prefill, say) gives
#   wrong scores for every cached position.
#
# ### Exercise: `llama_forward_with_cache`
#
# Chapter 4's `forward_with_cache` contract: the new tokens `[batch, new]` and the cache of
# everything before them in; their logits and the longer cache out. The given lines check the
# arguments and compute `positions` and `allowed`; the given lines after your part build the
# new cache from your lists `keys` and `values` (one tensor per layer, `[batch, n_kv_heads,
# past + new, d_head]`) and `logits`. In between, your part: the embeddings (no positions
# added), and for each block its attention on its `ln1` through `rotated_qkv` and `attend`
# with the cached keys and values in front of the new ones, then its MLP.
#
# Common mistakes: angles from 0 again after the prefill (positions made afresh for the new
# tokens in place of the given ones: the prefill is right, the first step after it is not);
# the given positions used as they come, which works for `[batch, new]` and fails for
# lookahead's `[new]`; caching keys before rotation; appending the new keys before the cached
# ones, or along another axis than the positions'; lists that start with the old cache's
# tensors (the new cache must hold one tensor per layer); logits made from `W_E` by hand
# instead of `model.unembed`; a tensor made on the CPU.
#
# One slip that chapter 4's model punished changes no logits here: positions counted over a
# row's padding, or from 1, shift every query and key of that row alike, and by section 3's
# property the scores, hence the logits, do not change (padding is never read). The logits
# cannot see it; the cached keys can. The given positions count real tokens only, as HF's
# `generate` does, so that your cached keys are the keys HF's cache would hold, and the tests
# compare them: keys turned by positions from 1 are each one position too far.
#
# The tests compare your logits with HF's `LlamaForCausalLM` on the whole text: a prefill then
# single steps, chunks of several tokens, and a left-padded batch whose rows must each give
# what HF gives for that row alone; they compare the first layer's cached keys with HF's
# rotated keys at every position, the padded batch's included (and, to name a failure, its
# values with HF's), and run the shipped model in bfloat16 (the cache keeps that dtype). One more
# calls your function as chapter 6's lookahead does, on a random untied model: two branches of
# three tokens after a cached prompt, with positions `[new]` and an `allowed` that lets each
# branch read the prompt and itself, against HF on the prompt followed by each branch. And they
# read your code for a tensor made without a device.
#
# <details><summary>Hint 1: a nudge</summary>
#
# It is `LlamaTransformer.forward` with chapter 4's cache: per block, the new rotated keys and
# values go after the cached ones, and the queries attend to all of them.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `positions` comes `[batch, new]` (chapter 4's callers) or `[new]` (chapter 6's lookahead) from
# the given lines: expanding it to the tokens' shape (`Tensor.expand`, as in section 6) makes
# it `[batch, new]` either way. Walk the blocks together with each layer's cached keys and
# values (`zip`). `torch.cat` along the positions axis (which of the four?) puts the new keys
# after the cached ones. Collect each layer's full keys and values in the lists `keys` and
# `values`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("llama_forward_with_cache")`.
#
# </details>

# %% tags=["exercise"] exercise="llama_cache"
# solution: solutions.llama_cache.llama_forward_with_cache

# %%
check("llama_cache")

# %% [markdown]
# A prefill, then greedy steps, each against the uncached model on the whole text:

# %%
with torch.no_grad():
    text = torch.tensor([tokenizer.encode("ROMEO.\nBut soft, what light")])
    logits, cache = llama_forward_with_cache(llama_model, text)
    for _ in range(3 if QUICK else 8):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        text = torch.cat([text, next_token], dim=1)
        logits, cache = llama_forward_with_cache(llama_model, next_token, cache)
        gap = (logits[:, -1] - hf_llama(text).logits[:, -1]).abs().max().item()
        print(f"cache.length {cache.length:2}, keys[0] {tuple(cache.keys[0].shape)}, "
              f"largest gap to HF on the whole text {gap:.1e}")  # fmt: skip
print(repr(tokenizer.decode(text[0])))

# %% [markdown]
# ### What GQA saves
#
# **Predict, then run.** Both shipped models have 4 layers, heads of 32 and the same text. How
# many bytes does each cache take per token? The cell measures the tensors of a real cache of
# each model (chapter 4's `forward_with_cache` for the GPT-2 model).

# %%
from solutions.cached_model import forward_with_cache


def bytes_per_token(cache: KeyValueCache) -> float:
    stored = sum(t.nbytes for t in (*cache.keys, *cache.values))
    return stored / (cache.batch * cache.length)


prompt = torch.tensor([tokenizer.encode("KING HENRY.\nOnce more unto the breach, dear friends")])
with torch.no_grad():
    _, gpt2_cache = forward_with_cache(gpt2_model, prompt)
    _, llama_cache = llama_forward_with_cache(llama_model, prompt)
per_token = {GPT2: bytes_per_token(gpt2_cache), LLAMA: bytes_per_token(llama_cache)}
for name, n in per_token.items():
    print(f"{name:18} {n:,.0f} bytes per token (float32)")
saving = per_token[GPT2] / per_token[LLAMA]
print(f"saving: {saving:.1f} times = n_heads / n_kv_heads = {cfg.n_heads} / {cfg.n_kv_heads}")

# %% tags=["claim"]
assert saving == cfg.n_heads / cfg.n_kv_heads == 3
assert per_token[GPT2] == 2 * 4 * 6 * 32 * 4 == 6144 and per_token[LLAMA] == 2048
assert per_token[LLAMA] * 8 * 256 == 4 * 2**20, "check your understanding: 4 MiB"
assert per_token[GPT2] * 8 * 256 == 12 * 2**20, "check your understanding: 12 MiB"

# %% [markdown]
# At equal layers and head size the saving is `n_heads / n_kv_heads`: 3 for the shipped
# models, 6,144 bytes per token against 2,048. At SmolLM2-135M's sizes (`LlamaConfig()`'s
# defaults: 30 layers, 9 query heads and 3 key/value heads of 64) in bfloat16:

# %%
smol = LlamaConfig()
smol_gqa = 2 * smol.n_layers * smol.n_kv_heads * smol.d_head * 2
smol_mha = 2 * smol.n_layers * smol.n_heads * smol.d_head * 2
print(f"SmolLM2-135M: {smol_gqa:,} bytes per token; with a key/value head per query head, "
      f"{smol_mha:,}")  # fmt: skip
print(f"8,192 tokens: {smol_gqa * 8192 / 2**20:.0f} MiB against {smol_mha * 8192 / 2**20:.0f} MiB")

# %% [markdown]
# ## Check your understanding
#
# - Why can RMSNorm drop LayerNorm's bias as well as its mean?
#
# <details><summary>Answer</summary>
#
# A bias adds the same vector at every position after the normalisation: it normalises
# nothing. What keeps the layers' inputs on one scale is the division, and RMSNorm keeps it;
# the mean is the part the RMSNorm paper hypothesised LayerNorm can do without, and it reports
# performance comparable to LayerNorm's. Llama drops the biases of every layer, not only the
# norms'.
#
# </details>
#
# - A key at position 7 is cached. Six steps later a query at position 13 reads it. Which
#   angles do the two carry, and which angle does their score see?
#
# <details><summary>Answer</summary>
#
# The key carries the angles of position 7, given once when it was computed; the query those of
# position 13. Each pair's score sees the difference, the angles of offset 6, the same as for a
# key at 0 and a query at 6.
#
# </details>
#
# - Why would a model whose positions start at 1 give the same logits as one whose positions
#   start at 0, and where would mixing the two show?
#
# <details><summary>Answer</summary>
#
# Every score depends only on the offset between a query and a key, and shifting all positions
# by 1 keeps every offset. Mixing shows when cached keys were turned under one rule and the new
# query under another: a prefill from 0 and steps from 1 put every cached key one position too
# far from the query.
#
# </details>
#
# - In chapter 4, a left-padded row whose positions counted its padding got other logits from
#   the GPT-2 model. Why does the Llama model give the same logits either way?
#
# <details><summary>Answer</summary>
#
# GPT-2 adds a learned vector per absolute position: a row shifted by its padding reads other
# rows of `W_pos`, which it was never trained to read there. RoPE only ever sees the offset
# between a query and a key, and a shift of the whole row keeps every offset; the padding's
# keys are masked, so they never enter a score.
#
# </details>
#
# - HF's conversion script reorders the rows of `wq` and `wk` but not of `wv`. Why not `wv`?
#
# <details><summary>Answer</summary>
#
# Values are never rotated: their coordinates are not paired, so the order they are in is the
# one the output projection was trained with. Reordering them would also need the matching
# reordering of `wo`'s columns, for nothing.
#
# </details>
#
# - Multi-query attention saves more cache than GQA with 2 key/value heads. Why doesn't every
#   model use it?
#
# <details><summary>Answer</summary>
#
# One key/value head for all query heads costs quality: every head must attend with the same
# keys and read the same values. The GQA paper reports that a few key/value heads recover
# quality close to multi-head attention at a speed close to multi-query attention.
#
# </details>
#
# - For the shipped Llama model, how many bytes does the cache of a batch of 8 full contexts
#   (256 tokens) take, in float32?
#
# <details><summary>Answer</summary>
#
# $2 \times 4 \times 2 \times 32 \times 4 = 2{,}048$ bytes per token, times $8 \times 256$:
# 4 MiB (the GPT-2 model: 12 MiB).
#
# </details>
#
# ## Further reading
#
# - Zhang & Sennrich, *Root Mean Square Layer Normalization*, NeurIPS 2019 (arXiv:1910.07467).
# - Su et al., *RoFormer: Enhanced Transformer with Rotary Position Embedding*, 2021
#   (arXiv:2104.09864).
# - Shazeer, *GLU Variants Improve Transformer*, 2020 (arXiv:2002.05202).
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need*, 2019
#   (arXiv:1911.02150): multi-query attention. Ainslie et al., *GQA: Training Generalized
#   Multi-Query Transformer Models from Multi-Head Checkpoints*, 2023 (arXiv:2305.13245).
# - Touvron et al., *LLaMA: Open and Efficient Foundation Language Models*, 2023
#   (arXiv:2302.13971): pre-normalisation with RMSNorm, SwiGLU at $\frac23 4d$, rotary
#   embeddings at every layer.
# - Hugging Face transformers 5.24, `src/transformers/models/llama/modeling_llama.py`:
#   `LlamaRMSNorm`, `LlamaRotaryEmbedding`, `rotate_half`, `apply_rotary_pos_emb`, `LlamaMLP`,
#   `repeat_kv`, `LlamaAttention`; and, in the GitHub repository only (the pip package leaves
#   conversion scripts out), `src/transformers/models/llama/convert_llama_weights_to_hf.py` (the
#   `permute` of `wq` and `wk`).
#
# ## What's next
#
# **Chapter 8** serves many requests at once: a scheduler, a block pool for the cache, and an
# engine behind the OpenAI API. It runs on either shipped model; with the Llama model, every
# cache block holds a third of the bytes.
