"""Chapter 5: the fixed cost of a step, graded against NumPy's least squares, transformer-lens
activations, HF GPT-2's logits and `generate` on HF's own static cache, chapter 3's sampler
(graded against HF), dynamo's own counters, and PyTorch's quantization observer and quantizer.
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys
import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solutions.config import Config
from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._oracles import (
    BATCH_PROMPTS,
    F32_ATOL,
    F32_RTOL,
    PROMPT,
    assert_close_f32,
    close_f32,
    hf_static_greedy,
)
from tests.graded.test_04_kv_cache import (
    EOS_BOOST,
    describe_difference,
    eos_boosted,
    head_first,
    left_padded,
    uncached_variant,
)

CHAPTER = "05_fixed_cost"


def printed_by(call) -> str:
    """What `call()` prints. Read through a redirect of its own, not pytest's capsys: the grader
    captures what learner code prints (it is shown beside a failure), and capsys then sees
    nothing of it, so that two prints would compare equal whatever they said."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue()


PAD_ID = 1000
"""Left padding's id in the padded tests: neither 0 nor end-of-text."""


class ReadCounter:
    """Counts the times Python reads a tensor's value: `.item()`, `.tolist()`, `bool(t)`,
    `int(t)`, `float(t)`, and a tensor used as an index; `where` counts them by the function that
    made each read (its code's name), so that a message can blame the function the read is in,
    not its caller."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.reads = 0
        self.where: collections.Counter[str] = collections.Counter()
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.reads += 1
                self.where[sys._getframe(1).f_code.co_name] += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def reset(self) -> None:
        self.reads = 0
        self.where.clear()

    def inside(self, *functions: str) -> int:
        """The reads made by code of these names."""
        return sum(self.where[f] for f in functions)


def reads(n: int) -> str:
    return f"{n} host read" + ("" if n == 1 else "s")


HOST_READS = "`.item()`, `.tolist()`, `int(t)`, `bool(t)` or an `if` on a tensor's value"


# --------------------------------------------------------------------------- fit_step_cost

PER_OP, PER_CACHED = 1.3e-6, 4.0e-10
"""The costs the fit tests make their steps from: neither 0 nor 1, nor each other's size."""


def made_steps(noise: float = 0.0, seed: int = 0, dtype=torch.float64):
    """Steps of two kinds of model at several positions, with times made from known costs (and
    `noise`, relative, when asked): n_ops, floor, cached, seconds."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.tensor([3, 40, 97, 160, 230, 255, 10, 120, 250], dtype=torch.float64)
    n_ops = torch.tensor([911.0] * 6 + [499.0] * 3, dtype=torch.float64)
    cached = positions * torch.where(n_ops > 900, 2 * 4 * 192.0, 2 * 2 * 128.0)
    floor = torch.where(n_ops > 900, 3.1e-4, 1.1e-4) + 1e-8 * positions
    seconds = floor + PER_OP * n_ops + PER_CACHED * cached
    if noise:
        seconds = seconds * (
            1 + noise * torch.randn(len(seconds), generator=g, dtype=torch.float64)
        )
    return tuple(c.to(dtype) for c in (n_ops, floor, cached, seconds))


def numpy_fit(n_ops, floor, cached, seconds) -> tuple[float, float]:
    """The oracle: NumPy's least squares on the time above the floor, in float64."""
    A = np.stack([n_ops.double().numpy(), cached.double().numpy()], axis=1)
    b = seconds.double().numpy() - floor.double().numpy()
    per_op, per_cached = np.linalg.lstsq(A, b, rcond=None)[0]
    return float(per_op), float(per_cached)


def intercept_fit(n_ops, floor, cached, seconds) -> tuple[float, float]:
    """NumPy's least squares with a third column of ones: per_op and per_cached of that fit."""
    A = np.stack([n_ops.double().numpy(), cached.double().numpy(), np.ones(len(n_ops))], axis=1)
    b = seconds.double().numpy() - floor.double().numpy()
    per_op, per_cached, _ = np.linalg.lstsq(A, b, rcond=None)[0]
    return float(per_op), float(per_cached)


def fitted(impl, *columns):
    """The learner's fit, with the two shape slips of a least-squares call named where they
    break: the matrix stacked the other way round, and its solution read along the wrong axis."""
    try:
        return impl.fit_step_cost(*columns)
    except RuntimeError as error:
        if "lstsq" in str(error) and "size(-2)" in str(error):
            pytest.fail(
                f"fit_step_cost raised `{error}`: torch.linalg.lstsq wants the matrix with one ROW "
                "per step and one column per fitted term ([steps, 2]), and the right-hand side "
                "with one row per step too ([steps, 1]). Along which dimension did you stack the "
                "two columns?"
            )
        raise
    except IndexError as error:
        pytest.fail(
            f"fit_step_cost raised `{error}` while reading the solution. Print its shape: for a "
            "right-hand side [steps, 1] it is [2, 1], one row per unknown (in your columns' "
            "order) and one column per right-hand side."
        )


