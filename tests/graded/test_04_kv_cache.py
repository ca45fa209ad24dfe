"""Chapter 4: the KV cache, graded against transformer-lens activations, HF GPT-2's logits and
`generate`, HF's tokenizer padding and logits warpers (exact probabilities for sampled batches),
and (for sampling under a seed) chapter 3's uncached sampler, itself graded against HF.

"Equal to the uncached model" is checked in float64, where rounding is ~1e-14 and a bound of
1e-5 leaves no room for a real mistake; against HF (float32) the bound is 1e-4 as in chapter 1.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._oracles import (
    BATCH_PROMPTS,
    BEAM_SCORE_ATOL,
    PROMPT,
    assert_close_f32,
    close_f32,
    hf_beam_search,
    hf_greedy,
    hf_window_greedy,
)
from tests.support import ALPHA, assert_samples_follow

CHAPTER = "04_kv_cache"

PAD_ID = 1000
"""The padding id of the padded tests that choose one: neither 0 nor end-of-text (also 0 in this
vocabulary), so that code which pads with a constant, or finds padding by its id rather than by
the mask, is caught."""


def ids_of(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tests' own left padding, written out (the learner's `left_pad` is graded apart)."""
    width = max(map(len, rows))
    tokens = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return tokens, mask


def show(tokenizer, token: int) -> str:
    return f"{tokenizer.decode([token])!r} (id {token})"


def first_difference(expected: list[int], got: list[int]) -> int | None:
    """The first index where two texts of token ids (prompt, then continuation) differ, or None."""
    for k in range(min(len(expected), len(got))):
        if expected[k] != got[k]:
            return k
    return None if len(expected) == len(got) else min(len(expected), len(got))


def new_tokens(n: int) -> str:
    return f"{n} new token" + ("" if n == 1 else "s")


def agreed(step: int) -> str:
    if step == 0:
        return "the very first new token differs"
    return "the first new token agrees" if step == 1 else f"the first {step} new tokens agree"


def describe_difference(tokenizer, expected: list[int], got: list[int] | str, n_prompt: int) -> str:
    """Where `got` (token ids, or a decoded text) first leaves `expected` (the prompt's ids, then
    the continuation's), in words: the step (0 is the first new token) and the tokens there."""
    n_expected = len(expected) - n_prompt
    if isinstance(got, str):
        prompt = tokenizer.decode(expected[:n_prompt])
        if not got.startswith(prompt):
            return f"the text does not start with its prompt {prompt!r}: it starts {got[:60]!r}"
        for k in range(n_prompt, len(expected)):
            if not got.startswith(tokenizer.decode(expected[: k + 1])):
                head = tokenizer.decode(expected[:k])
                rest = got[len(head) :] if got.startswith(head) else got[len(prompt) :]
                step = k - n_prompt
                if not rest:
                    return (
                        f"yours stops after {new_tokens(step)}; the expected text goes on with "
                        f"{show(tokenizer, expected[k])} ({new_tokens(n_expected)} in all)"
                    )
                return (
                    f"{agreed(step)}: new token {step} should be "
                    f"{show(tokenizer, expected[k])}, yours continues {rest[:30]!r}"
                )
        extra = got[len(tokenizer.decode(expected)) :]
        return (
            f"the expected text ends after {new_tokens(n_expected)}; yours goes on with "
            f"{extra[:30]!r}"
        )
    k = first_difference(expected, got)
    if k is None:
        return "the texts are equal"
    if k < n_prompt:
        return f"the prompt itself changed at its token {k}: return the prompt, then the new tokens"
    step = k - n_prompt
    if k == len(got):
        return (
            f"yours stops after {new_tokens(step)}; the expected text goes on with "
            f"{show(tokenizer, expected[k])} ({new_tokens(n_expected)} in all)"
        )
    if k == len(expected):
        return (
            f"the expected text ends after {new_tokens(step)}; yours goes on with "
            f"{show(tokenizer, got[k])}"
        )
    return (
        f"{agreed(step)}: new token {step} should be {show(tokenizer, expected[k])}, yours is "
        f"{show(tokenizer, got[k])}"
    )


def end_of_text_hint(tokenizer, expected: str, got: str) -> str:
    """The likely mistake when a batched text ends in the wrong place, or ""."""
    eos = tokenizer.eos_token
    if expected.endswith(eos) and got == expected[: -len(eos)]:
        return (
            " Its end-of-text token is missing: feed it as a real token (attention_mask True) "
            "and mark the row done only after that step."
        )
    if len(got) < len(expected) and expected.startswith(got):
        return " It stopped early: the batch goes on until EVERY row is done (done.all())."
    return ""


# --------------------------------------------------------------------------- causal_mask


@pytest.mark.causal_mask
def test_causal_mask_is_made_on_the_device_it_is_given(impl):
    """On a GPU, a mask made on the CPU meets scores on the GPU and the attention fails there;
    PyTorch's `meta` device (shapes, no data) shows the same here, with no GPU."""
    try:
        mask = impl.causal_mask(3, 5, device=torch.device("meta"))
    except TypeError as err:
        pytest.fail(f"causal_mask(n_query, n_key, device=...) must take a device: {err}")
    assert mask.device.type == "meta", (
        f"causal_mask(3, 5, device=meta) made its mask on {mask.device}: pass device= to the "
        "tensor you create (torch.ones(..., device=device)), or on a GPU the mask stays on the "
        "CPU while the scores are on the GPU"
    )


@pytest.mark.causal_mask
# (3, 10) before (1, 9): one query cannot tell a mask the wrong way round from a diagonal moved
# the wrong way, three can.
@pytest.mark.parametrize("n_query,n_key", [(1, 1), (4, 4), (3, 10), (1, 9), (5, 7)])
def test_causal_mask_hides_the_keys_after_each_query(impl, n_query, n_key):
    mask = impl.causal_mask(n_query, n_key)
    offset = n_key - n_query
    expected = torch.tensor(
        [[k > offset + q for k in range(n_key)] for q in range(n_query)], dtype=torch.bool
    )
    assert mask.shape == (n_query, n_key), (
        f"expected shape ({n_query}, {n_key}), got {tuple(mask.shape)}"
    )
    assert mask.dtype == torch.bool, f"expected a bool mask, got {mask.dtype}"
    if n_query < n_key and torch.equal(mask, torch.triu(torch.ones_like(mask), diagonal=1)):
        pytest.fail(
            "This is chapter 1's mask: with a cache, the queries are the LAST n_query positions, "
            "so query i sits at position n_key - n_query + i. Shift the diagonal."
        )
    moved_left = torch.triu(torch.ones_like(mask), diagonal=1 - offset)
    if n_query > 1 and offset > 0 and torch.equal(mask, moved_left):
        pytest.fail(
            f"{n_query} queries after {offset} cached positions: your diagonal moved {offset} "
            f"places LEFT, so each query is hidden from keys before its own position. Query i "
            f"sits at position {offset} + i: the diagonal moves RIGHT by the number of cached "
            "positions. Is the offset's sign the wrong way round?"
        )
    own_key = torch.arange(n_key)[None, :] == offset + torch.arange(n_query)[:, None]
    inverted, own_hidden = torch.equal(mask, ~expected), torch.equal(mask, expected | own_key)
    if inverted and own_hidden:  # one query, one key: both mistakes give [[True]]
        pytest.fail(
            "one query and one key: your mask hides the query from its own key. causal_mask "
            "is True where a key is hidden, and only a key AFTER its query is: is yours True "
            "where attention is allowed, or does it hide each query's own key too?"
        )
    if inverted:
        pytest.fail(
            "your mask is True where attention is ALLOWED: causal_mask is True where a key is "
            "hidden from its query (a key after the query's position), False elsewhere."
        )
    if own_hidden:
        pytest.fail(
            f"each query is hidden from its own key: query i (at position {offset} + i) may "
            "see the keys up to AND including its own position; only the later ones are hidden."
        )
    assert torch.equal(mask, expected), (
        f"query i (at position {offset} + i) may see keys 0..{offset} + i and no later one"
    )


# --------------------------------------------------------------------------- attention


def head_first(t: torch.Tensor) -> torch.Tensor:
    """transformer-lens's [batch, pos, head, d_head] as the cache's [batch, head, pos, d_head]."""
    return t.transpose(1, 2)


