# %% [markdown]
# # Chapter 5 — The fixed cost of a step
#
# Chapter 4's cache cut the arithmetic of a decoding step by up to 240 times, and the cached sampler
# came out only several times faster (14.7 times over 255 new tokens in the recorded run,
# `benchmarks/results/generate.json`), not 240. Section 9 of that chapter guessed why: most of a
# cached step of this small model is not arithmetic at all, but the cost of *issuing* a few hundred
# small operations, one Python call, one dispatch and one new tensor each. That cost is the same for
# one position as for a hundred, which is why we call it **fixed**.
#
# This chapter measures that cost, then takes it away piece by piece, in the order gpt-fast
# (pytorch-labs/gpt-fast, a short PyTorch program that generates quickly from Llama models) takes
# it away on a GPU:
#
# 1. **Measure first.** `torch.profiler` counts and times a step's operations, and a small cost
#    model that you fit says how much of a step is dispatch, how much is arithmetic and memory,
#    and how much grows with the text.
# 2. **A static cache**, allocated once for all `n_ctx` positions and written in place: every
#    step then has the same shapes and touches the same memory.
# 3. **A loop that never waits**: the sampled token stays a tensor, the end of the text is a mask,
#    and Python looks at the results only every few steps.
# 4. **A compiled step**: `torch.compile` turns the step into one graph, compiled once for the
#    whole generation, which runs far fewer, fused operations.
# 5. On a GPU, **CUDA graphs**: the whole step launched at once.
# 6. **Fewer bytes per weight**: int8 weights with one scale per channel, and when that pays.
#
# What you write:
#
# - `fit_step_cost`: the cost model's fit, by least squares;
# - `StaticKeyValueCache`: the static cache's buffers and its causal mask;
# - `attention_static` and `forward_static`: attention and the forward pass that write into it;
# - `FastTransformerSampler.sample`'s loop: chapter 3's sampler on the static cache, without a
#   wait inside a step;
# - `quantize_int8`: per-channel int8 weights.
#
# Given: `profile_ops` (the profiler's counts), `step_flops` (chapter 4's count of a step's
# arithmetic), `step_bytes` (the bytes of the weights a step reads) and `step_cached` (the cached
# numbers it reads), `Rates` and `StepCost` (the cost model's floor and predictions),
# `decode_step` (one step, the function that gets compiled), `inductor_available` and
# `compiled_step` (which compiles it), `GraphedStep` (the CUDA graph), `dequantize_int8` and
# `int8_model`.
#
# Nothing is checked against the course's code alone: your fit against NumPy's least squares,
# your static cache's attention against the transformer-lens reference model's activations,
# its logits against HF's `GPT2LMHeadModel`, your sampler's greedy tokens against HF's
# `generate` with *its* static cache, its sampled tokens against chapter 3's sampler (graded
# against HF), its compiled step against dynamo's own counters, your int8 weights against
# PyTorch's quantization observer and quantizer.
#
# **Time:** about 2 hours 30 minutes (the exercises' estimates below add up to it; the
# timing cells run for a few minutes more). **You need:** chapter 4's cache
# (`forward_with_cache`, the `[batch, n_heads, pos, d_head]` layout, left padding and the
# positions of padded rows) and chapter 3's `sample` arguments. Both are imported from
# `solutions`, so your own versions need not work.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it. From a
# terminal, `pytest -m forward_static` and `course grade 5` grade your saved notebook;
# `show_solution("quantize_int8")` prints the reference when you are truly stuck; `course reset
# 05` gives you a fresh notebook and keeps a backup of yours. The exercises of sections 2 and 3
# build on each other (the sampler calls your `forward_static`, which calls your
# `attention_static` on your cache's buffers): do them in order.
#
# Compiling a step needs a C++ compiler (section 4 says which, and what to install where there
# is none). Without one, every exercise and every check still runs: grading traces the step with
# dynamo alone and never compiles it.
#
# Run the setup cell below first.

# %% tags=["setup"]
import copy
import os
import shutil
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int, Int8
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions import Attention, Config, DemoTransformer, TransformerSampler, checks
from solutions.cached_model import forward_with_cache
from solutions.cached_sampling import CachedTransformerSampler
from solutions.sampling import SamplerBase, sample_next_token
from solutions.step_cost import profile_ops, step_bytes, step_cached, step_flops
from utils.check import check
from utils.display import show_solution
from utils.timing import best_seconds, one_thread

# %% [markdown]
# The course's own tests (`make test`) execute this notebook from top to bottom with
# `COURSE_QUICK=1`: the demos and timings then measure fewer steps. On your machine `QUICK` is
# `False`. Every timing in this chapter runs on one PyTorch thread (`one_thread()`), as
# chapter 4's did: on a small model, more threads mostly wait for each other.

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)

# %% [markdown]
# ## The models
#
# Chapter 4's model, and the smaller draft model of chapter 6, which the cost model will try to
# predict: the same tokenizer, half the layers, a narrower residual stream.

# %%
from utils.models import load_model

model, tokenizer = load_model("shakespeare")
draft, _ = load_model("shakespeare-draft")
cfg = model.cfg
for name, m in [("shakespeare", model), ("shakespeare-draft", draft)]:
    c = m.cfg
    n_params = sum(p.numel() for p in m.parameters())
    print(
        f"{name:18} {c.n_layers} layers, d_model {c.d_model}, d_mlp {c.d_mlp}, {c.n_heads} heads; "
        f"{n_params / 1e6:.2f} M parameters"
    )

# %% tags=["claim"]
assert (cfg.n_layers, cfg.d_model, draft.cfg.n_layers, draft.cfg.d_model) == (4, 192, 2, 128), (
    "'The models' says half the layers and a narrower residual stream"
)

# %% [markdown]
# ## 1. Where a step's time goes
#
# A profiler records every operation PyTorch runs, with its time. `profile_ops(run, repeats)`
# (given, below) runs `run()` a few times under `torch.profiler` and returns how many PyTorch
# operations one call dispatches, and per operation name: calls per run and microseconds of its
# own CPU time per call. It counts every `aten::` operation, also those that another operation
# calls (`aten::matmul` calls `aten::mm`, for instance): each goes through PyTorch's dispatcher.
# The profiler slows each operation down a little: use it to count, and a clock to time.

# %% tags=["source"]
# solution: solutions.step_cost.profile_ops

# %% [markdown]
# **Predict, then run.** A cached step of this model computes about 5 million floating-point
# operations at this prompt's position (5.9 million at the end of the context; chapter 4,
# section 1). How many PyTorch operations do you think it dispatches?
# Which do you expect to take the most time?

# %%
demo_prompt = "ROMEO.\nBut soft, what light through yonder window breaks?"
prompt_ids = torch.tensor([tokenizer.encode(demo_prompt)])
with torch.inference_mode(), one_thread():
    _, cache4 = forward_with_cache(model, prompt_ids[:, :-1])
    last = prompt_ids[:, -1:]
    n_ops, ops = profile_ops(lambda: forward_with_cache(model, last, cache4), repeats=10)

table = Table(title=f"chapter 4's cached step: {n_ops:.0f} operations")
for column in ["operation", "calls", "µs per call", "µs per step"]:
    table.add_column(column, justify="left" if column == "operation" else "right")
for name, calls, us in ops[:12]:
    table.add_row(name, f"{calls:.0f}", f"{us:.1f}", f"{calls * us:.0f}")
Console().print(table)
profiled_us = sum(calls * us for _, calls, us in ops)
products = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}
products_us = sum(calls * us for name, calls, us in ops if name in products)
products_calls = sum(calls for name, calls, _ in ops if name in products)
print(f"{len(ops)} kinds of operation; their own time adds up to {profiled_us:.0f} µs a step")
print(f"matrix products: {products_calls:.0f} of the {n_ops:.0f} operations, {products_us:.0f} µs; "
      f"the other {n_ops - products_calls:.0f}: {profiled_us - products_us:.0f} µs")  # fmt: skip

# %% tags=["claim"]
assert 800 < n_ops < 1000, "section 1 says some 900 operations for one token"

# %% [markdown]
# Some 900 operations for one token, most of them tiny: additions, copies, views, reshapes, the
# `aten::cat` that makes chapter 4's cache grow. The matrix products (`aten::mm`, `aten::bmm`)
# are few, and on an idle machine they lead the time column: they do the step's real work,
# reading every weight. The cell's last line adds up the rest: hundreds of small operations, each
# far cheaper than a product, which together can cost as much as the products. Times move with
# what else your machine is doing (each operation waits its turn for a core), the counts do not:
# read your own line, and trust its counts more than its times.
#
# Now against a clock. A forward pass over all 256 positions does each position's arithmetic in
# big matrix products; divide its time by 256 and you have what one position costs when the
# fixed costs are shared by many: a **floor** for a step's arithmetic. Then the cached step,
# which computes one position.

