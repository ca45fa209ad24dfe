# %% [markdown]
# # Chapter 10 — Sampling kernels in Triton
#
# Every token the course has generated ended the same way: a row of `d_vocab` logits, then
# softmax, perhaps a sort for top-p, a cumulative sum, `torch.multinomial`. On a GPU each of
# those steps is a separate kernel that reads the whole row from memory and writes a whole row
# back, and for a real vocabulary (Llama 3: 128,256 tokens, the `vocab_size` in the
# `config.json` of `meta-llama/Meta-Llama-3-8B`) the arithmetic is trivial next to the traffic.
# Sampling is **memory-bound** (with one exception, met in section 9): the fastest possible
# sampler reads the probabilities once and writes one integer per row. This chapter writes such
# samplers as GPU kernels in [Triton](https://triton-lang.org) and measures them against the
# hardware's limit.
# Serving engines have kernels of the same kind: FlashInfer's sampling kernels are CUDA C++
# (`include/flashinfer/sampling.cuh`), and vLLM mixes PyTorch operations, FlashInfer's kernels
# where the user asks for them, and Triton kernels: its speculative rejection sampler, and in
# recent versions a top-k / top-p kernel (`vllm/v1/sample/`; sources under Further reading).
#
# What you write, each but one a Triton kernel behind a given wrapper with a PyTorch reference
# from an earlier chapter:
#
# - `softmax_kernel`: a row-wise softmax, the Triton programming model on a known problem;
# - `gumbel_kernel`: chapter 6's Gumbel-max trick, one pass over the logits, the random numbers
#   made inside the kernel;
# - `inverse_transform_kernel`: sampling from probabilities with one uniform per row and a
#   prefix sum carried from block to block, no sort;
# - `top_p_one_pivot`: the idea first, in plain PyTorch on one row: top-p by rejection with one
#   pivot;
# - `top_k_top_p_kernel`: exact top-k and top-p sampling without sorting, by FlashInfer's
#   dual-pivot rejection sampling;
# - `fused_matmul_kernel`: the unembedding's matrix product and Gumbel-max sampling in one
#   kernel, so the `[batch, d_vocab]` logits are never written to memory;
# - `rejection_kernel`: chapter 6's speculative rejection sampler as one kernel.
#
# **Where this runs.** With an NVIDIA GPU, Triton compiles each kernel for it. Without one,
# Triton's **interpreter** runs the same kernel source on the CPU (numpy standing in for the
# GPU), which is how this notebook and its tests run on any Linux machine: slowly, so the
# shapes here are small, but computing what the GPU version computes. Triton is not
# available on macOS or Windows; there this chapter cannot run. No NVIDIA GPU at hand? Google
# Colab lends one: the README's "On Google Colab" says how, and section 9 what each of its GPUs
# runs.
#
# **What the interpreter runs and a GPU refuses.** The interpreter runs your kernel as Python,
# so it also runs Python that Triton's compiler rejects: `break` or `continue` in a loop, a
# `return` inside a loop (one before any loop is fine), and a global that is not a
# `tl.constexpr` (`NOT_FOUND = -1` read in the kernel is refused, `NOT_FOUND = tl.constexpr(-1)`
# is accepted; an argument is better still). Such a kernel passes every test on the CPU and
# fails on the first GPU. So `check()` (and `pytest`, `course grade`) also compiles your kernel
# for an H100, as a launch on a GPU compiles it, which needs no GPU: a kernel the compiler
# refuses fails its exercise's last test, with Triton's reason and the line of your cell.
#
# **Ground truth**, as before, comes from outside the code under test: `torch.softmax`, exact
# probabilities (chi-square tests of stated false-failure probability), the top-k and top-p
# sets from their definitions, logits chosen first and then built into hidden states and
# weights for the fused kernel, and chapter 6's checks for the rejection sampler.
#
# **On a GPU, the same blocks.** On a GPU the wrappers choose blocks of thousands of columns,
# longer than the tests' rows. So there the tests give the wrappers the interpreter's smaller
# blocks, and a kernel that mishandles a row's second block fails on a GPU as it does on the
# CPU. The GPU-only tests of a real vocabulary's size keep the wrappers' own blocks.
#
# **Time:** about 5 hours 35 minutes (the seven exercises' estimates below add up to it). **You
# need:** chapter 3's sampling rules (temperature, top-k, top-p) and chapter 6's Gumbel-max trick
# and rejection sampler.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it.
# `pytest -m softmax_kernel` and `course grade 10` grade your saved notebook;
# `show_solution("softmax_kernel")` prints the reference when you are truly stuck. Run the setup
# cell first: it chooses the interpreter when there is no GPU, *before* Triton is imported.

# %% tags=["setup"]
import math
import os

from solutions.kernels import runtime  # first: sets TRITON_INTERPRET=1 when there is no GPU

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from jaxtyping import Bool, Float, Int  # noqa: E402
from torch import Tensor  # noqa: E402

from solutions import checks  # noqa: E402
from solutions.kernels.runtime import (  # noqa: E402
    DEVICE,
    INTERPRET,
    kernel_tensor,
    next_power_of_2,
    refuse_empty_rows,
    row_block,
    rows_per_program,
    seed_value,
)
from solutions.kernels.top_k_top_p import MAX_ROUNDS  # noqa: E402
from solutions.sampling import check_sampling_args  # noqa: E402
from solutions.speculative import check_rejection_args  # noqa: E402
from utils.check import check  # noqa: E402
from utils.display import show_solution  # noqa: E402
from utils.plots import dual_pivot_rounds, plot_dual_pivot  # noqa: E402

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("kernels run:", runtime.mode())
print("tensors for the kernels live on:", DEVICE)

# %% [markdown]
# ## 1. Why sampling is memory-bound
#
# Count the bytes. One row of float32 probabilities over Llama 3's vocabulary is
# $128{,}256 \times 4 \approx 0.5$ MB; a batch of 64 rows is 33 MB. An H100 SXM moves about
# 3.35 TB/s between its memory and its cores, and its 132 SMs do about $6.7 \times 10^{13}$
# float32 operations per second, a multiply-add counted as two (NVIDIA's figures for that card,
# [nvidia.com/en-us/data-center/h100](https://www.nvidia.com/en-us/data-center/h100/); the PCIe
# card has 2.0 TB/s and $5.1 \times 10^{13}$). That is 128 float32 lanes per SM at a clock of
# about 1.98 GHz, so $3.35 \times 10^{13}$ ordinary operations (an add, a maximum) a second.
# Reading the batch once takes about 10 µs. A softmax over it needs some ten ordinary operations
# per element, about 2.5 µs for the 8.2 million elements, and one `exp`, which runs on the
# special-function units: 16 per SM per clock against 128 for ordinary float32 arithmetic (the
# CUDA C++ Programming Guide's throughput table, compute capability 9.0), so the 8.2 million
# `exp`s take about 2 µs. Both stay under the read: whatever a sampler computes, its time is the
# bytes it moves divided by the bandwidth, as long as it computes little per byte.
#
# The PyTorch path moves many rows' worth. The cell below counts each step of sort-based top-p
# sampling from logits (each step reads its input and writes its output; the sort reads and
# writes values and indices, and more in its passes, so its count is a floor). `torch.multinomial
# (probs, 1)` in torch 2.13 reads the rows five times and writes two (`aminmax` and `sum` to
# check them, exponential noise written, `probs / noise` written, its `argmax`; ATen's
# `multinomial_out` in `aten/src/ATen/native/Distributions.cpp`).

