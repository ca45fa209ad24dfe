# %% [markdown]
# # Chapter 1 — Build GPT-2 from its parts
#
# In this chapter you write a GPT-2 style transformer, `DemoTransformer`, one layer at a time:
# token and position embeddings, LayerNorm, causal multi-head attention, the MLP, the
# transformer block, the unembedding, and finally the whole model. When you are done, your
# model produces **the same logits**, up to float32 rounding, as Hugging Face's
# `GPT2LMHeadModel` when it is given the same weights. Along the way you compare each layer with
# the same HF model's intermediate activations, which `transformer-lens` records: its bridge runs
# HF's own modules with hooks attached, so it is one reference seen layer by layer, not a second
# implementation.
#
# Nothing here is magic, and nothing is hidden behind `nn.Linear` or
# `nn.MultiheadAttention`: every matrix product is one you write. By the end you should be able
# to draw the model from memory and say what shape every tensor has at every step. What the
# chapter says about GPT-2 and the libraries it uses names its sources at the end.
#
# **Time:** about 3–4 hours. **You need:** PyTorch tensors, broadcasting and `nn.Module`.
# Knowing `einops` helps; there is a short refresher below.
#
# ## How this notebook works
#
# - Each **exercise cell** already contains a function or a class, with everything but your
#   part written for you (a class's `__init__` included). Wherever you see
#   `raise NotImplementedError()`, replace it with your code.
#   Keep the parameter names as they are: the reference weights are loaded by name.
# - Run the exercise cell, then the cell below it, `check("layernorm")` for example. It runs the
#   graded tests for that exercise against what this notebook defines *right now* and prints
#   ✓ or ✗, with the failing test and, most of the time, the likely mistake.
# - From a terminal, `pytest -m layernorm` runs the same tests on your **saved** notebook,
#   and `course grade` (or `course grade 1` for this chapter only) prints a table of every
#   exercise. Save the notebook first: the terminal reads the file, not your running kernel.
# - **Stuck?** `show_solution("LayerNorm")` in a cell (or `course solution LayerNorm` in a
#   terminal) prints the reference code; it is also each exercise's third hint. Give yourself
#   a real attempt first, 10–15 minutes with hints 1 and 2 open: you learn far more from
#   writing the code than from reading it. If you do peek, close it and write your version
#   from memory.
# - Broke the notebook beyond repair? `course reset 01` gives you a fresh one and keeps a
#   backup of yours.
#
# Run the setup cell below first.

# %% tags=["setup"]
import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions import checks
from solutions.config import Config
from solutions.mlp import gelu_new
from utils.check import check
from utils.display import show_solution

# %% [markdown]
# ## The reference model
#
# To know that your code is right we compare it with a reference: one GPT-2 checkpoint, loaded
# once and seen three ways. `reference.hf_model` is the Hugging Face `GPT2LMHeadModel`;
# `reference.bridge` wraps that same model in `transformer-lens`, which lets us read every
# intermediate activation; `reference.params` holds its weights under the names *your* modules
# use.
#
# **About this model.** It is not OpenAI's GPT-2 but the course's own: a small model with
# GPT-2's architecture (4 layers, a residual stream 192 wide, a context of 256 tokens, a
# vocabulary of 4,096 tokens) that the course trained on Shakespeare's plays with the code you
# will write in chapter 2. It ships with the course, so everything here runs offline in
# seconds. What we check in this chapter is that your code computes *exactly* what GPT-2's
# architecture computes; a model that has learnt something makes the demos worth reading.
# (`load_model("gpt2")` gives you the real GPT-2 small when you are online.)

# %%
from utils.models import load_reference, load_weights, params_under

reference = load_reference()
tokenizer = reference.tokenizer
cfg = reference.cfg
print(cfg)

# %% [markdown]
# ## 1. Tokens: what the model actually reads
#
# A language model never sees characters. Text is first cut into **tokens**, pieces drawn
# from a fixed vocabulary, and each token is replaced by its integer **id**. The model reads
# a sequence of ids and, at every position, outputs a score for every token in the vocabulary:
# how likely that token is to come *next*.
#
# GPT-2 uses **byte-level BPE** (byte-pair encoding), and so does the course's tokenizer:
#
# - The vocabulary starts with the 256 possible bytes, so *any* string can be encoded: there
#   is no "unknown word".
# - Training repeatedly finds the most frequent pair of adjacent tokens in a corpus and merges
#   it into a new token. GPT-2's tokenizer holds 50,000 merges: 256 bytes + 50,000 merges + 1
#   special token = 50,257 tokens. Frequent words end up as a single token; rare words are
#   spelled from several pieces.
# - Before merging, text is split into words that **carry their leading space**, so a word is
#   encoded differently with and without a space in front of it. In GPT-2's vocabulary
#   `"Hello"` and `" Hello"` are two different tokens (ids 15496 and 18435). In ours, `"the"`
#   and `" the"` are two different tokens (`the` and `Ġthe`), and a word our vocabulary lacks
#   is spelled from pieces whose first one carries the space: `" model"` is `Ġmod` + `el`,
#   while `"model"` is `m` + `od` + `el`. Capitals make a difference too.
#
# Inside the vocabulary, bytes that are awkward to print are shown as stand-in characters:
# a space is `Ġ`, a newline is `Ċ`. `tokenizer.convert_ids_to_tokens` shows you these raw
# vocabulary entries; `tokenizer.decode` turns ids back into real text.
#
# Our tokenizer learnt about 3,800 merges from the plays the model was trained on (GPT-2's
# learnt 50,000), so common words of the plays are single tokens and modern words break into
# pieces. Run the cell and look at how the words break.

# %%
text = "A language model predicts the next token. Wherefore art thou Romeo?"
ids = tokenizer.encode(text)
print("ids:           ", ids)
print("vocab entries: ", tokenizer.convert_ids_to_tokens(ids))
print("decoded:       ", repr(tokenizer.decode(ids)))
print()
for word in ["the", " the", "model", " model", "Model", " Model", "\n"]:
    print(f"{word!r:10} -> {tokenizer.convert_ids_to_tokens(tokenizer.encode(word))}")