# %%
repeats = 3 if QUICK else 10
gen = torch.Generator().manual_seed(0)
long_ids = torch.randint(0, cfg.d_vocab, (1, cfg.n_ctx), generator=gen)
with torch.inference_mode(), one_thread():
    full_pass = best_seconds(lambda: model(long_ids), repeats)
    step4 = best_seconds(lambda: forward_with_cache(model, last, cache4), 10 * repeats)
per_position = full_pass / cfg.n_ctx
print(f"a forward pass over {cfg.n_ctx} positions: {1e6 * per_position:.0f} µs per position")
print(f"chapter 4's cached step, one position:   {1e6 * step4:.0f} µs")
print(f"the step costs {step4 / per_position:.1f} times a position's share of the long pass")

# %% [markdown]
# A position computed alone costs several times what it costs among 255 others: that gap is
# the fixed cost. Two rates describe what this machine can do at best, and both are measured
# here:
#
# - **arithmetic**: floating-point operations per second of the long forward pass (its
#   arithmetic is `step_flops(cfg, 255, cached=False)`, chapter 4's count);
# - **reading weights**: bytes per second of a product of one row with the unembedding matrix
#   (`[1, 192] @ [192, 4096]`, 3 MB of weights for 1.6 million operations: a one-row product
#   waits for its weights to arrive, not for its arithmetic).
#
# A cached step multiplies one row by every weight matrix of the model, so it cannot take less
# than the slower of the two: its arithmetic at the first rate, or its weights' bytes
# (`step_bytes(model)`) at the second. `Rates` (given) holds the two rates and computes that
# floor.

# %% tags=["source"]
# solution: solutions.step_cost.Rates

# %%
with torch.inference_mode(), one_thread():
    row = torch.randn(1, cfg.d_model)
    W_U = model.unembed.W_U
    one_row = best_seconds(lambda: row @ W_U, 100 * repeats)
rates = Rates.from_times(model, full_pass, one_row)
floor4 = float(rates.floor(step_flops(cfg, prompt_ids.shape[1] - 1), step_bytes(model)))
print(f"arithmetic: {rates.flops_per_second / 1e9:.0f} billion operations per second")
print(f"reading weights: {rates.bytes_per_second / 1e9:.0f} GB per second")
print(f"a step's weights: {step_bytes(model) / 1e6:.1f} MB; its floor: {1e6 * floor4:.0f} µs")
print(f"chapter 4's step: {1e6 * step4:.0f} µs, {step4 / floor4:.1f} times its floor")

# %% [markdown]
# The last line is your machine's, and it moves with the load: a machine busy with other work
# slows the one-row product, which raises the floor, and the step with it. On the machine
# behind `benchmarks/results/fixed_cost.json` (one PyTorch thread; the cell below reads that
# file), chapter 4's step took several times its floor:

# %%
import json

from utils import REPO_ROOT

_cpu = json.loads((REPO_ROOT / "benchmarks/results/fixed_cost.json").read_text())["result"]["cpu"]
step_recorded = _cpu["us_per_token"]["cached"]
floor_recorded = _cpu["weight_reads"]["us_per_step_at_that_rate"]
print(
    f"recorded: chapter 4's step {step_recorded:.0f} µs, its floor {floor_recorded:.0f} µs, "
    f"{step_recorded / floor_recorded:.1f} times"
)

# %% tags=["claim"]
assert step_recorded > 3 * floor_recorded, "section 1 says the step costs several times its floor"

# %% [markdown]
# ### A cost model of a step
#
# Where does the rest go? A model with three terms:
#
# $$\text{seconds} = \text{floor} + \text{per\_op} \cdot n_\text{ops} + \text{per\_cached}
#   \cdot n_\text{cached}$$
#
# - the **floor**: the arithmetic or the weights' bytes, whichever is slower, at the measured
#   rates;
# - **per-operation**: a fixed time for each of the $n_\text{ops}$ operations dispatched
#   (Python, the dispatcher, a new tensor for each result), whatever its size;
# - **per cached number**: for each of the $n_\text{cached}$ numbers of the cache the step
#   reads (keys and values of every earlier position in every layer, `step_cached(cfg, t)`),
#   which chapter 4's cache also copies to grow by one.
#
# The floor is computed; the two other costs you **fit** from measured steps: a least-squares
# fit of the time above the floor, $\text{seconds} - \text{floor}$, by the two columns
# $n_\text{ops}$ and $n_\text{cached}$. Steps of one model at several positions tell the two
# apart: the number of operations stays put while the cache grows. Then the fitted costs
# predict the steps of *another* model, from that model's own counts: a test of the model
# that no fit can pass by construction.
#
# ### Exercise: `fit_step_cost`
#
# *About 20 minutes.*
#
# `fit_step_cost(n_ops, floor, cached, seconds)` takes four 1-d tensors, one entry per measured
# step, and returns a `StepCost(per_op, per_cached)` (given below, with its `predict`) whose
# predictions are closest to `seconds` in the least-squares sense. The given lines check the
# arguments.
#
# Common mistakes: fitting `seconds` rather than the time above the floor (the floor is then
# counted twice); solving in float32, where counts of a million and times of a millisecond
# leave few correct digits; returning the two numbers in the wrong order.
#
# The tests fit steps made from known costs (your fit must find them) and noisy steps (your fit
# must agree with NumPy's `numpy.linalg.lstsq`).
#
# <details><summary>Hint 1: a nudge</summary>
#
# It is a linear least-squares problem with two unknowns: one row per step, one column per
# fitted term, and the right-hand side is what the floor does not explain.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Convert the four tensors to float64. Stack the two columns into a matrix `[steps, 2]`, and
# solve it against `seconds - floor` with `torch.linalg.lstsq` (its documentation describes
# the right-hand side as a matrix with one column per problem, here a single column; look up
# where it puts the solution). The solution's two entries are `per_op` and `per_cached`, in the
# order of your columns.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("fit_step_cost")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["source"]
# solution: solutions.step_cost.StepCost

# %% tags=["exercise"] exercise="fit_step_cost"
# solution: solutions.step_cost.fit_step_cost

# %%
check("fit_step_cost")

# %% [markdown]
# Now the measurements: chapter 4's step of each model at several positions (the fastest of
# several runs each), with its counts. The cost model is fitted on the Shakespeare model's steps
# only, then predicts the draft model's.
#
# **Predict, then run.** The draft model dispatches about half as many operations as the main
# model and reads less than half the bytes. Will the costs fitted on the main model predict its
# steps well, too long, or too short?

# %%
fit_positions = [8, 128, 240] if QUICK else [8, 48, 96, 144, 192, 240]


def measure_steps(m: DemoTransformer, positions: list[int]) -> dict[str, Tensor]:
    """Chapter 4's cached step of `m` at each position: counts, floor and measured seconds."""
    columns = {"n_ops": [], "floor": [], "cached": [], "seconds": []}
    with torch.inference_mode(), one_thread():
        for t in positions:
            _, cache = forward_with_cache(m, long_ids[:, :t])
            token = long_ids[:, t : t + 1]

            def step(m=m, token=token, cache=cache):
                return forward_with_cache(m, token, cache)

            columns["n_ops"].append(profile_ops(step, repeats=2)[0])
            columns["floor"].append(float(rates.floor(step_flops(m.cfg, t), step_bytes(m))))
            columns["cached"].append(step_cached(m.cfg, t))
            columns["seconds"].append(best_seconds(step, 10 * repeats))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in columns.items()}


steps = {"shakespeare": measure_steps(model, fit_positions)}
steps["shakespeare-draft"] = measure_steps(draft, fit_positions)
main_steps = steps["shakespeare"]
cost = fit_step_cost(
    main_steps["n_ops"], main_steps["floor"], main_steps["cached"], main_steps["seconds"]
)
print(f"fitted on the main model: {1e6 * cost.per_op:.2f} µs per operation,")
print(f"  {1e12 * cost.per_cached:.1f} µs per million cached numbers read")

table = Table(title="chapter 4's cached step: measured and predicted (µs)")
for column in ["model", "position", "ops", "floor", "measured", "predicted", "error"]:
    table.add_column(column, justify="left" if column == "model" else "right")
errors = {}
for name, s in steps.items():
    predicted = cost.predict(s["n_ops"], s["floor"], s["cached"])
    errors[name] = (predicted / s["seconds"] - 1).abs().max().item()
    for i, t in enumerate(fit_positions):
        table.add_row(
            name, str(t), f"{s['n_ops'][i]:.0f}", f"{1e6 * s['floor'][i]:.0f}",
            f"{1e6 * s['seconds'][i]:.0f}", f"{1e6 * predicted[i]:.0f}",
            f"{predicted[i] / s['seconds'][i] - 1:+.0%}",
        )  # fmt: skip