# %%
V, B = 128_256, 64
row = V * 4  # bytes of one float32 row
steps = {
    "softmax (read logits, write probs)": 2 * row,
    "sort (read probs; write values + int64 indices)": row + row + 2 * row,
    "cumsum (read sorted, write cumulative)": 2 * row,
    "mask + scatter back (read 2 rows, write 1)": 3 * row,
    "renormalise (read, write)": 2 * row,
    "multinomial (torch 2.13: 5 reads, 2 writes)": 7 * row,
}
total = sum(steps.values())
for what, n in steps.items():
    print(f"{what:50} {n / row:4.0f} rows")
print(f"{'total':50} {total / row:4.0f} rows = {B * total / 1e6:.0f} MB for a batch of {B}")
print(f"one read of the probabilities: {B * row / 1e6:.0f} MB")

# %% tags=["claim"]
assert total == 20 * row, "section 9 says section 1 counted 20 rows' worth for the sort-based path"
assert round(B * row / 1e6) == 33 and round(B * row / 3.35e12 * 1e6) == 10, (
    "section 1: 33 MB, 10 µs"
)

# %% [markdown]
# So a kernel that reads the row once can be an order of magnitude faster, not by computing
# faster but by not moving the row again. Every kernel of this chapter is built on that idea:
# load a block of the row into registers, do everything that block is needed for, carry a few
# numbers to the next block, and never write the row back.
#
# ## 2. The Triton programming model
#
# A Triton kernel is a Python function decorated with `@triton.jit` that runs once per
# **program**; a launch `kernel[grid](args...)` starts `grid` programs, which the GPU runs in
# parallel. Inside, a program asks which one it is (`tl.program_id(0)`) and works on **blocks**:
# `tl.arange(0, BLOCK)` is a vector of `BLOCK` indices (a power of 2, a `tl.constexpr` known at
# compile time), `tl.load(ptr + offsets, mask=..., other=...)` reads a block from memory, with
# the mask keeping it inside the tensor, and `tl.store` writes one. Reductions (`tl.max`,
# `tl.sum`, `tl.argmax`) and scans (`tl.cumsum`) work along an axis of a block.
#
# Two layouts recur in this chapter:
#
# - **Rows per program.** Program `pid` handles rows `pid * BLOCK_B ... + BLOCK_B - 1`, a
#   `[BLOCK_B, BLOCK_V]` tile at a time: `rows[:, None] * n_cols + cols[None, :]` are the
#   offsets of the tile, `(rows < n_rows)[:, None] & (cols < n_cols)[None, :]` its mask.
#   `rows` holds 32-bit integers, and past 2**31 elements (16,744 rows of 128,256 columns) a
#   32-bit `rows * n_cols` wraps round to a wrong address: make the rows 64-bit before the
#   product (`.to(tl.int64)`), as the exercises' GPU compile checks ask. On a
#   GPU, `BLOCK_B = 1`: many programs, spread over the 132 multiprocessors. Under the
#   interpreter, which pays per program and per block operation rather than per element, the
#   wrappers choose large `BLOCK_B` (`rows_per_program`): a few programs of many rows.
# - **A loop over the row.** A row longer than one block is read in a loop
#   `for start in range(0, n_cols, BLOCK_V)`, carrying from block to block whatever the next
#   block needs: a running maximum, a running sum, the prefix so far. The last block is partial
#   unless `n_cols` is a multiple of `BLOCK_V`: its mask is what keeps it from reading the next
#   row (or past the end of the tensor).
#
# Random numbers come from `tl.rand(seed, offsets)`: a counter-based generator (Philox), so a
# given `(seed, offset)` always gives the same uniform in $[0, 1)$, whatever program asks for
# it. Give every random number its own offset (`row * n_cols + column` for one per element) and
# a run is reproducible from the seed, with independent rows.
#
# Each kernel below has a **wrapper**, given: it checks the arguments, chooses the block sizes
# and launches the kernel. Read the first one closely.
#
# A first kernel, given: multiply a vector by a number, `BLOCK` elements per program. Ten
# elements in blocks of 4 need three programs; the third one's offsets are 8 to 11, and its mask
# keeps it from touching elements 10 and 11, which do not exist.


# %%
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # the last program's block runs past the end of the vector
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * factor, mask=mask)


x_demo = torch.arange(10.0, device=DEVICE)
out_demo = torch.empty_like(x_demo)
grid = (triton.cdiv(x_demo.numel(), 4),)  # 3 programs
scale_kernel[grid](x_demo, out_demo, x_demo.numel(), 2.0, BLOCK=4)
print(grid, out_demo.tolist())

# %% [markdown]
# ## 3. A row-wise softmax
#
# ### Exercise: `softmax_kernel`
#
# *About 30 minutes (the first kernel: most of it is learning `tl.load`, masks and
# `tl.program_id`).*
#
# Write the kernel that computes `softmax` of each row of `x` `[n_rows, n_cols]` into `out`
# (same shape and dtype), in float32 whatever the input's dtype. A row may be longer than one
# block, and may hold `-inf` (masked tokens, never the whole row).
#
# The numerically stable softmax subtracts the row's maximum before `exp`. With a loop over
# blocks, either make two passes (the maximum and the sum of `exp(x - max)` first, then write
# `exp(x - max) / sum`), or keep an **online** maximum and sum in one pass, rescaling the sum
# by `exp(old_max - new_max)` whenever the maximum grows, then a second pass to write.
#
# Common mistakes: loading the last block without a mask (it reads the next row); `other=0`
# instead of `-inf` for masked-out columns (a 0 can be the maximum, and `exp(0)` adds 1 to the
# sum); `-inf - (-inf)` is NaN, so a running maximum that starts at `-inf` must not be
# subtracted from itself; a running maximum that starts at 0 (a row whose logits are all far
# below 0 then underflows to a sum of 0); the factor that rescales the running sum inverted (it
# is the exponential of the old maximum minus the new one, at most 1); computing in half
# precision.
#
# The tests compare with `torch.softmax` on rows of 1, 7, 1000 and 2500 columns, with masked
# tokens, logits of $10^4$, and half-precision inputs.
#
# <details><summary>Hint 1: a nudge</summary>
#
# One program per `BLOCK_B` rows. Three loops over the columns are fine (max, sum, write); two
# are enough with the online rescaling.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The tile: this program's `BLOCK_B` rows and, in each step of the loop, `BLOCK_V` columns
#   from `start`, laid out as in section 2. The mask needs both conditions: a row past `n_rows`
#   and a column past `n_cols` must not be read. What value must a masked-out element take, so
#   that it changes neither a row's maximum nor its sum? (`tl.load`'s `other=` gives it.)
# - Convert each loaded block to float32 before any arithmetic (`.to(tl.float32)`).
# - What a pass carries from block to block is a `[BLOCK_B]` vector, one number per row:
#   `tl.max(x, axis=1)` and `tl.sum(x, axis=1)` return one per row of the block, and
#   `tl.maximum` is the elementwise maximum of two vectors. The maximum first; then the sum of
#   the exponentials (`tl.exp`) of the logits less their row's maximum; then each element's
#   exponential over its row's sum, stored. A
#   `[BLOCK_B]` vector combines with a `[BLOCK_B, BLOCK_V]` block only once it has a column
#   axis: which indexing gives it one?
# - The store must be in the output's dtype (half precision in, half precision out):
#   `out_ptr.dtype.element_ty` is the element type of the tensor `out_ptr` points into, and
#   `.to(...)` converts a block to it.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("softmax_kernel")` in a new cell prints the
# reference. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="softmax_kernel"
# solution: solutions.kernels.row_softmax.softmax_kernel

