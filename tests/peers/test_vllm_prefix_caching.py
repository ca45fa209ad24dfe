"""vLLM v1's tests of its KV-cache blocks, prefix caching and scheduler, rewritten for chapter 8's
reference: `solutions/block_pool.py` (`BlockPool`, `hash_block_tokens`),
`solutions/kv_cache_manager.py` (`KVCacheManager`) and `solutions/scheduler.py` (`Scheduler`).

Sources (the cases, sizes and expected block orders are theirs; the code is this course's own):

- vllm-project/vllm, tests/v1/core/test_prefix_caching.py at commit
  717aebb008de838f4bbbb84a66d254f0f6c8c9bb.
- vllm-project/vllm, tests/v1/core/test_kv_cache_utils.py at commit
  002f10e0cfa1373a19a0d2756598a34b700d20e5.
- vllm-project/vllm, tests/v1/core/test_scheduler.py at commit
  003df2961dd8830c317a61f9745ccd557da9fa06 (its helpers, tests/v1/core/utils.py, at
  00620f91ea186ca295a1eb69f4acba9d0efaaaaa: prompts of [i] * 10, 16 seats, 8192 tokens a step,
  blocks of 16).

They check the course's reference code (`solutions`), not a learner's notebook: no `impl`. No
model runs: a "step" below is the bookkeeping the engine does after the model.

What changed on the way (tests/peers/README.md says more):

- Block ids. vLLM keeps block 0 as a null block, so its pool of 11 has 10 usable blocks, ids 1 to
  10. The course has no null block: a pool of 10 has ids 0 to 9. The tests write vLLM's ids and
  `vllm_ids` takes 1 off each, so vLLM's orders appear as vLLM wrote them.
- When a block is named: as in vLLM, `allocate_slots` names the full blocks among the tokens it
  covers (the tokens are scheduled, not yet computed), through the manager's `cache_blocks`.
  The port's helpers `admit` and `extend` make the scheduler's calls.
- `allocate_slots` returns the request's whole block table; vLLM returns the new blocks only.
  Where vLLM asserts the new blocks, the port asserts the table's tail.
- One hash, SHA-256 of the parent's name and the tokens, with no seed for the first block and no
  extra keys. vLLM's runs with Python's `hash`, and its extra keys (multimodal, LoRA, cache salt,
  prompt embeddings), have no counterpart.
- The free queue is an OrderedDict inside `BlockPool` (`free_queue`), not a linked list: vLLM's
  queue tests become the same operations through the pool (pop = `get_new_blocks`, remove from
  the middle = `touch`, append = `free_blocks`). Its pointer checks and `prepend_n` have no
  counterpart.
- `reset_prefix_cache`: the port first found that the course forgot every name even while
  blocks were held, where vLLM refuses and returns False; the course now refuses too.
- Two requests that compute the same prefix at once: vLLM names both copies (a name maps to
  several blocks); the course's first keeps the name and the copy stays unnamed.
- Scheduler: the course has one batch in flight, always chunks prompts and has no long-prefill
  threshold, prompt logprobs or async outputs; a preempted request is WAITING (vLLM:
  PREEMPTED). vLLM's pipelined cases are rebuilt with both requests in one step (said where).
- Not ported: multimodal, LoRA, sliding window, hybrid models, EAGLE (but for the non-EAGLE count
  its tests start from), KV events and connectors, prefix-cache statistics and metrics, prompt
  logprobs (`test_prefill_plp` except its duplicate blocks), priority scheduling, structured
  output, speculative decoding.
"""

from __future__ import annotations

import pytest

from solutions.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from solutions.kv_cache_manager import KVCacheManager
from solutions.request import Request, RequestStatus
from solutions.sampling_params import SamplingParams
from solutions.scheduler import Scheduler

# Three full blocks of 16 that several of vLLM's cases share: [0] * 16 + [1] * 16 + [2] * 16.
COMMON = [i for i in range(3) for _ in range(16)]