def lstsq_of(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(A, b, rcond=None)[0]


def fit_mistake(impl, n_ops, floor, cached, seconds, got) -> str:
    """The likely mistake behind a wrong fit, recognised by refitting under its hypothesis."""
    no_floor = numpy_fit(n_ops, torch.zeros_like(floor), cached, seconds)
    if np.allclose([got.per_op, got.per_cached], no_floor, rtol=1e-4, atol=0):
        return (
            " That is the fit of `seconds` itself: fit the time above the floor, seconds - floor "
            "(the floor is added back by predict)."
        )
    plus_floor = numpy_fit(n_ops, -floor, cached, seconds)
    if np.allclose([got.per_op, got.per_cached], plus_floor, rtol=1e-4, atol=0):
        return (
            " That is the fit of seconds + floor: the floor was added where it should come off. "
            "Fit the time the floor does not explain (the floor is added back by predict)."
        )
    found = np.array([got.per_op, got.per_cached])
    columns64 = [c.double().numpy() for c in (n_ops, floor, cached, seconds)]
    ops64, floor64, cached64, seconds64 = columns64
    right = numpy_fit(n_ops, floor, cached, seconds)

    def is_(candidate) -> bool:
        """The learner's fit is this mistake's, and the mistake's differs from the right one
        (steps that the model fits exactly hide some mistakes)."""
        return not np.allclose(candidate, right, rtol=1e-4, atol=0) and np.allclose(
            found, candidate, rtol=1e-4, atol=0
        )

    floor_column = lstsq_of(np.stack([ops64, cached64, floor64], axis=1), seconds64)[:2]
    if is_(floor_column):
        return (
            " That is a fit of `seconds` with the floor as a third fitted column: the floor is "
            "not fitted, it is computed and comes off first. Fit seconds - floor by the two "
            "columns n_ops and cached."
        )
    by_floor = lstsq_of(np.stack([ops64, floor64], axis=1), seconds64 - floor64)
    if is_(by_floor):
        return (
            " That is the fit by the columns n_ops and floor: the second column is `cached`, the "
            "numbers of the cache each step reads."
        )
    A = np.stack([ops64, cached64], axis=1)
    first_two = np.linalg.solve(A[:2], (seconds64 - floor64)[:2])
    if is_(first_two):
        return (
            " That is the exact solution of the first two steps alone: a least-squares fit uses "
            "every step (torch.linalg.lstsq on all the rows), not a square system of two."
        )
    if n_ops.dtype == torch.float32:
        above32 = (seconds - floor).double().numpy()  # the difference rounded in float32
        in_float32 = lstsq_of(A, above32)
        if not np.allclose(in_float32, right, rtol=1e-9, atol=0) and np.allclose(
            found, in_float32, rtol=1e-7, atol=0
        ):
            return (
                " That is the fit of seconds - floor computed in float32 and converted after: "
                "convert the four columns to float64 first, before any arithmetic on them."
            )
    # Steps that the model fits exactly hide a third column (its intercept fits as 0): on
    # noisy steps the intercept takes a share of the time.
    noisy = made_steps(noise=0.1, seed=0)
    with_intercept = intercept_fit(*noisy)
    if not np.allclose(with_intercept, numpy_fit(*noisy), rtol=1e-4, atol=0):
        again = fitted(impl, *noisy)
        if np.allclose([again.per_op, again.per_cached], with_intercept, rtol=1e-4, atol=0):
            return (
                " That is a fit with a third unknown, an intercept column of ones: the model has "
                "two terms above the floor and no constant (the floor is the constant), so "
                "solve for exactly two columns."
            )
    expected = numpy_fit(n_ops, floor, cached, seconds)
    if np.allclose([got.per_cached, got.per_op], expected, rtol=1e-4, atol=0):
        return " per_op and per_cached are swapped: return them in StepCost's order."
    if np.allclose([got.per_op, got.per_cached], expected, rtol=1e-2, atol=0):
        return (
            " Close, but not to the digits a float64 solve gives: convert the columns to "
            "float64 before solving (in float32, counts near a million and times near a "
            "millisecond keep few correct digits)."
        )
    return ""


@pytest.mark.fit_step_cost
def test_the_fit_finds_the_costs_the_steps_were_made_from(impl):
    n_ops, floor, cached, seconds = made_steps()
    got = fitted(impl, n_ops, floor, cached, seconds)
    ok = np.allclose([got.per_op, got.per_cached], [PER_OP, PER_CACHED], rtol=1e-8, atol=0)
    assert ok, (
        f"steps made from per_op={PER_OP:g} s and per_cached={PER_CACHED:g} s, with no noise: "
        f"the fit found per_op={got.per_op:g}, per_cached={got.per_cached:g}."
        + fit_mistake(impl, n_ops, floor, cached, seconds, got)
    )


@pytest.mark.fit_step_cost
@pytest.mark.parametrize("seed", [0, 1])
def test_the_fit_agrees_with_numpys_least_squares(impl, seed):
    n_ops, floor, cached, seconds = made_steps(noise=0.1, seed=seed)
    expected = numpy_fit(n_ops, floor, cached, seconds)
    got = fitted(impl, n_ops, floor, cached, seconds)
    assert np.allclose([got.per_op, got.per_cached], expected, rtol=1e-9, atol=0), (
        f"noisy steps: numpy.linalg.lstsq finds per_op={expected[0]:g}, "
        f"per_cached={expected[1]:g}; yours per_op={got.per_op:g}, per_cached={got.per_cached:g}."
        + fit_mistake(impl, n_ops, floor, cached, seconds, got)
    )


@pytest.mark.fit_step_cost
def test_the_fit_of_float32_measurements_is_solved_in_float64(impl):
    columns = made_steps(noise=0.1, seed=2, dtype=torch.float32)
    expected = numpy_fit(*columns)
    got = fitted(impl, *columns)
    assert isinstance(got.per_op, float) and isinstance(got.per_cached, float), (
        f"return plain Python floats in StepCost, got {type(got.per_op).__name__} and "
        f"{type(got.per_cached).__name__} (`.tolist()` or `float(...)` of the solution)"
    )
    assert np.allclose([got.per_op, got.per_cached], expected, rtol=1e-9, atol=0), (
        f"float32 measurements: numpy (in float64) finds per_op={expected[0]:g}, "
        f"per_cached={expected[1]:g}; yours per_op={got.per_op:g}, per_cached={got.per_cached:g}."
        + (
            fit_mistake(impl, *columns, got)
            or " Convert the columns to float64 before solving: with counts near a million and "
            "times near a millisecond, a float32 solve keeps few correct digits."
        )
    )


# --------------------------------------------------------------------------- StaticKeyValueCache

ODD = Config(d_model=10, n_heads=2, d_head=5, n_layers=3, n_ctx=7, d_vocab=11, d_mlp=12)
"""A configuration whose sizes are all different, so that a swapped dimension shows."""


@pytest.mark.static_cache
def test_the_buffers_have_the_static_layout(impl):
    cache = impl.StaticKeyValueCache(ODD, batch=4, dtype=torch.float64)
    missing = [name for name in ("keys", "values", "mask", "causal") if not hasattr(cache, name)]
    assert not missing, (
        f"the cache has no {', no '.join(missing)}: __init__ must make them attributes of the "
        "object, as the given lines do with self.cfg. A local variable of __init__ is gone when "
        "it returns"
    )
    for name in ("keys", "values"):
        buffers = getattr(cache, name)
        assert isinstance(buffers, list | tuple) and len(buffers) == ODD.n_layers, (
            f"cache.{name} must hold one buffer per layer ({ODD.n_layers}), got "
            f"{type(buffers).__name__} of {len(buffers) if hasattr(buffers, '__len__') else '?'}"
        )
        for b in buffers:
            assert tuple(b.shape) == (4, ODD.n_heads, ODD.n_ctx, ODD.d_head), (
                f"each buffer is [batch, n_heads, n_ctx, d_head] = (4, 2, 7, 5) here (chapter 4's "
                f"layout, with room for all n_ctx positions), got {tuple(b.shape)}"
            )
            assert b.dtype == torch.float64, (
                f"make the buffers in the dtype asked for, got {b.dtype}"
            )
            assert not b.any(), "the buffers start as zeros"
    assert cache.mask.shape == (4, ODD.n_ctx) and cache.mask.dtype == torch.bool, (
        f"mask is [batch, n_ctx] bool, got {cache.mask.dtype} {tuple(cache.mask.shape)}"
    )
    assert not cache.mask.any(), "no slot holds a token yet: the mask starts all False"


@pytest.mark.static_cache
def test_every_layer_has_buffers_of_its_own(impl):
    cache = impl.StaticKeyValueCache(ODD, batch=2)
    buffers = list(cache.keys) + list(cache.values)
    where = [b.untyped_storage().data_ptr() for b in buffers]
    if len(set(where)) < len(where):
        same_list = [b.untyped_storage().data_ptr() for b in cache.keys] == [
            b.untyped_storage().data_ptr() for b in cache.values
        ]
        pytest.fail(
            "two buffers share their memory: "
            + (
                "keys and values are the same tensors (`self.values = self.keys`?): make each "
                "list of its own."
                if same_list
                else "`[torch.zeros(...)] * n_layers` lists ONE tensor n_layers times, so every "
                "layer would write into the same buffer: make a new tensor for each layer (a list "
                "comprehension)."
            )
        )


@pytest.mark.static_cache
def test_the_causal_mask_lets_each_slot_read_itself_and_the_slots_before(impl):
    cache = impl.StaticKeyValueCache(ODD, batch=1)
    got = cache.causal
    expected = torch.tensor([[k <= q for k in range(ODD.n_ctx)] for q in range(ODD.n_ctx)])
    assert got.dtype == torch.bool and tuple(got.shape) == (ODD.n_ctx, ODD.n_ctx), (
        f"causal is [n_ctx, n_ctx] bool, got {got.dtype} {tuple(got.shape)}"
    )
    if torch.equal(got, expected):
        return
    if torch.equal(got, expected.T):
        pytest.fail("causal is transposed: rows are the query's slot, columns the key's (k <= q)")
    if torch.equal(got, ~expected):
        pytest.fail(
            "causal is True where attention is hidden: here True means the query MAY read the "
            "key (the convention of F.scaled_dot_product_attention's boolean mask)"
        )
    if torch.equal(got, expected & ~torch.eye(ODD.n_ctx, dtype=torch.bool)):
        pytest.fail("a query must read its own key too: k <= q, not k < q")
    if torch.equal(got & ~expected, got ^ expected):
        later = (got & ~expected).nonzero()[0].tolist()
        pytest.fail(
            f"causal lets a query read a slot after its own (query slot {later[0]}, key slot "
            f"{later[1]}): a query reads the slots up to its own, k <= q, and none after. Is your "
            "comparison shifted by one?"
        )
    if torch.equal(expected & ~got, got ^ expected):
        hidden = (expected & ~got).nonzero()[0].tolist()
        pytest.fail(
            f"causal hides a slot a query may read (query slot {hidden[0]}, key slot "
            f"{hidden[1]}): every key slot k <= q is readable, from slot 0 on"
        )
    pytest.fail(
        f"causal must be True exactly where the key's slot k <= the query's slot q:\n{got.int()}"
    )


@pytest.mark.static_cache
def test_the_cache_is_made_on_the_device_it_is_given(impl):
    cache = impl.StaticKeyValueCache(ODD, batch=2, device="meta")
    tensors = {"keys[0]": cache.keys[0], "values[-1]": cache.values[-1], "mask": cache.mask}
    tensors["causal"] = cache.causal
    wrong = [name for name, t in tensors.items() if t.device.type != "meta"]
    assert not wrong, (
        f"asked for device='meta', but {', '.join(wrong)} {'was' if len(wrong) == 1 else 'were'} "
        "made on another device: pass "
        "device= to every tensor you make (also the arange behind the causal mask)"
    )


# --------------------------------------------------------------------------- attention_static


def fresh_buffers(cfg, fill: float = 0.0):
    shape = (1, cfg.n_heads, cfg.n_ctx, cfg.d_head)
    return torch.full(shape, fill), torch.full(shape, fill)


def allowed_for(n_ctx: int, slots: torch.Tensor, written: int) -> torch.Tensor:
    """The test's own mask: a query in slot q reads slots k <= q that hold a token."""
    k = torch.arange(n_ctx)
    return ((k[None, :] <= slots[:, None]) & (k[None, :] < written))[None, None]


def attention_static_called(impl, attn, x, keys, values, slots, allowed):
    """The learner's attention_static, with the errors of two slips named: the buffers grown by
    torch.cat (which then no longer match `allowed`'s n_ctx) and the writes along another axis
    than the slots'."""
    before = keys.clone()
    try:
        with torch.no_grad():
            return impl.attention_static(attn, x, keys, values, slots, allowed)
    except RuntimeError as error:
        if "index_copy" in str(error) and "slice shape" in str(error):
            pytest.fail(
                f"attention_static raised `{error}`. The buffers are [batch, n_heads, n_ctx, "
                "d_head] and the slots index their third dimension (dim 2); the new keys and "
                "values must be [batch, n_heads, new, d_head] to be written there."
            )
        if torch.equal(keys, before) and (
            "size of tensor" in str(error) or "attn_mask" in str(error)
        ):
            pytest.fail(
                f"attention_static raised `{error}`, and the key buffer was never written. "
                "torch.cat (chapter 4's habit) makes a new, longer tensor that the cache never "
                "sees, and that no longer has `allowed`'s n_ctx slots: write the new keys and "
                "values into the buffers in place, at `slots` (Tensor.index_copy_)."
            )
        raise


@pytest.mark.attention_static
@pytest.mark.parametrize("layer", [0, 2])
def test_a_prefill_writes_its_keys_and_matches_the_reference(impl, shipped, ref_run, layer):
    _, _, acts = ref_run
    attn = shipped[0].blocks[layer].attn
    cfg = attn.cfg
    x = acts[f"blocks.{layer}.ln1.hook_out"]
    n = x.shape[1]
    keys, values = fresh_buffers(cfg)
    where = (keys.data_ptr(), values.data_ptr())
    slots = torch.arange(n)
    out = attention_static_called(
        impl, attn, x, keys, values, slots, allowed_for(cfg.n_ctx, slots, n)
    )
    assert (keys.data_ptr(), values.data_ptr()) == where
    for name, buffer in (("key", keys), ("value", values)):
        if not buffer.any():
            pytest.fail(
                f"the {name} buffer is still all zeros: write the new keys and values INTO the "
                "buffers passed in, in place (Tensor.index_copy_ at `slots`); torch.cat or "
                "index_copy (no underscore) make a new tensor that the cache never sees"
            )
    ref_k, ref_v = (head_first(acts[f"blocks.{layer}.attn.hook_{c}"]) for c in "kv")
    ref_q = head_first(acts[f"blocks.{layer}.attn.hook_q"])
    if torch.equal(keys, values):
        pytest.fail(
            "the value buffer holds the same numbers as the key buffer: are the new keys "
            "written into both? The values are the projection by W_V and b_V."
        )
    if close_f32(keys[:, :, :n], ref_q) or close_f32(values[:, :, :n], ref_q):
        name = "keys" if close_f32(keys[:, :, :n], ref_q) else "values"
        pytest.fail(
            f"the {name} written are the queries: each of q, k and v has its own weights and "
            "bias (W_Q and b_Q, W_K and b_K, W_V and b_V)."
        )
    for name, got, ref, bias in [("b_K", keys, ref_k, attn.b_K), ("b_V", values, ref_v, attn.b_V)]:
        if close_f32(got[:, :, :n], ref - bias[None, :, None, :]):
            pytest.fail(f"the keys or values lack their bias: did you forget {name}?")
    assert_close_f32(keys[:, :, :n], ref_k, "keys written to slots 0..n-1 (vs transformer-lens)")
    assert_close_f32(values[:, :, :n], ref_v, "values written to slots 0..n-1")
    assert not keys[:, :, n:].any(), "only the slots asked for may be written"
    q = head_first(acts[f"blocks.{layer}.attn.hook_q"])
    full_k, full_v = fresh_buffers(cfg)
    full_k[:, :, :n], full_v[:, :, :n] = ref_k, ref_v
    allowed = allowed_for(cfg.n_ctx, slots, n)
    check_output(
        out, acts[f"blocks.{layer}.hook_attn_out"], attn, q, full_k, full_v, allowed, slots
    )


def same_f32(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """close_f32, with NaN equal to NaN (a fully hidden row gives NaN in some variants)."""
    return actual.shape == expected.shape and torch.allclose(
        actual, expected, atol=1e-4, rtol=1e-4, equal_nan=True
    )


def attention_mistake(out, attn, q, keys, values, allowed, slots) -> str:
    """The likely mistake behind a wrong output, recognised by computing each candidate on the
    test's own queries, buffers and mask (`keys`, `values`: the buffers as they should be)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def projected(z):
        return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O

    b, h, n, e = q.shape
    right = sdpa(q, keys, values, attn_mask=allowed)
    scores = q @ keys.transpose(-1, -2) / e**0.5
    masked_to_zero = scores.masked_fill(~allowed, 0.0).softmax(-1) @ values
    new_k, new_v = keys[:, :, slots], values[:, :, slots]
    q_no_bias = q - attn.b_Q[None, :, None, :]
    candidates = [
        (
            projected(sdpa(q, keys, values, attn_mask=allowed, scale=1.0)),
            "it is attention whose scores were not scaled: divide q·k by sqrt(d_head) before "
            "the softmax (F.scaled_dot_product_attention does it for you).",
        ),
        (
            projected(sdpa(q, keys, values, attn_mask=allowed, scale=1 / e)),
            "it is attention whose scores were divided by d_head: the scale is 1/sqrt(d_head), "
            "the square root.",
        ),
        (
            projected(masked_to_zero),
            "it is attention whose hidden scores were set to 0 before the softmax: a score of "
            "0 still gets a weight (exp(0) = 1). Hidden slots need -inf, or pass `allowed` as "
            "attn_mask to F.scaled_dot_product_attention.",
        ),
        (
            projected(sdpa(q, keys, values)),
            "it is attention with no mask: every query read all n_ctx slots, the empty ones "
            "and those after it too. Pass `allowed` as the attention's mask.",
        ),
        (
            projected(sdpa(q, new_k, new_v)),
            "it is attention over the new positions' own keys and values only, not the "
            "buffers: the queries must read the whole buffers (every slot `allowed` lets in), "
            "where the earlier positions' keys are.",
        ),
        (
            projected(sdpa(q_no_bias, keys, values, attn_mask=allowed)),
            "it is the right attention with queries that lack their bias: did you forget b_Q?",
        ),
        (
            projected(sdpa(q, keys, values, attn_mask=~allowed)),
            "it is attention through the inverted mask. In `allowed`, True means may read (the "
            "convention of F.scaled_dot_product_attention's boolean mask); inverted, it hides "
            "exactly the slots to read and lets in the others.",
        ),
        (
            projected(sdpa(q, keys, values, is_causal=True)),
            "it is attention with is_causal=True. That mask is PyTorch's own, aligned to the "
            "top-left: the i-th new query reads slots 0..i, not the slots written up to its own "
            "slot. Pass the cache's mask `allowed` instead, which holds both.",
        ),
        (
            projected(sdpa(q, keys, values, attn_mask=allowed.float())),
            "it is attention with a float mask of 0s and 1s. A float mask is added to the "
            "scores, so every slot is read (the allowed ones get +1); a bool mask is what "
            "hides slots: pass `allowed` as it is.",
        ),
        (
            right.reshape(b, n, h * e) @ attn.W_O.reshape(h * e, -1) + attn.b_O,
            "it is the right attention, with z [batch, heads, new, d_head] reshaped to "
            "[batch, new, heads * d_head] while the heads axis still came first: that mixes "
            "positions and heads. Move the heads axis next to d_head before a reshape, or "
            "contract heads and d_head with W_O in one einsum.",
        ),
    ]
    for candidate, mistake in candidates:
        if not same_f32(candidate, projected(right)) and same_f32(out.detach(), candidate):
            return " " + mistake
    return ""


def check_output(out, expected, attn, q, keys, values, allowed, slots) -> None:
    if close_f32(out, expected):
        return
    if out.shape == expected.shape and close_f32(out, expected - attn.b_O):
        pytest.fail("Did you forget the output bias b_O? It is added after W_O.")
    with torch.no_grad():
        mistake = attention_mistake(out, attn, q, keys, values, allowed, slots)
    if mistake:
        pytest.fail(f"the attention output differs from transformer-lens':{mistake}")
    assert_close_f32(
        out,
        expected,
        "attention output (vs transformer-lens). Read all n_ctx slots through `allowed` "
        "(attn_mask=allowed: True means may read), scaled by 1/sqrt(d_head)",
    )


@pytest.mark.attention_static
@pytest.mark.parametrize("t", [9, 30])
def test_a_step_writes_its_own_slot_and_reads_the_cache(impl, shipped, ref_run, t):
    _, _, acts = ref_run
    layer = 1
    attn = shipped[0].blocks[layer].attn
    cfg = attn.cfg
    ref_k, ref_v = (head_first(acts[f"blocks.{layer}.attn.hook_{c}"]) for c in "kv")
    # Slots before t hold the reference's keys; every slot after holds 7.0, which the mask hides
    # and which must still be there afterwards.
    keys, values = fresh_buffers(cfg, fill=7.0)
    keys[:, :, :t], values[:, :, :t] = ref_k[:, :, :t], ref_v[:, :, :t]
    before_k, before_v = keys.clone(), values.clone()
    slot = torch.tensor([t])
    x = acts[f"blocks.{layer}.ln1.hook_out"][:, t : t + 1]
    out = attention_static_called(
        impl, attn, x, keys, values, slot, allowed_for(cfg.n_ctx, slot, t + 1)
    )
    if torch.equal(keys, before_k):
        pytest.fail(
            "the key buffer is unchanged: write the new key into slot `slots` of the buffer "
            "passed in, in place (index_copy_)"
        )
    if close_f32(keys[:, :, :1], ref_k[:, :, t : t + 1]) and not close_f32(
        keys[:, :, t : t + 1], ref_k[:, :, t : t + 1]
    ):
        pytest.fail(
            f"the new key went to slot 0, not to slot {t}: write at the slots given (`slots`), "
            "not at 0, 1, ..."
        )
    assert_close_f32(keys[:, :, t : t + 1], ref_k[:, :, t : t + 1], f"the key written to slot {t}")
    assert_close_f32(values[:, :, t : t + 1], ref_v[:, :, t : t + 1], f"the value in slot {t}")
    others = torch.ones(cfg.n_ctx, dtype=torch.bool)
    others[t] = False
    assert torch.equal(keys[:, :, others], before_k[:, :, others]) and torch.equal(
        values[:, :, others], before_v[:, :, others]
    ), "slots other than `slots` must be left as they were"
    q = head_first(acts[f"blocks.{layer}.attn.hook_q"])[:, :, t : t + 1]
    full_k, full_v = before_k.clone(), before_v.clone()
    full_k[:, :, t : t + 1], full_v[:, :, t : t + 1] = (
        ref_k[:, :, t : t + 1],
        ref_v[:, :, t : t + 1],
    )
    allowed = allowed_for(cfg.n_ctx, slot, t + 1)
    check_output(
        out,
        acts[f"blocks.{layer}.hook_attn_out"][:, t : t + 1],
        attn,
        q,
        full_k,
        full_v,
        allowed,
        slot,
    )


# --------------------------------------------------------------------------- forward_static


def hf_logits(hf, rows: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [hf(torch.tensor([r])).logits[0] for r in rows]


@pytest.mark.forward_static
def test_a_prefill_and_steps_give_hfs_logits(impl, shipped, hf, monkeypatch):
    model, tokenizer = shipped
    ids = tokenizer.encode(PROMPT)
    more = [17, 250, 3]
    expected = hf_logits(hf, [ids + more])[0]
    n = len(ids)
    cache = impl.StaticKeyValueCache(model.cfg, batch=1)
    where = [b.data_ptr() for b in list(cache.keys) + list(cache.values)]
    slots = torch.arange(n)
    with allowed_shapes(impl) as shapes, torch.no_grad():
        logits = impl.forward_static(model, torch.tensor([ids]), cache, slots, slots[None])
    want = (1, 1, n, model.cfg.n_ctx)
    wrong = [shape for shape in shapes if shape != want]
    assert not wrong, (
        f"forward_static handed attention_static an `allowed` of shape {wrong[0]}; it is "
        f"[batch, 1, new, n_ctx], here {want}: the axis of size 1 stands for the heads, so that "
        "one mask broadcasts over them. Without it, the batch meets the heads' axis (a batch of "
        "1 hides it; a batch of 3 fails). Which axes did you add to cache.mask and the rows?"
    )
    assert tuple(logits.shape) == (1, n, model.cfg.d_vocab), (
        f"logits of every new token, [batch, new, d_vocab]: got {tuple(logits.shape)}"
    )
    if not close_f32(logits[0], expected[:n]):
        later = (logits[0] - expected[:n]).abs().amax(dim=-1) > 1e-3
        tokens = torch.tensor([ids])
        with torch.no_grad():
            every_key = uncached_variant(model, tokens, causal=False)[0]
            no_final_ln = uncached_variant(model, tokens, final_ln=False)[0]
            square = torch.ones(n, n, dtype=torch.bool)
            later_keys = logits_reading(model, tokens, square.triu())[0]  # its own and after
            own_only = logits_reading(model, tokens, torch.eye(n, dtype=torch.bool))[0]
        if close_f32(logits[0], every_key):
            hint = (
                "they are the logits of queries that read every slot, those after their own too: "
                "keep the causal part of the mask (cache.causal[slots])."
            )
        elif close_f32(logits[0], later_keys):
            hint = (
                "they are the logits of queries that read their own slot and those AFTER it, not "
                "those before: the causal rows are turned around. In cache.causal the rows are "
                "the query slots and the columns the key slots: pick the rows of the new slots."
            )
        elif close_f32(logits[0], own_only):
            hint = (
                "they are the logits of queries that each read their own slot alone: when "
                "attention ran, cache.mask did not hold the new slots yet. Record `real` in "
                "cache.mask before the blocks run."
            )
        elif close_f32(logits[0], no_final_ln):
            hint = (
                "they are the logits without the final LayerNorm: the unembedding reads "
                "ln_final of the residual stream."
            )
        elif not close_f32(logits[0, :1], expected[:1]):
            hint = "already at the first position: check the embeddings, blocks and unembedding."
        else:
            hint = (
                f"from position {int(later.nonzero()[0])} on, while the first is right: a query "
                "reads slots it may not (the causal part, cache.causal[slots]) or not the ones it "
                "may (cache.mask must record the new slots before attention reads it)."
            )
        pytest.fail(f"prefill logits differ from HF's: {hint}")
    assert cache.mask[0, :n].all() and not cache.mask[0, n:].any(), (
        "after a prefill of n tokens, cache.mask is True at slots 0..n-1 and False after"
    )
    for i, token in enumerate(more):
        slot = torch.tensor([n + i])
        with torch.no_grad():
            step = impl.forward_static(model, torch.tensor([[token]]), cache, slot, slot[None])
        if not close_f32(step[0, -1], expected[n + i]) and positions_ignored(
            impl, model, ids, token
        ):
            pytest.fail(
                f"the prefill is right, and decoding step {i + 1}'s logits are not. Your "
                "forward_static gives a step the same logits whatever `positions` says: is each "
                "token embedded at its `positions` (W_pos's rows), not at positions counted from "
                "0 in the call (chapter 1's pos_embed of the new tokens alone)?"
            )
        assert_close_f32(step[0, -1], expected[n + i], f"the logits of decoding step {i + 1}")
    assert [b.data_ptr() for b in list(cache.keys) + list(cache.values)] == where, (
        "the cache's buffers moved: write into them in place"
    )


@contextlib.contextmanager
def allowed_shapes(impl):
    """The shape of each `allowed` that forward_static hands to attention_static, recorded as it
    calls it (when it calls it by that name) while the block runs. The name is put back when the
    block ends, not at the test's teardown: the grader puts the notebook's namespace back as it
    was when the test's call returns, and a later restore would leave this test's value there
    (the reference attention_static that stood in for a broken one, for the next tests)."""
    shapes: list[tuple[int, ...]] = []
    names = impl.forward_static.__globals__
    original = names.get("attention_static")
    if original is None:
        yield shapes
        return

    def recorded(attn, x, keys, values, slots, allowed, *args, **kwargs):
        shapes.append(tuple(allowed.shape))
        return original(attn, x, keys, values, slots, allowed, *args, **kwargs)

    names["attention_static"] = recorded
    try:
        yield shapes
    finally:
        names["attention_static"] = original


def logits_reading(model, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The model's logits when query i reads key j exactly where allowed[i, j] ([n, n] bool):
    what a mask built another way gives, to name it."""
    residual = model.embed(tokens) + model.pos_embed(tokens)
    for block in model.blocks:
        attn, x = block.attn, block.ln1(residual)
        q, k, v = (
            torch.einsum("bpd,hde->bhpe", x, W) + b[:, None]
            for W, b in ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V))
        )
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        residual = residual + torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O
        residual = residual + block.mlp(block.ln2(residual))
    return model.unembed(model.ln_final(residual))


