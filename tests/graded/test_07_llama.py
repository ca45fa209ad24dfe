"""Chapter 7: today's block, each part graded against Hugging Face's own Llama modules on the
same weights (LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb, LlamaMLP, repeat_kv,
LlamaAttention in eager mode, LlamaForCausalLM), on the shipped Llama model's weights and on
random ones whose every size differs (SMALL_LLAMA: an epsilon other than 1e-5, rope_theta other
than 10000, 6 query heads with 6, 2 and 1 key/value heads). Float32 bounds are chapter 1's.
Each part is also called the way the course's other callers call it: RMSNorm on 16-bit input
with a 16-bit weight and on 2-D input (chapter 8's runner), rope_cos_sin on 1-D positions (the
chapter's plot), apply_rope on bfloat16 queries, SwiGLU, the attention, the whole model and the
cached pass in bfloat16 against HF's modules in bfloat16, and the cached pass with chapter 6's
lookahead layout (positions [new], allowed [new, all]) on an untied model. The cached keys of a
left-padded batch are compared even where the logits agree (positions shifted within a row
change no logit), and the module tests check that an input is not changed in place and that a
second call does not reuse the first's angles.

Where a result is wrong, the test computes the likely mistakes on its own inputs (the mean
subtracted, epsilon outside the root, the exponent i/d, the interleaved layout, unrotated
keys, ...) and names the one that matches.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference, sentences
from tests.graded._oracles import (
    F32_ATOL,
    F32_RTOL,
    LLAMA_MISTAKES,
    assert_close_f32,
    close_f32,
    hf_attention,
    hf_cos_sin,
    hf_layer0_keys,
    hf_layer0_values,
    hf_llama_logits,
    hf_llama_mistake_logits,
    hf_qkv,
    hf_rotate,
    random_hf_llama,
    shipped_llama,
)

CHAPTER = "07_llama"


def close(a: torch.Tensor, b: torch.Tensor, atol: float = F32_ATOL, rtol: float = F32_RTOL):
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol)


@pytest.fixture(scope="module")
def llama():
    """(HF LlamaForCausalLM, tokenizer) of the shipped Llama model."""
    return shipped_llama()


@pytest.fixture(scope="module")
def small():
    """A random HF Llama of SMALL_LLAMA's sizes, untied, norm weights far from 1."""
    return random_hf_llama(seed=0)


def course_config(hf_config, **changes):
    from utils.convert import llama_config_from_hf

    cfg = llama_config_from_hf(hf_config)
    for name, value in changes.items():
        setattr(cfg, name, value)
    return cfg


def course_weights(hf) -> dict[str, torch.Tensor]:
    """HF's weights under the course's names (blocks.0.attn.W_Q ...), [in, out] layout."""
    from utils.convert import hf_to_llama, llama_config_from_hf

    return hf_to_llama(hf.state_dict(), llama_config_from_hf(hf.config))


def under(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


def learner_module(cls, cfg, params: dict[str, torch.Tensor]):
    module = cls(cfg)
    module.load_state_dict(params)
    return module.eval()


# --------------------------------------------------------------------------- RMSNorm


def rmsnorm_mistakes(x, w, eps) -> dict[str, torch.Tensor]:
    """What the likely wrong RMSNorms give on x (float32)."""
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        "mean": w * centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt(),
        "eps outside": w * x / (ms.sqrt() + eps),
        "no eps": w * x / ms.sqrt(),
        "no weight": x / (ms + eps).sqrt(),
        "one plus w": (1 + w) * x / (ms + eps).sqrt(),
        "sum": w * x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt(),
        "times": w * x * (ms + eps).sqrt(),
        "var": w * x / (x.var(-1, keepdim=True) + eps).sqrt(),
        "positions axis": w * x / (x.pow(2).mean(1, keepdim=True) + eps).sqrt(),
        "whole tensor": w * x / (x.pow(2).mean() + eps).sqrt(),
        "l2 norm": w * x / (x.norm(dim=-1, keepdim=True) + eps),
        "eps after": w * (x / ms.sqrt() + eps),
        "eps after the rsqrt": w * x * (ms.rsqrt() + eps),
        "mean abs": w * x / (x.abs().mean(-1, keepdim=True).pow(2) + eps).sqrt(),
        "len of the first axis": w * x / (x.pow(2).sum(-1, keepdim=True) / len(x) + eps).sqrt(),
    }


RMSNORM_MESSAGES = {
    "mean": "your RMSNorm subtracts the mean, as LayerNorm does: RMSNorm divides the vector as "
    "it is by its root mean square, with nothing subtracted (the residual's mean is kept).",
    "eps outside": "epsilon is added after the square root is taken: it belongs to the mean "
    "square, under the root, as in chapter 1's LayerNorm. Is your epsilon inside the sqrt?",
    "no eps": "your epsilon changes nothing: the mean square gets cfg.rms_norm_eps (0.01 in this "
    "test) added inside the sqrt. Is it missing, or a constant such as 1e-5?",
    "no weight": "the weight self.w is not applied: multiply the normalised vector by it.",
    "one plus w": "you scale by (1 + w), as Gemma's RMSNorm stores its weight: Llama's "
    "multiplies the normalised vector by the weight self.w itself (HF's LlamaRMSNorm: "
    "weight times the normalised vector).",
    "sum": "you divide by the root of the SUM of squares: RMSNorm takes their MEAN over d_model.",
    "times": "you multiply by the root mean square: RMSNorm divides by it (rsqrt is 1 / sqrt).",
    "var": "you divide by the root of the variance (torch.var subtracts the mean): RMSNorm "
    "takes the mean of the squares of the vector as it is.",
    "positions axis": "your mean square is taken over the positions axis: RMSNorm normalises "
    "each position's vector on its own, over d_model (the last axis).",
    "whole tensor": "your mean square is one number for the whole tensor: RMSNorm takes one per "
    "position, over that position's d_model numbers (the last axis), kept as an axis of size 1.",
    "l2 norm": "you divide by the vector's length, its L2 norm (the root of the SUM of squares, "
    "Tensor.norm): RMSNorm divides by the root of the MEAN square, with epsilon under the root.",
    "eps after": "epsilon is added to the normalised vector, after the division: it belongs to "
    "the mean square, under the root, where it keeps a vector of zeros from dividing by zero.",
    "eps after the rsqrt": "epsilon is added to the reciprocal of the root (one over the "
    "root, plus epsilon): it belongs to the mean square, under the root, so that the reciprocal "
    "is taken of the root of (mean square + epsilon). Is your epsilon inside the rsqrt?",
    "len of the first axis": "your sum of squares is divided by the length of the FIRST axis "
    "(len(x), the batch; the tokens of 2-D input): the mean is over d_model, the last axis, "
    "x.shape[-1] numbers.",
    "mean abs": "you divide by the mean of the absolute values: RMSNorm divides by the root of "
    "the mean of the SQUARES (the root mean square), which weighs large coordinates more.",
}


def run_norm(norm, x):
    """The learner's norm on x; a shape that does not broadcast is named, not pasted, and so is
    an input changed in place."""
    before = x.clone()
    try:
        with torch.no_grad():
            out = norm(x)
        if not torch.equal(x, before):
            pytest.fail(
                f"your RMSNorm changed its input, the caller's residual stream, in place "
                f"({x.dtype} input): the block adds the attention's output to that stream "
                "afterwards. "
                "Tensor.float() returns the tensor itself when it is float32 already, so an "
                "in-place operation on it (*=, mul_) writes into the input: make a new tensor."
            )
        return out
    except NotImplementedError:
        raise
    except RuntimeError as err:
        if "must match the size" not in str(err):
            raise
        pytest.fail(
            f"your RMSNorm on x {tuple(x.shape)} ([batch, posn, d_model]) meets two shapes that "
            f"do not broadcast ({str(err).splitlines()[0]}). Each position's mean square is "
            "[batch, posn, 1]: does your mean over d_model keep its axis (keepdim)?"
        )


@pytest.mark.rmsnorm
def test_rmsnorm_matches_hf_on_shipped_weights(impl, llama):
    """The shipped first layer's norm weight, a residual whose mean is far from zero, and an
    epsilon of 1e-2: the mean, the epsilon's place and the weight each change the output."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf, _ = llama
    w = hf.model.layers[0].input_layernorm.weight.detach()
    eps = 1e-2
    cfg = course_config(hf.config, rms_norm_eps=eps)
    oracle = LlamaRMSNorm(cfg.d_model, eps=eps)
    with torch.no_grad():
        oracle.weight.copy_(w * torch.linspace(0.5, 1.5, cfg.d_model))  # far from all ones
    g = torch.Generator().manual_seed(0)
    x = 0.1 * torch.randn(2, 3, cfg.d_model, generator=g) + 0.08
    norm = learner_module(impl.RMSNorm, cfg, {"w": oracle.weight.detach().clone()})
    got = run_norm(norm, x)
    with torch.no_grad():
        expected = oracle(x)
    assert got.shape == expected.shape, (
        f"expected shape {tuple(expected.shape)} ([batch, posn, d_model]), got {tuple(got.shape)}. "
        + explain_difference(got, expected, ("batch", "posn", "d_model"))
    )
    if not close(got, expected):
        for mistake, wrong in rmsnorm_mistakes(x, oracle.weight.detach(), eps).items():
            if close(got, wrong):
                pytest.fail(RMSNORM_MESSAGES[mistake])
        said = rms_of_rows(impl, cfg, x, eps)
        if said:
            pytest.fail(said)
        plain = run_norm(learner_module(impl.RMSNorm, cfg, {"w": torch.ones(cfg.d_model)}), x)
        if close(plain, x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()):
            pytest.fail(
                "with the weight all ones your RMSNorm agrees with HF's, with the weight given it "
                "does not: what does your weight multiply? It scales the normalised vector, after "
                "the division, each coordinate by its own weight (it is not part of what is "
                "normalised)."
            )
        assert_close_f32(got.float(), expected, "RMSNorm differs from HF's LlamaRMSNorm")


def rms_of_rows(impl, cfg, x, eps) -> str | None:
    """With the weight all ones, each row of RMSNorm's output has a root mean square of
    sqrt(ms / (ms + eps)), about 1: where the learner's rows do not, say what they were divided
    by (when each row is divided by one number) and what the root mean square is."""
    norm = learner_module(impl.RMSNorm, cfg, {"w": torch.ones(cfg.d_model)})
    got = run_norm(norm, x.clone()).float()
    if got.shape != x.shape:
        return None
    ms = x.pow(2).mean(-1)
    want = (ms / (ms + eps)).sqrt()
    rms = got.pow(2).mean(-1).sqrt()
    if close(rms, want, atol=1e-4, rtol=1e-3):
        return None

    def some(t):
        return ", ".join(f"{v:.3g}" for v in t.flatten()[:3].tolist())

    said = (
        f"with the weight set to all ones, each position's output should have a root mean "
        f"square of sqrt(ms / (ms + eps)), 1 where epsilon is small next to the mean square ms "
        f"(here {some(want)}, ...); yours has {some(rms)}, ... RMSNorm divides each "
        "position's vector by sqrt(mean(x_i^2) + eps): the root of the MEAN of the SQUARES of "
        "its d_model coordinates, plus epsilon under the root."
    )
    divisor = x / got
    one_each = (divisor - divisor[..., :1]).abs().max() <= 1e-4 * divisor.abs().max()
    if not one_each:
        return said
    d = divisor[..., 0]
    said += (
        f" Your rows are each divided by one number, {some(d)}, ..., where sqrt(ms + eps) is "
        f"{some((ms + eps).sqrt())}, ..."
    )
    n = x.shape[-1]
    if close(d, (ms * n / (n - 1) + eps).sqrt(), atol=1e-6, rtol=1e-5):
        said += (
            f": yours is the root of the sum of squares divided by d_model - 1 = {n - 1}, "
            "where the mean divides by d_model (no correction: nothing is estimated here)"
        )
    elif close(d, ms + eps, atol=1e-5, rtol=1e-4):
        said += (
            ": yours is the mean square itself, not its root. The divisor is the ROOT of the "
            "mean square (plus epsilon)"
        )
    elif close(d, (ms.sqrt() + eps).sqrt(), atol=1e-5, rtol=1e-4) or close(
        d, (ms + eps).sqrt().sqrt(), atol=1e-5, rtol=1e-4
    ):
        said += (
            ": yours is the FOURTH root of the mean square, the square root taken twice (rsqrt "
            "is 1 / sqrt already)"
        )
    elif close(d, (x.mean(-1).pow(2) + eps).sqrt(), atol=1e-5, rtol=1e-4):
        said += (
            ": yours is the root of the square of the MEAN (the mean taken first, then "
            "squared), not of the mean of the squares. Square each coordinate first"
        )
    return said + "."


@pytest.mark.rmsnorm
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_in_half_precision(impl, llama, dtype):
    """Values of a few hundred, as residual streams of large models hold: their squares
    overflow float16 (largest 65,504). Input and weight in 16 bits, as in a model loaded in
    16 bits. HF squares in float32, casts the normalised vector back to the input's dtype, then
    multiplies by the weight: its result is the input's dtype, and equal to HF's almost
    everywhere (HF's order of operations gives HF's numbers; another order, such as the weight
    applied before the cast, leaves about a fifth of them one rounding off)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf, _ = llama
    cfg = course_config(hf.config)
    oracle = LlamaRMSNorm(cfg.d_model, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        oracle.weight.copy_(hf.model.layers[1].input_layernorm.weight)
    g = torch.Generator().manual_seed(1)
    x32 = 300 * torch.randn(2, 3, cfg.d_model, generator=g)
    w32 = oracle.weight.detach().clone()
    with torch.no_grad():
        got32, want32 = (
            run_norm(learner_module(impl.RMSNorm, cfg, {"w": w32.clone()}), x32),
            oracle(x32),
        )
        if not close(got32, want32, atol=1e-4, rtol=1e-4):
            normalised = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
            for fixed in (torch.float16, torch.bfloat16):
                if close(got32, w32 * normalised.to(fixed).float(), atol=1e-4, rtol=1e-4):
                    pytest.fail(
                        f"on float32 input your RMSNorm's numbers carry {fixed}'s rounding: the "
                        f"normalised vector is cast to {fixed} whatever the input's dtype. Cast it "
                        "back to the input's own dtype (the one it came in), not to a fixed one."
                    )
            pytest.fail(
                sentences(
                    f"your RMSNorm differs from HF's LlamaRMSNorm in float32 already (values near "
                    f"300), not only in {dtype}",
                    explain_difference(got32, want32, ("batch", "posn", "d_model"), 1e-4, 1e-4),
                    "test_rmsnorm_matches_hf_on_shipped_weights compares it on smaller values",
                )
            )
    x, w = x32.to(dtype), w32.to(dtype)
    oracle = oracle.to(dtype)
    norm = learner_module(impl.RMSNorm, cfg, {"w": w.clone()}).to(dtype)
    with torch.no_grad():
        got, expected = run_norm(norm, x), oracle(x)
    assert torch.isfinite(got).all() and got.float().abs().max() > 0.1, (
        f"on {dtype} input your RMSNorm gives {'zeros' if torch.isfinite(got).all() else 'inf/NaN'}"
        f": the squares of values near 300 overflow {dtype} (float16's largest number is "
        "65,504). Compute the mean square in float32, then cast the normalised "
        "vector back to the input's dtype, as HF's LlamaRMSNorm does."
    )
    assert got.dtype == dtype, (
        f"on {dtype} input with a {dtype} weight your RMSNorm returns {got.dtype}: the next "
        "layer's 16-bit weights cannot multiply it (a model loaded in 16 bits stops there). "
        "The float32 copy is for the mean square only: cast the normalised vector back to the "
        "input's dtype before the weight multiplies it."
    )
    assert close(got, expected, atol=2e-2, rtol=2e-2), (
        f"on {dtype} input your RMSNorm differs from HF's by "
        f"{(got.float() - expected.float()).abs().max().item():.3g}: normalise in float32, cast "
        "back to the input's dtype, then multiply by the weight."
    )
    differ = (got != expected).float().mean().item()
    if differ > 0.05:
        xf = x.float()
        late_cast = (w.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)
                                                  + cfg.rms_norm_eps)).to(dtype)  # fmt: skip
        if (got == late_cast).float().mean() > 0.95:
            pytest.fail(
                f"on {dtype} input {differ:.0%} of your numbers are one rounding off HF's: your "
                "weight multiplies the float32 vector, and the product is cast back. HF casts "
                "the normalised vector back to the input's dtype first, then multiplies by the "
                f"{dtype} weight, and a checkpoint's numbers were made in that order."
            )
        pytest.fail(
            f"on {dtype} input {differ:.0%} of your numbers differ from HF's (each by a rounding "
            "or so): the mean square and the normalisation in float32, the cast back to the "
            "input's dtype, then the product with the weight, in that order."
        )