def vllm_ids(*ids: int) -> list[int]:
    """vLLM's block ids (1 to num_blocks - 1, after its null block 0) as the course's (from 0)."""
    return [i - 1 for i in ids]


def block_ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def free_order(pool: BlockPool) -> list[int]:
    """The free queue, the next block to be handed out (evicted) first."""
    return list(pool.free_queue)


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, list(token_ids), SamplingParams(max_tokens=17))


def admit(kv: KVCacheManager, request: Request):
    """What the scheduler does for a waiting request: look its prefix up, allocate the rest of its
    tokens, count the hits as computed and name the full blocks it scheduled. Returns (hits,
    tokens hit, table or None)."""
    computed, num_cached = kv.get_computed_blocks(request)
    num_new = request.num_tokens - num_cached
    table = kv.allocate_slots(request, num_new, computed)
    if table is not None:
        request.num_computed_tokens = num_cached
    return computed, num_cached, table


def extend(kv: KVCacheManager, request: Request, num_new: int):
    """What the scheduler does for a running request: slots for `num_new` more tokens (and names
    for the blocks they fill). Returns the table, or None."""
    return kv.allocate_slots(request, num_new)


def chain(token_ids: list[int], block_size: int) -> list[bytes]:
    """The names of the full blocks of `token_ids`, computed here from `hash_block_tokens`."""
    names, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tuple(token_ids[start : start + block_size]))
        names.append(parent)
    return names


# ---------------------------------------------------------------------------------------------
# tests/v1/core/test_prefix_caching.py


def test_prefill_hits_the_common_prefix_and_frees_tail_first():
    """vLLM's `test_prefill`: 10 blocks of 16, three requests sharing 3 full blocks, then one
    that needs the whole pool: the free queue's order is the eviction order."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    pool = kv.pool

    # Request 0: 3 full blocks and 7 tokens; nothing cached.
    req0 = make_request("0", COMMON + [3] * 7)
    computed, num_cached, table = admit(kv, req0)
    assert computed == [] and num_cached == 0
    assert len(kv.req_hashes["0"]) == 3
    assert block_ids(table) == vllm_ids(1, 2, 3, 4)
    for block, name in zip(table[:3], chain(COMMON, 16), strict=True):
        assert block.block_hash == name and block.ref_cnt == 1
        assert pool.get_cached_block(name) is block
    assert table[3].block_hash is None and table[3].ref_cnt == 1  # the partial block

    # Request 1 hits the 3 blocks while request 0 still holds them.
    req1 = make_request("1", COMMON + [3] * 5)
    computed, num_cached, table = admit(kv, req1)
    assert len(kv.req_hashes["1"]) == 3
    assert block_ids(computed) == vllm_ids(1, 2, 3) and num_cached == 3 * 16
    assert block_ids(table[3:]) == vllm_ids(5)  # 53 - 48 tokens: one new block
    assert [block.ref_cnt for block in computed] == [2, 2, 2]
    assert pool.num_free_blocks == 5

    kv.free(req0)
    kv.free(req1)
    assert pool.num_free_blocks == 10
    # Never used, then request 0's tail, request 1's tail, then the common blocks, last first.
    assert free_order(pool) == vllm_ids(6, 7, 8, 9, 10, 4, 5, 3, 2, 1)

    # Request 2 hits the 3 blocks while they are free: they leave the queue.
    req2 = make_request("2", COMMON + [3] * 6)
    computed, num_cached, table = admit(kv, req2)
    assert len(kv.req_hashes["2"]) == 3
    assert block_ids(computed) == vllm_ids(1, 2, 3) and num_cached == 3 * 16
    assert block_ids(table[3:]) == vllm_ids(6)
    assert pool.num_free_blocks == 6
    assert all(pool.blocks[i].ref_cnt == 0 for i in pool.free_queue)
    kv.free(req2)

    # Request 3 needs every block: the eviction order is the free queue's.
    req3 = make_request("3", [99] * (16 * 10))
    computed, num_cached, table = admit(kv, req3)
    assert computed == [] and num_cached == 0
    assert block_ids(table) == vllm_ids(7, 8, 9, 10, 4, 5, 6, 3, 2, 1)
    assert pool.num_free_blocks == 0 and free_order(pool) == []
    # The evicted blocks lost their names; request 3's own 10 blocks are all that is named.
    assert sorted(b.block_id for b in pool.cached.values()) == list(range(10))
    assert set(pool.cached) == set(chain([99] * 160, 16))


def test_decode_grows_the_table_one_block_at_a_time():
    """vLLM's `test_decode`: 4 output tokens fit the last block; 19 more need exactly one new
    block, and the block they fill is named."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    req0 = make_request("0", COMMON + [3] * 7)
    computed, num_cached, table = admit(kv, req0)
    assert computed == [] and num_cached == 0
    assert block_ids(table) == vllm_ids(1, 2, 3, 4)

    req0.num_computed_tokens = 55
    req0.output_token_ids += [8] * 4  # 59 tokens: still 4 blocks
    table = extend(kv, req0, 4)
    assert table is not None and block_ids(table) == vllm_ids(1, 2, 3, 4)
    assert table[-1].block_hash is None  # 11 of 16 tokens

    req0.num_computed_tokens = 59
    req0.output_token_ids += [7] * (9 + 10)  # 9 fill block 4, 10 go into a new one
    table = extend(kv, req0, 19)
    assert table is not None and len(table) == 5
    # The output tokens are part of the name: 7 prompt tokens, 4 eights, 5 sevens.
    assert table[-2].block_hash == hash_block_tokens(
        table[-3].block_hash, tuple([3] * 7 + [8] * 4 + [7] * 5)
    )
    assert table[-1].block_hash is None