def positions_ignored(impl, model, ids: list[int], token: int) -> bool:
    """Whether the learner's forward_static gives a step after `ids` the same logits at its true
    position and at position 0 (each on a fresh prefill): `positions` then changes nothing."""
    n = len(ids)
    steps = []
    for position in (n, 0):
        cache = impl.StaticKeyValueCache(model.cfg, batch=1)
        slots = torch.arange(n)
        with torch.no_grad():
            impl.forward_static(model, torch.tensor([ids]), cache, slots, slots[None])
            slot = torch.tensor([n])
            step = impl.forward_static(
                model, torch.tensor([[token]]), cache, slot, torch.tensor([[position]])
            )
        steps.append(step[0, -1])
    return close_f32(steps[0], steps[1])


def padded_prefill(impl, shipped):
    """The batch prompts, left-padded with PAD_ID, prefilled by the learner's forward_static into
    a fresh cache: (rows, tokens, real, positions, cache, logits)."""
    model, tokenizer = shipped
    rows = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    tokens, real = left_padded(rows, PAD_ID)
    positions = (real.cumsum(dim=1) - 1).clamp(min=0)
    cache = impl.StaticKeyValueCache(model.cfg, batch=len(rows))
    with torch.no_grad():
        slots = torch.arange(tokens.shape[1])
        logits = impl.forward_static(model, tokens, cache, slots, positions, real)
    return rows, tokens, real, positions, cache, logits