Console().print(table)
for name, error in errors.items():
    print(f"largest error, {name}: {error:.0%}")
draft_ops = steps["shakespeare-draft"]["n_ops"][0].item()
draft_above = steps["shakespeare-draft"]["seconds"] - steps["shakespeare-draft"]["floor"]
print(
    f"the draft model's own time above its floor per operation: "
    f"{1e6 * draft_above.median().item() / draft_ops:.2f} µs"
)

# %% [markdown]
# Read the table in three ways.
#
# - **The floor is a small part of a step.** Most of chapter 4's step is the per-operation
#   term: some 900 operations, each at the fitted cost the cell prints (a busy machine raises
#   it: every operation then also waits for a core), on a machine whose arithmetic and memory
#   would do the step's real work in a fraction of that time.
# - **The cache term** is what grows with the position: chapter 4's cache is read, and copied to
#   grow by one position, at every step. At 256 positions of 6 heads of 32 numbers in 4 layers,
#   that is at most 393,216 numbers (1.5 MiB), so the fitted cost per number times that count
#   says how much of a late step the cache costs here. On a busy machine the fit can come out
#   near zero or even below: then it is fitting noise. For long texts and large models this is
#   the term that grows (chapter 8's subject).
# - **The prediction for the other model** says how fixed the fixed cost is. Compare the
#   fitted cost per operation with the draft's own time above its floor per operation (the
#   cell's last line). Where the draft's is lower, the costs fitted on the main model predict
#   the draft's steps too long, and part of a "fixed" cost grows with the size of what the
#   operation touches: a LayerNorm over 128 numbers is cheaper than over 192, and small tensors
#   stay in the processor's caches. Where the two are close, the fit predicts the draft well.
#   A single run cannot say how stable this comparison is, and the machine's load moves both
#   numbers: a model with one cost per operation is a first
#   approximation, good enough to say *where* the time goes, not to predict another model to a
#   few percent. The benchmark (`python benchmarks/fixed_cost.py`, section 8) records its errors.
#
# What the model says to do is clear either way: **fewer operations per token**. The rest of the
# chapter removes them.

# %% [markdown]
# ## 2. A static cache
#
# Chapter 4's cache grows: every step concatenates one position onto every layer's keys and
# values (`aten::cat` in the profile), which allocates new tensors, copies the old ones into
# them, and gives every step new shapes. New shapes cost a compiled step: a graph compiled for a
# cache of 37 positions is code for 37. Either it is compiled again for 38 (and 39, ...), or it
# is compiled once more with the length as a symbol, more general and less specialised code
# (section 4 shows both); and a CUDA graph (section 5) replays fixed shapes at fixed addresses,
# with no symbol at all.
#
# A **static cache** allocates everything once, before the first token, for all `n_ctx`
# positions: one buffer per layer for the keys and one for the values, each
# `[batch, n_heads, n_ctx, d_head]`. A step **writes** its new keys and values into their slots
# in place, and attention reads the whole buffer through a mask that hides the slots not written
# yet. Every decoding step then has exactly the same shapes and touches the same memory. This is
# gpt-fast's `KVCache` (`model.py`: buffers of `max_seq_length` positions, written with
# `index_put_`) and HF's `StaticCache` (transformers 5.24, `cache_utils.py`: `index_copy_` in
# `StaticLayer.update`).
#
# Two words, because a padded batch makes them differ (chapter 4, section 8):
#
# - a **slot** is a column of the buffers: slot $j$ holds the $j$-th token of every row,
#   padding included, the same slot for all rows;
# - a **position** is where a token sits in its own text, counting real tokens only: what the
#   position embedding and the causal order are about.
#
# Without padding, slot and position are the same numbers.
#
# Besides the buffers, the cache holds two masks:
#
# - `mask` `[batch, n_ctx]`: `True` at the slots that hold a real token (`False` for slots not
#   written yet, and for padding);
# - `causal` `[n_ctx, n_ctx]`: `True` where a query in slot $q$ may read the key in slot $k$,
#   that is where $k \le q$. It is made once: a step's causal mask is then the rows of its own
#   slots, `causal[slots]`, picked rather than computed again. Picked, not shared: indexing with
#   a tensor of indices (advanced indexing) always copies, so `causal[slots]` is a new
#   `[new, n_ctx]` tensor, not a view of `causal`; a small one, and the same shape every step.
#
# Note that `causal` is `True` where attention is **allowed**: the convention of
# `F.scaled_dot_product_attention`'s boolean mask, which reads it directly. (Chapter 4's
# `causal_mask` marked what is hidden.)
#
# ### Exercise: `StaticKeyValueCache`
#
# *About 15 minutes.*
#
# Write the part of `__init__` that allocates: `self.keys` and `self.values`, lists of
# `n_layers` zero tensors `[batch, n_heads, n_ctx, d_head]` of the given `dtype` on the given
# `device`; `self.mask`, `[batch, n_ctx]` bool, all `False`; `self.causal`, `[n_ctx, n_ctx]`
# bool as above, on the same device. The given lines check the arguments; `reset` and
# `check_step` are given.
#
# Common mistakes: `[torch.zeros(...)] * n_layers`, which is one tensor listed `n_layers` times
# (every layer would then write into the same buffer); `self.values = self.keys`, the same slip
# one level up; the causal mask one off its diagonal (`<` rather than `<=`: a query must read its
# own key) or transposed; forgetting `device=` on one of the tensors.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Each layer needs two buffers of its own: make a new tensor for each in a list comprehension.
# The causal mask compares a key's slot with a query's slot, for every pair.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `torch.zeros` once per layer for the keys (with the shape, the device and the dtype), again
# for the values; `torch.zeros` with a bool dtype for the mask. For `causal`, make a range of
# all `n_ctx` slots on the device (`torch.arange`) and compare a row vector of key slots with a
# column vector of query slots (broadcasting gives the `[n_ctx, n_ctx]` table; the rows are the
# queries).
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("StaticKeyValueCache")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="static_cache"
# solution: solutions.static_cache.StaticKeyValueCache

# %%
check("static_cache")

# %%
demo_cache = StaticKeyValueCache(cfg, batch=1)
n_bytes = sum(t.numel() * t.element_size() for t in demo_cache.keys + demo_cache.values)
print(f"{cfg.n_layers} layers x (keys, values), each {tuple(demo_cache.keys[0].shape)}")
print(f"{n_bytes / 2**20:.2f} MiB for one text of up to {cfg.n_ctx} tokens, allocated once")
print("causal, first 5 slots (1: may read):\n", demo_cache.causal[:5, :5].int())

# %% [markdown]
# ### Exercise: `attention_static`
#
# *About 25 minutes.*
#
# `attention_static(attn, x, keys, values, slots, allowed)` is chapter 4's
# `attention_with_cache` for a static cache:
#
# - `x` `[batch, new, d_model]`: the new positions' inputs (already layer-normed);
# - `keys`, `values`: this layer's buffers, `[batch, n_heads, n_ctx, d_head]`;
# - `slots` `[new]` (long): the slots the new positions go to;
# - `allowed` `[batch, 1, new, n_ctx]` (bool): which slots each new query may read (`True`:
#   may), made by `forward_static` (next exercise) from the cache's two masks.
#
# It computes the new queries, keys and values (chapter 1's projections: `attn.W_Q`, `W_K`, `W_V`
# are `[n_heads, d_model, d_head]` with biases `[n_heads, d_head]`, `attn.W_O` is
# `[n_heads, d_head, d_model]` with `b_O` `[d_model]`), **writes** the new keys
# and values into their slots of the buffers, in place, then lets each new query attend over all
# `n_ctx` slots through `allowed`, and returns the output `[batch, new, d_model]` (with `W_O`
# and `b_O`).
#
# Reading all `n_ctx` slots, most of them masked out, is arithmetic thrown away. It buys the
# same shapes at every step, which is the point; gpt-fast does the same.
#
# Common mistakes: `torch.cat` (chapter 4's habit; here it builds a new tensor and the cache
# never sees the new keys); writing with `.index_copy` (no underscore: it returns a copy) or
# into `keys.clone()`; writing to slots `0, 1, ...` rather than to `slots`; passing `~allowed`,
# or `is_causal=True`, to the attention function; forgetting `b_O`.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Everything is chapter 4's, except two lines: the new keys and values go *into* the buffers
# at `slots`, and the attention function reads the buffers through `allowed`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Project `x` to queries, keys and values in the cache's layout, `[batch, n_heads, new,
# d_head]`. `Tensor.index_copy_` writes a source along one dimension at given indices, in
# place: the slots are dimension 2 of the buffers. Then `F.scaled_dot_product_attention` of the
# new queries over the whole buffers, with `allowed` as its `attn_mask`, and chapter 1's output
# projection.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("attention_static")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="attention_static"
# solution: solutions.static_cache.attention_static

