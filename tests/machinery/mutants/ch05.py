"""Chapter 5's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    Mutant(
        "forward_static",
        "own = torch.arange(model.cfg.n_ctx, device=tokens.device)",
        "own = torch.arange(model.cfg.n_ctx)",
        "the own-slot rule's slot numbers made on the CPU whatever the tokens' device",
        says=("forward_static makes torch.arange", "without a device"),
    ),
    Mutant(
        "fast_sample",
        "text = torch.full((n_prompt + max_tokens_generated,), eos, device=device)",
        "text = torch.full((n_prompt + max_tokens_generated,), eos)",
        "the text buffer made on the CPU whatever the model's device",
        says=("torch.full", "without a device"),
    ),
    Mutant(
        "fast_sample",
        "            if verbose and not printed_end:  # the text ends at its first end-of-text",
        "            if verbose:",
        "verbose keeps printing the masked end-of-text tokens after the text has ended",
        says=("more end-of-text after the first",),
    ),
    # fit_step_cost
    Mutant(
        "fit_step_cost",
        "above = seconds - floor  # what the floor does not explain",
        "above = seconds",
        "the measured seconds fitted, not the time above the floor",
        says=("above the floor",),
    ),
    Mutant(
        "fit_step_cost",
        "per_op, per_cached = solution.tolist()",
        "per_cached, per_op = solution.tolist()",
        "the two costs returned in the wrong order",
        says=("swapped",),
    ),
    Mutant(
        "fit_step_cost",
        "n_ops, floor, cached, seconds = (c.to(torch.float64) for c in columns)",
        "n_ops, floor, cached, seconds = (c.to(torch.float32) for c in columns)",
        "solved in float32",
        says=("float64",),
    ),
    Mutant(
        "fit_step_cost",
        "per_op, per_cached = solution.tolist()",
        "per_op, per_cached = solution",
        "0-d tensors returned instead of Python floats",
        says=("python floats",),
    ),
    # static_cache
    Mutant(
        "fit_step_cost",
        "above = seconds - floor  # what the floor does not explain",
        "above = seconds + floor  # what the floor does not explain",
        "the floor added to the seconds instead of subtracted",
        says=("floor", "added"),
    ),
    Mutant(
        "fit_step_cost",
        "A = torch.stack([n_ops, cached], dim=1)  # [steps, 2]: one column per fitted term\n"
        "    above = seconds - floor  # what the floor does not explain\n"
        '    solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]\n'
        "    per_op, per_cached = solution.tolist()",
        "A = torch.stack([n_ops, cached, torch.ones_like(n_ops)], dim=1)\n"
        "    above = seconds - floor  # what the floor does not explain\n"
        '    solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]\n'
        "    per_op, per_cached, _ = solution.tolist()",
        "an intercept column added, a third unknown the model does not have",
        name="intercept-column",
        says=("intercept",),
    ),
    Mutant(
        "static_cache",
        "self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]",
        "self.keys = [torch.zeros(shape, device=device, dtype=dtype)] * cfg.n_layers",
        "one tensor listed n_layers times: every layer writes into the same buffer",
        says=("n_layers times",),
    ),
    Mutant(
        "static_cache",
        "self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]",  # noqa: E501
        "self.values = self.keys",
        "keys and values are the same tensors",
        says=("self.values = self.keys",),
    ),
    Mutant(
        "static_cache",
        "shape = (batch, cfg.n_kv_heads, cfg.n_ctx, cfg.d_head)",
        "shape = (batch, cfg.n_ctx, cfg.n_kv_heads, cfg.d_head)",
        "positions before heads: not chapter 4's layout",
        says=("[batch, n_heads, n_ctx, d_head]",),
    ),
    Mutant(
        "static_cache",
        "self.causal = slots[None, :] <= slots[:, None]  # [query slot, key slot]",
        "self.causal = slots[None, :] < slots[:, None]  # [query slot, key slot]",
        "a query may not read its own key",
        says=("own key",),
    ),
    Mutant(
        "static_cache",
        "self.causal = slots[None, :] <= slots[:, None]  # [query slot, key slot]",
        "self.causal = slots[:, None] <= slots[None, :]  # [query slot, key slot]",
        "the causal mask transposed",
        says=("transposed",),
    ),
    Mutant(
        "static_cache",
        "slots = torch.arange(cfg.n_ctx, device=device)",
        "slots = torch.arange(cfg.n_ctx)",
        "the causal mask made on the CPU whatever the device",
        says=("device=", "causal"),
    ),
    Mutant(
        "static_cache",
        "self.mask = torch.zeros(batch, cfg.n_ctx, dtype=torch.bool, device=device)",
        "self.mask = torch.ones(batch, cfg.n_ctx, dtype=torch.bool, device=device)",
        "every slot marked as holding a token from the start",
        says=("all false",),
    ),
    Mutant(
        "static_cache",
        "self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]",
        "self.keys = [torch.zeros(shape, device=device) for _ in range(cfg.n_layers)]",
        "the keys made in float32 whatever the dtype",
        says=("dtype",),
    ),
    # attention_static
    Mutant(
        "attention_static",
        "keys.index_copy_(2, slots, k)",
        "keys = keys.index_copy(2, slots, k)",
        "index_copy without the underscore: a new tensor, the cache never sees the keys",
        says=("in place",),
    ),
    Mutant(
        "attention_static",
        "keys.index_copy_(2, slots, k)",
        "keys.index_copy_(2, torch.arange(len(slots)), k)",
        "the new keys written to slots 0, 1, ... instead of `slots`",
        says=("slot 0",),
    ),
    Mutant(
        "attention_static",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=~allowed)",
        "the mask inverted",
        says=("inverted", "true means may read"),
    ),
    Mutant(
        "attention_static",
        'return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O',
        'return torch.einsum("bhpe,hed->bpd", z, attn.W_O)',
        "the output bias b_O forgotten",
        says=("b_O",),
    ),
    Mutant(
        "attention_static",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values, is_causal=True)",
        "is_causal instead of the mask: wrong after a cache, and the empty slots are read",
        says=("is_causal",),
    ),
    Mutant(
        "attention_static",
        "project(attn.W_K, attn.b_K)",
        "project(attn.W_K, 0 * attn.b_K)",
        "the keys' bias b_K forgotten",
        says=("b_K",),
    ),
    Mutant(
        "attention_static",
        "keys.index_copy_(2, slots, k)",
        "keys[:, :, slots.tolist()] = k",
        "the slots read back as a Python list to write the keys: a host read in every step",
        says=("attention_static", "host read"),
    ),
    # forward_static
    Mutant(
        "forward_static",
        "allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)",
        "allowed = cache.causal[slots] & cache.mask[:, None, None, :]",
        "the own-slot rule left out: a padding query has nothing to read",
        says=("own slot", "padding"),
    ),
    Mutant(
        "forward_static",
        "    cache.mask[:, slots] = real\n",
        "    cache.mask[:, slots.tolist()] = real\n",
        "the slots turned into a Python list: a host read inside forward_static",
        says=("host read", "forward_static"),
    ),
    Mutant(
        "forward_static",
        "    if real is None:\n",
        "    if real is None or real.all():\n",
        "a Python branch on a tensor's value inside forward_static",
        says=("host read", "forward_static"),
    ),
    Mutant(
        "forward_static",
        "residual = model.embed(tokens) + model.pos_embed.W_pos[positions]",
        "residual = model.embed(tokens) + model.pos_embed.W_pos[slots]",
        "tokens embedded at their slots, not their positions",
        says=("position", "slot"),
    ),
    Mutant(
        "forward_static",
        "    cache.mask[:, slots] = real\n",
        "",
        "the new slots never recorded in cache.mask",
        says=("cache.mask",),
    ),
    Mutant(
        "forward_static",
        "allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)",
        "allowed = cache.mask[:, None, None, :] | own",
        "the causal part forgotten: a prefill reads the future",
        says=("causal",),
    ),
    Mutant(
        "forward_static",
        "    cache.mask[:, slots] = real\n",
        "    cache.mask[:, slots] = True\n",
        "`real` ignored: padding is read as text",
        says=("real",),
    ),
    # fast_sample
    Mutant(
        "fast_sample",
        "            slot += 1\n",
        "",
        "the slot never advanced: every step writes the same slot",
        says=("advance",),
    ),
    Mutant(
        "fast_sample",
        "slot = torch.tensor([n_prompt], device=device)",
        "slot = torch.tensor([n_prompt - 1], device=device)",
        "the first new token written to the prompt's last slot",
        name="first-slot-one-early",
        says=("first decoding step", "slot start"),
    ),
    Mutant(
        "fast_sample",
        "slot = torch.tensor([n_prompt], device=device)",
        "slot = torch.tensor([n_prompt + 1], device=device)",
        "the first new token written one slot past the prompt, leaving a gap",
        name="first-slot-one-late",
        says=("first decoding step", "slot start"),
    ),
    Mutant(
        "fast_sample",
        "                token = torch.where(done, eos, token)\n",
        "",
        "a finished text keeps feeding the tokens sampled after its end",
        says=("end-of-text", "done"),
    ),
    Mutant(
        "fast_sample",
        "                self.host_reads += 1\n                word = int(token)\n",
        "                word = int(token)\n",
        "verbose's printed tokens not counted as host reads",
        says=("verbose", "host read"),
    ),
    Mutant(
        "fast_sample",
        "            if stop_at_eos and n_new % self.sync_every == 0:",
        "            if stop_at_eos:",
        "a host read at every step",
        says=("host reads",),
        try_first="test_the_loop_reads_the_device_once_every_sync_every_tokens",
    ),
    Mutant(
        "fast_sample",
        "                done |= token == eos\n",
        "",
        "done never set: the loop runs to max_tokens_generated after the end of text",
        says=("done", "as soon as"),
        try_first="test_the_loop_stops_soon_after_the_end_of_text",
    ),
    Mutant(
        "fast_sample",
        "                counts.index_add_(1, token, one)\n",
        "                pass\n",
        "the penalty's counts never updated",
        says=("index_add_",),
    ),
    Mutant(
        "fast_sample",
        "            logits = self.step(self.model, cache, token[None], slot, slot[None])",
        "            logits = self.step(self.model, cache, token[None], slot, n_prompt + i)",
        "the position passed as a Python int: a compiled step recompiles at every step",
        says=("python ints",),
        try_first="test_a_compiled_step_is_one_graph_compiled_once_for_a_whole_generation",
    ),
    Mutant(
        "fast_sample",
        "            if stop_at_eos:  # a finished text writes end-of-text; no branch on the device",  # noqa: E501
        "            if True:",
        "end-of-text masked even without stop_at_eos: the text after it is lost",
        says=("only when stop_at_eos",),
        try_first="test_without_stop_at_eos_sampling_goes_on_after_the_end_of_text",
    ),
    Mutant(
        "fast_sample",
        "            if n_new == max_tokens_generated:\n                break\n",
        "",
        "the model called once more after the last token",
        says=("never fed",),
        try_first="test_the_model_is_not_called_after_the_last_token",
    ),
    Mutant(
        "fast_sample",
        "            token = sample_next_token(input_ids[None], scores, generator=generator, **kwargs)",  # noqa: E501
        "            token = sample_next_token(input_ids[None], scores, **kwargs)",
        "the seed's generator not passed: not chapter 3's draws",
        says=("generator",),
    ),
    # quantize_int8
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = W.abs().amax(dim=-1) / 127",
        "one scale per row (per input) instead of per column",
        says=("per row",),
    ),
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = (W.abs().amax(dim=-2) / 127).half()",
        "the scales stored in float16 to save bytes",
        says=("float16", "dtype"),
    ),
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = W.abs().amax(dim=-2) / 128",
        "divided by 128",
        says=("divide by 128",),
    ),
    Mutant(
        "quantize_int8",
        "q = torch.round(W / scale.unsqueeze(-2)).clamp(-127, 127).to(torch.int8)",
        "q = (W / scale.unsqueeze(-2)).clamp(-127, 127).to(torch.int8)",
        "truncated toward zero instead of rounded",
        says=("truncates",),
    ),
    Mutant(
        "quantize_int8",
        "    scale = scale.clamp(min=torch.finfo(W.dtype).eps)  # an all-zero column: q = 0, not NaN\n",  # noqa: E501
        "",
        "a zero column divided by a zero scale",
        says=("column of zeros",),
    ),
    # attention_static: the mask and the layout, recognised on the test's own inputs
    Mutant(
        "attention_static",
        "attn_mask=allowed)",
        "attn_mask=allowed.float())",
        "the mask converted to float, so it is added to the scores",
        says=("float", "added"),
    ),
    Mutant(
        "attention_static",
        'return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O',
        "b, h, n, e = z.shape\n"
        "    return z.reshape(b, n, h * e) @ attn.W_O.reshape(h * e, -1) + attn.b_O",
        "z reshaped to [batch, new, heads * d_head] without moving the heads axis first",
        says=("heads", "reshape"),
    ),
    Mutant(
        "attention_static",
        "    values.index_copy_(2, slots, v)\n",
        "",
        "the values never written into their buffer",
        says=("value buffer", "zeros"),
    ),
    # fast_sample: the loop's bookkeeping
    Mutant(
        "fast_sample",
        "text[n_prompt + i : n_prompt + i + 1] = token",
        "text[n_prompt + i + 1 : n_prompt + i + 2] = token",
        "each token written one index late in text",
        says=("text", "one index late"),
    ),
    Mutant(
        "fast_sample",
        "slots, slots[None])[:, -1]",
        "slots, slots[None])[:, 0]",
        "the first token sampled from the prefill's first position, not its last",
        says=("prefill", "last position"),
    ),
    Mutant(
        "fast_sample",
        "            n_new = i + 1\n"
        "            if verbose and not printed_end:  # the text ends at its first end-of-text\n"
        "                self.host_reads += 1\n"
        "                word = int(token)\n"
        '                print(self.tokenizer.decode([word]), end="", flush=True)\n'
        "                printed_end = stop_at_eos and word == eos\n"
        "            if n_new == max_tokens_generated:\n"
        "                break\n"
        "            if stop_at_eos and n_new % self.sync_every",
        "            n_new_so_far = i + 1\n"
        "            if verbose and not printed_end:  # the text ends at its first end-of-text\n"
        "                self.host_reads += 1\n"
        "                word = int(token)\n"
        '                print(self.tokenizer.decode([word]), end="", flush=True)\n'
        "                printed_end = stop_at_eos and word == eos\n"
        "            if n_new_so_far == max_tokens_generated:\n"
        "                break\n"
        "            if stop_at_eos and n_new_so_far % self.sync_every",
        "n_new never set, so the text is cut to no new tokens",
        name="n-new-never-set",
        says=("n_new", "stays 0"),
    ),
    Mutant(
        "fast_sample",
        "counts = torch.bincount(input_ids, minlength=self.cfg.d_vocab).float()[None]",
        "counts = torch.zeros(1, self.cfg.d_vocab, device=device)",
        "the penalty's counts start at zero, not from the prompt's tokens",
        says=("counts", "prompt"),
    ),
    Mutant(
        "fast_sample",
        "counts = torch.bincount(input_ids, minlength=self.cfg.d_vocab).float()[None]",
        "counts = torch.bincount(text, minlength=self.cfg.d_vocab).float()[None]",
        "the counts taken from the text buffer, whose end-of-text filler counts too",
        says=("end-of-text", "filler"),
    ),
    Mutant(
        "fast_sample",
        "sample_next_token(input_ids[None], scores,",
        "sample_next_token(input_ids[None], scores.softmax(-1),",
        "probabilities handed to sample_next_token in place of logits",
        says=("probabilities", "logits"),
    ),
    Mutant(
        "fast_sample",
        "                self.host_reads += 1  # the one wait: every sync_every tokens\n",
        "",
        "the wait every sync_every tokens not counted in self.host_reads",
        says=("host_reads", "sync"),
    ),
    # Slips of a learner's run of the blank notebook (each first told something else, or a
    # bare error): fit_step_cost
    Mutant(
        "fit_step_cost",
        "A = torch.stack([n_ops, cached], dim=1)",
        "A = torch.stack([n_ops, cached])",
        "the two columns stacked along dim 0: a [2, steps] matrix",
        says=("one row", "along which dimension"),
    ),
    Mutant(
        "fit_step_cost",
        "A = torch.stack([n_ops, cached], dim=1)  # [steps, 2]: one column per fitted term\n"
        "    above = seconds - floor  # what the floor does not explain\n"
        '    solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]\n'
        "    per_op, per_cached = solution.tolist()",
        "A = torch.stack([n_ops, cached, floor], dim=1)\n"
        "    above = seconds\n"
        '    solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]\n'
        "    per_op, per_cached, _ = solution.tolist()",
        "the floor fitted as a third column of seconds",
        name="floor-as-a-column",
        says=("floor", "third fitted column"),
    ),
    Mutant(
        "fit_step_cost",
        "A = torch.stack([n_ops, cached], dim=1)",
        "A = torch.stack([n_ops, floor], dim=1)",
        "the floor stacked as the second column in place of cached",
        says=("n_ops and floor", "cached"),
    ),
    Mutant(
        "fit_step_cost",
        "n_ops, floor, cached, seconds = (c.to(torch.float64) for c in columns)\n"
        "    A = torch.stack([n_ops, cached], dim=1)  # [steps, 2]: one column per fitted term\n"
        "    above = seconds - floor  # what the floor does not explain\n",
        "n_ops, floor, cached, seconds = columns\n"
        "    A = torch.stack([n_ops, cached], dim=1).double()\n"
        "    above = (seconds - floor).double()\n",
        "seconds - floor computed in float32, converted to float64 after",
        name="float32-subtraction",
        says=("computed in float32", "before any arithmetic"),
    ),
    Mutant(
        "fit_step_cost",
        'solution = torch.linalg.lstsq(A, above[:, None], driver="gelsd").solution[:, 0]',
        "solution = torch.linalg.solve(A[:2], above[:2])",
        "the exact solution of the first two steps instead of a fit of all",
        says=("first two steps",),
    ),
    Mutant(
        "fit_step_cost",
        ".solution[:, 0]\n    per_op, per_cached = solution.tolist()",
        ".solution\n    per_op, per_cached = float(solution[0, 0]), float(solution[0, 1])",
        "the [2, 1] solution read along its columns",
        name="solution-read-along-columns",
        says=("[2, 1]", "one row per unknown"),
    ),
    # static_cache
    Mutant(
        "static_cache",
        "self.causal = slots[None, :] <= slots[:, None]  # [query slot, key slot]",
        "self.causal = slots[None, :] <= slots[:, None] + 1  # [query slot, key slot]",
        "the causal mask one past the diagonal: each query reads the next slot too",
        says=("after its own", "shifted by one"),
    ),
    Mutant(
        "static_cache",
        "        self.keys = [torch.zeros(",
        "        keys = [torch.zeros(",
        "the keys kept in a local variable of __init__",
        says=("no keys", "local variable"),
    ),
    # attention_static
    Mutant(
        "attention_static",
        "attn_mask=allowed)",
        "attn_mask=allowed, scale=1.0)",
        "the scores not scaled by 1/sqrt(d_head)",
        says=("not scaled", "sqrt(d_head)"),
    ),
    Mutant(
        "attention_static",
        "    z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)\n",
        "    scores = q @ keys.transpose(-1, -2) / attn.cfg.d_head**0.5\n"
        "    z = scores.masked_fill(~allowed, 0.0).softmax(-1) @ values\n",
        "a hand-written softmax with the hidden scores set to 0, not -inf",
        says=("set to 0", "-inf"),
    ),
    Mutant(
        "attention_static",
        "attn_mask=allowed)",
        "attn_mask=allowed, scale=1 / attn.cfg.d_head)",
        "the scores divided by d_head, not its square root",
        says=("divided by d_head", "square root"),
    ),
    Mutant(
        "attention_static",
        "project(attn.W_Q, attn.b_Q)",
        "project(attn.W_Q, 0 * attn.b_Q)",
        "the queries' bias b_Q forgotten",
        says=("b_Q",),
    ),
    Mutant(
        "attention_static",
        "values.index_copy_(2, slots, v)",
        "values.index_copy_(2, slots, k)",
        "the new keys written into the value buffer too",
        says=("value buffer", "keys"),
    ),
    Mutant(
        "attention_static",
        "project(attn.W_K, attn.b_K)",
        "project(attn.W_Q, attn.b_Q)",
        "the keys projected with the queries' weights",
        says=("are the queries", "W_K"),
    ),
    Mutant(
        "attention_static",
        "keys.index_copy_(2, slots, k)\n    values.index_copy_(2, slots, v)",
        "keys.index_copy_(1, slots, k)\n    values.index_copy_(1, slots, v)",
        "the new keys and values written along the heads axis",
        says=("dim 2",),
    ),
    Mutant(
        "attention_static",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, k, v)",
        "attention over the new positions' keys and values alone, not the buffers",
        says=("new positions' own keys", "buffers"),
    ),
    Mutant(
        "attention_static",
        "z = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)",
        "z = F.scaled_dot_product_attention(q, keys, values)",
        "no mask: every slot of the buffers read",
        says=("no mask",),
    ),
    Mutant(
        "attention_static",
        "keys.index_copy_(2, slots, k)\n    values.index_copy_(2, slots, v)",
        "keys = torch.cat([keys, k], dim=2)\n    values = torch.cat([values, v], dim=2)",
        "chapter 4's torch.cat: longer new tensors, the buffers never written",
        says=("torch.cat", "in place"),
    ),
    # forward_static
    Mutant(
        "forward_static",
        "    cache.mask[:, slots] = real\n"
        "    # A query reads the real keys up to its own slot, and always its own key (a padding query\n"  # noqa: E501
        "    # then has one key to read, not none: no all -inf row, no NaN; chapter 4's reason).\n"
        "    own = torch.arange(model.cfg.n_ctx, device=tokens.device)[None, :] == slots[:, None]\n"
        "    allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)  # [batch, 1, new, n_ctx]\n"  # noqa: E501
        "    residual = model.embed(tokens) + model.pos_embed.W_pos[positions]\n"
        "    for block, keys, values in zip(model.blocks, cache.keys, cache.values, strict=True):\n"
        "        attn_out = attention_static(block.attn, block.ln1(residual), keys, values, slots, allowed)\n"  # noqa: E501
        "        residual = residual + attn_out\n"
        "        residual = residual + block.mlp(block.ln2(residual))\n"
        "    return model.unembed(model.ln_final(residual))",
        "    # A query reads the real keys up to its own slot, and always its own key (a padding query\n"  # noqa: E501
        "    # then has one key to read, not none: no all -inf row, no NaN; chapter 4's reason).\n"
        "    own = torch.arange(model.cfg.n_ctx, device=tokens.device)[None, :] == slots[:, None]\n"
        "    allowed = cache.causal[slots] & (cache.mask[:, None, None, :] | own)  # [batch, 1, new, n_ctx]\n"  # noqa: E501
        "    residual = model.embed(tokens) + model.pos_embed.W_pos[positions]\n"
        "    for block, keys, values in zip(model.blocks, cache.keys, cache.values, strict=True):\n"
        "        attn_out = attention_static(block.attn, block.ln1(residual), keys, values, slots, allowed)\n"  # noqa: E501
        "        residual = residual + attn_out\n"
        "        residual = residual + block.mlp(block.ln2(residual))\n"
        "    cache.mask[:, slots] = real\n"
        "    return model.unembed(model.ln_final(residual))",
        "the new slots recorded in cache.mask only after the blocks ran",
        name="mask-recorded-after-the-blocks",
        says=("own slot alone", "before the blocks"),
    ),
    Mutant(
        "forward_static",
        "model.pos_embed.W_pos[positions]",
        "model.pos_embed(tokens)",
        "chapter 1's pos_embed of the new tokens: positions from 0 at every call",
        says=("positions", "same logits"),
        try_first="test_a_prefill_and_steps_give_hfs_logits",
    ),
    Mutant(
        "forward_static",
        "cache.mask[:, None, None, :]",
        "cache.mask[:, None, :]",
        "allowed built without the heads axis",
        says=("[batch, 1, new, n_ctx]", "heads"),
    ),
    Mutant(
        "forward_static",
        "model.unembed(model.ln_final(residual))",
        "model.unembed(residual)",
        "the final LayerNorm forgotten",
        says=("final layernorm",),
    ),
    Mutant(
        "forward_static",
        "cache.causal[slots]",
        "cache.causal[:, slots].T",
        "the causal rows picked as columns: each query reads the slots after it",
        says=("turned around",),
    ),
    # fast_sample
    Mutant(
        "fast_sample",
        "torch.where(done, eos, token)",
        "torch.where(done, token, eos)",
        "torch.where's two values swapped: end-of-text until the text is done",
        says=("torch.where", "first new token"),
    ),
    Mutant(
        "fast_sample",
        "token = sample_next_token(input_ids[None], scores, generator=generator, **kwargs)",
        "token = torch.multinomial(scores.softmax(-1), 1, generator=generator)[0]",
        "sampled by hand with multinomial, the sampling arguments ignored",
        says=("bookkeeping is right", "sample_next_token"),
    ),
    Mutant(
        "fast_sample",
        "scores, generator=generator, **kwargs)",
        "scores, generator=None if seed is None else torch.Generator().manual_seed(seed), **kwargs)",  # noqa: E501
        "a new generator seeded at every step: the same draw again and again",
        says=("one generator", "each step"),
    ),
    Mutant(
        "fast_sample",
        "range(max_tokens_generated), disable",
        "range(max_tokens_generated - 1), disable",
        "the loop one token short",
        says=("one short",),
    ),
    Mutant(
        "fast_sample",
        "text[n_prompt + i : n_prompt + i + 1] = token",
        "text[n_prompt + i - 1 : n_prompt + i] = token",
        "each token written one index early in text",
        says=("one index early",),
    ),
    Mutant(
        "fast_sample",
        "            logits = self.step(self.model, cache, token[None], slot, slot[None])\n"
        "            slot += 1\n",
        "            slot += 1\n"
        "            logits = self.step(self.model, cache, token[None], slot, slot[None])\n",
        "the slot advanced before the step instead of after",
        says=("advanced after each step",),
    ),
    Mutant(
        "fast_sample",
        "            n_new = i + 1\n",
        "            n_new = i\n",
        "n_new one short of the tokens written",
        says=("one short", "n_new"),
    ),
    Mutant(
        "fast_sample",
        "logits = forward_static(self.model, input_ids[None], cache, slots, slots[None])[:, -1]",
        "logits = self.step(self.model, cache, input_ids[None], slots, slots[None])",
        "the prefill run through self.step, the compiled one-token step",
        says=("prefill", "forward_static"),
    ),
    Mutant(
        "fast_sample",
        "slots, slots[None])[:, -1]",
        "slots, slots[None])",
        "the prefill's logits of every position handed to sample_next_token",
        says=("last position", "[1, d_vocab]"),
    ),
    # quantize_int8
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = W.amax(dim=-2) / 127",
        "the largest value of a column, not its largest magnitude",
        says=("largest value", "abs"),
    ),
    Mutant(
        "quantize_int8",
        "W / scale.unsqueeze(-2)",
        "W / scale",
        "W divided by the scale without putting back the d_in dimension",
        says=("unsqueeze(-2)",),
    ),
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = (W.amax(dim=-2) - W.amin(dim=-2)) / 255",
        "an asymmetric range, (max - min) / 255",
        says=("asymmetric",),
    ),
    Mutant(
        "quantize_int8",
        "scale = W.abs().amax(dim=-2) / 127",
        "scale = W.abs().amax(dim=0) / 127",
        "the max over dim 0: the stack of matrices, for attention's weights",
        says=("dim 0", "dim=-2"),
    ),
]