# %% tags=["source"]
# solution: solutions.kernels.row_softmax.softmax

# %%
check("softmax_kernel")

# %% [markdown]
# ## 4. Gumbel-max sampling from logits
#
# ### Exercise: `gumbel_kernel`
#
# *About 30 minutes.*
#
# Chapter 6's `gumbel_sample` as a kernel: for each row, the argmax of
# $\ell / T + G$ with $G = -\log(-\log u)$, $u$ uniform, one per logit. In one pass over the
# row: each block's best score and its column, compared with the best so far. No softmax, no
# probabilities, no normalisation: the noise does it all. Temperature 0 is the plain argmax
# (a `tl.constexpr` flag: no noise, no division).
#
# The noise is made in the kernel, by the given `gumbel_noise(seed, rows, start, n_cols,
# BLOCK_B, BLOCK_V)` (the cell below): $G$ for the block of columns from `start`, each
# (row, column) its own number from a counter-based generator (Philox), so a seed reproduces a
# run and rows are independent. Two things in it are worth reading. It asks the generator for
# four numbers per call (`tl.randint4x`): four neighbouring columns of a row share one counter,
# `r * ceil(n_cols / 4) + c // 4`, and each takes one of its four outputs. `tl.rand` would run
# the whole generator for every element and keep one output: compiled for an H100, this kernel
# runs 88 instructions per column (`benchmarks/sass.py`, section 9), and the same kernel with
# `tl.rand` 125 (that variant compiled the same way, Triton 3.9). And it computes
# $-\log u$ from $v = 1 - u$, whose smallest values a float32 holds finely: the largest noise
# values, the ones that decide a row of 128,256 logits, come from $u$ near 1, where
# `-tl.log(-tl.log(u))` with a float32 $u$ stops at about 16.6.
#
# Common mistakes: the temperature applied to the noise too, $(\ell + G) / T$ (the argmax then
# ignores $T$: chapter 6's bug); the noise subtracted ($-G$ is not Gumbel noise); the noise of
# the wrong rows (every row then gets the same noise, and the same token) or of the wrong block
# (`start` 0: every block of a row reuses the first block's noise, and the tests check rows
# of several blocks); the block's argmax returned without adding the block's start column; at
# temperature 0, a later block that replaces a tied best (`>=`): ties go to the lowest column,
# as `torch.argmax` does; a running best that starts at 0 (a row whose noisy scores are all
# negative never beats it).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Carry two vectors of `BLOCK_B` values from block to block: the best score so far and its
# column. A block replaces them where its best is strictly larger.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Before the loop: the best score of each row so far, `[BLOCK_B]`, starting at `-inf`, and
#   its column. (`tl.full(shape, value, dtype)` and `tl.zeros(shape, dtype)` make them.)
# - In each block: the logits in float32, the masked columns at `-inf`; unless `GREEDY`,
#   scaled by `inv_temperature` with the block's noise added (`gumbel_noise`, for this block's
#   columns: which `start`?). Check that a masked column still scores `-inf` afterwards.
# - `tl.max(scores, axis=1)` returns each row's best score in the block, `[BLOCK_B]`;
#   `tl.argmax(scores, axis=1)` returns where it is *within the block*, from 0 to
#   `BLOCK_V - 1`. What turns that into a column of the row?
# - `tl.where(condition, a, b)` picks per row between the block's best and the best so far
#   (and the same for the column); which comparison gives ties to the earlier column?
# - `out` is int64, one per row: convert the columns before the store, and mask it to the rows
#   that exist.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("gumbel_kernel")`.
#
# </details>

# %% tags=["source"]
# solution: solutions.kernels.gumbel.gumbel_noise

# %% tags=["exercise"] exercise="gumbel_kernel"
# solution: solutions.kernels.gumbel.gumbel_kernel

# %% tags=["source"]
# solution: solutions.kernels.gumbel.gumbel_sample

# %%
check("gumbel_kernel")

# %% [markdown]
# ## 5. Sampling from probabilities by inverse transform
#
# ### Exercise: `inverse_transform_kernel`
#
# *About 45 minutes (the running prefix across blocks is the hard part).*
#
# Gumbel-max needs one random number per logit. Given probabilities, one per row is enough:
# draw $u$ and return the first token whose cumulative probability exceeds it. `torch`'s way is
# a `cumsum` over the whole row, written to memory, then a search; the kernel carries the
# prefix instead. Each block's `tl.cumsum` plus the total of the blocks before it is the true
# prefix; the first column where it exceeds $u$ is the token, and later blocks change nothing.
#
# A scan is the costly part: every thread of the program takes part in a prefix sum across
# all of them (compiled for an H100, a block of 16,384 columns spread over 16 warps runs about
# 1,070 instructions per thread and 6 barriers when it scans; `python benchmarks/sass.py`
# shows it). But a row crosses $u$ in one block only. So sum each block first (`tl.sum`: about
# 210 instructions and 2 barriers), and scan a block only when some row's running total passes
# $u$ inside it: an `if` on one number for the whole program (is any of its rows crossing
# here? a reduction over the rows answers it), which a GPU compiler turns into a branch the
# whole program takes or skips. A row of 128,256 tokens in blocks of 16,384 then scans one
# block of 8.
#
# The rounding edge: the row's probabilities, summed in float32, can add up to a little less
# than 1, and $u$ can exceed all of them. Then return the **last token of positive
# probability** (never a token of probability 0, never an index past the row): remember the
# start of the last block with any mass, and after the loop, only if some row has no token,
# read that block again and take its last positive column. A row with no positive probability
# at all (all zeros, or NaN: the softmax of a row of `-inf` logits) has no token to give: leave
# it at -1, and the given wrapper refuses it with a `ValueError` naming the row. The same holds
# for the top-k / top-p kernel below (which must not spend a round on such a row).
#
# Common mistakes: a prefix that restarts at each block (then a token in every block crosses
# $u$ too early); deciding to scan a block from the total *before* it (the crossing block is
# then skipped and the next one scanned); `>=` instead of `>` (when $u$ is exactly 0, a row
# that starts with tokens of probability 0 returns the first of them: their running total, 0,
# already reaches $u$); a later block's crossing that replaces the row's first (keep the first
# column whose running total passes $u$); a fallback that takes the last column whatever its
# probability; and
# leaving the loop with `break` once every row has its token. The interpreter runs that `break`
# and a GPU compiler refuses it: the loop runs to its end, and the blocks after the crossing
# are read and only summed.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Per row, carry the running total and the chosen column (start it at "none", e.g. -1). A
# block needs scanning for a row when that row has no token yet and its total *after* the
# block exceeds $u$.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# In each block: load it, sum each row, and work out which rows cross inside it. If any does,
# add the running total to the block's cumulative sums, look for the first column whose prefix
# exceeds $u$ and whose probability is positive (a minimum over the block of the column, or a
# large number where it does not qualify), and keep it for rows that had no token. Either way
# note whether the block had mass and add its sum to the total. After the loop, if any row
# still has no token, reload the last block with mass and take its largest column of positive
# probability.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("inverse_transform_kernel")`.
#
# </details>