# %%
check("attention_static")

# %% [markdown]
# ### Exercise: `forward_static`
#
# *About 30 minutes.*
#
# `forward_static(model, tokens, cache, slots, positions, real=None)` runs the whole model on
# the new tokens `[batch, new]`, writing them to `slots` `[new]` of `cache`, at `positions`
# `[batch, new]`; `real` `[batch, new]` is `False` where a new token is left padding (`None`:
# all real). It returns the logits `[batch, new, d_vocab]`. What it must do:
#
# 1. record in `cache.mask` which of the new slots hold real tokens;
# 2. build `allowed` `[batch, 1, new, n_ctx]`: a query may read a slot that is causally before or
#    at its own (`cache.causal[slots]`) **and** real (`cache.mask`), and always its own slot: a
#    padding query has no real key before it, and a query with nothing to read is a row of
#    $-\infty$ in the softmax (chapter 4, section 8);
# 3. embed the tokens at their `positions` (not their slots), then run every block with your
#    `attention_static` on that layer's buffers, then the final LayerNorm and the unembedding.
#
# It has no check, no `.item()` and no Python branch on a tensor's value: section 4 compiles it
# into a single graph. (`StaticKeyValueCache.check_step` is for the caller, once per text.)
#
# Common mistakes: the position embedding taken at the slots (wrong only for padded rows);
# `cache.mask` not updated (every query then reads only its own key); `real` ignored (padding
# is then read as text); the causal part forgotten (in a prefill, each query would read the
# future); the own-slot rule forgotten; a host read (`.tolist()` of the slots, an `if` on
# `real`'s values).
#
# The tests compare your logits with HF's `GPT2LMHeadModel`: a prefill and steps, a left-padded
# batch at every real position, and the padding slots themselves. There the own-slot rule
# decides: a padding query reads only its own key, at position 0, so its logits are those of
# the one-token text made of the pad token. (Without the rule its row of `allowed` is all
# `False`. PyTorch 2.13's `scaled_dot_product_attention` returns zeros for such a row on the
# CPU, while a softmax written by hand over a row of −∞, as in chapter 4, returns NaN, and a NaN
# in the cache would reach every real query, since a weight of 0 times NaN is NaN.) They also count
# the host reads one call makes: none.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Chapter 4's `forward_with_cache`, with the mask built from the cache's two masks instead of
# from `causal_mask`, and `attention_static` instead of `attention_with_cache`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Write `real` into the new slots' columns of the cache's mask. Then three tables: the causal
# rows of the new slots, `[new, n_ctx]`; the cache's mask with two new axes in the middle,
# `[batch, 1, 1, n_ctx]`; and one more `[new, n_ctx]` table that is `True` where a key's slot is
# the query's own slot (compare a range of all slots with the new slots). A key may be read when
# it is causally allowed, and it is either real or the query's own: an "and" of the first with
# an "or" of the other two, which broadcasting turns into `[batch, 1, new, n_ctx]`. The residual
# stream starts as the token embedding plus the position embedding's rows at `positions`; each
# block then adds its attention (on `ln1` of the stream) and its MLP (on `ln2`), as in chapter 4.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("forward_static")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="forward_static"
# solution: solutions.static_cache.forward_static

# %%
check("forward_static")

# %% [markdown]
# One decoding step is then one call of `forward_static` with one token. `decode_step` (given)
# is that call, and it is the function section 4 compiles. Its slot and position are
# **tensors**, not Python numbers, for a reason section 4 shows.

# %% tags=["source"]
# solution: solutions.fast_sampling.decode_step

# %% [markdown]
# Your static cache against chapter 4's growing one: a prefill and a few steps, the same logits,
# and buffers that never move.

# %%
with torch.inference_mode():
    n = prompt_ids.shape[1]
    static = StaticKeyValueCache(cfg, batch=1)
    addresses = [t.data_ptr() for t in static.keys + static.values]
    slots = torch.arange(n)
    logits_static = forward_static(model, prompt_ids, static, slots, slots[None])[:, -1]
    logits_grown, grown = forward_with_cache(model, prompt_ids)
    largest = (logits_static - logits_grown[:, -1]).abs().max().item()
    for token in [17, 250, 3]:
        slot = torch.tensor([n])
        logits_static = decode_step(model, static, torch.tensor([[token]]), slot, slot[None])
        logits_grown, grown = forward_with_cache(model, torch.tensor([[token]]), grown)
        largest = max(largest, (logits_static - logits_grown[:, -1]).abs().max().item())
        n += 1
moved = addresses != [t.data_ptr() for t in static.keys + static.values]
print(f"largest difference from chapter 4's logits: {largest:.1e}")
print(f"buffers moved: {moved}; slots written: {int(static.mask.sum())} of {cfg.n_ctx}")

# %% tags=["claim"]
assert largest < 1e-4 and not moved, "section 2 says the same logits and buffers that never move"

# %% [markdown]
# ## 3. A loop that never waits
#
# Chapter 3's loop asks the model for logits, samples a token, and then *looks* at it: appends
# it to a Python list, checks `if token == eos: break`. Every such look (`.item()`,
# `.tolist()`, `int(t)`, `if t == ...:` on a tensor) is a **host read**: Python needs the
# number, so it must wait until the step that computes it has finished.
#
# On a GPU that wait is expensive: the CPU normally queues kernels ahead of the GPU, and a read
# empties the queue, so the GPU sits idle while Python decides what to launch next. By default,
# a read splits a compiled graph in two (dynamo can be told to capture `.item()`, with
# `torch._dynamo.config.capture_scalar_outputs`, but a Python `if` on the value still breaks
# the graph): a compiler cannot turn "if this number is 0" into part of a graph that runs
# without Python. A fast loop therefore:
#
# - keeps the sampled token a **tensor** and feeds it straight into the next step;
# - samples on the device (chapter 3's `sample_next_token` does: its draws are tensor
#   operations with a `torch.Generator`);
# - writes the tokens into a preallocated tensor, not a Python list;
# - handles the end of text with a **mask**: once a text has written `<|endoftext|>`, its later
#   tokens are replaced by end-of-text (`torch.where`), and a `done` flag (a tensor) records it.
#   The steps between the end and the next look are then fed end-of-text, and the buffer holds
#   the finished text followed by end-of-text, whatever was sampled: HF's `generate` does the
#   same for the finished rows of a batch (transformers 5.24, `GenerationMixin._sample` writes
#   the pad token there). One text at a time, the given code cuts the text after its first
#   end-of-text anyway; in a batch, a finished row steps on with the others, and the mask is
#   what it writes;
# - looks at `done` only every `sync_every` steps, to stop early, and reads the tokens once at
#   the end.
#
# `FastTransformerSampler(model, tokenizer, compile=True, sync_every=16)` is that loop, with
# chapter 3's `sample` signature. It needs two given pieces: `inductor_available()`, which says
# whether `torch.compile`'s default backend can build code on this machine (and if not, what to
# install), and `compiled_step(compile)`, which returns `decode_step` eager (`False`), compiled
# by the default backend (`True`), or compiled by a backend you name (`"eager"`: dynamo's graph,
# run as it is, which needs no compiler).

# %% tags=["source"]
# solution: solutions.fast_sampling.inductor_available
# solution: solutions.fast_sampling.compiled_step