def test_evict_least_recently_freed_and_a_prefix_hit_skips_the_queue():
    """vLLM's `test_evict`: two requests (6 and 3 blocks) freed tail first; a hit on the first
    two blocks takes them out of the queue and the new block comes from its head."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    pool = kv.pool
    last = 5 * 16 + 7
    req0 = make_request("0", list(range(last)))
    computed, num_cached, table = admit(kv, req0)
    assert computed == [] and num_cached == 0 and len(table) == 6  # 5 full and 1 partial
    req1 = make_request("1", list(range(last, last + 3 * 16)))
    computed, num_cached, table = admit(kv, req1)
    assert computed == [] and num_cached == 0 and len(table) == 3
    assert pool.num_free_blocks == 1  # 10 - (6 + 3)

    kv.free(req0)
    kv.free(req1)
    assert pool.num_free_blocks == 10
    assert free_order(pool) == vllm_ids(10, 6, 5, 4, 3, 2, 1, 9, 8, 7)

    req2 = make_request("2", list(range(2 * 16 + 3)))
    computed, num_cached, table = admit(kv, req2)
    assert block_ids(computed) == vllm_ids(1, 2) and num_cached == 2 * 16
    assert block_ids(table[2:]) == vllm_ids(10)
    assert pool.num_free_blocks == 7


def test_a_reused_block_loses_its_old_name():
    """vLLM's `test_hash_block_correct_reuse`: one usable block, named by a full request, then
    handed to a 15-token request: it must not keep the old name."""
    kv = KVCacheManager(num_blocks=1, block_size=16)  # vLLM: 2, one of them its null block
    req = make_request("0", list(range(16)))
    computed, num_cached, table = admit(kv, req)
    assert computed == [] and num_cached == 0 and len(table) == 1
    assert table[0].block_hash is not None
    kv.free(req)

    req = make_request("1", list(range(15)))
    computed, num_cached, table = admit(kv, req)
    assert computed == [] and num_cached == 0 and len(table) == 1
    assert kv.pool.blocks[table[0].block_id].block_hash is None
    assert kv.pool.cached == {}


def test_a_hit_block_is_not_evicted_for_its_own_request():
    """vLLM's `test_computed_blocks_not_evicted`: two free named blocks, the older one a hit:
    the request's new block must be the other one, not its own hit."""
    kv = KVCacheManager(num_blocks=2, block_size=16)  # vLLM: 3, one of them its null block
    req0 = make_request("0", list(range(16)))
    _, _, table = admit(kv, req0)
    assert block_ids(table) == vllm_ids(1)
    req1 = make_request("1", list(range(16, 32)))
    _, _, table = admit(kv, req1)
    assert block_ids(table) == vllm_ids(2)
    kv.free(req0)
    kv.free(req1)

    req2 = make_request("2", list(range(32)))
    computed, num_cached, table = admit(kv, req2)
    assert block_ids(computed) == vllm_ids(1) and num_cached == 16
    assert block_ids(table[1:]) == vllm_ids(2)
    assert table[0].ref_cnt == 1 and table[0].block_hash is not None