# %% tags=["claim"]
assert {
    w: tokenizer.convert_ids_to_tokens(tokenizer.encode(w))
    for w in ["the", " the", "model", " model", "\n"]
} == {
    "the": ["the"],
    " the": ["Ġthe"],
    "model": ["m", "od", "el"],
    " model": ["Ġmod", "el"],
    "\n": ["Ċ"],
}, "section 1 quotes these splits: re-run the cell above and fix the prose"
assert len(tokenizer) == 4096 and round(len(tokenizer) - 256 - 1, -2) == 3800, (
    "section 1 says about 3,800 merges (4,096 tokens = 256 bytes + merges + <|endoftext|>)"
)

# %% [markdown]
# There is one **special token**, `<|endoftext|>`. It marks the boundary between documents
# during training (the course's training text puts one after every play). It also serves as
# a "beginning of sequence" token: GPT-2's tokenizer names it both `eos_token` and `bos_token`,
# and so does ours, and OpenAI's GPT-2 code starts its unconditional samples from it. The
# course's own code does not put it in front of a prompt: `tokenizer.encode(text)` gives only
# the text's tokens (with or without `add_special_tokens=False`), and that is how every prompt
# of the later chapters is encoded. The one exception is the reference model's `to_tokens`, below,
# which prepends `<|endoftext|>` by default.

# %%
print(tokenizer.eos_token, "has id", tokenizer.eos_token_id)

# %% [markdown]
# ### Exercise: `token_strings`
#
# Write `token_strings(tokenizer, text)`: the list of the strings of `text`'s tokens, in order,
# written as real text (a space, not `Ġ`). What the tests check:
#
# - one string per token of `tokenizer.encode(text, add_special_tokens=False)`: no special
#   token, and tokens, not characters;
# - `"".join(token_strings(tokenizer, text)) == text`.
#
# This is the function you will reach for whenever you want to *see* what the model sees.
#
# <details><summary>Hint 1: a nudge</summary>
#
# You want the text each token stands for, one token at a time. The trap is the tokenizer's raw
# vocabulary entries, which show a space as `Ġ`: they are not the text.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Two steps. First the ids, exactly as the spec above names them: a list of ints, no special
# token. Then the text of each id *on its own*. `tokenizer.decode` turns a list of ids into one
# string (in HF transformers 5.24 a single int works too): what do you get if you hand it all
# the ids at once, and what if you hand it one at a time? `convert_ids_to_tokens` is not the
# answer: it returns the raw `Ġ` forms.
# The result is a plain Python list of strings, one per id.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("token_strings")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>
#
# *Aside.* Decoding token by token only rebuilds the text when no token boundary falls inside
# a character. An emoji such as 😀 is 4 bytes in UTF-8 and may be split over several tokens,
# and each piece decodes to `�` on its own. The tests use plain ASCII text.

# %% tags=["exercise"] exercise="token_strings"
# solution: solutions.tokens.token_strings

# %%
check("token_strings")

# %% [markdown]
# Once your function passes, see how a sentence is cut up:

# %%
print(token_strings(tokenizer, "Tokens, not characters: that is what a model reads."))

# %% [markdown]
# ## 2. The big picture
#
# Here is all of GPT-2, read from the bottom up: tokens in, one vector of scores per position
# out. Each block holds an attention layer and then an MLP; each of the two reads a LayerNorm
# of the stream and adds its output back (section 7 writes the block's equations).

# %%
from utils.plots import plot_transformer_diagram

plot_transformer_diagram(n_layers=2)

# %% [markdown]
# The central object is the **residual stream**: one vector of width `d_model` per position.
# The embeddings write its first value. Each block then *reads* from it (through a LayerNorm)
# and *adds* its result back, never replacing it. So the final stream is a sum:
#
# $$x_{\text{final}} = \text{token emb} + \text{pos emb}
#   + \sum_{\text{layers}} \left(\text{attn out} + \text{mlp out}\right)$$
#
# Two kinds of layers write into it:
#
# - **Attention** is the *only* place where information moves between positions. Each
#   position gathers information from itself and from earlier positions.
# - The **MLP** works on every position separately, the same small network at each position.
#
# At the end, the stream at each position is turned into `d_vocab` logits: scores for the
# *next* token. Position `i` predicts token `i + 1`, so one forward pass trains on (or
# predicts at) every position at once.
#
# ### Shapes and the `Config`
#
# Every module takes a `Config` and reads its sizes from it. You will see these names in
# every type annotation:
#
# | name | `Config` field | meaning | GPT-2 small |
# |---|---|---|---|
# | `batch` | | number of sequences processed together | any |
# | `posn` | (at most `n_ctx`) | number of tokens in each sequence | up to 1024 |
# | `d_model` | `d_model` | width of the residual stream | 768 |
# | `d_vocab` | `d_vocab` | number of tokens in the vocabulary | 50,257 |
# | | `n_ctx` | longest sequence: the number of learned positions | 1024 |
# | `n_heads` | `n_heads` | attention heads per layer | 12 |
# | `d_head` | `d_head` | width of one head's queries, keys and values | 64 |
# | `d_mlp` | `d_mlp` | hidden width of the MLP (4 × `d_model`) | 3072 |
# | | `n_layers` | number of transformer blocks | 12 |
# | | `layer_norm_eps` | the ε of LayerNorm | 1e-5 |
# | | `init_range` | std of the random initial weights | 0.02 |
#
# `Config()` with no arguments *is* GPT-2 small. The course's model uses the same fields with
# smaller numbers (printed above). In GPT-2 `n_heads * d_head == d_model`, but nothing in
# the code needs that.
#
# ### Naming: why the weights load
#
# The names of modules and parameters follow `transformer-lens`: `embed.W_E`,
# `blocks.0.ln1.w`, `blocks.0.attn.W_Q`, `blocks.1.mlp.b_out`, `unembed.W_U`... Because your
# modules use the same names and shapes, copying the reference weights into your model is a
# loop over `named_parameters()` (that is what `load_weights` does, after checking that every
# name and shape matches). Here are the reference weights: those outside the blocks, and one
# block's (every block has the same names and shapes, under `blocks.0.` to `blocks.3.`).