# %% [markdown]
# ### Exercise: `FastTransformerSampler.sample`'s loop
#
# *About 40 minutes.*
#
# The given code checks the arguments, makes (once) and resets the cache, and after your part
# reads the tokens and cuts the text after its first end-of-text. Your part, between the
# `BEGIN` and `END` of the old fences (now `raise NotImplementedError()`):
#
# 1. the **prefill**: `forward_static` on the prompt, in slots and positions `0 .. n_prompt - 1`
#    (left eager: its shape is the prompt's), keeping the last position's logits `[1, d_vocab]`;
# 2. the buffers the loop writes, made before it starts: `text`, the prompt followed by room for
#    `max_tokens_generated` tokens; with a frequency penalty, `counts`, how often each token
#    occurs in the text so far (`[1, d_vocab]`, float); `done`, a bool tensor;
# 3. the loop, for each new token: the scores (the logits minus `penalty * counts` when there is
#    a penalty), `sample_next_token(input_ids[None], scores, generator=generator, **kwargs)`
#    (chapter 3's rules, in chapter 3's order, with the same generator: this is what makes your
#    tokens chapter 3's under the same seed; the given code has taken `frequency_penalty` out of
#    `kwargs`, so `sample_next_token` never counts `input_ids` and the prompt alone will do),
#    the end-of-text mask when `stop_at_eos` (only then: without it, sampling goes on after an
#    end-of-text, as in chapter 3), the token written into `text`, the counts updated, then
#    `self.step(model, cache, token[None], slot, slot[None])` for the next logits, the slot a
#    **tensor**, never a Python int (a compiled step is specialised on every Python number it is
#    given), that you advance by one after each step;
# 4. set `n_new` (the tokens written) as you go; every `sync_every` tokens, when `stop_at_eos`,
#    count a host read (`self.host_reads += 1`) and stop if `done`.
#
# Do not call the model after the last token: it would be fed to nobody. With `verbose`, print
# each token as it comes (a host read per token: count them), up to the text's first
# end-of-text and not after it, as chapter 3 does (with `stop_at_eos`, the tokens after it are
# the mask's end-of-text, not text); with `progress`, show a `tqdm` bar over the loop, as
# chapter 3's sampler does.
#
# Common mistakes: a host read in every step (`if token == eos: break`); the slot or position
# passed as a Python `int` (section 4 shows what that costs a compiled step); `slot` not
# advanced; the penalty's counts not updated; the model called once more than needed.
#
# The tests compare your greedy tokens with HF's `generate` on its own static cache (and, if
# they differ, the slots your steps were given), your sampled tokens with chapter 3's sampler
# under the same seed (every sampling argument, with `stop_at_eos` both ways), what the steps
# after an end of text are fed, your printed tokens with chapter 3's under `verbose`, count your
# host reads (also `self.host_reads` with `verbose`), and compile your step with dynamo to count
# its graphs.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Start from chapter 3's loop and replace every Python value that comes from a tensor by the
# tensor itself. The only `bool(...)` left is the one every `sync_every` steps.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Before the loop, on the prompt's device: `text`, a long tensor with room for the prompt and
# every new token, filled with end-of-text and the prompt copied into its start (look up
# `torch.full`); `counts`, the prompt's token counts as floats, one row of `d_vocab` (look up
# `torch.bincount` and its `minlength`); `done`, a one-element bool tensor, False; `slot`, a
# one-element long tensor holding `n_prompt`. In the loop: where `done` is set, replace the
# token by end-of-text (`torch.where`), then or the token's own test for end-of-text into
# `done`, in place; write the token (the tensor itself, not a number read from it) into `text`
# through a one-element slice at its index; add one to its count (`Tensor.index_add_`, whose
# source has the shape of what it adds: one row of one column here); count `n_new`, and stop
# before calling the model once `n_new` reaches `max_tokens_generated`; add one to `slot` after
# the step.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("FastTransformerSampler")` in a new cell prints the
# reference implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="fast_sample"
# solution: solutions.fast_sampling.FastTransformerSampler

# %%
check("fast_sample")

# %% [markdown]
# The same prompt and seed with chapter 3's sampler and yours (eager: no compiler yet), and the
# host reads your loop made.

# %%
n_demo = 40 if QUICK else 150
fast_eager = FastTransformerSampler(model, tokenizer, compile=False)
with one_thread():
    text3 = TransformerSampler(model, tokenizer).sample(demo_prompt, n_demo, seed=1, top_p=0.9)
    text5 = fast_eager.sample(demo_prompt, n_demo, seed=1, top_p=0.9)
print("same text:", text3 == text5)
print(f"host reads: {fast_eager.host_reads} for up to {n_demo} tokens")
print(text5)

# %% tags=["claim"]
assert text3 == text5, "section 3 says the same text as chapter 3's sampler"
assert fast_eager.host_reads <= n_demo // 16 + 1, "section 3: one read every sync_every tokens"

# %% [markdown]
# ## 4. A compiled step
#
# `torch.compile(fn)` does two things. **Dynamo** reads the Python bytecode of `fn` as it runs and
# records the PyTorch operations it performs into a **graph**, together with **guards**: the
# conditions under which the graph is valid (the shapes, dtypes and devices of the inputs, the
# values of Python numbers it used). A **backend** then turns the graph into code: the default,
# **Inductor**, fuses chains of small operations into a few loops and writes them as C++ for a
# CPU (Triton for a GPU). The next call checks the guards and, if they hold, runs the compiled
# code without Python ever seeing the individual operations. That removes, at once, most of the
# per-operation cost section 1 measured.
#
# Two things go wrong, and both are counted:
#
# - a **graph break**: something dynamo cannot put into a graph (a host read, a Python branch on
#   a tensor's value, a call it cannot trace) splits the function, and Python runs in between;
#   `fullgraph=True` turns a break into an error;
# - a **recompilation**: a guard fails, and the function is compiled again. What a Python `int`
#   (or a shape) costs depends on `torch.compile`'s `dynamic` argument. With `dynamic=False`,
#   which this chapter's `compiled_step` passes, every int is specialised to its value: pass the
#   position as an `int`, and every step is a new value and a new compilation, until dynamo's
#   limit. With the default, `dynamic=None`, the first new value compiles the function once
#   more, with the int as a symbol, and that version then serves every later value.
#
# `torch._dynamo.explain` traces a function with dynamo alone and reports its graphs and breaks,
# in seconds, without a compiler.

# %%
with torch.inference_mode():
    explain_cache = StaticKeyValueCache(cfg, batch=1)
    slot = torch.tensor([0])
    report = torch._dynamo.explain(decode_step)(
        model, explain_cache, torch.tensor([[5]]), slot, slot[None]
    )
print(f"decode_step: {report.graph_count} graph, {report.graph_break_count} graph breaks, ")
print(f"  {len(report.ops_per_graph[0])} operations in its graph")

# %% tags=["claim"]
assert report.graph_count == 1 and report.graph_break_count == 0, "section 4: one graph, no break"

# %% [markdown]
# And what a Python number does. The step below takes its slot as an `int` and makes the tensor
# inside; we compile it with dynamo's `"eager"` backend (no compiler needed), once with
# `dynamic=False` and once with the default, and count the entries in dynamo's cache for it
# after each step; then `decode_step`, whose slot is a tensor.

# %%
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def step_with_int_slot(model, cache, token, slot: int):
    slots = torch.tensor([slot])
    return forward_static(model, token, cache, slots, slots[None])[:, -1]


def versions(step, args_at, dynamic, n_steps=4) -> list[int]:
    """Compiled versions of `step` in dynamo's cache after each of `n_steps` steps."""
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", dynamic=dynamic)
    counts = []
    with torch.inference_mode():
        for s in range(n_steps):
            compiled(*args_at(s))
            counts.append(len(_debug_get_cache_entry_list(step.__code__)))
    return counts


version_cache, five = StaticKeyValueCache(cfg, 1), torch.tensor([[5]])
entries = {
    "int slot, dynamic=False": versions(
        step_with_int_slot, lambda s: (model, version_cache, five, s), dynamic=False
    ),
    "int slot, dynamic=None (the default)": versions(
        step_with_int_slot, lambda s: (model, version_cache, five, s), dynamic=None
    ),
    "tensor slot, dynamic=False": versions(
        decode_step,
        lambda s: (model, version_cache, five, torch.tensor([s]), torch.tensor([[s]])),
        dynamic=False,
    ),
}
torch._dynamo.reset()
for name, counts in entries.items():
    print(f"{name:37} compiled versions after steps 0-3: {counts}")

# %% tags=["claim"]
assert entries["int slot, dynamic=False"] == [1, 2, 3, 4], "section 4: a version per int value"
assert entries["int slot, dynamic=None (the default)"] == [1, 2, 2, 2], "one more, symbolic"
assert entries["tensor slot, dynamic=False"] == [1, 1, 1, 1], "section 4: one for tensors"

