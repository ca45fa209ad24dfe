"""Chapter 8's learner-style mutants: slots, paged attention, the block pool, the cache manager,
the scheduler and per-request sampling (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

# attend's attention call, and the first lines of a hand-written attention put in its place
# (the slips that write their own attention share them)
SDPA_CALL = (
    "    z = F.scaled_dot_product_attention(\n"
    "        queries.transpose(1, 2), gather(keys), "
    "gather(values), attn_mask=allowed[:, None]\n"
    "    )\n"
)
HAND_SCORES = (
    "    q, k, v = queries.transpose(1, 2), gather(keys), gather(values)\n"
    "    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5\n"
)

MUTANTS: list[Mutant] = [
    # slots_of
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p % block_size] * block_size + p // block_size",
        "the block's index and the offset within it swapped",
        says=("swapped",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] + p % block_size",
        "the block id used as a slot, not multiplied by the block size",
        says=("not a slot",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "(p // block_size) * block_size + p % block_size",
        "the table not used: blocks taken in order from 0",
        says=("table",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[(p - 1) // block_size] * block_size + p % block_size",
        "the block index one position early: (p - 1) // block_size",
        name="block-one-position-early",
        says=("one position early", "block"),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] * block_size + p % block_size + 1",
        "the offset within the block counted from 1",
        name="offset-from-1",
        says=("1 more", "counts from 0"),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[-(-p // block_size)] * block_size + p % block_size",
        "the block index rounded up, not down",
        name="block-index-rounded-up",
        says=("rounded down",),
    ),
    # attend
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] < query_pos[:, :, None]",
        "a query may not read its own position",
        says=("own position",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] <= query_pos[:, -1:, None]",
        "every query reads up to the last position written (a chunk is not causal)",
        says=("each query's own",),
    ),
    Mutant(
        "attend",
        "blocks = block_tables.flatten()",
        "blocks = block_tables.sort(dim=1).values.flatten()",
        "the blocks read in sorted order, not the table's",
        says=("sorted",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=None",
        "no mask: padding blocks and unwritten slots are read",
        says=("is a mask passed",),
    ),
    # block_pool
    Mutant(
        "block_pool",
        "self.free_queue.popitem(last=False)",
        "self.free_queue.popitem()",
        "the newest free block handed out, not the least recently freed",
        says=("newest",),
    ),
    Mutant(
        "block_pool",
        "if block.ref_cnt == 0:\n                self.free_queue[block.block_id] = None",
        "self.free_queue[block.block_id] = None",
        "a block made free at every free, not when its count reaches 0",
        says=("reaches 0",),
    ),
    Mutant(
        "block_pool",
        "del self.free_queue[block.block_id]",
        "pass",
        "touch leaves a free block in the free queue",
        says=("leave the free queue",),
    ),
    Mutant(
        "block_pool",
        "                block.block_hash = None\n",
        "",
        "an evicted block keeps its name",
        says=("lose its name",),
    ),
    Mutant(
        "block_pool",
        "                del self.cached[block.block_hash]\n",
        "",
        "an evicted block's name left in the pool's table of names",
        name="evicted-name-still-cached",
        says=("pool.cached",),
    ),
    Mutant(
        "block_pool",
        "            block.ref_cnt += 1\n",
        "            block.ref_cnt = 1\n",
        "touch sets a shared block's count to 1, not one more",
        name="touch-resets-count",
        says=("adds a holder",),
    ),
    # kv_cache_manager
    Mutant(
        "kv_cache_manager",
        "self.block_hashes(request, request.num_tokens - 1)",
        "self.block_hashes(request, request.num_tokens)",
        "every token may be a hit, the last one too",
        says=("last token",),
    ),
    Mutant(
        "kv_cache_manager",
        "needed = math.ceil((num_computed + num_new_tokens) / self.block_size)",
        "needed = (num_computed + num_new_tokens) // self.block_size",
        "blocks rounded down",
        says=("rounded up",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_computed = request.num_computed_tokens + len(computed) * self.block_size",
        "num_computed = request.num_computed_tokens",
        "the hits' tokens not counted",
        says=("hits' tokens",),
    ),
    Mutant(
        "kv_cache_manager",
        "if num_new_blocks > self.pool.num_free_blocks - evictable_hits:",
        "if num_new_blocks > self.pool.num_free_blocks:",
        "a free cached hit counted as free for new blocks",
        says=("ref_cnt is 0",),
    ),
    Mutant(
        "kv_cache_manager",
        "            if block is None:\n                break\n            blocks.append(block)\n",
        "            if block is not None:\n"
        "                blocks.append(block)\n"
        "                break\n",
        "the lookup stops at the first hit, not at the first miss",
        name="stops-at-first-hit",
        says=("first hit", "first miss"),
    ),
    Mutant(
        "kv_cache_manager",
        "num_new_blocks = needed - len(blocks) - len(computed)",
        "num_new_blocks = needed - len(blocks)",
        "the hits asked of the pool again as new blocks",
        name="hits-not-subtracted",
        says=("hits among its blocks",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_computed = request.num_computed_tokens + len(computed) * self.block_size",
        "num_computed = len(computed) * self.block_size",
        "the tokens computed already not counted in the table's size",
        name="computed-tokens-forgotten",
        says=("num_computed_tokens", "must cover"),
    ),
    Mutant(
        "kv_cache_manager",
        "if num_new_blocks > self.pool.num_free_blocks - evictable_hits:",
        "if num_new_blocks >= self.pool.num_free_blocks - evictable_hits:",
        "refused when exactly enough blocks are free",
        name="refuses-exactly-enough",
        says=("more than the free",),
    ),
    Mutant(
        "kv_cache_manager",
        "return blocks, len(blocks) * self.block_size",
        "return blocks, len(blocks)",
        "the hits counted in blocks, not tokens",
        name="hits-in-blocks",
        says=("tokens", "times block_size"),
    ),
    # schedule
    Mutant(
        "schedule",
        "                budget -= num_new\n                i += 1",
        "                i += 1",
        "the running requests' tokens not taken from the budget",
        says=("running requests", "not taken from the budget"),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - num_cached, budget)",
        "num_new = request.num_tokens - num_cached",
        "a prompt admitted whole, past the budget",
        says=("budget",),
    ),
    Mutant(
        "schedule",
        "            if self.kv.allocate_slots(request, num_new, computed) is None:\n"
        "                break  # first come, first served: nobody overtakes the head of the "
        "queue\n",
        "            self.kv.allocate_slots(request, num_new, computed)\n",
        "a request admitted although allocate_slots returned None (no blocks for it)",
        name="admitted-without-blocks",
        says=("none", "not admitted"),
    ),
    Mutant(
        "schedule",
        "victim = self.running.pop()",
        "victim = self.running.pop(0)",
        "the oldest running request preempted",
        says=("newest",),
    ),
    Mutant(
        "schedule",
        "while self.waiting and budget > 0 and not out.preempted:",
        "while self.waiting and budget > 0:",
        "requests admitted in a step that preempted",
        says=("nobody is admitted",),
    ),
    Mutant(
        "schedule",
        "            if len(self.running) >= self.max_num_seqs:\n                break\n",
        "",
        "max_num_seqs ignored",
        says=("max_num_seqs",),
    ),
    Mutant(
        "schedule",
        "request.num_computed_tokens = request.num_cached_tokens = num_cached",
        "request.num_cached_tokens = num_cached",
        "an admitted request does not start at its cache hits",
        says=("num_computed_tokens",),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - request.num_computed_tokens, budget)",
        "num_new = min(1, budget)",
        "a running request always given one token (a chunked prompt stalls)",
        name="running-always-one-token",
        says=("not always decoding",),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - num_cached, budget)",
        "num_new = min(request.num_tokens, budget)",
        "an admitted request's first chunk sized from its whole prompt, cache hits included",
        name="chunk-includes-hits",
        says=("cache hits",),
    ),
    Mutant(
        "schedule",
        "if len(self.running) >= self.max_num_seqs:",
        "if len(self.running) > self.max_num_seqs:",
        "one request more than max_num_seqs admitted",
        name="seats-off-by-one",
        says=("max_num_seqs",),
    ),
    Mutant(
        "schedule",
        "            out.admitted.append(request)\n            budget -= num_new\n",
        "            out.admitted.append(request)\n",
        "an admitted request's tokens not taken from the budget",
        name="admitted-not-from-budget",
        says=("admitted request's tokens", "budget"),
    ),
    Mutant(
        "schedule",
        "                self._preempt(victim)\n",
        "                self.waiting.appendleft(victim)\n",
        "a victim put back in the queue without self._preempt: its blocks not freed",
        name="requeued-without-preempt",
        says=("_preempt",),
    ),
    # sample_requests
    Mutant(
        "sample_requests",
        "generator=request.generator",
        "generator=requests[0].generator",
        "one generator for the whole batch",
        says=("own generator",),
    ),
    Mutant(
        "sample_requests",
        "r.params.temperature == 0 and r.params.frequency_penalty == 0",
        "r.params.temperature == 0",
        "a greedy request with a penalty sent to the plain argmax",
        says=("plain argmax",),
    ),
    Mutant(
        "sample_requests",
        "zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True)",
        "zip(range(len(greedy)), logits[greedy].argmax(dim=-1).tolist(), strict=True)",
        "the greedy results not written back at their requests' indices",
        says=("indices",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([request.prompt_token_ids], device=logits.device)",
        "the penalty counts the prompt only",
        says=("prompt alone",),
    ),
    Mutant(
        "slots_of",
        "for p in positions]",
        "for p in range(len(positions))]",
        "the positions counted from 0, not from where they start",
        says=("start at",),
    ),
    Mutant(
        "slots_of",
        "return [block_table[p // block_size] * block_size + p % block_size for p in positions]",
        "return torch.tensor([block_table[p // block_size] * block_size + p % block_size "
        "for p in positions])",
        "a tensor returned, not a list of ints",
        says=("list of python ints",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=allowed",
        "the mask without its heads axis",
        name="mask-without-heads-axis",
        says=("[g, 1, q, l]",),
    ),
    Mutant(
        "kv_cache_manager",
        "if num_new_blocks > self.pool.num_free_blocks - evictable_hits:",
        "if num_new_blocks >= self.pool.num_free_blocks - evictable_hits:",
        "refused when the free blocks are exactly enough",
        says=("more than",),
    ),
    Mutant(
        "schedule",
        "            request.status = RequestStatus.RUNNING\n",
        "",
        "an admitted request left WAITING",
        says=("running",),
    ),
    Mutant(
        "schedule",
        "                if victim is request:\n                    break\n",
        "",
        "no break when the request preempted is the request itself",
        says=("break",),
    ),
    Mutant(
        "sample_requests",
        "**request.params.sampling_kwargs(),",
        "temperature=request.params.temperature, top_k=request.params.top_k, "
        "frequency_penalty=request.params.frequency_penalty,",
        "top_p not passed on",
        says=("all of the request's settings",),
    ),
]
MUTANTS += [
    Mutant(
        "attend",
        "key_pos = torch.arange(B * keys.shape[1], device=queries.device)",
        "key_pos = torch.arange(B * keys.shape[1])",
        "the key positions made on the CPU, not on the queries' device",
        says=("device",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([request.all_token_ids])",
        "the request's text made on the CPU, not on the logits' device",
        says=("device",),
    ),
    Mutant(
        "block_pool",
        "block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n",
        "if block.ref_cnt == 1:\n                block.ref_cnt = 0\n",
        "a shared block's count never decreased: only a block held once is freed",
        says=("not decreased",),
    ),
    Mutant(
        "schedule",
        "self._preempt(victim)",
        "self.waiting.appendleft(victim)",
        "a preempted request put back in the queue without freeing its blocks",
        says=("still holds",),
    ),
    Mutant(
        "schedule",
        "            out.admitted.append(request)\n",
        "",
        "an admitted request not named in the plan's admitted list",
        says=("admitted",),
    ),
    Mutant(
        "attend",
        "return z.transpose(1, 2)",
        "return z.reshape(z.shape[0], z.shape[2], z.shape[1], z.shape[3])",
        "the output's heads and queries reshaped, not transposed",
        says=("transpose",),
    ),
    Mutant(
        "attend",
        "return rows.transpose(1, 2).contiguous()",
        "return rows.reshape(G, cache.shape[2], B * cache.shape[1], cache.shape[3])",
        "the gathered keys reshaped heads first, not transposed",
        says=("transpose",),
    ),
    Mutant(
        "kv_cache_manager",
        "if num_new_blocks > self.pool.num_free_blocks - evictable_hits:",
        "if needed > self.pool.num_free_blocks - evictable_hits:",
        "all the blocks the table needs compared with the free ones, those it holds included",
        says=("already holds", "needed again"),
    ),
    Mutant(
        "kv_cache_manager",
        "            if block is None:\n                break",
        "            if block is None:\n                continue",
        "the lookup skips a miss and goes on to later blocks",
        says=("past a miss",),
    ),
    Mutant(
        "attend",
        "key_pos = torch.arange(B * keys.shape[1], device=queries.device)",
        "key_pos = torch.arange(1, B * keys.shape[1] + 1, device=queries.device)",
        "the key positions counted from 1",
        says=("counted from 1",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "is_causal=True",
        "is_causal=True instead of a mask of each query's positions",
        says=("is_causal",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=allowed[:, None].float()",
        "a float 0/1 mask, added to the scores",
        says=("boolean",),
    ),
    Mutant(
        "attend",
        "    z = F.scaled_dot_product_attention(\n"
        "        queries.transpose(1, 2), gather(keys), gather(values), "
        "attn_mask=allowed[:, None]\n"
        "    )\n",
        HAND_SCORES + "    z = scores.masked_fill(~allowed[:, None], 0.0).softmax(-1) @ v\n",
        "a hand-written softmax whose masked scores are 0, not minus infinity",
        says=("minus infinity",),
    ),
    Mutant(
        "block_pool",
        "                self.free_queue[block.block_id] = None",
        "                self.free_queue[block.block_id] = None\n"
        "                if block.block_hash is not None:\n"
        "                    del self.cached[block.block_hash]\n"
        "                    block.block_hash = None",
        "free_blocks drops the name of a block that becomes free",
        says=("free_blocks", "name"),
    ),
    Mutant(
        "block_pool",
        "        blocks = []\n        for _ in range(n):\n"
        "            block = self.blocks[self.free_queue.popitem(last=False)[0]]",
        "        blocks = []\n        queue = self.free_queue.copy()\n        for _ in range(n):\n"
        "            block = self.blocks[queue.popitem(last=False)[0]]",
        "get_new_blocks pops from a copy of the free queue",
        says=("copy of the queue",),
    ),
    Mutant(
        "block_pool",
        "block = self.blocks[self.free_queue.popitem(last=False)[0]]",
        "block = KVCacheBlock(self.free_queue.popitem(last=False)[0])",
        "get_new_blocks returns new KVCacheBlock objects, not the pool's",
        says=("pool's own",),
    ),
    Mutant(
        "sample_requests",
        "logits[greedy].argmax(dim=-1).tolist()",
        "logits[greedy].argmax(dim=0).tolist()[: len(greedy)]",
        "the greedy rows' argmax taken over the requests axis, dim 0",
        says=("vocabulary axis",),
    ),
    Mutant(
        "sample_requests",
        "ids, logits[i : i + 1], generator=request.generator,",
        "ids, logits[i : i + 1].softmax(-1), generator=request.generator,",
        "softmax applied before sample_next_token: probabilities passed as logits",
        says=("not probabilities",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([request.output_token_ids or [0]], device=logits.device)",
        "the penalty counts the output only",
        says=("output alone",),
    ),
    Mutant(
        "schedule",
        "            self.running.append(request)\n",
        "",
        "an admitted request not added to self.running",
        says=("self.running",),
    ),
    Mutant(
        "schedule",
        "            self.waiting.popleft()\n",
        "            self.waiting.pop()\n",
        "the queue's tail taken off after admitting its head (pop, not popleft)",
        says=("tail",),
    ),
    # output_processor
    Mutant(
        "output_processor",
        "add(output.new_token_ids, last=output.finished)",
        "add(output.output_token_ids, last=output.finished)",
        "every token so far given to the detokenizer at each step, not the new ones",
        says=("new_token_ids",),
    ),
    Mutant(
        "output_processor",
        "text, state.sent = state.text[state.sent : end], end",
        "text, state.sent = state.text[:end], end",
        "each delta sends the whole text so far, not what was not sent before",
        says=("not sent before",),
    ),
    Mutant(
        "output_processor",
        "last=output.finished)",
        "last=False)",
        "the detokenizer never told that a finished request's tokens are its last",
        says=("last=true",),
    ),
    Mutant(
        "output_processor",
        "last=output.finished)",
        "last=True)",
        "every call told it is the last: a piece of a character is sent",
        says=("piece of a character",),
    ),
    Mutant(
        "output_processor",
        'state.text, reason = state.text[: min(hits)], "stop"',
        'reason = "stop"',
        "the text not cut at the stop string: the stop string and what follows are sent",
        says=("stop string itself",),
    ),
    Mutant(
        "output_processor",
        "if i >= 0]",
        "if i >= 0][:1]",
        "the text cut at the first stop string of the list, not the first in the text",
        says=("first in the text",),
    ),
    Mutant(
        "output_processor",
        'state.text, reason = state.text[: min(hits)], "stop"',
        "state.text = state.text[: min(hits)]",
        "a request that meets a stop string keeps the engine's reason, not 'stop'",
        says=("'stop'",),
    ),
    Mutant(
        "output_processor",
        "                    processed.to_abort.append(output.request_id)\n",
        "                    pass\n",
        "a request that met a stop string never aborted in the engine",
        says=("to_abort must name it",),
    ),
    Mutant(
        "output_processor",
        "if not output.finished:",
        "if True:",
        "a request the engine already finished aborted too",
        says=("nothing to abort",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = max(map(len, state.stop), default=0)",
        "the longest stop string's whole length held back, not one less",
        says=("holds back too much",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = max(map(len, state.stop), default=2) - 1",
        "a character held back although the request has no stop strings",
        says=("no stop strings",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = 0",
        "nothing held back: text past a stop string's beginning sent before it is complete",
        says=("before the stop string was complete",),
    ),
    Mutant(
        "output_processor",
        "end = max(state.sent, len(state.text) - hold)",
        "end = len(state.text) - hold",
        "the end of the text to send may go below what was sent (negative while the text is short)",
        says=("never below",),
    ),
    Mutant(
        "output_processor",
        "                del self.states[output.request_id]\n",
        "                pass\n",
        "a finished request never forgotten: the engine's next report makes a second last delta",
        says=("forgotten",),
    ),
    Mutant(
        "output_processor",
        "if text or reason is not None:",
        "if True:",
        "an empty delta made in a step with nothing to send",
        says=("nothing to send",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(output.new_token_ids), reason, output.error",
        "num_output_tokens counts the step's tokens, not every token so far",
        says=("every token so far",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(output.output_token_ids), reason, None",
        "the engine's error not passed on",
        says=("error",),
    ),
    # output_processor: slips from a learner's run of "Serving it"
    Mutant(
        "output_processor",
        "if i >= 0]",
        "if i > 0]",
        "a stop string at the very beginning of the text not counted as found",
        says=("0 is a place",),
    ),
    Mutant(
        "output_processor",
        "hits = [i for i in (state.text.find(s) for s in state.stop) if i >= 0]",
        "hits = [state.text.find(s) for s in state.stop]",
        "str.find's -1 for an absent stop string taken as a place to cut",
        says=("answers -1",),
    ),
    Mutant(
        "output_processor",
        "state.text[: min(hits)]",
        "state.text[: max(hits)]",
        "the text cut at the stop string that occurs last, not first",
        says=("occurs last",),
    ),
    Mutant(
        "output_processor",
        "state.text.find(s)",
        "state.text.rfind(s)",
        "the text cut at the last place a stop string occurs (rfind), not the first",
        says=("first place it occurs",),
    ),
    Mutant(
        "output_processor",
        "state.text[: min(hits)]",
        "state.text[: min(hits) - 1]",
        "the text cut one character before the stop string",
        says=("one character short",),
    ),
    Mutant(
        "output_processor",
        "state.text[: min(hits)]",
        "state.text[: min(hits) + 1]",
        "the text cut one character into the stop string",
        says=("runs past its beginning",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = min(map(len, state.stop), default=1) - 1",
        "the hold taken from the shortest stop string, not the longest",
        says=("too little held back", "longest"),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = len(state.stop[0]) - 1 if state.stop else 0",
        "the hold taken from the first stop string of the list",
        says=("too little held back", "longest"),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        'hold = len(max(state.stop, default="x")) - 1',
        "the hold taken from the alphabetically last stop string (max of the strings)",
        says=("too little held back", "longest"),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = max(map(len, state.stop), default=0) - 1",
        "a hold of -1 with no stop strings: a character skipped at every step",
        says=("not -1",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = max((len(s.encode()) for s in state.stop), default=1) - 1",
        "the stop strings' length counted in bytes, not characters",
        says=("not bytes",),
    ),
    Mutant(
        "output_processor",
        "text, state.sent = state.text[state.sent : end], end",
        "text, state.sent = state.text[state.sent : end], len(state.text)",
        "state.sent set to the text's length: held-back characters never sent",
        says=("not the text's length",),
    ),
    Mutant(
        "output_processor",
        "state.text += state.detokenizer.add",
        "state.text = state.detokenizer.add",
        "the text replaced by the step's new text, not added to",
        says=("not put in its place",),
    ),
    Mutant(
        "output_processor",
        "            state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n"
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [i for i in (state.text.find(s) for s in state.stop) if i >= 0]\n",
        "            new = state.detokenizer.add(output.new_token_ids, last=output.finished)\n"
        "            state.text += new\n"
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [len(state.text) - len(new) + i\n"
        "                    for i in (new.find(s) for s in state.stop) if i >= 0]\n",
        "the step's new text alone searched for stop strings: one that spans steps is missed",
        says=("not in the step's new text alone",),
    ),
    Mutant(
        "output_processor",
        "            state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n"
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [i for i in (state.text.find(s) for s in state.stop) if i >= 0]\n",
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [i for i in (state.text.find(s) for s in state.stop) if i >= 0]\n"
        "            state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n",
        "the text searched for stop strings before the step's new text is added",
        says=("but was not found",),
    ),
    Mutant(
        "output_processor",
        "                    text, len(output.output_token_ids), reason, output.error\n"
        "                )\n",
        "                    text, len(output.output_token_ids), reason, output.error\n"
        "                )\n"
        '                if reason == "stop":\n'
        "                    break\n",
        "the loop left at a stop string: the step's other outputs are dropped",
        says=("loop left",),
    ),
    Mutant(
        "output_processor",
        "processed.to_abort.append(output.request_id)",
        "processed.to_abort = [output.request_id]",
        "to_abort replaced at each request that stops, not added to",
        says=("replaced rather than added to",),
    ),
    Mutant(
        "output_processor",
        "                if not output.finished:\n"
        "                    processed.to_abort.append(output.request_id)\n",
        "                for _ in hits:\n"
        "                    if not output.finished:\n"
        "                        processed.to_abort.append(output.request_id)\n",
        "a request named in to_abort once per stop string found",
        says=("named once",),
    ),
    Mutant(
        "output_processor",
        "processed.to_abort.append(output.request_id)",
        "processed.to_abort.append(output)",
        "the output put in to_abort, not its request id",
        says=("request ids (strings)",),
    ),
    Mutant(
        "output_processor",
        "if text or reason is not None:",
        "if text:",
        "no delta when a request ends with nothing left to send",
        says=("a reason to give",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(state.text), reason, output.error",
        "num_output_tokens is the text's length in characters",
        says=("not the characters",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, end, reason, output.error",
        "num_output_tokens is the number of characters sent",
        says=("not the characters",),
    ),
    Mutant(
        "output_processor",
        "state.text += state.detokenizer.add(output.new_token_ids, last=output.finished)",
        "state.text += state.detokenizer.add(output.new_token_ids, last=output.finished).replace("
        '"\\ufffd", "")',
        "the replacement character taken out of the text",
        says=("taken out",),
    ),
    Mutant(
        "output_processor",
        "            state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n",
        "            if output.new_token_ids:\n"
        "                state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n",
        "the detokenizer not called in a last step with no new token: a held character lost",
        says=("no new token",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(output.output_token_ids), output.error, reason",
        "the Delta's reason and error given in the wrong order",
        says=("error field",),
    ),
    Mutant(
        "output_processor",
        "                end = len(state.text)\n",
        "                end = max(state.sent, len(state.text) - max(map(len, state.stop), "
        "default=1) + 1)\n",
        "the hold applied to a finished request too: its last characters never sent",
        says=("held-back characters are sent with its last delta",),
    ),
    Mutant(
        "output_processor",
        "(state.text.find(s) for s in state.stop)",
        "(state.text[state.sent :].find(s) for s in state.stop)",
        "the unsent text searched for stop strings, its index used as if in the whole text",
        says=("index in all the text so far",),
    ),
    Mutant(
        "output_processor",
        "state.text += state.detokenizer.add",
        "state.text += Detokenizer(self.tokenizer).add",
        "a new detokenizer at each step: characters that span tokens lost",
        says=("not a new one",),
    ),
    Mutant(
        "output_processor",
        "end = max(state.sent, len(state.text) - hold)",
        "end = min(state.sent, len(state.text) - hold)",
        "the smaller of what was sent and the text less the hold: nothing sent before the end",
        says=("the larger",),
    ),
    Mutant(
        "output_processor",
        "            text, state.sent = state.text[state.sent : end], end\n",
        "            state.sent = end\n            text = state.text[state.sent : end]\n",
        "state.sent moved before the delta's text is read: every delta empty",
        says=("before the delta's text is read",),
    ),
]

# Slips from a learner's run of the whole chapter (each one's first message names it):
# the table's length for the block size, a mask reversed or applied after the softmax, a
# generator seeded anew at every step, a held hit counted as not free, a running chunk
# past the budget, a loop over a copy of the running requests, ...
MUTANTS += [
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // len(block_table)] * block_size + p % len(block_table)",
        "the table's length used as the block size",
        name="len-table-as-size",
        says=("table's length", "block size"),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] * len(block_table) + p % block_size",
        "the block id multiplied by the number of blocks in the table, not the block size",
        name="stride-table-length",
        says=("table's length", "times block_size"),
    ),
    Mutant(
        "slots_of",
        "for p in positions]",
        "for p in range(positions.start + 1, positions.stop + 1)]",
        "the positions counted from 1: each slot is the next position's",
        name="positions-from-1",
        says=("next position",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size - 1] * block_size + p % block_size",
        "the table entry one early (p // block_size - 1): Python's -1 wraps to the last",
        name="entry-minus-one",
        says=("entry before its own",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "sorted(block_table)[p // block_size] * block_size + p % block_size",
        "the table sorted before it is read",
        name="sorted-table",
        says=("table sorted",),
    ),
    Mutant(
        "slots_of",
        "return [block_table",
        "return [torch.tensor(block_table)",
        "the slots are 0-d tensors, not ints",
        name="tensor-elements",
        says=("list of python ints",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, :, None] <= query_pos[:, None, :]",
        "the mask transposed: [G, L, Q]",
        name="mask-transposed",
        says=("queries before keys",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] >= query_pos[:, :, None]",
        "the mask's comparison reversed: each query reads its position and after",
        name="mask-reversed",
        says=("reversed",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] <= query_pos[:, :1, None]",
        "every query reads up to the first query's position",
        name="mask-first-query",
        says=("first query's position",),
    ),
    Mutant(
        "attend",
        SDPA_CALL,
        "    q, k, v = queries.transpose(1, 2), gather(keys), gather(values)\n"
        "    scores = q @ k.transpose(-1, -2)\n"
        "    z = scores.masked_fill(~allowed[:, None], float('-inf')).softmax(-1) @ v\n",
        "a hand-written attention whose scores are not divided by sqrt(d_head)",
        name="no-scale",
        says=("sqrt(d_head)",),
    ),
    Mutant(
        "attend",
        SDPA_CALL,
        HAND_SCORES + "    z = scores.softmax(-1).masked_fill(~allowed[:, None], 0.0) @ v\n",
        "the mask applied to the probabilities after the softmax, not to the scores before it",
        name="mask-after-softmax",
        says=("after the softmax",),
    ),
    Mutant(
        "attend",
        SDPA_CALL,
        HAND_SCORES
        + "    z = scores.masked_fill(~allowed[:, None], float('-inf')).softmax(-2) @ v\n",
        "the hand-written softmax over the queries axis, not the keys",
        name="softmax-axis",
        says=("keys' axis",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=allowed[:, None].long()",
        "an integer 0/1 mask where a boolean one is wanted",
        name="long-mask",
        says=("boolean",),
    ),
    Mutant(
        "attend",
        ".view(G, B * cache.shape[1], *cache.shape[2:])",
        ".view(G, B * cache.shape[0], *cache.shape[2:])",
        "the positions axis sized with num_blocks, not block_size",
        name="view-num-blocks",
        says=("num_blocks",),
    ),
    Mutant(
        "attend",
        "queries.transpose(1, 2), gather(keys)",
        "queries, gather(keys)",
        "the queries not put heads first",
        name="queries-not-transposed",
        says=("queries go heads first",),
    ),
    Mutant(
        "attend",
        "return z.transpose(1, 2)",
        "return z",
        "the output left heads first",
        name="output-heads-first",
        says=("transpose",),
    ),
    Mutant(
        "attend",
        "blocks = block_tables.flatten()",
        "blocks = block_tables[0].repeat(G)",
        "every request read through the first request's table",
        name="first-table-for-all",
        says=("first request's table",),
    ),
    Mutant(
        "attend",
        "blocks = block_tables.flatten()",
        "blocks = block_tables.t().flatten()",
        "the table flattened column by column (transposed)",
        name="table-transposed",
        says=("column by column",),
    ),
    Mutant(
        "block_pool",
        "            block.ref_cnt = 1\n            blocks.append(block)",
        "            blocks.append(block)",
        "a new block's count not set to 1",
        name="new-block-count-not-set",
        says=("held once", "set each block's count"),
    ),
    Mutant(
        "block_pool",
        "                self.free_queue[block.block_id] = None",
        "                self.free_queue[block.block_id] = None\n"
        "                self.free_queue.move_to_end(block.block_id, last=False)",
        "a freed block put at the front of the queue (evicted first)",
        name="freed-to-front",
        says=("end of the free queue",),
    ),
    Mutant(
        "block_pool",
        "        for block in blocks:\n            if block.ref_cnt <= 0:",
        "        for block in reversed(blocks):\n            if block.ref_cnt <= 0:",
        "free_blocks frees in reverse of the order given",
        name="free-reversed",
        says=("reverse of the order given",),
    ),
    Mutant(
        "block_pool",
        "block = self.blocks[self.free_queue.popitem(last=False)[0]]",
        "block = self.blocks[next(iter(self.free_queue))]",
        "the front of the queue read but never taken out",
        name="peek-not-pop",
        says=("more than once", "taken out"),
    ),
    Mutant(
        "block_pool",
        "            if block.ref_cnt == 0:\n                del self.free_queue[block.block_id]\n",
        "            del self.free_queue[block.block_id]\n",
        "touch takes every block out of the queue, held ones too",
        name="touch-del-always",
        says=("held already",),
    ),
    Mutant(
        "block_pool",
        "            if block.ref_cnt == 0:\n"
        "                self.free_queue[block.block_id] = None",
        "            if block.ref_cnt == 0:\n"
        "                queue = self.free_queue.copy()\n"
        "                queue[block.block_id] = None",
        "free_blocks adds to a copy of the queue",
        name="free-to-copy",
        says=("copy of the queue",),
    ),
    Mutant(
        "block_pool",
        "            if block.block_hash is not None:  # evict: its "
        "memory is about to be overwritten\n"
        "                del self.cached[block.block_hash]\n",
        "            del self.cached[block.block_hash]\n            if True:\n",
        "every block evicted by name, unnamed ones too",
        name="evict-unnamed",
        says=("never named",),
    ),
    Mutant(
        "kv_cache_manager",
        "self.block_hashes(request, request.num_tokens - 1)",
        "self.block_hashes(request, request.num_tokens)[:-1]",
        "the last full block always left out",
        name="last-block-dropped",
        says=("last token", "not the last full block"),
    ),
    Mutant(
        "kv_cache_manager",
        "needed = math.ceil((num_computed + num_new_tokens) / self.block_size)",
        "needed = (num_computed + num_new_tokens + self.block_size) // self.block_size",
        "blocks counted as n // size + 1: one too many when exact",
        name="plus-one-block",
        says=("a block too many",),
    ),
    Mutant(
        "kv_cache_manager",
        "evictable_hits = sum(1 for block in computed if block.ref_cnt == 0)",
        "evictable_hits = len(computed)",
        "every hit counted as not free, held ones too",
        name="all-hits-not-free",
        says=("held hit",),
    ),
    Mutant(
        "kv_cache_manager",
        "needed = math.ceil((num_computed + num_new_tokens) / self.block_size)",
        "needed = math.ceil(num_new_tokens / self.block_size)",
        "only the new tokens counted",
        name="only-new-tokens",
        says=("num_computed_tokens",),
    ),
    Mutant(
        "kv_cache_manager",
        "            blocks.append(block)\n        return blocks,",
        "            blocks.append(block_hash)\n        return blocks,",
        "the names returned, not the blocks",
        name="names-not-blocks",
        says=("not their names",),
    ),
    Mutant(
        "kv_cache_manager",
        "self.block_hashes(request, request.num_tokens - 1)",
        "self.block_hashes(request, len(request.prompt_token_ids) - 1)",
        "the hits looked for in the prompt only",
        name="prompt-only",
        says=("prompt alone",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_computed = request.num_computed_tokens + len(computed) * self.block_size",
        "num_computed = request.num_computed_tokens + len(computed)",
        "the hits counted as one token each",
        name="hits-as-tokens",
        says=("hits' tokens",),
    ),
    Mutant(
        "sample_requests",
        "generator=request.generator",
        "generator=None",
        "the request's generator not passed: all draw from the global one",
        name="generator-none",
        says=("own generator", "draw with each request's generator"),
    ),
    Mutant(
        "sample_requests",
        "generator=request.generator",
        "generator=None if request.params.seed is None else "
        "torch.Generator(logits.device).manual_seed(request.params.seed)",
        "a new generator seeded at every step",
        name="reseeded-each-step",
        says=("seeded, at each step",),
    ),
    Mutant(
        "sample_requests",
        "**request.params.sampling_kwargs(),",
        "temperature=request.params.temperature, "
        "top_k=request.params.top_k, top_p=request.params.top_p,",
        "frequency_penalty not passed on",
        name="penalty-not-passed",
        says=("without its frequency_penalty",),
    ),
    Mutant(
        "sample_requests",
        "ids, logits[i : i + 1], generator",
        "ids, logits[i], generator",
        "a row passed without its batch axis",
        name="row-1d",
        says=("logits [batch, d_vocab]",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor(request.all_token_ids, device=logits.device)",
        "the text passed 1-D, without its batch axis",
        name="text-1d",
        says=("input_ids [batch, seq]",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([request.all_token_ids], device=logits.device, dtype=logits.dtype)",
        "the text made in the logits' float dtype",
        name="text-float",
        says=("integer token ids",),
    ),
    Mutant(
        "sample_requests",
        "tokens[i] = int(token[0])",
        "tokens[i] = token[0]",
        "a sampled token kept as a tensor",
        name="token-tensor",
        says=("one int per request",),
    ),
    Mutant(
        "sample_requests",
        "generator=request.generator",
        "generator=request.generator or torch.Generator()",
        "an unseeded request given a fresh default generator at every step",
        name="unseeded-fresh-generator",
        says=("global generator", "new generator"),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - request.num_computed_tokens, budget)",
        "num_new = request.num_tokens - request.num_computed_tokens",
        "a running request's chunk not capped by the budget",
        name="running-not-capped",
        says=("more than the whole budget", "capped"),
    ),
    Mutant(
        "schedule",
        "                budget -= num_new\n                i += 1",
        "                budget -= num_new",
        "the index not moved on after scheduling",
        name="index-not-moved",
        says=("more than once", "index"),
    ),
    Mutant(
        "schedule",
        "request.num_computed_tokens = request.num_cached_tokens = num_cached",
        "request.num_computed_tokens = num_cached",
        "num_cached_tokens not set",
        name="cached-not-set",
        says=("num_cached_tokens",),
    ),
    Mutant(
        "schedule",
        "                out.preempted.append(victim)\n",
        "",
        "a preempted request not recorded in the plan",
        name="preempted-not-recorded",
        says=("list is empty", "out.preempted"),
    ),
    Mutant(
        "schedule",
        "                break  # first come, first served: nobody "
        "overtakes the head of the queue\n",
        "                continue\n",
        "continue where admission must stop",
        name="continue-not-break",
        says=("admission stops",),
    ),
    Mutant(
        "schedule",
        "            self.running.append(request)\n",
        "            self.running.insert(0, request)\n",
        "an admitted request put at the front of running",
        name="admitted-at-front",
        says=("end of self.running",),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - request.num_computed_tokens, budget)",
        "num_new = min(request.num_tokens - request.num_cached_tokens, budget)",
        "the running request's tokens counted from its cache hits, not its computed tokens",
        name="running-from-cached",
        says=("not less its cache hits",),
    ),
    Mutant(
        "output_processor",
        "            if hits:\n",
        "            if hits and not output.finished:\n",
        "stop strings looked for only while the engine runs the request",
        name="stop-only-unfinished",
        says=("engine finishes the request too",),
    ),
    Mutant(
        "output_processor",
        "hold = max(map(len, state.stop), default=1) - 1",
        "hold = max(map(len, state.stop)) - 1",
        "no default for the hold",
        name="hold-no-default",
        says=("no stop strings", "hold is 0"),
    ),
    Mutant(
        "schedule",
        "        while i < len(self.running) and budget > 0:\n"
        "            request = self.running[i]\n",
        "        for request in list(self.running):\n"
        "            if budget <= 0:\n"
        "                break\n",
        "the running requests looped over in a copy made before the preemptions",
        name="loop-over-copy",
        says=("copied before the step",),
    ),
    # Slips a held-out run found with no named first message: the grader now says where a
    # crash in the learner's code was raised, and what a meta tensor's refusal means.
    Mutant(
        "attend",
        "    G, B = block_tables.shape\n",
        "    G, B = block_tables.shape\n    if max(query_pos.flatten().tolist()) < 0:\n"
        "        raise ValueError('no position')\n",
        "the positions read back into Python (.tolist()) inside attend: a host sync",
        name="tolist-host-read",
        says=("meta", "reads values back into Python"),
    ),
    Mutant(
        "block_pool",
        "del self.cached[block.block_hash]\n                block.block_hash = None",
        "block.block_hash = None\n                del self.cached[block.block_hash]",
        "the evicted block's name cleared before it is used to remove the block from the cache",
        name="name-cleared-before-eviction",
        says=("raised in your", "del self.cached"),
    ),
    # Held-out slips whose first message did not name them (each now does).
    Mutant(
        "slots_of",
        "for p in positions]",
        "for p in range(positions.start, positions.stop + 1)]",
        "the positions' range run one past its end: one slot too many",
        name="one-slot-too-many",
        says=("one slot per position", "slots came back"),
    ),
    Mutant(
        "attend",
        "queries.transpose(1, 2), gather(keys), gather(values)",
        "queries.float().transpose(1, 2), gather(keys).float(), gather(values).float()",
        "attention computed in float32 and the result not cast back to the queries' dtype",
        name="float32-not-cast-back",
        says=("dtype", "cast"),
    ),
    Mutant(
        "attend",
        "queries.transpose(1, 2), gather(keys), gather(values)",
        "queries.transpose(1, 2), gather(keys), gather(keys)",
        "the values gathered from the keys' cache",
        name="values-from-keys",
        says=("keys as values",),
    ),
    Mutant(
        "kv_cache_manager",
        "math.ceil((num_computed + num_new_tokens) / self.block_size)",
        "math.ceil(num_computed + num_new_tokens / self.block_size)",
        "the blocks needed computed without the parentheses: only the new tokens divided",
        name="ceil-parentheses-lost",
        says=("blocks needed", "block boundar"),
    ),
    Mutant(
        "kv_cache_manager",
        "self.block_hashes(request, request.num_tokens - 1)",
        "self.block_hashes(request, request.num_computed_tokens)",
        "the hits looked up among the computed tokens only, not the request's tokens",
        name="hits-among-computed",
        says=("looked at", "tokens"),
    ),
    Mutant(
        "schedule",
        "            if len(self.running) >= self.max_num_seqs:\n"
        "                break\n"
        "            request = self.waiting[0]\n"
        "            computed, num_cached = self.kv.get_computed_blocks(request)\n"
        "            num_new = min(request.num_tokens - num_cached, budget)\n"
        "            if self.kv.allocate_slots(request, num_new, computed) is None:\n"
        "                break",
        "            request = self.waiting[0]\n"
        "            computed, num_cached = self.kv.get_computed_blocks(request)\n"
        "            num_new = min(request.num_tokens - num_cached, budget)\n"
        "            if self.kv.allocate_slots(request, num_new, computed) is None:\n"
        "                break\n"
        "            if len(self.running) >= self.max_num_seqs:\n"
        "                break",
        "the seat check made after allocate_slots: a request left waiting holds blocks",
        name="seats-after-allocation",
        says=("left waiting", "holds"),
    ),
    Mutant(
        "sample_requests",
        "            tokens[i] = token\n",
        "            tokens.append(token)\n",
        "the greedy tokens appended to the list, not written in each request's own place",
        name="append-not-in-place",
        says=("own place", "requests"),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([request.all_token_ids[:-1]], device=logits.device)",
        "the penalty's text without its last token",
        name="text-without-last",
        says=("whole text", "prompt and output"),
    ),
    Mutant(
        "sample_requests",
        "ids, logits[i : i + 1], generator",
        "ids, logits[i : i + 1] / request.params.temperature, generator",
        "the logits divided by the temperature before the sampler divides them again",
        name="temperature-twice",
        says=("temperature", "twice"),
    ),
    # held out from the chapter's tests, named after one run (a learner's slips of our own)
    Mutant(
        "slots_of",
        "[block_table[p // block_size] * block_size",
        "[block_table[-1] * block_size",
        "every position put in the table's last block",
        name="last-block-for-all",
        says=("last block",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=allowed[None]",
        "the mask's heads axis added in front ([1, G, Q, L]) instead of after G",
        name="mask-heads-axis-first",
        says=("broadcast over the heads",),
    ),
    Mutant(
        "attend",
        "return z.transpose(1, 2)",
        "return z.reshape(queries.shape)",
        "the output [G, n_heads, Q, d_head] reshaped to the queries' shape instead of transposed",
        name="output-reshaped",
        says=("transpose",),
    ),
    Mutant(
        "block_pool",
        "                del self.free_queue[block.block_id]\n            block.ref_cnt += 1",
        "                del self.free_queue[block.block_id]\n                block.ref_cnt += 1",
        "touch adds a holder only to a free block (the increment indented under the if)",
        name="touch-counts-free-only",
        says=("adds a holder",),
    ),
    Mutant(
        "sample_requests",
        "r.params.temperature == 0 and r.params.frequency_penalty == 0",
        "r.params.temperature == 0 or r.params.frequency_penalty == 0",
        "'or' for 'and' in the greedy test: greedy requests with a penalty and unpenalised "
        "sampling requests taken by argmax",
        name="or-for-and-greedy",
        says=("not a plain argmax",),
    ),
    Mutant(
        "output_processor",
        "text, state.sent = state.text[state.sent : end], end",
        "text, sent = state.text[state.sent : end], end",
        "the characters sent kept in a local variable, not in state.sent",
        name="sent-in-a-local",
        says=("not sent before",),
    ),
    Mutant(
        "output_processor",
        "processed.to_abort.append(output.request_id)",
        "processed.to_abort.extend(output.request_id)",
        "to_abort extended with the request id (its characters) instead of appending it",
        name="extend-for-append",
        says=("characters of the ids",),
    ),
    # held out from the chapter's tests (a fourth set, none a mutant before), named after one run
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] * block_size + p",
        "the offset within the block is the whole position p, not p % block_size: right in "
        "the first block only",
        name="ho-the-offset-within-the-block",
        says=("whole position",),
    ),
    Mutant(
        "slots_of",
        "for p in positions]",
        "for p in range(positions.stop)]",
        "slots for every position up to the range's end, the already-computed ones too, "
        "instead of only the positions given",
        name="ho-slots-for-every-position-up",
        says=("positions before",),
    ),
    Mutant(
        "attend",
        "attn_mask=allowed[:, None]",
        "attn_mask=allowed[:, :, None]",
        "the mask's heads axis inserted after the queries ([G, Q, 1, L]) instead of after "
        "G: right for decodes (Q = 1), wrong for a prompt chunk",
        name="ho-the-mask-s-heads-axis",
        says=("broadcast over the heads",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] <= query_pos[:, :, None] + 1",
        "each query may read one key past its own position (an unwritten slot, or the next "
        "token of its chunk)",
        name="ho-each-query-may-read-one",
        says=("just after its own",),
    ),
    Mutant(
        "block_pool",
        "block.ref_cnt -= 1\n"
        "            if block.ref_cnt == 0:\n"
        "                self.free_queue[block.block_id] = None",
        "if block.ref_cnt == 0:\n"
        "                self.free_queue[block.block_id] = None\n"
        "            block.ref_cnt -= 1",
        "free_blocks tests for 0 before decrementing: a block whose last holder lets go "
        "never joins the free queue",
        name="ho-free-blocks-tests-for-0",
        says=("checked after it is lowered",),
    ),
    Mutant(
        "block_pool",
        "            blocks.append(block)\n        return blocks",
        "            blocks.append(block)\n            return blocks",
        "return indented into the loop of get_new_blocks: one block handed out whatever n is asked",
        name="ho-return-indented-into-the-loop",
        says=("one block for each asked for",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_computed = request.num_computed_tokens + len(computed) * self.block_size",
        "num_computed = request.num_tokens + len(computed) * self.block_size",
        "the blocks counted from all the request's known tokens (num_tokens) instead of "
        "its computed ones: the new tokens are counted twice and too many blocks are taken",
        name="ho-the-blocks-counted-from-all",
        says=("counted twice",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_new_blocks = needed - len(blocks) - len(computed)",
        "num_new_blocks = needed - len(computed)",
        "the blocks the request already holds not subtracted: every step asks the pool for "
        "the whole table again and the table grows",
        name="ho-the-blocks-the-request-already",
        says=("holds already count",),
    ),
    Mutant(
        "sample_requests",
        "        if is_greedy[i]:\n            continue",
        "        if is_greedy[i]:\n            break",
        "break for continue at a greedy request: every sampling request after the first "
        "greedy one is never sampled (its token stays 0)",
        name="ho-break-for-continue-at-a",
        says=("rows skipped",),
    ),
    Mutant(
        "sample_requests",
        "**request.params.sampling_kwargs(),",
        "**requests[0].params.sampling_kwargs(),",
        "the first request's settings (temperature, top-k, top-p, penalty) used for every "
        "sampled request",
        name="ho-the-first-request-s-settings",
        says=("its own settings",),
    ),
    Mutant(
        "schedule",
        "budget -= num_new\n                i += 1",
        "budget -= 1\n                i += 1",
        "a running request takes one token from the budget whatever its chunk: a chunked "
        "prompt overruns max_num_batched_tokens",
        name="ho-a-running-request-takes-one",
        says=("whole chunk",),
    ),
    Mutant(
        "schedule",
        "request.num_computed_tokens = request.num_cached_tokens = num_cached",
        "request.num_cached_tokens = num_cached\n"
        "            request.num_computed_tokens = num_cached + num_new",
        "an admitted request's computed tokens advanced past the chunk scheduled now "
        "(update adds them again after the model ran)",
        name="ho-an-admitted-request-s-computed",
        says=("counted as computed twice",),
    ),
    Mutant(
        "output_processor",
        "if not output.finished:",
        "if output.finished:",
        "the test for aborting inverted: a request the engine already finished is put in "
        "to_abort, one still running never is",
        name="ho-the-test-for-aborting-inverted",
        says=("to_abort must name it",),
    ),
    Mutant(
        "output_processor",
        "add(output.new_token_ids, last=output.finished)",
        "add(output.output_token_ids[-1:], last=output.finished)",
        "the newest output token taken as the step's new tokens: a step with no new token "
        "(a prompt chunk after a preemption, an abort) adds the last token's text again",
        name="ho-the-newest-output-token-taken",
        says=("all of its new tokens",),
    ),
    # held out from the chapter's tests (a fifth set, none a mutant before), named after one run
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size",
        "block_table[round(p / block_size)] * block_size",
        "the table entry rounded to the nearest (round(p / block_size)) instead of rounded "
        "down: the second half of every block goes to the next block",
        name="ho5-the-table-entry-rounded-to",
        says=("rounded down",),
    ),
    Mutant(
        "slots_of",
        "return [block_table[p // block_size] * block_size + p % block_size for p in positions]",
        "return (block_table[p // block_size] * block_size + p % block_size for p in positions)",
        "round brackets for square ones: a one-shot generator returned, not the list of "
        "ints the contract asks for (prepare_inputs's += hides it)",
        name="ho5-round-brackets-for-square-ones",
        says=("list of python ints",),
    ),
    Mutant(
        "attend",
        "rows = cache.index_select(0, blocks)",
        "rows = cache.index_select(1, blocks)",
        "the blocks picked along axis 1 (offsets within a block) instead of axis 0 (the blocks)",
        name="ho5-the-blocks-picked-along-axis",
        says=("it was raised in your",),
    ),
    Mutant(
        "attend",
        "G, B = block_tables.shape\n    blocks = block_tables.flatten()",
        "B, G = block_tables.shape\n    blocks = block_tables.flatten()",
        "the table's shape unpacked in the wrong order (B, G): right only when a table is "
        "square, G == B",
        name="ho5-the-table-s-shape-unpacked",
        says=("[b, g]",),
    ),
    Mutant(
        "block_pool",
        "block = self.blocks[self.free_queue.popitem(last=False)[0]]",
        "block = self.blocks[self.free_queue.popitem(last=False)[1]]",
        "the popped (key, value) pair read at index 1: the value (None) used as the block "
        "id, not the key",
        name="ho5-the-popped-key-value-pair",
        says=("it was raised in your",),
    ),
    Mutant(
        "block_pool",
        "                del self.free_queue[block.block_id]",
        "                self.free_queue.popitem(last=False)",
        "touch takes the oldest free block out of the queue (popitem) instead of the block "
        "it touches: the touched block stays free and another is lost",
        name="ho5-touch-takes-the-oldest-free",
        says=("must leave the free queue",),
    ),
    Mutant(
        "kv_cache_manager",
        "evictable_hits = sum(1 for block in computed if block.ref_cnt == 0)",
        "evictable_hits = sum(1 for block in computed if block.ref_cnt > 0)",
        "the hits held by others counted as the ones taken from the free blocks, and the "
        "free ones not: the condition inverted",
        name="ho5-the-hits-held-by-others",
        says=("ref_cnt is 0",),
    ),
    Mutant(
        "kv_cache_manager",
        "needed = math.ceil((num_computed + num_new_tokens) / self.block_size)",
        "needed = (num_computed + num_new_tokens - 1) // self.block_size",
        "a ceiling division misremembered as (n - 1) // size: always one block too few",
        name="ho5-a-ceiling-division-misremembered-as",
        says=("one too few",),
    ),
    Mutant(
        "sample_requests",
        "generator=request.generator,",
        "generator=request.generator if request.params.seed else None,",
        "the generator passed only when the seed is truthy: a request seeded with 0 draws "
        "from the global generator",
        name="ho5-the-generator-passed-only-when",
        says=("seed of 0",),
    ),
    Mutant(
        "sample_requests",
        "logits[greedy].argmax(dim=-1)",
        "logits[: len(greedy)].argmax(dim=-1)",
        "the greedy tokens taken from the first len(greedy) rows instead of the greedy "
        "requests' own rows",
        name="ho5-the-greedy-tokens-taken-from",
        says=("its own request's place",),
    ),
    Mutant(
        "schedule",
        "out.preempted.append(victim)",
        "out.preempted.append(request)",
        "the request being scheduled recorded as preempted instead of the victim",
        name="ho5-the-request-being-scheduled-recorded",
        says=("names the victim",),
    ),
    Mutant(
        "output_processor",
        "state.text.find(s)",
        "state.text.index(s)",
        "str.index for str.find: a stop string not (yet) in the text raises instead of giving -1",
        name="ho5-str-index-for-str-find",
        says=("it was raised in your",),
    ),
    # held out from the chapter's tests (a sixth set, none a mutant before), named after one run
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] * block_size + (p - positions.start) % block_size",
        "the offset within the block counted from the chunk's first position, (p - start) "
        "% block_size, not p % block_size: right only when the chunk starts at a block "
        "boundary (a prefill from 0), wrong for decodes",
        name="ho6-the-offset-within-the-block",
        says=("offsets within the block",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[p // block_size] * block_size + p // block_size",
        "copy-paste: the offset within the block written p // block_size (the block's "
        "index) instead of p % block_size",
        name="ho6-copy-paste-the-offset-within",
        says=("offsets within the block",),
    ),
    Mutant(
        "attend",
        "return z.transpose(1, 2)",
        "return z.transpose(1, 2).flatten(2)",
        "the heads' outputs concatenated (flatten(2), chapter 1's habit): attend returns "
        "[G, Q, n_heads * d_head] where its contract and paged_attention want [G, Q, "
        "n_heads, d_head]",
        name="ho6-the-heads-outputs-concatenated-flatten",
        says=("wrong shape",),
    ),
    Mutant(
        "block_pool",
        "for _ in range(n):",
        "for _ in range(1, n):",
        "get_new_blocks loops over range(1, n): one block fewer than asked (none when one "
        "is asked)",
        name="ho6-get-new-blocks-loops-over",
        says=("one block for each asked for",),
    ),
    Mutant(
        "block_pool",
        "block.ref_cnt -= 1",
        "block.ref_cnt = 0",
        "free_blocks sets a block's count to 0 instead of one less: a block shared by two "
        "requests becomes free (and can be handed out) when the first lets go",
        name="ho6-free-blocks-sets-a-block",
        says=("ref_cnt should be 1",),
    ),
    Mutant(
        "kv_cache_manager",
        "return blocks, len(blocks) * self.block_size",
        "return blocks, max(0, len(blocks) * self.block_size - 1)",
        "the rule 'the last token must be computed' applied to the hits' count: one token "
        "fewer than the hit blocks hold is reported cached (the lookup already leaves the "
        "last token out)",
        name="ho6-the-rule-the-last-token",
        says=("the count is not",),
    ),
    Mutant(
        "kv_cache_manager",
        "self.pool.num_free_blocks - evictable_hits:\n            return None",
        "self.pool.num_free_blocks - evictable_hits:\n            return []",
        "an empty list returned when the pool cannot give the blocks, where the contract "
        "says None: the scheduler takes [] for success and schedules the request without "
        "its blocks",
        name="ho6-an-empty-list-returned-when",
        says=("return none",),
    ),
    Mutant(
        "sample_requests",
        "ids, logits[i : i + 1], generator=request.generator,",
        "ids, logits[-1:], generator=request.generator,",
        "every sampled request drawn from the last row of the logits (logits[-1:], the "
        "generate loop's habit of taking the last position) instead of its own row i",
        name="ho6-every-sampled-request-drawn-from",
        says=("last row",),
    ),
    Mutant(
        "sample_requests",
        "logits[greedy].argmax(dim=-1).tolist()",
        "logits[greedy].argmax(dim=-1, keepdim=True).tolist()",
        "argmax with keepdim=True: .tolist() gives one-element lists, so each greedy "
        "request gets [token] where an int belongs",
        name="ho6-argmax-with-keepdim-true-tolist",
        says=("python int",),
    ),
    Mutant(
        "schedule",
        "victim = self.running.pop()",
        "victim = self.running.pop(i)",
        "the running request that needs a block preempts itself (running.pop(i)) instead "
        "of the newest running request: an older request is sent back while newer ones "
        "keep their blocks",
        name="ho6-the-running-request-that-needs",
        says=("newest",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(output.output_token_ids) + len(output.new_token_ids), reason, output.error",
        "num_output_tokens adds the step's new tokens to output_token_ids, which already "
        "holds them: each step's tokens counted twice",
        name="ho6-num-output-tokens-adds-the",
        says=("every token so far",),
    ),
    Mutant(
        "output_processor",
        "reason = output.finish_reason if output.finished else None",
        'reason = "stop" if output.finished else None',
        "every request the engine finished reported with reason 'stop': the engine's own "
        "reason ('length', 'abort', 'error') replaced",
        name="ho6-every-request-the-engine-finished",
        says=("engine's reason",),
    ),
    Mutant(
        "schedule",
        "if self.kv.allocate_slots(request, num_new, computed) is None:",
        "if self.kv.allocate_slots(request, num_new) is None:",
        "the cache hits not passed to allocate_slots: they are never held, and the table "
        "does not cover the cached positions",
        name="ho5-cache-hits-not-passed",
        says=("computed` argument",),
    ),
    Mutant(
        "output_processor",
        "if reason is None:  # a stop string",
        "if not output.finished:  # a stop string",
        "the hold-or-finish test reads the engine's finished flag instead of the reason: "
        "a request that meets a stop string is held back and never forgotten",
        name="ho5-hold-or-finish-reads-finished",
        says=("not by the engine's finished flag",),
    ),
    Mutant(
        "attend",
        "    key_pos = torch.arange(B * keys.shape[1], device=queries.device)\n"
        '    allowed: Bool[Tensor, "G Q L"] = key_pos[None, None, :] <= query_pos[:, :, None]',
        "    offsets = torch.arange(keys.shape[1], device=queries.device)\n"
        "    key_pos = (blocks[:, None] * keys.shape[1] + offsets).view(G, -1)\n"
        '    allowed: Bool[Tensor, "G Q L"] = key_pos[:, None, :] <= query_pos[:, :, None]',
        "the keys' slots (where they lie in the cache) compared with the queries' "
        "positions in the mask, instead of the keys' positions in their request: right "
        "only when a table is 0, 1, 2, ...",
        name="ho6-key-positions-from-slots",
        says=("IN THE TABLE",),
    ),
    Mutant(
        "schedule",
        "            request = self.waiting[0]\n"
        "            computed, num_cached = self.kv.get_computed_blocks(request)\n"
        "            num_new = min(request.num_tokens - num_cached, budget)\n"
        "            if self.kv.allocate_slots(request, num_new, computed) is None:\n"
        "                break  # first come, first served: "
        "nobody overtakes the head of the queue\n"
        "            self.waiting.popleft()\n",
        "            request = self.waiting.popleft()\n"
        "            computed, num_cached = self.kv.get_computed_blocks(request)\n"
        "            num_new = min(request.num_tokens - num_cached, budget)\n"
        "            if self.kv.allocate_slots(request, num_new, computed) is None:\n"
        "                break  # first come, first served: "
        "nobody overtakes the head of the queue\n",
        "the head of the queue popped before allocate_slots answers: a request the pool "
        "cannot take yet is dropped from the queue, neither waiting nor running, and "
        "never served",
        name="ho6-queue-head-popped-early",
        says=("neither waiting nor running",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size + p % block_size",
        "block_table[0] * block_size + p",
        "the request's blocks taken as one contiguous run from its first block (block_table[0] "
        "* block_size + p): right only when the table is consecutive ids",
        name="ho7-the-request-s-blocks-taken",
        says=("one after another in the cache",),
    ),
    Mutant(
        "slots_of",
        "block_table[p // block_size] * block_size",
        "block_table[(p + 1) // block_size] * block_size",
        "the table entry from (p + 1) // block_size (a count of tokens, not a position): the "
        "last position of every block goes into the next block (out of the table at its end)",
        name="ho7-the-table-entry-from-p",
        says=("rounded DOWN",),
    ),
    Mutant(
        "attend",
        "        rows = cache.index_select(0, blocks).view(G, B * cache.shape[1], "
        "*cache.shape[2:])\n"
        "        return rows.transpose(1, 2).contiguous()",
        "        rows = cache.index_select(0, blocks).view(G, B, *cache.shape[1:])\n"
        "        return rows.permute(0, 3, 2, 1, 4).reshape(G, cache.shape[2], B * "
        "cache.shape[1], cache.shape[3])",
        "heads moved first with permute(0, 3, 2, 1, 4), which also swaps blocks and offsets "
        "before they are merged: key index offset * B + block instead of block * block_size + "
        "offset (right only with one block)",
        name="ho7-heads-moved-first-with-permute",
        says=("offsets first",),
    ),
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] <= query_pos[0][None, :, None]",
        "one mask for every request, from the first request's positions (query_pos[0]): right "
        "for a prompt chunk alone (G = 1), wrong for a group of decodes at different positions",
        name="ho7-one-mask-for-every-request",
        says=("query_pos[0]",),
    ),
    Mutant(
        "block_pool",
        "block.ref_cnt -= 1\n            if block.ref_cnt == 0:",
        "block.ref_cnt -= 1\n            if block.ref_cnt == 1:",
        "free_blocks tests for the last holder (== 1) after the decrement: a block still held "
        "once joins the free queue, a block nobody holds never does",
        name="ho7-free-blocks-tests-for-the",
        says=("checked after it is lowered",),
    ),
    Mutant(
        "block_pool",
        "del self.cached[block.block_hash]",
        "del self.cached[block.block_id]",
        "an evicted block's entry removed from self.cached by its id instead of its hash: "
        "KeyError whenever a named block is handed out again",
        name="ho7-an-evicted-block-s-entry",
        says=("it was raised in your",),
    ),
    Mutant(
        "kv_cache_manager",
        "num_new_blocks = needed - len(blocks) - len(computed)",
        "num_new_blocks = math.ceil(num_new_tokens / self.block_size)",
        "the new blocks counted from the new tokens alone, rounded up, ignoring the room left "
        "in the request's last block: every decode step takes a fresh block",
        name="ho7-the-new-blocks-counted-from",
        says=("room left in the request's last block",),
    ),
    Mutant(
        "kv_cache_manager",
        "            if block is None:\n                break",
        "            if block is None:\n                return [], 0",
        "get_computed_blocks gives up at the first miss with no hits at all, throwing away the "
        "leading blocks already found: hits only when every full block is cached",
        name="ho7-get-computed-blocks-gives-up",
        says=("thrown away at the miss",),
    ),
    Mutant(
        "sample_requests",
        "ids, logits[i : i + 1], generator=request.generator,",
        "ids, logits[i:], generator=request.generator,",
        "the slice's end forgotten (logits[i:]): every row from i on handed to "
        "sample_next_token, right only when the sampled request is the last row",
        name="ho7-the-slice-s-end-forgotten",
        says=("it was raised in your",),
    ),
    Mutant(
        "sample_requests",
        "logits[greedy].argmax(dim=-1).tolist()",
        "logits[greedy].max(dim=-1).values.tolist()",
        "the greedy rows' largest logit (max(...).values) taken instead of its index: greedy "
        "requests get a float logit where a token id belongs",
        name="ho7-the-greedy-rows-largest-logit",
        says=("largest LOGIT",),
    ),
    Mutant(
        "schedule",
        "num_new = min(request.num_tokens - request.num_computed_tokens, budget)",
        "num_new = min(len(request.prompt_token_ids) - request.num_computed_tokens, budget)",
        "a running request's missing tokens counted against its prompt only, not prompt and "
        "output: a decoding request is given 0 or fewer tokens",
        name="ho7-a-running-request-s-missing",
        says=("against its prompt alone",),
    ),
    Mutant(
        "schedule",
        "            out.admitted.append(request)\n            budget -= num_new",
        "            out.admitted.append(request)\n            budget -= request.num_tokens",
        "an admitted request charged its whole prompt against the budget, its cache hits "
        "included, instead of the tokens scheduled: fewer requests admitted after a prefix hit",
        name="ho7-an-admitted-request-charged-its",
        says=("cache hits included",),
    ),
    Mutant(
        "output_processor",
        "text, len(output.output_token_ids), reason, output.error",
        "text, len(output.output_token_ids), output.finish_reason, output.error",
        "the delta carries the engine's finish_reason instead of the processor's reason: a "
        "request ended by a stop string while running gets a last delta with reason None (and "
        "'length' where it should say 'stop')",
        name="ho7-the-delta-carries-the-engine",
        says=("the engine's finish_reason",),
    ),
    Mutant(
        "output_processor",
        "                end = len(state.text)\n                del self.states[output.request_id]",
        "                end = len(state.text)\n"
        "                if output.finished:\n"
        "                    del self.states[output.request_id]",
        "a request is forgotten only when the engine finished it: one ended by a stop string "
        "stays in states, and the abort the engine reports next makes a second last delta",
        name="ho7-a-request-is-forgotten-only",
        says=("not by the engine's finished flag",),
    ),
    Mutant(
        "slots_of",
        "for p in positions]",
        "for p in positions[:-1]]",
        "the range's last position dropped (positions[:-1]): one slot too few, and a decode "
        "step (one position) gets none",
        name="ho8-the-range-s-last-position",
        says=("have none",),
    ),
    Mutant(
        "slots_of",
        "+ p % block_size",
        "+ p - p // block_size",
        "the offset within the block written p - p // block_size (the block's index "
        "subtracted, the * block_size forgotten) instead of p % block_size: right in block 0 only",
        name="ho8-the-offset-within-the-block",
        says=("minus its block's INDEX",),
    ),
    Mutant(
        "attend",
        "key_pos = torch.arange(B * keys.shape[1], device=queries.device)",
        "key_pos = torch.arange(B * keys.shape[1]).to(queries)",
        "the key positions moved with .to(queries), which takes the queries' dtype as well as "
        "their device: in bfloat16 the positions above 256 are rounded, and the mask is wrong "
        "around them",
        name="ho8-the-key-positions-moved-with",
        says=("Past 256",),
    ),
    Mutant(
        "attend",
        "key_pos = torch.arange(B * keys.shape[1], device=queries.device)",
        "key_pos = torch.arange(keys.shape[1], device=queries.device).repeat(B)",
        "each key's offset within its block (arange(block_size) repeated per block) compared "
        "with the query's position instead of its position in the request: past the first "
        "block, every key of every block is readable, padding and unwritten slots included",
        name="ho8-each-key-s-offset-within",
        says=("offset in its block alone",),
    ),
    Mutant(
        "block_pool",
        "block = self.blocks[self.free_queue.popitem(last=False)[0]]",
        "block_id = min(self.free_queue)\n"
        "            del self.free_queue[block_id]\n"
        "            block = self.blocks[block_id]",
        "the free block with the smallest id handed out instead of the least recently freed: "
        "right while the queue is still in id order, wrong once blocks come back",
        name="ho8-the-free-block-with-the",
        says=("smallest free ids",),
    ),
    Mutant(
        "block_pool",
        "if block.ref_cnt == 0:\n                self.free_queue[block.block_id] = None",
        "if block.ref_cnt == 0 and block.block_hash is None:\n"
        "                self.free_queue[block.block_id] = None",
        "a named block kept out of the free queue when its count reaches 0 ('to keep it "
        "cached'): it can never be evicted, the pool runs dry, and a hit on it (touch) finds "
        "it missing from the queue",
        name="ho8-a-named-block-kept-out",
        says=("named or not",),
    ),
    Mutant(
        "kv_cache_manager",
        "            if block is None:\n                break",
        "            if block is None or block.ref_cnt == 0:\n                break",
        "a cached block that nobody holds (freed, waiting in the queue) taken for a miss: "
        "blocks keep their contents when freed, but only a prefix still held by a running "
        "request is found",
        name="ho8-a-cached-block-that-nobody",
        says=("taken for a miss",),
    ),
    Mutant(
        "kv_cache_manager",
        "if num_new_blocks > self.pool.num_free_blocks - evictable_hits:",
        "if num_new_blocks - evictable_hits > self.pool.num_free_blocks:",
        "the free hits subtracted from the blocks needed instead of from the free blocks: an "
        "allocation the pool cannot give is accepted, and get_new_blocks fails",
        name="ho8-the-free-hits-subtracted-from",
        says=("count the hits whose ref_cnt is 0 as not free",),
    ),
    Mutant(
        "sample_requests",
        "    for i, request in enumerate(requests):\n"
        "        if is_greedy[i]:\n"
        "            continue\n",
        "    for i, request in enumerate([r for r, g in zip(requests, is_greedy) if not g]):\n",
        "the sampled requests enumerated after the greedy ones are filtered out: i counts "
        "sampled requests only, so each reads another request's row and writes its token in "
        "another request's place",
        name="ho8-the-sampled-requests-enumerated-after",
        says=("counts the sampled requests alone",),
    ),
    Mutant(
        "sample_requests",
        "torch.tensor([request.all_token_ids], device=logits.device)",
        "torch.tensor([sorted(set(request.all_token_ids))], device=logits.device)",
        "the request's text passed as its set of distinct tokens: the frequency penalty counts "
        "each token once (a presence penalty) instead of once per occurrence",
        name="ho8-the-request-s-text-passed",
        says=("every token of it",),
    ),
    Mutant(
        "schedule",
        "if len(self.running) >= self.max_num_seqs:",
        "if len(self.running) + len(out.admitted) >= self.max_num_seqs:",
        "the requests admitted in this step counted twice against max_num_seqs (they are in "
        "self.running already): fewer requests admitted than there are seats",
        name="ho8-the-requests-admitted-in-this",
        says=("counted twice against max_num_seqs",),
    ),
    Mutant(
        "schedule",
        "victim = self.running.pop()",
        "victim = self.running[-1]",
        "the newest running request read (self.running[-1]) as the victim but never taken out "
        "of running before it is preempted",
        name="ho8-the-newest-running-request-read",
        says=("take it out of running first",),
    ),
    Mutant(
        "output_processor",
        "reason = output.finish_reason if output.finished else None",
        "reason = None",
        "the reason started at None whatever the engine said: only a stop string finishes a "
        "request, so one the engine ended ('length', 'abort') is held back, gets no last delta "
        "and is never forgotten",
        name="ho8-the-reason-started-at-none",
        says=("the engine's reason",),
    ),
    Mutant(
        "output_processor",
        "processed.deltas[output.request_id] = Delta(\n"
        "                    text, len(output.output_token_ids), reason, output.error\n"
        "                )",
        "processed.deltas = {\n"
        "                    output.request_id: Delta(text, len(output.output_token_ids), "
        "reason, output.error)\n"
        "                }",
        "the step's deltas replaced by a new dict at each output instead of added to: only the "
        "last request's delta of a step survives",
        name="ho8-the-step-s-deltas-replaced",
        says=("processed.deltas made anew",),
    ),
    # A learner's run of the whole chapter from the blank notebook (73 slips, 70 named first
    # before these).
    Mutant(
        "attend",
        "key_pos[None, None, :] <= query_pos[:, :, None]",
        "key_pos[None, None, :] <= query_pos[:, None]",
        "the queries' positions given their new axis in the middle (a learner's run, chapter 8)",
        says=("new LAST axis",),
    ),
    Mutant(
        "output_processor",
        "text, state.sent = state.text[state.sent : end], end",
        "text = state.text[state.sent : end]",
        "state.sent never moved on (a learner's run, chapter 8)",
        says=("state.sent stayed at 0",),
    ),
    # More of the same learner's run: each slip a mutant
    Mutant(
        "output_processor",
        "            state.text += state.detokenizer.add(output.new_token_ids, "
        "last=output.finished)\n"
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [i for i in (state.text.find(s) for s in state.stop) if i >= 0]\n",
        "            new = state.detokenizer.add(output.new_token_ids, last=output.finished)\n"
        "            state.text += new\n"
        "            reason = output.finish_reason if output.finished else None\n"
        "            hits = [i for i in (new.find(s) for s in state.stop) if i >= 0]\n",
        "the stop strings looked for in the step's new text alone, and an index found there "
        "used as an index in all the text (a learner's run, chapter 8)",
        says=("new text alone",),
    ),
]