# %%
for name, param in reference.params.items():
    if not name.startswith("blocks.") or name.startswith("blocks.0."):
        print(f"{name:24} {tuple(param.shape)}")
n_blocks_params = sum(name.startswith("blocks.") for name in reference.params)
print(f"... and the same {n_blocks_params // cfg.n_layers} weights in each of the other blocks")

# %% [markdown]
# Note the convention: activations are multiplied **on the left**, `x @ W`. So `W_in` has shape
# `[d_model, d_mlp]` (input dimension first), the transpose of `nn.Linear.weight`. The
# attention weights keep a separate `n_heads` dimension rather than one big matrix.
#
# ### Peeking inside the reference
#
# `reference.bridge.run_with_cache(tokens)` runs the reference model and records every
# intermediate activation in `cache`, keyed by hook names. We will compare your layers with
# these activations: feed your layer the reference's input, compare with the reference's
# output. (`to_tokens` puts `<|endoftext|>` in front of the prompt.)

# %%
prompt = "MACBETH.\nIs this a dagger which I see before"
tokens = reference.bridge.to_tokens(prompt)
print(reference.bridge.to_str_tokens(tokens))

with torch.no_grad():
    ref_logits, cache = reference.bridge.run_with_cache(tokens)

for name in [
    "hook_embed",
    "hook_pos_embed",
    "blocks.0.hook_resid_pre",
    "blocks.0.ln1.hook_out",
    "blocks.0.attn.hook_pattern",
    "blocks.0.hook_attn_out",
    "blocks.0.hook_mlp_out",
    "blocks.0.hook_resid_post",
    "ln_final.hook_out",
]:
    print(f"{name:28} {tuple(cache[name].shape)}")
print(f"{'logits':28} {tuple(ref_logits.shape)}")

# One layer's weights: those under a prefix, named as the layer names its own parameters.
print(list(params_under(reference.params, "blocks.0.ln1.")))

# %% [markdown]
# ### A two-minute `einops` refresher
#
# `einops.einsum` multiplies tensors and sums over every dimension name that does not appear
# after the `->`. Names are words, separated by spaces, so the pattern documents itself.
# `einops.repeat` copies a tensor along a new dimension. The annotations you see in the cells,
# like `Float[Tensor, "batch posn d_model"]`, are `jaxtyping` documentation of shapes: they are
# not checked at run time, but they tell you exactly what to return.

# %%
a, b = torch.randn(2, 3), torch.randn(3, 4)
same = einops.einsum(a, b, "i j, j k -> i k")  # a matrix product: j is summed over
print(torch.allclose(same, a @ b))

x = torch.randn(5, 2, 3)  # [posn, n_heads, d_head]
W = torch.randn(2, 3, 8)  # [n_heads, d_head, d_model]
out = einops.einsum(x, W, "posn n_heads d_head, n_heads d_head d_model -> posn d_model")
print(out.shape)  # n_heads and d_head were summed over

print(einops.repeat(torch.arange(4), "d -> batch d", batch=2))

# %% [markdown]
# ## 3. LayerNorm
#
# Every layer reads the residual stream through a **LayerNorm**. The stream is a running sum,
# so its size differs from position to position and from layer to layer; LayerNorm hands each
# layer a vector of a predictable size. For each position separately, it
#
# 1. subtracts the mean of the vector's `d_model` entries,
# 2. divides by their standard deviation,
# 3. scales and shifts each feature with the learned `w` and `b` (both of shape `[d_model]`).
#
# $$\mu = \frac{1}{d_{\text{model}}}\sum_i x_i, \qquad
#   \sigma^2 = \frac{1}{d_{\text{model}}}\sum_i (x_i - \mu)^2, \qquad
#   \operatorname{LN}(x) = \frac{x - \mu}{\sqrt{\sigma^2 + \varepsilon}} \odot w + b$$
#
# Input and output: `[batch, posn, d_model]`. The mean and variance are over the **last**
# dimension only. What the tests insist on, because it is what GPT-2 was trained with:
#
# - the **biased** variance: divide by `d_model`, not `d_model - 1`;
# - ε (`cfg.layer_norm_eps`) goes **inside** the square root: $\sqrt{\sigma^2 + \varepsilon}$,
#   not $\sigma + \varepsilon$. The two differ a lot on vectors with a tiny variance;
# - the input is **not modified in place**. The caller still needs the residual stream
#   after the LayerNorm (it adds the layer's output to it), so no `x -= ...` on the input.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Everything happens along the last dimension, for each position separately. The traps are the
# three details GPT-2 was trained with: the biased variance, ε inside the square root, and an
# input that is never modified in place.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The mean over `d_model`, one number per position. `Tensor.mean` takes a `dim` and a
#   `keepdim` flag: with the dimension kept the result is `[batch, posn, 1]`, and it broadcasts
#   back against `[batch, posn, d_model]`. (Without it you get `[batch, posn]`: which dimensions
#   would broadcasting line up then?) The centred values must be a *new* tensor, not the input
#   changed in place.
# - The variance over the same dimension, again `[batch, posn, 1]`: either the mean of the
#   squared centred values, or `Tensor.var`, which divides by `d_model - 1` unless you tell it
#   otherwise (look up its `correction` argument).
# - Divide the centred values by the square root of the variance plus `cfg.layer_norm_eps`.
# - Scale by `w` and shift by `b`: both are `[d_model]`. Do they need any reshaping to
#   broadcast against `[batch, posn, d_model]`?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("LayerNorm")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="layernorm"
# solution: solutions.layernorm.LayerNorm

# %%
check("layernorm")

# %% [markdown]
# `check` tells you pass or fail. You can also look for yourself, which is the best way to
# debug: load the weights of block 0's first LayerNorm into yours, feed it the residual stream
# the reference fed its own, and compare outputs. Run this once your `LayerNorm` passes.

# %%
ln1 = load_weights(LayerNorm(cfg), params_under(reference.params, "blocks.0.ln1."))
with torch.no_grad():
    ours = ln1(cache["blocks.0.hook_resid_pre"])
print("max |ours - reference| =", (ours - cache["blocks.0.ln1.hook_out"]).abs().max().item())

