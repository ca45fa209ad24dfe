"""Chapter 4's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    Mutant(
        "causal_mask",
        "ones = torch.ones(n_query, n_key, dtype=torch.bool, device=device)",
        "ones = torch.ones(n_query, n_key, dtype=torch.bool)",
        "the mask made on the CPU whatever the device asked for",
        says=("device=",),
    ),
    Mutant(
        "causal_mask",
        "return torch.triu(ones, diagonal=offset + 1)",
        "return torch.triu(ones, diagonal=1)",
        "chapter 1's mask, not shifted by the cached positions",
        says=("chapter 1's mask", "shift"),
    ),
    Mutant(
        "causal_mask",
        "return torch.triu(ones, diagonal=offset + 1)",
        "return torch.triu(ones, diagonal=offset)",
        "each query also hidden from its own key",
        says=("own key",),
    ),
    Mutant(
        "causal_mask",
        "return torch.triu(ones, diagonal=offset + 1)",
        "return torch.tril(ones, diagonal=offset)",
        "True where attention is allowed instead of where it is hidden",
        says=("true where", "hidden"),
    ),
    # attention_with_cache
    Mutant(
        "attention_with_cache",
        "keys = torch.cat([past_keys, k], dim=2)",
        "keys = torch.cat([k, past_keys], dim=2)",
        "new keys put before the cached ones",
        says=("new keys", "after"),
    ),
    Mutant(
        "attention_with_cache",
        "return out, keys, values",
        "return out, k, v",
        "only the new keys and values returned: the cache forgets the past",
        says=("all positions", "past"),
    ),
    Mutant(
        "attention_with_cache",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, is_causal=allowed is not None)",
        "is_causal=True: PyTorch aligns that mask top left, wrong after a cache",
        says=("is_causal", "top left"),
    ),
    Mutant(
        "attention_with_cache",
        'out = torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O',
        'out = torch.einsum("bhpe,hed->bpd", z, attn.W_O)',
        "the output bias b_O forgotten",
        says=("b_O",),
    ),
    Mutant(
        "attention_with_cache",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=1.0)",
        "scores not scaled by 1/sqrt(d_head)",
        says=("sqrt(d_head)",),
    ),
    # forward_with_cache
    Mutant(
        "forward_with_cache",
        "positions = torch.arange(cache.length, n_all, device=tokens.device)",
        "positions = torch.arange(n_new, device=tokens.device)",
        "positions restart at 0 at every step",
        says=("positions", "cache.length"),
    ),
    Mutant(
        "forward_with_cache",
        "allowed = None if n_new == 1 else ~causal_mask(n_new, n_all, device=tokens.device)",
        "allowed = None",
        "no mask for a chunk of several new tokens: a prefill reads the future",
        says=("mask", "chunk"),
    ),
    Mutant(
        "forward_with_cache",
        "allowed = None if n_new == 1 else ~causal_mask(n_new, n_all, device=tokens.device)",
        "allowed = None if n_new == 1 else ~causal_mask(n_new, n_new, device=tokens.device)",
        "the chunk's mask covers the new keys only",
        says=("mask", "cached key"),
    ),
    Mutant(
        "forward_with_cache",
        "block.attn, block.ln1(residual), past_k, past_v, allowed",
        "block.attn, residual, past_k, past_v, allowed",
        "attention reads the residual stream without ln1",
        says=("ln1",),
    ),
    Mutant(
        "forward_with_cache",
        "residual = residual + block.mlp(block.ln2(residual))",
        "residual = residual + block.mlp(block.ln2(residual - attn_out))",
        "the MLP reads the residual stream from before the attention was added",
        says=("mlp", "attention"),
    ),
    Mutant(
        "forward_with_cache",
        "logits = model.unembed(model.ln_final(residual))",
        "logits = model.unembed(residual)",
        "no final LayerNorm",
        says=("final layernorm",),
    ),
    # positions_and_allowed
    Mutant(
        "positions_and_allowed",
        "positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -n_new:]",
        "positions = torch.arange(mask.shape[1] - n_new, mask.shape[1], device=mask.device)[None]",
        "padding counted in the positions",
        name="positions-count-padding",
        says=("padding", "positions"),
    ),
    Mutant(
        "positions_and_allowed",
        "positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -n_new:]",
        "positions = (mask.cumsum(dim=1) - 1)[:, -n_new:]",
        "positions not clamped: padding at -1 reads the last row of W_pos",
        says=("clamp", "W_pos"),
    ),
    Mutant(
        "positions_and_allowed",
        "positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -n_new:]",
        "positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, :n_new]",
        "the positions of the first n_new columns, not the last",
        says=("first n_new", "last"),
    ),
    Mutant(
        "positions_and_allowed",
        "allowed = causal & (mask[:, None, None, :] | own_key)",
        "allowed = causal & mask[:, None, None, :]",
        "padding queries see no key at all (NaN with a hand-written softmax)",
        says=("own key",),
    ),
    Mutant(
        "positions_and_allowed",
        "allowed = causal & (mask[:, None, None, :] | own_key)",
        "allowed = causal.expand(mask.shape[0], 1, n_new, n_all)",
        "padding keys not hidden from real queries",
        says=("padding keys",),
    ),
    Mutant(
        "positions_and_allowed",
        "allowed = causal & (mask[:, None, None, :] | own_key)",
        "allowed = mask[:, None, None, :] | own_key",
        "no causal mask once padding is handled",
        says=("causal",),
    ),
    Mutant(
        "positions_and_allowed",
        "own_key = column[None, :] == column[-n_new:, None]",
        "own_key = column[None, :] == column[:n_new, None]",
        "own keys taken from the first columns: after a cache, a new query sees column 0",
        says=("own key", "last n_new"),
    ),
    # CachedTransformerSampler
    Mutant(
        "cached_sample",
        "logits, self.cache = forward_with_cache(self.model, input_ids[None, -1:], self.cache)",
        "logits, self.cache = forward_with_cache(self.model, input_ids[None, -1:])",
        "the cache not passed: every step sees one token",
        says=("cache", "last token alone"),
    ),
    Mutant(
        "cached_sample",
        "logits, self.cache = forward_with_cache(self.model, input_ids[None, -n_ctx:])",
        "logits, self.cache = forward_with_cache(self.model, input_ids[None])",
        "the prefill reads the whole prompt: a prompt longer than n_ctx overflows the positions",
        name="prefill-not-cropped",
        says=("prefill", "last n_ctx"),
        try_first="test_cached_sampling_of_a_prompt_longer_than_n_ctx",
    ),
    Mutant(
        "cached_sample",
        "keep = n_ctx - self.window_shift + 1",
        "keep = n_ctx - self.window_shift",
        "the rebuilt window one token short",
        says=("window_shift", "n_ctx - window_shift + 1"),
        try_first="test_cached_sampling_past_n_ctx_slides_the_window",
    ),
    Mutant(
        "cached_sample",
        "        elif self.cache.length == n_ctx:\n",
        "        elif self.cache.length > n_ctx:\n",
        "the window slid one step too late (the cache overflows n_ctx)",
        says=("full", "n_ctx"),
        try_first="test_cached_sampling_past_n_ctx_slides_the_window",
    ),
    # CachedBeams
    Mutant(
        "cached_beams",
        "cache = None if self.cache is None else self.cache[self.parents]",
        "cache = self.cache",
        "the cache does not follow the beams it keeps",
        says=("cache[parents]",),
    ),
    Mutant(
        "cached_beams",
        "parents = torch.arange(len(self), device=tokens.device).repeat_interleave(k)",
        "parents = torch.arange(len(self), device=tokens.device).repeat(k)",
        "parents cycle through the beams instead of repeating each k times",
        says=("parents", "repeat_interleave"),
    ),
    # left_pad
    Mutant(
        "left_pad",
        "tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)",
        "tokens = torch.zeros((len(prompts), width), dtype=torch.long)",
        "padding with 0 instead of pad_id",
        says=("pad_id", "not 0"),
    ),
    Mutant(
        "left_pad",
        "            tokens[row, -len(prompt) :] = torch.tensor(prompt)\n"
        "            mask[row, -len(prompt) :] = True\n",
        "            tokens[row, : len(prompt)] = torch.tensor(prompt)\n"
        "            mask[row, : len(prompt)] = True\n",
        "padding on the right",
        says=("on the right", "left"),
    ),
    Mutant(
        "left_pad",
        "        if prompt:\n"
        "            tokens[row, -len(prompt) :] = torch.tensor(prompt)\n"
        "            mask[row, -len(prompt) :] = True\n",
        "        tokens[row, -len(prompt) :] = torch.tensor(prompt)\n"
        "        mask[row, -len(prompt) :] = True\n",
        "an empty prompt not skipped: tokens[row, -0:] is the whole row",
        says=("empty prompt", "-0"),
    ),
    Mutant(
        "left_pad",
        "mask = torch.zeros((len(prompts), width), dtype=torch.bool)",
        "mask = torch.zeros((len(prompts), width), dtype=torch.long)",
        "a mask of 0s and 1s instead of bools",
        says=("bool",),
    ),
    # generate_batch_tokens
    Mutant(
        "generate_batch",
        "logits, cache = forward_with_cache(model, tokens, attention_mask=mask)",
        "logits, cache = forward_with_cache(model, tokens)",
        "the prefill without the attention mask: padding read as text",
        says=("attention_mask=mask", "prefill"),
    ),
    Mutant(
        "generate_batch",
        "generator=generator, attention_mask=cache.mask, **kwargs",
        "generator=generator, **kwargs",
        "padding counted by the frequency penalty",
        says=("padding", "frequency penalty"),
        try_first="test_batched_frequency_penalty_counts_each_row_alone",
    ),
    Mutant(
        "generate_batch",
        "generator=generator, attention_mask=cache.mask, **kwargs",
        "attention_mask=cache.mask, **kwargs",
        "the seeded generator not passed on",
        says=("generator",),
        try_first="test_batched_sampling_is_reproducible_under_a_seed",
    ),
    Mutant(
        "generate_batch",
        "        next_token = torch.where(done, eos, next_token)\n",
        "",
        "finished rows keep writing real tokens",
        says=("finished row", "padding"),
        try_first="test_finished_rows_are_fed_padding",
    ),
    Mutant(
        "generate_batch",
        "if bool(done.all()):",
        "if bool(done.any()):",
        "stops when the first row finishes",
        says=("every row",),
        try_first="test_batched_frequency_penalty_counts_each_row_alone",
    ),
    Mutant(
        "generate_batch",
        "done = done | (stop_at_eos & (next_token == eos))",
        "done = done | (next_token == eos)",
        "stop_at_eos=False ignored",
        says=("stop_at_eos",),
        try_first="test_batched_without_stop_at_eos_writes_every_token",
    ),
    Mutant(
        "generate_batch",
        "model, next_token[:, None], cache, attention_mask=~done[:, None]",
        "model, next_token[:, None], cache",
        "a finished row's padding fed as real tokens",
        says=("finished row", "attention_mask=~done"),
        try_first="test_finished_rows_are_fed_padding",
    ),
    Mutant(
        "generate_batch",
        "        logits, cache = forward_with_cache(\n"
        "            model, next_token[:, None], cache, attention_mask=~done[:, None]\n"
        "        )\n"
        "        done = done | (stop_at_eos & (next_token == eos))\n",
        "        done = done | (stop_at_eos & (next_token == eos))\n"
        "        logits, cache = forward_with_cache(\n"
        "            model, next_token[:, None], cache, attention_mask=~done[:, None]\n"
        "        )\n",
        "a row marked done before its end-of-text is fed: the text loses that token",
        says=("end-of-text", "done"),
        try_first="test_batched_frequency_penalty_counts_each_row_alone",
    ),
    Mutant(
        "generate_batch",
        "cache.tokens, logits[:, -1], generator=generator, attention_mask=cache.mask, **kwargs",
        "tokens, logits[:, -1], generator=generator, attention_mask=mask, **kwargs",
        "the frequency penalty counts the prompt only, not the generated tokens",
        says=("frequency penalty", "generated"),
        try_first="test_batched_frequency_penalty_counts_each_row_alone",
    ),
    # issue 33: slips a learner's run of the blank notebook made, each to be named
    Mutant(
        "attention_with_cache",
        "return (rows @ W + b[:, None]).unflatten(1, x.shape[:2]).transpose(0, 1)",
        "return (rows @ W + b).unflatten(1, x.shape[:2]).transpose(0, 1)",
        "the bias added without its head axis: it lines up with the positions instead",
        says=("bias", "head axis"),
    ),
    Mutant(
        "forward_with_cache",
        "allowed = None if n_new == 1 else ~causal_mask(n_new, n_all, device=tokens.device)",
        "allowed = None if n_new == 1 else causal_mask(n_new, n_all, device=tokens.device)",
        "causal_mask passed as `allowed` without inverting it: it is True where keys are hidden",
        says=("causal_mask", "hidden", "allowed"),
    ),
    Mutant(
        "cached_sample",
        "logits, self.cache = forward_with_cache(self.model, input_ids[None, -n_ctx:])",
        "logits, cache = forward_with_cache(self.model, input_ids[None, -n_ctx:])",
        "the prefill's cache kept in a local variable: self.cache stays None, every step a prefill",
        says=("self.cache", "prefill"),
        try_first="test_the_sampler_keeps_its_cache_and_feeds_one_token_a_step",
    ),
    Mutant(
        "cached_beams",
        "logits, cache = forward_with_cache(self.model, self.tokens[:, -1:], cache)",
        "logits, cache = forward_with_cache(self.model, self.tokens[:, -2:], cache)",
        "each step feeds the last two tokens: the one before the newest is cached already",
        says=("newest", "already"),
    ),
    Mutant(
        "generate_batch",
        "        next_token = torch.where(done, eos, next_token)\n",
        "        next_token = torch.where(done, eos, next_token)\n"
        "        if _ == max_tokens_generated - 1:\n"
        "            break\n",
        "the last sampled token never fed: the text, read from the cache, loses it",
        says=("last", "fed"),
    ),
    # made on the CPU whatever the device (a GPU's failure, found on a CPU: tests/graded/_device.py)
    Mutant(
        "forward_with_cache",
        "positions = torch.arange(cache.length, n_all, device=tokens.device)",
        "positions = torch.arange(cache.length, n_all)",
        "the positions made on the CPU whatever the tokens' device",
        says=("without a device", "tokens' device"),
    ),
    Mutant(
        "positions_and_allowed",
        "column = torch.arange(n_all, device=mask.device)",
        "column = torch.arange(n_all)",
        "the columns' numbers made on the CPU whatever the mask's device",
        says=("without a device", "mask's device"),
    ),
    Mutant(
        "cached_beams",
        "parents = torch.arange(len(self), device=tokens.device).repeat_interleave(k)",
        "parents = torch.arange(len(self)).repeat_interleave(k)",
        "the parents made on the CPU whatever the tokens' device",
        says=("without a device", "tokens' device"),
    ),
    Mutant(
        "generate_batch",
        "done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)",
        "done = torch.zeros(tokens.shape[0], dtype=torch.bool)",
        "`done` made on the CPU whatever the tokens' device",
        says=("without a device", "tokens' device"),
    ),
    Mutant(
        "attention_with_cache",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "mask = None if allowed is None else allowed.float()\n"
        "    z = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)",
        "`allowed` passed as a float mask: scaled_dot_product_attention adds it to the scores",
        name="float-mask",
        says=("boolean", "float", "added"),
    ),
]