# %% tags=["exercise"] exercise="inverse_transform"
# solution: solutions.kernels.inverse_transform.inverse_transform_kernel

# %% tags=["source"]
# solution: solutions.kernels.inverse_transform.sample_from_probs

# %%
check("inverse_transform")

# %% [markdown]
# ## 6. Top-k and top-p without sorting
#
# Chapter 3 sorted the row to find the top-k or top-p set. A sort of 128,256 values is costly:
# section 1 counted four rows of traffic as its floor, before the passes a sort makes of its
# own. FlashInfer's observation: you never need the sorted order, only a **threshold** $\tau$
# such that the kept set is $\{x : p_x \ge \tau\}$, and you can test any candidate token $j$
# for membership in one pass:
#
# - top-k (ties with the $k$-th kept, as in chapter 3): $j$ is kept iff fewer than $k$ tokens
#   are strictly more likely, $\#\{x : p_x > p_j\} < k$;
# - top-p: $j$ is kept iff the tokens strictly more likely hold less than top-p of the mass,
#   $\sum_{x : p_x > p_j} p_x < \text{top-}p$. (With ties at the cut this keeps every tied
#   token; chapter 3's sort keeps an order-dependent subset of them. Without ties the two sets
#   are equal.)
#
# **Rejection sampling.** Draw $j$ from $p$; if $j$ is kept, it is a sample from $p$
# restricted to the kept set, renormalised, exactly as a rejection sampler's accepted proposal
# is. If not, every token at most as likely as $j$ is out too: draw again, from $p$ restricted
# to $\{x : p_x > p_j\}$. That set still contains the whole kept set, so an accepted draw is
# still exact.
#
# ### Exercise: `top_p_one_pivot` (a stepping stone, in PyTorch)
#
# *About 20 minutes.*
#
# Before the kernel, the idea alone, on one row, in plain PyTorch: `top_p_one_pivot(probs,
# top_p, generator)` returns a token of the top-p set and the number of rounds it took. Each
# round: draw $j$ from `probs` restricted to $p > \text{low}$ (`torch.multinomial` accepts
# weights that do not sum to 1); keep $j$ if the tokens strictly more likely hold less than
# top-p; otherwise rule out $j$ and every token at most as likely, for the rounds after. The
# kernel later does the same per row, with a second pivot and without a Python loop.
#
# Common mistakes: `<=` for `<` (a token whose more likely tokens hold exactly top-p is out);
# summing the tokens at least as likely as $j$ (itself included); drawing from the whole row
# every round (still exact, but a row then needs many more rounds: the test counts them);
# forgetting the generator.
#
# The tests: 4,000 draws each at top-p 0.6 and 0.9 on a row of ten: the tokens follow HF's
# top-p set, and the rounds follow their exact distribution, computed in the test from the
# definition; a boundary reached exactly (powers of two); the generator.
#
# <details><summary>Hint 1: a nudge</summary>
#
# A round needs neither a shorter row nor a renormalised one. Give every token at or below
# `low` weight 0 and keep the others' probabilities as they are: `torch.multinomial` draws in
# proportion to the weights, and the index it returns is already a token of `probs`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Each pass of the given `while True` loop is one round, and ends by returning or by raising
# `low`. Count it first: a draw kept in the first round reports 1 round.
#
# - The weights, `[d_vocab]`: `torch.where(condition, a, b)` takes `a` where the condition
#   holds and `b` elsewhere.
# - `torch.multinomial(weights, 1, generator=...)` returns a tensor holding one index, `[1]`;
#   `int(...)` makes it a Python int, as the function returns. Without the `generator=`
#   keyword it draws from torch's global generator, and the test with a seeded generator fails.
# - The test: the mass of the tokens *strictly* more likely than the drawn one (a boolean mask
#   of `probs`, then `.sum()`), compared with `top_p`. Which comparison keeps a token whose more
#   likely tokens hold exactly top-p out?
# - Rejected: every token at most as likely as the drawn one is out for good. What must `low`
#   become, so that the next round's weights leave them out?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("top_p_one_pivot")`.
#
# </details>

# %% tags=["exercise"] exercise="one_pivot"
# solution: solutions.kernels.top_k_top_p.top_p_one_pivot

# %%
check("one_pivot")

# %% [markdown]
# **Dual pivots.** One pivot is fast on average. Every round's candidates contain the whole
# top-p set, which holds at least top-p of the row's mass, so each round keeps its draw with
# probability at least top-p: a row averages at most $1 / \text{top-}p$ rounds (1.1 at 0.9).
# But nothing bounds one row: it can draw the least likely candidate round after round, up to
# one round per dropped token, and a kernel waits for its slowest row. The second pivot bounds
# the rounds of every row (FlashInfer's dual-pivot rejection sampling). Keep an interval
# $(\text{low}, \text{high}]$ known to contain $\tau$, starting at $(0, 1]$. Each round draws
# $j$ from $\{p > \text{low}\}$ and, in the same pass over the row, tests two pivots, $p_j$
# and $(p_j + \text{high}) / 2$. If $p_j$ passes, accept $j$; if only the midpoint passes,
# $\tau$ lies between them: $\text{low} = p_j$, $\text{high} =$ the midpoint; if neither,
# $\text{low} =$ the midpoint. Either way the interval at least halves, so after $r$ rejected
# rounds it is at most $2^{-r}$ long, and once it is shorter than the gap between the smallest
# kept probability and the largest dropped one, the next draw is kept: at most
# $2 + \lceil \log_2(1 / \text{gap}) \rceil$ rounds, and in float32 never more than about 150
# however close the gap.
#
# The cell below draws from the same two rows 500 times with one pivot (your
# `top_p_one_pivot`) and 500 times with two (`dual_pivot_rounds` from `utils.plots`: the rounds
# written plainly in PyTorch): a Zipf row of 4,096 tokens ($p \propto 1 / \text{rank}^{1.1}$,
# a few likely tokens and a long tail) at top-p 0.9, and a nearly flat row at top-p 0.01, whose
# top-p set holds 1 % of the mass, so that one pivot takes several rounds. It prints the average
# and the largest count of rounds, the worst case one pivot allows (one round per dropped token,
# and the last) and the bound above for two.