# Before `w` and `b`, every position has mean 0 and standard deviation 1 (a hair under 1,
# in fact: that is epsilon at work).
plain = LayerNorm(cfg)  # w = 1, b = 0
with torch.no_grad():
    normed = plain(cache["blocks.0.hook_resid_pre"])
print("means:", normed.mean(-1)[0, :4], "\nstds: ", normed.std(-1, unbiased=False)[0, :4])

# %% [markdown]
# ## 4. Embeddings
#
# ### Token embedding
#
# `W_E` has one row per vocabulary token: `[d_vocab, d_model]`. Embedding token `t` means
# taking row `t`. (Mathematically it is a one-hot vector times `W_E`; in code it is indexing,
# which is the same thing without building a `d_vocab`-wide vector.)
#
# `tokens` is `[batch, posn]` of integer ids; the result is `[batch, posn, d_model]`.
#
# ### Positional embedding
#
# Attention, as you will see, scores other positions by their *content* only. The causal mask
# gives it a little sense of order (a position sees only what came before it, so it could in
# principle count its predecessors), but nothing says directly how far back a word is, and
# without help the model would have a hard time telling "dog bites man" from "man bites dog".
# GPT-2 fixes this with a **learned** vector per position: `W_pos` is `[n_ctx, d_model]`, and
# row `i` is added to whatever token sits at position `i`. (This is also why GPT-2 cannot read
# more than `n_ctx` tokens: there is no row for position `n_ctx`.)
#
# `PosEmbed.forward` receives the same `tokens` as `Embed`, but the **ids do not matter**, only
# the shape: a sequence of length `posn` gets rows `0, 1, ..., posn - 1` of `W_pos`, and every
# sequence of the batch gets the same ones. The tests feed two different sequences and expect
# identical positional vectors.
#
# You write both `forward`s, in one cell.
#
# Common mistakes: a matrix product with a one-hot vector (right, but it builds a
# `d_vocab`-wide vector per token); indexing `W_pos` with the token ids instead of the
# positions; returning `[posn, d_model]` without the batch dimension.
#
# The tests compare both embeddings with the reference model's activations, `hook_embed` and
# `hook_pos_embed`, on a prompt, and feed `PosEmbed` two different sequences of one length.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Embedding token `t` means taking row `t` of `W_E`: no matrix product and no loop. For the
# positions, the ids do not matter, only how many there are: position `i` gets row `i` of
# `W_pos`, and every sequence of the batch gets the same rows.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `Embed`: indexing a tensor with an integer tensor picks rows, and the result has the
#   index's shape followed by the remaining dimensions. Here the index is `tokens`
#   `[batch, posn]` and the rows of `W_E` are `[d_model]` wide: `[batch, posn, d_model]`.
# - `PosEmbed`: `tokens.shape` gives you `batch` and the sequence length `posn`. Which rows of
#   `W_pos` does a sequence of length `posn` need? Together they are `[posn, d_model]`. Then
#   give them a new leading `batch` dimension, `[batch, posn, d_model]`: `einops.repeat` adds a
#   dimension that you name in the output side of its pattern and size with a keyword argument
#   (the refresher above has an example), and `Tensor.expand` does the same without copying.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("Embed")` and `show_solution("PosEmbed")` in a new
# cell print the reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="embed"
# solution: solutions.embed.Embed
# solution: solutions.embed.PosEmbed

# %%
check("embed")

# %% [markdown]
# With both embeddings you can build the first value of the residual stream yourself. Once
# `Embed` and `PosEmbed` pass, this should print a difference of (nearly) zero:

# %%
embed = load_weights(Embed(cfg), params_under(reference.params, "embed."))
pos_embed = load_weights(PosEmbed(cfg), params_under(reference.params, "pos_embed."))
with torch.no_grad():
    resid_pre = embed(tokens) + pos_embed(tokens)
diff = (resid_pre - cache["blocks.0.hook_resid_pre"]).abs().max().item()
print("max |ours - reference| =", diff)