def attention_by_hand(
    attn, acts, layer: int, n_past: int, n_new: int, allowed=None, scale=None, added=None
):
    """The attention output of positions n_past .. n_past + n_new - 1 of layer `layer`, from
    transformer-lens's own queries, keys and values, with a chosen mask (True where a query may
    read a key; None: every key) and score scale (None: 1/sqrt(d_head)); `added`, a boolean
    mask added to the scores as 1.0 and 0.0 (what a float mask does). With a known mistake's
    mask or scale, it is that mistake's output: the tests use it to name the mistake."""
    q, k, v = (head_first(acts[f"blocks.{layer}.attn.hook_{n}"]) for n in "qkv")
    q, k, v = q[:, :, n_past : n_past + n_new], k[:, :, : n_past + n_new], v[:, :, : n_past + n_new]
    scores = q @ k.transpose(-1, -2) * (attn.cfg.d_head**-0.5 if scale is None else scale)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if added is not None:
        scores = scores + added.to(scores.dtype)
    z = scores.softmax(dim=-1) @ v
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


def biases_by_position(attn, x_new, past_keys, past_values, allowed):
    """The attention output when b_Q, b_K and b_V [n_heads, d_head] are added without their
    head axis: they then line up with the positions (as many as there are heads), new position
    p getting head p's bias in every head. The slip runs only where the shapes allow it."""
    n_new = x_new.shape[1]

    def project(W, b):  # [batch, n_heads, new, d_head]
        return torch.einsum("bpd,hde->bhpe", x_new, W) + b[:n_new][None, None]

    q, k, v = project(attn.W_Q, attn.b_Q), project(attn.W_K, attn.b_K), project(attn.W_V, attn.b_V)
    keys, values = torch.cat([past_keys, k], dim=2), torch.cat([past_values, v], dim=2)
    scores = (q @ keys.transpose(-1, -2) * attn.cfg.d_head**-0.5).masked_fill(~allowed, -torch.inf)
    z = scores.softmax(dim=-1) @ values
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


BIAS_WITHOUT_HEAD_AXIS = (
    "the query, key and value biases (b_Q, b_K, b_V, each [n_heads, d_head]) were added to the "
    "projections ([..., n_heads, positions, d_head]) without their head axis, so broadcasting "
    "lined them up with the positions: one new position does not fit, and as many positions "
    "as heads get one head's bias each. Give each bias the head axis it belongs to."
)


def bias_slip_in_a_chunk(impl, attn, acts, layer: int, n_past: int) -> bool:
    """Whether the learner's attention, on as many new positions as heads (where the slip runs),
    computes `biases_by_position`."""
    n_new = attn.cfg.n_heads
    x = acts[f"blocks.{layer}.ln1.hook_out"][:, n_past : n_past + n_new]
    keys, values = (head_first(acts[f"blocks.{layer}.attn.hook_{n}"])[:, :, :n_past] for n in "kv")
    allowed = torch.arange(n_past + n_new)[None, :] <= torch.arange(n_past, n_past + n_new)[:, None]
    try:
        with torch.no_grad():
            out, _, _ = impl.attention_with_cache(attn, x, keys, values, allowed)
    except Exception:  # noqa: BLE001 - a probe: any failure means "not this slip"
        return False
    return close_f32(out, biases_by_position(attn, x, keys, values, allowed))


@pytest.mark.attention_with_cache
@pytest.mark.parametrize("layer,n_past", [(0, 20), (2, 27), (3, 0)])
def test_attention_of_one_new_position_matches_reference(impl, shipped, ref_run, layer, n_past):
    _, _, acts = ref_run
    attn = shipped[0].blocks[layer].attn
    x = acts[f"blocks.{layer}.ln1.hook_out"]
    keys, values = (head_first(acts[f"blocks.{layer}.attn.hook_{n}"]) for n in "kv")
    try:
        with torch.no_grad():
            out, k, v = impl.attention_with_cache(
                attn, x[:, n_past : n_past + 1], keys[:, :, :n_past], values[:, :, :n_past]
            )
    except RuntimeError as err:
        if bias_slip_in_a_chunk(impl, attn, acts, layer, n_past):
            pytest.fail(BIAS_WITHOUT_HEAD_AXIS)
        said = str(err)
        if "Sizes of tensors must match except in dimension" in said and "dimension 2" not in said:
            pytest.fail(
                f"attention_with_cache raised RuntimeError ({said.splitlines()[0]}): the cached "
                "and new keys (or values) were joined along the wrong axis. The cache's layout "
                "is [batch, n_heads, pos, d_head]: the new position goes after the cached ones "
                "on the positions axis, the third."
            )
        raise
    assert k.shape == (1, attn.cfg.n_heads, n_past + 1, attn.cfg.d_head), (
        f"return the keys of ALL positions, past and new, as [batch, n_heads, pos, d_head]; "
        f"got {tuple(k.shape)}"
    )
    new_first = torch.cat([keys[:, :, n_past : n_past + 1], keys[:, :, :n_past]], dim=2)
    if n_past > 0 and close_f32(k, new_first):
        pytest.fail(
            "the new position's keys come before the cached ones: the cache keeps positions in "
            "order, so the new keys (and values) go after the past ones."
        )
    assert_close_f32(
        k, keys[:, :, : n_past + 1], "keys: the cached ones followed by the new position's"
    )
    assert_close_f32(
        v, values[:, :, : n_past + 1], "values: the cached ones followed by the new position's"
    )
    expected = acts[f"blocks.{layer}.hook_attn_out"][:, n_past : n_past + 1]
    if not close_f32(out, expected):
        if close_f32(out, expected - attn.b_O):
            pytest.fail("Did you forget the output bias b_O? It is added after W_O.")
        if close_f32(out, attention_by_hand(attn, acts, layer, n_past, 1, scale=1.0)):
            pytest.fail(
                "the attention scores were not divided by sqrt(d_head): scale q k^T by "
                "1/sqrt(d_head) before the softmax (F.scaled_dot_product_attention does it "
                "unless given another `scale`)."
            )
    assert_close_f32(out, expected, "attention output of the new position (vs transformer-lens)")


@pytest.mark.attention_with_cache
def test_attention_of_a_chunk_matches_reference(impl, shipped, ref_run):
    _, _, acts = ref_run
    attn = shipped[0].blocks[1].attn
    x = acts["blocks.1.ln1.hook_out"]
    keys, values = (head_first(acts[f"blocks.1.attn.hook_{n}"]) for n in "kv")
    n_past, n_new = 11, 6
    q_pos = torch.arange(n_past, n_past + n_new)[:, None]
    allowed = torch.arange(n_past + n_new)[None, :] <= q_pos  # the definition, written out
    with torch.no_grad():
        out, _, _ = impl.attention_with_cache(
            attn,
            x[:, n_past : n_past + n_new],
            keys[:, :, :n_past],
            values[:, :, :n_past],
            allowed,
        )
    expected = acts["blocks.1.hook_attn_out"][:, n_past : n_past + n_new]
    if not close_f32(out, expected):
        if n_new == attn.cfg.n_heads and close_f32(
            out, biases_by_position(attn, x[:, n_past : n_past + n_new], keys[:, :, :n_past],
                                    values[:, :, :n_past], allowed)
        ):  # fmt: skip
            pytest.fail(BIAS_WITHOUT_HEAD_AXIS)
        if close_f32(out, attention_by_hand(attn, acts, 1, n_past, n_new, added=allowed)):
            pytest.fail(
                "six new positions after 11 cached ones: your output is attention with "
                "`allowed` ADDED to the scores as numbers (1.0 where a query may read a key, 0.0 "
                "where it may not), so every query read every key, the later ones too. "
                "scaled_dot_product_attention reads a boolean mask as 'may read' and a float "
                "mask as a bias it adds to the scores. Is the mask you pass still boolean, or "
                "did it become a float tensor on the way?"
            )
        top_left = torch.arange(n_past + n_new)[None, :] <= torch.arange(n_new)[:, None]
        if close_f32(out, attention_by_hand(attn, acts, 1, n_past, n_new, top_left)):
            pytest.fail(
                "six new positions after 11 cached ones: new query i read keys 0..i only, the "
                "causal mask aligned top left. That is what is_causal=True does (PyTorch aligns "
                "it top left), right only with no cache. Pass `allowed` as the mask "
                "(attn_mask=allowed): query i sits at position 11 + i."
            )
        if close_f32(out, attention_by_hand(attn, acts, 1, n_past, n_new)):
            pytest.fail(
                "six new positions at once: each query read every key, also the later ones. "
                "Pass `allowed` on to the attention as its mask."
            )
    assert_close_f32(out, expected, "six new positions at once; did you pass `allowed` on?")