def test_nothing_is_shared_with_prefix_caching_off():
    """vLLM's `test_basic_prefix_caching_disabled`: blocks of 4, 4 usable blocks; no hits, no
    names, and a third request that does not fit gets None."""
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    req1 = make_request("1", list(range(10)))  # 2 full blocks and 2 tokens
    computed, num_cached, table = admit(kv, req1)
    assert computed == [] and num_cached == 0 and len(table) == 3
    kv.free(req1)

    req2 = make_request("2", list(range(16)))  # shares req1's first 2 blocks' tokens
    computed, num_cached, table = admit(kv, req2)
    assert computed == [] and num_cached == 0 and len(table) == 4

    req3 = make_request("3", list(range(4)))
    computed, num_cached, table = admit(kv, req3)
    assert computed == [] and num_cached == 0
    assert table is None
    assert kv.pool.cached == {} and all(b.block_hash is None for b in kv.pool.blocks)


def test_cache_blocks_names_each_full_block_once():
    """vLLM's `test_cache_blocks` (there `BlockPool.cache_full_blocks`; here the manager's
    `cache_blocks`, which `allocate_slots` calls): 14 tokens in blocks of 4, allocated 8, 4 and
    2 at a time. Two full blocks are named, then a third without renaming the first two; the
    partial fourth never is."""
    kv = KVCacheManager(num_blocks=5, block_size=4)
    req = make_request("0", list(range(14)))
    names = chain(list(range(14)), 4)

    table = kv.allocate_slots(req, 8)
    assert len(kv.pool.cached) == 2
    assert [block.block_hash for block in table] == [names[0], names[1]]

    req.num_computed_tokens = 8
    table = kv.allocate_slots(req, 4)  # blocks that do not start at the request's first
    assert len(kv.pool.cached) == 3
    assert [block.block_hash for block in table] == names

    req.num_computed_tokens = 12
    table = kv.allocate_slots(req, 2)  # the fourth block holds 2 tokens
    kv.cache_blocks(req, 14)  # naming again changes nothing
    assert len(kv.pool.cached) == 3 and [block.block_hash for block in table] == [*names, None]