# %% [markdown]
# ## 5. Attention
#
# Attention is how a position gathers information from other positions. It runs `n_heads`
# **heads** in parallel; each head independently decides where to look and what to copy.
#
# For each head $h$, each position computes three vectors of width `d_head` from its
# (normalised) residual vector $x$:
#
# - a **query** $q = x W_Q^h + b_Q^h$: "what am I looking for?"
# - a **key** $k = x W_K^h + b_K^h$: "what do I contain?"
# - a **value** $v = x W_V^h + b_V^h$: "what do I pass on if someone attends to me?"
#
# Then:
#
# 1. **Scores.** The query at position $i$ is compared with the key at every position $j$:
#    $A_{ij} = q_i \cdot k_j \,/\, \sqrt{d_{\text{head}}}$.
# 2. **Causal mask.** Position $i$ may only look at $j \le i$: scores with $j > i$ become $-\infty$.
# 3. **Pattern.** A softmax over the keys $j$ turns each row of scores into weights that sum to
#    1: the attention pattern.
# 4. **Mix.** $z_i = \sum_j \text{pattern}_{ij}\, v_j$: a weighted average of the values.
# 5. **Write out.** Each head maps its $z$ back to `d_model` with its own
#    $W_O^h$, the heads' results are **summed**, and $b_O$ is added once:
#    $\text{out}_i = \sum_h z^h_i W_O^h + b_O$.
#
# Shapes along the way:
#
# | tensor | shape |
# |---|---|
# | input `normalized_resid_pre` | `[batch, posn, d_model]` |
# | `W_Q`, `W_K`, `W_V` | `[n_heads, d_model, d_head]` |
# | `b_Q`, `b_K`, `b_V` | `[n_heads, d_head]` |
# | q, k, v | `[batch, posn, n_heads, d_head]` |
# | scores, pattern | `[batch, n_heads, query_pos, key_pos]` |
# | z | `[batch, posn, n_heads, d_head]` |
# | `W_O` | `[n_heads, d_head, d_model]` |
# | `b_O`, output | `[d_model]`, `[batch, posn, d_model]` |
#
# (Summing each head's $z^h W_O^h$ is the same as concatenating the heads' $z$ into one
# `n_heads * d_head` vector and multiplying by one big matrix, which is how the Hugging Face
# code does it. Keeping the heads separate makes each one easy to study on its own.)
#
# ### Why divide by $\sqrt{d_{\text{head}}}$?
#
# Take a query and a key whose `d_head` entries are all independent, each with mean 0 and
# variance 1. Their dot product is a sum of `d_head` terms of variance 1, so its variance is
# `d_head` (the argument of the Transformer paper, Vaswani et al. 2017). Unscaled, the scores
# of a wide head would be large, the softmax would put almost all its weight on one key, and
# its gradients would vanish. Dividing by $\sqrt{d_{\text{head}}}$ brings the variance back to
# about 1 whatever the head width. Divide by the square root, not by `d_head` itself.
#
# ### The causal mask
#
# A GPT is trained to predict the next token at *every* position at once. If position $i$
# could read position $i + 1$, it would simply copy the answer. So every score whose key comes
# **after** its query is replaced by `self.IGNORE`, a $-\infty$ stored on the module (as a
# buffer, so that it moves to the GPU with the module).
#
# - Why is $-\infty$ safe? $e^{-\infty} = 0$, so a masked key gets weight *exactly* 0 and the
#   other weights still sum to 1. That works as long as each row keeps at least one finite
#   score; a row of only $-\infty$ would be $0/0$ = `nan`. The diagonal guarantees this:
#   a token always **sees itself**. So mask strictly above the diagonal, never the diagonal
#   itself (if you build the mask with `torch.triu`, its `diagonal` argument decides that).
# - Apply the mask **before** the softmax, to the scores, not to the pattern.
#
# What the tests check: `apply_causal_mask` returns a new tensor of the same shape and leaves
# its input unchanged (`masked_fill`, not the in-place `masked_fill_`), leaves every score on
# and below the diagonal unchanged and sets every score above it to a large negative number
# (`self.IGNORE` is one). `forward` matches the reference's attention output on block 0's
# weights and biases, and changing the input at position 4 changes no earlier output but does
# change position 4's own. (No test can catch a forgotten `b_K`: it adds $q_i \cdot b_K$ to
# every score of row $i$, the same amount for every key, and a softmax ignores that. The
# other three biases change the output.)
#
# Write `apply_causal_mask` first (it is short), then `forward`, which calls it.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Write `apply_causal_mask` first: a boolean "key comes after query" matrix, and a *new* tensor
# with those scores replaced; the diagonal stays visible. Then `forward` follows the five steps
# above. Keep the dimension names straight: the softmax runs over the **keys**, the last
# dimension of the scores.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# **The mask.** The mask is a boolean matrix `[query_pos, key_pos]`, its sizes the last two of
# the scores' shape, made on the scores' device (the module may live on a GPU). One way:
# `torch.triu(m, diagonal=d)` keeps the entries of `m` where column $\ge$ row $+ d$ and zeroes
# the rest; applied to a boolean matrix of ones, which $d$ marks exactly the keys that come
# after their query? Check your answer on a 3 × 3 picture: row 0 must hide keys 1 and 2, and
# row 2 nothing. `Tensor.masked_fill` returns a new tensor with the marked entries replaced by
# a value (`masked_fill_` is its in-place twin), and a `[query_pos, key_pos]` mask broadcasts
# over batch and heads.
#
# **The forward pass**, with the input `[batch, posn, d_model]`. Each step below is one
# `einops.einsum`: write its pattern from the shapes of its two inputs and of the result (the
# refresher above shows how), and any dimension you leave out of the result is summed over.
#
# 1. q, k and v, each `[batch, posn, n_heads, d_head]`: the input with `W_Q` (`W_K`, `W_V`),
#    summing over `d_model`, plus the bias. Does a `[n_heads, d_head]` bias broadcast onto that
#    shape as it is?
# 2. Scores `[batch, n_heads, q_pos, k_pos]`: q with k, summing over `d_head`. Give the two
#    position axes different names (`q_pos`, `k_pos`): einsum treats two axes with the same name
#    as one axis.
# 3. Scale the scores as the section says, mask them, then softmax. Which dimension holds the
#    keys?
# 4. z `[batch, q_pos, n_heads, d_head]`: the pattern with v, summing over the keys. Which name
#    must v's position axis have here?
# 5. The output `[batch, q_pos, d_model]`: z with `W_O`, summing over both `n_heads` and
#    `d_head`, then add `b_O` once.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("Attention")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="attention"
# solution: solutions.attention.Attention

# %%
check("attention")

# %% [markdown]
# ### What an attention pattern looks like
#
# The cache holds every head's pattern. The cell below draws layer 3, head 0 of the reference on
# our prompt: row $i$ shows how much position $i$ (the query) attends to each position $j$ (the
# key). Trained models grow heads with striking patterns (to the previous token, to the first
# token, to an earlier copy of the current token), which is where interpretability research
# starts: afterwards, try other heads and layers (`cache["blocks.2.attn.hook_pattern"][0, 3]`)
# and see what you find.
#
# **Predict, then run.** Some facts about this picture follow from the code you just wrote,
# whatever the weights. Which cells must be zero? What must each row add up to? Where must the
# first row put its weight?
#
# <details><summary>What to expect</summary>
#
# Everything above the diagonal is zero: that is the causal mask (the cell prints 0.0 as the
# largest weight above it). Every row sums to 1: that is the softmax. The first row has only one
# key to choose from, so all its weight, 1.0, is on `<|endoftext|>`.
#
# The rest is what this head learnt, and on this prompt it is striking: almost every query
# puts nearly all its weight on the very first token, `<|endoftext|>` (the cell prints the
# average weight on it). Such an "attention sink" is common in trained transformers (Xiao et
# al. 2023): a head that has nothing useful to read at a position parks its attention on a
# token that is always there, and its output there is close to a constant. Layer 0, head 0 is
# close to the opposite: after the first few queries it spreads each row fairly evenly over
# everything the query can see (no key gets much more than a quarter of a row), nearly a
# running average of the text so far.
#
# </details>

# %%
from utils.plots import plot_attention