@pytest.mark.forward_static
def test_a_left_padded_batch_gives_each_rows_own_logits(impl, shipped, hf):
    model = shipped[0]
    rows, tokens, real, positions, cache, logits = padded_prefill(impl, shipped)
    width = tokens.shape[1]
    with torch.no_grad():
        nxt = torch.tensor([[7], [9], [11]])
        slot = torch.tensor([width])
        step = impl.forward_static(model, nxt, cache, slot, positions[:, -1:] + 1)
    expected = hf_logits(hf, [r + [int(nxt[b])] for b, r in enumerate(rows)])
    for b, row in enumerate(rows):
        padded = width > len(row)
        ok = close_f32(logits[b, -1], expected[b][len(row) - 1]) and close_f32(
            step[b, -1], expected[b][len(row)]
        )
        if ok:
            continue
        if padded:
            with torch.no_grad():
                by_slot = hf(tokens[b : b + 1], attention_mask=real[b : b + 1].long()).logits
            if close_f32(logits[b, -1], by_slot[0, -1]):
                pytest.fail(
                    f"row {b} is left-padded and its logits are those of its tokens at their "
                    "SLOTS, 0, 1, 2, ... from the first column, as for a row without padding (the "
                    "slots, or another row's positions, give that): embed each token at its own "
                    "row's position (`positions[b]`, which counts real tokens), not at its slot"
                )
            pytest.fail(
                f"row {b} is left-padded ({width - len(row)} padding tokens) and its logits differ "
                "from the prompt's alone: record `real` in cache.mask (padding is not a token to "
                "read), embed at `positions`, and let each query read real slots up to its own"
            )
        pytest.fail(
            f"row {b} (no padding) differs from HF's logits for the prompt alone (step 0: the "
            "prefill's last position, step 1: the next token's). "
            + explain_difference(
                torch.stack([logits[b, -1], step[b, -1]]),
                torch.stack([expected[b][len(row) - 1], expected[b][len(row)]]),
                ("step", "d_vocab"),
                F32_ATOL,
                F32_RTOL,
            )
        )