def attention_written_out(attn, x, past_keys, past_values, allowed, heads_by_reshape=False):
    """Chapter 1's attention for new positions `x` [batch, new, d_model] after the cached keys
    and values, written out from the layer's weights (einsum, softmax). With `heads_by_reshape`,
    the known mistake: the projections [n_heads, batch * new, d_head] brought to the cache's
    layout by a reshape instead of moving the heads axis, which mixes batch rows and heads."""
    batch, n_new, _ = x.shape

    def project(W, b):
        if heads_by_reshape:
            rows = torch.einsum("nd,hde->hne", x.flatten(0, 1), W) + b[:, None]
            return rows.reshape(batch, W.shape[0], n_new, -1)
        return torch.einsum("bpd,hde->bhpe", x, W) + b[None, :, None]

    q, k, v = project(attn.W_Q, attn.b_Q), project(attn.W_K, attn.b_K), project(attn.W_V, attn.b_V)
    keys, values = torch.cat([past_keys, k], dim=2), torch.cat([past_values, v], dim=2)
    scores = (q @ keys.transpose(-1, -2) / attn.cfg.d_head**0.5).masked_fill(~allowed, -torch.inf)
    z = scores.softmax(dim=-1) @ values
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


@pytest.mark.attention_with_cache
def test_attention_keeps_the_batch_rows_and_the_heads_apart(impl, shipped):
    """A batch of two different rows, 3 new positions after 5 cached ones: every axis (batch 2,
    heads 6, new 3, all 8, d_head 32) has its own length, so a reshape that should have been a
    transpose cannot pass by luck, as it does at batch 1."""
    attn = shipped[0].blocks[0].attn
    cfg = attn.cfg
    g = torch.Generator().manual_seed(43)
    x = torch.randn(2, 3, cfg.d_model, generator=g)
    past_k, past_v = (torch.randn(2, cfg.n_heads, 5, cfg.d_head, generator=g) for _ in "kv")
    allowed = torch.arange(8)[None, :] <= torch.arange(5, 8)[:, None]
    with torch.no_grad():
        out, _, _ = impl.attention_with_cache(attn, x, past_k, past_v, allowed)
        expected = attention_written_out(attn, x, past_k, past_v, allowed)
        reshaped = attention_written_out(attn, x, past_k, past_v, allowed, heads_by_reshape=True)
    assert out.shape == expected.shape, (
        f"a batch of 2 rows, 3 new positions: expected output {tuple(expected.shape)}, got "
        f"{tuple(out.shape)}"
    )
    if not close_f32(out, expected) and close_f32(out, reshaped):
        pytest.fail(
            "on a batch of two rows, your output is what comes out when the projections "
            "[n_heads, batch * new, d_head] are RESHAPED to [batch, n_heads, new, d_head]: a "
            "reshape keeps the numbers in memory order, so row 0's positions land in other "
            "heads and in row 1. At batch 1 it happens to give the right numbers. Split the "
            "batch and position axes, then move the heads axis into place (a transpose, not a "
            "reshape)."
        )
    assert_close_f32(
        out, expected, "a batch of two rows, 3 new positions after 5 cached ones (by hand)"
    )


# --------------------------------------------------------------------------- forward_with_cache


def queries_keys_values(attn, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The layer's own q, k and v of the positions `x`, each [batch, n_heads, pos, d_head]."""
    return tuple(
        torch.einsum("bpd,hde->bhpe", x, W) + b[:, None]
        for W, b in [(attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V)]
    )


def attention_reading_every_key(attn, x: torch.Tensor) -> torch.Tensor:
    """Chapter 1's attention from the layer's own weights, WITHOUT the causal mask: every query
    reads every key (a known mistake's attention)."""
    q, k, v = queries_keys_values(attn, x)
    z = (q @ k.transpose(-1, -2) / attn.cfg.d_head**0.5).softmax(dim=-1) @ v
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


def attention_reading_later_keys(attn, x: torch.Tensor) -> torch.Tensor:
    """Attention whose mask is the causal mask the wrong way round: each query reads only the
    keys after it (the last one none), through PyTorch's fused attention, as a learner who
    passes causal_mask as `allowed` computes it."""
    q, k, v = queries_keys_values(attn, x)
    n = x.shape[1]
    later = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(diagonal=1)
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=later)
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


def uncached_variant(
    model, tokens, ln1=True, mlp_after_attn=True, final_ln=True, causal=True, first_position=0
):
    """model(tokens) written out from the model's own layers, or with one known mistake: the
    attention reads the residual stream without ln1, the MLP reads the stream from before the
    attention was added, the final LayerNorm is left out, the queries read every key (no
    causal mask), or the positions start at `first_position` instead of 0. Used to name a
    mistake only; the model itself is the ground truth."""
    if first_position:
        n = tokens.shape[1]
        positions = model.pos_embed.W_pos[first_position : first_position + n]
    else:
        positions = model.pos_embed(tokens)
    residual = model.embed(tokens) + positions
    for block in model.blocks:
        attn_in = block.ln1(residual) if ln1 else residual
        if causal == "inverted":
            attn_out = attention_reading_later_keys(block.attn, attn_in)
        elif causal:
            attn_out = block.attn(attn_in)
        else:
            attn_out = attention_reading_every_key(block.attn, attn_in)
        mlp_in = residual + attn_out if mlp_after_attn else residual
        residual = residual + attn_out + block.mlp(block.ln2(mlp_in))
    return model.unembed(model.ln_final(residual) if final_ln else residual)


def diagnose_prefill(model, tokens, logits) -> None:
    """Fail with the known mistake behind prefill logits (no cache) that differ from
    model(tokens)'s, if one explains them."""
    variants = [
        (
            dict(causal=False),
            "every query reads every key, the later ones too: a chunk of several new tokens "
            "needs the causal mask (only a single new token may read every key)",
        ),
        (
            dict(causal="inverted"),
            "each query reads only the keys after it: `allowed` is True where a query may read "
            "a key, and causal_mask is True where a key is hidden, so passing causal_mask as "
            "`allowed` as it is turns the rule around",
        ),
        (
            dict(final_ln=False),
            "there is no final LayerNorm: the logits are unembed(ln_final(residual))",
        ),
        (
            dict(ln1=False),
            "the attention reads the residual stream itself: it reads block.ln1(residual), "
            "and its output is added to the stream",
        ),
        (
            dict(mlp_after_attn=False),
            "the MLP reads the residual stream from before the attention output was added: add "
            "the attention output first, then the MLP reads ln2 of the sum",
        ),
    ]
    if logits.isnan().any():
        pytest.fail(
            "with no cache, your logits hold NaN: some query could read no key at all (a "
            "softmax over a row of -inf). `allowed` is True where a query may read a key, and "
            "causal_mask is True where a key is hidden: was causal_mask passed as `allowed` "
            "as it is, the wrong way round?"
        )
    variants.append(
        (
            dict(first_position=1),
            "the positions start at 1: each token reads the next position's row of W_pos. With "
            "no cache the first new token sits at position 0 (the cache's length)",
        )
    )
    for changes, mistake in variants:
        if (logits - uncached_variant(model, tokens, **changes)).abs().max() <= 1e-5:
            pytest.fail(f"with no cache, your logits are those of a model in which {mistake}.")


@pytest.mark.forward_with_cache
def test_empty_cache_gives_the_uncached_logits(impl, shipped64, shipped):
    tokens = ids_of(shipped[1], PROMPT)
    with torch.no_grad():
        logits, cache = impl.forward_with_cache(shipped64, tokens)
        expected = shipped64(tokens)
    assert logits.shape == expected.shape, (
        f"expected {tuple(expected.shape)}, got {tuple(logits.shape)}"
    )
    if (logits - expected).abs().max() > 1e-5:
        with torch.no_grad():
            diagnose_prefill(shipped64, tokens, logits)
    assert (logits - expected).abs().max() <= 1e-5, (
        "with no cache, compute exactly model(tokens). "
        + explain_difference(logits, expected, ("batch", "posn", "d_vocab"), atol=1e-5, rtol=0)
    )
    assert cache.length == tokens.shape[1], "the returned cache must hold every position fed"
    assert torch.equal(cache.tokens, tokens), "the cache records the token ids it has seen"