def test_a_failed_allocation_leaves_the_hit_blocks_untouched():
    """vLLM's `test_prefill_not_enough_free_blocks_with_computed_blocks`: request 3 hits 6
    blocks, 3 of them free, and needs 3 more; 5 blocks are free, but 3 of those are its own hits,
    so it does not fit, and its hits' counts and the queue must not change."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    pool = kv.pool
    req0 = make_request("0", COMMON)
    computed, num_cached, _ = admit(kv, req0)
    assert computed == [] and num_cached == 0
    part0 = kv.blocks_of(req0)

    req1 = make_request("1", COMMON * 2)
    computed, num_cached, _ = admit(kv, req1)
    assert computed == part0 and num_cached == 3 * 16
    part1 = kv.blocks_of(req1)
    kv.free(req1)
    assert {block.ref_cnt for block in part1[:3]} == {1}
    assert {block.ref_cnt for block in part1[3:]} == {0}

    req2 = make_request("2", [7] * 16 * 2)
    computed, num_cached, _ = admit(kv, req2)
    assert computed == [] and num_cached == 0

    assert pool.num_free_blocks == 5
    queue = free_order(pool)
    req3 = make_request("3", COMMON * 3)
    computed, num_cached = kv.get_computed_blocks(req3)
    assert computed == part1 and num_cached == 6 * 16
    assert kv.allocate_slots(req3, 48, computed) is None
    assert {block.ref_cnt for block in part1[:3]} == {1}
    assert {block.ref_cnt for block in part1[3:]} == {0}
    assert free_order(pool) == queue and req3.block_ids == []
    assert all(pool.get_cached_block(b.block_hash) is b for b in part1), "no hit was evicted"


def test_a_copy_of_a_named_prefix_stays_unnamed():
    """vLLM's `test_prefill_plp`, its duplicate blocks: request 2 does not take the cache's
    hits (in vLLM because it wants prompt logprobs) and writes the same 3 full blocks into other
    blocks. vLLM gives the copies the same names; the course keeps request 0's and leaves the
    copies unnamed, to be freed and evicted as any other block."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    pool = kv.pool
    req0 = make_request("0", COMMON + [3] * 7)
    _, _, table0 = admit(kv, req0)
    assert block_ids(table0) == vllm_ids(1, 2, 3, 4)
    names = chain(COMMON, 16)
    assert [block.block_hash for block in table0[:3]] == names

    req2 = make_request("2", COMMON + [3] * 6)
    table2 = kv.allocate_slots(req2, 54)  # no hits passed
    kv.cache_blocks(req2, 54)
    assert block_ids(table2) == vllm_ids(5, 6, 7, 8)  # vLLM: different ids, and != [1, 2, 3, 4]
    assert [block.block_hash for block in table2] == [None] * 4
    assert all(block.ref_cnt == 1 for block in table0 + table2)

    kv.free(req2)  # the copies are evicted first; the names stay with request 0's blocks
    pool.get_new_blocks(pool.num_free_blocks)
    assert all(pool.get_cached_block(n) is b for n, b in zip(names, table0, strict=False))


def test_reset_prefix_cache_refuses_while_blocks_are_held():
    """vLLM's `test_reset_prefix_cache`: two requests sharing 3 named blocks. The reset refuses
    (False) while they hold blocks, names kept; once both are freed it forgets every name."""
    kv = KVCacheManager(num_blocks=10, block_size=16)
    pool = kv.pool
    req0 = make_request("0", COMMON + [3] * 7)
    _, _, table = admit(kv, req0)
    assert block_ids(table) == vllm_ids(1, 2, 3, 4)
    req1 = make_request("1", COMMON + [4] * 7)
    computed, _, table = admit(kv, req1)
    assert len(kv.req_hashes["1"]) == 3 and len(computed) == 3
    assert block_ids(table[3:]) == vllm_ids(5)

    named = dict(pool.cached)
    assert not pool.reset_prefix_cache()
    assert pool.cached == named

    kv.free(req0)
    kv.free(req1)
    assert pool.reset_prefix_cache()
    assert pool.cached == {}
    assert all(block.block_hash is None for block in pool.blocks)
    assert pool.num_free_blocks == 10


def test_the_last_block_of_a_whole_block_prompt_is_never_a_hit():
    """The non-EAGLE count that vLLM's `test_eagle_enabled_removes_last_block` and
    `test_eagle_with_partial_blocks` start from: a cached prompt of 3 whole blocks hits 2 (its
    last token must be computed for its logits), one of 2 blocks and 5 tokens hits 2. (EAGLE
    then drops one more block: no counterpart.)"""
    for num_tokens, hits in [(3 * 16, 2), (2 * 16 + 5, 2)]:
        kv = KVCacheManager(num_blocks=10, block_size=16)
        req = make_request("prime", [0] * num_tokens)
        admit(kv, req)
        kv.free(req)
        computed, num_cached = kv.get_computed_blocks(make_request("again", [0] * num_tokens))
        assert len(computed) == hits and num_cached == hits * 16, num_tokens