@pytest.mark.forward_static
def test_a_padding_query_reads_its_own_slot(impl, shipped, hf):
    # A padding query has no real key at or before its slot: the own-slot rule gives it one key
    # to read, its own. It then sees only itself, at position 0: its logits are the one-token
    # text [pad]'s. Without the rule its row is all masked: PyTorch's CPU attention (2.13)
    # returns zeros there, a softmax written by hand NaN, which would then reach every real
    # query through the cache (a weight of 0 times a NaN value is NaN).
    rows, tokens, real, _, _, logits = padded_prefill(impl, shipped)
    width = tokens.shape[1]
    with torch.no_grad():
        alone = hf(torch.tensor([[PAD_ID]])).logits[0, 0]
    b = next(b for b, r in enumerate(rows) if len(r) < width)
    n_pad = width - len(rows[b])
    got = logits[b, :n_pad]
    if torch.isnan(got).any() or not close_f32(got, alone.expand_as(got)):
        what = "NaN" if torch.isnan(got).any() else "logits that are not the pad token's alone"
        pytest.fail(
            f"row {b} starts with {n_pad} padding tokens, and at those slots forward_static gave "
            f"{what}. A padding query has no real key at or before its own slot: does your "
            "`allowed` let every query read its own slot, padding or not? Then a padding query "
            "reads one key (its own) and its logits are those of the one-token text [pad] (HF's "
            "GPT-2 on that token alone, the expected here); with no key at all its softmax row "
            "is all -inf, which some attention kernels turn into NaN, and a NaN value in the "
            "cache spoils every real query that multiplies it by a weight of 0."
        )


@pytest.mark.attention_static
def test_attention_static_never_reads_the_device(impl, shipped, monkeypatch):
    attn = shipped[0].blocks[1].attn
    cfg = attn.cfg
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, cfg.d_model, generator=g)
    keys = torch.zeros(2, cfg.n_heads, cfg.n_ctx, cfg.d_head)
    values = torch.zeros_like(keys)
    slots = torch.tensor([4, 5, 6])
    allowed = allowed_for(cfg.n_ctx, slots, 7).expand(2, 1, 3, cfg.n_ctx)
    with monkeypatch.context() as patch, torch.no_grad():
        counter = ReadCounter(patch)
        impl.attention_static(attn, x, keys, values, slots, allowed)
    assert counter.reads == 0, (
        f"one call of attention_static made {reads(counter.reads)} ({HOST_READS}). Each "
        "read makes the host wait for the device and splits a compiled step in two. Which "
        "line turns a tensor into a Python number, or branches on one?"
    )


@pytest.mark.forward_static
def test_forward_static_never_reads_the_device(impl, shipped, monkeypatch):
    model, tokenizer = shipped
    rows = [tokenizer.encode(p) for p in BATCH_PROMPTS]
    tokens, real = left_padded(rows, PAD_ID)
    width = tokens.shape[1]
    positions = (real.cumsum(dim=1) - 1).clamp(min=0)
    cache = impl.StaticKeyValueCache(model.cfg, batch=len(rows))
    slot = torch.tensor([width])
    with monkeypatch.context() as patch, torch.no_grad():
        counter = ReadCounter(patch)
        impl.forward_static(model, tokens, cache, torch.arange(width), positions, real)
        impl.forward_static(
            model, torch.tensor([[7], [9], [11]]), cache, slot, positions[:, -1:] + 1
        )
    if not counter.reads:
        return
    in_attention = counter.inside("attention_static", "project")
    if in_attention == counter.reads:
        pytest.fail(
            f"a prefill and a step made {reads(counter.reads)}, all inside your "
            "attention_static, which forward_static calls: fix attention_static first "
            "(pytest -m attention_static)"
        )
    pytest.fail(
        f"a padded prefill and one decoding step made {reads(counter.reads - in_attention)} "
        f"in forward_static itself ({HOST_READS}; by function: {dict(counter.where)}). "
        "forward_static is the decoding step that section 4 compiles into one graph: a read "
        "there makes every step wait for the device and splits the graph. Keep `real`, the "
        "slots and the positions tensors: build the mask with tensor operations (a default of "
        "all True is a tensor of ones, not a Python branch on values)."
    )


# --------------------------------------------------------------------------- fast_sample


class StepCalls(list):
    """(token, slot, position) of each call of the step, and the widths of the tokens given."""

    widths: list[int]


def recording_steps(sampler) -> StepCalls:
    """Wraps `sampler.step` so that each call's (token, slot, position) is recorded, as numbers
    copied at the call (the loop advances its slot in place afterwards), with the number of
    tokens each call was given (`widths`)."""
    calls = StepCalls()
    calls.widths = []
    step = sampler.step

    def recorded(model, cache, token, slot, position):
        numbers = [
            name for name, t in (("slot", slot), ("position", position)) if not torch.is_tensor(t)
        ]
        if numbers:
            pytest.fail(
                f"self.step was given its {' and '.join(numbers)} as a Python number. A "
                "compiled step is guarded on every Python number it is given and compiled again "
                "for each new value: pass the slot and the position as tensors (the slot tensor "
                "advanced in place, its [None] as the position), never as Python ints."
            )
        calls.append((int(token.flatten()[0]), int(slot.flatten()[0]), int(position.flatten()[0])))
        calls.widths.append(token.shape[-1] if token.ndim else 1)
        return step(model, cache, token, slot, position)

    sampler.step = recorded
    return calls


def slot_mistake(
    calls: list[tuple[int, int, int]],
    n_prompt: int,
    new: list[int],
    wanted: list[int] | None = None,
    first_position: int | None = None,
) -> str:
    """What the slots, positions and tokens fed to the decoding steps say about the loop, given
    the new tokens `wanted` and, when known, the greedy token after the prompt's
    FIRST position (what a prefill read at position 0 samples)."""
    if not calls:
        return (
            " The loop never called self.step: call it for the logits after each new token "
            "(it is the step that section 4 compiles)."
        )
    tokens, slots, positions = (list(c) for c in zip(*calls, strict=True))
    if slots[0] != n_prompt:
        return (
            f" The first decoding step got slot {slots[0]}, but the prompt's {n_prompt} tokens "
            f"fill slots 0 to {n_prompt - 1}, so the first sampled token goes into slot "
            f"{n_prompt}. Where does your slot start"
            + (
                ", and is it advanced after each step, not before?"
                if slots[0] == n_prompt + 1
                else "?"
            )
        )
    if len(slots) > 1 and len(set(slots)) == 1:
        return f" Every decoding step got slot {slots[0]}: advance the slot after each step."
    expected = list(range(n_prompt, n_prompt + len(slots)))
    if slots != expected:
        return f" The steps got slots {slots[:6]}..., one more each step would be {expected[:6]}."
    if positions != slots:
        return (
            f" The steps got positions {positions[:6]}... for slots {slots[:6]}...: without "
            "padding, a token's position is its slot."
        )
    if not new:
        return (
            f" The loop ran {len(calls)} decoding steps, yet the text keeps 0 new tokens: the "
            "end of sample cuts `text` to n_new new tokens, and your n_new stays 0. Is it set to "
            "the number of tokens written as the loop goes?"
        )
    if wanted is not None and tokens == wanted[: len(tokens)] and new == wanted[:-1]:
        return (
            f" The decoding steps were fed the right tokens, and yours keeps {len(new)} new "
            f"tokens of the {len(wanted)} asked for: one short. Does the loop sample "
            "max_tokens_generated tokens, and is n_new (how many new tokens the given code keeps) "
            "the number written so far, i + 1 after token i?"
        )
    if wanted is not None and tokens == wanted[: len(tokens)] and new != wanted:
        late = new[1 : len(wanted)] == wanted[: len(new) - 1]
        early = len(new) > 1 and new[: len(new) - 1] == wanted[1 : len(new)]
        if early:
            return (
                f" The decoding steps were fed the right tokens ({tokens[:4]}...), so the "
                "sampling is right and `text` is off: each token sits one index early in `text` "
                "(the first new token overwrote the prompt's last, and the next token overwrote "
                "it). Where does new token i go, counting from the end of the prompt?"
            )
        return (
            f" The decoding steps were fed the right tokens ({tokens[:4]}...), so the sampling "
            "is right and `text` is off"
            + (
                ": each token sits one index late in `text`, after a gap. Where does new token "
                "i go, counting from the end of the prompt?"
                if late
                else ": where in `text` is each new token written?"
            )
        )
    if first_position is not None and wanted and new[0] == first_position != wanted[0]:
        return (
            " The very first new token comes from the prefill alone, and yours is the one the "
            "prompt's FIRST position predicts: sample it from the logits of the prefill's last "
            "position (the prompt's last token)."
        )
    for i, (fed, sampled) in enumerate(zip(tokens, new, strict=False)):
        if fed != sampled:
            return (
                f" Decoding step {i + 1} was fed token {fed}, but the token sampled before it "
                f"was {sampled}: feed each sampled token to the next step."
            )
    return (
        " Each decoding step was fed the token sampled before it, at the right slot and "
        "position: the loop's bookkeeping is right, and the tokens drawn are not. Are they drawn "
        "by sample_next_token from the logits (the prefill's last position's for the first "
        "token, then each step's), with every sampling argument (here temperature=0: the "
        "argmax)?"
    )