@pytest.mark.forward_with_cache
@pytest.mark.parametrize("chunks", [[5] + [1] * 25, [3, 7, 1, 9, 2, 8]], ids=["steps", "chunks"])
def test_cached_logits_equal_uncached_logits(impl, shipped64, shipped, chunks):
    tokens = ids_of(shipped[1], PROMPT)[:, : sum(chunks)]
    with torch.no_grad():
        expected = shipped64(tokens)
        cache, start, got = None, 0, []
        for size in chunks:
            try:
                logits, cache = impl.forward_with_cache(
                    shipped64, tokens[:, start : start + size], cache
                )
            except RuntimeError as err:
                if start == 0 or size == 1:
                    raise
                pytest.fail(
                    f"forward_with_cache raised RuntimeError ({str(err).splitlines()[0]}) on a "
                    f"chunk of {size} new tokens after {start} cached ones. Does the chunk's mask "
                    "cover only the new keys? Its queries read the cached keys too: the mask is "
                    f"[n_new, n_all] = [{size}, {start + size}], one column per key."
                )
            assert logits.shape[1] == size, (
                f"return logits for the {size} NEW positions only, got {logits.shape[1]}"
            )
            got.append(logits)
            start += size
    diff = (torch.cat(got, dim=1) - expected).abs().amax(dim=-1)[0]
    if diff.max() > 1e-5:
        first_bad = int((diff > 1e-5).nonzero()[0])
        hint = (
            "The first position is already wrong: check the prefill."
            if first_bad < chunks[0]
            else "Positions after the first chunk are wrong: do the new tokens get positions "
            "cache.length, cache.length + 1, ... (not 0, 1, ...)? Does the mask let each new "
            "query see every cached key?"
        )
        how = explain_difference(
            torch.cat(got, dim=1), expected, ("batch", "posn", "d_vocab"), atol=1e-5, rtol=0
        )
        pytest.fail(
            f"logits differ from the uncached model from position {first_bad} on. {how} {hint}"
        )
    assert cache.length == tokens.shape[1]


@pytest.mark.forward_with_cache
def test_forward_with_cache_makes_its_tensors_on_the_tokens_device(impl):
    assert_made_on_the_inputs_device(impl.forward_with_cache, "forward_with_cache", "the tokens")


@pytest.mark.forward_with_cache
def test_cached_logits_match_hf(impl, shipped, hf):
    model, tokenizer = shipped
    tokens = ids_of(tokenizer, PROMPT)
    with torch.no_grad():
        expected = hf(tokens).logits
        logits, cache = impl.forward_with_cache(model, tokens[:, :10])
        steps = [logits]
        for t in range(10, tokens.shape[1]):
            logits, cache = impl.forward_with_cache(model, tokens[:, t : t + 1], cache)
            steps.append(logits)
    assert_close_f32(
        torch.cat(steps, 1), expected, "prefill of 10 then single steps, against GPT2LMHeadModel"
    )


# --------------------------------------------------------------------------- positions_and_allowed


def padded_masks() -> list[tuple[str, torch.Tensor, int]]:
    """(what, mask [batch, all], n_new): a left-padded prefill of rows of 6, 3 and 1 real tokens;
    then, after two steps and one where row 1 was fed padding (it had finished), one and three
    new tokens."""
    _, prefill = left_padded([[5] * 6, [5] * 3, [5]], PAD_ID)
    later = torch.cat([prefill, torch.tensor([[True, True, True]] * 3)], dim=1)
    later[1, -1] = False
    return [
        ("the prefill of a left-padded batch", prefill, prefill.shape[1]),
        ("one new token after a padded cache", later, 1),
        ("three new tokens after a padded cache", later, 3),
    ]


def allowed_by_rule(mask: torch.Tensor, n_new: int, own_key_column: int | None = None):
    """The chapter's rule, one (row, query, key) at a time: a real query reads the real keys up to
    its own column. [batch, new, all]

    With `own_key_column`, also every query's "own" key, taken (wrongly unless it is
    n_all - n_new) as column own_key_column + i for query i: a known mistake's mask."""
    batch, n_all = mask.shape
    out = torch.zeros(batch, n_new, n_all, dtype=torch.bool)
    for b in range(batch):
        for i in range(n_new):
            col = n_all - n_new + i
            for j in range(col + 1):
                out[b, i, j] = bool(mask[b, j]) or (
                    own_key_column is not None and j == own_key_column + i
                )
    return out


def call_positions_and_allowed(impl, case: int):
    """(what, mask, n_new, the learner's (positions, allowed)) for one of `padded_masks`, with
    the mask handed over as it is and checked afterwards."""
    what, mask, n_new = padded_masks()[case]
    before = mask.clone()
    out = impl.positions_and_allowed(mask, n_new)
    assert torch.equal(mask, before), "positions_and_allowed must not change its mask in place"
    return what, mask, n_new, out


@pytest.mark.positions_and_allowed
@pytest.mark.parametrize("case", range(3), ids=["prefill", "one-new", "three-new"])
def test_positions_count_real_tokens(impl, case):
    what, mask, n_new, (positions, _) = call_positions_and_allowed(impl, case)
    batch = mask.shape[0]
    assert torch.broadcast_shapes(tuple(positions.shape), (batch, n_new)) == (batch, n_new), (
        f"{what}: positions must be [batch, new] = {(batch, n_new)}, got {tuple(positions.shape)}"
    )
    positions = positions.expand(batch, n_new)
    # HF GPT-2's convention in `generate`: the number of real tokens before a token, and 0 at
    # left padding (the notebook's definition, which the messages print).
    expected = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n_new:]
    real = mask[:, -n_new:]
    if not torch.equal(positions[real], expected[real]):
        hint = (
            "Do you count padding in the positions? A token's position is the number of real "
            "tokens before it in its row (a running count of the mask along the row, less one)."
        )
        counted = mask.long().cumsum(-1) - 1
        if torch.equal(positions[real], expected[real] + 1):
            hint = (
                "Every real token's position is one too high: counted from 1. A row's first "
                "real token is at position 0, so a position is the count of real tokens BEFORE it."
            )
        elif batch > 1 and torch.equal(
            positions[real], (mask.long().cumsum(0) - 1).clamp(min=0)[:, -n_new:][real]
        ):
            hint = (
                "These are counts DOWN the batch (over the rows, dim 0), not along each row: a "
                "token's position counts the real tokens before it in its own row."
            )
        if n_new < mask.shape[1] and any(
            torch.equal(positions[real], first[:, :n_new][real])
            for first in (counted, counted.clamp(min=0))
        ):
            hint = "These are the positions of the FIRST n_new columns; the new ones are the LAST."
        pytest.fail(
            f"{what}: the positions should be {expected.tolist()} (padding gets 0, and only "
            f"the real tokens' positions are graded here), got {positions.tolist()}. {hint}"
        )
    pad_positions = positions[~real]
    assert bool((pad_positions >= 0).all()), (
        f"{what}: padding got position {int(pad_positions.min())}: W_pos[-1] is the LAST row, "
        "not a harmless one. Clamp the positions at 0."
    )