# %% [markdown]
# With an `int` and `dynamic=False`, each new slot compiles a new version of the step. Dynamo
# stops after `torch._dynamo.config.recompile_limit` versions (8 by default): then it runs the
# function uncompiled, with a warning, or, under `fullgraph=True`, raises an error. With the
# default, the second value fails the guard on the first, and dynamo compiles the step again
# with the slot as a symbol (an "automatic dynamic" int): that version serves every later slot.
# A cache grown by `torch.cat` goes the same way (on torch 2.13, one version per length with
# `dynamic=False`; two in all with the default). With a tensor, the value is data: one version
# serves every step, whatever `dynamic` says.
#
# So why does this chapter pass tensors, keep a cache of one shape, and compile with
# `dynamic=False`, when the default would settle for two versions? Because a version with
# symbols is general code: its sizes are read from the inputs at every call, and Inductor
# cannot specialise its loops to sizes it does not know. And on a GPU, a CUDA graph
# (section 5) is recorded for fixed shapes at fixed addresses: a new length, symbolic or not,
# is a new recording. Tensors for what changes and one shape for the cache give one fully
# specialised version, and one graph to replay.
#
# ### Timing it
#
# Now the three samplers, on the same prompt and the same seed: chapter 4's
# `CachedTransformerSampler`, yours eager, and yours with the step compiled by Inductor. A first
# call compiles (Inductor keeps what it built in a cache on disk, so a second session compiles
# faster); the timing leaves that call out, as every timing of compiled code must.
#
# **Predict, then run.** Which of the three wins, and by how much? Will your eager static-cache
# sampler beat chapter 4's?

# %%
inductor_ok, why_not = inductor_available()
print("Inductor can compile here:", inductor_ok)
if not inductor_ok:
    print(why_not)

# %% tags=["demo"]
n_timed = 60 if QUICK else 200  # the prompt and 200 tokens fit the static cache's 256 slots
samplers = {
    "chapter 4, cached": CachedTransformerSampler(model, tokenizer),
    "static cache, eager": FastTransformerSampler(model, tokenizer, compile=False),
}
compile_seconds = None
if inductor_ok:
    samplers["static cache, compiled"] = FastTransformerSampler(model, tokenizer, compile=True)
    start = time.perf_counter()
    with one_thread():
        samplers["static cache, compiled"].sample("KING.\n", 4, temperature=0.0)
    compile_seconds = time.perf_counter() - start
    print(f"the first compiled call (compiling) took {compile_seconds:.1f} s")

times, outputs = {}, {}
with one_thread():
    for name, sampler in samplers.items():
        sampler.sample("KING.\n", 4, temperature=0.0)  # warm-up, not timed
        run = lambda s=sampler: s.sample(  # noqa: E731
            "KING.\n", n_timed, temperature=0.0, stop_at_eos=False
        )
        times[name] = best_seconds(run, 2 if QUICK else 3)
        outputs[name] = run()
table = Table(title=f"greedy, {n_timed} new tokens, one thread (fastest of a few runs)")
for column in ["sampler", "tokens/s", "vs chapter 4", "same tokens"]:
    table.add_column(column, justify="left" if column == "sampler" else "right")
base = times["chapter 4, cached"]
for name, seconds in times.items():
    same = outputs[name] == outputs["chapter 4, cached"]
    table.add_row(name, f"{n_timed / seconds:.0f}", f"{base / seconds:.2f}x", str(same))
Console().print(table)

# %% tags=["claim"]
assert all(o == outputs["chapter 4, cached"] for o in outputs.values()), "'same tokens'"
assert inductor_ok or compile_seconds is None, "the compiled row is there only with Inductor"

# %% [markdown]
# The same tokens from all three (the claim cell checks it). The eager static-cache sampler is
# not what makes the difference (in the runs made for this chapter it came out anywhere from
# somewhat slower than chapter 4's to somewhat faster): it no longer copies the cache, but it
# computes attention over all 256 slots, and it dispatches about as many operations. The
# compiled one does the same arithmetic in far fewer operations. How much faster it is here
# depends on your machine and on what else it is doing: the table says.
#
# Last, the compiled step against section 1's floor. Section 1 timed chapter 4's step and the
# long pass minutes ago, maybe under another load; the cell below times all four again, in
# turns, so that whatever else your machine is doing slows them alike: chapter 4's step, the
# static-cache step eager and compiled, and the long pass's time per position.

# %% tags=["demo"]
if inductor_ok:
    step_fn = compiled_step(True)
    with torch.inference_mode(), one_thread():
        timing_cache = StaticKeyValueCache(cfg, batch=1)
        slot = torch.tensor([100])
        token = torch.tensor([[5]])
        step_fn(model, timing_cache, token, slot, slot[None])  # compiled already: a cache hit
        args = (model, timing_cache, token, slot, slot[None])
        timed = {
            "chapter 4's step": lambda: forward_with_cache(model, last, cache4),
            "static cache, eager": lambda: decode_step(*args),
            "static cache, compiled": lambda: step_fn(*args),
        }
        best = dict.fromkeys([*timed, "long pass"], float("inf"))
        for _ in range(3):  # in turns: a load that comes and goes meets every one of them
            for name, run in timed.items():
                best[name] = min(best[name], best_seconds(run, 3 * repeats))
            best["long pass"] = min(best["long pass"], best_seconds(lambda: model(long_ids), 1))
    position_now = best.pop("long pass") / cfg.n_ctx
    print(f"a position of the long pass: {1e6 * position_now:.0f} µs")
    for name, seconds in best.items():
        print(f"{name:23} {1e6 * seconds:6.0f} µs, {seconds / position_now:5.1f} times a position")

# %% [markdown]
# Read the last column rather than the microseconds: timed in turns, the ratios move less under
# load than the times, though a busy machine still moves them. In the benchmark's record
# (section 8; `benchmarks/results/fixed_cost.json` keeps the steps alone under `step` and a
# prefill position under `us_per_prefill_position`), the compiled step was faster than the
# eager one and still many times a position's share.
# Part of what is left is the cost of *calling* compiled code: before each call, dynamo checks its
# guards (every input's shape, dtype and device, and every weight of the model it reads). The
# benchmark (section 8) measures what that costs, by timing the step with only the guards that
# tell cached versions apart (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`; with one
# cached version, none; unsafe outside a measurement).
# Another part is the matrix products, which Inductor leaves to PyTorch's own kernels, and
# which wait for their weights to arrive from memory. On a GPU, CUDA graphs (next section)
# replace the many launches of a step by one.
#
# **If you have no C++ compiler**: `inductor_available()` says what to install. Debian and Ubuntu:
# `apt install g++`; macOS: `xcode-select --install`; Windows: the "Build Tools for Visual
# Studio" with the C++ workload. Without one, `compile="eager"` still checks that your step is one
# graph, compiled once; it just runs it as it is.

# %% [markdown]
# ## 5. On a GPU: CUDA graphs
#
# On a GPU the arithmetic of a small model's step takes microseconds, and the fixed cost is
# the **launch**: each operation is a kernel that the CPU must send to the GPU, a few
# microseconds each (NVIDIA, "Getting Started with CUDA Graphs"), on top of Python's and
# PyTorch's cost of issuing it. A **CUDA graph** records the kernels of one call, with the
# memory addresses they read and write, and replays them all with one launch. A replay runs the
# same kernels on the same memory, so everything a step reads must stay where it was recorded:
# the inputs are copied into the recorded input tensors, the outputs are read from the recorded
# output tensors. That is possible only because the static cache never moves.
#
# `GraphedStep` (given) records `decode_step` by hand, following PyTorch's documented recipe
# (`torch.cuda.graphs`: warm up on a side stream, record, replay). `torch.compile(mode=
# "reduce-overhead")` does the same for a compiled step, and gpt-fast's decode step is compiled
# that way. The cell below runs only where PyTorch sees a CUDA GPU. Without one, it prints what
# it printed on a GPU lent to this course, and what `benchmarks/cuda_graphs.py` measured there
# (`benchmarks/results/cuda_graphs.json`).

# %% tags=["source"]
# solution: solutions.cuda_graphs.GraphedStep

# %% tags=["demo"]
if torch.cuda.is_available():
    gpu = torch.device("cuda")
    gpu_model = copy.deepcopy(model).to(gpu)
    gpu_cache = StaticKeyValueCache(cfg, batch=1, device=gpu)
    graphed = GraphedStep(gpu_model, gpu_cache)
    token = torch.tensor([[5]], device=gpu)
    slot = torch.tensor([0], device=gpu)
    with torch.inference_mode():
        eager_logits = decode_step(gpu_model, gpu_cache, token, slot, slot[None]).clone()
        graph_logits = graphed(gpu_model, gpu_cache, token, slot, slot[None]).clone()

        def timed(step, n=200):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                step(gpu_model, gpu_cache, token, slot, slot[None])
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / n

        print(torch.cuda.get_device_name())
        print(f"same logits: {torch.allclose(eager_logits, graph_logits, atol=1e-4)}")
        print(f"a step: {1e6 * timed(decode_step):.0f} µs eager, {1e6 * timed(graphed):.0f} µs "
              "replayed")  # fmt: skip
