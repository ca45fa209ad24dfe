"""The model runner: one forward pass over every scheduled token of every request, reading and
writing keys and values through block tables (nano-vllm's `model_runner.py`, in PyTorch).

A step's tokens are not a rectangle. One request feeds a prompt chunk of 37 tokens, thirty
others one token each; padding them to a [batch, longest] rectangle would waste most of the
arithmetic. So the tokens are laid end to end, [T] (vLLM's "flattened" batch), and everything
that does not mix positions (embeddings, layer norms, the MLP, the projections) runs on the
T rows as they are. Only attention mixes positions, and only within a request: there each
request's queries meet its own keys, gathered from its blocks.

Where a token's key goes: position p of a request lives in block `block_table[p // block_size]`
at offset `p % block_size`, which is row `block * block_size + offset` of the layer's cache
viewed as [num_blocks * block_size, n_kv_heads, d_head]: its **slot**. (A block holds a layer's
key/value heads: GPT-2 has one per query head, chapter 7's model fewer, n_kv_heads.)
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions.attention import Attention
from solutions.model import DemoTransformer


@dataclass
class PagedKVCache:
    """Per layer, keys and values for every block: [num_blocks, block_size, n_kv_heads, d_head]
    each (vLLM's per-block layout; vLLM stacks the two in one tensor per layer)."""

    keys: list[Tensor]
    values: list[Tensor]

    @classmethod
    def allocate(cls, model: nn.Module, num_blocks: int, block_size: int) -> "PagedKVCache":
        cfg, weight = model.cfg, model.embed.W_E
        shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.d_head)

        def zeros():
            return torch.zeros(shape, device=weight.device, dtype=weight.dtype)

        return cls([zeros() for _ in range(cfg.n_layers)], [zeros() for _ in range(cfg.n_layers)])

    @property
    def block_size(self) -> int:
        return self.keys[0].shape[1]

    @staticmethod
    def bytes_per_block(model: nn.Module, block_size: int) -> int:
        """The memory one block takes: keys and values of `block_size` positions in every layer,
        2 * n_layers * block_size * n_kv_heads * d_head numbers of the model's dtype."""
        cfg = model.cfg
        numbers = 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.d_head
        return numbers * model.embed.W_E.element_size()

    @classmethod
    def blocks_for_bytes(cls, model: nn.Module, kv_bytes: int, block_size: int) -> int:
        """How many blocks `kv_bytes` of memory hold for this model (vLLM sizes its pool the same
        way: the memory left for the cache over the bytes of one block)."""
        return kv_bytes // cls.bytes_per_block(model, block_size)


@dataclass
class StepInputs:
    """One step's flattened batch: R requests, T tokens in all."""

    token_ids: Int[Tensor, "T"]
    positions: Int[Tensor, "T"]  # each token's position in its own request
    slot_mapping: Int[Tensor, "T"]  # where each token's key and value are written
    query_start: Int[Tensor, "R_plus_1"]  # request r's tokens are [query_start[r], [r + 1])
    block_tables: Int[Tensor, "R B"]  # request r's blocks, in order (padded with block 0)
    context_lens: Int[Tensor, "R"]  # positions request r can read after this step's writes


def slots_of(block_table: list[int], positions: range, block_size: int) -> list[int]:
    """The slot of each position, through the block table."""
    # BEGIN SOLUTION
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]
    # END SOLUTION