@pytest.mark.positions_and_allowed
@pytest.mark.parametrize("case", range(3), ids=["prefill", "one-new", "three-new"])
def test_allowed_hides_padding_and_the_future(impl, case):
    what, mask, n_new, (_, allowed) = call_positions_and_allowed(impl, case)
    batch, n_all = mask.shape
    assert allowed.dtype == torch.bool, f"allowed must be a bool tensor, got {allowed.dtype}"
    assert tuple(allowed.shape) == (batch, 1, n_new, n_all), (
        f"{what}: allowed must be [batch, 1, new, all] = {(batch, 1, n_new, n_all)} (the 1 "
        f"broadcasts over heads), got {tuple(allowed.shape)}"
    )
    allowed = allowed[:, 0]
    expected = allowed_by_rule(mask, n_new)
    real = mask[:, -n_new:]
    if n_new < n_all and torch.equal(allowed, allowed_by_rule(mask, n_new, own_key_column=0)):
        pytest.fail(
            f"{what}: each query's own key is taken from the first columns: new query i sees "
            f"column i, although it sits in column {n_all - n_new} + i (the new queries are the "
            "LAST n_new columns). Compare the key columns with the last n_new columns."
        )
    for b, i in real.nonzero().tolist():
        if not torch.equal(allowed[b, i], expected[b, i]):
            col = n_all - n_new + i
            got, want = allowed[b, i].int().tolist(), expected[b, i].int().tolist()
            if bool(allowed[b, i, col + 1 :].any()):
                hint = "It sees keys after its own column: is the causal part still there?"
            elif bool((allowed[b, i] & ~mask[b]).any()):
                hint = "It sees padding keys: combine with mask[:, None, None, :]."
            else:
                hint = "It misses a real key before it."
            pytest.fail(
                f"{what}: the real query of row {b} in column {col} may read keys {want}, "
                f"got {got}. {hint}"
            )
    for b, i in (~real).nonzero().tolist():
        col = n_all - n_new + i
        assert bool(allowed[b, i, col]), (
            f"{what}: the padding query of row {b} in column {col} may not read its own key. "
            "A query that sees no key at all has a softmax row of all -inf (0/0 = NaN with a "
            "hand-written softmax), and NaN spreads to real tokens in the next layer. Allow "
            "every query its own key: own_key compares the key columns with the LAST n_new "
            "columns."
        )
        assert not bool(allowed[b, i, col + 1 :].any()), (
            f"{what}: the padding query of row {b} in column {col} sees later keys"
        )


@pytest.mark.positions_and_allowed
def test_positions_and_allowed_are_made_on_the_masks_device(impl):
    """PyTorch's `meta` device (shapes, no values) shows here what a GPU would: a tensor made
    without `device=` lands on the CPU and cannot meet the mask's."""
    mask = torch.tensor([[False, True, True, True, True], [True] * 5], device="meta")
    try:
        positions, allowed = impl.positions_and_allowed(mask, 2)
    except RuntimeError as err:
        if "device" not in str(err):
            raise
        pytest.fail(
            f"with the mask on another device (PyTorch's meta device, standing in for a GPU), "
            f"positions_and_allowed raised: {str(err).splitlines()[0]}. A tensor made without "
            "a device (the columns' numbers, say) sits on the CPU: make each new tensor on the "
            "mask's device."
        )
    for name, t in (("positions", positions), ("allowed", allowed)):
        assert t.device.type == "meta", (
            f"with the mask on the meta device, {name} came back on {t.device}: make it on the "
            "mask's device"
        )


@pytest.mark.positions_and_allowed
def test_left_padded_batch_matches_each_prompt_alone(impl, shipped, hf):
    model, tokenizer = shipped
    rows = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    tokens, mask = left_padded(rows, PAD_ID)
    width = tokens.shape[1]
    nxt = torch.tensor([[11], [12], [13]])
    with torch.no_grad():
        logits, cache = impl.forward_with_cache(model, tokens, attention_mask=mask)
        step, _ = impl.forward_with_cache(model, nxt, cache)
        for i, r in enumerate(rows):
            alone = hf(torch.tensor([r + [int(nxt[i])]])).logits[0]
            assert not logits[i].isnan().any(), (
                "NaN in a padded row: a padding query that may see no key at all gives a softmax "
                "of all -inf. Let every position see its own key."
            )
            assert_close_f32(
                logits[i, width - len(r) :],
                alone[:-1],
                f"prompt {i} padded on the left: its real positions must count from 0 and "
                "never attend to padding",
            )
            assert_close_f32(
                step[i, -1], alone[-1], f"prompt {i}: the step after the padded prefill"
            )


@pytest.mark.positions_and_allowed
def test_padding_positions_see_only_their_own_key(impl, shipped, hf):
    # What a padding column computes is never read by a real token, but it must be finite
    # whatever the attention function does with a row of scores that is all -inf (zeros in
    # PyTorch >= 2.5, NaN with a hand-written softmax or an older PyTorch). The chapter's rule,
    # every query sees its own key and padding gets position 0, makes it exactly what the
    # padding token computes alone: HF on the one-token text [PAD_ID].
    model, tokenizer = shipped
    tokens, mask = left_padded([tokenizer.encode(p) for p in BATCH_PROMPTS], PAD_ID)
    with torch.no_grad():
        logits, cache = impl.forward_with_cache(model, tokens, attention_mask=mask)
        alone = hf(torch.tensor([[PAD_ID]]), use_cache=True)
    for name, tensors in [("logits", [logits]), ("keys", cache.keys), ("values", cache.values)]:
        assert all(bool(torch.isfinite(t).all()) for t in tensors), (
            f"NaN or inf in the {name} of a padded batch: a padding query that sees no key at "
            "all has a softmax row of all -inf (0/0). Let every query see its own key: "
            "allowed & (mask[:, None, None, :] | own_key)"
        )
    pad = ~mask
    for layer in range(model.cfg.n_layers):
        hf_layer = alone.past_key_values.layers[layer]
        for name, got, want in [
            ("keys", cache.keys[layer], hf_layer.keys),
            ("values", cache.values[layer], hf_layer.values),
        ]:
            got_pad = got.transpose(1, 2)[pad]  # [n_padding, n_heads, d_head]
            if torch.allclose(got_pad, want[0, :, 0].expand_as(got_pad), atol=1e-4, rtol=1e-3):
                continue
            if layer == 0:
                hint = (
                    "Layer 0 is already different, before any attention: padding must get "
                    "position 0 (a count of real tokens before it gives -1 there, and -1 "
                    "indexes the LAST row of W_pos)."
                )
            else:
                hint = (
                    "Layer 0 agrees, so the positions are right; the attention of a padding "
                    "query is not: it must see its own key and nothing else (every key before "
                    "it is padding). If it sees no key at all, its softmax row is all -inf: "
                    "F.scaled_dot_product_attention returns zeros there, a hand-written softmax "
                    "NaN; do not depend on that. Use allowed & (mask[:, None, None, :] | "
                    "own_key)."
                )
            pytest.fail(
                f"the cached {name} of layer {layer} at padding positions differ from those of "
                f"the padding token alone at position 0 (HF on [{PAD_ID}]). {hint}"
            )
    assert_close_f32(
        logits[pad],
        alone.logits[0, 0].expand(int(pad.sum()), -1),
        "logits at padding positions: a padding query sees its own key only, at position 0, "
        "so it computes what the padding token computes alone",
    )


# --------------------------------------------------------------------------- cached sampling


@pytest.mark.cached_sample
@pytest.mark.parametrize("prompt", BATCH_PROMPTS)
def test_cached_greedy_equals_hf_generate(impl, shipped, hf, prompt):
    model, tokenizer = shipped
    ids = tokenizer.encode(prompt)
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    got = sampler.sample(ids, 40, temperature=0.0, stop_at_eos=False).tolist()
    expected = hf_greedy(hf, ids, 40)
    if got != expected:
        pytest.fail(
            f"greedy text differs from HF's generate: "
            f"{describe_difference(tokenizer, expected, got, len(ids))}. "
            f"{explain_cached_greedy(hf, expected, got, len(ids))}"
        )


def explain_cached_greedy(hf, expected: list[int], got: list[int], n_prompt: int) -> str:
    """The likely mistake behind the first wrong token of a cached greedy text, recognised by
    recomputing that token with HF under each mistake's hypothesis."""
    k = first_difference(expected, got)
    if k is None or k >= min(len(expected), len(got)) or k < n_prompt:
        return "Return the prompt and exactly the tokens asked for."
    if k == n_prompt:
        return (
            "The first new token is already wrong, and it comes from the prefill: "
            "forward_with_cache(model, prompt) with no cache must give model(prompt)'s logits "
            "(see forward_with_cache's tests)."
        )
    seen = torch.tensor([expected[:k]])  # what both texts hold before the first wrong token
    restarted = torch.tensor([list(range(n_prompt)) + [0] * (k - n_prompt)])
    with torch.no_grad():
        from_last_alone = int(hf(seen[:, -1:]).logits[0, -1].argmax())
        from_position_0 = int(hf(seen, position_ids=restarted).logits[0, -1].argmax())
    if got[k] == from_last_alone:
        return (
            "That is the model's prediction from the last token alone: the step did not read "
            "the cache. Pass self.cache to forward_with_cache, and keep the cache it returns."
        )
    if got[k] == from_position_0:
        return (
            "That is the model's prediction when each generated token sits at position 0: "
            "positions must go on from cache.length (see forward_with_cache's tests)."
        )
    return (
        "The prefill is right (the first new token matches) and a later step is not: feed only "
        "the newest token, with the cache, and keep the cache forward_with_cache returns."
    )