# %%
flat_gen = torch.Generator().manual_seed(0)
zipf_row = torch.arange(1, 4097, dtype=torch.float64) ** -1.1
flat_row = 1 + 0.01 * torch.rand(4096, generator=flat_gen, dtype=torch.float64)
pivot_rows = {
    "Zipf, top-p 0.9": (zipf_row / zipf_row.sum(), 0.9),
    "nearly flat, top-p 0.01": (flat_row / flat_row.sum(), 0.01),
}
pivot_rounds = {}
for name, (row_p, row_top_p) in pivot_rows.items():
    one_gen, two_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    one = [top_p_one_pivot(row_p, row_top_p, one_gen)[1] for _ in range(500)]
    two = [len(dual_pivot_rounds(row_p, row_top_p, two_gen)) for _ in range(500)]
    pivot_rounds[name] = (one, two)
    ranked = row_p.sort(descending=True).values
    in_set = ranked.cumsum(0) - ranked < row_top_p
    gap = float(ranked[in_set].min() - ranked[~in_set].max())
    print(
        f"{name}:\n  one pivot:  {sum(one) / 500:.2f} rounds on average, at most {max(one)}; "
        f"worst case {int((~in_set).sum()) + 1}"
    )
    print(f"  two pivots: {sum(two) / 500:.2f} rounds on average, at most {max(two)}; "
          f"bound {2 + math.ceil(math.log2(1 / gap))}")  # fmt: skip

# %% tags=["claim"]
assert all(abs(sum(a) - sum(b)) < 0.15 * sum(a) for a, b in pivot_rounds.values()), (
    "section 6 says one pivot and two average about the same number of rounds"
)
assert sum(pivot_rounds["nearly flat, top-p 0.01"][0]) > 3 * 500, "section 6: several rounds"
assert sum(pivot_rounds["Zipf, top-p 0.9"][0]) < 1.2 * 500, "section 6: about 1.1 at 0.9"

# %% [markdown]
# The second pivot makes neither row faster on average: on the flat row the midpoint starts near
# 1/2 and needs many rounds to come down among probabilities near 1/4,096, while the first pivot
# does the work alone. What it buys is the bound, the same for every draw of every row, where one
# pivot's worst case grows with the length of the row. (FlashInfer's blog, under Further
# reading, gives the same reason: without it, "there is no theoretical guarantee on the number
# of rounds".)
#
# Drawn round by round on one row of 200 tokens with top-p 0.3 (the rounds written plainly in
# PyTorch by `dual_pivot_rounds`, for the picture; the tokens are drawn sorted only to be
# readable). Watch the shaded interval: it always holds the threshold τ (the black line), and
# its length, in the last panel, at least halves each round.

# %%
demo_row = (torch.randn(200, generator=torch.Generator().manual_seed(0)) * 1.5).softmax(-1)
rounds_demo = dual_pivot_rounds(demo_row, 0.3, torch.Generator().manual_seed(2))
plot_dual_pivot(demo_row, 0.3, rounds_demo)

# %% [markdown]
# Round 1 drew a token of the long tail (rank 57 of 200): rejected. Its second pivot, halfway
# to `high` = 1, passes (no token is that likely), so the interval becomes (pivot 0, pivot 1]:
# every token at most as likely as the rejected one is out for good. Each later round draws
# only among the tokens above `low` and shrinks the interval again, until a draw lands in the
# top-p set and is returned. Had a second pivot failed, `low` would have jumped up to it.

# %% tags=["claim"]
assert int((demo_row > demo_row[rounds_demo[0]["token"]]).sum()) + 1 == 57, "section 6: rank 57"
assert not rounds_demo[0]["kept"] and rounds_demo[1]["low"] == rounds_demo[0]["pivot0"]
assert rounds_demo[1]["high"] == rounds_demo[0]["pivot1"] > float(demo_row.max()), (
    "section 6 says round 1's second pivot passes: the interval becomes (pivot 0, pivot 1]"
)

# %% [markdown]
# ### Exercise: `top_k_top_p_kernel`
#
# *About 90 minutes: the longest exercise of this chapter. Write the rounds with one pivot
# first (section 6's rejection sampling), check them on a small row, then add the second.*
#
# The draw of each round is an inverse transform over $\{p > \text{low}\}$ (your kernel of
# section 5, with the probabilities at or below `low` counted as 0 and $u$ scaled by the mass
# above `low`); the second pass counts and sums the tokens above each pivot. No pass only to
# sum the row: the first round's mass is 1 (the row sums to 1 up to rounding), and the row's
# total, which top-p's test needs, is where the first draw's running prefix ends. A row with no
# candidate at all in its first draw (zeros, or NaN) stops there, with token -1 and 0 rounds.
# The wrapper (given) refuses top-k and top-p together, as chapter 3 does.
#
# Common mistakes: testing membership with $\ge$ (the token that crosses top-p is then never
# kept); forgetting to scale $u$ by the mass above `low`; the two pivots swapped (the draw
# kept when the midpoint passes the test); rounds counted from 0;
# forgetting `done`: a row that already has its token keeps drawing in the later rounds and
# replaces it.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Keep per row: `low`, `high`, the mass above `low`, `done`, the token and the count of
# rounds. Loop over rounds while any row of the program is not done; rows that are done keep
# their token.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# A round is two passes over the row, then a decision for every row not yet done.
#
# 1. The draw. One uniform per row and round, scaled by the mass of the candidates; the
#    docstring fixes its `tl.rand` offset for row $r$ and round $i$. (Which rows would share a
#    uniform if the offset were $r + i$?) Then section 5's loop over the blocks, with every
#    probability at or below `low` counted as 0 (`tl.where`), gives $j$; one `tl.load` at row
#    $r$, column $j$ gives $p_j$ (masked where a row has no $j$: -1 is no column). In the first
#    round the running prefix ends at the row's total: keep it for top-p's test.
# 2. The count. One more loop over the row: per row, the mass strictly above each pivot and,
#    for top-k, how many tokens that is (a comparison converted with `.to(tl.int32)`, then
#    `tl.sum` along axis 1): up to four `[BLOCK_B]` accumulators.
# 3. The decision. A pivot passes for top-k when fewer than `top_k` tokens are above it, for
#    top-p when the mass above it is less than top-p of the row's total (`MODE` is a
#    `tl.constexpr`, so an `if` on it is decided at compile time; in mode 0 the first draw is
#    kept). Where $p_j$ passes, the row is done; elsewhere move `low` and `high` as the
#    dual-pivot paragraph says. The next round's candidates are the tokens above the new `low`:
#    which of step 2's sums is their mass?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("top_k_top_p")`.
#
# </details>


# %% tags=["exercise"] exercise="top_k_top_p"
# solution: solutions.kernels.top_k_top_p.top_k_top_p_kernel

# %% tags=["source"]
# solution: solutions.kernels.top_k_top_p.top_k_top_p_sample