def prepare_inputs(
    scheduled: list[tuple[list[int], int, int, list[int]]], block_size: int, device=None
) -> "StepInputs":  # defined just below it in the notebook
    """`scheduled`: per request (its token ids, num_computed, num_new, block table). The step
    feeds tokens [num_computed, num_computed + num_new) of each."""
    token_ids, positions, slot_mapping, starts, lens, tables = [], [], [], [0], [], []
    for tokens, num_computed, num_new, table in scheduled:
        new = range(num_computed, num_computed + num_new)
        if len(table) * block_size < new.stop:
            covered = len(table) * block_size
            raise ValueError(
                f"a block table of {len(table)} blocks of {block_size} covers {covered} positions, "
                f"and the step writes up to position {new.stop - 1}: the table must cover every "
                "token scheduled (allocate_slots counts the blocks)"
            )
        token_ids += tokens[new.start : new.stop]
        positions += list(new)
        slot_mapping += slots_of(table, new, block_size)
        starts.append(starts[-1] + num_new)
        lens.append(new.stop)
        tables.append(table[: -(-new.stop // block_size)])  # the blocks it reads
    longest = max(map(len, tables))
    padded = [t + [0] * (longest - len(t)) for t in tables]  # block 0: read, then masked out

    def tensor(x):
        return torch.tensor(x, dtype=torch.long, device=device)

    return StepInputs(
        token_ids=tensor(token_ids),
        positions=tensor(positions),
        slot_mapping=tensor(slot_mapping),
        query_start=tensor(starts),
        block_tables=tensor(padded),
        context_lens=tensor(lens),
    )


def attend(
    queries: Float[Tensor, "G Q n_heads d_head"],
    keys: Float[Tensor, "num_blocks block_size n_heads d_head"],
    values: Float[Tensor, "num_blocks block_size n_heads d_head"],
    block_tables: Int[Tensor, "G B"],
    query_pos: Int[Tensor, "G Q"],
) -> Float[Tensor, "G Q n_heads d_head"]:
    """G requests with Q queries each: gather each one's blocks through its table, whole blocks
    at a time, into the layout attention reads fastest, [G, n_heads, B * block_size, d_head];
    each query reads the positions up to its own (the rest of its last block is masked out)."""
    # BEGIN SOLUTION
    G, B = block_tables.shape
    blocks = block_tables.flatten()

    def gather(cache):
        rows = cache.index_select(0, blocks).view(G, B * cache.shape[1], *cache.shape[2:])
        return rows.transpose(1, 2).contiguous()

    key_pos = torch.arange(B * keys.shape[1], device=queries.device)
    allowed: Bool[Tensor, "G Q L"] = key_pos[None, None, :] <= query_pos[:, :, None]
    z = F.scaled_dot_product_attention(
        queries.transpose(1, 2), gather(keys), gather(values), attn_mask=allowed[:, None]
    )
    return z.transpose(1, 2)
    # END SOLUTION


def gather_blocks(
    cache: Float[Tensor, "num_blocks block_size heads d_head"], block_tables: Int[Tensor, "G B"]
) -> Float[Tensor, "G heads L d_head"]:
    """Each request's blocks, in table order, as its keys (or values), heads first. Picking blocks
    through a table cannot be a view: `index_select` copies them, whole blocks, into
    [G * B, block_size, heads, d_head]. Putting the heads first needs no second copy: the
    result is a strided view of that one copy (position p of request g is index p of axis 2)."""
    G, B = block_tables.shape
    picked = cache.index_select(0, block_tables.flatten())
    return picked.view(G, B * cache.shape[1], *cache.shape[2:]).transpose(1, 2)


def readable(query_pos: Int[Tensor, "G Q"], length: int) -> Bool[Tensor, "G 1 Q L"]:
    """Which of `length` key positions each query may read: its own and those before it (the
    rest of a partly filled last block, and padding blocks, are masked out). One mask for every
    head."""
    return (torch.arange(length, device=query_pos.device) <= query_pos[..., None])[:, None]


def attend_strided(
    queries: Float[Tensor, "G Q n_heads d_head"],
    keys: Float[Tensor, "num_blocks block_size n_heads d_head"],
    values: Float[Tensor, "num_blocks block_size n_heads d_head"],
    block_tables: Int[Tensor, "G B"],
    query_pos: Int[Tensor, "G Q"],
) -> Float[Tensor, "G Q n_heads d_head"]:
    """`attend`, one copy fewer: the attention function reads a strided view (any strides, as
    long as each head's d_head numbers lie side by side), so the blocks are read where
    `gather_blocks`'s one copy left them. With fewer key/value heads than query heads (chapter
    7's grouped-query attention), each group of query heads reads its key/value head where it
    lies (`enable_gqa`), without chapter 7's copy of each head for its group (`expand_kv`)."""
    k, v = gather_blocks(keys, block_tables), gather_blocks(values, block_tables)
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2), k, v, attn_mask=readable(query_pos, k.shape[2]),
        enable_gqa=k.shape[1] != queries.shape[2],
    )  # fmt: skip
    return out.transpose(1, 2)


@dataclass
class AttentionGroup:
    """Requests attended in one call: their rows of the flattened batch, [G, Q] (a decode's
    one row, or a chunk's rows), their first B blocks and each query's position."""

    rows: Int[Tensor, "G Q"]
    block_tables: Int[Tensor, "G B"]
    query_pos: Int[Tensor, "G Q"]


def attention_groups(inputs: StepInputs, block_size: int, bucket: int = 2) -> list[AttentionGroup]:
    """How the step's requests are attended, decided once a step for every layer. Decodes (one
    query each) are attended together, in groups of requests whose tables have about as many
    blocks (rounded up to a multiple of `bucket`): a group reads B blocks for each of its
    requests, its longest table's, so a short request beside a long one would read the long
    one's padding. Each prompt chunk is attended alone."""
    counts = inputs.query_start.diff().tolist()
    starts, lens = inputs.query_start.tolist(), inputs.context_lens.tolist()
    device = inputs.query_start.device
    by_size: dict[int, list[int]] = {}
    groups = []
    for r, count in enumerate(counts):
        B = -(-lens[r] // block_size)
        if count == 1:
            by_size.setdefault(-(-B // bucket) * bucket, []).append(r)
            continue
        rows = torch.arange(starts[r], starts[r] + count, device=device)
        groups.append(AttentionGroup(rows[None], inputs.block_tables[r : r + 1, :B],
                                     inputs.positions[rows][None]))  # fmt: skip
    for size in sorted(by_size):
        decodes = torch.tensor(by_size[size], device=device)
        B = -(-max(lens[r] for r in by_size[size]) // block_size)
        rows = inputs.query_start[decodes]
        groups.append(AttentionGroup(rows[:, None], inputs.block_tables[decodes, :B],
                                     inputs.positions[rows][:, None]))  # fmt: skip
    return groups


def fused_qkv(
    attn: Attention,
) -> tuple[Float[Tensor, "d_model three_H_d_head"], Float[Tensor, "three_H_d_head"]]:
    """The three projections as one matrix and one bias (vLLM's QKVParallelLinear), so that a
    step's queries, keys and values are one matrix product: [T, 3 * H * d_head]."""
    d_model = attn.W_Q.shape[1]
    W_QKV = torch.cat([attn.W_Q, attn.W_K, attn.W_V]).transpose(0, 1).reshape(d_model, -1)
    return W_QKV, torch.cat([attn.b_Q, attn.b_K, attn.b_V]).flatten()


def write_slots(
    keys: Float[Tensor, "num_blocks block_size heads d_head"],
    values: Float[Tensor, "num_blocks block_size heads d_head"],
    slot_mapping: Int[Tensor, "T"],
    k: Float[Tensor, "T heads d_head"],
    v: Float[Tensor, "T heads d_head"],
) -> None:
    """Each new token's key and value into its slot of one layer's cache (`flatten` of the
    cache is a view of it: the writes land in the blocks)."""
    keys.flatten(0, 1)[slot_mapping] = k
    values.flatten(0, 1)[slot_mapping] = v


def paged_attention(
    attn: Attention,
    x: Float[Tensor, "T d_model"],
    keys: Float[Tensor, "num_blocks block_size n_heads d_head"],
    values: Float[Tensor, "num_blocks block_size n_heads d_head"],
    inputs: StepInputs,
    groups: list[AttentionGroup],
    attention=None,
    qkv: tuple[Tensor, Tensor] | None = None,
) -> Float[Tensor, "T d_model"]:
    """Attention for the step's T tokens: write their keys and values to their slots, then
    let each request's queries read its own positions, up to their own, group by group
    (`attention`: any function with `attend`'s contract; `attend` if None). `qkv`: the layer's
    `fused_qkv`, made once by a caller that runs many steps; made here if None."""
    attention = attend if attention is None else attention
    T, (H, d_model, d_head) = x.shape[0], attn.W_Q.shape
    W_QKV, b_QKV = fused_qkv(attn) if qkv is None else qkv
    q, k, v = torch.addmm(b_QKV, x, W_QKV).view(T, 3, H, d_head).unbind(1)
    write_slots(keys, values, inputs.slot_mapping, k, v)
    z = torch.empty_like(q)
    for g in groups:
        z[g.rows] = attention(q[g.rows], keys, values, g.block_tables, g.query_pos)
    return torch.addmm(attn.b_O, z.view(T, H * d_head), attn.W_O.view(H * d_head, d_model))


def forward_paged(
    model: DemoTransformer,
    keys_values: PagedKVCache,
    inputs: StepInputs,
    logits_at: Int[Tensor, "S"],
    attention=None,
    qkv: list[tuple[Tensor, Tensor]] | None = None,
) -> Float[Tensor, "S d_vocab"]:
    """The logits at rows `logits_at` of the flattened batch (the last token of each request
    that samples in this step; a prefill chunk that does not reach its prompt's end samples
    nothing and needs no unembedding). `attention`: `attend` if None, or `attend_strided`;
    `qkv`: each layer's `fused_qkv`, or None to make them in this call."""
    groups = attention_groups(inputs, keys_values.block_size)
    qkv = [None] * len(model.blocks) if qkv is None else qkv
    residual = model.embed(inputs.token_ids[None])[0] + model.pos_embed.W_pos[inputs.positions]
    layers = zip(model.blocks, keys_values.keys, keys_values.values, qkv, strict=True)
    for block, keys, values, fused in layers:
        x = block.ln1(residual)
        residual = residual + paged_attention(
            block.attn, x, keys, values, inputs, groups, attention, fused
        )
        residual = residual + block.mlp(block.ln2(residual))
    return model.unembed(model.ln_final(residual[logits_at]))
