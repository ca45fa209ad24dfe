"""The block pool: every block of the paged KV cache, who uses it, and which are free.

The cache's memory is cut into `num_blocks` blocks of `block_size` positions each (per layer,
keys and values; the tensors live in the model runner). A request holds a list of blocks, its
block table, so that a request's memory grows one block at a time wherever a free block is,
and a finished request's blocks go back at once (vLLM's PagedAttention, Kwon et al., SOSP 2023).

Blocks are shared. A full block is named by the hash of its tokens and of the block before it
(so a name stands for the whole prefix up to that block's end), and two requests whose prompts
begin with the same blocks hold the same physical blocks. A block's `ref_cnt` counts the
requests that hold it; at 0 it is free, but it keeps its contents and its name, so that a later
request with the same prefix finds it, until the pool needs the memory and evicts the least
recently freed block (vLLM v1's `BlockPool`; SGLang's radix tree is the other design).
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from solutions import checks


def hash_block_tokens(parent_hash: bytes | None, token_ids: tuple[int, ...]) -> bytes:
    """A full block's name: SHA-256 of its parent's name and its own tokens. The parent makes
    equal blocks in different contexts different names; a cryptographic hash makes a collision
    (two prefixes, one name: a request would silently read another's keys) practically
    impossible, which Python's 64-bit `hash` does not."""
    data = (parent_hash or b"") + b"|" + ",".join(map(str, token_ids)).encode()
    return hashlib.sha256(data).digest()


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full (scheduled to be written)


class BlockPool:
    """`num_blocks` blocks, a queue of the free ones (least recently freed first) and the map
    from a block's hash to the block, for prefix caching."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        checks.integer("num_blocks", num_blocks, low=1)
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # An ordered dict as the queue: popping the oldest and removing any one are both O(1).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, KVCacheBlock] = {}
        self.enable_caching = enable_caching

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included: a cached block with no user can be evicted."""
        return len(self.free_queue)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """n free blocks, the least recently freed first, each now held once. A block that was
        cached loses its name: its memory is about to be overwritten."""
        if n > len(self.free_queue):
            raise ValueError(f"asked for {n} blocks, only {len(self.free_queue)} are free")
        # BEGIN SOLUTION
        blocks = []
        for _ in range(n):
            block = self.blocks[self.free_queue.popitem(last=False)[0]]
            if block.block_hash is not None:  # evict: its memory is about to be overwritten
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            blocks.append(block)
        return blocks
        # END SOLUTION

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """One more holder for each block (a prefix-cache hit); a free one leaves the queue."""
        # BEGIN SOLUTION
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1
        # END SOLUTION

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """One holder less for each block, in the order given; a block nobody holds joins the
        queue's end (evicted last), keeping its contents and its name."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more times than it was held")
            # BEGIN SOLUTION
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = None
            # END SOLUTION

    def cache_full_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Name a full block, so that later requests with its prefix can share it. If
        another block already has the name (two requests computed the same prefix at once),
        the first keeps it: this one stays unnamed and is freed as any other."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every name, only while no request holds a block (vLLM's contract): a holder
        would name its blocks again at its next step, and the reset would not be one. Returns
        whether it reset. (The blocks' contents stay until they are reused.)"""
        if any(block.ref_cnt > 0 for block in self.blocks):
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True