pattern = cache["blocks.3.attn.hook_pattern"][0, 0]  # [query_pos, key_pos]
print("row sums:", pattern.sum(-1)[:5])
print("largest weight above the diagonal:", pattern.triu(1).max().item())
print(f"mean weight on the first token: {pattern[:, 0].mean():.2f}")
plot_attention(pattern, reference.bridge.to_str_tokens(tokens), "Layer 3, head 0")

# %% tags=["claim"]
assert pattern.triu(1).max() == 0 and pattern[0, 0] == 1, "section 5: masked cells and first row"
assert pattern[:, 0].mean() > 0.9, "section 5 says nearly all the weight is on the first token"
assert cache["blocks.0.attn.hook_pattern"][0, 0, 5:].max() < 0.3, (
    "section 5 says layer 0, head 0 spreads its rows (after the first few) fairly evenly"
)

# %% [markdown]
# ## 6. The MLP
#
# After attention has moved information between positions, the **MLP** processes each
# position on its own: the same two-layer network, applied to every residual vector. It holds
# about two thirds of GPT-2's non-embedding parameters, and much of what a trained model
# "knows" seems to be stored in it (Geva et al. 2021; Meng et al. 2022).
#
# $$\text{MLP}(x) = \operatorname{GELU}(x W_{\text{in}} + b_{\text{in}})\, W_{\text{out}}
#   + b_{\text{out}}$$
#
# with `W_in` `[d_model, d_mlp]`, `b_in` `[d_mlp]`, `W_out` `[d_mlp, d_model]`, `b_out`
# `[d_model]`. The hidden layer is 4 times wider than the stream.
#
# The non-linearity is **GELU**, a smooth cousin of ReLU. GPT-2 was trained with its tanh
# approximation,
#
# $$\operatorname{GELU}(x) \approx \tfrac12\, x \left(1 + \tanh\!\left[\sqrt{2/\pi}\,
#   \left(x + 0.044715\, x^3\right)\right]\right),$$
#
# which the setup cell imported as `gelu_new` (it calls PyTorch's `F.gelu(x, approximate="tanh")`,
# the same formula in one fused operation). Use it: PyTorch's default `F.gelu` is the exact
# version, and the difference is large enough for the tests to notice (they will tell you).
# Here are the three curves, and the gap between the two GELUs:

# %%
from utils.plots import plot_gelu

plot_gelu()

# %% [markdown]
# Now write the `MLP`, with `gelu_new` between its two matrix products.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Two matrix products with the non-linearity between them, the same at every position. The trap
# is the GELU: GPT-2 uses the tanh approximation, `gelu_new`, not `F.gelu`'s default.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# No loop over positions: a `[batch, posn, d_model]` tensor times a 2-D matrix with `@`
# multiplies the last dimension by the matrix's first and keeps `[batch, posn]` in front (an
# `einops.einsum` can say the same). Follow the shapes: through `W_in` and its bias to
# `[batch, posn, d_mlp]`; `gelu_new` keeps the shape; through `W_out` and its bias back to
# `[batch, posn, d_model]`. Which of the two biases is added *before* the GELU?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("MLP")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="mlp"
# solution: solutions.mlp.MLP

# %%
check("mlp")

# %% [markdown]
# ## 7. The transformer block
#
# A block is one attention layer and one MLP, each reading the residual stream through its
# own LayerNorm and adding its output back. GPT-2 is a **pre-LN** transformer: the
# normalisation is applied to what each layer *reads*, never to the stream itself.
#
# $$x_{\text{mid}} = x_{\text{pre}} + \operatorname{Attn}(\operatorname{LN}_1(x_{\text{pre}}))$$
# $$x_{\text{post}} = x_{\text{mid}} + \operatorname{MLP}(\operatorname{LN}_2(x_{\text{mid}}))$$
#
# These two additions are the **residual connections**. They are why a gradient can flow
# straight from the loss to the first layer, and why each layer can be seen as making a small
# edit to a shared stream rather than rebuilding it.
#
# The tests check blocks 0 and 1 against the reference, and that `resid_pre` is left
# untouched (write `resid_pre + ...`, not `resid_pre += ...`).
#
# <details><summary>Hint 1: a nudge</summary>
#
# A block never replaces the residual stream: it *adds* to it, twice. Each layer reads its own
# LayerNorm of the stream, and the MLP reads the stream *after* attention's output has been
# added.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Read the two equations above from the inside out; the modules are `self.ln1`, `self.attn`,
# `self.ln2` and `self.mlp`, and every tensor is `[batch, posn, d_model]`. Which stream does
# each LayerNorm read: the block's input, or the stream after attention's output was added?
# And what is each layer's output added to? Every sum makes a new tensor; none changes
# `resid_pre` in place.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("TransformerBlock")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="block"
# solution: solutions.block.TransformerBlock

# %%
check("block")

