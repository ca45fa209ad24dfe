"""Chapter 1: DemoTransformer, graded against HF's GPT-2 on the shipped weights, read through
transformer-lens 4's bridge (which runs HF's own modules, so its activations are HF's), plus
tests aimed at the classic mistakes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.graded._explain import explain_difference, sentences
from tests.graded._oracles import F32_ATOL, F32_RTOL, close_f32
from utils.models import load_weights, params_under

CHAPTER = "01_transformer"


def build(cls, cfg, params: dict[str, torch.Tensor]):
    """A learner module holding `params`. A module whose parameter names or shapes differ from
    the reference's fails the test with load_weights' message (which names them), not with a
    ValueError the learner would take for an error in their own code."""
    module = cls(cfg)
    try:
        return load_weights(module, params).eval()
    except ValueError as err:
        raise AssertionError(str(err)) from None


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """Seeded test inputs: a failure reports the same difference on every run."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_matches(actual, expected, what: str, hint: str = "", axes=None) -> None:
    """`actual` equals the reference's `expected`, or fail with what was compared, how the two
    differ (the explainer: axes, positions, pattern), then `hint`, the slip that points to."""
    assert isinstance(actual, torch.Tensor), f"{what} must return a tensor, got {type(actual)}"
    if axes is None and expected.dim() == 3:
        last = "d_vocab" if expected.shape[-1] > 1024 else "d_model"
        axes = ("batch", "posn", last)
    if close_f32(actual, expected):
        return
    how = explain_difference(actual, expected, axes, atol=F32_ATOL, rtol=F32_RTOL)
    assert actual.shape == expected.shape, sentences(
        f"{what} returned shape {tuple(actual.shape)}, expected {tuple(expected.shape)}", how
    )
    diff = (actual - expected).abs().max().item()
    pytest.fail(
        sentences(f"{what} differs from the reference model by up to {diff:.3g}", how, hint)
    )


# --------------------------------------------------------------------------- token_strings