@pytest.mark.cached_sample
def test_the_sampler_keeps_its_cache_and_feeds_one_token_a_step(impl, shipped):
    model, tokenizer = shipped
    ids = tokenizer.encode(BATCH_PROMPTS[0])
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    sampler.sample(ids, 10, temperature=0.0, stop_at_eos=False)
    assert sampler.cache is not None, (
        "after sampling 10 tokens, self.cache is still None: the cache that forward_with_cache "
        "returns was not kept in self.cache, so every step is a prefill of the whole text "
        "(right tokens, and none of the cache's speed)."
    )
    expected = len(ids) + 10 - 1  # the prompt's prefill, then one token a step; the last
    assert sampler.cache.length == expected, (  # sampled token is never fed
        f"after a prompt of {len(ids)} tokens and 10 new ones, self.cache holds "
        f"{sampler.cache.length} positions; it should hold {expected}: the prefill's "
        f"{len(ids)}, then one per step for the newest token (the tenth is sampled, not fed). "
        "Is self.cache the cache the last step returned, and does each step feed only the "
        "newest token?"
    )


@pytest.mark.cached_sample
@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=0.8), dict(top_k=12), dict(top_p=0.7), dict(frequency_penalty=1.2)],
    ids=["temperature", "top_k", "top_p", "frequency_penalty"],
)
def test_cached_sampling_equals_uncached_under_a_seed(impl, shipped, kwargs):
    model, tokenizer = shipped
    uncached = impl.TransformerSampler(model, tokenizer)
    cached = impl.CachedTransformerSampler(model, tokenizer)
    for seed in (0, 1):
        a = uncached.sample(BATCH_PROMPTS[0], 50, seed=seed, stop_at_eos=False, **kwargs)
        b = cached.sample(BATCH_PROMPTS[0], 50, seed=seed, stop_at_eos=False, **kwargs)
        assert a == b, (
            f"seed {seed}, {kwargs}: the cached sampler must draw exactly the uncached tokens. "
            "Does it pass the WHOLE text so far to sample_next_token (the penalty counts it)?"
        )


@pytest.mark.cached_sample
@pytest.mark.parametrize("shift", [1, 40])
def test_cached_sampling_past_n_ctx_slides_the_window(impl, shipped, hf, shift):
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.cfg.d_vocab, (n_ctx - 5,), generator=g).tolist()
    new = 60

    def window_start(t: int, length: int) -> int:
        # The documented rule: a full cache is rebuilt from the last n_ctx - shift + 1 tokens,
        # and then grows one position per step until it is full again.
        if length <= n_ctx:
            return 0
        overflow = length - n_ctx  # steps since the window first had to move
        last_rebuild = length - (overflow - 1) % shift  # text length at the last rebuild
        return last_rebuild - (n_ctx - shift + 1)

    expected = hf_window_greedy(hf, prompt, new, window_start)
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    try:
        got = sampler.sample(prompt, new, temperature=0.0, stop_at_eos=False, window_shift=shift)
    except ValueError as err:
        pytest.fail(
            f"past n_ctx with window_shift={shift}, sample raised ValueError: "
            f"{str(err).splitlines()[0][:200]}. The cache was fed past n_ctx={n_ctx}: slide "
            "the window as soon as the cache is full (it holds n_ctx positions), before the "
            "step that would overflow it."
        )
    assert got.tolist() == expected, (
        f"past n_ctx with window_shift={shift}: "
        f"{describe_difference(tokenizer, expected, got.tolist(), len(prompt))} "
        f"(the cache is full after {n_ctx - len(prompt)} new tokens). Rebuild the cache from "
        f"the last n_ctx - window_shift + 1 tokens when it is full"
    )


@pytest.mark.cached_sample
def test_cached_sampling_of_a_prompt_longer_than_n_ctx(impl, shipped, hf):
    # Chapter 3's sampler reads the last n_ctx tokens of a prompt that is longer than that; so
    # must the cached one, from its prefill on (the model has only n_ctx positions).
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, model.cfg.d_vocab, (n_ctx + 9,), generator=g).tolist()
    new = 6
    expected = hf_window_greedy(hf, prompt, new, lambda t, length: length - n_ctx)
    sampler = impl.CachedTransformerSampler(model, tokenizer)
    try:
        got = sampler.sample(prompt, new, temperature=0.0, stop_at_eos=False)
    except (IndexError, RuntimeError, ValueError) as error:
        pytest.fail(
            f"a prompt of n_ctx + 9 = {n_ctx + 9} tokens raised {type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}. The prefill must read only the prompt's last "
            "n_ctx tokens, as chapter 3's sampler does (the model has n_ctx positions)."
        )
    assert got.tolist() == expected, (
        f"a prompt longer than n_ctx: "
        f"{describe_difference(tokenizer, expected, got.tolist(), len(prompt))}. The prefill "
        "reads the prompt's last n_ctx tokens, and every step after it the last n_ctx tokens "
        "of the text (window_shift=1)"
    )


# --------------------------------------------------------------------------- cached beams


def diagnose_beams_cache_length(impl, model, tokenizer) -> None:
    """Fail if, after a few steps, CachedBeams' cache does not hold every token but each beam's
    newest (which the next step feeds)."""
    beams = impl.CachedBeams(
        model, tokenizer, torch.zeros(1), ids_of(tokenizer, BATCH_PROMPTS[0]), None, None
    )
    for k in (3, 2, 2):
        beams = beams.generate(k)
    if beams.cache is None:
        return
    n_text = beams.tokens.shape[1]
    if beams.cache.length > n_text - 1:
        pytest.fail(
            f"after three steps the beams hold {n_text} tokens and their cache "
            f"{beams.cache.length} positions, more than the {n_text - 1} before each beam's "
            "newest token: a step fed a token that was already cached. After the first step "
            "the cache holds every token but the newest one, so each step feeds the newest "
            "alone."
        )