# ---------------------------------------------------------------------------------------------
# tests/v1/core/test_kv_cache_utils.py


def test_kv_cache_block_counts_and_name():
    """vLLM's `test_kv_cache_block`: a new block is free and unnamed; the pool counts its
    holders, names it, and clears the name when the block is handed out again."""
    block = KVCacheBlock(block_id=0)
    assert (block.block_id, block.ref_cnt, block.block_hash) == (0, 0, None)
    pool = BlockPool(num_blocks=1)
    (block,) = pool.get_new_blocks(1)
    assert block.ref_cnt == 1
    name = hash_block_tokens(None, (1, 2, 3))
    pool.cache_full_block(block, name)
    assert block.block_hash == name
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and block.block_hash == name  # free, still named
    pool.get_new_blocks(1)
    assert block.block_hash is None  # vLLM's reset_hash


def test_free_queue_pop_remove_append():
    """vLLM's `test_free_kv_cache_block_queue_initialization`, `..._operations` and
    `..._get_all_free_blocks`, on 5 blocks: pop the head, remove one from the middle (a cache
    hit on a free block), append it back (freed), pop until empty, then one more."""
    pool = BlockPool(num_blocks=1)
    assert free_order(pool) == [0] and pool.num_free_blocks == 1

    pool = BlockPool(num_blocks=5)
    blocks = pool.blocks
    assert free_order(pool) == [0, 1, 2, 3, 4] and pool.num_free_blocks == 5
    assert pool.get_new_blocks(1) == [blocks[0]]
    assert free_order(pool) == [1, 2, 3, 4]
    pool.touch([blocks[2]])
    assert free_order(pool) == [1, 3, 4] and pool.num_free_blocks == 3
    pool.free_blocks([blocks[2]])
    assert free_order(pool) == [1, 3, 4, 2] and pool.num_free_blocks == 4
    assert block_ids(pool.get_new_blocks(4)) == [1, 3, 4, 2]
    assert pool.num_free_blocks == 0 and free_order(pool) == []
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)


def test_free_queue_appends_in_the_order_given():
    """vLLM's `test_free_kv_cache_block_queue_append_n`: append none, b0, then b4 b5, then
    b1 b2 b3: the queue reads b0 b4 b5 b1 b2 b3."""
    pool = BlockPool(num_blocks=6)
    blocks = pool.get_new_blocks(6)
    pool.free_blocks([])
    assert free_order(pool) == []
    pool.free_blocks(blocks[0:1])
    assert free_order(pool) == [0]
    pool.free_blocks(blocks[4:6])
    assert free_order(pool) == [0, 4, 5]
    pool.free_blocks(blocks[1:4])
    assert free_order(pool) == [0, 4, 5, 1, 2, 3] and pool.num_free_blocks == 6


def test_free_queue_pops_n_from_the_head():
    """vLLM's `test_free_kv_cache_block_queue_popleft_n`: a queue b1 b3 b5 b4 b0 b2; pop 0,
    then 1, 2 and 3 blocks: each pop takes the head, in order, and each block comes out held."""
    pool = BlockPool(num_blocks=6)
    blocks = pool.get_new_blocks(6)
    pool.free_blocks([blocks[i] for i in (1, 3, 5, 4, 0, 2)])
    assert free_order(pool) == [1, 3, 5, 4, 0, 2]
    assert pool.get_new_blocks(0) == [] and pool.num_free_blocks == 6
    for n, want in [(1, [1]), (2, [3, 5]), (3, [4, 0, 2])]:
        got = pool.get_new_blocks(n)
        assert block_ids(got) == want
        assert all(block.ref_cnt == 1 and block.block_id not in pool.free_queue for block in got)
    assert pool.num_free_blocks == 0