@pytest.mark.token_strings
@pytest.mark.parametrize(
    "text",
    ["Hello world", " leading space", "tokens, tokens!\nNew line.", "aaaaaaaa", "A"],
)
def test_token_strings_rebuild_the_text(impl, reference, text):
    tokenizer = reference.tokenizer
    pieces = impl.token_strings(tokenizer, text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert isinstance(pieces, list) and all(isinstance(p, str) for p in pieces), (
        "token_strings must return a list of str"
    )
    assert len(pieces) == len(ids), (
        f"expected one string per token ({len(ids)}), got {len(pieces)}: did you add a special "
        "token, or split into characters instead of tokens?"
    )
    assert "".join(pieces) == text, (
        f"the pieces join to {''.join(pieces)!r}, not {text!r}: decode each id on its own, "
        "as a text of one token (convert_ids_to_tokens gives the raw 'Ġ' form)"
    )


# --------------------------------------------------------------------------- layernorm


def _random_ln(impl, cfg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = {
        "w": 1 + 0.3 * torch.randn(cfg.d_model, generator=gen),
        "b": 0.3 * torch.randn(cfg.d_model, generator=gen),
    }
    return build(impl.LayerNorm, cfg, params), params


@pytest.mark.layernorm
def test_layernorm_matches_torch(impl, reference):
    cfg = reference.cfg
    ln, p = _random_ln(impl, cfg)
    x = 3 * randn(2, 5, cfg.d_model) + 1
    expected = F.layer_norm(x, (cfg.d_model,), p["w"], p["b"], cfg.layer_norm_eps)
    try:
        out = ln(x)
    except RuntimeError as err:
        if "must match the size" not in str(err):
            raise
        pytest.fail(
            f"LayerNorm on a (2, 5, {cfg.d_model}) input raised a shape error "
            f"({str(err).splitlines()[0]}). A mean over d_model has one dimension fewer than "
            "the residual, shape (batch, posn), so it does not line up with the residual's "
            "last axis: keep the reduced dimension (size 1, `keepdim`) and it broadcasts "
            "over d_model."
        )
    assert_matches(out, expected, "LayerNorm", "Mean and variance over d_model, then * w + b?")


@pytest.mark.layernorm
def test_layernorm_epsilon_inside_sqrt(impl, reference):
    cfg = reference.cfg
    ln, p = _random_ln(impl, cfg)
    x = 1e-3 * randn(2, 5, cfg.d_model, seed=1)  # variance ~1e-6, smaller than eps=1e-5
    expected = F.layer_norm(x, (cfg.d_model,), p["w"], p["b"], cfg.layer_norm_eps)
    out = ln(x)
    centered = x - x.mean(-1, keepdim=True)
    outside = centered / (centered.pow(2).mean(-1, keepdim=True).sqrt() + cfg.layer_norm_eps)
    if close_f32(out, outside * p["w"] + p["b"]):
        pytest.fail("Is your epsilon outside the sqrt? It is added to the variance, inside it.")
    assert_matches(out, expected, "LayerNorm on a low-variance input", "Epsilon inside the sqrt?")


@pytest.mark.layernorm
def test_layernorm_reads_epsilon_from_the_config(impl, reference):
    cfg = dataclasses.replace(reference.cfg, layer_norm_eps=0.1)
    ln, p = _random_ln(impl, cfg)
    x = 0.3 * randn(2, 5, cfg.d_model, seed=6)  # variance ~0.09: eps=0.1 matters a lot
    expected = F.layer_norm(x, (cfg.d_model,), p["w"], p["b"], cfg.layer_norm_eps)
    assert_matches(
        ln(x),
        expected,
        "LayerNorm with layer_norm_eps=0.1",
        "Read epsilon from self.cfg.layer_norm_eps: 1e-5 is GPT-2's value, not every model's.",
    )


@pytest.mark.layernorm
def test_layernorm_biased_variance(impl):
    from solutions.config import Config

    cfg = Config(d_model=4, d_vocab=10, n_ctx=8, d_head=2, d_mlp=8, n_heads=2, n_layers=1)
    ln, p = _random_ln(impl, cfg)
    x = randn(3, 2, 4, seed=2)
    expected = F.layer_norm(x, (4,), p["w"], p["b"], cfg.layer_norm_eps)
    out = ln(x)
    unbiased = (x - x.mean(-1, keepdim=True)) / (
        x.var(-1, keepdim=True) + cfg.layer_norm_eps
    ).sqrt()
    if close_f32(out, unbiased * p["w"] + p["b"]):
        pytest.fail(
            "Your variance divides by d_model - 1 (Bessel's correction): LayerNorm's divides by "
            "d_model. Tensor.var's `correction` says which."
        )
    assert_matches(out, expected, "LayerNorm with d_model=4")


@pytest.mark.layernorm
def test_layernorm_does_not_modify_its_input(impl, reference):
    ln, _ = _random_ln(impl, reference.cfg)
    x = randn(2, 5, reference.cfg.d_model, seed=3) + 2
    before = x.clone()
    ln(x)
    assert torch.equal(x, before), (
        "LayerNorm changed its input in place (`-=` / `/=`): the residual stream is needed "
        "again after the layer, so compute a new tensor."
    )


@pytest.mark.layernorm
def test_layernorm_matches_reference(impl, reference, ref_run):
    _, _, cache = ref_run
    ln = build(impl.LayerNorm, reference.cfg, params_under(reference.params, "blocks.0.ln1."))
    out = ln(cache["blocks.0.hook_resid_pre"])
    assert_matches(out, cache["blocks.0.ln1.hook_out"], "LayerNorm (block 0, ln1)")


# --------------------------------------------------------------------------- embeddings


@pytest.mark.embed
def test_embed_matches_reference(impl, reference, ref_run):
    tokens, _, cache = ref_run
    embed = build(impl.Embed, reference.cfg, params_under(reference.params, "embed."))
    out, expected = embed(tokens), cache["hook_embed"]
    if isinstance(out, torch.Tensor) and close_f32(out, expected * reference.cfg.d_model**0.5):
        pytest.fail(
            "Your embeddings are scaled by sqrt(d_model), as the original Transformer's are; "
            "GPT-2 does not scale them: row t of W_E as it is."
        )
    assert_matches(out, expected, "Embed", "Row t of W_E embeds token t.")


@pytest.mark.embed
def test_pos_embed_depends_on_position_not_token(impl, reference):
    cfg = reference.cfg
    pos = build(impl.PosEmbed, cfg, params_under(reference.params, "pos_embed."))
    tokens = torch.tensor([[5, 9, 2, 7], [1, 1, 30, 3]])
    out = pos(tokens)
    assert out.shape == (2, 4, cfg.d_model), f"expected shape (2, 4, d_model), got {out.shape}"
    expected = reference.params["pos_embed.W_pos"][:4]
    if torch.allclose(out[0], reference.params["pos_embed.W_pos"][1:5]):
        pytest.fail(
            "A sequence of 4 tokens got rows 1, 2, 3, 4 of W_pos: each position got the next "
            "position's row. Positions count from 0: the first token gets row 0."
        )
    if torch.allclose(out[0], reference.params["pos_embed.W_pos"][-4:]):
        pytest.fail(
            "A sequence of 4 tokens got the LAST 4 rows of W_pos: positions count from the "
            "start, so it gets rows 0, 1, 2, 3."
        )
    assert torch.allclose(out[0], expected) and torch.allclose(out[1], expected), sentences(
        explain_difference(out, expected.expand(2, 4, -1), ("batch", "posn", "d_model")),
        "Index W_pos by position (0, 1, 2...), not by token id; every row of the batch gets "
        "the same positional vectors.",
    )


@pytest.mark.embed
def test_pos_embed_matches_reference(impl, reference, ref_run):
    tokens, _, cache = ref_run
    pos = build(impl.PosEmbed, reference.cfg, params_under(reference.params, "pos_embed."))
    assert_matches(pos(tokens), cache["hook_pos_embed"], "PosEmbed")


# --------------------------------------------------------------------------- attention


@pytest.mark.attention
def test_causal_mask(impl, reference):
    attn = impl.Attention(reference.cfg)
    scores = randn(2, 3, 6, 6, seed=4)
    before = scores.clone()
    masked = attn.apply_causal_mask(scores)
    assert masked.shape == scores.shape, f"mask changed the shape to {tuple(masked.shape)}"
    assert torch.equal(scores, before), "apply_causal_mask must not modify its input in place"
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert torch.equal(masked[..., ~future], scores[..., ~future]), (
        "Scores on and below the diagonal must be unchanged: a token attends to itself and "
        "to earlier tokens (is your mask off by one? Which diagonal does it start from?)."
    )
    assert (masked[..., future] <= -1e4).all(), (
        "Every score above the diagonal (a key AFTER its query) must become self.IGNORE."
    )


def attention_with_axes_swapped(cfg, params: dict[str, torch.Tensor], x: torch.Tensor, where: str):
    """Block 0's attention written out from its weights, with one known mistake: the query and
    key axes swapped in the `scores` (before the mask and softmax) or in the `pattern` (when it
    mixes the values). Used to name it only."""
    q, k, v = (torch.einsum("bpd,hde->bphe", x, params[f"W_{n}"]) + params[f"b_{n}"] for n in "QKV")
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.d_head**0.5
    if where == "scores":
        scores = scores.transpose(-1, -2)
    n = x.shape[1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    pattern = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    if where == "pattern":
        pattern = pattern.transpose(-1, -2)
    z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
    return torch.einsum("bqhe,hed->bqd", z, params["W_O"]) + params["b_O"]


@pytest.mark.attention
def test_attention_matches_reference(impl, reference, ref_run):
    _, _, cache = ref_run
    cfg = reference.cfg
    params = params_under(reference.params, "blocks.0.attn.")
    x = cache["blocks.0.ln1.hook_out"]
    expected = cache["blocks.0.hook_attn_out"]
    out = build(impl.Attention, cfg, params)(x)
    if not close_f32(out, expected):
        # Diagnose the scale: rescaling the queries undoes a wrong score scale exactly.
        for factor, mistake in [
            (cfg.d_head**-0.5, "Did you forget to divide the scores by sqrt(d_head)?"),
            (cfg.d_head**0.5, "Divide the scores by sqrt(d_head), not by d_head."),
            ((cfg.d_model / cfg.d_head) ** 0.5, "Divide by sqrt(d_head), not sqrt(d_model)."),
        ]:
            scaled = dict(params, W_Q=params["W_Q"] * factor, b_Q=params["b_Q"] * factor)
            if close_f32(build(impl.Attention, cfg, scaled)(x), expected):
                pytest.fail(mistake)
        # A forgotten bias shifts every output by a constant vector (attention rows sum to 1).
        v_shift = torch.einsum("hd,hdm->m", params["b_V"], params["W_O"])
        for shift, bias in [(params["b_O"], "b_O"), (v_shift, "b_V")]:
            if close_f32(out, expected - shift):
                pytest.fail(f"Did you forget the bias {bias}? Add it as you add the others.")
        if close_f32(out, attention_with_axes_swapped(cfg, params, x, "scores")):
            pytest.fail(
                "Your output is what attention gives with the SCORES laid out transposed, "
                "[.., key_pos, query_pos]: the causal mask and the softmax then act on the "
                "wrong axes (each row is a key, normalised over the queries). When you take "
                "the dot product of queries and keys, is the query axis the one before the key "
                "axis in the result, [batch, head, query_pos, key_pos]?"
            )
        if close_f32(out, attention_with_axes_swapped(cfg, params, x, "pattern")):
            pytest.fail(
                "Your output is what attention gives with the pattern read TRANSPOSED when the "
                "values are mixed: query q took its weights from column q of the pattern (the "
                "weights the queries gave to key q), not from its own row. The pattern is "
                "[batch, head, query_pos, key_pos], and each row sums to 1 over the keys: when "
                "you weight the values, is the pattern's key axis the one summed with the "
                "values' position axis, and its query axis the one kept?"
            )
        if close_f32(out, expected + (cfg.n_heads - 1) * params["b_O"]):
            pytest.fail(
                f"Your output carries b_O {cfg.n_heads} times: it was added to each head's "
                "output before the heads were summed. b_O is one bias for the whole layer, "
                "added once, after the sum over heads."
            )
    assert_matches(out, expected, "Attention (block 0)", "Check the biases and the softmax dim.")


@pytest.mark.attention
def test_attention_makes_its_tensors_on_the_inputs_device(impl, reference):
    """On a GPU, a tensor made inside `forward` without `device=` (a mask from `torch.ones(n, n)`)
    lands on the CPU beside scores on the GPU, and the first operation that mixes them fails.
    PyTorch's `meta` device (shapes, no data) fails the same way here, with no GPU."""
    cfg = reference.cfg
    attn = build(impl.Attention, cfg, params_under(reference.params, "blocks.0.attn.")).to("meta")
    x = torch.empty(2, 5, cfg.d_model, device="meta")
    try:
        out = attn(x)
    except RuntimeError as err:
        if "device" not in str(err):
            raise
        pytest.fail(
            "Attention made a tensor on the CPU while its input was on another device (here "
            f"PyTorch's meta device; on a GPU, the GPU): {str(err).splitlines()[0]} Is your causal "
            "mask made with torch.ones / torch.triu without device=? Make every tensor you "
            "create in forward or apply_causal_mask on the scores' device."
        )
    assert out.device.type == "meta" and out.shape == (2, 5, cfg.d_model)


@pytest.mark.attention
def test_attention_is_causal(impl, reference):
    cfg = reference.cfg
    attn = build(impl.Attention, cfg, params_under(reference.params, "blocks.0.attn."))
    x = randn(1, 6, cfg.d_model, seed=5)
    y = x.clone()
    y[0, 4] += 1.0
    out_x, out_y = attn(x), attn(y)
    assert torch.allclose(out_x[0, :4], out_y[0, :4], atol=F32_ATOL), (
        "Changing token 4 changed the output at earlier positions: attention is reading the "
        "future. Apply the causal mask before the softmax."
    )
    assert not torch.allclose(out_x[0, 4], out_y[0, 4]), (
        "Changing token 4 did not change its own output: a token must attend to itself."
    )


# --------------------------------------------------------------------------- mlp


@pytest.mark.mlp
def test_mlp_matches_reference(impl, reference, ref_run):
    _, _, cache = ref_run
    p = params_under(reference.params, "blocks.0.mlp.")
    x = cache["blocks.0.ln2.hook_out"]
    expected = cache["blocks.0.hook_mlp_out"]
    out = build(impl.MLP, reference.cfg, p)(x)
    if not close_f32(out, expected):
        exact_gelu = F.gelu(x @ p["W_in"] + p["b_in"]) @ p["W_out"] + p["b_out"]
        if close_f32(out, exact_gelu):
            pytest.fail("GPT-2 uses the tanh approximation of GELU: use gelu_new.")
        relu = F.relu(x @ p["W_in"] + p["b_in"]) @ p["W_out"] + p["b_out"]
        if close_f32(out, relu):
            pytest.fail("GPT-2's MLP uses GELU (gelu_new, its tanh approximation), not ReLU.")
        no_bias = F.gelu(x @ p["W_in"], approximate="tanh") @ p["W_out"]
        if close_f32(out, no_bias):
            pytest.fail("Did you drop the biases b_in and b_out?")
        if close_f32(out, no_bias + p["b_out"]):
            pytest.fail("Did you forget b_in? It is added before the GELU.")
        gelu = F.gelu(x @ p["W_in"] + p["b_in"], approximate="tanh")
        if close_f32(out, gelu @ p["W_out"]):
            pytest.fail("Did you forget b_out? It is added after W_out.")
        late_b_in = F.gelu(x @ p["W_in"], approximate="tanh") + p["b_in"]
        if close_f32(out, late_b_in @ p["W_out"] + p["b_out"]):
            pytest.fail("b_in was added after the GELU: it belongs inside, before the GELU.")
    assert_matches(out, expected, "MLP (block 0)")


# --------------------------------------------------------------------------- block


@pytest.mark.block
@pytest.mark.parametrize("layer", [0, 1])
def test_block_matches_reference(impl, reference, ref_run, layer):
    _, _, cache = ref_run
    block = build(
        impl.TransformerBlock, reference.cfg, params_under(reference.params, f"blocks.{layer}.")
    )
    resid_pre = cache[f"blocks.{layer}.hook_resid_pre"].clone()
    out = block(resid_pre)
    assert torch.equal(resid_pre, cache[f"blocks.{layer}.hook_resid_pre"]), (
        "TransformerBlock modified resid_pre in place (`+=`): return a new tensor."
    )
    assert_matches(
        out,
        cache[f"blocks.{layer}.hook_resid_post"],
        f"TransformerBlock {layer}",
        "Pre-LN, as the text draws it: the attention reads ln1 of resid_pre, and its output "
        "added to resid_pre is resid_mid; the MLP reads ln2 of resid_mid (not of resid_pre), "
        "and its output is added to resid_mid.",
    )


# --------------------------------------------------------------------------- unembed


@pytest.mark.transformer
def test_unembed_matches_reference(impl, reference, ref_run):
    _, logits, cache = ref_run
    unembed = build(impl.Unembed, reference.cfg, params_under(reference.params, "unembed."))
    assert_matches(unembed(cache["ln_final.hook_out"]), logits, "Unembed")


@pytest.mark.transformer
def test_unembed_adds_its_bias(impl, reference):
    cfg = reference.cfg
    params = {
        "W_U": 0.1 * randn(cfg.d_model, cfg.d_vocab, seed=7),
        "b_U": randn(cfg.d_vocab, seed=8),  # GPT-2's is zero; a model trained with one is not
    }
    unembed = build(impl.Unembed, cfg, params)
    x = randn(2, 3, cfg.d_model, seed=9)
    expected = F.linear(x, params["W_U"].T, params["b_U"])
    assert_matches(unembed(x), expected, "Unembed with a non-zero b_U", "Did you add b_U?")


# --------------------------------------------------------------------------- transformer


def _demo(impl, reference):
    return build(impl.DemoTransformer, reference.cfg, reference.params)


@pytest.mark.transformer
def test_transformer_matches_bridge(impl, reference, ref_run):
    tokens, logits, cache = ref_run
    out = _demo(impl, reference)(tokens)
    # A known-wrong variant, diagnosed: the last block's output unembedded as it is.
    last = cache[f"blocks.{reference.cfg.n_layers - 1}.hook_resid_post"]
    unembed = params_under(reference.params, "unembed.")
    no_ln_final = last @ unembed["W_U"] + unembed["b_U"]
    if isinstance(out, torch.Tensor) and close_f32(out, no_ln_final):
        pytest.fail(
            "Your logits are the unembedding of the last block's output as it is: apply "
            "ln_final to the residual stream before unembed."
        )
    if isinstance(out, torch.Tensor) and not close_f32(out, logits):
        with torch.no_grad():  # the reference, run without its positional embedding
            no_positions = reference.bridge.run_with_hooks(
                tokens, fwd_hooks=[("hook_pos_embed", lambda t, hook: torch.zeros_like(t))]
            )
        if close_f32(out, no_positions):
            pytest.fail(
                "Your logits are the reference's with no positional embedding: add pos_embed's "
                "output to the token embeddings before the first block."
            )
        n = reference.cfg.n_layers
        embedded = cache["blocks.0.hook_resid_pre"]
        last_in = cache[f"blocks.{n - 1}.hook_resid_pre"]
        variants = [  # the reference run with one known mistake, by hooks
            (
                "the first block is skipped (its output is its input): does every block run, "
                "from block 0 on?",
                [("blocks.0.hook_resid_post", lambda t, hook: embedded)],
            ),
            (
                "the last block is skipped (its output is its input): does every block run?",
                [(f"blocks.{n - 1}.hook_resid_post", lambda t, hook: last_in)],
            ),
            (
                "each block reads the embeddings, not the previous block's output: the residual "
                "stream flows from block to block",
                [(f"blocks.{i}.hook_resid_pre", lambda t, hook: embedded) for i in range(1, n)],
            ),
        ]
        for mistake, hooks in variants:
            with torch.no_grad():
                wrong = reference.bridge.run_with_hooks(tokens, fwd_hooks=hooks)
            if close_f32(out, wrong):
                pytest.fail(f"Your logits are the reference's when {mistake}")
    assert_matches(out, logits, "DemoTransformer logits")


@pytest.mark.transformer
def test_transformer_matches_hf_on_a_batch(impl, reference):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, reference.cfg.d_vocab, (3, reference.cfg.n_ctx), generator=gen)
    with torch.no_grad():
        expected = reference.hf_model(tokens).logits
        out = _demo(impl, reference)(tokens)
    assert_matches(out, expected, "DemoTransformer on a full-context batch")


@pytest.mark.transformer
def test_transformer_rejects_bad_tokens(impl, reference):
    demo = _demo(impl, reference)
    n_ctx, d_vocab = reference.cfg.n_ctx, reference.cfg.d_vocab
    assert demo(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, d_vocab)
    for bad in [
        torch.zeros(1, n_ctx + 1, dtype=torch.long),  # longer than the context window
        torch.zeros(1, 3),  # float tokens
        torch.full((1, 3), d_vocab),  # id outside the vocabulary
        torch.zeros(3, dtype=torch.long),  # no batch dimension
    ]:
        with pytest.raises(ValueError):
            demo(bad)