def diagnose_parents(impl, model, tokenizer) -> None:
    """Fail if CachedBeams.generate's `parents` do not say which beam each new one continues
    (new beam i's tokens, but the last, are those of beam parents[i])."""
    start = impl.CachedBeams(
        model, tokenizer, torch.zeros(1), ids_of(tokenizer, BATCH_PROMPTS[0]), None, None
    )
    beams = start.generate(3)  # three beams, then two continuations of each
    new = beams.generate(2)
    if new.parents is None or len(new.parents) != len(new):
        return
    wanted = [i // 2 for i in range(len(new))]
    follows = [
        bool(torch.equal(new.tokens[i, :-1], beams.tokens[int(p)]))
        for i, p in enumerate(new.parents)
    ]
    if not all(follows):
        pytest.fail(
            f"three beams with two continuations each: new beam i continues beam i // 2 (its "
            f"tokens start with that beam's), so parents should be {wanted}, but yours are "
            f"{new.parents.tolist()}, and beams read the cache rows of other beams. The k "
            "continuations of each beam come together: each parent repeats k times in a row "
            "(repeat_interleave, not repeat)."
        )


@pytest.mark.cached_beams
@pytest.mark.parametrize(
    "cfg",
    [
        dict(num_beams=3, num_return_sequences=3, max_new_tokens=15),
        dict(num_beams=4, num_return_sequences=2, max_new_tokens=12, no_repeat_ngram_size=2),
    ],
)
def test_cached_beam_search_equals_hf(impl, shipped, hf, cfg):
    model, tokenizer = shipped
    try:
        got = impl.beam_search(
            model, tokenizer, BATCH_PROMPTS[0], beams_class=impl.CachedBeams, **cfg
        )
    except (ValueError, RuntimeError, IndexError) as err:
        pytest.fail(
            f"beam search with CachedBeams raised {type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}. The cache has one row per beam of the step "
            "that made these beams, and filter keeps other beams, in another order: before "
            "feeding the last tokens, take the cache rows of the beams' parents, "
            "cache[parents]."
        )
    expected = hf_beam_search(hf, tokenizer.encode(BATCH_PROMPTS[0]), **cfg)
    if [t.tolist() for _, t in got] != [t.tolist() for _, t in expected]:
        diagnose_beams_cache_length(impl, model, tokenizer)
        diagnose_parents(impl, model, tokenizer)
    assert [t.tolist() for _, t in got] == [t.tolist() for _, t in expected], (
        "beams differ from HF's: does each candidate's cache row follow its parent beam "
        "(cache[parents]) after filter?"
    )
    torch.testing.assert_close(
        torch.tensor([s for s, _ in got]),
        torch.tensor([s for s, _ in expected]),
        atol=BEAM_SCORE_ATOL,
        rtol=0,
    )


@pytest.mark.cached_beams
def test_cached_beams_make_their_tensors_on_the_tokens_device(impl):
    generate = impl.CachedBeams.generate
    assert_made_on_the_inputs_device(generate, "CachedBeams.generate", "the tokens")


@pytest.mark.cached_beams
def test_cached_beam_search_past_n_ctx_equals_uncached(impl, shipped):
    model, tokenizer = shipped
    g = torch.Generator().manual_seed(3)
    words = torch.randint(0, model.cfg.d_vocab, (model.cfg.n_ctx - 4,), generator=g).tolist()
    prompt = tokenizer.decode(words)
    cfg = dict(num_beams=3, num_return_sequences=3, max_new_tokens=10)
    expected = impl.beam_search(model, tokenizer, prompt, **cfg)  # chapter 3's, graded vs HF
    got = impl.beam_search(model, tokenizer, prompt, beams_class=impl.CachedBeams, **cfg)
    assert [t.tolist() for _, t in got] == [t.tolist() for _, t in expected], (
        "past n_ctx the cached beams must read the same last n_ctx tokens as the uncached ones"
    )


# --------------------------------------------------------------------------- batches


@pytest.mark.left_pad
def test_left_pad_matches_hf_tokenizer_padding(impl, shipped):
    _, tokenizer = shipped
    tok = copy.deepcopy(tokenizer)
    tok.padding_side = "left"
    tok.pad_token = tok.convert_ids_to_tokens(PAD_ID)  # not 0, not end-of-text (0 here)
    texts = BATCH_PROMPTS + ["A", ""]
    expected = tok(texts, padding=True, return_tensors="pt")
    prompts = [tokenizer.encode(t) for t in texts]
    try:
        tokens, mask = impl.left_pad(prompts, PAD_ID)
    except (RuntimeError, IndexError, ValueError) as err:
        pytest.fail(
            f"left_pad raised {type(err).__name__} ({str(err).splitlines()[0][:160]}) on "
            f"prompts of {[len(p) for p in prompts]} tokens. The last is an empty prompt: "
            "tokens[row, -len(prompt):] is then tokens[row, -0:], and -0 is 0, so that is the "
            "whole row, not an empty slice. Leave an empty prompt's row as padding only."
        )
    assert tokens.shape == expected["input_ids"].shape, (
        f"one row per prompt, as wide as the longest: expected {tuple(expected['input_ids'].shape)}"
        f", got {tuple(tokens.shape)}"
    )
    if torch.equal(tokens[-1], torch.zeros_like(tokens[-1])):
        pytest.fail(f"the empty prompt's row is all 0s: pad with pad_id ({PAD_ID} here), not 0")
    right_padded = torch.tensor([p + [PAD_ID] * (tokens.shape[1] - len(p)) for p in prompts])
    if torch.equal(tokens, right_padded):
        pytest.fail(
            "you pad on the right: the padding goes on the LEFT, before the prompt, so that "
            "every row's last column holds its newest token and all rows generate in the same "
            "column."
        )
    assert torch.equal(tokens, expected["input_ids"]), (
        f"each row: padding (pad_id, {PAD_ID} here) first, then the prompt; the last prompt is "
        "empty, a row of padding only (tokens[row, -0:] is the whole row, not an empty slice)"
    )
    assert mask.dtype == torch.bool, f"the mask must be a bool tensor, got {mask.dtype}"
    assert torch.equal(mask, expected["attention_mask"].bool()), (
        "the mask is True at real tokens, False at padding"
    )


def hint_for_batch(tokenizer, wrong: list[int], texts: list[str], expected: list[str]) -> str:
    """The likely mistake behind wrong rows of a batch of BATCH_PROMPTS (row 1 is padded)."""
    eos = tokenizer.eos_token
    if any(eos in t and eos not in e for t, e in zip(texts, expected, strict=True)):
        return (
            "Padding (end-of-text tokens) became part of a text: the prefill read it as text. "
            "Pass attention_mask=mask to the prefill's forward_with_cache."
        )
    if wrong == [1]:
        return (
            "Only the short prompt, the one with padding, is wrong: its padding must stay out of "
            "its attention and its positions (attention_mask=mask at the prefill; see "
            "forward_with_cache's padding tests)."
        )
    return (
        "Every row reads logits[:, -1], feeds next_token[:, None] with the cache, and keeps the "
        "cache forward_with_cache returns."
    )


@pytest.mark.generate_batch
def test_generate_batch_makes_its_tensors_on_the_tokens_device(impl):
    generate = impl.generate_batch_tokens
    assert_made_on_the_inputs_device(generate, "generate_batch_tokens", "the tokens")


@pytest.mark.generate_batch
def test_batched_greedy_equals_hf_on_each_prompt(impl, shipped, hf):
    model, tokenizer = shipped
    texts = impl.generate_batch(
        model, tokenizer, BATCH_PROMPTS, 30, temperature=0.0, stop_at_eos=False
    )
    assert len(texts) == len(BATCH_PROMPTS), "one text per prompt, in the prompts' order"
    prompts = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    expected = [hf_greedy(hf, ids, 30) for ids in prompts]
    expected_texts = [tokenizer.decode(ids) for ids in expected]
    wrong = [i for i, t in enumerate(texts) if t != expected_texts[i]]
    if wrong and all(texts[i] == tokenizer.decode(expected[i][:-1]) for i in wrong):
        pytest.fail(
            f"rows {wrong} are the prompt generated alone (HF, greedy) without its last token: "
            "the last sampled token was never fed to the model, and the text is read from the "
            "cache's tokens, which hold only what was fed. Feed every sampled token, the last "
            "one too."
        )
    if wrong:
        i = wrong[0]
        pytest.fail(
            f"rows {wrong} differ from the prompt generated alone (HF, greedy); prompt {i} "
            f"{BATCH_PROMPTS[i]!r}: "
            f"{describe_difference(tokenizer, expected[i], texts[i], len(prompts[i]))}. "
            f"{hint_for_batch(tokenizer, wrong, texts, expected_texts)}"
        )


@pytest.mark.generate_batch
def test_batched_sampling_is_reproducible_under_a_seed(impl, shipped):
    model, tokenizer = shipped
    kwargs = dict(temperature=1.0, top_k=50)
    with torch.random.fork_rng(devices=[]):  # the global state is restored afterwards
        torch.manual_seed(0)  # a different global random state before each run
        state = torch.get_rng_state()
        a = impl.generate_batch(model, tokenizer, BATCH_PROMPTS, 20, seed=5, **kwargs)
        global_used = not torch.equal(state, torch.get_rng_state())
        torch.manual_seed(1)
        b = impl.generate_batch(model, tokenizer, BATCH_PROMPTS, 20, seed=5, **kwargs)
        c = impl.generate_batch(model, tokenizer, BATCH_PROMPTS, 20, seed=6, **kwargs)
    assert a == b, "the same seed must give the same texts. " + (
        "Sampling drew from torch's global random state: pass generator=generator on to "
        "sample_next_token."
        if global_used
        else "Is generator passed on to sample_next_token at every step?"
    )
    assert a != c, "seeds 5 and 6 gave the same texts: pass generator=generator on"


@pytest.mark.generate_batch
def test_batched_sampling_follows_the_models_distribution(impl, shipped, hf):
    # 200 copies of each of two short prompts (6 and 5 tokens) in one left-padded batch:
    # each row's first new token is one sample from HF's next-token distribution for its
    # prompt, after HF's temperature and top-k warpers. False failure for a correct
    # implementation: at most 2 * ALPHA = 2e-5 (two chi-square comparisons, a union bound).
    model, tokenizer = shipped
    eos, n = tokenizer.eos_token_id, 200
    prompts = [tokenizer.encode(p) for p in (BATCH_PROMPTS[1], "JULIET.\n")]
    tokens, mask = left_padded(prompts * n, eos)
    width = tokens.shape[1]
    generator = torch.Generator().manual_seed(0)
    cache = impl.generate_batch_tokens(
        model, tokens, mask, 1, eos, generator, temperature=0.8, top_k=40
    )
    assert cache.tokens.shape[1] == width + 1, (
        f"asked for 1 new token: the cache should hold the {width} prompt columns and one new "
        f"column (feed every sampled token), got {cache.tokens.shape[1]} columns"
    )
    first = cache.tokens[:, width]
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(40)])
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[:, -1]
        probs = warpers(None, logits.clone()).softmax(-1)[0]
        assert_samples_follow(
            first[i :: len(prompts)],
            probs,
            f"prompt {tokenizer.decode(ids)!r}, first new token with temperature=0.8, top_k=40 "
            "(pass **kwargs on to sample_next_token, and sample from logits[:, -1])",
            alpha=ALPHA,
        )