else:
    import json

    from utils import REPO_ROOT

    record = json.loads((REPO_ROOT / "benchmarks/results/cuda_graphs.json").read_text())
    run = record["result"]
    print(f"no CUDA GPU here. On a lent {run['machine']['device']} ({record['date']}), this cell "
          "printed:")  # fmt: skip
    print("   " + record["also_seen"]["chapter_5_cuda_graph_cell"].split(": ", 1)[1])
    step, kernels, tps = run["step_alone_us"], run["kernels_per_step"], run["tokens_per_s"]
    print(
        f"and benchmarks/cuda_graphs.py measured a step alone: {step['eager']:.0f} µs eager, "
        f"{step['graphed']:.0f} µs replayed ({kernels['graphed']:.0f} kernels in a replay), "
        f"{step['reduce_overhead']:.0f} µs compiled with mode='reduce-overhead' (Inductor's "
        f"step: {kernels['compiled']:.0f} kernels); a prefill position "
        f"{run['us_per_prefill_position']:.1f} µs"
    )
    print(
        f"255 tokens: chapter 4's loop {tps['cached']:.0f} tokens/s, yours eager "
        f"{tps['fast_eager']:.0f}, replayed {tps['fast_graphed']:.0f}, reduce-overhead "
        f"{tps['fast_reduce_overhead']:.0f}"
    )

# %% [markdown]
# Read those numbers as a GPU's story. Eager, your static-cache loop is no faster than chapter
# 4's on the GPU: a step's time there is not its arithmetic (compare a prefill position) but the
# launching of its kernels, each sent by the CPU through Python and PyTorch. Replayed from a
# graph, the CPU sends one launch, and the step costs a fraction of the eager one. What is left
# is the kernels themselves, run back to back: divide the replayed step's time by the kernels
# the profiler counted in a replay, and each one takes about two microseconds of the GPU
# however little it computes. (The record also counts an eager call's kernels, a dozen fewer
# than a replay's; why the two counts differ it does not say, so the cell leaves the eager
# count out.) So fewer
# kernels is the next saving, and that is what `mode="reduce-overhead"` adds: Inductor fuses the
# step into fewer kernels and records *those* as a graph.
#
# It can record only if every tensor the step writes stays at one address between calls. Inductor
# records a step that writes one of its inputs only when that input is a parameter, a buffer, a
# tensor marked as static, or the output of an earlier recorded graph (PyTorch's
# `torch/_inductor/cudagraph_utils.py`, `check_for_mutation`); otherwise it runs the step without a
# graph and says "skipping cudagraphs due to mutated inputs". So the benchmark marks each of the
# cache's buffers with `torch._dynamo.mark_static_address(buffer)`. gpt-fast gets the same by making
# its cache a module's buffers. HF's static cache, under its own documented `mode="reduce-overhead"`
# recipe, hit exactly this refusal on the lent GPU (transformers 5.17) and then failed in
# `generate`; the record says how.

# %% [markdown]
# ## 6. Fewer bytes per weight: int8
#
# A step multiplies one row by every weight matrix, so it reads every weight once and does two
# operations with it: for a large model on a GPU, the step's time *is* the time to read the
# weights from memory, and storing each weight in fewer bytes is a faster step. gpt-fast's int8
# (`quantize.py`, `WeightOnlyInt8Linear`) stores each weight in one byte with one float scale
# per output channel, and converts back inside the matrix product.
#
# Our matrices are `[..., d_in, d_out]` (we compute `x @ W`), so an output channel is a
# **column**. Per column: the scale is the column's largest magnitude divided by 127, and each
# weight becomes the nearest integer to `W / scale`, from -127 to 127. The largest weight of
# each column is then exactly ±127 steps, and every weight is off by at most half a step.
#
# ### Exercise: `quantize_int8`
#
# *About 20 minutes.*
#
# `quantize_int8(W)` returns `(q, scale)`: `q` int8 of `W`'s shape, `scale` `[..., d_out]` in
# `W`'s dtype, with `W ≈ q * scale[..., None, :]`. `W` may have leading dimensions (the
# attention weights are `[n_heads, d_model, d_head]`): each matrix of the batch gets its own
# scales. A column of zeros gets a tiny positive scale (`torch.finfo(W.dtype).eps`), not 0: its
# `q` is then 0, not NaN.
#
# Common mistakes: the largest magnitude taken along the wrong dimension (per row: one scale
# per *input*); dividing by 128 or 255; `.to(torch.int8)` without rounding first (it truncates
# toward zero); a zero column divided by a zero scale; the scale stored in float16 to save
# bytes (there is one per column: it saves almost nothing, and adds a rounding of its own).
#
# The tests compare your scales with PyTorch's own observer (`torch.ao.quantization`'s
# `PerChannelMinMaxObserver`, symmetric, range ±127) and your integers with
# `torch.quantize_per_channel`, including ties, which both round to even.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Two lines: the scale per column, then the rounded quotient. `d_in` is the second-to-last
# dimension.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# The largest magnitude over `d_in` (look up `Tensor.amax`), divided by 127, then clamped
# below at the eps; `W` divided by the scale (put back the `d_in` dimension with `unsqueeze` so
# that it broadcasts), rounded (`torch.round`), clamped to [-127, 127], converted to int8. Keep
# the scale in `W`'s dtype.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("quantize_int8")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="quantize_int8"
# solution: solutions.int8.quantize_int8

# %%
check("quantize_int8")

# %% [markdown]
# `dequantize_int8` turns `(q, scale)` back into floats, and `int8_model(model)` (both given)
# makes a copy of a model whose matrices (and token embedding) are their int8 versions turned
# back into floats, with the bytes the int8 weights would take stored. Its loss is the int8
# model's loss, up to float rounding: the two compute the same products. First the size, then
# the held-out loss (chapter 2's held-out plays, chapter 2's `evaluate`).

# %% tags=["source"]
# solution: solutions.int8.dequantize_int8
# solution: solutions.int8.int8_model

# %%
from torch.utils.data import DataLoader

from solutions.dataset import TokenWindows
from solutions.train import evaluate
from utils.corpus import load_plays, split_plays

model8, int8_bytes = int8_model(model)
float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"float32: {float_bytes / 1e6:.1f} MB; int8: {int8_bytes / 1e6:.1f} MB; "
      f"{float_bytes / int8_bytes:.2f} times smaller")  # fmt: skip

_, held_out = split_plays(load_plays())
held_out_ids = torch.tensor(tokenizer.encode("\n\n".join(held_out.values())))
loader = DataLoader(TokenWindows(held_out_ids, cfg.n_ctx), batch_size=16)
n_batches = 4 if QUICK else None  # None: every held-out window (a minute or two)
with one_thread():
    loss32 = evaluate(model, loader, max_batches=n_batches)
    loss8 = evaluate(model8, loader, max_batches=n_batches)
print(f"held-out loss: {loss32:.4f} float32, {loss8:.4f} int8 ({loss8 - loss32:+.4f} nats/token)")

# %% tags=["claim"]
assert float_bytes / int8_bytes > 3.5, "section 6 says more than 3.5 times smaller"
assert abs(loss8 - loss32) < 0.01, "section 6 says the int8 model loses less than 0.01 nats"

# %% [markdown]
# More than 3.5 times smaller (not 4: the scales, the biases, the LayerNorms and the position
# embedding stay in float32), for a held-out loss that moves in the fourth decimal place (the
# recorded run, `benchmarks/results/fixed_cost.json`, over its first 16 batches of held-out
# windows: 4.1748 against 4.1747; the cell above reads every window outside a quick run, so its
# losses differ from those; the claim cell checks a difference of less than 0.01).
#
# **Does it make this step faster?** Only if reading the weights is what the step waits for.
# Section 1's floor says it is not: on this CPU, reading a step's weights is a small part of the
# step's time. Worse, a CPU has no instruction that multiplies a float by an int8 weight: the
# weights must first be converted back to floats, which writes a float copy (more bytes, not
# fewer), or go through a special kernel. The cell below times one product with the
# unembedding, the model's largest matrix, three ways: float32; int8 converted back, then
# multiplied; and PyTorch's int8 weight kernel for CPUs (`torch._weight_int8pack_mm`, a private
# function, which wants the matrix as `[d_out, d_in]`).

# %%
with torch.inference_mode(), one_thread():
    q_U, scale_U = quantize_int8(W_U)
    q_U_t = q_U.T.contiguous()
    ways = {
        "float32": lambda: row @ W_U,
        "int8, converted back": lambda: (row @ q_U.float()) * scale_U,
        "int8 kernel": lambda: torch._weight_int8pack_mm(row, q_U_t, scale_U),
    }
    for name, way in ways.items():
        print(f"{name:22} {1e6 * best_seconds(way, 100 * repeats):7.1f} µs")