@pytest.mark.fast_sample
@pytest.mark.parametrize("prompt", BATCH_PROMPTS[:2])
def test_greedy_tokens_are_hf_generates_on_its_static_cache(impl, shipped, hf, prompt):
    model, tokenizer = shipped
    ids = tokenizer.encode(prompt)
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False)
    calls = recording_steps(sampler)
    try:
        got = sampler.sample(ids, 40, temperature=0.0, stop_at_eos=False).tolist()
    except ValueError as error:
        if "logits [batch, d_vocab]" in str(error):
            pytest.fail(
                f"sample_next_token refused the first logits: `{error}`. The prefill gives "
                "logits for every position of the prompt, [1, n_prompt, d_vocab]; the first new "
                "token is sampled from the last position's alone, [1, d_vocab]."
            )
        raise
    wide = [width for width in calls.widths if width != 1]
    assert not wide, (
        f"self.step was called with {wide[0]} tokens at once: that is the prefill. self.step is "
        "the decoding step that section 4 compiles for one shape, one token [1, 1]; the prompt's "
        "shape would compile it again for every prompt length. Run the prefill with "
        "forward_static itself (eager), and self.step for the new tokens only."
    )
    expected = hf_static_greedy(hf, ids, 40, stop_at_eos=False)
    if got != expected:
        with torch.no_grad():
            first_position = int(hf(torch.tensor([ids])).logits[0, 0].argmax())
        pytest.fail(
            f"greedy text differs from HF's generate(cache_implementation='static'): "
            f"{describe_difference(tokenizer, expected, got, len(ids))}."
            + slot_mistake(calls, len(ids), got[len(ids) :], expected[len(ids) :], first_position)
        )


SAMPLING_CASES = [
    {"temperature": 1.0, "seed": 3},
    {"temperature": 0.8, "top_k": 10, "seed": 1},
    {"temperature": 1.0, "top_p": 0.9, "seed": 2},
    {"temperature": 1.0, "frequency_penalty": 1.5, "seed": 4},
    {"temperature": 1.2, "seed": 5, "stop_at_eos": False},
]


def probabilities_sampler(impl):
    """Chapter 3's sampler with the softmax of its logits in their place."""

    class Probabilities(impl.TransformerSampler):
        def next_logits(self, input_ids):
            return super().next_logits(input_ids).softmax(-1)

    return Probabilities


@pytest.mark.fast_sample
@pytest.mark.parametrize("kwargs", SAMPLING_CASES, ids=lambda k: ",".join(map(str, k)))
def test_sampled_tokens_are_chapter_3s_under_the_same_seed(impl, shipped, kwargs):
    model, tokenizer = shipped
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False)
    expected = impl.TransformerSampler(model, tokenizer).sample(PROMPT, 60, **kwargs)
    try:
        got = sampler.sample(PROMPT, 60, **kwargs)
    except RuntimeError as error:
        if kwargs.get("frequency_penalty") and (
            "size of tensor" in str(error) or "scalar type" in str(error)
        ):
            pytest.fail(
                f"{kwargs}: sample raised `{error}`. The penalty's counts are one row of floats "
                f"with one entry per token of the vocabulary, [1, d_vocab] = [1, "
                f"{model.cfg.d_vocab}]: torch.bincount stops at the largest id it sees unless "
                "told its minlength, and counts integers unless converted to float."
            )
        raise
    if got != expected:
        n_prompt = len(tokenizer.encode(PROMPT))
        where = describe_difference(tokenizer, tokenizer.encode(expected), got, n_prompt)
        hint = ""
        if kwargs.get("frequency_penalty"):
            hint = (
                " With a frequency penalty, subtract penalty * counts from the logits, and add "
                "each sampled token to counts (index_add_) before the next step. Do your counts "
                "start from the prompt's tokens? Chapter 3's penalty counts the prompt too."
            )
        elif got == probabilities_sampler(impl)(model, tokenizer).sample(PROMPT, 60, **kwargs):
            pytest.fail(
                f"{kwargs}: yours is chapter 3's sampler handed probabilities where logits go "
                f"({where}): sample_next_token takes logits (it divides by the temperature and "
                "takes the softmax itself). Pass the scores as they are, before any softmax."
            )
        eos = tokenizer.eos_token_id
        new_ids = tokenizer.encode(got)[n_prompt:]
        if (
            kwargs.get("stop_at_eos", True)
            and new_ids[:1] == [eos] != tokenizer.encode(expected)[n_prompt:][:1]
        ):
            pytest.fail(
                f"{kwargs}: your text ends at once, with end-of-text as its first new token, "
                f"where chapter 3's goes on ({where}). The mask wrote end-of-text before the "
                "text was done: torch.where(condition, x, y) takes x where the condition is "
                "True. Which of the two is end-of-text in yours?"
            )
        pytest.fail(
            f"{kwargs}: the text differs from chapter 3's sampler under the same seed: {where}. "
            "Call sample_next_token once per token, with the sampling arguments and the one "
            "generator that `_start` made from the seed (the same generator for every token: "
            f"one made again at each step repeats its first draws), in chapter 3's order.{hint}"
        )


@pytest.mark.fast_sample
def test_the_penalty_counts_the_text_so_far_when_the_end_of_text_comes_early(impl, shipped):
    model, tokenizer = shipped
    eos = tokenizer.eos_token_id
    # On the shipped model this draw ends with end-of-text as new token 6, well before the 40
    # asked for: the slots of `text` not written yet hold end-of-text filler all along.
    kwargs = dict(temperature=1.3, frequency_penalty=0.5, seed=14)
    prompt = "KING.\n"
    expected = impl.TransformerSampler(model, tokenizer).sample(prompt, 40, **kwargs)
    n_prompt = len(tokenizer.encode(prompt))
    new = tokenizer.encode(expected)[n_prompt:]
    assert new and new[-1] == eos and len(new) < 10, "test setup: this draw ends early"
    got = impl.FastTransformerSampler(model, tokenizer, compile=False).sample(prompt, 40, **kwargs)
    if got == expected:
        return
    where = describe_difference(tokenizer, tokenizer.encode(expected), got, n_prompt)
    head = tokenizer.decode(tokenizer.encode(expected)[:-1])
    if got.startswith(head) and not got.startswith(expected):
        pytest.fail(
            f"{kwargs}: chapter 3's text ends with end-of-text as new token {len(new) - 1}; "
            f"yours goes on instead ({where}). End-of-text was held back as if the penalty had "
            "counted it many times: do your counts come from the `text` buffer, whose slots not "
            "written yet are end-of-text filler? Count the prompt's tokens and then each token "
            "as it is sampled."
        )
    pytest.fail(
        f"{kwargs}, a draw that ends early: the text differs from chapter 3's sampler under the "
        f"same seed: {where}. With a frequency penalty, the counts start from the prompt's "
        "tokens and grow by each sampled token."
    )


