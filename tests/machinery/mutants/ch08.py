"""Chapter 8's learner-style mutants: slots, paged attention, the block pool, the cache manager,
the scheduler and per-request sampling (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

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
        "            if block is not None:\n                blocks.append(block)\n                break\n",
        "the lookup stops at the first hit, not at the first miss",
        name="stops-at-first-hit",
        says=("first hit", "first miss"),
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
        "                break  # first come, first served: nobody overtakes the head of the queue\n",
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
        "    q, k, v = queries.transpose(1, 2), gather(keys), gather(values)\n"
        "    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5\n"
        "    z = scores.masked_fill(~allowed[:, None], 0.0).softmax(-1) @ v\n",
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