# %% [markdown]
# Where does int8 pay, then? Where a step is bound by memory: a model whose weights do not fit in
# the caches, read at every step by a processor that computes far faster than it reads. A GPU
# decoding one text of a 7-billion-parameter model is the textbook case: gpt-fast's README
# (README.md from its first commit, 9ac48bc, on; its benchmark table: one text, a power-limited
# A100) reports Llama-2-7B at
# 104.9 tokens/s in 16-bit weights and 155.58 with int8 weights, one byte per weight read instead
# of two. For this model on this CPU, the honest answer is: 3.7 times fewer bytes of weights,
# the same loss, and (in the runs made for this chapter) no speed.

# %% [markdown]
# ## 7. What it buys speculative decoding
#
# Chapter 6's speculative decoding pays when a draft step is cheap next to a main step: its
# expected number of tokens per main pass, for an acceptance rate $\alpha$ and $k$ drafted
# tokens, is $\frac{1 - \alpha^{k+1}}{1 - \alpha}$, and each round costs $k$ draft steps and one
# main pass (Leviathan et al. 2023, section 3). With the cost of a draft step $c$ as a fraction
# of a main step, the speed-up over plain decoding is about
# $\frac{1 - \alpha^{k+1}}{(1 - \alpha)(k c + 1)}$, if the main pass over $k + 1$ tokens costs
# what one step does.
#
# Chapter 4's steps are mostly fixed cost, and the draft model has half the operations of the
# main one, so $c$ is large. Compiled, both steps shrink: does $c$?


# %% tags=["demo"]
def step_seconds(m: DemoTransformer, compile: bool) -> float:
    """One decoding step of `m` at slot 100, eager or compiled (the compilation not timed)."""
    step = compiled_step(compile)
    cache = StaticKeyValueCache(m.cfg, batch=1)
    slot, token = torch.tensor([100]), torch.tensor([[5]])
    with torch.inference_mode(), one_thread():
        step(m, cache, token, slot, slot[None])
        return best_seconds(lambda: step(m, cache, token, slot, slot[None]), 10 * repeats)


table = Table(title="a draft step as a fraction c of a main step")
for column in ["steps", "main (µs)", "draft (µs)", "c", "speed-up at α=0.7, k=4"]:
    table.add_column(column, justify="left" if column == "steps" else "right")
for label, compile in [("eager", False), ("compiled", True)] if inductor_ok else [("eager", False)]:
    main_s, draft_s = step_seconds(model, compile), step_seconds(draft, compile)
    c = draft_s / main_s
    speedup = (1 - 0.7**5) / ((1 - 0.7) * (4 * c + 1))
    table.add_row(
        label, f"{1e6 * main_s:.0f}", f"{1e6 * draft_s:.0f}", f"{c:.2f}", f"{speedup:.2f}x"
    )
Console().print(table)

# %% [markdown]
# The last column is the formula's, not a measurement, for an acceptance rate you can read off
# chapter 6's runs; chapter 6's benchmark (`python benchmarks/speculative.py`) measures the
# real thing.
#
# ## 8. The careful benchmark
#
# `python benchmarks/fixed_cost.py --threads 1` (from the repository's root) measures what this
# chapter measured, more carefully: HF's `generate` with its dynamic cache and with its static cache
# and a compiled forward (`cache_implementation="static"`), chapter 4's sampler, and yours eager and
# compiled, interleaved over several runs, 255 new tokens, each timed call's tokens checked against
# HF's. It reports medians and ratios, the compile time, recompilations and graph breaks, a step
# alone (eager, compiled, and compiled without its guard checks), the cost model's errors on both
# models, and the int8 model's size and held-out loss. (The draft's step as a fraction $c$ of the
# main one's, eager and compiled on one cache, is measured by chapter 6's benchmark, `python
# benchmarks/speculative.py --compiled`, beside the runs it explains.) The README's benchmark
# section records its runs.

# %% [markdown]
# ## Check your understanding
#
# - Why does the static cache read all `n_ctx` slots at every step, when most are empty?
#
# <details><summary>Answer</summary>
#
# So that every step has the same shapes: a step compiled with `dynamic=False` (as here) and a
# CUDA graph are valid only for the shapes they were made for, and a version compiled with
# symbolic sizes is more general, less specialised code. The masked slots cost some
# arithmetic, which is cheap next to a recompilation or a new allocation per step.
#
# </details>
#
# - Why must `decode_step`'s slot and position be tensors?
#
# <details><summary>Answer</summary>
#
# With `dynamic=False`, dynamo guards on the value of every Python number a compiled function
# uses: a new value fails the guard and compiles the function again, at every step, until the
# recompile limit. With the default `dynamic=None`, the second value compiles it once more with
# the number as a symbol, and that version serves the rest: two compilations, and general code.
# A tensor's value is data: one specialised version serves every position, and a CUDA graph can
# replay it.
#
# </details>
#
# - Your loop checks `done` every 16 tokens. What does that cost when a text ends early?
#
# <details><summary>Answer</summary>
#
# Up to 15 steps after the end of text, which the mask fills with end-of-text and the given code
# cuts off: wasted arithmetic, never wrong tokens. Checking every step would waste no steps but
# make every step wait.
#
# </details>
#
# - Why does a CUDA graph need the static cache?
#
# <details><summary>Answer</summary>
#
# A replay runs the recorded kernels on the recorded memory addresses. Chapter 4's cache is a new
# tensor, at a new address, after every step; the static cache's buffers never move.
#
# </details>
#
# - Your int8 model is 3.7 times smaller. Why is its step not faster on this CPU?
#
# <details><summary>Answer</summary>
#
# The step does not wait mostly for its weights: it waits for its operations' fixed costs
# (section 1's cost model: the floor, which includes reading the weights, is a small part of
# the step). And the CPU must convert the int8 weights back to floats before it can
# multiply, which adds work.
#
# </details>
#
# ## Further reading
#
# - pytorch-labs/gpt-fast: `model.py` (`KVCache`, preallocated and written in place),
#   `generate.py` (`decode_one_token` compiled with `mode="reduce-overhead"` and
#   `fullgraph=True`, the prefill compiled apart), `quantize.py` (`WeightOnlyInt8Linear`), and the
#   README's table of tokens per second; the PyTorch blog post "Accelerating Generative AI with
#   PyTorch II: GPT, Fast" (2023).
# - Hugging Face transformers 5.24, `cache_utils.py` (`StaticCache`, `StaticLayer.update`) and the
#   documentation page "Optimizing inference" (static cache and `torch.compile`).
# - PyTorch's documentation: `torch.compile`, "torch.compiler troubleshooting" (graph breaks,
#   recompilations, `TORCH_LOGS="recompiles"`), `torch._dynamo.explain`, `torch.cuda.graphs`, and
#   the profiler's recipe ("PyTorch Profiler").
# - NVIDIA, "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs).
# - Williams, Waterman and Patterson, *Roofline: An Insightful Visual Performance Model for
#   Multicore Architectures*, Communications of the ACM, 2009: the floor of section 1.
# - Dettmers et al., *LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale*, 2022
#   (arXiv:2208.07339): int8 matrix multiplication, activations included. What it finds losing
#   accuracy is the int8 *activations*: outlier features that appear in models from about 6.7
#   billion parameters, which it keeps in 16 bits. Weight-only int8, as in section 6, never
#   quantizes activations.
# - Leviathan, Kalman and Matias, *Fast Inference from Transformers via Speculative Decoding*,
#   ICML 2023 (arXiv:2211.17192): the speed-up formula of section 7.
#
# ## What's next
#
# One text at a time, the compiled step is faster, and still far from what this machine's
# memory allows: the benchmark's record (`python benchmarks/fixed_cost.py --runs 5 --threads 1`,
# the course's 2-core machine with another job on its second core, 2026-11-27,
# `benchmarks/results/fixed_cost.json`) has the compiled step alone at 1216 µs, 2.7 times the
# 447 µs its weights take to read at the rate measured in the same run, and 14.1 times a
# prefill position (14.34 times per generated token in a whole generation). Chapter 6 gets more than
# one token out of a main-model step: speculative and lookahead decoding, on chapter 4's cache.
# Chapter 8 serves many requests at once, which shares each step's fixed cost among many texts.

# %% tags=["claim"]
_run, _step = _cpu, _cpu["step"]["main_compiled_us"]
_floor = _run["weight_reads"]["us_per_step_at_that_rate"]
assert (round(_step), round(_floor), round(_step / _floor, 1)) == (1216, 447, 2.7), "What's next"
assert round(_step / _run["us_per_prefill_position"], 1) == 14.1, "What's next: a position"
assert _run["goals"]["step_over_prefill_position"]["measured"] == 14.34, "What's next: per token"
