"""The KV cache manager: a request's view of the block pool (vLLM v1's `KVCacheManager`).

Three questions, asked by the scheduler:
- `get_computed_blocks(request)`: which of the request's leading full blocks are already in the
  prefix cache, and so how many of its tokens need no computing;
- `allocate_slots(request, n, computed)`: make the request's block table cover n more tokens, or
  say (None) that the pool cannot, so that the scheduler can preempt someone and try again; the
  blocks those tokens fill are named then and there (`cache_blocks`, as vLLM's does), so that
  no caller can forget it;
- `free(request)`: give its blocks back.

The block table is the request's own `block_ids` (one table: the manager keeps no copy); the
manager looks each id up in the pool.
"""

import math

from solutions.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from solutions.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        # Per request: the names of its full blocks so far (computed once each).
        self.req_hashes: dict[str, list[bytes]] = {}
        # For the engine's report: every block ever handed out, and how many times a block
        # was handed out again after being freed.
        self.handed_out: set[int] = set()
        self.blocks_reused = 0

    def blocks_of(self, request: Request) -> list[KVCacheBlock]:
        """The request's blocks, in its table's order."""
        return [self.pool.blocks[i] for i in request.block_ids]

    def block_hashes(self, request: Request, num_tokens: int) -> list[bytes]:
        """The names of the full blocks among the request's first `num_tokens` tokens."""
        hashes = self.req_hashes.setdefault(request.request_id, [])
        tokens, size = request.all_token_ids, self.block_size
        while (len(hashes) + 1) * size <= num_tokens:
            start = len(hashes) * size
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, tuple(tokens[start : start + size])))
        return hashes[: num_tokens // size]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of the request's leading full blocks found in the cache, and the
        tokens they hold. Never every token: the last one must be computed to give the logits
        that the next token is sampled from."""
        if not self.enable_prefix_caching:
            return [], 0
        # BEGIN SOLUTION
        blocks = []
        for block_hash in self.block_hashes(request, request.num_tokens - 1):
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size
        # END SOLUTION

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None
    ) -> list[KVCacheBlock] | None:
        """Blocks for the request's `num_new_tokens` next tokens (after its computed ones and
        the `computed` cache hits, which it then holds), or None, changing nothing, if the free
        blocks are too few. The full blocks among the tokens it will then have are named."""
        computed = computed or []
        blocks = self.blocks_of(request)
        # Count num_new_blocks, the blocks to add; return None if the pool cannot give them.
        # BEGIN SOLUTION
        num_computed = request.num_computed_tokens + len(computed) * self.block_size
        needed = math.ceil((num_computed + num_new_tokens) / self.block_size)
        num_new_blocks = needed - len(blocks) - len(computed)
        # A free cached block that this request is about to take is not free for new blocks.
        evictable_hits = sum(1 for block in computed if block.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - evictable_hits:
            return None
        # END SOLUTION
        self.pool.touch(computed)
        blocks.extend(computed)
        if num_new_blocks > 0:
            new_blocks = self.pool.get_new_blocks(num_new_blocks)
            self.blocks_reused += sum(b.block_id in self.handed_out for b in new_blocks)
            self.handed_out.update(b.block_id for b in new_blocks)
            blocks.extend(new_blocks)
        request.block_ids = [block.block_id for block in blocks]
        # Named now, as soon as the tokens that fill them are scheduled (see cache_blocks).
        scheduled = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        self.cache_blocks(request, min(scheduled, request.num_tokens))
        return blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Name every full block among the request's first `num_tokens` tokens. `allocate_slots`
        names a block as soon as the tokens that fill it are scheduled: their keys and values
        are written in this step's pass, and a request that finds the name in this same step
        reads them in that pass, after they are written (each layer writes every token's key
        and value before any token's attention reads)."""
        if not self.enable_prefix_caching:
            return
        blocks = self.blocks_of(request)
        hashes = self.block_hashes(request, num_tokens)
        for block, block_hash in zip(blocks, hashes, strict=False):
            self.pool.cache_full_block(block, block_hash)

    def free(self, request: Request) -> None:
        """Give the request's blocks back, its last block first: of the blocks that become
        free, a prefix's tail is then evicted before its head, which more requests share."""
        blocks = self.blocks_of(request)
        request.block_ids = []
        self.pool.free_blocks(list(reversed(blocks)))

    def forget(self, request: Request) -> None:
        """Drop the request's cached names too (it is finished and will not be scheduled)."""
        self.req_hashes.pop(request.request_id, None)