@pytest.mark.fast_sample
@pytest.mark.parametrize("stop_at_eos", [True, False])
def test_the_loop_reads_the_device_once_every_sync_every_tokens(
    impl, shipped, monkeypatch, stop_at_eos
):
    model, tokenizer = shipped
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False, sync_every=16)
    ids = tokenizer.encode(PROMPT)
    counts, inside, told = [], [], []
    with monkeypatch.context() as patch:
        counter = ReadCounter(patch)
        for n_tokens in (64, 128):
            counter.reset()
            sampler.sample(ids, n_tokens, temperature=1.0, seed=0, stop_at_eos=stop_at_eos)
            counts.append(counter.reads)
            inside.append(counter.inside("forward_static", "attention_static", "project"))
            told.append(sampler.host_reads)
    allowed = 64 // 16 if stop_at_eos else 0
    more = counts[1] - counts[0]
    if more > allowed and inside[1] > inside[0]:
        pytest.fail(
            f"64 more tokens made {more} more host reads, {inside[1] - inside[0]} of them inside "
            "your forward_static or attention_static, which every decoding step calls: the "
            "reads are there, not in the loop. Fix them first (pytest -m forward_static and "
            "-m attention_static say where)."
        )
    assert more <= allowed, (
        f"64 more tokens made {more} more host reads in the loop ({HOST_READS}); "
        + (
            f"a loop that waits only every sync_every=16 tokens makes {allowed}. "
            if stop_at_eos
            else "without stop_at_eos there is nothing to check before the end: 0. "
        )
        + "Keep the token a tensor, write it into `text`, and mark the end of text with a mask "
        "(look up torch.where) instead of an `if`"
    )
    assert told[1] - told[0] == more, (
        f"64 more tokens made {more} more host reads, counted here as they happened, but "
        f"self.host_reads went up by {told[1] - told[0]} ({told[0]} for 64 tokens, {told[1]} "
        "for 128): self.host_reads must equal the reads your loop actually makes. Does it count "
        "the check of `done` every sync_every tokens (one read each time)?"
    )


@pytest.mark.fast_sample
def test_verbose_prints_each_token_and_counts_a_host_read_for_each(impl, shipped):
    model, tokenizer = shipped
    kwargs = dict(temperature=1.0, seed=7, stop_at_eos=False)
    chapter_3 = impl.TransformerSampler(model, tokenizer)
    expected = printed_by(lambda: chapter_3.sample(PROMPT, 12, verbose=True, **kwargs))
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False, sync_every=16)
    sampler.sample(PROMPT, 12, **kwargs)
    quiet = sampler.host_reads
    printed = printed_by(lambda: sampler.sample(PROMPT, 12, verbose=True, **kwargs))
    assert printed == expected, (
        f"with verbose=True, chapter 3's sampler prints each new token as it comes, "
        f"{expected!r}; yours printed {printed!r}. Print each token's text once, right after it "
        "is sampled, on one line (no newline between tokens)"
    )
    assert sampler.host_reads - quiet == 12, (
        f"12 tokens printed as they come are 12 host reads (each print waits for its token), "
        f"so verbose=True should add 12 to self.host_reads; yours added "
        f"{sampler.host_reads - quiet}. Count one host read for each token you print"
    )


@pytest.mark.fast_sample
def test_after_the_end_of_text_the_steps_are_fed_end_of_text(impl, shipped):
    # HF's generate does the same for a finished row of a batch: it writes the pad token in
    # place of whatever was sampled (transformers' GenerationMixin._sample,
    # `next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)`). At
    # batch 1 the given code cuts the text anyway; what the mask decides is what the steps
    # between the end of text and the next check are fed, and what `text` holds there.
    model, tokenizer = shipped
    eos = tokenizer.eos_token_id
    # On the shipped model this draw writes end-of-text as new token 6, then other tokens.
    kwargs = dict(temperature=1.3, seed=14)
    prompt = "KING.\n"
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False, sync_every=16)
    calls = recording_steps(sampler)
    out = sampler.sample(prompt, 120, **kwargs)
    n_prompt = len(tokenizer.encode(prompt))
    new = tokenizer.encode(out)[n_prompt:]
    assert new and new[-1] == eos, "test setup: this draw should end with end-of-text"
    fed = [token for token, _, _ in calls]
    after = fed[len(new) - 1 :]
    assert after and all(t == eos for t in after), (
        f"the text ended at new token {len(new)} (end-of-text), and the loop went on for "
        f"{len(after)} more steps until its check every sync_every=16 tokens; those steps were "
        f"fed {after[:8]}..., not end-of-text ({eos}) each time. Once a text is done, every "
        "later token is end-of-text, whatever was sampled: is each sampled token replaced by "
        "end-of-text when `done` is already set, before it is written and fed to the next step?"
    )


@pytest.mark.fast_sample
def test_the_loop_stops_soon_after_the_end_of_text(impl, shipped):
    model, tokenizer = shipped
    crafted = eos_boosted(model, tokenizer, EOS_BOOST)  # greedy text ends after 19 new tokens
    sampler = impl.FastTransformerSampler(crafted, tokenizer, compile=False, sync_every=8)
    calls = []
    step = sampler.step
    sampler.step = lambda *args: (calls.append(1), step(*args))[1]
    prompt = BATCH_PROMPTS[0]
    expected = impl.TransformerSampler(crafted, tokenizer).sample(prompt, 100, temperature=0.0)
    got = sampler.sample(prompt, 100, temperature=0.0)
    n_prompt = len(tokenizer.encode(prompt))
    where = describe_difference(tokenizer, tokenizer.encode(expected), got, n_prompt)
    assert got == expected, f"greedy on a model that likes end-of-text: {where}"
    n_new = len(tokenizer.encode(expected)) - n_prompt
    assert len(calls) <= n_new + 8, (
        f"the text ended after {n_new} new tokens, and the loop ran {len(calls)} decoding steps "
        "(of 99 at most): with sync_every=8 it must stop within 8 steps of the end. Is `done` set "
        "(or-ed in place) as soon as a token is end-of-text, and does the loop, every "
        "sync_every tokens, stop when `done` is set?"
    )


@pytest.mark.fast_sample
def test_without_stop_at_eos_sampling_goes_on_after_the_end_of_text(impl, shipped):
    model, tokenizer = shipped
    eos = tokenizer.eos_token_id
    # On the shipped model this draw writes one end-of-text, as new token 6, then goes on.
    kwargs = dict(temperature=1.3, seed=14, stop_at_eos=False)
    prompt = "KING.\n"
    expected = impl.TransformerSampler(model, tokenizer).sample(prompt, 120, **kwargs)
    n_prompt = len(tokenizer.encode(prompt))
    new = tokenizer.encode(expected)[n_prompt:]
    assert eos in new[:-1], "test setup: chapter 3's text should hold an end-of-text mid-way"
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False)
    got = sampler.sample(prompt, 120, **kwargs)
    if got != expected:
        where = describe_difference(tokenizer, tokenizer.encode(expected), got, n_prompt)
        pytest.fail(
            f"stop_at_eos=False, on a model that samples end-of-text often: {where}. Without "
            "stop_at_eos, an end-of-text is a token like any other and sampling goes on after "
            "it, as in chapter 3: replace the tokens after it by end-of-text only when "
            "stop_at_eos"
        )


@pytest.mark.fast_sample
def test_the_model_is_not_called_after_the_last_token(impl, shipped):
    model, tokenizer = shipped
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False)
    calls = []
    step = sampler.step
    sampler.step = lambda *args: (calls.append(1), step(*args))[1]
    out = sampler.sample(PROMPT, 20, temperature=0.0, stop_at_eos=False)
    assert len(tokenizer.encode(out)) - len(tokenizer.encode(PROMPT)) == 20
    assert len(calls) == 19, (
        f"20 new tokens take the prefill and 19 decoding steps (the last token is never fed to "
        f"the model), got {len(calls)} calls of self.step"
    )


@pytest.mark.fast_sample
def test_a_compiled_step_is_one_graph_compiled_once_for_a_whole_generation(impl, shipped):
    model, tokenizer = shipped
    torch._dynamo.reset()
    counters.clear()
    sampler = impl.FastTransformerSampler(model, tokenizer, compile="eager")
    ints = (
        "a compiled step is guarded on every Python number it is given. Pass the slot and the "
        "position as tensors (and advance the slot tensor itself), never as Python ints"
    )
    try:
        # A correct step compiles once; a step compiled again at every token stops at the
        # third version, not dynamo's eighth (each costs seconds on a busy machine).
        with torch._dynamo.config.patch(recompile_limit=2):
            first = sampler.sample(PROMPT, 24, temperature=1.0, seed=3, stop_at_eos=False)
            sampler.sample("KING.\nWhat", 12, temperature=0.0)
    except torch._dynamo.exc.FailOnRecompileLimitHit:
        torch._dynamo.reset()
        pytest.fail(f"decode_step was compiled again and again until dynamo's limit: {ints}")
    entries = len(_debug_get_cache_entry_list(impl.decode_step.__code__))
    breaks = dict(counters["graph_break"])
    torch._dynamo.reset()
    assert not breaks, (
        f"the compiled step has graph breaks: {breaks}. Inside a step, no .item(), no Python "
        "branch on a tensor, nothing dynamo cannot trace"
    )
    assert entries == 1, f"decode_step was compiled {entries} times over two generations: {ints}"
    expected = impl.TransformerSampler(model, tokenizer).sample(
        PROMPT, 24, temperature=1.0, seed=3, stop_at_eos=False
    )
    assert first == expected, "compiled with dynamo, the text must still be chapter 3's"