@pytest.mark.rmsnorm
@pytest.mark.parametrize(
    "x_dtype, w_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
def test_rmsnorm_with_its_weight_in_another_dtype(impl, llama, x_dtype, w_dtype):
    """Mixed precision keeps some weights in another dtype than the residual stream (a norm's
    weight in float32 beside a bfloat16 stream, say). HF casts the normalised vector back to
    the INPUT's dtype, then the weight multiplies it, and PyTorch's type promotion gives the
    product's dtype: float32 either way here, with the bfloat16 input's rounding in it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf, _ = llama
    cfg = course_config(hf.config)
    oracle = LlamaRMSNorm(cfg.d_model, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        oracle.weight.copy_(hf.model.layers[1].input_layernorm.weight)
    oracle = oracle.to(w_dtype)
    x = (3 * torch.randn(2, 3, cfg.d_model, generator=torch.Generator().manual_seed(5))).to(x_dtype)
    norm = learner_module(impl.RMSNorm, cfg, {"w": oracle.weight.detach().float()}).to(w_dtype)
    with torch.no_grad():
        got, want = run_norm(norm, x), oracle(x)
    assert got.dtype == want.dtype, (
        f"with a {x_dtype} input and a {w_dtype} weight, HF's LlamaRMSNorm returns {want.dtype}, "
        f"yours {got.dtype}: the normalised vector goes back to the INPUT's dtype (the one it "
        "came in), and then the weight multiplies it; PyTorch's promotion gives the product's "
        "dtype."
        + (f" Yours was cast to the weight's dtype ({w_dtype}) instead." if got.dtype == w_dtype
           else "")
    )  # fmt: skip
    ones = learner_module(impl.RMSNorm, cfg, {"w": torch.ones(cfg.d_model)}).to(w_dtype)
    with torch.no_grad():
        normalised = run_norm(ones, x).float()
    # The normalised vector already in the input's dtype (as HF's): the difference is elsewhere.
    rounded = x_dtype != torch.float32 and torch.equal(normalised.to(x_dtype).float(), normalised)
    assert close(got, want, atol=1e-6, rtol=1e-5), (
        f"with a {x_dtype} input and a {w_dtype} weight your RMSNorm differs from HF's by "
        f"{(got.float() - want.float()).abs().max().item():.3g}: "
        + (f"your normalised vector is in {x_dtype}, as HF's is, yet differs: is the mean "
           f"square computed in {x_dtype}? HF squares and averages in float32, then casts the "
           "normalised vector back." if rounded else
           f"HF's numbers carry {x_dtype}'s rounding, yours do not. The normalised vector is "
           f"cast back to the input's dtype ({x_dtype}) before the weight multiplies it, not "
           "to the weight's." if x_dtype != torch.float32 else
           "the normalisation in float32, the cast back to the input's dtype, then the product "
           "with the weight, in that order.")
    )  # fmt: skip


@pytest.mark.rmsnorm
def test_rmsnorm_on_2d_input(impl, llama):
    """Chapter 8's model runner hands ln_final the tokens of a step as [tokens, d_model], with
    no batch axis: a norm over the last axis works on any number of axes before it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf, _ = llama
    cfg = course_config(hf.config, rms_norm_eps=1e-2)
    oracle = LlamaRMSNorm(cfg.d_model, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        oracle.weight.copy_(hf.model.norm.weight)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, cfg.d_model, generator=g) + 0.05
    norm = learner_module(impl.RMSNorm, cfg, {"w": oracle.weight.detach().clone()})
    try:
        with torch.no_grad():
            got = run_norm(norm, x)
    except NotImplementedError:
        raise
    except Exception as err:
        pytest.fail(
            f"your RMSNorm fails on 2-D input [tokens 5, d_model {cfg.d_model}] "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120]}), the layout chapter 8's "
            "model runner hands ln_final. Does it name an axis by its number from the front (axis "
            "2 is the last only with 3 axes), or unpack three sizes? Count the axis from the end."
        )
    with torch.no_grad():
        expected = oracle(x)
    assert got.shape == expected.shape, (
        f"2-D input {tuple(x.shape)} ([tokens, d_model]): expected {tuple(expected.shape)} back, "
        f"got {tuple(got.shape)}. " + explain_difference(got, expected, ("tokens", "d_model"))
    )
    if not close(got, expected):
        w = oracle.weight.detach()
        by_column = w * x / (x.pow(2).mean(0, keepdim=True) + cfg.rms_norm_eps).sqrt()
        if close(got, by_column):
            pytest.fail(
                "on 2-D input [tokens, d_model] your mean square is taken over the tokens (axis "
                "0): each token's vector is normalised on its own, over d_model, the last axis."
            )
        assert_close_f32(got, expected, "RMSNorm on 2-D input differs from HF's LlamaRMSNorm")


# --------------------------------------------------------------------------- RoPE


def wrong_cos_sin(positions, d_head, theta) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The likely wrong cosines and sines."""

    def build(pos, exponents, theta_, interleave=False):
        angles = pos.double()[..., None] / theta_**exponents
        angles = angles.repeat_interleave(2, -1) if interleave else torch.cat([angles] * 2, -1)
        return angles.cos().float(), angles.sin().float()

    right = torch.arange(0, d_head, 2).double() / d_head
    found = {
        "exponent": build(positions, torch.arange(d_head // 2).double() / d_head, theta),
        "interleaved": build(positions, right, theta, interleave=True),
        "from 1": build(positions + 1, right, theta),
        "from 0": build(positions - positions[..., :1], right, theta),
        "inverse": build(positions, -right, theta),
        "4i": build(positions, 2 * right, theta),
        "2i + 1": build(positions, right + 1 / d_head, theta),
    }
    for dtype in (torch.float16, torch.bfloat16):  # the angles' product made in 16 bits
        inv_freq = (1.0 / theta ** right.float()).to(dtype)
        angles = (positions.to(dtype)[..., None] * inv_freq).double()
        angles = torch.cat([angles] * 2, -1)
        found[str(dtype)] = (angles.cos().float(), angles.sin().float())
    angles = positions.double()[..., None] * theta ** -(2 * torch.arange(d_head // 2).double())
    angles = torch.cat([angles / d_head] * 2, -1)  # theta ** (-2i) / d_head: ** binds first
    found["precedence"] = (angles.cos().float(), angles.sin().float())
    if theta != 10000.0:
        found["theta"] = build(positions, right, 10000.0)
    cos, sin = build(positions, right, theta)
    found["swapped"] = (sin, cos)
    return found


COS_SIN_MESSAGES = {
    "precedence": "your frequencies are theta ** (-2i) / d_head: ** binds before /, so the "
    "division by d_head went to the frequency, not into the exponent. Pair "
    "i's frequency is theta ** (-2i / d_head): the exponent in parentheses.",
    "exponent": "pair i's frequency must be theta ** (-2i / d_head): yours is theta ** "
    "(-i / d_head), so every pair after the first turns too fast. Is the exponent 2i/d?",
    "interleaved": "your angles are in the interleaved layout (phi_0, phi_0, phi_1, phi_1, ...): "
    "HF's half-split layout puts pair i in columns i and i + d_head/2, so the angles are "
    "(phi_0, ..., phi_last, phi_0, ..., phi_last): two copies one after the other.",
    "from 1": "your angles are those of the next position: positions count from 0 (use the "
    "positions you are given as they are, not positions + 1).",
    "from 0": "your angles start again at 0 in every row: use the positions you are given, which "
    "here do not start at 0.",
    "theta": "your angles use theta = 10000, not the theta you are given: read the argument "
    "(rope_theta is 100000 for SmolLM2-135M, 500000 here).",
    "swapped": "your cos and sin are swapped: return the cosines first.",
    "inverse": "your angles grow with the pair: position * theta ** (+2i / d_head). Pair i's "
    "frequency is ONE OVER theta ** (2i / d_head), so that later pairs turn slower.",
    "4i": "your exponent is 2i / (d_head / 2), that is 4i / d_head: pair i's exponent is 2i over "
    "the whole head size d_head.",
    "2i + 1": "your exponent is (2i + 1) / d_head: pair i's is 2i / d_head, so pair 0 has "
    "exponent 0 and turns by one radian per position. Do your 2i start at 0?",
    "torch.float16": "your angles are computed in float16: with about 3 significant digits, the "
    "angle of position 46 is off by up to 0.03 radians (and at position 4,000 by 2). Compute the "
    "frequencies, the angles and their cosines and sines in float32.",
    "torch.bfloat16": "your angles are computed in bfloat16: with about 2 significant digits, the "
    "angle of position 46 is off by up to 0.1 radians. Compute the frequencies, the angles and "
    "their cosines and sines in float32.",
}


def measured_frequencies(cos, sin, positions, d_head, theta) -> str:
    """What cos and sin say about each pair's frequency, where they hold angles that grow by a
    fixed step per position (else an empty string)."""
    if not ((cos.double() ** 2 + sin.double() ** 2 - 1).abs() < 1e-3).all():
        return ""
    phi = torch.atan2(sin.double(), cos.double())[..., : d_head // 2]
    steps = (phi[..., 1:, :] - phi[..., :-1, :] + torch.pi) % (2 * torch.pi) - torch.pi
    steps = steps / (positions[..., 1:] - positions[..., :-1]).double()[..., None]
    freq = steps.flatten(0, -2).median(0).values
    if not ((steps - freq).abs() < 1e-3).all() or not (freq > 0).all():
        return ""
    right = theta ** (-torch.arange(0, d_head, 2).double() / d_head)
    bad = int(((freq - right).abs() / right).argmax())
    shown = min(4, d_head // 2)
    exponents = -torch.log(freq) / math.log(theta) * d_head
    if (freq - right).abs().max() < 1e-4:
        return ""
    return (
        f" Your pairs 0 to {shown - 1} turn by {[round(f, 4) for f in freq[:shown].tolist()]} "
        f"radians per position, HF's by {[round(f, 4) for f in right[:shown].tolist()]} "
        f"(theta ** (-2i / d_head)); pair {bad} is furthest off. Read as theta ** (-e / d_head), "
        f"your e are {[round(e, 2) for e in exponents[:shown].tolist()]}, where 0, 2, 4, 6 are "
        "wanted."
    )


def check_cos_sin(impl, positions, d_head, theta):
    from transformers import LlamaConfig as HFLlamaConfig

    config = HFLlamaConfig(
        hidden_size=4 * d_head,
        num_attention_heads=4,
        head_dim=d_head,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    if positions.ndim == 1:  # HF's rotary embedding wants [batch, posn]
        expected_cos, expected_sin = (t[0] for t in hf_cos_sin(config, positions[None]))
    else:
        expected_cos, expected_sin = hf_cos_sin(config, positions)
    try:
        out = impl.rope_cos_sin(positions.clone(), d_head, theta)
    except NotImplementedError:
        raise
    except (RuntimeError, IndexError) as err:
        layout = {1: "[posn], as the chapter's plot of the angles passes them", 2: "[batch, posn]"}
        pytest.fail(
            f"rope_cos_sin fails on positions {tuple(positions.shape)} "
            f"({layout.get(positions.ndim, '[*batch, posn]')}): {type(err).__name__}: "
            f"{str(err).splitlines()[0][:100]}. Positions come with any number of axes before "
            "posn ([*batch, posn]): does your code assume a number of axes (indexing [:, :, None], "
            "torch.outer, an einsum that names them)? A new last axis, after however many "
            "axes come first, times the frequencies broadcasts over all of them."
        )
    assert isinstance(out, tuple) and len(out) == 2, "rope_cos_sin must return (cos, sin)"
    cos, sin = out
    shape = (*positions.shape, d_head)
    why = ""
    if cos.shape[:-1] == shape[:-1] and cos.shape[-1] != d_head:
        why = (
            f": your last axis holds {cos.shape[-1]} angles. A head has d_head/2 = {d_head // 2} "
            "pairs, one frequency each, and the half-split layout writes those angles twice."
        )
    elif cos.shape[:-2] == shape[:-2] and cos.shape[-2:] == (2 * shape[-2], d_head // 2):
        why = (
            ": twice the positions and half the columns. The two copies of the angles go one "
            "after the other along the last axis, not the positions axis."
        )
    assert cos.shape == shape and sin.shape == shape, (
        f"positions {tuple(positions.shape)} and d_head {d_head}: cos and sin must be {shape} "
        f"([*batch, posn, d_head]), got {tuple(cos.shape)} and {tuple(sin.shape)}{why}"
    )
    cos_right = close(cos, expected_cos, atol=1e-5)
    sin_right = close(sin, expected_sin, atol=1e-5)
    axes = ("batch", "posn", "d_head")[-positions.ndim - 1 :] if positions.ndim < 3 else None
    if cos_right and sin_right:
        assert cos.dtype == sin.dtype == torch.float32, (
            f"your cos and sin are {cos.dtype} and {sin.dtype}: return them in float32 (apply_rope "
            "casts them to the dtype of the queries it turns)."
        )
        return
    for mistake, (wrong_cos, wrong_sin) in wrong_cos_sin(positions, d_head, theta).items():
        # Angles of thousands of radians, as growing frequencies give, lose a few thousandths
        # in float32: their cosines are compared more loosely (the right ones differ by ~1);
        # 16-bit cosines are rounded to 16 bits.
        atol = {"inverse": 5e-2, "torch.float16": 2e-3, "torch.bfloat16": 8e-3}.get(mistake, 1e-4)
        if close(cos, wrong_cos, atol=atol) and close(sin, wrong_sin, atol=atol):
            pytest.fail(COS_SIN_MESSAGES[mistake])
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        pytest.fail(
            f"your cos and sin are {cos.dtype} and {sin.dtype}, and differ from HF's: compute the "
            "frequencies, the angles and their cosines and sines in float32."
        )

    def worst(got, want):
        bad = (got - want).abs().amax(dim=tuple(range(got.ndim - 1)))
        column = int(bad.argmax())
        return f"column {column} (pair {column % (d_head // 2)}), by {bad.max().item():.3g}"

    where = f"HF's LlamaRotaryEmbedding's (theta {theta:g}, d_head {d_head})"
    if cos_right:
        pytest.fail(
            sentences(
                f"your cos equals {where}, your sin does not: it differs most in "
                f"{worst(sin, expected_sin)}",
                explain_difference(sin, expected_sin, axes, atol=1e-5, rtol=1e-5),
                "The sines are of the same angles as the cosines, in the same layout: both "
                "halves of the last axis hold the same sines (the minus sign of the rotation is "
                "rotate_half's)",
            )
        )
    if sin_right:
        pytest.fail(
            f"your sin equals {where}, your cos does not: it differs most in "
            f"{worst(cos, expected_cos)}. The cosines are of the same angles as the sines, in "
            "the same layout."
        )
    pytest.fail(
        f"cos differs from {where} most in {worst(cos, expected_cos)}: pair i's angle is "
        "position * theta ** (-2i / d_head), in columns i and i + d_head/2."
        + measured_frequencies(cos, sin, positions, d_head, theta)
    )


@pytest.mark.rope
def test_rope_cos_sin_match_hf(impl):
    """The shipped model's head size and theta; two rows whose positions differ and do not
    start at 0."""
    positions = torch.stack([torch.arange(3, 10), torch.arange(40, 47)])
    check_cos_sin(impl, positions, d_head=32, theta=10000.0)


@pytest.mark.rope
def test_rope_cos_sin_read_theta(impl):
    """A theta other than 10000, another head size, one row."""
    check_cos_sin(impl, torch.arange(5, 11)[None], d_head=16, theta=500000.0)


@pytest.mark.rope
def test_rope_cos_sin_on_1d_positions(impl):
    """Positions [posn] with no batch axis, as the chapter's plot of the angles passes them: the
    signature is [*batch, posn], any number of axes before posn."""
    check_cos_sin(impl, torch.arange(3, 9), d_head=8, theta=10000.0)


@pytest.mark.rope
def test_rope_cos_sin_are_made_on_the_positions_device(impl):
    positions = torch.arange(4, device="meta")[None]
    try:
        cos, sin = impl.rope_cos_sin(positions, 8, 10000.0)
    except RuntimeError as err:  # a CPU tensor meeting a meta one, or not a device slip
        if "device" not in str(err):
            raise
        pytest.fail(
            "rope_cos_sin with positions on another device (PyTorch's meta device here, a GPU "
            f"for real) fails: {type(err).__name__}: {str(err).splitlines()[0][:120]}. A tensor "
            "you make (torch.arange of the frequencies) sits on the CPU: make it on the "
            "positions' device."
        )
    assert cos.device.type == "meta" and sin.device.type == "meta", (
        f"rope_cos_sin made cos and sin on {cos.device}, not on the positions' device: pass "
        "device=positions.device to the tensors you create (torch.arange)."
    )


def rotate_half_of(x):
    """HF's rotate_half: (x1, x2) -> (-x2, x1)."""
    from transformers.models.llama.modeling_llama import rotate_half

    return rotate_half(x)