# %% [markdown]
# ## 8. Unembedding
#
# The last step turns the final (normalised) residual vector at each position into one
# **logit** per vocabulary token: `[batch, posn, d_model] -> [batch, posn, d_vocab]`, with
# `W_U` of shape `[d_model, d_vocab]`. A softmax over the logits gives the model's probability
# for each possible next token.
#
# GPT-2 has no unembedding bias, but `transformer-lens` gives the unembedding a `b_U` anyway:
# the `HookedTransformer` of its earlier versions as a trainable parameter that starts at zero,
# the 4.3 bridge used here as a fixed zero vector for GPT-2. Our `Unembed` has one too, an
# ordinary parameter, and the reference's is all zeros. Add it anyway: a module should compute
# what its parameters say, whatever values they happen to hold.
# (GPT-2 also *ties* `W_U` to `W_E`: its unembedding is the transpose of its embedding, and so
# is the course model's. Our module keeps them as two parameters and `load_weights` simply
# copies whatever the checkpoint holds.)
#
# ## 9. The whole model
#
# Now assemble `DemoTransformer`: embed the tokens and their positions, add the two, run the
# residual stream through every block in order, apply the final LayerNorm `ln_final`, and
# unembed. `tokens [batch, posn] -> logits [batch, posn, d_vocab]`.
#
# The first lines of `forward` are already written: they reject tokens that are not an
# integer `[batch, posn]` tensor, sequences longer than `n_ctx`, and ids outside the
# vocabulary, with a readable `ValueError` instead of an obscure indexing error deep inside
# `Embed`. Keep them (a test checks them) and write your code below them.
#
# You write `Unembed.forward` (section 8) and `DemoTransformer.forward`, in one cell.
#
# Common mistakes: forgetting `b_U` (GPT-2's is zero, so only a model with a bias shows it);
# skipping `ln_final`; feeding every block the embeddings instead of the previous block's
# output; unembedding before the last block.
#
# The tests compare `Unembed` with the reference's logits from its final normalised residual
# stream, and with a random non-zero `b_U`; then your logits with the `transformer-lens`
# bridge on a prompt, and with the Hugging Face model on a batch of three full-length
# (`n_ctx`) random sequences.
#
# <details><summary>Hint 1: a nudge</summary>
#
# `Unembed` is one matrix product from `d_model` to `d_vocab` at every position, plus the bias,
# whatever its values. Then you have written every part: `DemoTransformer.forward` is the
# diagram of section 2 read from top to bottom. Keep the given checks at the top and write
# below them.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `Unembed`: `[batch, posn, d_model]` times `W_U` `[d_model, d_vocab]` is
# `[batch, posn, d_vocab]` (`@`, or an einsum); `b_U` is `[d_vocab]` and broadcasts when you add
# it.
#
# `DemoTransformer`: the residual stream starts as the sum of the two embeddings of `tokens`,
# `[batch, posn, d_model]`. `self.blocks` is an `nn.ModuleList`, which a `for` loop walks like
# a Python list. What does block 1 read: the embeddings, or block 0's output? Every block, and
# the final LayerNorm after them, keeps the shape `[batch, posn, d_model]`; the unembedding,
# last, turns it into `[batch, posn, d_vocab]`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("Unembed")` and `show_solution("DemoTransformer")` in
# a new cell print the reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="transformer"
# solution: solutions.unembed.Unembed
# solution: solutions.model.DemoTransformer

# %%
check("transformer")

# %% [markdown]
# ## 10. Putting it together
#
# You have written GPT-2. Let's load the reference weights into it and compare it, end to end,
# with the reference, read both ways: through the `transformer-lens` bridge and straight from
# the Hugging Face model. Run this once your `DemoTransformer` passes.

# %%
demo = load_weights(DemoTransformer(cfg), reference.params).eval()

with torch.no_grad():
    demo_logits = demo(tokens)
    bridge_logits = reference.bridge(tokens)
    hf_logits = reference.hf_model(tokens).logits

print("logits shape:", tuple(demo_logits.shape))
print("max |ours - transformer-lens| =", (demo_logits - bridge_logits).abs().max().item())
print("max |ours - Hugging Face|     =", (demo_logits - hf_logits).abs().max().item())

# %% tags=["claim"]
assert torch.equal(bridge_logits, hf_logits), "section 10 says the bridge's logits are HF's"
assert (demo_logits - hf_logits).abs().max() < 1e-4, "section 10 says differences around 1e-5"
assert 10 < hf_logits.abs().max() < 100, "section 10 says the logits reach into the tens"
assert not reference.params["unembed.b_U"].any(), "section 8 says the reference's b_U is zero"
assert torch.equal(reference.params["unembed.W_U"], reference.params["embed.W_E"].T), (
    "section 8 says the course model ties W_U to W_E"
)

# %% [markdown]
# The two lines print the same number: the bridge runs HF's own modules, so its logits are
# HF's, bit for bit. Differences of around $10^{-5}$ between yours and theirs are
# floating-point rounding: your code and HF's add and multiply in a different order, and
# float32 keeps about 7 significant digits of logits that reach into the tens. Your model
# computes the same function.
#
# The logits at the **last** position are the model's guess for the token that comes after
# the prompt. Here are its five favourites for a line of *Macbeth*, a play the model never
# saw in training (the course held it out to measure exactly this).

# %%
print(repr(prompt), "->")
probs = demo_logits[0, -1].softmax(dim=-1)
top = probs.topk(5)
for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
    print(f"  {p:6.2%}  {tokenizer.decode([i])!r}")
print(f"(a uniform guess would give each token {1 / cfg.d_vocab:.2%})")

# %% [markdown]
# Where do the parameters live? Count them per component:

# %%
counts: dict[str, int] = {}
for name, param in demo.named_parameters():
    # "blocks.1.attn.W_Q" counts as "attn" (all layers together), "embed.W_E" as "embed".
    part = name.split(".")[2] if name.startswith("blocks.") else name.split(".")[0]
    counts[part] = counts.get(part, 0) + param.numel()
for part, n in counts.items():
    print(f"{part:10} {n:>10,}")
print(f"{'total':10} {sum(counts.values()):>10,}")

# %% tags=["claim"]
with torch.device("meta"):  # GPT-2 small's shapes, without its memory
    sizes = {n: p.numel() for n, p in DemoTransformer(Config()).named_parameters()}
untied = sum(sizes.values())
tied = sum(n for name, n in sizes.items() if not name.startswith("unembed."))  # as in HF
mlp_share = sum(n for name, n in sizes.items() if ".mlp." in name) / sum(
    n for name, n in sizes.items() if name.startswith("blocks.")
)
assert round(untied / 1e6) == 163 and round(tied / 1e6) == 124, "section 10: 163M and 124M"
assert abs(mlp_share - 2 / 3) < 0.01, "section 6: the MLPs hold about two thirds"

