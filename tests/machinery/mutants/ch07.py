"""Chapter 7's learner-style mutants: slots, paged attention, the block pool, the cache manager,
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
        says=("own positions",),
    ),
    # block_pool
    Mutant(
        "block_pool",
        "self.free_queue.popitem(last=False)",
        "self.free_queue.popitem()",
        "the newest free block handed out, not the least recently freed",
        says=("popitem(last=false)",),
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
        says=("penalty",),
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
        says=("prompt and output",),
    ),
]
