"""Chapter 6's learner-style mutants: the Triton kernels (see tests/machinery/mutants/__init__.py).
Each is a mistake of someone writing their first kernels: a block's offset forgotten, a mask
left off, the temperature on the noise, a prefix that restarts, a pivot test one sign off; and
Python that Triton's interpreter runs and a GPU compiler refuses (a `break`, a global that is not
a constexpr), which only the compile tests catch."""

from tests.machinery.mutants import Mutant

MUTANTS: list[Mutant] = [
    # softmax_kernel
    Mutant(
        "softmax_kernel",
        'other=float("-inf"))\n        x = x.to(tl.float32)',
        "other=0.0)\n        x = x.to(tl.float32)",
        "masked columns loaded as 0, not -inf: a 0 joins the max and the sum",
        name="other-zero",
    ),
    Mutant(
        "softmax_kernel",
        "s = s * tl.exp(m - shift) + ",
        "s = s + ",
        "the running sum not rescaled when the running max grows",
        name="sum-not-rescaled",
    ),
    Mutant(
        "softmax_kernel",
        "y = tl.exp(x.to(tl.float32) - m[:, None]) / s[:, None]",
        "y = tl.exp(x.to(tl.float32)) / s[:, None]",
        "the max not subtracted when writing: exp overflows on large logits",
        name="no-max-subtracted",
    ),
    Mutant(
        "softmax_kernel",
        "        mask = row_ok[:, None] & (cols < n_cols)[None, :]\n"
        '        x = tl.load(x_ptr + row_start + cols[None, :], mask=mask, other=float("-inf"))\n'
        "        x = x.to(tl.float32)",
        "        mask = row_ok[:, None] & (cols < n_cols)[None, :]\n"
        "        x = tl.load(x_ptr + row_start + cols[None, :], mask=row_ok[:, None], other=0.0)\n"
        "        x = x.to(tl.float32)",
        "the last block of the first pass loaded without its column mask: it reads the next row",
        name="last-block-unmasked",
    ),
    Mutant(
        "softmax_kernel",
        "    for start in range(0, n_cols, BLOCK_V):\n"
        "        cols = start + tl.arange(0, BLOCK_V)\n"
        "        mask = row_ok[:, None] & (cols < n_cols)[None, :]\n"
        '        x = tl.load(x_ptr + row_start + cols[None, :], mask=mask, other=float("-inf"))\n'
        "        x = x.to(tl.float32)",
        "    for start in range(0, BLOCK_V, BLOCK_V):\n"
        "        cols = start + tl.arange(0, BLOCK_V)\n"
        "        mask = row_ok[:, None] & (cols < n_cols)[None, :]\n"
        '        x = tl.load(x_ptr + row_start + cols[None, :], mask=mask, other=float("-inf"))\n'
        "        x = x.to(tl.float32)",
        "the max and the sum taken over the first block only",
        name="first-block-only",
    ),
    # gumbel_kernel
    Mutant(
        "gumbel_kernel",
        "scores = x * inv_temperature + gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)",
        "scores = (x + gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V))"
        " * inv_temperature",
        "the temperature divides the noisy logits: (x + G) / T samples at T = 1",
        name="temperature-after-noise",
    ),
    Mutant(
        "gumbel_kernel",
        "scores = x * inv_temperature + gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)",
        "scores = x * inv_temperature - gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)",
        "the noise subtracted: -G is not Gumbel noise (argmax(x - G) is not a softmax sample)",
        name="noise-subtracted",
    ),
    Mutant(
        "gumbel_kernel",
        "gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)",
        "gumbel_noise(seed, rows * 0, start, n_cols, BLOCK_B, BLOCK_V)",
        "the noise forgets the row: every row gets the same noise",
        name="offset-without-row",
    ),
    Mutant(
        "gumbel_kernel",
        "gumbel_noise(seed, rows, start, n_cols, BLOCK_B, BLOCK_V)",
        "gumbel_noise(seed, rows, 0, n_cols, BLOCK_B, BLOCK_V)",
        "the noise forgets the block's start: every block of a row gets the first block's noise",
        name="noise-without-block-start",
    ),
    Mutant(
        "gumbel_kernel",
        "better = block_best > best",
        "better = block_best >= best",
        "a later block wins a tie: at temperature 0, not torch.argmax's lowest column",
        name="tie-to-later-block",
    ),
    Mutant(
        "gumbel_kernel",
        "block_col = start + tl.argmax(scores, axis=1)",
        "block_col = tl.argmax(scores, axis=1)",
        "the column of a block's best without the block's start",
        name="column-without-start",
    ),
    Mutant(
        "gumbel_kernel",
        "        if GREEDY:\n            scores = x\n        else:\n",
        "        if True:\n",
        "temperature 0 not special-cased: inv_temperature 0 leaves pure noise",
        name="no-greedy",
    ),
    # inverse_transform
    Mutant(
        "inverse_transform",
        "prefix = total[:, None] + tl.cumsum(p, axis=1)",
        "prefix = tl.cumsum(p, axis=1)",
        "the prefix sum restarts at each block",
        name="prefix-restarts",
    ),
    Mutant(
        "inverse_transform",
        "crossing = (chosen < 0) & (total + block_total > u)",
        "crossing = (chosen < 0) & (total > u)",
        "a block is scanned only after the running total has passed u: one block too late",
        name="scan-a-block-late",
    ),
    Mutant(
        "inverse_transform",
        "        total += block_total\n",
        "",
        "the running total is never carried from block to block",
        name="total-not-carried",
    ),
    Mutant(
        "inverse_transform",
        "chosen = tl.where(chosen < 0, last_possible, chosen)",
        "chosen = tl.where(chosen < 0, n_cols - 1, chosen)",
        "rounding's fallback is the last column, whatever its probability",
        name="fallback-last-column",
    ),
    Mutant(
        "inverse_transform",
        "\n        chosen = tl.where(chosen < 0, last_possible, chosen)",
        "",
        "no fallback when rounding leaves u above every prefix: -1 comes out",
        name="no-fallback",
    ),
    Mutant(
        "inverse_transform",
        "last_possible = tl.max(tl.where(mask & (p > 0), cols, -1), axis=1)",
        "last_possible = tl.max(tl.where(mask, cols, -1), axis=1)",
        "the fallback takes the last column of the block, whatever its probability: a row of "
        "zeros returns a token",
        name="fallback-ignores-p",
    ),
    Mutant(
        "inverse_transform",
        "u = tl.rand(seed, rows)",
        "u = tl.rand(seed, tl.program_id(0) + tl.arange(0, BLOCK_B))",
        "the offset program_id + arange: neighbouring programs share their uniforms",
        name="program-offsets-overlap",
    ),
    Mutant(
        "inverse_transform",
        "u = tl.rand(seed, rows)",
        "u = tl.rand(seed, rows * 0)",
        "one uniform for all rows",
        name="same-uniform",
    ),
    Mutant(
        "inverse_transform",
        "first = tl.min(tl.where(crossed, cols[None, :], n_cols), axis=1)",
        "first = tl.min(tl.where(crossed, cols[None, :] - start, n_cols), axis=1)",
        "the crossing column counted from the block's start",
        name="column-without-start",
    ),
    Mutant(
        "inverse_transform",
        "            chosen = tl.where((chosen < 0) & (first < n_cols), first, chosen)\n",
        "            chosen = tl.where((chosen < 0) & (first < n_cols), first, chosen)\n"
        "            if tl.min(tl.where(row_ok, chosen, 0), axis=0) >= 0:\n"
        "                break  # every row has its token: the blocks after it change nothing\n",
        "the loop left with `break` once every row has its token: right under the "
        "interpreter, refused by a GPU compiler",
        name="break-when-all-found",
    ),
    # top_k_top_p
    Mutant(
        "top_k_top_p",
        "keep0 = mass0 < top_p * total",
        "keep0 = mass0 <= top_p * total",
        "top-p keeps a token whose more likely tokens hold exactly top_p",
        name="top-p-boundary-kept",
    ),
    Mutant(
        "top_k_top_p",
        "u = tl.rand(seed, rows * MAX_ROUNDS + i) * mass",
        "u = tl.rand(seed, rows + i) * mass",
        "round i of row r draws with offset r + i: row r + 1's first round reuses it",
        name="round-offset-overlaps-next-row",
    ),
    Mutant(
        "top_k_top_p",
        "u = tl.rand(seed, rows * MAX_ROUNDS + i) * mass",
        "u = tl.rand(seed, rows * MAX_ROUNDS) * mass",
        "one uniform for every round of a row",
        name="one-uniform-for-all-rounds",
    ),
    Mutant(
        "top_k_top_p",
        "above0 = p > pivot0[:, None]",
        "above0 = p >= pivot0[:, None]",
        "the pivot's own token counted above it: the token that crosses top-p is dropped",
        name="pivot-drops-crossing-token",
    ),
    Mutant(
        "top_k_top_p",
        "u = tl.rand(seed, rows * MAX_ROUNDS + i) * mass",
        "u = tl.rand(seed, rows * MAX_ROUNDS + i)",
        "u not scaled by the mass of the candidates left",
        name="u-not-scaled",
    ),
    Mutant(
        "top_k_top_p",
        "        mass = tl.where(narrow, mass0, tl.where(skip, mass1, mass))\n",
        "",
        "the candidates' mass not updated when low rises",
        name="mass-not-updated",
    ),
    Mutant(
        "top_k_top_p",
        "keep0 = count0 < top_k",
        "keep0 = count0 <= top_k",
        "top-k keeps a token with k more likely tokens: k + 1 tokens",
        name="top-k-off-by-one",
    ),
    Mutant(
        "top_k_top_p",
        "low = tl.where(narrow, pivot0, tl.where(skip, pivot1, low))",
        "low = tl.where(narrow, pivot1, tl.where(skip, pivot1, low))",
        "low raised to the second pivot even when that pivot passed",
        name="low-past-threshold",
    ),
    Mutant(
        "top_k_top_p",
        "q = tl.where(p.to(tl.float32) > low[:, None], p.to(tl.float32), 0.0)",
        "q = p.to(tl.float32)",
        "every round draws from the whole row: rejected tokens come back",
        name="candidates-not-restricted",
    ),
    # fused_matmul
    Mutant(
        "fused_matmul",
        "scores = acc * inv_temperature + noise",
        "scores = (acc + noise) * inv_temperature",
        "the temperature divides the noisy logits: (x + G) / T samples at T = 1",
        name="temperature-after-noise",
    ),
    Mutant(
        "fused_matmul",
        "scores = acc * inv_temperature + noise",
        "scores = acc * inv_temperature - noise",
        "the noise subtracted: -G is not Gumbel noise, and the draws follow another law",
        name="noise-subtracted",
    ),
    Mutant(
        "fused_matmul",
        '    scores = tl.where(col_ok[None, :], scores, float("-inf"))',
        "    scores = scores",
        "columns past the vocabulary keep their score: the last tile's padding can win",
        name="last-tile-unmasked",
    ),
    Mutant(
        "fused_matmul",
        "best_col = tile * BLOCK_V + tl.argmax(scores, axis=1)",
        "best_col = tl.argmax(scores, axis=1)",
        "the column of a tile's best without the tile's start",
        name="column-without-tile",
    ),
    Mutant(
        "fused_matmul",
        "for d0 in range(0, d_model, BLOCK_D):",
        "for d0 in range(0, BLOCK_D, BLOCK_D):",
        "the dot product over the first BLOCK_D dimensions only",
        name="first-d-block-only",
    ),
    Mutant(
        "fused_matmul",
        "        if UPCAST:\n",
        "        if INTERPRET:\n",
        "the setup cell's INTERPRET read in the kernel instead of the UPCAST flag: a global that "
        "is not a constexpr, which the interpreter reads and a GPU compiler refuses",
        name="interpret-global",
    ),
    Mutant(
        "fused_matmul",
        "    if GREEDY:\n        scores = acc\n",
        "    if GREEDY:\n        scores = acc.to(h.dtype)\n",
        "the float32 accumulator cast back to the input dtype before the argmax",
        name="accumulator-cast-back",
    ),
    Mutant(
        "fused_matmul",
        "    if GREEDY:\n        scores = acc\n",
        "    if GREEDY:\n        scores = acc.to(w_ptr.dtype.element_ty)\n",
        "the float32 accumulator cast to the weights' dtype before the argmax",
        name="accumulator-cast-to-weight-dtype",
    ),
    Mutant(
        "fused_matmul",
        "gumbel_noise(seed, rows, tile * BLOCK_V, n_vocab, BLOCK_B, BLOCK_V)",
        "gumbel_noise(seed, rows * 0, tile * BLOCK_V, n_vocab, BLOCK_B, BLOCK_V)",
        "the noise of row 0 for every row: all rows draw the same token",
        name="noise-without-row",
    ),
    Mutant(
        "fused_matmul",
        "gumbel_noise(seed, rows, tile * BLOCK_V, n_vocab, BLOCK_B, BLOCK_V)",
        "gumbel_noise(seed, rows, 0, n_vocab, BLOCK_B, BLOCK_V)",
        "the noise of the first tile's columns in every tile: column c and c + BLOCK_V share it",
        name="noise-without-tile-start",
    ),
    # rejection_kernel
    Mutant(
        "rejection_kernel",
        "u = tl.load(u_ptr + rows64 * (k + 1) + j, mask=row_ok, other=1.0)",
        "u = tl.load(u_ptr + rows64 * k + j, mask=row_ok, other=1.0)",
        "the uniforms' row stride k, not k + 1: rows read each other's uniforms",
        name="u-row-stride-k",
    ),
    Mutant(
        "rejection_kernel",
        "u = tl.load(u_ptr + rows64 * (k + 1) + j, mask=row_ok, other=1.0)",
        "u = tl.load(u_ptr + rows64 * (k + 1), mask=row_ok, other=1.0)",
        "one uniform reused for the k drafts of a row",
        name="one-u-per-row",
    ),
    Mutant(
        "rejection_kernel",
        "        keep = keep & going  # a draft after a rejection never counts\n",
        "",
        "drafts kept after the first rejection",
        name="kept-after-rejection",
    ),
    Mutant(
        "rejection_kernel",
        "keep = u * q < p",
        "keep = u * p < q",
        "the acceptance ratio upside down",
        name="ratio-upside-down",
    ),
    Mutant(
        "rejection_kernel",
        "            use_p = use_p | empty\n",
        "",
        "a residual of zero mass sampled anyway: no token comes out (-1)",
        name="zero-residual",
    ),
    Mutant(
        "rejection_kernel",
        "use_p = n_accepted == k",
        "use_p = n_accepted >= 0",
        "the recovered token resampled from p, not from max(0, p - q)",
        name="resample-from-p",
    ),
    Mutant(
        "rejection_kernel",
        "tl.load(u_ptr + rows64 * (k + 1) + k, mask=row_ok, other=0.0) * mass",
        "tl.load(u_ptr + rows64 * (k + 1) + k, mask=row_ok, other=0.0)",
        "the residual sampled as if its mass were 1 (not renormalised)",
        name="residual-not-renormalised",
    ),
    Mutant(
        "rejection_kernel",
        "    at = n_accepted.to(tl.int64)",
        "    at = tl.minimum(n_accepted, k - 1).to(tl.int64)",
        "no bonus column: when all k are kept, the last draft is overwritten",
        name="no-bonus-column",
    ),
    # one_pivot (the stepping stone, in PyTorch)
    Mutant(
        "one_pivot",
        "if float(probs[probs > pivot].sum()) < top_p:",
        "if float(probs[probs > pivot].sum()) <= top_p:",
        "`<=` for `<`: a token whose more likely tokens hold exactly top-p is kept",
    ),
    Mutant(
        "one_pivot",
        "if float(probs[probs > pivot].sum()) < top_p:",
        "if float(probs[probs >= pivot].sum()) < top_p:",
        "sums the tokens at least as likely as the draw, itself included",
    ),
    Mutant(
        "one_pivot",
        "candidates = torch.where(probs > low, probs, 0.0)",
        "candidates = probs",
        "draws from the whole row every round: exact, but many more rounds",
    ),
    Mutant(
        "one_pivot",
        "\n        low = float(pivot)",
        "",
        "never raises low after a rejection",
    ),
    Mutant(
        "one_pivot",
        "token = int(torch.multinomial(candidates, 1, generator=generator))",
        "token = int(torch.multinomial(candidates, 1))",
        "draws without the generator",
    ),
    Mutant(
        "one_pivot",
        "        rounds += 1\n",
        "",
        "never counts its rounds",
    ),
]