def interleaved_rotation(x, cos, sin):
    """Neighbours (2i, 2i + 1) turned, with cos and sin in HF's half-split layout: the rotation
    written for the paper's layout, fed HF's angles."""
    pairs = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
    return x * cos[:, None] + pairs * sin[:, None]


@pytest.mark.rope
def test_apply_rope_matches_hf(impl):
    """Queries [batch 2, heads 3, posn 5, d_head 8], HF's angles for positions from 6 and 20."""
    from transformers import LlamaConfig as HFLlamaConfig

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, 8, generator=g)
    positions = torch.stack([torch.arange(6, 11), torch.arange(20, 25)])
    config = HFLlamaConfig(hidden_size=24, num_attention_heads=3, head_dim=8)
    cos, sin = hf_cos_sin(config, positions)
    try:
        got = impl.apply_rope(x.clone(), cos, sin)
    except NotImplementedError:
        raise
    except RuntimeError as err:
        if "must match the size" not in str(err):
            raise
        pytest.fail(
            f"x {tuple(x.shape)} ([batch, heads, posn, d_head]) and cos {tuple(cos.shape)} "
            f"([batch, posn, d_head]) do not broadcast ({str(err).splitlines()[0]}): cos and sin "
            "need an axis of size 1 for the heads, at axis 1, so that every head of a position "
            "turns by that position's angles."
        )
    expected = hf_rotate(x, cos, sin)
    assert got.shape == expected.shape, (
        f"x {tuple(x.shape)}: expected {tuple(expected.shape)} back, got {tuple(got.shape)}. "
        "cos and sin are [batch, posn, d_head]: give them an axis for the heads (axis 1)."
    )
    if close_f32(got, expected):
        return
    if close_f32(got, interleaved_rotation(x, cos, sin)):
        pytest.fail(
            "you turn neighbouring coordinates (2i, 2i + 1) together, the interleaved layout of "
            "the RoFormer paper and Meta's code: HF's half-split layout pairs coordinate i with "
            "i + d_head/2 (that is what rotate_half does)."
        )
    if close_f32(got, rotate_half_of(x) * cos[:, None] + x * sin[:, None]):
        pytest.fail(
            "your cosines multiply rotate_half(x) and your sines x: a pair (a, b) turned by phi "
            "keeps a cos phi in its first coordinate. x goes with the cosines, rotate_half(x) "
            "with the sines."
        )
    if close_f32(got, hf_rotate(x, cos, -sin)):
        pytest.fail(
            "your rotation turns the wrong way: a pair (a, b) turned by phi is "
            "(a cos phi - b sin phi, b cos phi + a sin phi). Check the sine's sign."
        )
    for name, args in (("sin", (cos, 2 * sin)), ("cos", (2 * cos, sin))):
        if torch.equal(impl.apply_rope(x.clone(), *args), got):
            pytest.fail(
                f"your apply_rope gives the same output whatever {name} holds: {name} is never "
                "used. A pair turned by phi mixes cos phi and sin phi: x times the cosines, "
                "plus rotate_half(x) times the sines."
            )
    scaled = x * cos[:, None]
    if close_f32(got, scaled + rotate_half_of(scaled) * sin[:, None]):
        pytest.fail(
            "your rotate_half reads x already multiplied by the cosines: (x cos) + rotate_half(x "
            "cos) sin. Is a name (x) given x * cos before rotate_half reads it? Both terms read "
            "the x you were given: x cos + rotate_half(x) sin."
        )
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)  # rotate_half without its sign
    if close_f32(got, x * cos[:, None] + swapped * sin[:, None]):
        pytest.fail(
            "your second term pairs each coordinate with its partner in the other half, but "
            "without the sign: a pair (a, b) turned by phi is (a cos phi - b sin phi, b cos phi "
            "+ a sin phi), so the first half's partner enters with a minus (rotate_half gives "
            "(-x2, x1); swapping the halves alone gives (x2, x1))."
        )
    for fixed in (torch.float16, torch.bfloat16):
        if close_f32(got.float(), hf_rotate(x, cos.to(fixed).float(), sin.to(fixed).float())):
            pytest.fail(
                f"on float32 queries your rotation uses cos and sin rounded to {fixed}: they are "
                "cast to a fixed 16-bit dtype whatever x's. Cast them to x's own dtype (float32 "
                "here, bfloat16 in a bfloat16 model)."
            )
    assert_close_f32(got, expected, "apply_rope differs from HF's apply_rotary_pos_emb")


@pytest.mark.rope
def test_apply_rope_keeps_the_queries_dtype(impl):
    """A model in bfloat16: queries in bfloat16, the angles' cos and sin in float32 (as
    rope_cos_sin makes them). HF's LlamaRotaryEmbedding casts cos and sin to the input's dtype,
    so its queries and keys stay bfloat16, like the values they meet in the attention."""
    from transformers import LlamaConfig as HFLlamaConfig

    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 3, 5, 8, generator=g).to(torch.bfloat16)
    positions = torch.stack([torch.arange(6, 11), torch.arange(20, 25)])
    cos, sin = hf_cos_sin(
        HFLlamaConfig(hidden_size=24, num_attention_heads=3, head_dim=8), positions
    )
    with torch.no_grad():
        got = impl.apply_rope(x.clone(), cos.clone(), sin.clone())
    expected = hf_rotate(x, cos.to(x.dtype), sin.to(x.dtype))
    assert got.dtype == x.dtype, (
        f"apply_rope on bfloat16 queries with float32 cos and sin returns {got.dtype}: the float32 "
        "angles promote what they multiply. A model in bfloat16 then meets float32 queries and "
        "keys with bfloat16 values in its attention, which refuses them. Turn x in its own dtype "
        "(HF's LlamaRotaryEmbedding casts cos and sin to the input's dtype)."
    )
    assert close(got, expected, atol=3e-2, rtol=1e-2), (
        "apply_rope on bfloat16 queries differs from HF's apply_rotary_pos_emb by "
        f"{(got.float() - expected.float()).abs().max().item():.3g}, more than bfloat16's "
        "rounding: test_apply_rope_matches_hf says more in float32."
    )