# %% [markdown]
# For comparison, GPT-2 small (`Config()`) has about 124 million parameters when `W_U` shares
# `W_E`'s storage, and about 163 million counted the way this loop counts them. Try working
# out where they go from the shapes table: the embeddings and the MLPs dominate.
#
# ## Check your understanding
#
# - Which layer is the only one that moves information between positions? What would the
#   model's output at position 3 depend on if you deleted every attention layer?
#
# <details><summary>Answer</summary>
#
# Attention. The embeddings, every LayerNorm, the MLPs and the unembedding work on each position
# on its own. Without attention, the logits at position 3 would be a function of token 3 and of
# position 3's embedding only: the model could still learn which tokens tend to follow token 3,
# a bigram model of sorts, but nothing that came before it could make any difference.
#
# </details>
#
# - Why must LayerNorm and the block not modify their input in place?
#
# <details><summary>Answer</summary>
#
# Because the caller still needs the input afterwards. The block computes
# `resid_pre + attn(ln1(resid_pre))`: if `ln1` normalised `resid_pre` in place, the residual
# connection would add the attention output to the *normalised* stream, and the model would
# compute something else. Likewise the block's input belongs to its caller (the previous block,
# a test, a cached activation). And during training, autograd refuses a backward pass through a
# tensor that was modified in place after being saved for the gradient.
#
# </details>
#
# - What goes wrong if the causal mask uses `diagonal=0`? (Think about the first row.)
#
# <details><summary>Answer</summary>
#
# `diagonal=0` masks the diagonal too, so no position may attend to itself. Every other row then
# loses its own token, a different model from GPT-2, but the first row loses everything:
# position 0 has no earlier key, its row of scores is all $-\infty$, and the softmax computes
# $0/0$ = `nan`. From the next layer on, every later position attends to position 0, whose key
# and value are now `nan`, so the whole output turns to `nan`.
#
# </details>
#
# - No position's output depends on a later token. Why is that what makes it possible to
#   train on every position of a sequence in a single forward pass?
#
# <details><summary>Answer</summary>
#
# Because of it, the output at position $i$ is exactly what the model would compute if the text
# ended at $i$: an honest prediction of token $i + 1$, made without seeing it. So one forward
# pass over $n$ tokens gives $n$ predictions, each with its own loss term, as if we had run the
# model on each of the $n$ prefixes separately. If position $i$ could read token $i + 1$, the
# model would learn to copy its target, and we would need a separate pass per prefix to get the
# same training signal.
#
# </details>
#
# - The model can read at most `n_ctx` tokens. Which weight sets that limit?
#
# <details><summary>Answer</summary>
#
# The positional embedding, `W_pos` `[n_ctx, d_model]`: it has one learned row per position, and
# there is no row for position `n_ctx` or beyond. Nothing else depends on the length:
# attention's weights act on each position's vector and its pattern is as wide as the sequence,
# and every other layer works position by position. (GPT-2 small: 1,024 positions; the course's
# model: 256.)
#
# </details>
#
# ## What's next
#
# Your `DemoTransformer` computes exactly what GPT-2's architecture computes, and with the
# course's weights it writes something like Shakespeare (`models/shakespeare/README.md` shows
# two continuations). In **chapter 2** you find out where those weights come from: you train a
# model built from these same parts on Shakespeare, minimising the cross-entropy of its
# next-token predictions.
# In **chapter 3** you sample from it, turning logits into text one token at a time.
#
# ## Sources
#
# What this chapter says about other systems, and where to check it:
#
# - **GPT-2**: Radford et al. 2019, *Language Models are Unsupervised Multitask Learners*
#   (section 2.2: byte-level BPE on a base vocabulary of 256 bytes; section 2.3: LayerNorm at
#   the input of each sub-block, one more after the last block, 50,257 tokens, 1,024 positions).
#   OpenAI's code, [github.com/openai/gpt-2](https://github.com/openai/gpt-2):
#   `src/model.py` (commit `122c55a`) has the tanh GELU, the LayerNorm (biased variance, ε
#   inside the square root), the pre-LN block, the learned positions and the logits computed
#   with the token embedding; `src/encoder.py` (commit `1b8a018`) has the pattern that cuts
#   text into words that keep their leading space; `src/generate_unconditional_samples.py`
#   (commit `1d8a942`) starts its samples from `<|endoftext|>`.
# - **GPT-2's vocabulary**: `tiktoken_ext/openai_public.py` in
#   [openai/tiktoken](https://github.com/openai/tiktoken) (commit `1f098ca`) gives GPT-2
#   50,257 ids with `<|endoftext|>` at 50,256, so 50,256 = 256 bytes + 50,000 merges. The ids
#   of `"Hello"` and `" Hello"` are in the docstring of `GPT2Tokenizer`,
#   `transformers/models/gpt2/tokenization_gpt2.py` (HF transformers 5.24), which also names
#   `<|endoftext|>` the default `bos_token` and `eos_token`.
# - **Hugging Face's GPT-2** (transformers 5.24), `transformers/models/gpt2/modeling_gpt2.py`:
#   `GPT2Attention` merges the heads and applies one `c_proj` matrix; `GPT2LMHeadModel` ties
#   `lm_head.weight` to `transformer.wte.weight`. `tokenizer.decode` (in
#   `tokenization_utils_base.py`) takes an int, a list of ids or a batch of lists.
# - **transformer-lens 4.3**: `model_bridge/generalized_components/unembedding.py` gives a
#   bias-free unembedding a fixed zero `b_U` (a buffer, not a parameter). The trainable one of
#   the earlier `HookedTransformer` (not in 4.3) is in `transformer_lens/components/unembed.py`
#   of [TransformerLensOrg/TransformerLens](https://github.com/TransformerLensOrg/TransformerLens),
#   for example at commit `0c7bbc4`.
# - **Scaled dot-product attention**: Vaswani et al. 2017, *Attention Is All You Need*,
#   section 3.2.1 and its footnote on the variance of $q \cdot k$.
# - **Position without positional embeddings**: Haviv et al. 2022, *Transformer Language
#   Models without Positional Encodings Still Learn Positional Information* (Findings of
#   EMNLP), who conjecture that causal attention lets a model count the tokens before it.
# - **Heads worth studying**: Wang et al. 2022, *Interpretability in the Wild: a Circuit for
#   Indirect Object Identification in GPT-2 small* (previous-token and duplicate-token heads);
#   Olsson et al. 2022, *In-context Learning and Induction Heads*.
# - **Attention sinks**: Xiao et al. 2023, *Efficient Streaming Language Models with Attention
#   Sinks* (arXiv 2309.17453).
# - **What the MLPs store**: Geva et al. 2021, *Transformer Feed-Forward Layers Are Key-Value
#   Memories*; Meng et al. 2022, *Locating and Editing Factual Associations in GPT*.