def test_hash_block_tokens_depends_on_parent_and_tokens():
    """vLLM's `test_hash_block_tokens` (parent b"123", tokens (1, 2, 3)): vLLM compares with its
    hash function of (parent, tokens, extra keys). The course has no extra keys and does not fix
    its byte encoding, so the port checks what the name must depend on."""
    parent, tokens = b"123", (1, 2, 3)
    name = hash_block_tokens(parent, tokens)
    assert isinstance(name, bytes) and len(name) == 32  # a SHA-256 digest
    assert hash_block_tokens(parent, tokens) == name
    assert hash_block_tokens(b"124", tokens) != name
    assert hash_block_tokens(None, tokens) != name
    assert hash_block_tokens(parent, (1, 3, 2)) != name
    assert hash_block_tokens(parent, (1, 2)) != name
    assert hash_block_tokens(None, (1, 23)) != hash_block_tokens(None, (12, 3))


def test_a_requests_block_names_chain():
    """vLLM's `test_hash_request_tokens_no_mm_inputs`: 6 tokens in blocks of 3 give two names,
    the second with the first as its parent; a partial block has none."""
    kv = KVCacheManager(num_blocks=4, block_size=3)
    request = make_request("0", list(range(6)))
    names = kv.block_hashes(request, 6)
    assert len(names) == 2
    assert names[0] == hash_block_tokens(None, (0, 1, 2))
    assert names[1] == hash_block_tokens(names[0], (3, 4, 5))
    request.output_token_ids.append(6)
    assert kv.block_hashes(request, 7) == names


# ---------------------------------------------------------------------------------------------
# tests/v1/core/test_scheduler.py (create_scheduler's defaults: 16 seats, 8192 tokens a step,
# blocks of 16, 10000 blocks; create_requests: request i's prompt is [i] * 10)


def make_scheduler(
    num_blocks=10000, block_size=16, budget=8192, seats=16, caching=True
) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, block_size, caching), budget, seats)


def make_requests(n: int, num_tokens: int = 10, ids: list[str] | None = None) -> list[Request]:
    ids = ids or [str(i) for i in range(n)]
    return [make_request(ids[i], [i] * num_tokens) for i in range(n)]


def run_step(scheduler: Scheduler, out, token: int = 0) -> None:
    """The engine's side of a step, without a model: the scheduled tokens are computed, and a
    request that reached its end gets `token`."""
    for request, num_new in out.scheduled:
        request.num_computed_tokens += num_new
        if request.num_computed_tokens == request.num_tokens:
            request.output_token_ids.append(token)


def test_add_and_abort_requests():
    """vLLM's `test_add_requests` and `test_finish_request` (aborted): 10 requests queue in
    order and leave the queue one by one; an aborted running request gives its blocks back."""
    scheduler = make_scheduler()
    requests = make_requests(10)
    for i, request in enumerate(requests):
        scheduler.add_request(request)
        assert len(scheduler.waiting) == i + 1
    for i, request in enumerate(requests):
        scheduler.finish(request, "abort")
        assert request not in scheduler.waiting and len(scheduler.waiting) == 9 - i

    scheduler.add_request(requests[0])
    scheduler.schedule()
    assert scheduler.running == [requests[0]] and scheduler.kv.pool.num_free_blocks == 9999
    scheduler.finish(requests[0], "abort")
    assert scheduler.running == [] and scheduler.kv.pool.num_free_blocks == 10000