@pytest.mark.rope
def test_rotated_scores_depend_only_on_the_offset(impl):
    """RoPE's point: a rotated query's score with a rotated key is a function of the offset
    between their positions, wherever the two sit; a different offset, a different score."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 1, 1, 16, generator=g)

    def score(m, n):
        cos_m, sin_m = impl.rope_cos_sin(torch.tensor([[m]]), 16, 10000.0)
        cos_n, sin_n = impl.rope_cos_sin(torch.tensor([[n]]), 16, 10000.0)
        return (impl.apply_rope(q, cos_m, sin_m) * impl.apply_rope(k, cos_n, sin_n)).sum().item()

    for offset in (0, 3, 17):
        scores = [score(m + offset, m) for m in (0, 5, 123)]
        assert max(scores) - min(scores) < 1e-4, (
            f"query and key {offset} positions apart give scores {scores} at three places: a "
            "rotated score must depend on the offset only. Do queries and keys turn by the "
            "same angles for the same position?"
        )
    assert abs(score(3, 0) - score(4, 0)) > 1e-4, (
        "offsets 3 and 4 give the same score: your rotation does not depend on the position"
    )


# --------------------------------------------------------------------------- SwiGLU

SWIGLU_MESSAGES = {
    "up": "SiLU is on the up branch: the gate branch (through W_gate) is the one that goes through "
    "SiLU; the up branch stays linear.",
    "product": "SiLU is applied to the product: it goes on the gate branch only, before the "
    "product with the up branch.",
    "gelu": "that is GELU on the gate: today's gated MLP uses SiLU (F.silu), x * sigmoid(x).",
    "none": "there is no SiLU: the gate branch goes through F.silu before the product.",
    "sigmoid": "the gate goes through a sigmoid (the original GLU): SwiGLU's gate goes through "
    "SiLU, x * sigmoid(x) (F.silu).",
    "relu": "that is ReLU on the gate (ReGLU): today's gated MLP uses SiLU (F.silu).",
    "sum": "the two branches are added: SwiGLU multiplies SiLU(gate) by up element by element.",
    "residual": "your output has the MLP's input added to it: the MLP returns its down projection "
    "alone, and the block adds that to the residual stream (adding it here counts it twice).",
}


def check_swiglu(impl, hf, layer):
    cfg = course_config(hf.config)
    mlp = hf.model.layers[layer].mlp
    params = under(course_weights(hf), f"blocks.{layer}.mlp.")
    module = learner_module(impl.SwiGLU, cfg, params)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, cfg.d_model, generator=g)
    try:
        with torch.no_grad():
            got = module(x)
    except NotImplementedError:
        raise
    except RuntimeError as err:
        if "cannot be multiplied" not in str(err):
            raise
        pytest.fail(
            f"a product of your SwiGLU does not fit ({str(err).splitlines()[0]}): the course keeps "
            f"chapter 1's [in, out] layout, W_gate and W_up [d_model {cfg.d_model}, d_mlp "
            f"{cfg.d_mlp}] and W_down [d_mlp, d_model], so each is applied as x @ W (F.linear "
            "expects HF's [out, in] weights)."
        )
    with torch.no_grad():
        expected = mlp(x)
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        down = mlp.down_proj
        wrong = {
            "up": down(gate * F.silu(up)),
            "product": down(F.silu(gate * up)),
            "gelu": down(F.gelu(gate) * up),
            "none": down(gate * up),
            "sigmoid": down(torch.sigmoid(gate) * up),
            "relu": down(F.relu(gate) * up),
            "sum": down(F.silu(gate) + up),
            "residual": expected + x,
        }
    assert got.shape[-1] != cfg.d_mlp or cfg.d_mlp == cfg.d_model, (
        f"your output is d_mlp = {cfg.d_mlp} wide: the product of the two branches goes through "
        f"W_down, back to d_model = {cfg.d_model}."
    )
    assert got.shape == expected.shape, (
        f"expected {tuple(expected.shape)} ([batch, posn, d_model]), got {tuple(got.shape)}. "
        + explain_difference(got, expected, ("batch", "posn", "d_model"))
    )
    if close_f32(got, expected):
        return
    for mistake, candidate in wrong.items():
        if close_f32(got, candidate):
            pytest.fail(SWIGLU_MESSAGES[mistake])
    said = weight_roles(impl, cfg, params, x, got) or gate_branch(impl, cfg)
    if said:
        pytest.fail(said)
    assert_close_f32(got, expected, "SwiGLU differs from HF's LlamaMLP on the same weights")


def weight_roles(impl, cfg, params, x, got) -> str | None:
    """What each weight does to the learner's output, read by doubling it alone: SwiGLU's
    output doubles with W_up (the linear branch) and with W_down (applied once, last), and
    changes with W_gate. A weight that changes nothing is never used; a factor other than 2 says
    how often, or where, it is applied."""
    factors = {}
    for name in ("W_gate", "W_up", "W_down"):
        doubled = {**params, name: 2 * params[name]}
        try:
            with torch.no_grad():
                out = learner_module(impl.SwiGLU, cfg, doubled)(x.clone())
        except Exception:
            return None
        if out.shape != got.shape:
            return None
        if close_f32(out, got):
            factors[name] = 1.0
        else:
            ratio = (out * got).sum() / (got * got).sum()  # the best single factor
            factors[name] = round(ratio.item(), 2) if close_f32(out, ratio * got) else None
    for name in ("W_gate", "W_up", "W_down"):
        if factors[name] == 1.0:
            return (
                f"your output does not change when {name} does: {name} is never used. SwiGLU "
                "projects the input through W_gate (activated) and W_up (not), multiplies the "
                "two, and projects the product through W_down."
            )
    for name, role in (("W_down", "applied once, last, to the gated product"),
                       ("W_up", "the branch that is not activated")):  # fmt: skip
        if factors[name] != 2.0:
            how = (f"scaled it by {factors[name]:g}" if factors[name] is not None
                   else "changed it by no single factor")  # fmt: skip
            return (
                f"doubling {name} alone should double SwiGLU's output ({name} is {role}); in "
                f"yours it {how}. Where, and how many times, does {name} enter your product?"
            )
    return None


def gate_branch(impl, cfg) -> str | None:
    """The gate branch alone, read through weights that make the output the activated gate:
    d_mlp = d_model, W_down = I, W_up reading the input's last coordinate (1), W_gate = c * I.
    Then SwiGLU gives SiLU(c * g) for each other coordinate g; what the learner's gives says
    whether the activation is SiLU, and (c = 2) whether it comes after the projection."""
    d = cfg.d_model
    probe = copy.copy(cfg)
    probe.d_mlp = d
    g = torch.linspace(-4, 4, d - 1)
    g[:4] = torch.tensor([2.0, -2.0, 1.0, -1.0])
    x = torch.cat([g, torch.ones(1)])[None, None]
    W_up = torch.zeros(d, d)
    W_up[-1] = 1.0

    def gate_out(W_gate, W_up):
        params = {"W_gate": W_gate, "W_up": W_up, "W_down": torch.eye(d)}
        try:
            with torch.no_grad():
                out = learner_module(impl.SwiGLU, probe, params)(x.clone())
        except Exception:
            return None
        return out[0, 0, :-1] if out.shape == x.shape else None

    # First the up branch, with a constant gate (W_gate reads the 1): the output must be the
    # input times one number. Only then does the gate probe below speak of the gate alone.
    linear_up = gate_out(W_up, torch.eye(d))
    if linear_up is None or not close_f32(linear_up, linear_up[0] / g[0] * g):
        return None
    if linear_up[0].abs() < 1e-3:
        return None
    one, two = gate_out(torch.eye(d), W_up), gate_out(2 * torch.eye(d), W_up)
    if one is None or two is None:
        return None
    at = "; ".join(
        f"at g = {v:g} SiLU gives {F.silu(torch.tensor(v)).item():.3g}, yours {o:.3g}"
        for v, o in zip(g[:2].tolist(), one[:2].tolist(), strict=True)
    )
    if not close_f32(one, F.silu(g)):
        return (
            "your gate's activation is not SiLU: with W_up and W_down chosen so that the "
            f"output is the activated gate itself, {at}. SiLU(g) = g * sigmoid(g), and "
            "sigmoid(g) = 1 / (1 + exp(-g)). Which activation does your gate branch apply?"
        )
    if not close_f32(two, F.silu(2 * g)):
        if close_f32(two, 2 * F.silu(g)):
            return (
                "with W_gate = I your gate branch gives SiLU(g), but with W_gate = 2 I it gives "
                f"2 SiLU(g) (at g = 1: {two[2].item():.3g}, where SiLU(2) = "
                f"{F.silu(torch.tensor(2.0)).item():.3g}): your SiLU is applied to the input, "
                "before the projection through W_gate. It goes on the projection x @ W_gate."
            )
        return (
            "with W_gate = I your gate branch is SiLU(g), but with W_gate = 2 I it is not "
            "SiLU(2 g): is SiLU applied to the gate's projection, x @ W_gate, and to it alone?"
        )
    return None


@pytest.mark.swiglu
def test_swiglu_matches_hf_on_shipped_weights(impl, llama):
    check_swiglu(impl, llama[0], layer=1)


@pytest.mark.swiglu
def test_swiglu_matches_hf_with_other_widths(impl, small):
    """d_model 42, d_mlp 72: a weight read transposed cannot line up."""
    check_swiglu(impl, small, layer=0)


@pytest.mark.swiglu
def test_swiglu_in_bfloat16(impl, small):
    """Input and weights in bfloat16, as in a model loaded in 16 bits: the result keeps the
    input's dtype and is HF's LlamaMLP in bfloat16 up to rounding (the bound: twice HF's own
    bfloat16 distance from its float32 output, and at least 0.05)."""
    cfg = course_config(small.config)
    mlp32 = small.model.layers[0].mlp
    mlp16 = copy.deepcopy(mlp32).to(torch.bfloat16)
    params = {
        k: v.to(torch.bfloat16) for k, v in under(course_weights(small), "blocks.0.mlp.").items()
    }
    module = learner_module(impl.SwiGLU, cfg, params).to(torch.bfloat16)
    g = torch.Generator().manual_seed(15)
    x = torch.randn(2, 3, cfg.d_model, generator=g).to(torch.bfloat16)
    try:
        with torch.no_grad():
            got = module(x.clone())
    except NotImplementedError:
        raise
    except RuntimeError as err:
        pytest.fail(
            "your SwiGLU fails on bfloat16 input with bfloat16 weights "
            f"({str(err).splitlines()[0][:100]}): a part of it leaves bfloat16 (a .float() on "
            "a branch?) and then meets a bfloat16 "
            "weight. Keep every product in the input's dtype, as HF's LlamaMLP does."
        )
    assert got.dtype == torch.bfloat16, (
        f"on bfloat16 input with bfloat16 weights your SwiGLU returns {got.dtype}: the next "
        "layer's bfloat16 weights cannot take it. Keep every product in the input's dtype."
    )
    with torch.no_grad():
        want16, want32 = mlp16(x), mlp32(x.float())
    bound = max(0.05, 2 * (want16.float() - want32).abs().max().item())
    gap = (got.float() - want16.float()).abs().max().item()
    assert gap <= bound, (
        f"in bfloat16 your SwiGLU differs from HF's LlamaMLP in bfloat16 by up to {gap:.3g}, more "
        f"than bfloat16's rounding ({bound:.3g}): test_swiglu_matches_hf_on_shipped_weights says "
        "more in float32."
    )


# --------------------------------------------------------------------------- expand_kv


@pytest.mark.expand_kv
@pytest.mark.parametrize("n_kv_heads,group", [(2, 3), (3, 1), (1, 4)])
def test_expand_kv_matches_hf_repeat_kv(impl, n_kv_heads, group):
    """GQA (2 key/value heads in groups of 3), and both ends: multi-head (groups of 1) and
    multi-query (one key/value head for 4 query heads)."""
    from transformers.models.llama.modeling_llama import repeat_kv

    g = torch.Generator().manual_seed(5)
    kv = torch.randn(7, n_kv_heads, 5, 6, generator=g)
    try:
        got = impl.expand_kv(kv.clone(), group)
    except RuntimeError as err:
        if "expanded size" not in str(err) or n_kv_heads == 1:
            raise
        pytest.fail(
            f"with {n_kv_heads} key/value heads in groups of {group} your expand_kv fails "
            f"({str(err).splitlines()[0]}). Tensor.expand only repeats axes of size 1 (a view "
            "that reads the same numbers again): it works with one key/value head and no other. "
            "Each key/value head needs group_size copies next to each other along the heads "
            "axis (repeat_interleave makes such copies)."
        )
    expected = repeat_kv(kv, group)
    said = (
        f"keys [batch 7, n_kv_heads {n_kv_heads}, pos 5, d_head 6] in groups of {group}: expected "
        f"{tuple(expected.shape)}, got {tuple(got.shape)}."
    )
    if got.ndim == 4 and got.shape != expected.shape:
        names = ("batch", "heads", "positions", "d_head")
        grew = [names[a] for a in (0, 2, 3) if got.shape[a] != expected.shape[a]]
        if grew:
            said += (
                f" Your {' and '.join(grew)} axis changed size: the copies go along the heads "
                "axis (axis 1), and every other axis keeps its size."
            )
        elif (
            got.shape[1] < expected.shape[1]
            and (expected.shape[1] - got.shape[1]) % group == 0
            and torch.equal(got, expected[:, : got.shape[1]])
        ):
            said += (
                f" Your {got.shape[1]} heads are the first {got.shape[1]} of the expected "
                f"{expected.shape[1]}, right as far as they go: the groups of the last "
                f"{(expected.shape[1] - got.shape[1]) // group} key/value head(s) are missing. "
                "Does a loop over the key/value heads stop one short (range(n - 1))?"
            )
        else:
            said += (
                f" Your heads axis holds {got.shape[1]} heads where n_kv_heads x group_size = "
                f"{n_kv_heads} x {group} = {n_kv_heads * group} are wanted: each key/value head is "
                "copied group_size times (group_size is the number of query heads per key/value "
                "head, not a number of heads to reach)."
            )
    else:
        said += " Repeat along the heads axis (axis 1)."
    assert got.shape == expected.shape, said
    if torch.equal(got, expected):
        return
    tiled = kv.repeat(1, group, 1, 1)
    if torch.equal(got, tiled):
        pytest.fail(
            f"your copies are in the order k0, k1, ..., k0, k1, ...: query head 1 then reads "
            f"key/value head 1. HF's repeat_kv gives each group of {group} consecutive query "
            f"heads one key/value head: k0 for query heads 0..{group - 1}, then k1, ... "
            "(Tensor.repeat, or a new axis IN FRONT of the heads, tiles the heads; each head's "
            "copies stay together when the new axis comes right after the heads axis, as "
            "repeat_interleave along it does)."
        )
    for head in range(got.shape[1]):
        if not any(torch.equal(got[:, head], kv[:, j]) for j in range(n_kv_heads)):
            pytest.fail(
                f"head {head} of your output is not a copy of any key/value head: each of the "
                f"{n_kv_heads * group} heads must be one of the {n_kv_heads} input heads, "
                "unchanged. Did a reshape mix the heads axis with another one?"
            )
    copies = [next(j for j in range(n_kv_heads) if torch.equal(got[:, h], kv[:, j]))
              for h in range(got.shape[1])]  # fmt: skip
    want = [h // group for h in range(got.shape[1])]
    pytest.fail(
        f"expand_kv differs from HF's repeat_kv: your heads are copies of the key/value heads "
        f"{copies}, HF's of {want}: each key/value head j is copied group_size times, in "
        "place, and every key/value head is used."
    )


# --------------------------------------------------------------------------- GQA


def gqa_of(impl, hf, layer):
    cfg = course_config(hf.config)
    params = under(course_weights(hf), f"blocks.{layer}.attn.")
    return learner_module(impl.GroupedQueryAttention, cfg, params), cfg


@pytest.mark.gqa
def test_rotated_qkv_match_hf(impl, small):
    """Queries and keys rotated, values not, heads first: 6 query heads, 2 key/value heads of
    8, d_model 42, theta 500000, a batch of 3 whose rows' positions start at 7, 0 and 30."""
    attn, cfg = gqa_of(impl, small, 0)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, cfg.d_model, generator=g)
    positions = torch.stack([torch.arange(7, 12), torch.arange(5), torch.arange(30, 35)])
    with torch.no_grad(), spying_on_rope(impl, attn, cfg, x):
        earlier = attn.rotated_qkv(x.clone(), positions + 11)  # a first call, other positions
        out = attn.rotated_qkv(x, positions)
        hf_attn = small.model.layers[0].self_attn
        expected = hf_qkv(hf_attn, x, positions, small.config)
        expected_earlier = hf_qkv(hf_attn, x, positions + 11, small.config)
        plain = hf_qkv(hf_attn, x, torch.zeros_like(positions), small.config)  # angle 0: unrotated
        at_10000 = copy.deepcopy(small.config)
        at_10000.rope_parameters = {**at_10000.rope_parameters, "rope_theta": 10000.0}
        slipped = {
            "positions from 0": hf_qkv(hf_attn, x, positions - positions[:, :1], small.config),
            "first row's positions": hf_qkv(
                hf_attn, x, positions[:1].expand_as(positions), small.config
            ),
            "theta 10000": hf_qkv(hf_attn, x, positions, at_10000),
        }
    assert isinstance(out, tuple) and len(out) == 3, "rotated_qkv must return (q, k, v)"
    if (
        not close_f32(out[0], expected[0])
        and isinstance(earlier, tuple)
        and close_f32(earlier[0], expected_earlier[0])
        and close_f32(out[0], earlier[0])
    ):
        pytest.fail(
            "a second call of rotated_qkv, with other positions, turns the queries by the angles "
            "of the first call: something from an earlier call is kept (on the module?) and "
            "reused. The angles come from the positions of each call."
        )
    for name, got, want, raw in zip("qkv", out, expected, plain, strict=True):
        heads = cfg.n_heads if name == "q" else cfg.n_kv_heads
        same_as_q = name != "q" and got.shape == out[0].shape and torch.equal(got, out[0])
        assert got.shape == want.shape, (
            f"{name}: expected {tuple(want.shape)} ([batch, {heads} heads, posn, d_head], heads "
            f"first), got {tuple(got.shape)}"
            + (f": your {name} is your q, number for number. Is it projected with W_Q, where "
               f"{'W_K' if name == 'k' else 'W_V'} belongs?" if same_as_q else ". "
               + explain_difference(got, want, ("batch", "head", "posn", "d_head")))
        )  # fmt: skip
        if close_f32(got, want):
            continue
        cos, sin = hf_cos_sin(small.config, positions)
        if name in "qk" and close_f32(got, raw):
            pytest.fail(
                f"the {'queries' if name == 'q' else 'keys'} are not rotated: both "
                "queries and keys turn by their positions (apply_rope), values do not."
            )
        if name == "k" and close_f32(got, hf_rotate(plain[2], cos, sin)):
            pytest.fail(
                "your keys are the projection through W_V, rotated: keys come from W_K, values "
                "from W_V."
            )
        if name == "v" and close_f32(got, plain[1]):
            pytest.fail("your values are the projection through W_K: values come from W_V.")
        if name == "v" and close_f32(got, hf_rotate(raw, cos, sin)):
            pytest.fail(
                "the values are rotated: only queries and keys turn; values carry what a "
                "query reads, not where it is."
            )
        said = memory_order(got, raw, cos, sin, rotated=name in "qk")
        if said:
            pytest.fail(f"your {dict(q='queries', k='keys', v='values')[name]} {said}")
        which = "queries" if name == "q" else "keys"
        for slip, qkv in slipped.items():
            if name in "qk" and close_f32(got, qkv["qk".index(name)]):
                pytest.fail(
                    {
                        "positions from 0": f"your {which} are turned as if every row's "
                        "positions started at 0: turn them by the positions given (here they "
                        "start at 7, 0 and 30).",
                        "first row's positions": f"your {which} of every row are turned by the "
                        "first row's positions: each row has its own positions [batch, posn].",
                        "theta 10000": f"your {which} are turned with theta = 10000, not the "
                        "model's self.cfg.rope_theta (500000 here).",
                    }[slip]
                )
        assert_close_f32(
            got, want, f"{name} differs from HF's projection rotated by apply_rotary_pos_emb"
        )


def memory_order(got, raw, cos, sin, rotated: bool) -> str | None:
    """Whether `got` holds the right numbers in the wrong memory order: the projection `raw`
    [batch, heads, posn, d_head] laid out with its axes in another order, then reshaped (or
    viewed) to [batch, heads, posn, d_head] (and rotated, for queries and keys)."""
    import itertools

    names = ("batch", "heads", "posn", "d_head")
    for order in itertools.permutations(range(4)):
        if order == (0, 1, 2, 3):
            continue
        candidate = raw.permute(order).reshape(raw.shape)
        if rotated:
            candidate = hf_rotate(candidate, cos, sin)
        if close_f32(got, candidate):
            laid = ", ".join(names[a] for a in order)
            return (
                f"hold the right numbers in the wrong order: they are what a tensor laid out "
                f"[{laid}] gives when reshaped (or viewed) to [batch, heads, posn, d_head]. A "
                "reshape keeps the numbers in their memory order and only cuts them anew; "
                "moving an axis takes a transpose (or permute)."
            )
    return None


@contextlib.contextmanager
def spying_on_rope(impl, attn, cfg, x):
    """Name what rotated_qkv hands rope_cos_sin and apply_rope when it fails: a head size other
    than d_head, or queries and keys not in the heads-first layout."""
    space = getattr(type(attn).rotated_qkv, "__globals__", {})
    handed = {}
    patched = {}

    def wrap(name, record):
        original = space.get(name)
        if not callable(original):
            return

        def spy(*args, **kwargs):
            record(*args, **kwargs)
            return original(*args, **kwargs)

        patched[name] = original
        space[name] = spy

    def cos_sin_args(positions, d_head=None, theta=None, *_, **kw):
        handed["d_head"] = kw.get("d_head", d_head)

    def rope_args(x_, *_args, **_kw):
        handed.setdefault("shapes", []).append(tuple(x_.shape))

    wrap("rope_cos_sin", cos_sin_args)
    wrap("apply_rope", rope_args)
    try:
        yield
    except NotImplementedError:
        raise
    except (RuntimeError, ValueError) as err:
        batch, posn = x.shape[:2]
        if handed.get("d_head") not in (None, cfg.d_head):
            pytest.fail(
                "your rotated_qkv asks rope_cos_sin for angles of d_head = "
                f"{handed['d_head']}, and the queries are d_head = {cfg.d_head} wide "
                f"({str(err).splitlines()[0][:90]}): "
                "rope_cos_sin takes the head size (self.cfg.d_head) and makes its d_head / 2 "
                "pairs itself."
            )
        for shape in handed.get("shapes", []):
            if len(shape) != 4 or shape[2] == posn or posn not in shape:
                continue
            wanted = f"apply_rope turns [batch {batch}, heads, posn {posn}, d_head {cfg.d_head}]"
            if shape[:2] == (batch, posn):
                pytest.fail(
                    f"your rotated_qkv hands apply_rope queries or keys of shape {shape} "
                    f"({str(err).splitlines()[0][:90]}): {wanted}, heads first. Put the heads "
                    "axis in front of the positions before turning them."
                )
            pytest.fail(
                f"your rotated_qkv hands apply_rope queries or keys of shape {shape} "
                f"({str(err).splitlines()[0][:90]}): {wanted}. Which of your axes holds the "
                f"batch ({batch}) and which the positions ({posn})?"
            )
        raise
    finally:
        space.update(patched)