# %%
check("top_k_top_p")

# %% [markdown]
# **Predict, then run.** How many rounds does a row take? On a language model's own
# distributions: the shipped model's next-token probabilities at every position of a passage
# (a few likely tokens, a long tail of 4,096), each row repeated, about 5,000 rows in all;
# top-p 0.9. Most rows in one round, or several?
#
# <details><summary>What to expect</summary>
#
# Round 1 draws from the whole row, and the draw lands in the top-p set with probability at
# least 0.9: about nine rows in ten stop there. A row whose first draw $j$ falls in the tail
# moves its interval to $(p_j, (p_j + 1) / 2]$ if the midpoint passes, or to
# $((p_j + 1) / 2, 1]$ if the tokens above the midpoint already hold top-p, so the second round
# draws only among tokens more likely than the rejected one; a third round is rare. A kernel's
# time follows its slowest row, though: the longest count below is the one a GPU waits for.
#
# </details>

# %%
from utils.models import load_model

lm, lm_tokenizer = load_model("shakespeare")
passage = lm_tokenizer.encode(
    "MACBETH.\nTomorrow, and tomorrow, and tomorrow,\nCreeps in this petty pace from day to "
    "day,\nTo the last syllable of recorded time;\nAnd all our yesterdays have lighted fools\n"
    "The way to dusty death. Out, out, brief candle!"
)
with torch.inference_mode():
    lm_probs = lm(torch.tensor([passage]))[0].softmax(-1)  # [positions, d_vocab]
