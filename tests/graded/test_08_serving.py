"""Chapter 8: many requests at once, graded against HF GPT-2's logits and greedy `generate` on
each prompt alone, attention computed position by position in float64, chapter 3's sampler
(graded against HF) and exact probabilities, exact counts of the positions a prefix cache
saves, and the contract of vLLM's `BlockPool` (its own tests are ported in tests/peers/).
"""

from __future__ import annotations

import linecache
import random

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._oracles import N_SAMPLES
from tests.support import (
    PROMPTS,
    assert_samples_follow,
    greedy_difference,
    invariant_problems,
    run_to_end,
    scheduler_problems,
    uneven_chunks,
)

CHAPTER = "08_serving"


def greedy(impl, max_tokens: int = 12):
    return impl.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


# --------------------------------------------------------------------------- slots_of


def slot_by_definition(table: list[int], p: int, block_size: int) -> int:
    block, offset = table[p // block_size], p % block_size
    return block * block_size + offset


def slots_mistake(table, positions, block_size, got) -> str:
    if got == [table[p % block_size] * block_size + p // block_size for p in positions]:
        return " The block's index and the offset within it are swapped."
    if got == [table[p // block_size] + p % block_size for p in positions]:
        return (
            " A block id is not a slot: block b's first slot is b times the block size "
            "(its block_size slots come before the next block's)."
        )
    if got == list(positions):
        return " Those are the positions themselves: a position's slot goes through the table."
    if got == [table[p // block_size] * block_size + p for p in positions]:
        return (
            " Each slot is its block's first slot plus the whole position: the offset within "
            "the block is what is left of the position once its whole blocks are counted (its "
            "remainder by block_size)."
        )
    if len(got) > len(positions) and got == [
        slot_by_definition(table, p, block_size) for p in range(positions.stop)
    ]:
        return (
            f" Those are the slots of positions 0 to {positions.stop - 1}: the positions before "
            f"{positions.start} (computed already) were given slots too. Only the positions "
            "asked for get slots."
        )
    for end, entry in (("last", table[-1]), ("first", table[0])):
        if got == [entry * block_size + p % block_size for p in positions]:
            return (
                f" Every position went to the table's {end} block ({entry}): a position's "
                "block is the table's entry p // block_size, so positions that span several "
                "blocks go to several."
            )
    if positions.start and got == [slot_by_definition(table, p, block_size)
                                   for p in range(len(positions))]:  # fmt: skip
        return (
            f" Those are the slots of positions 0 to {len(positions) - 1}: the positions asked "
            f"for start at {positions.start} (iterate over `positions` itself)."
        )
    if got == [(p // block_size) * block_size + p % block_size for p in positions]:
        return " The table was not used: entry p // block_size of the table is the block's id."
    n = len(table)
    if n != block_size and got == [table[p // n] * block_size + p % n for p in positions]:
        return (
            f" The table's length ({n} entries) was used where the block size ({block_size}) "
            "belongs, for the entry and the offset: a block holds block_size positions, however "
            "many blocks the table has."
        )
    if n != block_size and got == [table[p // block_size] * n + p % block_size
                                   for p in positions]:  # fmt: skip
        return (
            f" Each block's first slot was its id times the table's length ({n}): the cache "
            f"holds block_size ({block_size}) slots per block, so block b starts at b times "
            "block_size, whatever the table's length."
        )
    if got == [table[p // block_size - 1] * block_size + p % block_size for p in positions]:
        return (
            " Every position got the block of the table entry before its own (position 0 got "
            "the table's last entry: index -1 wraps around in Python). Position p's block is "
            "entry p // block_size itself, counted from 0."
        )
    ordered = sorted(table)
    if ordered != table and got == [slot_by_definition(ordered, p, block_size)
                                     for p in positions]:  # fmt: skip
        return (
            f" Those are the slots through the table sorted ({ordered}): a table lists the "
            "request's blocks in the order of its positions, wherever they lie in the pool, so "
            "it is read as it is."
        )
    return slots_by_position(table, positions, block_size, got)


def overflow_mistake(impl, table, positions, block_size) -> str:
    """Why slots_of ran past the table's end, from its slots for the positions that stay inside
    the table under each hypothesis (the last position left out)."""
    inner = range(positions.start, positions.stop - 1)
    try:
        got = impl.slots_of(table, inner, block_size)
    except Exception:
        got = None
    if isinstance(got, list) and len(got) != len(inner):
        extra = len(got) - len(inner)
        past = range(inner.start, inner.stop + extra) if extra > 0 else None
        which = (
            (
                f"one is the slot of position {past.stop - 1}"
                if extra == 1
                else f"ones are the slots of positions {past.stop - extra} to {past.stop - 1}"
            )
            if past
            else ""
        )
        off = (
            f" The extra {which}, past the range's end: a range does not include its stop, "
            "and the positions are exactly the range given."
            if past and got == [slot_by_definition(table, p, block_size) for p in past]
            else ""
        )
        return (
            f" Asked for the {len(inner)} positions {inner.start} to {inner.stop - 1} (which stay "
            f"inside the table), {len(got)} slots came back: one slot per position is "
            f"expected.{off}"
        )
    if got == [slot_by_definition(table, p + 1, block_size) for p in inner]:
        return (
            " Each slot it gave is the slot of the NEXT position (p + 1): the positions were "
            "counted from 1, or shifted by one. The positions are the range given, each as it is."
        )
    return (
        " A position's block is the position divided by block_size, rounded DOWN (positions 0 "
        "to block_size - 1 are all in block 0)."
    )


def slots_by_position(table, positions, block_size, got) -> str:
    """Which positions went wrong, and whether their offset or their block is: the block
    taken one position early or late, the offset from another position."""
    if not isinstance(got, list) or len(got) != len(positions):
        n = len(got) if isinstance(got, list) else "?"
        want = [slot_by_definition(table, p, block_size) for p in positions]
        which = ""
        if isinstance(got, list) and got == want[: len(got)]:
            which = (
                f" They are the first {len(got)} positions' slots, right: the last "
                f"{len(want) - len(got)} position(s) have none. Does the loop stop short "
                "(positions[:-1], range(stop - 1))?"
            )
        elif isinstance(got, list) and got == want[len(want) - len(got) :]:
            which = f" They are the last {len(got)} positions' slots: the first have none."
        return (
            f" One slot per position was expected: {len(positions)} positions, {n} slots came "
            "back." + which
        )
    wrong = [(p, s) for p, s in zip(positions, got, strict=True)
             if s != slot_by_definition(table, p, block_size)]  # fmt: skip
    if not wrong:
        return ""
    shifts = {s - slot_by_definition(table, p, block_size) for p, s in wrong}
    if len(wrong) == len(got) and len(shifts) == 1:
        d = shifts.pop()
        return (
            f" Every slot is {abs(d)} {'more' if d > 0 else 'less'} than it should be: the "
            "block's first slot is block id times block_size, and the offset within the block "
            "counts from 0 (position p's offset is its remainder by block_size)."
        )
    if got == [table[0] * block_size + p for p in positions]:
        return (
            f" Wrong at positions {[p for p, _ in wrong]}: each slot is the first block's "
            "first slot plus the position, as if the request's blocks lay one after another "
            "in the cache from its first. They lie anywhere: a position's block is the table's "
            "entry at the position's block index (position // block_size), and its offset in "
            "that block is the remainder."
        )
    offsets_right = all(s % block_size == p % block_size for p, s in wrong)
    entries = [table.index(s // block_size) if s // block_size in table else None
               for _, s in wrong]  # fmt: skip
    ps = [p for p, _ in wrong]
    words = f" Wrong at positions {ps}; the others are right."
    if offsets_right and all(e is not None for e in entries):
        late = [(p // block_size + 1) % len(table) for p in ps]
        early = [(p // block_size - 1) % len(table) for p in ps]
        if entries == early and all(p % block_size == 0 for p in ps):
            return words + (
                " They are the positions that start a block, their offsets are right, and each "
                "got the block of the position before it (for position 0, the table's last "
                "entry): the block index is taken one position early. Which block a position "
                "is in depends on the position itself."
            )
        if entries == late and all(p % block_size == block_size - 1 for p in ps):
            return words + (
                " They are the last positions of their blocks, their offsets are right, and "
                "each got the next block: the block index is taken one position late."
            )
        return words + (
            f" Their offsets within the block are right, their blocks are not: table entries "
            f"{entries} where {[p // block_size for p in ps]} were expected."
        )
    if all(s - table[p // block_size] * block_size == p - p // block_size for p, s in wrong):
        return words + (
            " Each offset within its block is the position minus its block's INDEX (p - p // "
            "block_size), where it is the position minus the block's first position (the index "
            "times block_size): the remainder p % block_size."
        )
    return words + (
        " Their offsets within the block are "
        + ("right" if offsets_right else f"{[s % block_size for _, s in wrong]}, expected "
           f"{[p % block_size for p in ps]}") + "."
    )  # fmt: skip


@pytest.mark.slots_of
@pytest.mark.parametrize(
    "table, positions, block_size",
    [
        ([7, 2, 9, 4, 11], range(0, 20), 4),
        ([5, 0, 3, 1], range(6, 12), 3),
        ([4, 8], range(1, 4), 2),
    ],
)
def test_each_position_goes_to_its_slot_through_the_table(impl, table, positions, block_size):
    try:
        got = impl.slots_of(table, positions, block_size)
    except IndexError as error:
        pytest.fail(
            f"block table {table} ({len(table)} entries), block_size {block_size}, positions "
            f"{list(positions)}: slots_of raised IndexError ({error}): a position's block index "
            f"went past the table's end. The table covers positions 0 to "
            f"{len(table) * block_size - 1}." + overflow_mistake(impl, table, positions, block_size)
        )
    want = [slot_by_definition(table, p, block_size) for p in positions]
    assert isinstance(got, list) and all(type(s) is int for s in got), (
        f"return the slots as a list of Python ints, got {type(got).__name__}"
        + (f" of {type(got[0]).__name__}" if isinstance(got, list) and got else "")
    )
    assert list(got) == want, (
        f"block table {table}, block_size {block_size}, positions {list(positions)}: slots "
        f"should be {want}, got {list(got)}." + slots_mistake(table, positions, block_size, got)
    )


# --------------------------------------------------------------------------- attend


def attention_by_hand(queries, keys, values, tables, query_pos):
    """Each query against its own request's positions 0..its own, in float64, one at a time."""
    G, Q, H, D = queries.shape
    block_size = keys.shape[1]
    out = torch.zeros(G, Q, H, D, dtype=torch.float64)
    for g in range(G):
        for q in range(Q):
            p_max = int(query_pos[g, q])
            k = torch.stack([keys[tables[g][p // block_size], p % block_size]
                             for p in range(p_max + 1)]).double()  # fmt: skip
            v = torch.stack([values[tables[g][p // block_size], p % block_size]
                             for p in range(p_max + 1)]).double()  # fmt: skip
            scores = torch.einsum("hd,phd->hp", queries[g, q].double(), k) / D**0.5
            out[g, q] = torch.einsum("hp,phd->hd", scores.softmax(-1), v)
    return out


def gathered_reshaped(queries, keys, values, tables, query_pos):
    """`attend` under one hypothesis: each request's [L, n_heads, d_head] keys and values
    reshaped, not transposed, to [n_heads, L, d_head]; in float64."""
    G, Q, H, D = queries.shape
    block_size = keys.shape[1]
    B = max(map(len, tables))
    out = torch.zeros(G, Q, H, D, dtype=torch.float64)
    for g in range(G):
        table = tables[g] + [0] * (B - len(tables[g]))
        k = keys[table].reshape(H, B * block_size, D).double()
        v = values[table].reshape(H, B * block_size, D).double()
        for q in range(Q):
            scores = torch.einsum("hd,hpd->hp", queries[g, q].double(), k) / D**0.5
            scores[:, int(query_pos[g, q]) + 1 :] = float("-inf")
            out[g, q] = torch.einsum("hp,hpd->hd", scores.softmax(-1), v)
    return out


def attend_case(seed: int, G: int, Q: int, num_blocks=16, block_size=4, H=4, D=8):
    """Random queries and a cache whose every slot holds something (large values where no
    position of any request is: a mask that lets them in shows); block tables out of order."""
    g = torch.Generator().manual_seed(seed)
    keys = 30 * torch.randn(num_blocks, block_size, H, D, generator=g)
    values = 30 * torch.randn(num_blocks, block_size, H, D, generator=g)
    order = torch.randperm(num_blocks - 1, generator=g).add(1).tolist()  # block 0: padding
    B = 3
    lengths = [B * block_size - 1 - 2 * i for i in range(G)]  # each ends inside its last block
    # Each request's blocks, as many as its length needs: a third request has 2, and its table
    # is padded with block 0 (whose large values it must not read).
    tables = [order[i * B : (i + 1) * B][: -(-n // block_size)] for i, n in enumerate(lengths)]
    query_pos = torch.tensor([[n - Q + q for q in range(Q)] for n in lengths])
    for t, n in zip(tables, lengths, strict=True):  # its own positions: ordinary values
        for p in range(n):
            keys[t[p // block_size], p % block_size] /= 30
            values[t[p // block_size], p % block_size] /= 30
    queries = torch.randn(G, Q, H, D, generator=g)
    return queries, keys, values, tables, query_pos


def attention_over_table(queries, keys, values, tables, scores_of, weights=False):
    """`attend` under one hypothesis about its mask: every slot of each request's padded table
    read, its scores [n_heads, Q, L] changed by `scores_of(scores, g)` (g: the request) before
    the softmax (`weights`: `scores_of` gives the weights itself); in float64."""
    G, Q, H, D = queries.shape
    block_size = keys.shape[1]
    B = max(map(len, tables))
    L = B * block_size
    out = torch.zeros(G, Q, H, D, dtype=torch.float64)
    for g in range(G):
        table = tables[g] + [0] * (B - len(tables[g]))
        k = keys[table].reshape(L, H, D).double()
        v = values[table].reshape(L, H, D).double()
        scores = torch.einsum("qhd,phd->hqp", queries[g].double(), k) / D**0.5
        w = scores_of(scores, g) if weights else scores_of(scores, g).softmax(-1)
        out[g] = torch.einsum("hqp,phd->qhd", w, v)
    return out


def mask_mistake(queries, keys, values, tables, query_pos, got) -> str:
    """The mask's known mistakes, each recognised by computing what it gives."""
    L = max(map(len, tables)) * keys.shape[1]
    Q = queries.shape[1]
    allowed = torch.arange(L)[None, None, :] <= query_pos[:, :, None]  # [G, Q, L]
    later = torch.arange(L)[None, None, :] >= query_pos[:, :, None]  # the comparison reversed
    causal = torch.ones(Q, L, dtype=torch.bool).tril()  # is_causal: query q reads keys 0..q
    hypotheses = [
        (lambda s, g: s, (
            " Every query read every slot of its table: the padding blocks, the unwritten rest "
            "of its last block and its later positions too. Is a mask passed at all, and does "
            "it compare each key's POSITION in its request (its block's place in the table "
            "times block_size, plus its offset in the block) with the query's? A key's offset "
            "in its block alone is never past the query's position.")),
        (lambda s, g: s.masked_fill(~causal, float("-inf")), (
            " That is `is_causal=True`: it lines the queries up with the first keys, so query q "
            "reads positions 0 to q (a decode reads position 0 alone), not up to its own "
            "position. Pass a mask built from each query's position instead.")),
        (lambda s, g: s + allowed[g].double(), (
            " The mask was added to the scores as numbers (1 where allowed, 0 elsewhere): a "
            "float mask is added, not obeyed, so every slot is read. The mask must be boolean "
            "(True where a query may read).")),
        (lambda s, g: s.masked_fill(~allowed[g], 0.0), (
            " The masked scores were set to 0, and exp(0) is 1: the masked slots still get "
            "weight. A masked score must be minus infinity, so that its weight is 0.")),
        (lambda s, g: s.masked_fill(~later[g], float("-inf")), (
            " Each query read its own position and those AFTER it, not those before: the "
            "mask's comparison is reversed (a key may be read when its position is at most the "
            "query's).")),
        (lambda s, g: (s * queries.shape[-1] ** 0.5).masked_fill(~allowed[g], float("-inf")), (
            " That is attention whose scores were not divided by sqrt(d_head): the right keys, "
            "a softmax too sharp. The scores are q . k / sqrt(d_head) (the attention function "
            "divides by it itself).")),
        (lambda s, g: s.softmax(-1).masked_fill(~allowed[g], 0.0), (
            " The mask was applied after the softmax (the probabilities of unreadable keys set "
            "to 0): the readable keys' weights then no longer sum to 1. Mask the scores, with "
            "minus infinity, before the softmax (the attention function does, given the "
            "mask).")),
    ]  # fmt: skip
    for k, (scores_of, message) in enumerate(hypotheses):
        weights = k == len(hypotheses) - 1  # the last gives the weights, after its softmax
        if torch.allclose(got.double(), attention_over_table(
                queries, keys, values, tables, scores_of, weights), atol=1e-4):  # fmt: skip
            return message
    return ""


def attend_mistake(queries, keys, values, tables, query_pos, got) -> str:
    """Recognise a known mistake by recomputing under its hypothesis."""
    G, Q, H, D = queries.shape
    if got.shape != queries.shape:
        if Q != H and got.shape[1:3] == (H, H):
            return (
                f" The result has {H} entries on both its second and third axes, n_heads where "
                f"the queries ({Q}) belong: the queries went into the attention function in "
                "their own order, [G, Q, n_heads, d_head], so it took their heads axis for "
                "their positions. Queries go heads first too, [G, n_heads, Q, d_head], like "
                "the keys and values."
            )
        B = max(map(len, tables))
        if G != B and got.shape[0] == B:
            return (
                f" The result has {B} rows, the block tables' width (B, the blocks of each "
                f"request), where the {G} requests (G) belong: is the tables' shape read as "
                "[B, G] instead of [G, B]?"
            )
        return (
            f" The result should have the queries' shape {tuple(queries.shape)} "
            f"([G, Q, n_heads, d_head]), got {tuple(got.shape)}."
        )
    if got.isnan().all():
        return (
            " Every value is NaN: a softmax over scores that are all minus infinity gives NaN. "
            "Is the softmax taken over the keys' axis (the last)? Over the queries' axis, a "
            "decode's one query is alone in its softmax, masked or not."
        )
    swapped = [
        (keys, keys, "reads the KEYS as values (were the values gathered from the keys' cache?)"),
        (values, values, "reads the VALUES as keys (were the keys gathered from the values' "
                         "cache?)"),
        (values, keys, "reads the keys' and values' caches swapped"),
    ]  # fmt: skip
    for as_keys, as_values, how in swapped:
        if torch.allclose(got.double(), attention_by_hand(queries, as_keys, as_values, tables,
                                                          query_pos), atol=1e-4):  # fmt: skip
            return (
                f" Your output is what attention gives when it {how}: the mask and the "
                "positions are right; the scores come from the keys' cache and the weighted sum "
                "from the values' cache."
            )
    strict = attention_by_hand(queries, keys, values, tables, query_pos - 1)
    if torch.allclose(got.double(), strict, atol=1e-4):
        return (
            " Each query read only the positions before its own position: is the mask `<` where "
            "it must be `<=`, or are the key positions counted from 1 rather than from 0?"
        )
    B = max(map(len, tables))
    padded = [t + [0] * (B - len(t)) for t in tables]  # as the block tables reach attend
    if int(query_pos.max()) + 1 < B * keys.shape[1] and torch.allclose(
        got.double(), attention_by_hand(queries, keys, values, padded, query_pos + 1), atol=1e-4
    ):
        return (
            " Each query also read the position just after its own (a slot not written yet, or "
            "the next token of its chunk): the mask lets a key through when its position is at "
            "most the query's own, not one more."
        )
    mistake = mask_mistake(queries, keys, values, tables, query_pos, got)
    if mistake:
        return mistake
    first = query_pos[:, :1].expand_as(query_pos)
    if Q > 1 and torch.allclose(got.double(), attention_by_hand(queries, keys, values, tables,
                                                                first), atol=1e-4):  # fmt: skip
        return (
            " Every query read up to the FIRST query's position: a chunk's later queries missed "
            "the positions after it. The mask compares each key's position with each query's "
            "own (query_pos[g, q] for query q)."
        )
    from_first = query_pos[:1].expand_as(query_pos)
    first_mask = attention_by_hand(queries, keys, values, padded, from_first)
    if G > 1 and torch.allclose(got.double(), first_mask, atol=1e-4):
        return (
            " Every request read the positions the FIRST request's queries may read: the mask "
            "was made from query_pos[0] and used for all. Each request's mask compares its "
            "keys' positions with its own queries' positions, query_pos[g]."
        )
    last = query_pos[:, -1:].expand_as(query_pos)
    if torch.allclose(got.double(), attention_by_hand(queries, keys, values, tables, last),
                      atol=1e-4):  # fmt: skip
        return (
            " Every query read every position written so far: a chunk's early queries read its "
            "later tokens. The mask must compare each key's position with each query's own."
        )
    want = attention_by_hand(queries, keys, values, tables, query_pos)
    if torch.allclose(got.double(), want.transpose(1, 2).reshape(G, Q, H, D), atol=1e-4):
        return (
            " The numbers are right and in the wrong places: the result, heads first, was "
            "reshaped (or viewed) into [G, Q, n_heads, d_head]. A reshape keeps the memory's "
            "order; moving an axis takes a transpose."
        )
    if torch.allclose(got.double(), gathered_reshaped(queries, keys, values, tables, query_pos),
                      atol=1e-4):  # fmt: skip
        return (
            " The gathered keys and values, [G, positions, n_heads, d_head], were reshaped (or "
            "viewed) heads first: that mixes heads and positions. Moving the heads axis before "
            "the positions takes a transpose."
        )
    B = max(map(len, tables))
    sorted_tables = [sorted(t + [0] * (B - len(t))) for t in tables]  # the padded table sorted
    if torch.allclose(got.double(), attention_by_hand(queries, keys, values, sorted_tables,
                                                      query_pos), atol=1e-4):  # fmt: skip
        return " The blocks were read in sorted order: read them in the table's order."
    L = B * keys.shape[1]
    allowed = torch.arange(L)[None, :] <= query_pos[:, :, None]  # [G, Q, L]
    offsets_first = torch.zeros(G, Q, H, D, dtype=torch.float64)
    for g in range(G):  # the gathered [B, block_size] axes merged offsets first
        table = tables[g] + [0] * (B - len(tables[g]))
        k, v = (c[table].transpose(0, 1).reshape(L, H, D).double() for c in (keys, values))
        scores = torch.einsum("qhd,phd->hqp", queries[g].double(), k) / D**0.5
        weights = scores.masked_fill(~allowed[g][None], float("-inf")).softmax(-1)
        offsets_first[g] = torch.einsum("hqp,phd->qhd", weights, v)
    if B > 1 and torch.allclose(got.double(), offsets_first, atol=1e-4):
        return (
            " The gathered keys and values run offsets first: every block's first slot, then "
            "every block's second, and so on, where a request's text runs through its first "
            "block, then its second. The blocks' axis and the offsets' axis were swapped (a "
            "permute or transpose) before the two were merged into one axis of positions: "
            "blocks outer, offsets inner."
        )
    padded = torch.tensor([t + [0] * (B - len(t)) for t in tables])
    if G > 1 and torch.allclose(got.double(), attention_by_hand(
            queries, keys, values, [padded[0].tolist()] * G, query_pos), atol=1e-4):  # fmt: skip
        return (
            " Every request read its keys through the FIRST request's table: request g reads "
            "through row g of block_tables (the gather is for all G requests at once)."
        )
    columns = padded.t().reshape(G, B).tolist()
    if G > 1 and torch.allclose(got.double(), attention_by_hand(
            queries, keys, values, columns, query_pos), atol=1e-4):  # fmt: skip
        return (
            " The block tables were read column by column (block_tables transposed before it "
            "was flattened): request g's blocks are row g of block_tables, in order."
        )
    return ""


def where_it_goes_wrong(impl, queries, keys, values, tables, query_pos) -> str:
    """Two general probes when no known mistake fits: `attend` on each request alone, with its
    own table, then with its blocks moved to slots 0, 1, 2, ... of a cache of their own. Right
    alone and wrong together: the requests mix. Right only once moved: the answer depends on
    where the blocks lie, which only the table should say."""
    G, B = queries.shape[0], max(map(len, tables))

    def alone(g: int, moved: bool) -> bool:
        table = list(range(len(tables[g]))) if moved else tables[g]
        k, v = keys, values
        if moved:  # the same blocks, in the table's order, from slot 0; the rest as it was
            k, v = keys.clone(), values.clone()
            k[: len(table)], v[: len(table)] = keys[tables[g]], values[tables[g]]
        # padded with the cache's last block: a pad reads as the latest positions, if at all
        padded = torch.tensor([table + [keys.shape[0] - 1] * (B - len(table))])
        try:
            got = impl.attend(queries[g : g + 1], k, v, padded, query_pos[g : g + 1])
        except Exception:  # noqa: BLE001 - a probe: a refusal only means "not this"
            return False
        want = attention_by_hand(queries[g : g + 1], k, v, [table], query_pos[g : g + 1])
        return got.shape == want.shape and torch.allclose(got.double(), want, atol=1e-4)

    if G > 1 and all(alone(g, moved=False) for g in range(G)):
        return (
            " Each request alone, with its own table, gets the right answer; together they do "
            "not: something mixes the requests (a table, a position or a mask read from "
            "another request's row, or an axis of G requests taken for another)."
        )
    if all(alone(g, moved=True) for g in range(G)) and not all(
        alone(g, moved=False) for g in range(G)
    ):
        return (
            " The answer is right when a request's blocks lie at slots 0, 1, 2, ... of the "
            "cache (its table is 0, 1, 2, ...) and wrong when the same blocks lie elsewhere: "
            "something uses where a block lies (its number in the cache) as if it were a "
            "position in the request. A key's position is its block's place IN THE TABLE "
            "times block_size, plus its offset in the block."
        )
    return ""


def raising_line(error: BaseException, function: str) -> str:
    """The line of the innermost frame of `function` in the error's traceback (the learner's
    own line, quoted as written), or ""."""
    line, tb = "", error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == function:
            line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        tb = tb.tb_next
    return line


def attend_error(error: str) -> str:
    """What PyTorch's refusal inside `attend` points to."""
    if "attn_mask dtype" in error:
        return (
            " The mask must be boolean (True: may read): a mask of integers is refused, and a "
            "float one would be added to the scores, not obeyed. A comparison gives booleans "
            "already."
        )
    if "is invalid for input of size" in error:
        return (
            " A view or reshape asked for a shape the gathered blocks do not have: they are G "
            "requests times B blocks times block_size positions (the cache's axis 1; its axis "
            "0 is num_blocks), times n_heads and d_head."
        )
    if "broadcast" in error:
        return (
            " The mask does not fit the scores, [G, n_heads, Q, L]: it is one row per query, "
            "over the L key positions, [G, Q, L] (queries before keys), with a heads axis of 1: "
            "[G, 1, Q, L]."
        )
    if "must match the size" in error:
        return (
            " The attention function wants queries, keys and values heads first, [G, n_heads, "
            "positions, d_head], and a mask it can broadcast over the heads: [G, 1, Q, L]."
        )
    return ""


@pytest.mark.attend
@pytest.mark.parametrize("G, Q", [(3, 1), (1, 5), (2, 3)])
def test_attention_reads_each_requests_own_positions_up_to_its_own(impl, G, Q):
    queries, keys, values, tables, query_pos = attend_case(seed=G * 10 + Q, G=G, Q=Q)
    B = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (B - len(t)) for t in tables])
    keys_before, values_before = keys.clone(), values.clone()
    try:
        got = impl.attend(queries, keys, values, block_tables, query_pos)
    except RuntimeError as error:  # a shape or dtype PyTorch refused
        said = attend_error(str(error))
        if not said:
            raise  # the grader quotes the learner's line that raised it
        line = raising_line(error, "attend")
        if line and "<" in line and "attn_mask" not in line and "scaled_dot" not in line:
            said = (
                " That line compares key positions with query positions: the comparison must "
                "broadcast to one row per query over the L key positions, [G, Q, L], so the "
                "queries' positions [G, Q] need a new LAST axis and the key positions [L] "
                "stay as they are."
            )
        where = f" at your line `{line}`" if line else ""
        error = str(error).rstrip(".")
        raise AssertionError(f"attend raised {error}{where}." + said) from None
    want = attention_by_hand(queries, keys_before, values_before, tables, query_pos)
    assert torch.equal(keys, keys_before) and torch.equal(values, values_before), (
        "attend must only read the cache, not change it"
    )
    ok = got.shape == want.shape and torch.allclose(got.double(), want, atol=1e-4)
    assert ok, (
        f"{G} request(s), {Q} queries each, positions {query_pos.tolist()}: the output differs "
        "from attention over each request's own positions, up to each query's own, read "
        "through its table. "
        + explain_difference(got.double(), want, ("request", "query", "head", "d_head"))
        + (
            attend_mistake(queries, keys, values, tables, query_pos, got)
            or where_it_goes_wrong(impl, queries, keys_before, values_before, tables, query_pos)
        )
    )


@pytest.mark.attend
def test_attend_in_bfloat16_returns_the_queries_dtype(impl):
    """A 16-bit model (chapter 7's, and the engine's in bfloat16) calls attend with bfloat16
    queries and cache: the output goes on in the queries' dtype, as PyTorch's attention's does."""
    queries, keys, values, tables, query_pos = attend_case(seed=7, G=2, Q=3)
    B = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (B - len(t)) for t in tables])
    q, k, v = (x.to(torch.bfloat16) for x in (queries, keys, values))
    got = impl.attend(q, k, v, block_tables, query_pos)
    want = attention_by_hand(q, k, v, tables, query_pos)
    close = got.shape == want.shape and torch.allclose(got.double(), want, atol=0.05, rtol=0.02)
    assert got.dtype == q.dtype, (
        f"attend was given bfloat16 queries, keys and values and returned {got.dtype}: the "
        "output must have the queries' dtype (the next layer adds it to a bfloat16 residual). "
        + (
            "Its numbers are right at bfloat16's precision; only the cast back is missing: was "
            "attention computed in float32 (the inputs made .float()) and the result not cast "
            "back to the queries' dtype?"
            if close
            else "Is a tensor made in another dtype, or the result not cast back?"
        )
    )
    assert torch.allclose(got.double(), want, atol=0.05, rtol=0.02), (
        "with bfloat16 queries, keys and values, attend's output is not attention at bfloat16's "
        "precision (within 0.05 + 2% of the float64 result). "
        + explain_difference(got.double(), want, ("request", "query", "head", "d_head"))
    )


@pytest.mark.attend
def test_attend_in_bfloat16_past_position_256(impl):
    """bfloat16 holds every integer up to 256 and only the even ones up to 512: a position
    made or compared in the queries' dtype is rounded there, and the mask lets a query read a
    key after its own. Every key scores alike here (keys of zeros), and the slots from position
    300 on hold large values, so that one key read too many moves the output far."""
    g = torch.Generator().manual_seed(11)
    block_size, H, D, Q = 16, 2, 8, 5
    table = torch.randperm(24, generator=g)[:20].tolist()  # 320 slots
    query_pos = torch.arange(297, 297 + Q)[None]
    queries = torch.randn(1, Q, H, D, generator=g)
    keys = torch.zeros(24, block_size, H, D)
    values = torch.randn(24, block_size, H, D, generator=g)
    for p in range(300, 20 * block_size):
        values[table[p // block_size], p % block_size] *= 100
    q, k, v = (x.to(torch.bfloat16) for x in (queries, keys, values))
    got = impl.attend(q, k, v, torch.tensor([table]), query_pos)
    want = attention_by_hand(q, k, v, [table], query_pos)
    assert got.shape == want.shape and torch.allclose(got.double(), want, atol=0.05, rtol=0.02), (
        f"bfloat16 queries at positions {query_pos[0].tolist()}: the output is not attention "
        "over each query's positions 0 to its own. "
        + explain_difference(got.double(), want, ("request", "query", "head", "d_head"), 0.05, 0.02)
        + " Past 256, bfloat16 holds only even integers: are the key positions made in (or "
        "moved to) the queries' dtype, `.to(queries)` taking its dtype with its device? "
        "Positions are integers: keep them int64, on the queries' device."
    )


@pytest.mark.attend
def test_attend_makes_its_tensors_on_the_queries_device(impl):
    """On a GPU, a tensor made inside `attend` without `device=` (the key positions, say) lands
    on the CPU beside queries on the GPU, and the mask that mixes them fails. PyTorch's `meta`
    device (shapes, no values) fails the same way here, with no GPU."""
    queries, keys, values, tables, query_pos = attend_case(seed=5, G=2, Q=3)
    B = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (B - len(t)) for t in tables])
    on_meta = [t.to("meta") for t in (queries, keys, values, block_tables, query_pos)]
    try:
        got = impl.attend(*on_meta)
    except RuntimeError as err:
        if "device" not in str(err):
            raise
        pytest.fail(
            "with every input on another device (PyTorch's meta device, standing in for a GPU), "
            f"attend raised: {str(err).splitlines()[0]} A tensor made without a device (the "
            "key positions' numbers, say) sits on the CPU: make each new tensor on the queries' "
            "device."
        )
    assert got.device.type == "meta" and got.shape == queries.shape, (
        f"with the inputs on the meta device, attend returned a {tuple(got.shape)} tensor on "
        f"{got.device}: the result belongs on the queries' device, in their shape"
    )


@pytest.mark.attend
def test_paged_logits_equal_hfs_for_prompts_read_in_uneven_chunks(impl, shipped, hf):
    model, tokenizer = shipped
    texts = [tokenizer.encode(p) for p in PROMPTS[:3]]
    block_size, num_blocks = 4, 30
    cache = impl.PagedKVCache.allocate(model, num_blocks, block_size)
    for layer in cache.keys + cache.values:  # what earlier requests left behind
        layer.normal_(0, 50, generator=torch.Generator().manual_seed(1))
    order = list(range(1, num_blocks))
    random.Random(0).shuffle(order)
    tables = [order[i::3] for i in range(3)]
    chunks = ([5, 1, 7], [3, 1, 9], [100, 1, 100], [1, 1, 1])
    for step in uneven_chunks([len(t) for t in texts], chunks):
        scheduled = [(texts[r], start, n, tables[r]) for r, start, n in step]
        inputs = impl.prepare_inputs(scheduled, block_size)
        with torch.inference_mode():
            logits = impl.forward_paged(model, cache, inputs, torch.arange(len(inputs.token_ids)))
        for i, (r, start, n) in enumerate(step):
            with torch.inference_mode():
                want = hf(torch.tensor([texts[r][: start + n]])).logits[0, start:]
            got = logits[inputs.query_start[i] : inputs.query_start[i + 1]]
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
                f"request {r}, positions {start} to {start + n - 1} (fed {n} at once, after "
                f"{start} cached): the logits differ from HF's by "
                f"{(got - want).abs().max().item():.3g}. The cache's unused slots hold large "
                "values: does each query read only its own request's positions, up to its own?"
            )


# --------------------------------------------------------------------------- block_pool


class PoolModel:
    """The contract of vLLM's BlockPool, written out: counts, and the free queue in order."""

    def __init__(self, n):
        self.count = [0] * n
        self.queue = list(range(n))

    def get(self, k):
        taken, self.queue = self.queue[:k], self.queue[k:]
        for b in taken:
            self.count[b] = 1
        return taken

    def touch(self, ids):
        for b in ids:
            if self.count[b] == 0:
                self.queue.remove(b)
            self.count[b] += 1

    def free(self, ids):
        for b in ids:
            self.count[b] -= 1
            if self.count[b] == 0:
                self.queue.append(b)


def pool_state(pool) -> tuple[list[int], list[int]]:
    return [b.ref_cnt for b in pool.blocks], list(pool.free_queue)


def pool_op(pool, method: str, arg):
    """Call one of the pool's methods; a KeyError it raises becomes what it points to."""
    try:
        return getattr(pool, method)(arg)
    except KeyError as error:
        key = error.args[0] if error.args else None
        if method == "get_new_blocks" and key is None:
            raise AssertionError(
                "get_new_blocks raised KeyError: None, looking up a name in pool.cached: a block "
                "that was never named (block_hash None) was evicted by its name. Only a block "
                "with a name loses it; a fresh block has none."
            ) from None
        if method == "touch" and isinstance(key, int):
            raise AssertionError(
                f"touch raised KeyError: {key}, taking block {key} out of the free queue, where "
                "it is not: the block is held already (ref_cnt > 0). Only a block nobody holds "
                "(ref_cnt 0) is in the queue and leaves it; a held one just gains a holder."
            ) from None
        raise


@pytest.mark.block_pool
def test_new_blocks_come_from_the_least_recently_freed(impl):
    pool = impl.BlockPool(6)
    handed = pool_op(pool, "get_new_blocks", 3)
    first = [b.block_id for b in handed]
    assert len(set(first)) == len(first), (
        f"a fresh pool handed out {first}: the same block more than once. Was the front of the "
        "free queue read without being taken out of it? Each block handed out leaves the queue "
        "(popitem removes the entry it returns)."
    )
    assert len(first) == 3, (
        f"asked for 3 blocks, a fresh pool's get_new_blocks handed out {len(first)} ({first}): "
        "one block for each asked for. Does the function return before its loop has run its "
        "course?"
    )
    assert first == [0, 1, 2], (
        f"a fresh pool hands out blocks 0, 1, 2 first (the front of the free queue), got "
        f"{first}. Which end of the OrderedDict does your pop take from? Called plainly, "
        "`popitem` takes the newest entry; it has an argument that makes it take the oldest."
    )
    counts = [b.ref_cnt for b in handed]
    assert counts == [1, 1, 1], (
        f"a block handed out by get_new_blocks is held once, by the request that asked: ref_cnt "
        f"1 each, got {counts}. Does get_new_blocks set each block's count?"
    )
    assert all(b is pool.blocks[b.block_id] for b in handed), (
        "get_new_blocks returned block objects that are not the pool's own (`self.blocks`): "
        "a new KVCacheBlock made on the spot is not the one the pool counts and names, so its "
        "ref_cnt and block_hash are lost. Return the pool's blocks, looked up by their ids."
    )
    assert not any(b in pool.free_queue for b in first), (
        f"get_new_blocks handed out {first}, yet the pool's free queue still holds them: "
        f"{list(pool.free_queue)}. Were they popped from a copy of the queue (a local one) "
        "rather than from `self.free_queue` itself?"
    )
    pool.free_blocks([pool.blocks[2], pool.blocks[0]])
    queue = list(pool.free_queue)
    assert queue == [3, 4, 5, 2, 0], (
        f"blocks 2 then 0, each held once, were freed: they join the END of the free queue, in "
        f"the order freed: expected [3, 4, 5, 2, 0], got {queue}."
        + (" Their counts reached 0, yet they are not in the queue at all. A block joins "
           "self.free_queue (the pool's own, not a copy of the queue) when the holder letting go "
           "brings its count to 0: is the count checked after it is lowered?"
           if queue == [3, 4, 5] and pool.blocks[0].ref_cnt == 0 else "")
        + (" They were freed in the reverse of the order given: free_blocks goes through its "
           "blocks in the order given (the caller decides which is evicted first)."
           if queue == [3, 4, 5, 0, 2] else "")
        + (" They went to the FRONT of the queue, to be evicted first: a block freed just now "
           "is the one most likely to be asked for again, so it joins the end."
           if queue[:2] in ([2, 0], [0, 2]) else "")
    )  # fmt: skip
    got = [b.block_id for b in pool.get_new_blocks(4)]
    smallest = got == sorted(queue)[:4]
    assert got == [3, 4, 5, 2], (
        f"get_new_blocks takes from the FRONT of the queue (least recently freed): expected "
        f"[3, 4, 5, 2], got {got}. "
        + ("Those are the smallest free ids: the queue's order is the order the blocks were "
           "freed in, not their ids, and the least recently freed (at its front) goes first."
           if smallest else "Which end of the OrderedDict does your pop take from? Called "
           "plainly, `popitem` takes the newest entry (the block just freed).")
    )  # fmt: skip
    assert [pool.blocks[b].ref_cnt for b in got] == [1, 1, 1, 1], "a new block is held once"


@pytest.mark.block_pool
def test_a_shared_block_is_free_only_when_its_last_holder_frees_it(impl):
    pool = impl.BlockPool(4)
    (block,) = pool.get_new_blocks(1)
    pool_op(pool, "touch", [block])
    assert block.ref_cnt == 2, f"touch adds a holder: ref_cnt should be 2, got {block.ref_cnt}"
    pool.free_blocks([block])
    assert block.ref_cnt == 1, (
        f"a block with 2 holders, freed by one of them: ref_cnt should be 1, got "
        f"{block.ref_cnt}."
        + (" The count was not decreased: every free takes one holder off, whether or not the "
           "block becomes free." if block.ref_cnt == 2 else "")
    )  # fmt: skip
    assert block.block_id not in pool.free_queue, (
        "one of its two holders freed it: ref_cnt is 1 and it must stay out of the free queue "
        "(the other holder still reads it); a block is free when its count reaches 0, not at "
        "every free"
    )
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and list(pool.free_queue)[-1] == block.block_id, (
        "its last holder freed it: ref_cnt 0, at the end of the free queue"
    )


@pytest.mark.block_pool
def test_touch_takes_a_free_cached_block_out_of_the_queue_and_keeps_its_name(impl):
    pool = impl.BlockPool(4)
    block = pool.get_new_blocks(2)[1]
    pool.cache_full_block(block, b"name")
    pool.free_blocks([block])
    assert block.block_hash == b"name" and pool.get_cached_block(b"name") is block, (
        "a block freed by its last holder keeps its name (block_hash, and its entry in "
        "pool.cached), so that a later request with the same prefix finds it; got block_hash "
        f"{block.block_hash!r}. Did free_blocks drop the name? Only get_new_blocks, handing the "
        "block out to be overwritten, takes it away."
    )
    assert block.block_id in pool.free_queue, (
        f"block {block.block_id}, named, was freed by its last holder (ref_cnt "
        f"{block.ref_cnt}) and is not in the free queue {list(pool.free_queue)}: a block whose "
        "count reaches 0 joins the queue, named or not. A named one keeps its name there, to "
        "be found again, until the pool hands it out as new; kept out of the queue, it could "
        "never be handed out, and the pool would run dry."
    )
    pool_op(pool, "touch", [block])
    assert block.block_id not in pool.free_queue, (
        "a free block that touch gives a holder must leave the free queue, or it would be handed "
        "out as new while held"
    )
    assert block.ref_cnt == 1 and block.block_hash == b"name", (
        f"a free named block that touch gives a holder: ref_cnt 1 and its name kept, got "
        f"ref_cnt {block.ref_cnt} and block_hash {block.block_hash!r}"
    )
    handed = [b.block_id for b in pool.get_new_blocks(pool.num_free_blocks)]
    assert block.block_id not in handed, "a held block was handed out as a new one"


@pytest.mark.block_pool
def test_an_evicted_block_loses_its_name(impl):
    pool = impl.BlockPool(3)
    named = pool.get_new_blocks(1)[0]
    pool.cache_full_block(named, b"prefix")
    pool.free_blocks([named])
    assert pool.get_cached_block(b"prefix") is named, "a freed block keeps its name"
    pool.get_new_blocks(3)  # the pool needs every block: the named one is evicted
    assert named.block_hash is None and pool.get_cached_block(b"prefix") is None, (
        "a block handed out as new is about to be overwritten: it must lose its name, in the "
        "block (its block_hash cleared) and in pool.cached (its entry removed). Does "
        "get_new_blocks take an evicted block's name away in both places?"
    )


@pytest.mark.block_pool
def test_random_allocations_follow_the_contract(impl):
    rng = random.Random(7)
    pool, model = impl.BlockPool(10), PoolModel(10)
    held: list[int] = []
    for step in range(300):
        op = rng.choice(["get", "touch", "free"])
        if op == "get" and model.queue:
            k = rng.randint(1, min(3, len(model.queue)))
            got = [b.block_id for b in pool.get_new_blocks(k)]
            want = model.get(k)
            assert got == want, f"operation {step}: get_new_blocks({k}) gave {got}, not {want}"
            held += got
        elif op == "touch":
            ids = rng.sample(range(10), rng.randint(1, 3))
            pool.touch([pool.blocks[b] for b in ids])
            model.touch(ids)
            held += ids
        elif op == "free" and held:
            ids = [held.pop(rng.randrange(len(held))) for _ in range(min(len(held), 2))]
            if len(set(ids)) == len(ids):
                pool.free_blocks([pool.blocks[b] for b in ids])
                model.free(ids)
            else:
                held += ids
        counts, queue = pool_state(pool)
        assert counts == model.count and queue == model.queue, (
            f"after operation {step} ({op}): counts {counts}, free queue {queue}; the contract "
            f"gives counts {model.count}, free queue {model.queue}"
        )


# --------------------------------------------------------------------------- kv_cache_manager


def request(impl, request_id: str, ids: list[int], max_tokens: int = 8):
    return impl.Request(request_id, list(ids), impl.SamplingParams(max_tokens=max_tokens))


def blocks_counted(impl) -> str:
    """How many blocks the learner's allocate_slots gives a request at exact block boundaries
    (a pool large enough for any count), where they fit a known mistake: a sentence."""
    cases, got = [(8, 4), (4, 8), (8, 1), (5, 2)], []
    for computed, new in cases:
        manager = impl.KVCacheManager(num_blocks=64, block_size=4)
        req = request(impl, f"probe-{computed}-{new}", range(100, 100 + computed + new))
        try:
            manager.allocate_slots(req, computed)
            req.num_computed_tokens = computed
            manager.allocate_slots(req, new)
        except Exception:
            return ""
        got.append(len(req.block_ids))
    need = [-(-(c + n) // 4) for c, n in cases]
    if got == need:
        return ""
    again = [-(-c // 4) + -(-(c + n) // 4) for c, n in cases]  # held blocks not subtracted
    if got == again:
        return (
            " At exact block boundaries, with a pool large enough: the request's table grew by "
            "all the blocks its tokens need, on top of those it held ("
            + "; ".join(
                f"{c} computed and {n} new tokens need {w}, your table has {g}"
                for (c, n), w, g in zip(cases, need, got, strict=True)
            )  # fmt: skip
            + "). The blocks it holds already count: only the difference is allocated."
        )
    if got == [(c + n - 1) // 4 for c, n in cases]:
        return (
            f" At exact block boundaries, with a pool large enough, your allocate_slots gives "
            f"{got} blocks where {need} are needed: one too few each time. Is n / size rounded "
            "up? (n - 1) // size is always one less than that."
        )
    twice = [max(-(-(2 * c + n) // 4), -(-(c + 2 * n) // 4)) for c, n in cases]
    if got == twice:
        return (
            " At exact block boundaries, with a pool large enough, your allocate_slots takes "
            f"{got} blocks where {need} are needed: the new tokens were counted twice. "
            "num_tokens counts every token the request knows, the new ones included: the "
            "tokens already in the cache are num_computed_tokens."
        )
    if got == [-(-c // 4) + -(-n // 4) for c, n in cases]:
        return (
            " At exact block boundaries, with a pool large enough: "
            + "; ".join(
                f"{c} computed and {n} new tokens need {w}, your table has {g}"
                for (c, n), w, g in zip(cases, need, got, strict=True)
            )  # fmt: skip
            + ". The new tokens' blocks were counted from the new tokens alone (rounded up) "
            "and added to those held: the room left in the request's last block went unused "
            "(5 computed tokens leave 3 free slots in their second block, enough for 2 more). "
            "Count the blocks ALL its tokens need, then take away those it holds."
        )
    if got == [c + -(-n // 4) for c, n in cases]:
        counts = "; ".join(
            f"{c} tokens computed and {n} new ({c + n} tokens) need {w} blocks of 4, your "
            f"allocate_slots gave the request {g}"
            for (c, n), w, g in zip(cases, need, got, strict=True)
        )
        return (
            f" At exact block boundaries, with a pool large enough for any count: {counts}. "
            "That is the computed tokens plus the new tokens' blocks: only the new tokens were "
            "divided by block_size. The blocks needed are ALL the tokens the request will have "
            "(computed and new), summed first, then divided by block_size and rounded up."
        )
    return ""


def allocated(impl, manager, req, n: int, hits=None) -> None:
    """allocate_slots for a setup whose pool has room: None is explained with the counts."""
    held, hit = len(req.block_ids), len(hits or [])
    free = getattr(manager.pool, "num_free_blocks", "?")
    got = manager.allocate_slots(req, n) if hits is None else manager.allocate_slots(req, n, hits)
    total = req.num_computed_tokens + hit * manager.block_size + n
    need = -(-total // manager.block_size)
    if got is not None and len(req.block_ids) != need:
        named = blocks_counted(impl)  # a known miscount is named here; others further on
        if named:
            pytest.fail(
                f"request {req.request_id!r}: {req.num_computed_tokens} tokens computed, {hit} "
                f"cached block(s) of {manager.block_size} and {n} new tokens make {total} "
                f"tokens: {need} blocks of {manager.block_size} (rounded up), and its table "
                f"has {len(req.block_ids)}." + named
            )
    if got is None:
        pytest.fail(
            f"request {req.request_id!r}: {req.num_computed_tokens} tokens computed, "
            f"{hit} cached block(s) and {n} new tokens make {total} tokens, {need} blocks of "
            f"{manager.block_size}; it held {held} and its hits are {hit}, so it needs "
            f"{max(need - held - hit, 0)} new block(s), and {free} were free: allocate_slots "
            "returned None where the blocks suffice." + blocks_counted(impl)
        )


def computed_in_full(impl, manager, req) -> None:
    """Allocate a request's whole prompt, name its full blocks, mark it computed."""
    allocated(impl, manager, req, req.num_tokens)
    manager.cache_blocks(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens


def found_while_held(impl, ids: list[int]) -> int:
    """The cached tokens the learner's lookup finds for `ids` while the request that computed
    tokens 100..113 still holds its blocks (none freed)."""
    manager = impl.KVCacheManager(num_blocks=16, block_size=4)
    computed_in_full(impl, manager, request(impl, "holder", range(100, 114)))
    return manager.get_computed_blocks(request(impl, "again", ids))[1]


@pytest.mark.kv_cache_manager
def test_prefix_hits_are_the_longest_run_of_named_leading_blocks(impl):
    manager = impl.KVCacheManager(num_blocks=16, block_size=4)
    first = request(impl, "a", range(100, 114))  # 3 full blocks, 2 tokens more
    computed_in_full(impl, manager, first)
    manager.free(first)  # its blocks stay named
    cases = [
        ("shares 2 blocks, differs in the third", list(range(100, 108)) + [1, 2, 3, 4, 5], 8),
        (
            "differs in the second block, same third",
            list(range(100, 104)) + [9] * 4 + list(range(108, 112)) + [7],
            4,
        ),  # fmt: skip
        ("is exactly the 3 named blocks", list(range(100, 112)), 8),
        ("differs in its first token", [0] + list(range(101, 114)), 0),
        ("is the 3 named blocks and one token more", list(range(100, 112)) + [5], 12),
    ]
    asked = []  # the token counts the lookup asked block_hashes for
    block_hashes = getattr(manager, "block_hashes", None)
    if callable(block_hashes):

        def spy(req, num_tokens):
            asked.append(num_tokens)
            return block_hashes(req, num_tokens)

        manager.block_hashes = spy
    for what, ids, want in cases:
        asked.clear()
        blocks, n = manager.get_computed_blocks(request(impl, what, ids))
        odd = [b for b in blocks if not hasattr(b, "ref_cnt")]
        assert not odd, (
            f"a prompt that {what}: get_computed_blocks returned {type(odd[0]).__name__} "
            "objects among its hits: it returns the pool's blocks (what pool.get_cached_block "
            "gives for a name), not their names."
        )
        hint = ""
        if what.startswith("is the 3") and n == 8:
            hint = (
                " Its third block ends before its last token, so it may be a hit: only the last "
                "TOKEN must be left to compute (look at the blocks among the first num_tokens - "
                "1 tokens), not the last full block."
            )
        elif what.startswith("is exactly") and n == 12:
            hint = (
                " All of its tokens were reported cached: the last token must be computed, to "
                "give the logits the next token is sampled from (look only at the first "
                "num_tokens - 1)."
            )
        elif what.startswith("differs in the second") and n == 8:
            hint = (
                " A block after a miss is not a hit: its name covers its whole prefix, so the "
                "run of hits stops at the first miss."
            )
        elif n == len(blocks) and want and len(blocks) == want // 4:
            hint = (
                " The number returned is the count of blocks found: it is the number of cached "
                "TOKENS, the blocks found times block_size."
            )
        elif 0 < n < want and len(blocks) == 1:
            hint = (
                " Only its first block was reported, though the blocks after it are named too: "
                "the lookup stopped at the first hit. The run of hits goes on while each block "
                "is found, and stops at the first miss."
            )
        elif n != want and asked and asked[-1] != len(ids) - 1:
            hint = (
                f" The lookup looked at the names of the blocks among the request's first "
                f"{asked[-1]} tokens (what it asked block_hashes for), where it should look at "
                f"{len(ids) - 1}: all the request's tokens but the last ({len(ids)} tokens, "
                "prompt and output, none computed yet), that is up to the last full block "
                "among them."
                + (
                    " 0 is what a request not run yet has computed: the hits are looked for "
                    "among the tokens it HAS, not those it has computed."
                    if asked[-1] == 0
                    else ""
                )
            )
        elif len(blocks) == want // 4 and n != len(blocks) * 4:
            hint = (
                f" The blocks found are right ({len(blocks)}), the count is not: the cached "
                f"tokens are the blocks found times block_size, {len(blocks) * 4}. (The last "
                "token is left out by which blocks are looked up, not by the count.)"
            )
        elif (
            n == 0
            and want
            and manager.get_computed_blocks(request(impl, "no miss", list(range(100, 112))))[1] == 8
        ):  # the same named blocks, with no miss after them: found
            hint = (
                " No hits at all, though the leading blocks are named: were the hits found "
                "before the first miss thrown away at the miss? The lookup stops at the first "
                "miss and keeps the run of hits found up to it."
            )
        elif n < want and found_while_held(impl, ids) == want:
            hint = (
                " Fewer hits than the named leading blocks, which are found while their holder "
                "still holds them. Here it has freed them "
                "(ref_cnt 0, in the free queue): a freed block keeps its contents and its name "
                "until it is handed out again, so it is still a hit. Is a block that nobody "
                "holds taken for a miss?"
            )
        elif n < want:
            hint = (
                " Fewer hits than the named leading blocks: the run of hits goes on while each "
                "block is found, and stops only at the first miss."
            )
        assert n == want and len(blocks) == want // 4, (
            f"a prompt that {what}: {want} cached tokens in {want // 4} blocks expected, got "
            f"{n} tokens in {len(blocks)} blocks." + hint
        )


@pytest.mark.kv_cache_manager
def test_the_hits_stop_at_the_first_miss_even_when_a_later_block_is_named(impl):
    manager = impl.KVCacheManager(num_blocks=6, block_size=4)
    prefix = list(range(1, 9))  # 2 full blocks
    a = request(impl, "a", prefix)
    allocated(impl, manager, a, 8)  # names its 2 blocks
    a.num_computed_tokens = 8
    b = request(impl, "b", prefix)
    hits, n = manager.get_computed_blocks(b)  # a's first block (its last token is computed)
    assert n == 4, f"setup: b shares a's first block (4 tokens), got {n} tokens"
    allocated(impl, manager, b, 4, hits)  # its 2nd block: a's keeps the name
    b.num_computed_tokens = 8
    b.output_token_ids += [11, 12, 13, 14]
    allocated(impl, manager, b, 4)  # b's 3rd block is named (its parent: 2nd)
    assert len(b.block_ids) == 3, (
        f"a request with 8 tokens computed (2 blocks of 4) and 4 new ones: 12 tokens need 3 "
        f"blocks, and its table has {len(b.block_ids)}."
        + (" That is a block too many: 12 tokens fill exactly 3 blocks of 4, and a block is "
           "added only for tokens past the last full one (12 / 4 rounded up is 3)."
           if len(b.block_ids) == 4 else " The tokens it has computed already "
           "(num_computed_tokens) count among those its table must cover, with the new ones.")
    )  # fmt: skip
    b.num_computed_tokens = 12
    manager.free(a)  # a's 2nd block becomes free, named
    other = request(impl, "other", [99] * 12)
    assert manager.allocate_slots(other, 12) is not None, (  # takes it: its name is gone
        "setup: 12 tokens need 3 blocks of 4 and exactly 3 are free: that is enough (refuse "
        "only when the blocks needed are more than the free ones)"
    )
    c = request(impl, "c", prefix + [11, 12, 13, 14, 50])
    found, n = manager.get_computed_blocks(c)
    table = [block.block_id for block in found]
    assert n == 4 and table == b.block_ids[:1], (
        f"c's first block is cached, its second is not any more (evicted), its third is "
        f"(b's): the hits are its first block alone, 4 tokens; got blocks {table}, {n} tokens."
        + (" The lookup went on past a miss: the later block found takes the missing block's "
           "place in c's table, where c would read its keys at the wrong positions. The run of "
           "hits stops at the first miss." if len(found) > 1 else "")
    )  # fmt: skip


@pytest.mark.kv_cache_manager
def test_no_hits_with_prefix_caching_off(impl):
    manager = impl.KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first = request(impl, "a", range(100, 110))
    computed_in_full(impl, manager, first)
    blocks, n = manager.get_computed_blocks(request(impl, "b", range(100, 110)))
    assert (list(blocks), n) == ([], 0), "with prefix caching off there are no hits"


@pytest.mark.kv_cache_manager
def test_a_table_grows_one_block_when_the_last_is_full(impl):
    manager = impl.KVCacheManager(num_blocks=8, block_size=4)
    req = request(impl, "a", range(100, 109))  # 9 tokens
    for new, computed_before, want in [(9, 0, 3), (1, 9, 3), (2, 10, 3), (1, 12, 4)]:
        req.num_computed_tokens = computed_before
        got = manager.allocate_slots(req, new)
        assert got is not None and len(req.block_ids) == want, (
            f"{computed_before} tokens computed, {new} more: {computed_before + new} tokens need "
            f"{want} blocks of 4 (rounded up), the table has "
            f"{'none (None returned)' if got is None else len(req.block_ids)}."
            + blocks_counted(impl)
        )


@pytest.mark.kv_cache_manager
def test_a_request_holding_most_of_the_pool_still_grows_by_one_block(impl):
    manager = impl.KVCacheManager(num_blocks=14, block_size=4)
    req = request(impl, "a", range(100, 140))  # 40 tokens: 10 full blocks of 4
    assert manager.allocate_slots(req, 40) is not None, "setup: 10 blocks of 14 for 40 tokens"
    req.num_computed_tokens = 40
    req.output_token_ids.append(7)  # its 41st token needs an 11th block; 4 are free
    free = manager.pool.num_free_blocks
    got = manager.allocate_slots(req, 1)
    assert got is not None and len(req.block_ids) == 11, (
        f"a request holds 10 blocks, {free} are free, and its 41st token needs one block more: "
        "the pool has it, so the table should grow to 11 blocks; got "
        f"{'None' if got is None else f'a table of {len(req.block_ids)} blocks'}. Only the "
        "blocks it does not hold yet must come from the pool: were the 10 it already holds "
        "counted as needed again? (In the engine such a request would preempt itself for ever.)"
    )


@pytest.mark.kv_cache_manager
def test_too_few_free_blocks_gives_none_and_changes_nothing(impl):
    manager = impl.KVCacheManager(num_blocks=4, block_size=4)
    other = request(impl, "other", range(50, 55))
    assert manager.allocate_slots(other, 5) is not None  # 2 blocks held
    req = request(impl, "a", range(100, 112))  # needs 3, 2 are free
    free_before = manager.pool.num_free_blocks
    held = len(other.block_ids)
    assert held == 2 and free_before == 2, (
        f"setup: a request of 5 tokens in blocks of 4 should hold 2 blocks (rounded up), leaving "
        f"2 of the 4 free; it holds {held} and {free_before} are free. Are the blocks needed "
        "rounded up?"
    )
    got = manager.allocate_slots(req, 12)
    assert got is None, (
        "12 tokens need 3 blocks of 4 and only 2 are free: return None (the scheduler then "
        f"preempts someone); got a table of {len(req.block_ids)} blocks"
    )
    assert manager.pool.num_free_blocks == free_before and req.block_ids == [], (
        "a refused allocation must change nothing: no block taken from the pool"
    )
    exact = request(impl, "b", range(200, 208))  # needs 2 blocks, and 2 are free
    assert manager.allocate_slots(exact, 8) is not None, (
        "8 tokens need 2 blocks of 4 and exactly 2 are free: that is enough (refuse only when "
        "the blocks needed are MORE than the free ones)"
    )


def with_two_cached_blocks(impl, num_blocks: int, own: int, first_freed: bool):
    """A manager whose first request computed 2 full blocks of 4 (and, if `first_freed`, gave
    them back, named), and a second request with the same 8 tokens and `own` more: (manager,
    first, second, second's hits)."""
    manager = impl.KVCacheManager(num_blocks=num_blocks, block_size=4)
    first = request(impl, "a", range(100, 108))
    computed_in_full(impl, manager, first)
    if first_freed:
        manager.free(first)
    second = request(impl, "b", range(100, 108 + own))
    hits, n = manager.get_computed_blocks(second)
    assert n == 8, f"setup: the second request should find 8 cached tokens, got {n}"
    return manager, first, second, hits


@pytest.mark.kv_cache_manager
def test_a_request_with_hits_gets_a_table_of_its_hits_then_new_blocks(impl):
    manager, first, second, hits = with_two_cached_blocks(impl, 12, own=6, first_freed=False)
    got = manager.allocate_slots(second, 6, hits)
    table = second.block_ids
    assert got is not None and len(table) == 4 and table[:2] == first.block_ids, (
        f"8 cached tokens (2 hits) and 6 new ones: 14 tokens need 4 blocks of 4, the 2 hits "
        f"first, then 2 new; the table is {table} (the hits are {first.block_ids}). The hits' "
        "tokens count among the tokens the table must cover, and the hits among its blocks."
    )


@pytest.mark.kv_cache_manager
def test_a_free_cached_hit_is_not_free_for_the_requests_new_blocks(impl):
    # 3 free blocks, 2 of them named: the second request's hits.
    manager, _, second, hits = with_two_cached_blocks(impl, 3, own=8, first_freed=True)
    counts = [b.ref_cnt for b in hits]
    try:
        got = manager.allocate_slots(second, 8, hits)
    except ValueError as error:  # the pool refused: the check let through what it cannot give
        got = error
    shown = f"a table of {len(got)} blocks" if isinstance(got, list) else repr(got)
    assert got is None, (
        "2 hits that sit in the free queue, and 2 new blocks needed: the pool has 3 free blocks, "
        "but 2 of them are the hits this request is about to take, so only 1 is free for new "
        f"blocks. Return None: count the hits whose ref_cnt is 0 as not free. (Got {shown}.)"
    )
    assert [b.ref_cnt for b in hits] == counts and manager.pool.num_free_blocks == 3, (
        "a refused allocation must change nothing: the hits were taken (touched) before the "
        "check said no"
    )


@pytest.mark.kv_cache_manager
def test_a_request_computed_again_finds_its_own_outputs_blocks(impl):
    """A preempted request comes back with its prompt and its output so far: a block of its
    output is named like any other, and found again."""
    manager = impl.KVCacheManager(num_blocks=16, block_size=4)
    computed_in_full(impl, manager, request(impl, "a", range(100, 114)))  # 3 named blocks
    back = request(impl, "back", range(100, 106))  # a 6-token prompt...
    back.output_token_ids = list(range(106, 113))  # ...and 7 tokens of output: 100 to 112
    blocks, n = manager.get_computed_blocks(back)
    assert n == 12 and len(blocks) == 3, (
        f"a request of 6 prompt tokens and 7 output tokens (a preempted one, computed again): "
        f"its first 12 tokens are 3 named blocks, so it has 12 cached tokens, got {n}."
        + (" Those are the hits of its prompt alone: the hits are looked for among all its "
           "tokens (all_token_ids; num_tokens counts them), output too." if n == 4 else "")
    )  # fmt: skip


@pytest.mark.kv_cache_manager
def test_hits_that_another_request_holds_cost_no_free_block(impl):
    manager, _, second, hits = with_two_cached_blocks(impl, 4, own=8, first_freed=False)
    free = manager.pool.num_free_blocks
    got = manager.allocate_slots(second, 8, hits)
    assert got is not None and len(second.block_ids) == 4, (
        f"2 hits still held by the request that computed them (ref_cnt 1, so not in the free "
        f"queue) and 8 new tokens: 16 tokens need 4 blocks, the 2 hits and 2 new ones, and "
        f"{free} blocks are free: enough. Got "
        f"{'None' if got is None else f'a table of {len(second.block_ids)} blocks'}. Only a "
        "hit nobody holds (ref_cnt 0) sits among the free blocks and is not free for new ones; "
        "a held hit takes nothing from them."
    )


# --------------------------------------------------------------------------- schedule


def step_done(scheduled) -> None:
    """What the engine does after a step, written out: the tokens are computed, and a request
    that computed its last known token gets a new one."""
    for req, n in scheduled:
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens:
            req.output_token_ids.append(1)


def plan(out) -> list[tuple[str, int]]:
    return [(req.request_id, n) for req, n in out.scheduled]


def scheduled_without_blocks(out, block_size: int, step: str) -> None:
    """Every request in the plan holds the blocks its scheduled tokens need: one admitted
    although `allocate_slots` returned None holds none (or too few)."""
    for req, n in out.scheduled:
        needed = -(-(req.num_computed_tokens + n) // block_size)
        assert len(req.block_ids) >= needed, (
            f"{step}: {req.request_id} is scheduled for {n} tokens, "
            f"{req.num_computed_tokens + n} in all, which need {needed} blocks of {block_size}, "
            f"and it holds {len(req.block_ids)}. When allocate_slots returns None there are not "
            "enough free blocks for it: such a request is not admitted (nor scheduled); it "
            "stays at the head of the queue and waits. Is the result of allocate_slots checked?"
        )


def over_budget(out, budget: int, running: list[str]) -> str:
    """A hint when the plan takes more tokens than the budget, naming whose were not counted."""
    total = sum(n for _, n in out.scheduled)
    if total <= budget:
        return ""
    whole = [(r.request_id, n) for r, n in out.scheduled if r.request_id in running and n > budget]
    if whole:
        rid, n = whole[0]
        return (
            f" The plan takes {total} tokens, over the budget of {budget}: running request {rid} "
            f"got {n} tokens, more than the whole budget. A running request's chunk is capped "
            "too: it gets the fewer of the tokens it lacks and the budget left."
        )
    from_running = sum(n for r, n in out.scheduled if r.request_id in running)
    if total - from_running <= budget:
        return (
            f" The plan takes {total} tokens, over the budget of {budget}, and the excess is "
            f"what the running requests {running} took: their tokens were not taken from the "
            "budget. Every scheduled request's tokens, a running one's too, come out of it."
        )
    admitted = [n for r, n in out.scheduled if any(r is a for a in out.admitted)]
    if len(admitted) > 1 and from_running + sum(admitted[:-1]) <= budget:
        return (
            f" The plan takes {total} tokens, over the budget of {budget}: the last request "
            "admitted got more than the requests before it left. An admitted request's "
            "tokens come out of the budget too, before the next one is sized."
        )
    return f" The plan takes {total} tokens, over the budget of {budget}."


def preempted_properly(out, step: str) -> None:
    """Each request preempted in the step gave its blocks back and starts again from nothing."""
    for victim in out.preempted:
        if any(r is victim for r, _ in out.scheduled):
            continue  # scheduled again after it was preempted: another test's mistake
        assert not victim.block_ids and victim.num_computed_tokens == 0, (
            f"{step}: request {victim.request_id} was preempted but still holds its blocks "
            f"{victim.block_ids} and {victim.num_computed_tokens} computed tokens: a preempted "
            "request gives its blocks back and is computed again later. Did it go through the "
            "given `self._preempt`, which frees them, or only back into the queue?"
        )


def preempted_newest_first(out, running_before: list[str], step: str) -> None:
    """The requests preempted in a step are the newest of those running, newest first."""
    got = [r.request_id for r in out.preempted]
    newest = list(reversed(running_before))[: len(got)]
    assert got == newest, (
        f"{step}: running before the step, oldest first: {running_before}; preempted {got}, "
        f"where the newest go first ({newest}). The victim is the NEWEST running request, the "
        "end of `self.running`; an older one keeps its place."
    )


def negative_count(out) -> str:
    """A request scheduled for fewer than 1 token: its computed count ran past its tokens, or
    what it lacks was counted against its prompt alone."""
    for req, n in out.scheduled:
        if n == 0 and req.output_token_ids and req.num_computed_tokens == len(req.prompt_token_ids):
            return (
                f" {req.request_id} was scheduled for 0 tokens: it has computed its "
                f"{req.num_computed_tokens}-token prompt and has {len(req.output_token_ids)} "
                "output token(s) to compute. Are the tokens it lacks counted against its "
                "prompt alone? They are all its tokens, prompt and output (num_tokens), less "
                "those computed."
            )
        if n < 0:
            return (
                f" {req.request_id} was scheduled for {n} tokens: its num_computed_tokens "
                f"({req.num_computed_tokens}) is past its {req.num_tokens} tokens. Were its "
                "tokens counted as computed twice, once when scheduled and again by the update "
                "after the step? On admission it has computed its cache hits only; the update "
                "adds what the step ran."
            )
    return ""


@pytest.mark.schedule
def test_running_requests_first_then_the_queue_within_the_budget(impl):
    kv = impl.KVCacheManager(num_blocks=32, block_size=4)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=10, max_num_seqs=8)
    a = request(impl, "a", range(100, 106))
    scheduler.add_request(a)
    out = scheduler.schedule()
    assert plan(out) == [("a", 6)], f"one request of 6 tokens, budget 10: got {plan(out)}"
    assert a in scheduler.running and a not in scheduler.waiting, (
        f"a was admitted: it must leave the queue and join `self.running`, where the next "
        f"steps find it; running holds {[r.request_id for r in scheduler.running]}, the queue "
        f"{[r.request_id for r in scheduler.waiting]}. Was the admitted request appended to "
        "self.running?"
    )
    step_done(out.scheduled)
    scheduler.add_request(request(impl, "b", range(200, 208)))
    scheduler.add_request(request(impl, "c", range(300, 320)))
    out = scheduler.schedule()
    ids = [r.request_id for r, _ in out.scheduled]
    twice = sorted({r for r in ids if ids.count(r) > 1})
    assert twice != ["a"], (
        f"a was running, b and c waiting; the plan {plan(out)} schedules the running request a "
        "more than once: once a running request is scheduled, the loop moves on to the next "
        "one (does the index into self.running go up?)."
    )
    assert not twice, (
        f"the queue held b then c; the plan {plan(out)} schedules {twice} more than once. "
        "An admitted request is the head of the queue, and the one to take off: was the "
        "queue's tail taken off instead (`pop` takes the last, the head stays to be admitted "
        "again)?"
    )
    want = [("a", 1), ("b", 8), ("c", 1)]
    whole_again = ("a", a.num_tokens) in plan(out) and a.num_cached_tokens == 0
    assert plan(out) == want, (
        f"a decodes (1 token), then b's 8-token prompt, then c gets what is left of the budget "
        f"of 10 (1 token, a chunk of its prompt): expected {want}, got {plan(out)}."
        + (f" a was scheduled for all its {a.num_tokens} tokens, though {a.num_computed_tokens} "
           "are computed: what a running request lacks is its known tokens less those computed "
           "(num_computed_tokens), not less its cache hits (num_cached_tokens, 0 here)."
           if whole_again else "")
        + (negative_count(out) or over_budget(out, 10, ["a"])
           or " Running requests go first; each gets min(tokens it lacks, budget left).")
    )  # fmt: skip
    order = [r.request_id for r in scheduler.running]
    assert order == ["a", "b", "c"], (
        f"a ran first, then b and c were admitted, in that order: self.running lists the running "
        f"requests oldest first, ['a', 'b', 'c'], got {order}. An admitted request joins the "
        "END of self.running (the newest, the first to be preempted)."
    )
    step_done(out.scheduled)
    out = scheduler.schedule()
    want = [("a", 1), ("b", 1), ("c", 8)]
    one_each = ("c", 1) in plan(out)
    assert plan(out) == want, (
        f"next step: a and b decode, c's prompt goes on in a chunk of 8: expected {want}, got "
        f"{plan(out)}."
        + (" c is running with 19 prompt tokens still to compute and got 1: a running "
           "request is not always decoding. It gets min(the tokens it lacks, budget left): "
           "a prompt admitted in a chunk goes on in chunks." if one_each else "")
        + over_budget(out, 10, ["a", "b", "c"])
    )  # fmt: skip


@pytest.mark.schedule
def test_seats_limit_admission_and_the_queue_is_first_come_first_served(impl):
    kv = impl.KVCacheManager(num_blocks=6, block_size=4)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=2)
    for name, n in [("a", 4), ("b", 4), ("c", 4)]:
        scheduler.add_request(request(impl, name, range(100, 100 + n)))
    out = scheduler.schedule()
    assert plan(out) == [("a", 4), ("b", 4)], (
        f"max_num_seqs=2: two requests run, the third waits; got {plan(out)}."
        + (f" One was admitted with 2 seats free: {len(scheduler.running)} request(s) run. Are "
           "the requests admitted in this step counted twice against max_num_seqs (they are in "
           "self.running as soon as admitted)?" if len(plan(out)) == 1 else "")
    )  # fmt: skip
    problems = scheduler_problems(scheduler)
    assert not problems, "max_num_seqs=2, three requests of 4 tokens: " + "; ".join(problems)
    kv2 = impl.KVCacheManager(num_blocks=4, block_size=4)
    allocate, asked = kv2.allocate_slots, []

    def allocate_counted(req, *args, **kwargs):
        asked.append(req.request_id)
        if len(asked) > 20:
            raise AssertionError(
                f"in one step, allocate_slots was asked {len(asked)} times, for {asked[-1]!r} "
                f"again and again ({sorted(set(asked))} in all): when the head of the queue gets "
                "no blocks (None), admission stops for this step (break), it does not go round "
                "again (continue) with the same head."
            )
        return allocate(req, *args, **kwargs)

    kv2.allocate_slots = allocate_counted
    fcfs = impl.Scheduler(kv2, max_num_batched_tokens=100, max_num_seqs=8)
    fcfs.add_request(request(impl, "small", range(100, 108)))  # 2 blocks
    fcfs.add_request(request(impl, "big", range(200, 212)))  # 3 blocks: does not fit now
    fcfs.add_request(request(impl, "tiny", range(300, 304)))  # 1 block: would fit
    out = fcfs.schedule()
    scheduled_without_blocks(out, 4, "a pool of 4 blocks of 4; the queue: small (8 tokens), big "
                             "(12), tiny (4)")  # fmt: skip
    assert plan(out) == [("small", 8)], (
        f"the head of the queue does not fit: nobody behind it may overtake it (first come, "
        f"first served; it would wait for ever behind smaller requests); got {plan(out)}"
    )
    problems = scheduler_problems(fcfs)
    assert not problems, "a pool of 4 blocks of 4, the queue small, big, tiny: " + "; ".join(
        problems
    )


@pytest.mark.schedule
def test_when_blocks_run_out_the_newest_request_is_preempted(impl):
    kv = impl.KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8)
    a, b = request(impl, "a", [1, 2, 3, 4]), request(impl, "b", [5, 6, 7, 8])
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()  # 2 blocks each: the pool is full
    assert plan(out) == [("a", 4), ("b", 4)], f"setup: both admitted, got {plan(out)}"
    step_done(out.scheduled)  # each has a 5th token to compute: it needs a third block
    out = scheduler.schedule()
    preempted_properly(out, "a needs a block and none is free")
    assert out.preempted or b not in scheduler.waiting, (
        "a needed a block and none was free: b, the newest, was preempted (it is back in the "
        "queue), but the plan's `preempted` list is empty. Each request preempted is named in "
        "out.preempted: the engine counts preemptions from it, and no one is admitted after one."
    )
    again = [r.request_id for r, _ in out.scheduled if any(r is v for v in out.preempted)]
    named = [r.request_id for r in out.preempted]
    b_was_preempted = b in scheduler.waiting and b not in scheduler.running
    assert named == ["b"], (
        f"a needs a block and none is free: the NEWEST running request (b) is preempted; got "
        f"{named}."
        + (f" b was preempted (it is back in the queue, out of running), yet out.preempted "
           f"names {named}: the list names the victim, not the request that needed the block."
           if b_was_preempted and "b" not in named
           else (f" And {again} were both preempted and scheduled in this step: a request "
           "preempted gets nothing more in that step, yet here a victim went on to ask for "
           "blocks and preempted an older request for them. Does the loop go over a list of "
           "the running requests copied before the step, where the victim still is, rather "
           "than over self.running itself?" if again else ""))
    )  # fmt: skip
    assert plan(out) == [("a", 1)], f"then a is scheduled; got {plan(out)}"
    assert b not in scheduler.running and scheduler.waiting and scheduler.waiting[0] is b, (
        "the preempted request leaves `running` and waits at the FRONT of the queue "
        "(self._preempt does both, and the victim must be popped from running)"
    )
    assert b.num_computed_tokens == 0 and b.block_ids == [], "preempted: blocks freed, recomputed"


@pytest.mark.schedule
def test_nobody_is_admitted_in_a_step_that_preempted(impl):
    kv = impl.KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=3, max_num_seqs=8)
    scheduler.add_request(request(impl, "a", [1, 2]))
    scheduler.add_request(request(impl, "b", [3]))
    preempting_steps = 0
    for step in range(8):
        before = {id(r) for r in scheduler.running}
        order = [r.request_id for r in scheduler.running]
        out = scheduler.schedule()
        if out.preempted:
            preempting_steps += 1
            victims = {id(r) for r in out.preempted}
            still_waiting = [r.request_id for r, _ in out.scheduled
                             if id(r) in victims and r in scheduler.waiting]  # fmt: skip
            assert not still_waiting, (
                f"step {step}: {still_waiting} preempted, and then scheduled while waiting in the "
                "queue: nothing more is scheduled in a step for a request once it is preempted. "
                "When the newest request is the one that needs the block, it is preempted "
                "itself: stop trying to allocate for it (break). And the loop goes over "
                "self.running itself, which each preemption shortens, not over a list of the "
                "running requests copied before the step (a victim would still be in it)."
            )
            admitted = [r.request_id for r, _ in out.scheduled
                        if id(r) not in before or id(r) in victims]  # fmt: skip
            assert not admitted, (
                f"step {step} preempted {[r.request_id for r in out.preempted]} and admitted "
                f"{admitted}: nobody is admitted in a step that preempted (the pool is full; a "
                "request admitted now would be preempted at the next step)"
            )
            preempted_newest_first(out, order, f"step {step}")
            preempted_properly(out, f"step {step}")
        step_done(out.scheduled)
    assert preempting_steps, "(the test meant to preempt: 4 blocks of 2 for 2 growing requests)"


@pytest.mark.schedule
def test_an_admitted_request_starts_at_its_cache_hits(impl):
    kv = impl.KVCacheManager(num_blocks=16, block_size=4)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8)
    a = request(impl, "a", range(100, 110))
    scheduler.add_request(a)
    step_done(scheduler.schedule().scheduled)
    b = request(impl, "b", list(range(100, 108)) + [1, 2, 3])
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert b.status == impl.RequestStatus.RUNNING, (
        f"an admitted request's status must become RUNNING, got {b.status}"
    )
    admitted = [r.request_id for r in out.admitted]
    assert admitted == ["b"], (
        f"b was admitted from the queue in this step (a was running already): the plan's "
        f"`admitted` list should name b alone, got {admitted}. The engine counts each admitted "
        "request's cache hits from that list, and the timeline shows its first chunk."
    )
    if ("b", 11) in plan(out) and b.num_computed_tokens == 8:
        pytest.fail(
            f"b shares a's first 2 full blocks (8 tokens) and starts with them computed, but it "
            f"was scheduled for 11 tokens, its whole prompt (plan {plan(out)}): the tokens to "
            "compute are those its cache hits do not hold, 3 here. Are the cached tokens taken "
            "from the prompt's length when its first chunk is sized?"
        )
    assert ("b", 3) in plan(out) and b.num_computed_tokens == 8 and b.num_cached_tokens == 8, (
        f"b shares a's first 2 full blocks (8 tokens): it must start with 8 tokens computed "
        f"(num_computed_tokens and num_cached_tokens) and be scheduled for its 3 others; got "
        f"plan {plan(out)}, num_computed_tokens {b.num_computed_tokens}, num_cached_tokens "
        f"{b.num_cached_tokens}"
    )
    shared, table = a.block_ids[:2], list(b.block_ids)
    hits_missing = len(table) == 1 and not set(table) & set(shared)
    assert table[:2] == shared and len(table) == 3, (
        f"b's block table must be a's 2 shared blocks {shared}, then 1 new block for its 3 "
        f"other tokens; it is {table}."
        + (" It holds only the new block: the cache hits are not in it, so b's attention "
           "would never read them and the pool does not count b as their holder. Were the "
           "hits found by get_computed_blocks given to allocate_slots (its `computed` "
           "argument), which makes the request hold them?" if hits_missing else "")
    )  # fmt: skip


@pytest.mark.schedule
def test_an_admitted_requests_cache_hits_cost_no_budget(impl):
    """The budget counts the tokens a step computes: a request's cache hits are not computed
    again, so an admission after a prefix hit leaves the rest of the budget to the queue."""
    kv = impl.KVCacheManager(num_blocks=16, block_size=4)
    scheduler = impl.Scheduler(kv, max_num_batched_tokens=10, max_num_seqs=8)
    a = request(impl, "a", range(100, 110))
    scheduler.add_request(a)
    step_done(scheduler.schedule().scheduled)  # a computed its 10 tokens: 2 full blocks named
    scheduler.add_request(request(impl, "b", list(range(100, 108)) + [1, 2, 3]))
    scheduler.add_request(request(impl, "c", range(300, 320)))
    out = scheduler.schedule()
    want = [("a", 1), ("b", 3), ("c", 6)]
    charged_whole = plan(out) == [("a", 1), ("b", 3)]
    assert plan(out) == want, (
        f"budget 10: a decodes (1 token), b's 11-token prompt finds 8 cached and computes 3, "
        f"and c gets the 6 left: expected {want}, got {plan(out)}."
        + (" c got nothing, as if b had cost its whole prompt (11 tokens, over what was left): "
           "is an admitted request charged for all its tokens, its cache hits included? It "
           "costs the tokens scheduled for it, num_new." if charged_whole else "")
    )  # fmt: skip


@pytest.mark.schedule
def test_the_engine_computes_exactly_the_prompt_positions_not_cached(impl, shipped):
    model, tokenizer = shipped
    shared = tokenizer.encode(PROMPTS[4])[:18]  # 4 full blocks of 4 and 2 tokens
    engine = impl.LLMEngine(model, tokenizer, num_blocks=64, block_size=4)
    impl.generate(engine, [shared + [10, 11, 12]], greedy(impl))
    before = engine.stats.prompt_tokens_computed
    second = shared + [20, 21, 22, 23, 24]
    impl.generate(engine, [second], greedy(impl))
    computed = engine.stats.prompt_tokens_computed - before
    assert computed == len(second) - 16, (
        f"the second prompt ({len(second)} tokens) shares 4 full blocks (16 tokens) with the "
        f"first: it should compute {len(second) - 16} prompt positions, computed {computed}"
    )


@pytest.mark.schedule
def test_requests_admitted_in_one_step_share_the_blocks_the_first_one_names(impl, shipped, hf):
    model, tokenizer = shipped
    shared = tokenizer.encode(PROMPTS[4])[:12]  # 3 full blocks of 4
    engine = impl.LLMEngine(model, tokenizer, num_blocks=64, block_size=4)
    engine.add_request("first", shared + [10, 11], greedy(impl))
    engine.add_request("second", shared + [20, 21, 22], greedy(impl))
    outputs = run_to_end(engine, max_steps=100)
    assert engine.stats.prompt_tokens_cached == 12, (
        f"both arrive before the first step: the second must find the first's 3 full blocks "
        f"(12 tokens), named when the first's blocks were allocated in that same step; it "
        f"found {engine.stats.prompt_tokens_cached}. Is the second admitted in the same step, "
        "after the first, with its cache hits looked up only then?"
    )
    for name, ids in [("first", shared + [10, 11]), ("second", shared + [20, 21, 22])]:
        want, problem = greedy_difference(hf, ids, outputs[name][-1].output_token_ids, 12)
        assert problem is None, f"request {name}: {problem} (shared blocks read wrongly?)"


@pytest.mark.schedule
def test_greedy_tokens_are_hfs_with_chunks_preemption_and_invariants(impl, shipped, hf):
    model, tokenizer = shipped
    engine = impl.LLMEngine(model, tokenizer, num_blocks=14, block_size=4,
                            max_num_batched_tokens=12, max_num_seqs=4)  # fmt: skip
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, greedy(impl))
    budget = []

    def check(engine):
        problems = invariant_problems(engine)
        assert not problems, "after a step: " + "; ".join(problems[:3])

    original = engine.scheduler.schedule

    def schedule_and_count():
        running = {r.request_id for r in engine.scheduler.running}
        out = original()
        plan = [(r.request_id, n, r.request_id in running) for r, n in out.scheduled]
        budget.append((out.num_tokens, plan))
        return out

    engine.scheduler.schedule = schedule_and_count
    outputs = run_to_end(engine, max_steps=400, check=check)
    most, plan = max(budget, key=lambda b: b[0])
    chunks = [(rid, n) for rid, n, was_running in plan if was_running and n > 1]
    assert most <= 12, (
        f"a step scheduled {most} tokens, the budget is 12: its plan {[p[:2] for p in plan]}."
        + (f" Running requests with chunks of more than one token ({chunks}, prompts read in "
           "chunks): does the budget go down by each running request's whole chunk, not by one "
           "token for each?" if chunks else "")
    )  # fmt: skip
    assert engine.stats.preemptions > 0, "(the test meant to preempt: 14 blocks for 5 requests)"
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt)
        got = outputs[str(i)][-1].output_token_ids
        want, problem = greedy_difference(hf, ids, got, 12)
        assert problem is None, (
            f"request {i} ({prompt!r:.30}), served beside 4 others with chunked prefill and "
            f"preemption: {problem}. HF alone: {want}, yours: {got}"
        )


# --------------------------------------------------------------------------- sample_requests


@pytest.mark.sample_requests
def test_sample_requests_makes_its_tensors_on_the_logits_device(impl):
    """Its argmax reads values, so it cannot run on the `meta` device: its source is read
    instead (tests/graded/_device.py)."""
    assert_made_on_the_inputs_device(impl.sample_requests, "sample_requests", "the logits")


def sampled_request(impl, ids, seed=None, **params):
    req = request(impl, f"r{seed}", ids)
    req.params = impl.SamplingParams(seed=seed, **params)
    if seed is not None:
        req.generator = torch.Generator().manual_seed(seed)
    return req


@pytest.mark.sample_requests
def test_greedy_rows_take_their_argmax_in_their_own_place(impl):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    reqs = [sampled_request(impl, [1, 2], temperature=0.0),
            sampled_request(impl, [3], seed=5, temperature=0.8),
            sampled_request(impl, [4, 5], temperature=0.0),
            sampled_request(impl, [6], temperature=0.0)]  # fmt: skip
    with recording(impl.sample_requests, "sample_next_token") as calls:
        try:
            got = impl.sample_requests(reqs, logits)
        except Exception:
            problem = sampler_input_problem(reqs, logits, calls, crashed=True)
            if problem:
                pytest.fail(problem)
            raise
    problem = sampler_input_problem(reqs, logits, calls)
    assert not problem, problem
    assert isinstance(got, list) and len(got) == len(reqs), (
        f"{len(reqs)} requests (3 greedy, 1 sampled), and sample_requests returned "
        + (f"a list of {len(got)} tokens" if isinstance(got, list) else type(got).__name__)
        + ": one token per request is expected, request i's at index i, each in its own "
        "request's place. Does a list that already has one place per request get more tokens "
        "appended, where each result belongs in its own place?"
    )
    odd = [(i, t) for i, t in enumerate(got) if type(t) is not int]
    assert not odd, (
        f"return one int per request (a Python int); request {odd[0][0]}'s is {odd[0][1]!r} "
        f"({type(odd[0][1]).__name__}): "
        + (
            f"that is the largest LOGIT of request {odd[0][0]}'s row, not its index: max gives "
            "(values, indices), and the token is the index (argmax)."
            if isinstance(odd[0][1], float)
            and abs(odd[0][1] - float(logits[odd[0][0]].max())) < 1e-6
            else "an extra axis (keepdim) or a tensor not turned into an int?"
        )
    )
    over_requests = logits[[0, 2, 3]].argmax(dim=0)[:3].tolist()  # argmax down the columns
    assert [got[i] for i in (0, 2, 3)] != over_requests, (
        f"requests 0, 2 and 3 are greedy: their tokens should be the argmax of their rows, "
        f"{[int(logits[i].argmax()) for i in (0, 2, 3)]}, got {[got[i] for i in (0, 2, 3)]}: "
        "the first argmaxes down the columns. The argmax was taken over the requests axis "
        "(dim 0): take it over the vocabulary axis, the last."
    )
    for i in (0, 2, 3):
        assert got[i] == int(logits[i].argmax()), (
            f"request {i} is greedy: its token is the argmax of ITS row "
            f"({int(logits[i].argmax())}), got {got[i]}. Are the greedy results written back "
            "at their requests' indices, each in its own request's place, and the sampled ones "
            "too? An index that counts the sampled requests alone (enumerated after the greedy "
            "ones were filtered out) reads another request's row and writes over another "
            "request's place."
        )
    assert len(got) == 4 and all(isinstance(t, int) for t in got), (
        "return one int per request, in the requests' order"
    )


def penalised_argmax(row: torch.Tensor, text: list[int], penalty: float) -> int:
    """Greedy with a frequency penalty, by hand: each token's logit less penalty times its
    count in `text`, then the argmax."""
    counts = torch.bincount(torch.tensor(text, dtype=torch.long), minlength=row.numel())
    return int((row - penalty * counts).argmax())


@pytest.mark.sample_requests
def test_a_greedy_request_with_a_penalty_counts_its_own_text(impl):
    logits = torch.zeros(3, 10)
    logits[:, 3], logits[:, 4] = 2.0, 1.6
    texts = [([7], [3, 3]), ([3, 3, 3, 3], []), ([4, 4], [])]  # (prompt, output) of each
    reqs = []
    for prompt, output in texts:
        req = sampled_request(impl, prompt, temperature=0.0, frequency_penalty=0.5)
        req.output_token_ids = list(output)
        reqs.append(req)
    with recording(impl.sample_requests, "sample_next_token") as both:
        got = impl.sample_requests(reqs, logits)
    problem = sampler_input_problem(reqs, logits, both)
    assert not problem, problem
    calls = [kwargs for _, kwargs in both]
    penalties = [kwargs.get("frequency_penalty", 0.0) for kwargs in calls]

    def each(text_of) -> list[int]:
        return [penalised_argmax(logits[i], text_of(i), 0.5) for i in range(3)]

    want = each(lambda i: texts[i][0] + texts[i][1])  # [4, 4, 3]
    if len(calls) == 3 and not any(penalties):
        plain = (" Those are the plain argmax of each row: sample_next_token was called for each "
                 "request, but without its frequency_penalty. Pass it all of the request's "
                 "settings (request.params.sampling_kwargs() has them).")  # fmt: skip
    else:
        plain = (" Those are the plain argmax of each row: a greedy request with a frequency "
                 "penalty is not a plain argmax (its penalty changes its logits first), so it "
                 "goes through sample_next_token with its text.")  # fmt: skip
    mistakes = [
        ([int(row.argmax()) for row in logits], plain),
        (each(lambda i: texts[i][0]), " The penalty counted each request's prompt alone."),
        (each(lambda i: texts[i][1]), " The penalty counted each request's output alone."),
        (each(lambda i: texts[0][0] + texts[0][1]), " Every row's penalty counted the FIRST "
         "request's text: row i's penalty counts request i's text only."),
    ]  # fmt: skip
    assert got == want, (
        f"three greedy requests with a frequency penalty of 0.5, each counting its own tokens, "
        f"prompt and output (request.all_token_ids): expected {want}, got {got}."
        + next((message for tokens, message in mistakes if got == tokens), "")
    )


@pytest.mark.sample_requests
def test_a_seeded_request_draws_the_same_alone_and_in_any_batch(impl):
    logits = torch.randn(6, 60, generator=torch.Generator().manual_seed(4))
    settings = [dict(temperature=0.9), dict(temperature=1.2, top_k=10), dict(top_p=0.7),
                dict(temperature=0.8, frequency_penalty=0.4), dict(temperature=0.0),
                dict(temperature=1.0, top_k=1)]  # fmt: skip

    seeds = [0, 11, 12, 13, 14, 15]  # 0 is a seed like any other

    def make():
        return [sampled_request(impl, [i, 2 * i], seed=seeds[i], **s)
                for i, s in enumerate(settings)]  # fmt: skip

    torch.manual_seed(1)  # a draw from the global generator instead is then the same each run
    alone = [impl.sample_requests([r], logits[i : i + 1])[0] for i, r in enumerate(make())]

    def chapter_3(i: int, row: torch.Tensor) -> int:
        """Chapter 3's draw for request i from `row`, with its text and its own generator."""
        ids = torch.tensor([make()[i].all_token_ids])
        generator = torch.Generator().manual_seed(seeds[i])
        return int(impl.sample_next_token(ids, row, generator=generator, **settings[i])[0])

    wants = [chapter_3(i, logits[i : i + 1]) for i in range(len(seeds))]
    differ = [i for i in range(len(seeds)) if alone[i] != wants[i]]
    if differ:
        i, s = differ[0], settings[differ[0]]
        if alone[i] == chapter_3(i, logits[i : i + 1].softmax(-1)):
            why = (". That is what it gives when handed the row's softmax: it takes the logits "
                   "(it applies the temperature, top-k and top-p to them and makes the "
                   "probabilities itself), not probabilities.")  # fmt: skip
        elif differ == [seeds.index(0)]:
            why = (". Only the request seeded 0 draws differently: a seed of 0 is a seed. Is the "
                   "request's generator used only when its seed is true (0 is false in Python), "
                   "not whenever it has one?")  # fmt: skip
        else:
            why = (f". Requests {differ} (seeds {[seeds[k] for k in differ]}) all draw "
                   "differently from their own generators: does it draw with each request's "
                   "generator (request.generator), handed to sample_next_token?")  # fmt: skip
        raise AssertionError(
            f"request {i} ({s}, seeded {seeds[i]}) alone: chapter 3's sample_next_token with its "
            f"text, its row and its own generator (request.generator) gives {wants[i]}, yours "
            f"{alone[i]}{why}"
        )
    reqs = make()
    order = [3, 0, 5, 2, 4, 1]
    batch = impl.sample_requests([reqs[i] for i in order], logits[order])
    in_batch = [batch[order.index(i)] for i in range(6)] if len(batch) == 6 else None
    assert in_batch == alone, (
        f"six requests, each seeded, in the order {order}: alone they draw {alone}, in the "
        f"batch {in_batch if in_batch is not None else batch}."
        + (row_mistake(impl, make, logits, order, alone, in_batch)
           or batch_mistake(alone, in_batch, settings))
    )  # fmt: skip


def row_mistake(impl, make, logits, order, alone, in_batch) -> str:
    """Whether the requests that drew differently in the batch each drew from one row of the
    batch's logits that is not their own (the last, the first): each request alone, on that
    row, with a fresh copy of its generator."""
    if in_batch is None:
        return ""
    diff = [i for i in range(len(alone)) if in_batch[i] != alone[i]]
    rows = logits[order]
    for j, name in ((len(order) - 1, "the last"), (0, "the first")):
        drawn = {i: impl.sample_requests([make()[i]], rows[j : j + 1])[0] for i in diff}
        if diff and all(drawn[i] == in_batch[i] for i in diff):
            return (
                f" Requests {diff} drew what they draw alone from {name} row of the batch's "
                "logits: request i's token comes from row i, its own."
            )
    return ""


def batch_mistake(alone: list[int], in_batch: list[int] | None, settings: list[dict]) -> str:
    """How the batch's tokens differ from each request's alone: the length, rows mixed up,
    rows left at a starting value, or draws that depend on the neighbours."""
    if in_batch is None:
        return " Return one token per request, in the requests' order."
    diff = [i for i in range(len(alone)) if in_batch[i] != alone[i]]
    which = f" Requests {diff} ({[settings[i] for i in diff]}) differ."
    borrowed = [i for i in diff if in_batch[i] in alone[:i] + alone[i + 1 :]]
    if len(borrowed) == len(diff):
        return which + (
            " Each got a token another request draws alone: is request i's row of the logits "
            "row i, and does each token go back to its own request's place?"
        )
    if len({in_batch[i] for i in diff}) == 1 and (len(diff) > 1 or in_batch[diff[0]] in (0, -1)):
        return which + (
            f" Each got token {in_batch[diff[0]]}: were their rows skipped, left at the "
            "starting value of the list?"
        )
    return which + (
        " Each request draws with its own generator (request.generator) and its own settings: "
        "its token must not depend on which requests share the step, nor on their order."
    )


class recording:
    """`with recording(fn, name) as calls`: like `spying`, each call's (args, kwargs)."""

    def __init__(self, fn, name: str):
        self.globals, self.name, self.calls = getattr(fn, "__globals__", {}), name, []

    def __enter__(self) -> list[tuple[tuple, dict]]:
        self.real = self.globals.get(self.name)
        if self.real is not None:

            def record(*args, **kwargs):
                self.calls.append((args, kwargs))
                return self.real(*args, **kwargs)

            self.globals[self.name] = record
        return self.calls

    def __exit__(self, *exc) -> None:
        if self.real is not None:
            self.globals[self.name] = self.real


def sampler_input_problem(reqs, logits, calls, crashed: bool = False) -> str:
    """What sample_requests handed chapter 3's sample_next_token that is not request k's own
    text and row: the calls are matched to the requests that sample (in order), or to every
    request where there is one call for each. The text is checked where the request has a
    penalty (without one, any text gives the same draw), or where the sampler crashed."""
    sampling = [k for k, r in enumerate(reqs)
                if r.params.temperature != 0 or r.params.frequency_penalty != 0]  # fmt: skip
    owners = list(range(len(reqs))) if len(calls) == len(reqs) else sampling
    for (args, kwargs), k in zip(calls, owners, strict=False):
        ids = args[0] if args else kwargs.get("input_ids")
        row = args[1] if len(args) > 1 else kwargs.get("logits")
        text = reqs[k].all_token_ids
        counted = crashed or reqs[k].params.frequency_penalty != 0
        if counted and isinstance(ids, torch.Tensor) and ids.flatten().tolist() != list(text):
            given = [int(t) for t in ids.flatten().tolist()]
            return (
                f"request {k} samples (temperature {reqs[k].params.temperature}, frequency "
                f"penalty {reqs[k].params.frequency_penalty}): sample_next_token was given the "
                f"text {given}, and its whole text is {list(text)} (prompt "
                f"{list(reqs[k].prompt_token_ids)}, output {list(reqs[k].output_token_ids)}). "
                "The penalty must count the "
                "request's whole text, prompt and output, every token of it."
                + " ".join(
                    [""]
                    + [
                        words
                        for words, tokens in [
                            ("That is its prompt alone.", list(reqs[k].prompt_token_ids)),
                            (
                                "That is its output alone"
                                + (
                                    ", or its text with its last token left out."
                                    if list(reqs[k].output_token_ids) == list(text)[:-1]
                                    else "."
                                ),
                                list(reqs[k].output_token_ids),
                            ),
                            ("That is its text with its last token left out.", list(text)[:-1]),
                        ]
                        if given == tokens
                    ][:1]
                )
                + (
                    " (An empty list makes a float tensor: that is where a complaint about a "
                    "float dtype comes from.)"
                    if not given
                    else ""
                )
            )
        if not isinstance(row, torch.Tensor) or row.numel() != logits[k].numel():
            continue
        row, own = row.detach().flatten().double(), logits[k].double()
        t = reqs[k].params.temperature
        if not row.isfinite().all():
            return (
                f"request {k} (temperature {t}): the row handed to sample_next_token holds "
                f"{'NaN' if row.isnan().any() else 'inf'}, where its logits are finite"
                + (
                    ": divided by a temperature of 0? sample_next_token applies the temperature "
                    "itself (0 means greedy there); the row goes to it as it came."
                    if t == 0
                    else "."
                )
            )
        if t not in (0, 1) and torch.allclose(row, own / t) and not torch.allclose(row, own):
            return (
                f"request {k} (temperature {t}): the row handed to sample_next_token is its "
                f"logits already divided by {t}, and sample_next_token divides by the "
                "temperature itself: the temperature is applied twice (the draws follow "
                f"temperature {t}**2 = {t * t:.3g}). Hand it the request's logits as they are."
            )
    return ""


@pytest.mark.sample_requests
def test_each_request_draws_on_from_step_to_step(impl):
    """Two steps in a row. A seeded request's generator is made once, by the engine: its second
    draw continues its first. An unseeded one (generator None) draws from PyTorch's global
    generator, as chapter 3's sampler does with generator=None."""
    logits = torch.zeros(1, 40)  # every token as likely: each draw is the generator's own
    settings = dict(temperature=1.0)

    def by_chapter_3(ids, generator) -> list[int]:
        return [int(impl.sample_next_token(torch.tensor([ids]), logits, generator=generator,
                                           **settings)[0]) for _ in range(2)]  # fmt: skip

    want = by_chapter_3([1, 2], torch.Generator().manual_seed(7))
    req = sampled_request(impl, [1, 2], seed=7, **settings)
    got = [impl.sample_requests([req], logits)[0] for _ in range(2)]
    again = [by_chapter_3([1, 2], torch.Generator().manual_seed(7))[0]] * 2
    assert got == want, (
        f"a request seeded 7, sampled in two steps: chapter 3's sampler with one generator "
        f"seeded 7, drawing twice, gives {want}, yours {got}."
        + (" Both steps drew what a generator freshly seeded 7 draws first: was a new generator "
           "made, and seeded, at each step? The engine made request.generator once, when the "
           "request was added; each step draws on from where the last left it." if got == again
           else " Does it draw with request.generator?")
    )  # fmt: skip
    unseeded = [sampled_request(impl, [3], **settings) for _ in range(4)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        want = by_chapter_3([3], None) + by_chapter_3([3], None)
        torch.manual_seed(11)
        got = impl.sample_requests(unseeded[:2], logits.expand(2, -1))
        got += impl.sample_requests(unseeded[2:], logits.expand(2, -1))
    assert got == want, (
        f"four unseeded requests (request.generator is None), two per step, with PyTorch's "
        f"global generator seeded 11: chapter 3's sampler with generator=None draws {want}, "
        f"yours {got}. An unseeded request draws from the global generator (generator=None)."
        + (" Each drew the same token: was a new generator made for an unseeded request? A "
           "generator made without a seed starts from the same fixed seed every time."
           if len(set(got)) == 1 else "")
    )  # fmt: skip


def warped(logits: torch.Tensor, **params) -> torch.Tensor:
    """The probabilities HF's logits warpers give (the oracle chapter 3 is graded against)."""
    warpers = [TemperatureLogitsWarper(params.get("temperature", 1.0))]
    if "top_k" in params:
        warpers.append(TopKLogitsWarper(params["top_k"]))
    if "top_p" in params:
        warpers.append(TopPLogitsWarper(params["top_p"]))
    scores = logits.clone()
    for warper in warpers:
        scores = warper(torch.zeros(1, 1, dtype=torch.long), scores)
    return scores[0].softmax(-1)


@pytest.mark.sample_requests
@pytest.mark.parametrize(
    "params", [dict(temperature=0.7, top_k=6), dict(temperature=1.3, top_p=0.6)], ids=str
)
def test_the_first_tokens_follow_the_exact_distribution(impl, params):
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(5)) * 2
    n = N_SAMPLES // 4
    reqs = [sampled_request(impl, [1], seed=s, **params) for s in range(n)]
    samples = torch.tensor(impl.sample_requests(reqs, logits.expand(n, -1)))
    assert_samples_follow(
        samples,
        warped(logits, **params),
        f"first tokens of {n} requests with {params}, each "
        "seeded: are all of the request's settings passed to sample_next_token?",
    )