def run_attention(attn, cfg, x, positions):
    """The learner's attention on x; queries and keys that meet with different numbers of heads
    are named, not pasted."""
    import re

    try:
        return attn(x, positions)
    except NotImplementedError:
        raise
    except RuntimeError as err:
        sizes = re.search(r"tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
                          r"non-singleton dimension 1", str(err))  # fmt: skip
        if not sizes or cfg.n_heads not in map(int, sizes.groups()):
            raise
        a, b = map(int, sizes.groups())
        heads = b if a == cfg.n_heads else a
        times = (
            f" That is each copied n_kv_heads = {cfg.n_kv_heads} times; "
            if heads == cfg.n_kv_heads**2 and cfg.n_kv_heads != cfg.group_size
            else " "
        )
        pytest.fail(
            f"in attend the queries have {cfg.n_heads} heads and your expanded keys or values "
            f"{heads} ({str(err).splitlines()[0][:100]}).{times}each key/value head is read by a "
            f"group of n_heads // n_kv_heads = {cfg.group_size} query heads (self.cfg.group_size),"
            " and is copied once for each of them."
        )


def check_attention(impl, hf, layer, positions, seed):
    attn, cfg = gqa_of(impl, hf, layer)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(positions.shape[0], positions.shape[1], cfg.d_model, generator=g)
    hf_attn = hf.model.layers[layer].self_attn
    with torch.no_grad():
        got = run_attention(attn, cfg, x, positions)
        expected = hf_attention(hf_attn, x, positions, hf.config)
    assert got.shape == expected.shape, (
        f"expected {tuple(expected.shape)} ([batch, posn, d_model]), got {tuple(got.shape)}"
    )
    if close_f32(got, expected):
        return
    with torch.no_grad():
        again = run_attention(attn, cfg, x, positions)
    if not torch.equal(again, got):
        pytest.fail(
            "your attention gives two different outputs for the same input, twice in a row: "
            "something random runs at inference (dropout_p in scaled_dot_product_attention "
            "drops weights whether or not the module is in eval mode). A model's forward is "
            "deterministic."
        )
    with torch.no_grad():
        q, k, v = hf_qkv(hf_attn, x, positions, hf.config)
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        group = cfg.n_heads // cfg.n_kv_heads

        def attend(k_, v_, scale=None, mask=causal, heads_first=False):
            z = F.scaled_dot_product_attention(q, k_, v_, attn_mask=mask, scale=scale)
            if heads_first:  # [batch, heads, posn, d_head] read as if it were [batch, posn, ...]
                return hf_attn.o_proj(z.reshape(z.shape[0], z.shape[2], -1))
            return hf_attn.o_proj(z.transpose(1, 2).flatten(-2))

        k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

        wrong = {
            "scale": attend(
                k.repeat_interleave(group, 1),
                v.repeat_interleave(group, 1),
                scale=cfg.d_model**-0.5,
            ),
            "scale d_head": attend(k_all, v_all, scale=cfg.d_head**-1.0),
            "scale multiplied": attend(k_all, v_all, scale=cfg.d_head**0.5),
            "no scale": attend(k_all, v_all, scale=1.0),
            "order": attend(k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)),
            "no mask": attend(k_all, v_all, mask=None),
            "heads first": attend(k_all, v_all, heads_first=True),
            "mask inverted": attend(k_all, v_all, mask=~causal),
            "float mask": attend(k_all, v_all, mask=causal.float()),
            "heads averaged": expected / cfg.n_heads,
        }
        scores = (q @ k_all.transpose(-1, -2) * cfg.d_head**-0.5).masked_fill(~causal, -math.inf)
        z = scores.softmax(dim=-2) @ v_all  # each key's weights over the queries sum to 1
        wrong["softmax over queries"] = hf_attn.o_proj(z.transpose(1, 2).flatten(-2))
    named = {
        "mask inverted": "your attention reads where `allowed` is False and hides where it is "
        "True: True means the query MAY read that key, the meaning of a boolean attn_mask in "
        "F.scaled_dot_product_attention. Is the mask inverted (~) on its way?",
        "float mask": "your mask is a float tensor of 1s and 0s: F.scaled_dot_product_attention "
        "ADDS a float mask to the scores (hiding nothing, and favouring the allowed keys by 1), "
        "and reads a boolean one as which keys may be read. Pass `allowed` as the boolean it is.",
        "heads averaged": f"your output is HF's divided by n_heads = {cfg.n_heads}: the heads' "
        "outputs are averaged. Each head's output goes through its own W_O and the results are "
        "summed over the heads.",
        "softmax over queries": "your softmax normalises over the queries axis: for each query, "
        "its weights over the keys sum to 1, so the softmax runs over the last axis (the keys).",
        "scale multiplied": "your scores are multiplied by sqrt(d_head): attention divides them "
        "by it (a scale of 1/sqrt(d_head), F.scaled_dot_product_attention's default; its "
        "`scale` argument is the factor the scores are multiplied by).",
        "no scale": "your scores are not scaled: attention divides q . k by sqrt(d_head) before "
        "the softmax (F.scaled_dot_product_attention's default scale).",
    }
    for mistake, message in named.items():
        if torch.allclose(got, wrong[mistake], atol=F32_ATOL, rtol=F32_RTOL, equal_nan=True):
            pytest.fail(message)
    if close_f32(got, wrong["scale"]):
        pytest.fail(
            "your scores are scaled by 1/sqrt(d_model): attention scales by "
            "1/sqrt(d_head), the width of one head (F.scaled_dot_product_attention's "
            "default)."
        )
    if close_f32(got, wrong["scale d_head"]):
        pytest.fail(
            "your scores are divided by d_head: attention divides them by sqrt(d_head), the "
            "root of one head's width (F.scaled_dot_product_attention's default scale)."
        )
    if group > 1 and close_f32(got, wrong["order"]):
        pytest.fail(
            "the wrong query heads share each key/value head (k0, k1, k0, k1, ...): "
            "each group of consecutive query heads reads one key/value head, as HF's "
            "repeat_kv has it. Check expand_kv."
        )
    if close_f32(got, wrong["no mask"]):
        pytest.fail(
            "every query reads every key, later positions too: attend must mask the scores "
            "with `allowed` (True where a query may read a key), as the attention mask."
        )
    if close_f32(got, wrong["heads first"]):
        pytest.fail(
            "the heads' outputs z [batch, n_heads, posn, d_head] are reshaped as if they were "
            "[batch, posn, n_heads, d_head]: the heads and positions axes get mixed. Let the "
            "output projection sum over the heads axis where it is (einops.einsum names it), or "
            "transpose before flattening."
        )
    assert_close_f32(
        got,
        expected,
        f"GroupedQueryAttention ({cfg.n_heads} query heads, "
        f"{cfg.n_kv_heads} key/value heads) differs from HF's LlamaAttention; "
        "test_rotated_qkv_match_hf checks the projections apart",
    )


@pytest.mark.gqa
def test_attention_matches_hf_on_shipped_weights(impl, llama):
    """The shipped first layer (6 query heads, 2 key/value heads), a batch of 3, positions 3..9."""
    check_attention(impl, llama[0], 0, torch.arange(3, 10).expand(3, 7), seed=7)


@pytest.mark.gqa
@pytest.mark.parametrize("n_kv_heads", [2, 6, 1])
def test_attention_matches_hf_from_multi_head_to_multi_query(impl, n_kv_heads):
    """6 query heads with 2 key/value heads (GQA), 6 (multi-head) and 1 (multi-query)."""
    hf = random_hf_llama(seed=8, n_kv_heads=n_kv_heads, n_layers=1)
    positions = torch.stack([torch.arange(4), torch.arange(9, 13), torch.arange(1, 5)])
    check_attention(impl, hf, 0, positions, seed=9)


@pytest.mark.gqa
def test_attend_reads_a_cache_where_allowed(impl, small):
    """Two new queries against 7 keys (5 cached): `allowed` [batch, 1, new, all] says which each
    reads (row 0: all before it; row 1: two padding keys left out; row 2: only keys 2..5 and
    itself). HF's eager_attention_forward with the same mask, added, is the reference."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    attn, cfg = gqa_of(impl, small, 0)
    hf_attn = small.model.layers[0].self_attn
    g = torch.Generator().manual_seed(11)
    q = torch.randn(3, cfg.n_heads, 2, cfg.d_head, generator=g)
    keys, values = torch.randn(2, 3, cfg.n_kv_heads, 7, cfg.d_head, generator=g)
    causal = torch.ones(2, 7, dtype=torch.bool).tril(diagonal=5)  # query i after 5 cached keys
    allowed = causal.expand(3, 2, 7).clone()
    allowed[1, :, :2] = False  # left padding
    allowed[2, :, :2] = False
    allowed[2, 1, 5] = False  # e.g. a lookahead branch that does not see the other's token
    allowed = allowed[:, None]
    with torch.no_grad():
        got = attn.attend(q.clone(), keys.clone(), values.clone(), allowed.clone())
        additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

        def reference(mask):
            z, _ = eager_attention_forward(hf_attn, q, keys, values, mask, cfg.d_head**-0.5)
            return hf_attn.o_proj(z.flatten(-2))  # z is [batch, new, heads, d_head]

        expected = reference(additive)
        top_left = torch.zeros(2, 7).masked_fill(~torch.ones(2, 7, dtype=torch.bool).tril(), -1e9)
    assert got.shape == expected.shape, (
        f"q [3, {cfg.n_heads}, 2 new, {cfg.d_head}] with 7 keys: expected {tuple(expected.shape)} "
        f"([batch, new, d_model]), got {tuple(got.shape)}"
    )
    if close_f32(got, expected):
        return
    with torch.no_grad():  # is_causal=True as well as `allowed`: PyTorch applies both
        group = cfg.n_heads // cfg.n_kv_heads
        both = allowed & torch.ones(2, 7, dtype=torch.bool).tril()
        z = F.scaled_dot_product_attention(
            q, keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1), both
        )
        own_causal = hf_attn.o_proj(z.transpose(1, 2).flatten(-2))
    if close_f32(got, own_causal):
        pytest.fail(
            "your attend hides more than `allowed` does: a causal mask of its own (is_causal="
            "True) on top of it lines the new queries up with the FIRST keys, so the cached keys "
            "after them are hidden. `allowed` already says which keys each query reads: pass it "
            "alone."
        )
    if close_f32(got, reference(None)) or close_f32(got, reference(top_left[None, None])):
        pytest.fail(
            "your attend does not use `allowed`: with a cache the new queries come after the "
            "cached keys, and `allowed` [batch, 1, new, all] says which keys each may read "
            "(padding and later keys not). A causal mask of your own (is_causal=True) or none "
            "gets this wrong: pass `allowed` as the attention mask."
        )
    assert_close_f32(got, expected, "attend with 7 keys (5 cached) differs from HF's attention")


@pytest.mark.gqa
def test_attend_with_no_mask(impl, small):
    """allowed=None, as llama_forward_with_cache passes it for one new token with no padding:
    every query reads every key, HF's eager attention with no mask."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    attn, cfg = gqa_of(impl, small, 0)
    hf_attn = small.model.layers[0].self_attn
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, cfg.n_heads, 1, cfg.d_head, generator=g)
    keys, values = torch.randn(2, 2, cfg.n_kv_heads, 6, cfg.d_head, generator=g)
    try:
        with torch.no_grad():
            got = attn.attend(q.clone(), keys.clone(), values.clone(), None)
    except NotImplementedError:
        raise
    except Exception as err:
        pytest.fail(
            f"your attend fails when called with allowed=None ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). llama_forward_with_cache passes "
            "None for one new token with no padding, which reads every cached key: no mask is "
            "needed. With allowed=None every query reads every key; does your attend use "
            "`allowed` (invert it, fill with it) without asking whether it is None?"
        )
    with torch.no_grad():
        z, _ = eager_attention_forward(hf_attn, q, keys, values, None, cfg.d_head**-0.5)
        expected = hf_attn.o_proj(z.flatten(-2))
    assert got.shape == expected.shape, (
        f"attend with allowed=None, q [2, {cfg.n_heads}, 1 new, {cfg.d_head}] and 6 keys: "
        f"expected {tuple(expected.shape)} ([batch, new, d_model]), got {tuple(got.shape)}"
    )
    with torch.no_grad():
        first_only = torch.full((1, 1, 1, keys.shape[2]), float("-inf"))
        first_only[..., 0] = 0.0  # what is_causal gives one query: the first key alone
        z, _ = eager_attention_forward(hf_attn, q, keys, values, first_only, cfg.d_head**-0.5)
        causal = hf_attn.o_proj(z.flatten(-2))
    assert_close_f32(
        got,
        expected,
        "attend with allowed=None (every key readable) differs from HF's attention",
        hint=(
            "Your one new query read the first key alone: that is is_causal=True, which lines "
            "the queries up with the FIRST keys. allowed=None means every key may be read (a "
            "decode reads every cached key): no mask at all, not a causal one."
            if close_f32(got, causal)
            else ""
        ),
    )


@pytest.mark.gqa
def test_attention_in_bfloat16(impl, small):
    """The layer in bfloat16, as in a model loaded in 16 bits: rotated_qkv's three tensors and
    attend's output keep bfloat16, and the output is HF's LlamaAttention in bfloat16 up to
    rounding (twice HF's own bfloat16 distance from float32, and at least 0.05)."""
    attn, cfg = gqa_of(impl, small, 0)
    attn = attn.to(torch.bfloat16)
    hf32 = small.model.layers[0].self_attn
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    g = torch.Generator().manual_seed(16)
    x = torch.randn(2, 5, cfg.d_model, generator=g).to(torch.bfloat16)
    positions = torch.stack([torch.arange(5), torch.arange(3, 8)])
    with torch.no_grad():
        q, k, v = attn.rotated_qkv(x.clone(), positions)
        dtypes = {"queries": q.dtype, "keys": k.dtype, "values": v.dtype}
        if set(dtypes.values()) != {torch.bfloat16}:
            pytest.fail(
                "in bfloat16 your rotated_qkv returns "
                f"{', '.join(f'{n} {d}' for n, d in dtypes.items())}: each keeps the input's "
                "dtype (apply_rope turns x in x's own dtype)."
            )
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        try:
            got = attn.attend(q, k, v, causal)
        except NotImplementedError:
            raise
        except RuntimeError as err:
            pytest.fail(
                "your attend fails on bfloat16 queries, keys and values "
                f"({str(err).splitlines()[0][:100]}): a part of it leaves bfloat16 (a .float() "
                "for the scores or the softmax?) and "
                "then meets the bfloat16 W_O. F.scaled_dot_product_attention takes 16-bit inputs "
                "as they are; keep its output in their dtype."
            )
        assert got.dtype == torch.bfloat16, (
            f"on bfloat16 queries, keys and values your attend returns {got.dtype}: the residual "
            "stream it is added to is bfloat16. Keep the attention in the inputs' dtype."
        )
        cos, sin = hf_cos_sin(small.config, positions)  # HF's rotary casts them to x's dtype
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        want16, _ = hf16(
            x,
            position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)),
            attention_mask=mask.to(x.dtype),
        )
        want32 = hf_attention(hf32, x.float(), positions, small.config)
        got_all = attn(x, positions)
    bound = max(0.05, 2 * (want16.float() - want32).abs().max().item())
    gap = (got_all.float() - want16.float()).abs().max().item()
    assert gap <= bound, (
        f"in bfloat16 your attention differs from HF's LlamaAttention in bfloat16 by up to "
        f"{gap:.3g}, more than bfloat16's rounding ({bound:.3g}): the float32 tests say more."
    )


@pytest.mark.gqa
def test_attention_makes_tensors_on_the_inputs_device(impl):
    for method in ("rotated_qkv", "attend"):
        assert_made_on_the_inputs_device(
            getattr(impl.GroupedQueryAttention, method),
            f"GroupedQueryAttention.{method}",
            "the queries, keys and values",
        )


# --------------------------------------------------------------------------- the model


def learner_llama(impl, hf, tie: bool):
    cfg = course_config(hf.config)
    model = impl.LlamaTransformer(cfg, tie_embeddings=tie)
    model.load_state_dict(course_weights(hf))
    return model.eval()