copies = -(-1_000 // len(passage)) if QUICK else -(-5_000 // len(passage))
demo_probs = lm_probs.repeat(copies, 1).contiguous()
print(f"{demo_probs.shape[0]} rows: {len(passage)} positions of the passage, {copies} copies each")
tokens, rounds = top_k_top_p_sample(demo_probs.to(DEVICE), top_p=0.9, seed=0, return_rounds=True)
counts = torch.bincount(rounds.cpu().long())
for r, n in enumerate(counts.tolist()):
    if n:
        print(f"{r} round{'s' if r != 1 else ''}: {n} rows")

# %% tags=["claim"]
assert 0.85 < counts[1] / demo_probs.shape[0] < 0.95, "section 6 says about nine rows in ten"
assert counts[3:].sum() < 0.01 * demo_probs.shape[0], "section 6 says a third round is rare"

# %% [markdown]
# ## 7. Fused matmul + sample
#
# At the end of the model, `logits = hidden @ W_U.T` is `[batch, d_vocab]`: written to memory
# by the matmul, read back by the sampler. The Gumbel-max trick needs no normalisation, so it
# can run *inside* the matmul: each program computes a `[BLOCK_B, BLOCK_V]` tile of logits in
# registers, adds the noise, keeps only each row's best score and column of that tile, and
# writes those two numbers. A tiny reduction over the tiles then picks each row's token. The
# logits never exist in memory; the kernel's cost is the matmul's, which reads `W_U` once.
#
# ### Exercise: `fused_matmul_kernel`
#
# *About 60 minutes.*
#
# A 2-D grid: `tl.program_id(0)` picks the tile of rows, `tl.program_id(1)` the vocabulary
# tile. (Programs next to each other in the launch order then share a tile of `W_U`, which
# stays in the GPU's L2 cache between them.) Loop over `d_model` in blocks of `BLOCK_D`,
# accumulating the tile of logits, `h[rows] @ W_U[cols].T` for this tile's rows and columns, in
# float32 with `tl.dot`. Then the same scores as in `gumbel_kernel`: the `gumbel_noise` call the
# docstring gives (the tile's first column as `start`, the whole vocabulary as `n_cols`) gives
# this tile's columns the very numbers `gumbel_kernel` adds to the same (row, column), so the
# two kernels draw the same token from the same logits and seed (up to the rounding of the
# product). The tile's best per row goes into `score[row, tile]` and `col[row, tile]`; the
# wrapper (given) picks each row's best tile.
#
# One difference between the interpreter and a GPU shows here: the interpreter holds bfloat16
# values as raw 16-bit integers, and its `tl.dot` would multiply those. The wrapper sets the
# `UPCAST` flag under the interpreter for bfloat16 inputs: convert the loaded blocks to float32
# first when it is set. (A GPU multiplies bfloat16 directly, on its tensor cores.) Test the flag,
# not the setup cell's `INTERPRET`: that is a global that is not a `tl.constexpr`, which a GPU
# compiler refuses.
#
# Common mistakes: the last vocabulary tile unmasked (rows of `W_U` past $V$ are read as 0 and
# their scores can win); the column of a tile's best without the tile's start; a tile that
# reports its largest raw logit instead of its best noisy score; `hidden` or `W_U` read with
# the block's width as their row stride instead of `d_model`, or `W_U` read as if it were
# stored [d_model, d_vocab] (HF keeps it [d_vocab, d_model]); the noise
# scaled by the temperature; the accumulator, or the scores made from it, rounded to the input
# dtype before the argmax (near a logit of 96, float16 moves in steps of 1/16 and bfloat16 of
# 1/2: rows whose two best logits differ by 1/256 then tie). The interpreter upcasts bfloat16
# before `tl.dot`, which can hide that cast; float16 does not, and the compile test looks for
# it in what a GPU would run.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The wrapper's tile has at least 16 rows even for a batch of one (a GPU's tensor cores multiply
# at least 16 rows at a time), so mask the rows past the batch. `tl.dot`'s own limit is on the inner
# dimension: at least 16 for 16-bit inputs, 8 for float32 (Triton 3.9), which `BLOCK_D` meets.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The accumulator: a float32 `[BLOCK_B, BLOCK_V]` block of zeros, made before the loop.
# - Each step of the loop loads two blocks, `[BLOCK_B, BLOCK_D]` of `h` and `[BLOCK_V,
#   BLOCK_D]` of `W_U` (its rows are the vocabulary), each with its own offsets and a mask on
#   both of its axes: `d_model` need not be a multiple of `BLOCK_D`. What must a masked element
#   read as, so that it adds nothing to a dot product?
# - `tl.dot(a, b, acc)` returns `acc + a @ b` for `a` `[M, K]` and `b` `[K, N]`; `tl.trans`
#   transposes a block. Which of the two blocks must be turned round? (On a GPU with tensor
#   cores, `tl.dot` multiplies float32 inputs as TF32 by default, 10 bits of mantissa instead
#   of 23; `input_precision="ieee"` keeps them float32. 16-bit inputs and the interpreter
#   ignore the option.)
# - Scores: the accumulator over the temperature plus this tile's noise, `-inf` where the
#   column is past the vocabulary; then the best score and its column along axis 1, as in
#   `gumbel_kernel`, and the two stores at this row's entry for this tile.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("fused_matmul")`.
#
# </details>

# %% tags=["exercise"] exercise="fused_matmul"
# solution: solutions.kernels.fused_matmul.fused_matmul_kernel

# %% tags=["source"]
# solution: solutions.kernels.fused_matmul.fused_tiles
# solution: solutions.kernels.fused_matmul.fused_matmul_sample

# %%
check("fused_matmul")

# %% [markdown]
# ## 8. The speculative rejection sampler as one kernel
#
# ### Exercise: `rejection_kernel`
#
# *About 60 minutes.*
#
# Chapter 6's `rejection_sample` (same arguments, same `[batch, k + 1]` layout with -1 padding
# and the bonus token), as one kernel. Three small `@triton.jit` helpers are given just above
# the exercise cell: `_row_argmax` (greedy mode), `_residual_block` (one block of the
# distribution the main model's token is drawn from) and `_mass` (the total of those blocks).
# A jitted function calls them like any function; Triton inlines them. The uniforms come from
# the caller's generator, drawn by the wrapper: `u[:, j]` decides draft $j$ (keep iff
# $u \cdot q < p$), `u[:, k]` draws the recovered or bonus token by inverse transform, from
# $\max(0, p - q)$ renormalised (its mass in one pass, the crossing in another) or from the
# target's last position. Chapter 6's edge case too: a residual of zero mass ($p \le q$
# everywhere, the two equal up to rounding) is drawn from $p$ instead, as the bonus token is.
#
# Common mistakes: chapter 6's, now in a kernel: drafts kept after the first rejection, a bonus
# token after a rejection, the residual not renormalised (scale $u$ by its mass); the target
# read with a row stride of $k$ positions (it holds $k + 1$ per row: the bonus position too).
#
# <details><summary>Hint 1: a nudge</summary>
#
# Loop over the $k$ positions with a per-row flag "still accepting"; the number accepted
# decides which distribution the last draw uses.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Gather $p$ and $q$ at the draft token with one `tl.load` each per position. After the loop,
# the residual of the first rejected position (or the target's last row): a pass for its mass,
# a pass for the crossing, as in section 5.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("rejection_kernel")`.
#
# </details>

# %% tags=["source"]
# solution: solutions.kernels.rejection._residual_block
# solution: solutions.kernels.rejection._mass
# solution: solutions.kernels.rejection._row_argmax

# %% tags=["exercise"] exercise="rejection_kernel"
# solution: solutions.kernels.rejection.rejection_kernel

# %% tags=["source"]
# solution: solutions.kernels.rejection.rejection_sample

# %%
check("rejection_kernel")

# %% [markdown]
# ## 9. How fast, on a GPU
#
# `python benchmarks/kernels.py --plot latency.png` (on a machine with an NVIDIA GPU) times
# every kernel against the PyTorch path doing the same job, on rows shaped like a language
# model's (Zipf rows at V in {50257, 128256}, and the shipped model's own distributions) for
# batches of 1 to 256, and against the memory limit: a plain read of the same tensor, timed the
# same way in the same run, each call after the L2 cache is flushed. It prints one JSON object
# (its docstring explains every field, and derives each of its goals from the arithmetic
# below) and draws latency against batch size. One run on an H100 is recorded in
# `benchmarks/results/kernels.json`, and the README quotes its goals, met and not met. What to
# look for:
#
# - `sample_from_probs` should sit within a small factor of `floor_ms`, one read of the rows
#   (the goal: 1.5 times): its instructions take less time than the read. `torch.multinomial`
#   reads the rows five times and writes them twice (section 1). `gumbel` cannot come as close:
#   its instructions take longer than the read (below).
# - `top_p` against the sort: section 1 counted at least 20 rows' worth of traffic for the
#   sort-based path; the kernel reads the row twice per round, and `rounds` says how many
#   rounds the rows took: the slowest row (`max`) sets the kernel's time.
# - `tokens`: the last timed call's tokens are checked (valid, in the kept set, and their
#   mean probability against its expectation): a fast kernel that samples wrongly is not fast.
# - `fused`: against the matmul alone (`x_matmul`, ideally close to 1) and against matmul +
#   softmax + multinomial, which writes the `[B, V]` logits in bfloat16, reads them back and
#   writes them in float32, reads and writes them in the softmax, then reads them five times
#   and writes them twice in `torch.multinomial`. At B = 64, D = 4,096, V = 128,256 that is a
#   third more bytes than the read of `W_U` (1.41 GB against 1.05 GB), so at the same fraction
#   of the bandwidth the fused kernel is about 1.3 times faster, not more (the goal: 1.2 times).
#
# Without a GPU there is still something to read: what the GPU would run. `python
# benchmarks/sass.py` compiles every kernel for an H100 as a real launch compiles it (the
# wrappers' block sizes, the 16-byte alignment hints Triton's launcher gives) and disassembles
# the machine code with the tools Triton ships. Compiled, not timed, per block of the main loop
# (one run of that script, Triton 3.9.0, 2026-11-25; your Triton version may differ a little):
#
# | kernel (block, warps) | instructions per thread | barriers | loads | registers |
# |---|---|---|---|---|
# | softmax, bf16 (16,384, 16) | 414 | 0 | 16-byte | 64 |
# | Gumbel, sampling (16,384, 16) | 2,804: 88 per column | 5 | 16-byte | 70 |
# | Gumbel, greedy (16,384, 16) | 429 | 5 | 16-byte | 70 |
# | inverse transform, summed block (16,384, 16) | 213 | 2 | 16-byte | 128 |
# | inverse transform, scanned block (16,384, 16) | 1,070 | 6 | 16-byte | 128 |
# | top-p, a round's draw / count (8,192, 8) | 950 / 287 | 8 / 4 | 16-byte | 181 |
# | top-k, a round's draw / count (8,192, 8) | 822 / 512 | 8 / 8 | 16-byte | 141 |
# | fused matmul + sample, bf16 (64 x 128 x 64 tile, 4) | 125, 4 `wgmma` | 2 | async copies | 240 |
#
# Read it as section 1 taught. A memory-bound kernel must keep enough bytes in flight: memory
# stays busy only with bandwidth x latency on the way (Little's law), on an H100 about
# 3.35 TB/s x 0.6 µs, some 2 MB (0.6 µs is an assumed latency under load, not a published
# figure). A program issues every load of a block before it uses any, so a block is what one
# row has in flight: 16,384 float32 are 64 KB, and 64 rows keep 4 MB in flight. Blocks of
# 4,096 on 4 warps, as these kernels first had, kept 1 MB: by this count, half the bandwidth.
# So the wrappers take blocks of up to 16,384 columns, 32 per thread (16 warps; top-k / top-p,
# which keeps more per column, 8,192 on 8: `runtime.row_block`), and the compiled code shows
# the cost: no spilled register, and per column about the same work as before (except the
# inverse transform's one scanned block per row: 1,070 instructions against 689). Below about 32
# rows even that is not enough: splitting a row across programs would be the next step. (The
# inverse transform's summed blocks are a fifth of its scanned ones: the reason section 5 scans
# only where a row crosses $u$.)
#
# Gumbel sampling is another matter: 88 instructions per column, most of them the random
# number generator and two accurate logarithms (the greedy branch, which has neither, runs 429
# per block against 2,804). An H100 issues about $10^{12}$ warp instructions a second (132 SMs x
# 4 schedulers, each one warp instruction per clock, x 1.98 GHz), so 64 rows of 128,256, one
# per SM, take about 45 µs, over four times the read (about 4.6): arithmetic, not bytes, on a
# GPU too. Even spread over all 132 SMs they would take 2.2 reads, so the benchmark's goal for
# Gumbel sampling is 6 times one read, not 2.
# The top-k / top-p rounds are partly arithmetic too: a round's draw pass scans every block, and
# its 950 instructions per thread for each of a row's 16 blocks (8 warps) take about 15 µs, 1.6
# reads, before the count pass reads the row again.
# The fused kernel pays for the same noise once per tile, after its loop: 5,600 - 872 = 4,728
# instructions per thread for a 64 x 128 tile (with `tl.rand` for each logit, compiled the same
# way, 7,944 - 872 = 7,072), about 60 % of the 64 loop steps a d_model of 4,096 takes and three
# times the 12 steps of GPT-2's 768.
#
# **On Colab.** Which GPUs Colab offers depends on the plan and changes over time (the course
# cannot check it; *Runtime > Change runtime type* lists them); `!nvidia-smi` in a cell names
# the one you got. What matters here is its compute capability, and what Triton compiles for it
# can be read without one: `python benchmarks/sass.py --kernel fused_matmul --arch 75`.
#
# - **T4** (compute capability 7.5, the free plan's usual one; 320 GB/s, 40 SMs, 4 MB of L2):
#   every kernel compiles and samples exactly, and the sampling kernels are still memory-bound,
#   only about ten times slower than on an H100 (a [64, 128256] float32 batch takes about 100 µs
#   to read). But Triton uses tensor cores from compute capability 8.0 on: on a T4 the fused
#   kernel's `tl.dot` compiles to ordinary float32 multiply-adds (4,096 `FFMA` per thread per
#   tile step of the bf16 launch, no tensor-core instruction), while cuBLAS multiplies on the
#   T4's tensor cores. So on a T4 expect `fused` to lose to the matmul by a wide margin: correct,
#   and slow. The benchmark times the fused kernel in float16 there (`fused_dtype`): the T4's
#   tensor cores multiply float16, not bfloat16.
# - **L4** (8.9; 300 GB/s, 58 SMs, 48 MB of L2) and **A100** (8.0; 1.6 to 2.0 TB/s, 108 SMs,
#   40 MB of L2): `tl.dot` runs on the tensor cores (`mma`: HMMA instructions, 64 per tile
#   step; an H100 issues 4 `wgmma` instead), with asynchronous copies. All of the benchmark
#   applies. Its goals are derived from an H100's figures: those set by bytes carry over
#   roughly, since a slower memory makes every floor longer together, but the ones set by
#   instructions (Gumbel sampling, the top-k / top-p rounds) follow a card's ratio of
#   instruction rate to bandwidth, which differs from card to card.
#
# On any of them, look first at `x_floor` (how far each kernel is from one read of its rows) and
# `rounds`, then at the ratios against PyTorch; the absolute microseconds say which card you got.
#
# Without a GPU, `python benchmarks/kernels.py --device cpu --interpret --quick` runs the
# benchmark through the interpreter on tiny shapes: a check that it works, not a measurement.
# Interpreter timings say nothing about a GPU: the interpreter runs every program of the grid
# one after another in NumPy on the CPU, so its times follow Python's overheads and the grid's
# size, not bytes and bandwidth. Do not compare a kernel with PyTorch on a CPU run.
#
# ## Further reading
#
# - The Triton tutorials, above all "Fused Softmax" (one row per program, the row kept in
#   registers: section 3's kernel) and "Matrix Multiplication" (tiles, `tl.dot`, grouped
#   ordering: section 7's).
# - FlashInfer's blog post on sorting-free sampling ("Sorting-Free GPU Kernels for LLM
#   Sampling", March 2025, [flashinfer.ai/2025/03/10/sampling.html](
#   https://flashinfer.ai/2025/03/10/sampling.html)): rejection sampling with pivots for top-k
#   and top-p, section 6's idea, dual pivots since FlashInfer 0.2.3. Its kernels, in CUDA C++:
#   `include/flashinfer/sampling.cuh` (read here at commit `fb28d72`, August 2026, where
#   `TopPSamplingFromProbKernel` starts from $(0, 1]$ and a mass of 1 as section 6 does); its
#   sampling tests are ported in this repository's `tests/peers/`.
# - vLLM's sampler (`vllm/v1/sample/`): `sampler.py` applies penalties and temperature to the
#   batch's logits with PyTorch operations; `ops/topk_topp_sampler.py` samples top-k / top-p
#   with a sort in PyTorch, or with FlashInfer's kernels when `VLLM_USE_FLASHINFER_SAMPLER=1`;
#   `rejection_sampler.py` is section 8's contract as Triton kernels (read at commits
#   `3e34265`, `3babc05` and `7f6fc1c`). Later versions add `ops/topk_topp_triton.py` (read at
#   `08a5723`), a Triton kernel that finds the top-k / top-p threshold by a search over
#   pivots, without a sort, and masks the logits below it.
#
# ## Check your understanding
#
# - Why can Gumbel-max run inside the matmul while inverse-transform sampling cannot?
#
# <details><summary>Answer</summary>
#
# Inverse transform needs the normalised probabilities, so the whole row's sum, before it can
# place $u$; the matmul produces the row tile by tile. Gumbel-max compares unnormalised scores,
# so each tile's best can be decided alone and the tiles' bests compared at the end.
#
# </details>
#
# - Sampling from probabilities needs one random number per row; Gumbel-max needs one per
#   token. When is Gumbel-max still the better choice?
#
# <details><summary>Answer</summary>
#
# When the input is logits and its arithmetic costs less than the traffic it saves. The softmax
# that inverse transform would need reads the row twice and writes it once before the sampler
# reads it again: four reads' worth with this chapter's kernels. Gumbel-max reads the row once
# and pays in arithmetic instead: on an H100, by section 9's count, about 2.2 reads' worth when
# the rows keep all 132 SMs busy, 4.6 at a batch of 64, when one row per SM leaves half of
# them idle. And always inside a fused matmul, for the reason above.
#
# </details>
#
# - Top-p with `top_p = 1.0` and plain sampling give the same tokens from the kernel. How many
#   rounds does each take, and why?
#
# <details><summary>Answer</summary>
#
# One: every token of positive probability is kept, so the first draw is accepted. (The
# wrapper passes top-p 1.0 as "off", so the kernel does not even run the test.)
#
# </details>
#
# ## What's next
#
# Serving engines build on the same pieces. FlashInfer's sampling kernels take a different
# top-k or top-p per row in one launch (its softmax a temperature per row), add min-p (keep
# tokens at least a fraction of the most likely one's probability), and apply top-k and top-p
# together; vLLM runs the speculative verifier of section 8 as Triton kernels, which take the
# draft's probabilities or, for n-gram drafts, none (a draft probability of 1). The ideas are
# the ones you used: read each row as few times as possible, carry a few numbers in registers
# from block to block, and let rejection sampling replace a sort.
