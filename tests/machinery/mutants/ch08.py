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
    # schedule
    Mutant(
        "schedule",
        "                budget -= num_new\n                i += 1",
        "                i += 1",
        "the running requests' tokens not taken from the budget",
        says=("budget",),
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
]