# --------------------------------------------------------------------------- quantize_int8


def oracle_int8(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's own: the symmetric per-channel observer's scales (range ±127), and
    torch.quantize_per_channel's integers, one matrix at a time (channel: a column)."""
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    qs, scales = [], []
    for M in W.reshape(-1, *W.shape[-2:]):
        observer = PerChannelMinMaxObserver(
            ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
            quant_min=-127, quant_max=127,
        )  # fmt: skip
        observer(M)
        scale, zero = observer.calculate_qparams()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated, not gone
            q = torch.quantize_per_channel(M, scale.double(), zero, 1, torch.qint8).int_repr()
        qs.append(q)
        scales.append(scale)
    return torch.stack(qs).reshape(W.shape), torch.stack(scales).reshape(*W.shape[:-2], -1)


def quantized(impl, W) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (q, scale), with a scale of the wrong shape named where it breaks, and a
    scale of another dtype than W's named before any comparison (which would refuse it)."""
    try:
        q, scale = impl.quantize_int8(W)
    except RuntimeError as error:
        if W.ndim > 2 and ("size of tensor" in str(error) or "must match" in str(error)):
            try:
                _, one_scale = impl.quantize_int8(W[:1])  # a stack of one matrix
            except Exception:  # noqa: BLE001 - a probe: any failure means "not this slip"
                one_scale = None
            if isinstance(one_scale, torch.Tensor) and one_scale.shape == W.shape[1:]:
                pytest.fail(
                    f"quantize_int8 of a stack of matrices {tuple(W.shape)} raised `{error}`, and "
                    f"of a stack of one it returned scales {tuple(one_scale.shape)}, one per "
                    "weight: your max runs over dim 0, the stack, not over d_in. The input "
                    "dimension is dim=-2, whatever the leading dimensions."
                )
        if "size of tensor" in str(error) or "must match" in str(error):
            pytest.fail(
                f"quantize_int8 of a {tuple(W.shape)} matrix raised `{error}`. W / scale must "
                "broadcast: a scale [..., d_out] divides W [..., d_in, d_out] only once the d_in "
                "dimension is put back (unsqueeze(-2)). And is it one scale per column, the max "
                "over d_in (dim=-2), not per row?"
            )
        raise
    if not isinstance(scale, torch.Tensor) or scale.dtype != W.dtype:
        got = scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__
        pytest.fail(
            f"quantize_int8 of a {W.dtype} matrix returned scales of {got}: keep the scales in "
            f"W's own dtype ({W.dtype}; the docstring says so). They are few (one per column), "
            "so a narrower dtype saves almost nothing, and a float16 scale keeps only about "
            "three digits: it adds a rounding of its own to every weight it restores."
        )
    return q, scale


def int8_mistake(W, q, scale) -> str:
    rows = W.abs().amax(dim=-1) / 127
    if scale.shape == rows.shape and torch.allclose(scale, rows):
        return " Your scales are per ROW (per input): a channel is a column, the max over d_in."
    expected = W.abs().amax(dim=-2) / 127
    if scale.shape == expected.shape and torch.allclose(scale, W.amax(dim=-2) / 127):
        return (
            " Your scales are the largest VALUE of each column / 127, not its largest magnitude: "
            "a column whose biggest weight is negative needs abs() first."
        )
    asymmetric = (W.amax(dim=-2) - W.amin(dim=-2)) / 255
    if scale.shape == expected.shape and torch.allclose(scale, asymmetric):
        return (
            " Your scales are (max - min) / 255, an asymmetric range with a zero point: this "
            "scheme is symmetric, zero at 0 and the largest magnitude at ±127 steps."
        )
    if W.ndim > 2 and scale.shape == W.abs().amax(dim=0).shape:
        return (
            " Your scales are the max over dim 0, which for a stack of matrices is the stack: "
            "the input dimension d_in is dim=-2, whatever the leading dimensions."
        )
    for k in (128, 255, 127.5):
        if scale.shape == expected.shape and torch.allclose(scale * k, expected * 127):
            return f" Your scales divide by {k}: by 127, so that the largest weight is ±127 steps."
    if torch.equal(q, torch.trunc(W / expected.unsqueeze(-2)).to(torch.int8)):
        return " Round to the nearest integer before converting: .to(torch.int8) truncates."
    return ""


@pytest.mark.quantize_int8
@pytest.mark.parametrize("shape", [(6, 24, 8), (40, 16)])
def test_int8_matches_pytorchs_observer_and_quantizer(impl, shape):
    g = torch.Generator().manual_seed(sum(shape))
    W = torch.randn(shape, generator=g) * torch.rand(shape[-1], generator=g)  # scales differ
    before = W.clone()
    q, scale = quantized(impl, W)
    assert torch.equal(W, before), "quantize_int8 must leave W as it was"
    assert q.dtype == torch.int8 and tuple(q.shape) == shape, (
        f"q is int8 of W's shape {shape}, got {q.dtype} {tuple(q.shape)}"
    )
    want_q, want_scale = oracle_int8(W)
    assert tuple(scale.shape) == tuple(want_scale.shape), (
        f"one scale per column of each matrix: shape {tuple(want_scale.shape)}, got "
        f"{tuple(scale.shape)}." + int8_mistake(W, q, scale)
    )
    assert torch.allclose(scale, want_scale, rtol=1e-6, atol=0), (
        "the scales differ from PyTorch's symmetric per-channel observer (largest magnitude of "
        "the column / 127)." + int8_mistake(W, q, scale)
    )
    assert torch.equal(q, want_q), (
        f"{int((q != want_q).sum())} of {q.numel()} integers differ from "
        "torch.quantize_per_channel's." + int8_mistake(W, q, scale)
    )


@pytest.mark.quantize_int8
def test_int8_rounds_ties_to_even_and_a_zero_column_to_zero(impl):
    # Column 0: largest magnitude 127, scale 1, ties at .5; column 1: all zeros.
    W = torch.tensor([[127.0, 0.0], [2.5, 0.0], [-3.5, 0.0], [0.5, 0.0], [-126.4, 0.0]])
    q, scale = quantized(impl, W)
    assert torch.isfinite(scale).all() and (scale > 0).all(), (
        f"a column of zeros needs a positive scale (torch.finfo(W.dtype).eps), not 0: got {scale}"
    )
    assert not q[:, 1].any(), f"a column of zeros quantizes to zeros, got {q[:, 1].tolist()}"
    want_q, _ = oracle_int8(W[:, :1])
    assert q[:, 0].tolist() == want_q[:, 0].tolist(), (
        f"a column whose scale is exactly 1: expected {want_q[:, 0].tolist()} (ties to even, as "
        f"torch.round and torch.quantize_per_channel), got {q[:, 0].tolist()}."
        + int8_mistake(W[:, :1], q[:, :1], scale[:1])
    )


@pytest.mark.fast_sample
def test_verbose_stops_printing_at_the_end_of_text(impl, shipped):
    # Last of fast_sample's tests: its message is for this slip alone, once the others pass.
    model, tokenizer = shipped
    # On the shipped model this draw writes end-of-text early, then other tokens (masked).
    kwargs = dict(temperature=1.3, seed=14)
    chapter_3 = impl.TransformerSampler(model, tokenizer)
    expected = printed_by(lambda: chapter_3.sample("KING.\n", 40, verbose=True, **kwargs))
    sampler = impl.FastTransformerSampler(model, tokenizer, compile=False, sync_every=16)
    printed = printed_by(lambda: sampler.sample("KING.\n", 40, verbose=True, **kwargs))
    eos = tokenizer.eos_token
    assert printed == expected, (
        f"with verbose=True the text ends at its first end-of-text: chapter 3's sampler printed "
        f"{expected!r}; yours printed {printed!r}"
        + (
            f" ({printed.count(eos) - expected.count(eos)} more end-of-text after the first). "
            "The steps after the end are fed end-of-text, but they are not the text: print a "
            "token only while the text has not ended"
            if printed.count(eos) > expected.count(eos)
            else ""
        )
    )


# Tensors made without a device pass on a CPU. attention_static and forward_static read the
# cache's values and fast_sample the model's, so their sources are read (tests/graded/_device.py).


@pytest.mark.attention_static
def test_attention_static_makes_its_tensors_on_the_cache_device(impl):
    assert_made_on_the_inputs_device(
        impl.attention_static, "attention_static", "the cache's buffers"
    )


@pytest.mark.forward_static
def test_forward_static_makes_its_tensors_on_the_tokens_device(impl):
    assert_made_on_the_inputs_device(impl.forward_static, "forward_static", "the tokens")


@pytest.mark.fast_sample
def test_fast_sample_makes_its_buffers_on_the_model_device(impl):
    assert_made_on_the_inputs_device(
        impl.FastTransformerSampler.sample, "FastTransformerSampler.sample", "the model's weights"
    )


@pytest.mark.quantize_int8
def test_quantize_int8_makes_its_tensors_on_the_weights_device(impl):
    assert_made_on_the_inputs_device(impl.quantize_int8, "quantize_int8", "the weights")