MODEL_MESSAGES = {
    "no final norm": "the final RMSNorm (model.ln_final) is missing before the unembedding.",
    "mlp reads resid_pre": "the MLP's norm reads the residual stream from before the attention "
    "was added: the MLP reads resid_mid = resid_pre + attention output.",
    "no mlp residual": "the MLP's output replaces the residual stream instead of being added "
    "to it: the block returns resid_mid + MLP output.",
    "ln1 before the mlp": "the MLP reads ln1 of resid_mid: each sublayer has its own norm, "
    "and the MLP's is ln2.",
    "post-norm": "your block normalises after adding (post-norm, the original Transformer's "
    "order): Llama's is pre-norm, each sublayer reads ln(residual) and its output is added to "
    "the residual stream, which is never normalised itself.",
    "embeddings scaled": "your embeddings are scaled (by sqrt(d_model)): Llama's residual stream "
    "starts with the token embeddings as they are.",
    "no causal mask": "every position reads the later positions too: the attention is causal.",
    "norms swapped": "the attention reads ln2 and the MLP ln1: each sublayer has its own norm, "
    "ln1 before the attention and ln2 before the MLP (trained with those weights).",
    "block output added again": "each block's output is added to the residual stream it "
    "read: the block already returns the whole residual stream (its input plus what its "
    "sublayers add), so the model hands it on as it is.",
    "no attention residual": "the attention's output replaces the residual stream instead of "
    "being added to it: resid_mid is resid_pre plus the attention's output.",
    "attention added to its norm": "the attention's output is added to its normalised input "
    "ln1(resid_pre), not to the residual stream: the norm is what the sublayer reads, and its "
    "output is added to the stream as it was, resid_mid = resid_pre + attention output.",
    "mlp output normed": "the MLP reads the residual stream itself and its output goes through "
    "ln2: the norm goes on the sublayer's input, ln2(resid_mid), and the MLP's output is added "
    "to the stream as it is.",
    "mlp reads resid_mid unnormed": "the MLP reads the residual stream itself: each sublayer "
    "reads its own norm of the stream, the MLP ln2(resid_mid).",
    "attention reads resid_pre unnormed": "the attention reads the residual stream itself: "
    "each sublayer reads its own norm of the stream, the attention ln1 of the stream it "
    "receives.",
    "ln2 before the attention": "the attention reads ln2 of the stream, the MLP's norm: each "
    "sublayer has its own, ln1 before the attention and ln2 before the MLP (trained with those "
    "weights).",
    "mlp reads the attention's output alone": "the MLP reads ln2 of the attention's output "
    "alone: it reads ln2 of the residual stream that output was added to, ln2(resid_mid), "
    "resid_mid = resid_pre + attention output.",
    "last block's ln2 as the final norm": "the final norm is the last block's ln2 (a loop "
    "variable still bound after the loop?): the model's own final RMSNorm, model.ln_final "
    "(self.ln_final), goes before the unembedding.",
    "no mlp": "each block adds its attention's output and nothing more: the MLP's output (of "
    "ln2 of the stream) is added after the attention's, in every layer.",
    "mlp added to its norm": "the MLP's output is added to its normalised input ln2(resid_mid), "
    "not to the residual stream: the norm is what the sublayer reads, and its output is added "
    "to the stream as it was, resid_mid + MLP output.",
    "tied unembedding": "your logits come from the token embedding W_E, transposed, as a tied "
    "model's would: this model has an unembedding of its own (untied). Call the model's unembed "
    "(self.unembed in its forward, model.unembed in the cache's), tied or not as it was built.",
}
assert set(MODEL_MESSAGES) == set(LLAMA_MISTAKES)


def run_model(model, ids):
    """The learner's logits for ids; positions handed to the blocks in another shape than the
    tokens' are named, whether or not they crash a later exercise's code, and so are products
    that do not fit."""
    seen = {}

    def keep(module, args, kwargs):
        found = args[1] if len(args) > 1 else kwargs.get("positions")
        seen["shape"] = tuple(found.shape) if isinstance(found, torch.Tensor) else found
        seen["ids"] = isinstance(found, torch.Tensor) and torch.equal(found, ids)

    handle = model.blocks[0].register_forward_pre_hook(keep, with_kwargs=True)
    said = (
        "the positions your forward hands to the blocks are {got}, expected {want} ([batch, "
        "posn], the tokens' shape): every row gets the positions 0, 1, ..., one row per text."
    )
    cfg = model.cfg
    try:
        with torch.no_grad():
            got = model(ids)
    except NotImplementedError:
        raise
    except Exception as err:
        if seen and seen["shape"] != tuple(ids.shape):
            pytest.fail(said.format(got=seen["shape"], want=tuple(ids.shape)))
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "cannot be multiplied" in text and f"{cfg.d_vocab}x{cfg.d_model}" in text:
            pytest.fail(
                f"your forward multiplies the final residual stream [.., d_model {cfg.d_model}] "
                f"by a [d_vocab {cfg.d_vocab}, d_model] matrix as it is ({text}): W_E maps token "
                "ids to vectors, the unembedding maps vectors to logits. Call self.unembed, "
                "which does it (tied to W_E or not, as the model was built)."
            )
        if not seen and "expand" in text:
            pytest.fail(
                f"your forward fails before the first block, making the positions for tokens "
                f"{tuple(ids.shape)} ({text}): one position per column of tokens, that is "
                "the number of positions (the second axis), expanded to [batch, posn]."
            )
        raise
    finally:
        handle.remove()
    if seen and seen["shape"] != tuple(ids.shape):
        pytest.fail(said.format(got=seen["shape"], want=tuple(ids.shape)))
    if seen.get("ids"):
        pytest.fail(
            "your forward hands the blocks the token ids as their positions: the queries and "
            "keys then turn by each token's id, not by its place in the text. A block's "
            "positions are 0, 1, ... along the text, [batch, posn] like the tokens."
        )
    return got