def eos_boosted(model, tokenizer, nats: float):
    """A copy of `model` on which end-of-text is `nats` more likely everywhere."""
    crafted = copy.deepcopy(model)
    with torch.no_grad():
        crafted.unembed.b_U[tokenizer.eos_token_id] += nats
    return crafted


EOS_BOOST = 5.0
"""The crafted model's extra nats on end-of-text: greedy text then ends after 19 tokens for the
first batch prompt, 6 for the second, and not within 30 for the third."""


class BoostEndOfText(LogitsProcessor):
    """HF's side of `eos_boosted`: the same nats added to end-of-text's logit at every step."""

    def __init__(self, eos: int, nats: float):
        self.eos, self.nats = eos, nats

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.eos] += self.nats
        return scores


@pytest.fixture(scope="module")
def boosted_greedy(hf, shipped):
    """{stop_at_eos: [prompt + greedy continuation of 30 tokens on the crafted model, by HF's
    `generate`], one per batch prompt}."""
    _, tokenizer = shipped
    eos = tokenizer.eos_token_id
    out = {}
    for stop in (True, False):
        out[stop] = []
        for prompt in BATCH_PROMPTS:
            with torch.no_grad():
                ids = hf.generate(
                    ids_of(tokenizer, prompt),
                    max_new_tokens=30,
                    do_sample=False,
                    top_k=None,
                    pad_token_id=eos,
                    eos_token_id=eos if stop else None,
                    logits_processor=LogitsProcessorList([BoostEndOfText(eos, EOS_BOOST)]),
                )
            out[stop].append(ids[0].tolist())
    return out


@pytest.mark.generate_batch
def test_batched_frequency_penalty_counts_each_row_alone(impl, shipped):
    model, tokenizer = shipped
    # The padding id is end-of-text: made 5 nats more likely, greedy text ends within 25
    # tokens for the second and third prompts alone, and counting the 12 padding tokens of the
    # short second prompt as text (1.5 each) would stop its text ending.
    crafted = eos_boosted(model, tokenizer, EOS_BOOST)
    for m, stop in [(model, False), (crafted, True)]:
        sampler = impl.TransformerSampler(m, tokenizer)  # chapter 3's, graded vs closed form
        kwargs = dict(temperature=0.0, frequency_penalty=1.5, stop_at_eos=stop)
        texts = impl.generate_batch(m, tokenizer, BATCH_PROMPTS, 25, **kwargs)
        for text, prompt in zip(texts, BATCH_PROMPTS, strict=True):
            want = sampler.sample(prompt, 25, **kwargs)
            if text != want:
                n_prompt = len(tokenizer.encode(prompt))
                where = describe_difference(tokenizer, tokenizer.encode(want), text, n_prompt)
                hint = end_of_text_hint(tokenizer, want, text) or (
                    " Count each row's own real tokens, generated ones included: not the other "
                    "rows', not the padding (pass cache.tokens, and cache.mask as "
                    "attention_mask, to sample_next_token)."
                )
                pytest.fail(f"prompt {prompt!r}, frequency penalty 1.5: {where}.{hint}")


@pytest.mark.generate_batch
def test_batched_rows_stop_at_their_own_end_of_text(impl, shipped, boosted_greedy):
    model, tokenizer = shipped
    eos = tokenizer.eos_token_id
    crafted = eos_boosted(model, tokenizer, EOS_BOOST)
    expected = boosted_greedy[True]
    ends = [ids[-1] == eos for ids in expected]
    assert ends == [True, True, False], f"test setup: expected two texts to end, got {ends}"
    got = impl.generate_batch(crafted, tokenizer, BATCH_PROMPTS, 30, temperature=0.0)
    for i, (text, want) in enumerate(zip(got, expected, strict=True)):
        n_prompt = len(tokenizer.encode(BATCH_PROMPTS[i]))
        assert text == tokenizer.decode(want), (
            f"prompt {i} on a model that likes end-of-text, greedy (HF on the prompt alone "
            f"writes {new_tokens(len(want) - n_prompt)}): "
            f"{describe_difference(tokenizer, want, text, n_prompt)}."
            f"{end_of_text_hint(tokenizer, tokenizer.decode(want), text)} Stop each row after "
            "its own end-of-text token (keep that token), and let the other rows go on"
        )


@pytest.mark.generate_batch
def test_batched_without_stop_at_eos_writes_every_token(impl, shipped, boosted_greedy):
    model, tokenizer = shipped
    crafted = eos_boosted(model, tokenizer, EOS_BOOST)
    got = impl.generate_batch(
        crafted, tokenizer, BATCH_PROMPTS, 30, temperature=0.0, stop_at_eos=False
    )
    for i, (text, want) in enumerate(zip(got, boosted_greedy[False], strict=True)):
        n_prompt = len(tokenizer.encode(BATCH_PROMPTS[i]))
        assert text == tokenizer.decode(want), (
            f"prompt {i}, stop_at_eos=False on a model that likes end-of-text: "
            f"{describe_difference(tokenizer, want, text, n_prompt)}. With "
            "stop_at_eos=False no row is ever done: end-of-text is a token like any other, "
            "and every row writes all 30 tokens (done = done | (stop_at_eos & ...))"
        )


@pytest.mark.generate_batch
def test_finished_rows_are_fed_padding(impl, shipped, boosted_greedy):
    # generate_batch_tokens itself, on the crafted model: rows 0 and 1 end after 19 and 6
    # tokens, row 2 runs all 30 steps. After its end-of-text a row holds padding only: the
    # end-of-text id, with the mask False.
    model, tokenizer = shipped
    eos = tokenizer.eos_token_id
    crafted = eos_boosted(model, tokenizer, EOS_BOOST)
    prompts = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    tokens, mask = left_padded(prompts, eos)
    width = tokens.shape[1]
    cache = impl.generate_batch_tokens(crafted, tokens, mask, 30, eos, temperature=0.0)
    assert cache.length == width + 30, (
        f"the last row never ends, so the batch takes all 30 steps: expected {width + 30} "
        f"columns in the cache, got {cache.length}"
    )
    for i, (ids, want) in enumerate(zip(prompts, boosted_greedy[True], strict=True)):
        row, row_mask = cache.tokens[i].tolist(), cache.mask[i].tolist()
        real = [t for t, m in zip(row, row_mask, strict=True) if m]
        assert real[: len(want)] == want, (
            f"row {i}, its real tokens (cache.mask True) against HF on the prompt alone: "
            f"{describe_difference(tokenizer, want, real[: len(want)], len(ids))}"
        )
        end = width + len(want) - len(ids)  # the first column after the row's text
        if end == cache.length:
            continue
        assert not any(row_mask[end:]), (
            f"row {i} wrote end-of-text at step {len(want) - len(ids) - 1}, but the columns "
            "after it are not padding in cache.mask: feed a finished row's token with "
            "attention_mask=~done[:, None], so that it is hidden and left out of the text"
        )
        assert row[end:] == [eos] * (cache.length - end), (
            f"row {i} ended at step {len(want) - len(ids) - 1}, but then wrote "
            f"{[t for t in row[end:] if t != eos][:5]}...: a finished row's new token is "
            "padding, the end-of-text id, whatever was sampled for it: choose each row's token "
            "by whether that row is done"
        )