@pytest.mark.parametrize("caching", [False, True])
def test_schedule_admits_every_prompt_in_order(caching):
    """vLLM's `test_schedule` (its prompt-logprobs variant without the logprobs): 10 prompts of
    10 tokens are all scheduled whole in the first step, and run in arrival order."""
    scheduler = make_scheduler(caching=caching)
    requests = make_requests(10)
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [request for request, _ in out.scheduled] == requests
    assert all(num_new == len(r.prompt_token_ids) for r, num_new in out.scheduled)
    assert len(scheduler.waiting) == 0 and scheduler.running == requests
    assert all(request.status == RequestStatus.RUNNING for request in requests)


@pytest.mark.parametrize("caching", [False, True])
def test_schedule_a_second_request_beside_a_decoding_one(caching):
    """vLLM's `test_schedule_concurrent_batches` (2 seats, 1024 tokens, prompts of 512). vLLM
    schedules the second prompt while the first step is still in flight; the course has one
    step in flight, so its second step decodes request 0 beside request 1's prompt. A third
    request waits for a seat."""
    scheduler = make_scheduler(budget=1024, seats=2, caching=caching)
    req0, req1, req2 = make_requests(3, num_tokens=512)
    scheduler.add_request(req0)
    out = scheduler.schedule()
    assert out.scheduled == [(req0, 512)]
    run_step(scheduler, out)

    scheduler.add_request(req1)
    scheduler.add_request(req2)
    out = scheduler.schedule()
    assert out.scheduled == [(req0, 1), (req1, 512)]
    assert list(scheduler.waiting) == [req2]  # max_num_seqs = 2


@pytest.mark.parametrize("num_blocks", [10000, 60])
def test_schedule_order_first_come_first_served(num_blocks):
    """vLLM's `test_schedule_order`: 3 seats, 1024 tokens a step; two prompts of 800, then two
    of 10. Its chunked case (the course always chunks): the first step schedules the two long
    ones, 800 and the budget's last 224. Its unchunked case, where vLLM schedules only the first
    and no short prompt overtakes the second: the course's counterpart is a pool (60 blocks of
    16) that cannot hold the second one's chunk (14 blocks, 10 free). The short prompts would
    fit, in budget and in blocks, and still wait."""
    scheduler = make_scheduler(num_blocks=num_blocks, budget=1024, seats=3)
    requests = make_requests(2, 800, ids=["1", "2"]) + make_requests(2, 10, ids=["3", "4"])
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    if num_blocks == 10000:
        assert out.scheduled == [(requests[0], 800), (requests[1], 224)]
        assert list(scheduler.waiting) == requests[2:]
    else:
        assert out.scheduled == [(requests[0], 800)]
        assert list(scheduler.waiting) == requests[1:]
        assert scheduler.kv.pool.num_free_blocks == 10


def test_preempt_the_newest_when_the_pool_is_full():
    """vLLM's `test_preempt_during_execution`: 10 usable blocks of 16, prefix caching off, two
    prompts of 80 tokens (5 blocks each). When request 0 needs a sixth block, request 1 (the
    newest) is preempted: its blocks go back, it waits at the queue's head and keeps its sampled
    token. vLLM gets there with 100 tokens a step and a second schedule() before the first
    step's output; the course admits both in one step of 160."""
    scheduler = make_scheduler(num_blocks=10, budget=160, caching=False)
    req0, req1 = make_requests(2, num_tokens=80)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    out = scheduler.schedule()
    assert out.scheduled == [(req0, 80), (req1, 80)]
    assert len(req0.block_ids) == 5 and len(req1.block_ids) == 5
    run_step(scheduler, out, token=42)

    out = scheduler.schedule()
    assert out.preempted == [req1] and out.scheduled == [(req0, 1)]
    assert scheduler.running == [req0] and list(scheduler.waiting) == [req1]
    assert req1.status == RequestStatus.WAITING and req1.num_preemptions == 1
    assert req1.block_ids == [] and req1.num_computed_tokens == 0
    assert req1.output_token_ids == [42]
    assert len(req0.block_ids) == 6 and scheduler.kv.pool.num_free_blocks == 4