def where_it_differs(model, hf, ids) -> str:
    """Which part of the learner's model first departs from HF's, read from the residual
    stream after each part of both (forward hooks), or "" where that cannot be said."""
    mine, theirs = {}, {}

    def keep(store, name):
        def hook(module, args, out):
            out = out[0] if isinstance(out, tuple) else out
            store[name] = out.clone() if isinstance(out, torch.Tensor) else out

        return hook

    def given(store, name):
        def hook(module, args, kwargs):
            found = args[0] if args else next(iter(kwargs.values()), None)
            store["in " + name] = found.dtype if isinstance(found, torch.Tensor) else None
            store["input " + name] = found.clone() if isinstance(found, torch.Tensor) else found

        return hook

    embed_inputs = []  # what the learner's forward hands self.embed, call by call

    def embedded(module, args):
        embed_inputs.append(args[0] if args else None)

    parts = [("the embeddings", model.embed, hf.model.embed_tokens)]
    parts += [
        (f"block {i}", b, h)
        for i, (b, h) in enumerate(zip(model.blocks, hf.model.layers, strict=True))
    ]
    parts += [("the final norm", model.ln_final, hf.model.norm)]
    attribute = {"the embeddings": "self.embed", "the final norm": "self.ln_final"}
    handles = []
    changed = []  # modules of the learner's model that changed their input in place

    def snapshot(module, args):
        if args and isinstance(args[0], torch.Tensor):
            module._input_before = args[0].clone()

    def compare(module, args, out):
        before = module.__dict__.pop("_input_before", None)
        if before is not None and not changed and not torch.equal(args[0], before):
            changed.append(module)

    handles.append(model.embed.register_forward_pre_hook(embedded))
    for sub in model.modules():
        handles.append(sub.register_forward_pre_hook(snapshot))
        handles.append(sub.register_forward_hook(compare))
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.register_forward_hook(keep(theirs, f"attn block {i}")))
    for name, a, b in parts:
        handles.append(a.register_forward_hook(keep(mine, name)))
        handles.append(b.register_forward_hook(keep(theirs, name)))
        handles.append(a.register_forward_pre_hook(given(mine, name), with_kwargs=True))
        handles.append(b.register_forward_pre_hook(given(theirs, name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(ids)
            hf(ids)
    except Exception:
        return ""
    finally:
        for handle in handles:
            handle.remove()
    if changed:
        names = {m: n for n, m in model.named_modules()}
        return (
            f" Your {type(changed[0]).__name__} ({names.get(changed[0], '?')}) changes its input "
            "in place: the residual stream it reads is changed for every later part. Each part "
            "returns a new tensor and leaves its input as it was."
        )
    agree = []
    previous = None
    for name, _, _ in parts:
        where = attribute.get(name, f"self.blocks[{name.split()[-1]}]")
        if name not in mine:
            return f" Your forward never runs {name} ({where})."
        handed = mine.get("input " + name)
        if (
            previous is not None
            and isinstance(handed, torch.Tensor)
            and not (handed.shape == mine[previous].shape and torch.equal(handed, mine[previous]))
        ):
            return (
                f" Your forward hands {name} ({where}) a residual stream other than what "
                f"{previous} returned ({', '.join(agree)} agree with HF's): between them it "
                f"changes the stream (a norm, a sum?). Hand each block's output on as it is; only "
                "the last goes through the final norm."
            )
        previous = name
        if mine["in " + name] != theirs["in " + name]:
            return (
                f" Your forward hands {name} ({where}) {mine['in ' + name]}, HF's "
                f"{theirs['in ' + name]}: the residual stream keeps the model's dtype."
            )
        if mine[name].dtype != theirs[name].dtype:
            return (
                f" What {name} ({where}) returns is {mine[name].dtype}, HF's {theirs[name].dtype}:"
                " the residual stream keeps the model's dtype from the embeddings to the logits."
            )
        if not close_f32(mine[name], theirs[name]):
            before = f" ({', '.join(agree)} agree)" if agree else ""
            if name == "the embeddings" and len(embed_inputs) > 1:
                again = embed_inputs[1]
                positional = isinstance(again, torch.Tensor) and torch.equal(
                    again, torch.arange(ids.shape[1]).expand_as(again)
                )
                return (
                    f" Your forward calls self.embed {len(embed_inputs)} times, where it embeds "
                    "the tokens once"
                    + (", and the second call embeds the positions 0, 1, 2, ...: a position "
                       "embedding made from the token table? Llama has none; positions enter "
                       "through the rotation of the queries and keys (RoPE)."
                       if positional else ".")
                )  # fmt: skip
            if name == "the embeddings":
                extra = (
                    mine[name] - theirs[name] if mine[name].shape == theirs[name].shape else None
                )
                by_position = (
                    extra is not None
                    and extra.shape[0] > 1
                    and torch.allclose(extra, extra[:1].expand_as(extra), atol=F32_ATOL)
                )
                return " The embeddings already differ: the residual stream starts with " + (
                    "W_E[tokens] plus something that depends on the position alone (the same "
                    "at each position in every row): a position embedding? Llama has none; "
                    "positions enter through the rotation of the queries and keys (RoPE)."
                    if by_position
                    else "W_E[tokens]."
                )
            if name == "the final norm":
                return (
                    " The residual stream agrees with HF's after every block; the final norm's "
                    "output does not: self.ln_final of the last block's output."
                )
            said = block_terms(hf, name, theirs, mine[name])
            if said:
                return said
            return (
                f" The residual stream after {name} differs from HF's decoder layer's{before}: "
                "look at LlamaBlock (each sublayer reads its own norm of the residual stream, "
                "and its output is added to it) and at the positions it is handed."
            )
        agree.append(name)
    return (
        " The residual stream and its final norm agree with HF's: the unembedding is what "
        "differs. Call self.unembed (this model's, tied or not)."
    )


def block_terms(hf, name, theirs, got) -> str | None:
    """The learner's block output written as a x + b attention + c MLP, with HF's pieces on the
    block's input x (the attention's output, and the MLP on ln2 of x + attention): where that
    fits and (a, b, c) is not (1, 1, 1), which term is missing or counted twice."""
    x, attn_out = theirs.get("input " + name), theirs.get("attn " + name)
    if not isinstance(x, torch.Tensor) or not isinstance(attn_out, torch.Tensor):
        return None
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        return None
    layer = hf.model.layers[int(name.split()[-1])]
    with torch.no_grad():
        mlp_out = layer.mlp(layer.post_attention_layernorm(x + attn_out))
        terms = torch.stack([x, attn_out, mlp_out], dim=-1).reshape(-1, 3).double()
        coef = torch.linalg.lstsq(terms, got.reshape(-1, 1).double()).solution[:, 0]
    rounded = coef.round()
    if (coef - rounded).abs().max() > 0.01 or rounded.tolist() == [1.0, 1.0, 1.0]:
        return None
    if not close_f32(got, (terms.float() @ rounded.float()).reshape(got.shape)):
        return None
    a, b, c = (int(v) for v in rounded.tolist())
    said = (
        f" Your {name} returns {a} x its input + {b} x the attention's output + {c} x the MLP's "
        "output (HF's: 1, 1 and 1, the MLP reading ln2 of input + attention):"
    )
    parts = ("its input (resid_pre)", "the attention's output", "the MLP's output")
    missing = [p for p, n in zip(parts, (a, b, c), strict=True) if n == 0]
    extra = [p for p, n in zip(parts, (a, b, c), strict=True) if n not in (0, 1)]
    if missing:
        said += f" {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not in what you "
        said += "return."
    if extra:
        said += f" {' and '.join(extra)} counted more than once."
    return (
        said + " resid_mid = resid_pre + attention output, and the block returns resid_mid + "
        "the MLP's output: each sublayer's output is added to the stream once, and kept."
    )


def check_model(impl, hf, ids, tie):
    model = learner_llama(impl, hf, tie)
    got = run_model(model, ids)
    with torch.no_grad():
        expected = hf(ids).logits
    assert got.shape == expected.shape, (
        f"tokens {tuple(ids.shape)}: expected logits {tuple(expected.shape)}, got "
        f"{tuple(got.shape)}. " + explain_difference(got, expected, ("batch", "posn", "d_vocab"))
        + (" A model returns the logits at EVERY position (training and the checks read them "
           "all); a sampler takes the last one itself." if got.ndim == 3 and got.shape[1] == 1
           and ids.shape[1] > 1 else "")
    )  # fmt: skip
    if close_f32(got, expected):
        return
    if got.min() >= 0 and torch.allclose(got.float().sum(-1), torch.ones(got.shape[:-1])):
        pytest.fail(
            "your forward returns probabilities, not logits: every number is >= 0 and each "
            "position's row sums to 1 (a softmax). The model returns the unembedding's raw "
            "scores, the logits; a sampler takes the softmax itself, after its temperature and "
            "filters, and a loss its log-softmax."
        )
    for mistake, message in MODEL_MESSAGES.items():
        if close_f32(got, hf_llama_mistake_logits(hf, ids, mistake)):
            pytest.fail(message)
    assert_close_f32(
        got,
        expected,
        "LlamaTransformer's logits differ from HF's LlamaForCausalLM on the same weights."
        + where_it_differs(model, hf, ids),
    )


@pytest.mark.llama
def test_llama_matches_hf_on_shipped_weights(impl, llama):
    """A batch of two texts of 9 tokens, then one position alone."""
    hf, tokenizer = llama
    rows = [
        tokenizer.encode("MACBETH.\nIs this a dagger"),
        tokenizer.encode("VIOLA.\nWhat country"),
    ]
    n = min(map(len, rows))
    check_model(impl, hf, torch.tensor([r[:n] for r in rows]), tie=True)
    check_model(impl, hf, torch.tensor([rows[0][:1]]), tie=True)


@pytest.mark.llama
def test_llama_matches_hf_untied_random(impl):
    """A random model, untied unembedding, theta 500000, eps 1e-3, RMSNorm weights far from 1."""
    hf = random_hf_llama(seed=10)
    ids = torch.tensor([[3, 17, 42, 8, 0, 25], [49, 1, 2, 30, 30, 11]])
    check_model(impl, hf, ids, tie=False)


@pytest.mark.llama
def test_llama_block_leaves_its_input_unchanged(impl, small):
    """A LlamaBlock called on a residual stream the caller keeps (a copy taken first): the
    model's own forward cannot see a block that writes into its input, since it hands each
    stream on once, but a caller that keeps the stream (a hook, a probe, chapter 8's runner) can."""
    from tests.graded._oracles import assert_untouched

    cfg = course_config(small.config)
    block = learner_module(impl.LlamaBlock, cfg, under(course_weights(small), "blocks.0."))
    g = torch.Generator().manual_seed(16)
    x = torch.randn(2, 5, cfg.d_model, generator=g)
    before = x.clone()
    with torch.no_grad():
        block(x, torch.arange(5).expand(2, 5))
    assert_untouched(
        x,
        before,
        "your LlamaBlock",
        "An in-place addition (resid_pre += ..., add_) writes the attention's or the MLP's "
        "output into the residual stream the caller handed in; resid_pre + ... makes a new "
        "tensor.",
    )


def run_in_bfloat16(model, ids):
    """The learner's model, in bfloat16, on ids; the first part whose output leaves bfloat16
    (or whose queries and keys do) is named."""
    started, made = [], {}  # modules in the order they started; name -> (dtype in, dtype out)
    finished = set()

    def start(name):
        def hook(module, args):
            given = args[0].dtype if args and isinstance(args[0], torch.Tensor) else None
            started.append((name, type(module).__name__))
            made[name] = (given, None)

        return hook

    def keep(name):
        def hook(module, args, out):
            out = out[0] if isinstance(out, tuple) else out
            finished.add(name)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                made[name] = (made[name][0], out.dtype)

        return hook

    handles = []
    for n, m in model.named_modules():
        if n:
            handles += [m.register_forward_pre_hook(start(n)), m.register_forward_hook(keep(n))]

    def first_wrong() -> str | None:
        wrong_out = {n for n, (_, out) in made.items() if out not in (None, torch.bfloat16)}
        for name, kind in started:
            given, dtype = made[name]
            if given is not None and given.is_floating_point and given != torch.bfloat16:
                return (
                    f"in a model loaded in bfloat16, your {kind} ({name}) is handed {given}: "
                    "the code that feeds it turned the residual stream to another dtype. Keep "
                    "it in the model's dtype between the parts."
                )
            if any(other.startswith(name + ".") for other in wrong_out):
                continue  # a part inside it is the one to name
            if dtype not in (None, torch.bfloat16):
                return (
                    f"in a model loaded in bfloat16, your {kind} ({name}) returns {dtype} for "
                    "bfloat16 input: the parts after it meet bfloat16 weights with it. Each part "
                    "returns its input's dtype (RMSNorm: cast the normalised vector back before "
                    "the weight multiplies it)."
                )
        return None

    try:
        with torch.no_grad():
            got = model(ids)
    except NotImplementedError:
        raise
    except Exception as err:
        said = first_wrong()
        if said:
            pytest.fail(said)
        if "dtype" in str(err):
            attn = model.blocks[0].attn
            x = torch.randn(1, 3, model.cfg.d_model).to(torch.bfloat16)
            try:
                with torch.no_grad():
                    q, k, v = attn.rotated_qkv(x, torch.arange(3)[None])
            except Exception:
                raise err from None
            if {q.dtype, k.dtype} != {v.dtype}:
                pytest.fail(
                    f"in a model loaded in bfloat16 your rotated_qkv returns queries {q.dtype}, "
                    f"keys {k.dtype} and values {v.dtype}, and the attention refuses to mix "
                    f"them ({str(err).splitlines()[0][:90]}). The float32 cos and sin promote "
                    "what they multiply: apply_rope turns x in x's own dtype (HF's "
                    "LlamaRotaryEmbedding casts cos and sin to the input's dtype)."
                )
            unfinished = [(n, kind) for n, kind in started if n not in finished]
            if unfinished:
                name, kind = unfinished[-1]
                pytest.fail(
                    f"in a model loaded in bfloat16, your {kind} ({name}) fails on its bfloat16 "
                    f"input ({str(err).splitlines()[0][:100]}): a part of it leaves bfloat16 and "
                    "meets a bfloat16 tensor. Keep its products in its input's dtype."
                )
        raise
    finally:
        for handle in handles:
            handle.remove()
    if got.dtype != torch.bfloat16:
        pytest.fail(
            first_wrong()
            or f"in a model loaded in bfloat16 your forward returns {got.dtype} logits, though "
            "every part, self.unembed included, returns bfloat16: your forward casts them after "
            "the unembedding. The logits keep the model's dtype, as HF's do (a caller that wants "
            "float32 casts them itself)."
        )
    return got


@pytest.fixture(scope="module")
def llama_bf16(llama):
    """HF's LlamaForCausalLM of the shipped model in bfloat16 (a copy)."""
    return copy.deepcopy(llama[0]).to(torch.bfloat16)


@pytest.mark.llama
def test_llama_matches_hf_in_bfloat16(impl, llama, llama_bf16):
    """The shipped model loaded in bfloat16 (how chapter 8's engine can run it, and how large
    models are served) against HF's LlamaForCausalLM in bfloat16 on the same weights, two texts
    of 13 tokens. Two correct bfloat16 implementations differ by their rounding, as HF's
    bfloat16 logits differ from its float32 ones: the bound is twice that distance, measured
    here (about 0.14 on logits of up to 17, with transformers 5.24 on a CPU; the reference's own
    distance from HF's bfloat16 logits was about 0.13)."""
    hf, tokenizer = llama
    rows = [
        tokenizer.encode("MACBETH.\nIs this a dagger which I see"),
        tokenizer.encode("VIOLA.\nWhat country, friends, is this?"),
    ]
    n = min(map(len, rows))
    ids = torch.tensor([r[:n] for r in rows])
    model = learner_llama(impl, hf, tie=True).to(torch.bfloat16)
    got = run_in_bfloat16(model, ids)
    with torch.no_grad():
        want16, want32 = llama_bf16(ids).logits, hf(ids).logits
    assert got.shape == want16.shape, (
        f"tokens {tuple(ids.shape)}: expected logits {tuple(want16.shape)}, got {tuple(got.shape)}"
    )
    bound = 2 * (want16.float() - want32).abs().max().item()
    gap = (got.float() - want16.float()).abs().max().item()
    assert gap <= bound, (
        f"in bfloat16 your logits differ from HF's LlamaForCausalLM in bfloat16 by up to "
        f"{gap:.3g}, more than twice HF's own bfloat16 rounding ({bound / 2:.3g}); from HF's "
        f"float32 logits by {(got.float() - want32).abs().max().item():.3g}. Where the float32 "
        "tests pass, look for a part that computes in 16 bits what HF computes in float32: "
        "RMSNorm's mean square, RoPE's angles."
    )


@pytest.mark.llama
def test_llama_positions_are_made_on_the_tokens_device(impl):
    assert_made_on_the_inputs_device(
        impl.LlamaTransformer.forward, "LlamaTransformer.forward", "the tokens"
    )
    assert_made_on_the_inputs_device(
        impl.LlamaBlock.forward, "LlamaBlock.forward", "the residual stream and the positions"
    )


# --------------------------------------------------------------------------- the cache


@pytest.fixture(scope="module")
def llama_course_model(llama):
    """The shipped weights in the course's LlamaTransformer (the reference's: the cache
    exercise is graded apart from the model exercise)."""
    from utils.convert import llama_from_hf

    return llama_from_hf(llama[0])


def diagnose_keys(cache, hf, tokens_so_far: torch.Tensor, mask: torch.Tensor) -> str | None:
    """Name what the first layer's cached keys hold, if not HF's rotated keys."""
    true_positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    rotated, raw = hf_layer0_keys(hf, tokens_so_far, true_positions)
    got = cache.keys[0]
    if got.shape != rotated.shape:
        if got.shape[:2] + got.shape[3:] == rotated.shape[:2] + rotated.shape[3:]:
            return (
                f"the new cache holds {got.shape[2]} positions' keys, expected "
                f"{rotated.shape[2]}: the keys already cached, then the new ones after them "
                "(the cache is the whole text so far, not only the new tokens)."
            )
        return (
            f"the first layer's cached keys are {tuple(got.shape)}, expected "
            f"{tuple(rotated.shape)} ([batch, n_kv_heads, all positions, d_head])"
        )
    real = mask[:, None, :, None].expand_as(got)
    if close_f32(got[real], rotated[real]):
        return None
    if close_f32(got[real], raw[real]):
        return (
            "the cache holds the keys BEFORE rotation: cache the keys rotated by their own "
            "positions (what rotated_qkv returns), so that they never need turning again."
        )
    unnormed, _ = hf_layer0_keys(hf, tokens_so_far, true_positions, norm="none")
    if close_f32(got[real], unnormed[real]):
        return (
            "the keys are computed from the residual stream itself: the attention reads the "
            "block's ln1 of it (block.ln1), as in LlamaBlock."
        )
    through_ln2, _ = hf_layer0_keys(hf, tokens_so_far, true_positions, norm="ln2")
    if close_f32(got[real], through_ln2[real]):
        return (
            "the keys are computed from ln2 of the residual stream, the MLP's norm: the "
            "attention reads its own, the block's ln1 (block.ln1), as in LlamaBlock."
        )
    n = mask.shape[1]
    if not mask.all():  # each row's positions counted over its padding, or another row's
        for row in range(mask.shape[0]):
            keep = mask[row]
            if close_f32(got[row][:, keep], rotated[row][:, keep]):
                continue
            pad = int((~keep).sum())
            candidates = [torch.arange(n)[None]]  # counted over the padding
            candidates += [true_positions[o : o + 1] for o in range(mask.shape[0]) if o != row]
            for positions in candidates:
                wrong, _ = hf_layer0_keys(hf, tokens_so_far[row : row + 1], positions)
                if close_f32(got[row][:, keep], wrong[0][:, keep]):
                    first = int(positions[0, keep][0])
                    return (
                        f"row {row} ({pad} padding tokens on its left) has its keys turned "
                        f"as if its first real token sat at position {first}, where HF's "
                        "sits at 0: its positions count the padding (or are another row's). "
                        "A row's positions count its own real tokens only, which is what the "
                        "given positions do: use them."
                    )
    for s in range(1, n):  # the last s positions (the new ones) put in front of the cached ones
        moved = torch.cat([rotated[:, :, n - s :], rotated[:, :, : n - s]], dim=2)
        if mask.all() and close_f32(got, moved):
            return (
                f"the cache's first {s} key(s) are the new positions': the new keys were put "
                "BEFORE the cached ones. They go after them, in the order of the text."
            )
    for first_bad in range(mask.shape[1]):
        if not close_f32(
            got[..., first_bad, :][mask[:, first_bad]],
            rotated[..., first_bad, :][mask[:, first_bad]],
        ):
            break
    restarted = true_positions - true_positions[:, first_bad : first_bad + 1]
    again, _ = hf_layer0_keys(hf, tokens_so_far, restarted.clamp(min=0))
    tail = real[:, :, first_bad:]
    if close_f32(got[:, :, first_bad:][tail], again[:, :, first_bad:][tail]):
        return (
            f"the keys from position {first_bad} on are rotated as if their positions "
            "started again at 0: the angles were restarted after the prefill. A new token's "
            "position is its place after the cached ones: use the given positions."
        )
    for shift in dict.fromkeys((1, -1, 2, -2, first_bad)):  # first_bad: the cached count
        moved = true_positions + shift * (torch.arange(mask.shape[1]) >= first_bad)
        shifted, _ = hf_layer0_keys(hf, tokens_so_far, moved.clamp(min=0))
        if close_f32(got[:, :, first_bad:][tail], shifted[:, :, first_bad:][tail]):
            again = (
                f" {shift} is the number of positions cached before them: the given positions "
                "already count the cached tokens. Are they counted twice (the cache's length "
                "added to them)?"
                if shift == first_bad
                else ""
            )
            return (
                f"the key at position {first_bad} is rotated by the angles of position "
                f"{first_bad + shift}, {abs(shift)} too {'far' if shift > 0 else 'early'}: a "
                "new token's position is the number of real tokens before it in its row (the "
                "given positions)." + again
            )
    return (
        f"the first layer's cached key at position {first_bad} differs from HF's key "
        "rotated by its position"
    )


def diagnose_values(cache, hf, tokens_so_far: torch.Tensor, mask: torch.Tensor) -> str | None:
    """Name what the first layer's cached values hold, if not HF's (never rotated) values."""
    expected = hf_layer0_values(hf, tokens_so_far)
    got = cache.values[0]
    if got.shape != expected.shape:
        return (
            f"the first layer's cached values are {tuple(got.shape)}, expected "
            f"{tuple(expected.shape)} ([batch, n_kv_heads, all positions, d_head]), as the keys"
        )
    real = mask[:, None, :, None].expand_as(got)
    if close_f32(got[real], expected[real]):
        return None
    n = mask.shape[1]
    for s in range(1, n):
        moved = torch.cat([expected[:, :, n - s :], expected[:, :, : n - s]], dim=2)
        if mask.all() and close_f32(got, moved):
            return (
                f"the keys are right, but the cache's first {s} value(s) are the new positions': "
                "the new values were put BEFORE the cached ones. They go after them, as the keys."
            )
    keys = cache.keys[0]
    wrong = ~torch.isclose(got, expected, atol=F32_ATOL, rtol=F32_RTOL) & real
    if keys.shape == got.shape and wrong.any() and close_f32(got[wrong], keys[wrong]):
        cols = sorted(set(wrong.nonzero()[:, 2].tolist()))
        return (
            f"the keys are right, but the first layer's cached values at positions {cols[0]} to "
            f"{cols[-1]} are that layer's KEYS: the values the attention read there came from "
            "the cache's keys. Each layer's cached values come from cache.values."
        )
    return "the keys are right, but the first layer's cached values differ from HF's values"


def model_slip(hf, rows, pads, start, size, logits) -> str | None:
    """A model-level slip (LLAMA_MISTAKES) that the new positions' logits match, computed with
    HF's modules on each row's real tokens so far."""
    for mistake, message in MODEL_MESSAGES.items():
        matches = []
        for row, (r, pad) in enumerate(zip(rows, pads, strict=True)):
            columns = [c for c in range(start, start + size) if c >= pad]
            if not columns:
                continue
            so_far = torch.tensor([r[: start + size - pad]])
            wrong = hf_llama_mistake_logits(hf, so_far, mistake)[0]
            got = logits[row, [c - start for c in columns]]
            matches.append(close_f32(got, wrong[[c - pad for c in columns]]))
        if matches and all(matches) and mistake == "no causal mask":
            return (
                "Each new position also reads the new positions after it: attend reads the "
                "given `allowed` (causal among the new tokens, padding left out) as its mask."
            )
        if matches and all(matches):
            return message
    return None


@contextlib.contextmanager
def joined_along_positions(what: str, cfg=None):
    """Name a concatenation of cached and new keys or values along another axis than the
    positions', or of cached and new ones whose heads differ (the cache kept expanded)."""
    try:
        with torch.no_grad():
            yield
    except RuntimeError as err:
        import re

        axis = re.search(r"Sizes of tensors must match except in dimension (-?\d+)", str(err))
        if not axis:
            raise
        n = int(axis.group(1))
        sizes = re.search(r"Expected size (\d+) but got size (\d+)", str(err))
        if n in (2, -2) and sizes:  # joined along the positions, as they should be
            first, second = map(int, sizes.groups())
            heads = cfg is not None and {first, second} == {cfg.n_heads, cfg.n_kv_heads}
            pytest.fail(
                f"{what}: joining the cached keys or values with the new ones fails "
                f"({str(err).split('.')[0]}): along the positions axis, as it should be, but "
                f"one has {first} where the other has {second} on another axis."
                + (f" That is n_heads = {cfg.n_heads} against n_kv_heads = {cfg.n_kv_heads}: "
                   "are the keys and values cached after expand_kv? The cache keeps the "
                   "n_kv_heads heads that rotated_qkv gives (that is GQA's saving); attend "
                   "expands them for the queries itself." if heads else "")
            )  # fmt: skip
        names = {0: "batch", 1: "heads", 3: "d_head", -1: "d_head"}
        pytest.fail(
            f"{what}: joining the cached keys or values with the new ones fails "
            f"({str(err).split('.')[0]}). They are [batch, n_kv_heads, positions, "
            f"d_head], and yours are joined along axis {n} ({names.get(n, 'another axis')}): "
            "the new positions go after the cached ones, along the positions axis."
        )


def new_keys_only(hf, new, start, mask, logits) -> str | None:
    """Whether the new positions' logits are those of queries that read the new keys only (the
    cache built but not read), computed by HF on the new tokens alone at their positions."""
    if not start or not mask.all():
        return None
    positions = torch.arange(start, start + new.shape[1]).expand(new.shape)
    with torch.no_grad():
        alone = hf(new, position_ids=positions).logits
    if close_f32(logits, alone):
        return (
            "The new queries read the new keys only: the cache is built, but attend must read "
            "the cached keys and values followed by the new ones."
        )
    return None


@contextlib.contextmanager
def heads_handed_to_attend(model, what: str):
    """Name keys handed to attend with another number of heads than n_kv_heads (expanded
    before attend, which expands them itself), whether or not attend then fails."""
    handed = []
    blocks = list(model.blocks)
    for block in blocks:
        own = block.attn.attend

        def spy(q, keys, *args, _own=own, **kwargs):
            if isinstance(keys, torch.Tensor) and keys.ndim == 4:
                handed.append(keys.shape[1])
            return _own(q, keys, *args, **kwargs)

        block.attn.attend = spy
    n_kv = model.cfg.n_kv_heads
    said = (
        "{what}: your llama_forward_with_cache hands attend keys with {n} heads where the "
        f"cache holds n_kv_heads = {n_kv} per layer, as rotated_qkv returns them. attend copies "
        "each key/value head for its group of query heads itself (expand_kv): keys expanded "
        "before it are expanded twice, and a cache of expanded keys is group_size times larger "
        "than it needs to be. Cache and hand on the keys and values as rotated_qkv gives them."
    )
    try:
        yield
    except RuntimeError as err:
        import re

        wrong = [n for n in handed if n != n_kv]
        if wrong:
            pytest.fail(said.format(what=what, n=wrong[0]))
        # the cache's keys joined with new ones of another number of heads (expanded first)
        sizes = re.search(
            r"except in dimension (?:2|-2)\. Expected size (\d+) but got size (\d+)", str(err)
        )
        if sizes and int(sizes.group(1)) == n_kv and int(sizes.group(2)) % n_kv == 0:
            pytest.fail(
                said.replace("hands attend", "joins the cache's keys with new").format(
                    what=what, n=int(sizes.group(2))
                )
            )
        raise
    finally:
        for block in blocks:
            block.attn.__dict__.pop("attend", None)
    wrong = [n for n in handed if n != n_kv]
    if wrong:
        pytest.fail(said.format(what=what, n=wrong[0]))


def reads_later_new_tokens(impl, model, new, previous, mask, start) -> str | None:
    """Whether a step's earlier new positions change when its last new token does: they must
    not read it (causal among the new tokens), whatever the cache holds."""
    if new.shape[1] < 2:
        return None
    other = new.clone()
    other[:, -1] = (other[:, -1] + 1) % model.cfg.d_vocab
    step_mask = None if mask.all() else mask[:, start : start + new.shape[1]]
    try:
        with torch.no_grad():
            a, _ = impl.llama_forward_with_cache(model, new, copy.deepcopy(previous), step_mask)
            b, _ = impl.llama_forward_with_cache(model, other, copy.deepcopy(previous), step_mask)
    except Exception:
        return None
    if close_f32(a[:, :-1], b[:, :-1]):
        return None
    return (
        f"With {start} positions cached, the logits of the first {new.shape[1] - 1} new tokens "
        "change when only the last new token does: the new tokens read the new keys after "
        "them. A mask is needed at every step where more than one token is new (causal among "
        "them) or where the cache holds padding: the given `allowed`; only one new token in an "
        "unpadded batch may read every key (None)."
    )


def step_by_step(impl, model, hf, rows: list[list[int]], chunks: list[int]):
    """Feed each row's tokens in chunks, left-padded as one batch; compare each step's logits
    with HF's on each row alone, and the first layer's cached keys with HF's."""
    width = max(map(len, rows))
    tokens = torch.tensor([[7] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    expected = hf_llama_logits(hf, rows)
    cache, start = None, 0
    for size in chunks:
        new, new_mask = tokens[:, start : start + size], mask[:, : start + size]
        what = f"after {start} cached positions, {size} new" if start else f"a prefill of {size}"
        previous = cache
        with joined_along_positions(what, model.cfg), heads_handed_to_attend(model, what):
            logits, cache = impl.llama_forward_with_cache(
                model, new, cache, None if mask.all() else new_mask[:, start:]
            )
        n_layers = model.cfg.n_layers
        assert not all(k is v for k, v in zip(cache.keys, cache.values, strict=False)), (
            f"{what}: the new cache's keys and values are one list under two names (a = b = [] "
            "makes one list, not two): each layer's keys and its values both went into it. "
            "Keys and values each need a list of their own."
        )
        assert len(cache.keys) == n_layers and len(cache.values) == n_layers, (
            f"{what}: the new cache holds {len(cache.keys)} key tensors and "
            f"{len(cache.values)} value tensors for {n_layers} layers: one per layer, each the "
            "layer's cached keys followed by its new ones. Do your lists start empty, or with "
            "the old cache's tensors in them?"
        )
        last_only = (
            " Your logits are the last new token's only: the contract gives the logits of every "
            "new token (a prefill's too), and a caller that samples picks the last itself."
            if logits.ndim == 3 and logits.shape[1] == 1 and size > 1
            else ""
        )
        assert logits.shape == (len(rows), size, model.cfg.d_vocab), (
            f"{what}: expected logits {(len(rows), size, model.cfg.d_vocab)}, got "
            f"{tuple(logits.shape)}.{last_only}"
        )
        right = {}
        for row, (r, want) in enumerate(zip(rows, expected, strict=True)):
            pad = width - len(r)
            columns = [c for c in range(start, start + size) if c >= pad]
            if columns:
                right[row] = close_f32(
                    logits[row, [c - start for c in columns]], want[[c - pad for c in columns]]
                )
        padding_only = (
            f"Row {min(r for r, ok in right.items() if not ok)} has padding on its left and is "
            "wrong, while the rows without padding are right: do its new tokens read the padding "
            "keys? The given `allowed` hides them; hand it to attend at every step, single new "
            "tokens included."
            if any(not ok for r, ok in right.items())
            and all(ok for r, ok in right.items() if width == len(rows[r]))
            and any(width == len(r) for r in rows)
            else ""
        )
        for row, (r, want) in enumerate(zip(rows, expected, strict=True)):
            pad = width - len(r)
            columns = [c for c in range(start, start + size) if c >= pad]
            if not columns:
                continue
            got = logits[row, [c - start for c in columns]]
            if not close_f32(got, want[[c - pad for c in columns]]):
                so_far, mask_so_far = tokens[:, : start + size], mask[:, : start + size]
                said = (
                    diagnose_keys(cache, hf, so_far, mask_so_far)
                    or diagnose_values(cache, hf, so_far, mask_so_far)
                    or new_keys_only(hf, new, start, mask, logits)
                    or model_slip(hf, rows, [width - len(r) for r in rows], start, size, logits)
                    or padding_only
                    or reads_later_new_tokens(impl, model, new, previous, mask, start)
                    or "The first layer's cached keys and values are right: check what the "
                    "attention reads and what comes after it."
                )
                padded = f" (row {row}, {pad} padding tokens on its left)" if pad else ""
                pytest.fail(
                    f"{what}{padded}: the logits differ from HF's LlamaForCausalLM on the whole "
                    f"text. {said}"
                )
        if not mask.all():  # positions shifted within a row change no logit: the keys show it
            said = diagnose_keys(cache, hf, tokens[:, : start + size], mask[:, : start + size])
            if said:
                pytest.fail(f"{what}: the logits equal HF's, but {said}")
        start += size
    return cache


@pytest.mark.llama_cache
def test_prefill_then_single_steps_match_hf(impl, llama, llama_course_model):
    hf, tokenizer = llama
    row = tokenizer.encode("JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?")
    step_by_step(impl, llama_course_model, hf, [row[:12]], [8, 1, 1, 1, 1])


@pytest.mark.llama_cache
def test_chunks_match_hf(impl, llama, llama_course_model):
    hf, tokenizer = llama
    row = tokenizer.encode("KING HENRY.\nOnce more unto the breach, dear friends, once more;")
    step_by_step(impl, llama_course_model, hf, [row[:12]], [4, 3, 1, 4])


@pytest.mark.llama_cache
def test_left_padded_batch_matches_hf_row_by_row(impl, llama, llama_course_model):
    """Rows of 10 and 4 tokens, left-padded: each row's angles count its real tokens only."""
    hf, tokenizer = llama
    rows = [
        tokenizer.encode("MACBETH.\nIs this a dagger which I see")[:10],
        tokenizer.encode("VIOLA.\nWhat")[:4],
    ]
    step_by_step(impl, llama_course_model, hf, rows, [8, 1, 1])


@pytest.mark.llama_cache
def test_cached_keys_are_rotated_once(impl, llama, llama_course_model):
    """The first layer's cache after a prefill and two steps holds HF's rotated keys."""
    hf, tokenizer = llama
    row = tokenizer.encode("ROMEO.\nBut soft, what light through yonder window")[:9]
    cache = step_by_step(impl, llama_course_model, hf, [row], [6, 1, 1, 1])
    said = diagnose_keys(cache, hf, torch.tensor([row]), torch.ones(1, 9, dtype=torch.bool))
    assert said is None, said


@pytest.mark.llama_cache
def test_llama_cache_makes_tensors_on_the_tokens_device(impl):
    assert_made_on_the_inputs_device(
        impl.llama_forward_with_cache, "llama_forward_with_cache", "the tokens"
    )


@pytest.mark.llama_cache
def test_lookahead_layout_matches_hf(impl):
    """Chapter 6's lookahead decoding hands the cached pass its own positions [new] (one
    layout for the batch) and allowed [new, all]: here two branches of 3 tokens after a prompt
    of 5, both at positions 5, 6, 7, each reading the prompt and its own branch. Each branch
    token's logits are HF's on the prompt followed by its branch. A random untied model (2
    layers, 6 query heads, 2 key/value heads)."""
    from utils.convert import llama_from_hf

    hf = random_hf_llama(seed=14)
    model = llama_from_hf(hf)
    prompt, branches = [3, 17, 42, 8, 25], [[11, 30, 2], [49, 1, 30]]
    n_new = sum(map(len, branches))
    handed = []
    for block in model.blocks:  # what the learner hands rotated_qkv (this model is the test's own)

        def spy(x, positions, _rotated_qkv=block.attn.rotated_qkv):
            handed.append(tuple(positions.shape) if isinstance(positions, torch.Tensor) else None)
            return _rotated_qkv(x, positions)

        block.attn.rotated_qkv = spy
    said = (
        "here the given lines pass on the caller's positions [new] (chapter 6's lookahead "
        "layout: one layout for the whole batch) and your code hands them to rotated_qkv as "
        "{got}; it wants [batch, new]. Make each row's positions from them, as the hints say."
    )
    feed = torch.tensor([sum(branches, [])])
    positions = torch.tensor([5, 6, 7, 5, 6, 7])
    allowed = torch.zeros(n_new, len(prompt) + n_new, dtype=torch.bool)
    allowed[:, : len(prompt)] = True
    for first in (0, 3):  # each branch reads itself up to each token
        for i in range(3):
            allowed[first + i, len(prompt) + first : len(prompt) + first + i + 1] = True
    try:
        with torch.no_grad():
            _, cache = impl.llama_forward_with_cache(model, torch.tensor([prompt]))
            handed.clear()
            logits, _ = impl.llama_forward_with_cache(
                model, feed, cache, positions=positions.clone(), allowed=allowed.clone()
            )
    except NotImplementedError:
        raise
    except Exception:
        if handed and handed[-1] != (1, n_new):
            pytest.fail(said.format(got=list(handed[-1] or ())))
        raise
    if handed and handed[-1] != (1, n_new):
        pytest.fail(said.format(got=list(handed[-1] or ())))
    assert logits.shape == (1, n_new, hf.config.vocab_size), (
        f"two branches of 3 new tokens: expected logits {(1, n_new, hf.config.vocab_size)}, got "
        f"{tuple(logits.shape)}"
        + (
            ": the last new token's only. The contract gives the logits of every new token."
            if logits.ndim == 3 and logits.shape[1] == 1
            else ""
        )
    )
    texts = [prompt + branch[: i + 1] for branch in branches for i in range(len(branch))]
    expected = torch.stack([hf_llama_logits(hf, [text])[0][-1] for text in texts])
    if close_f32(logits[0], expected):
        return
    for mistake, message in MODEL_MESSAGES.items():
        wrong = torch.stack(
            [hf_llama_mistake_logits(hf, torch.tensor([t]), mistake)[0, -1] for t in texts]
        )
        if close_f32(logits[0], wrong):
            pytest.fail(f"two lookahead branches after a cached prompt: {message}")
    assert_close_f32(
        logits[0],
        expected,
        "two lookahead branches after a cached prompt (positions [new] and allowed [new, all] "
        "given): the logits differ from HF's LlamaForCausalLM on the prompt followed by each "
        "branch. Use the positions and allowed the given lines hand you, as they are.",
    )


@pytest.mark.llama_cache
def test_cache_in_bfloat16(impl, llama, llama_bf16):
    """The shipped model loaded in bfloat16: a prefill of 6 then two single steps. The cache
    keeps the model's dtype, and each step's logits are HF's LlamaForCausalLM in bfloat16 on the
    whole text within twice HF's own bfloat16 distance from float32 (and at least 0.25)."""
    from utils.convert import llama_from_hf

    hf, tokenizer = llama
    model = llama_from_hf(hf).to(torch.bfloat16)
    ids = torch.tensor([tokenizer.encode("HAMLET.\nTo be, or not to be, that is")[:8]])
    cache, start = None, 0
    for size in (6, 1, 1):
        what = (
            f"in bfloat16, after {start} cached positions, 1 new"
            if start
            else f"in bfloat16, a prefill of {size}"
        )
        try:
            with torch.no_grad():
                logits, cache = impl.llama_forward_with_cache(
                    model, ids[:, start : start + size], cache
                )
        except NotImplementedError:
            raise
        except RuntimeError as err:
            if "dtype" not in str(err).lower() and "type" not in str(err).lower():
                raise
            pytest.fail(
                f"{what}: your llama_forward_with_cache fails ({str(err).splitlines()[0][:100]}): "
                "a tensor of yours left bfloat16 (the cached keys or values, the residual "
                "stream?) and meets the model's bfloat16 ones. Keep the model's dtype throughout."
            )
        kinds = {t.dtype for t in (*cache.keys, *cache.values)}
        assert kinds == {torch.bfloat16}, (
            f"{what}: your cache holds {sorted(map(str, kinds))} keys and values: they keep the "
            "model's dtype (bfloat16 here), as the queries they meet do."
        )
        assert logits.dtype == torch.bfloat16, (
            f"{what}: your logits are {logits.dtype}: they keep the model's dtype, as HF's do."
        )
        with torch.no_grad():
            so_far = ids[:, : start + size]
            want16 = llama_bf16(so_far).logits[:, start:]
            want32 = hf(so_far).logits[:, start:]
        bound = max(0.25, 2 * (want16.float() - want32).abs().max().item())
        gap = (logits.float() - want16.float()).abs().max().item()
        assert gap <= bound, (
            f"{what}: your logits differ from HF's LlamaForCausalLM in bfloat16 by up to "
            f"{gap:.3g}, more than bfloat16's rounding ({bound:.3g}); the float32 tests say more."
        )
        start += size
