"""The grading helpers' explainer (tests/graded/_explain.py): each pattern it names is found in
a tensor built with that pattern, and none is claimed where it does not fit."""

from __future__ import annotations

import time

import pytest
import torch

from tests.graded._explain import explain_difference
from tests.graded._oracles import assert_close_f32
from utils.timing import patient

AXES = ("batch", "posn", "d_head")
PATTERNS = (
    "transpose", "swapped", "shifted", "times", "sign", "zeros", "permutation", "repeated",
    "plus", "vector", "bfloat16", "float16", "nan", "inf", "reversed", "reshape",
)  # fmt: skip


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


E = randn(2, 5, 8)


def with_posn(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(values, dim=1)


def nan_at(x: torch.Tensor, index: tuple[int, ...], value: float) -> torch.Tensor:
    x = x.clone()
    x[index] = value
    return x


CASES = [
    # (name, got, words the explanation must hold)
    ("axes swapped in the shape", E.transpose(1, 2), ["(2, 8, 5)", "'d_head' and 'posn' swapped"]),
    ("viewed as the wrong shape", E.reshape(2, 8, 5), ["memory order"]),
    ("one position missing", E[:, :4], ["'posn' yours has 4 where 5", "first 4"]),
    ("one position too many", torch.cat([E, E[:, :1]], 1), ["first 5 are right"]),
    ("a lost axis of size 1", E[None], ["size 1"]),
    ("scaled by 1/8", E * 0.125, ["times 0.125", "1/8", "1/√64"]),
    ("scaled by √8", E * 8**0.5, ["times 2.828", "√8"]),
    ("every sign flipped", -E, ["sign flipped"]),
    ("a constant added", E + 0.3, ["plus the same 0.3"]),
    ("a bias along d_head", E + randn(8, seed=1), ["depends only on the index along 'd_head'"]),
    ("one position late", torch.cat([torch.zeros(2, 1, 8), E[:, :-1]], 1), ["one position late"]),
    ("one position early", torch.cat([E[:, 1:], E[:, -1:]], 1), ["one position early"]),
    ("positions permuted", E[:, [1, 0, 3, 2, 4]], ["permutation", "'posn'", "[1, 0, 3, 2, 4]"]),
    ("two positions swapped", E[:, [0, 1, 4, 3, 2]], ["positions 2 and 4 along 'posn' swapped"]),
    ("positions reversed", E.flip(1), ["reversed along 'posn'"]),
    ("position 0 repeated", E[:, :1].expand_as(E), ["expected position 0", "repeated"]),
    (
        "only position 0 wrong",
        torch.cat([E[:, :1] + 1, E[:, 1:]], 1),
        ["Only position 0 along 'posn' differs", "positions 1..4 are right", "plus 1"],
    ),
    (
        "all but the first position scaled",
        torch.cat([E[:, :1], 2 * E[:, 1:]], 1),
        ["positions 1..4 along 'posn' differ", "position 0 is right", "times 2"],
    ),
    (
        "the last positions never written",
        torch.cat([E[:, :3], torch.zeros(2, 2, 8)], 1),
        ["positions 3..4", "zeros", "never written"],
    ),
    (
        "signs flipped in one row",
        torch.stack([E[0], -E[1]]),
        ["Only row 1 along 'batch'", "signs are flipped"],
    ),
    ("all zeros", torch.zeros_like(E), ["all zeros"]),
    ("a NaN", nan_at(E, (1, 2, 3), float("nan")), ["NaN", "(batch=1, posn=2, d_head=3)"]),
    ("an inf", nan_at(E, (0, 4, 0), float("inf")), ["inf", "(batch=0, posn=4, d_head=0)"]),
    ("rounded to bfloat16", E.bfloat16().float(), ["bfloat16 number"]),
    (
        "returned in bfloat16",
        E.bfloat16(),
        ["dtype is bfloat16 where float32", "right to bfloat16's rounding"],
    ),
    ("a None", None, ["returned None"]),
]


@pytest.mark.parametrize("name, got, words", CASES, ids=[c[0] for c in CASES])
def test_each_pattern_is_named(name, got, words):
    text = explain_difference(got, E, AXES)
    for word in words:
        assert word.lower() in text.lower(), f"{name}: {word!r} not in {text!r}"


def test_heads_in_one_group_are_named():
    x = randn(2, 4, 5, 3)
    got = x.clone()
    got[:, 2:4] *= 3
    text = explain_difference(got, x, ("batch", "head", "posn", "d_head"))
    assert "Only heads 2..3 along 'head' differ" in text and "key/value head" in text, text
    assert "times 3" in text, text


def test_a_transpose_of_square_axes_and_a_reshape_for_a_transpose():
    square = randn(3, 4, 4)
    text = explain_difference(square.transpose(1, 2), square, ("head", "query", "key"))
    assert "transposed" in text and "'query' and 'key'" in text, text
    x = randn(2, 5, 4, 3)  # batch posn head d_head; expected: heads first
    text = explain_difference(x.reshape(2, 4, 5, 3), x.transpose(1, 2), ("b", "head", "posn", "d"))
    assert "reshape or view where a transpose" in text, text


def test_axes_unnamed_are_numbered():
    text = explain_difference(torch.cat([E[:, :1], 2 * E[:, 1:]], 1), E)
    assert "along axis 1" in text, text


@pytest.mark.parametrize("seed", range(5))
def test_noise_is_not_given_a_pattern(seed):
    """Random differences as large as the values: no pattern is claimed, the largest are listed."""
    got = E + randn(*E.shape, seed=seed + 10)
    text = explain_difference(got, E, AXES)
    assert "no simple pattern" in text and "at (batch=" in text, text
    claimed = [p for p in PATTERNS if p in text.lower()]
    assert not claimed, f"noise described as {claimed}: {text}"


def test_a_few_scattered_differences_are_listed_not_patterned():
    got = E.clone()
    got[0, 1, 2] += 5.0
    got[1, 3, 6] -= 2.0
    text = explain_difference(got, E, AXES)
    assert "yours" in text and "(batch=0, posn=1, d_head=2)" in text, text
    assert "times" not in text and "plus" not in text.split(";")[0], text


def test_agreeing_tensors_get_no_explanation():
    assert explain_difference(E + 1e-6, E, AXES) == ""
    assert explain_difference(E.clone(), E) == ""
    ids = torch.tensor([3, 1, 2])
    assert explain_difference(ids, ids) == ""


def test_small_differences_are_not_called_rounding_when_large():
    got = E * (1 + 0.2 * randn(*E.shape, seed=3))
    text = explain_difference(got, E, AXES)
    assert "rounding" not in text and "times" not in text, text


def test_integer_outputs_and_lists():
    want = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    assert "one position late" in explain_difference(
        torch.tensor([[0, 5, 6, 7], [0, 1, 2, 3]]), want, ("row", "posn")
    )
    assert "not a tensor" in explain_difference([[5, 6, 7, 8], [1, 2, 3, 0]], want)


def test_it_never_raises():
    for got, expected in [
        ("text", E),
        (object(), E),
        (E, "text"),
        (torch.zeros(0), torch.zeros(0)),
        (torch.tensor(1.0), torch.tensor(2.0)),
        (E.to(torch.complex64), E),
        (torch.ones(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)),
        (torch.empty(2, 3, device="meta"), E),
    ]:
        assert isinstance(explain_difference(got, expected, AXES), str)


def test_a_large_tensor_is_explained_without_hanging():
    x = randn(4, 16, 128, 128)
    start = time.perf_counter()
    text = explain_difference(x + randn(*x.shape, seed=1), x)
    assert "no simple pattern" in text
    text = explain_difference(x * 0.5, x)
    assert "times 0.5" in text
    # A limit that catches a hang, not a speed (about 1 s on a busy 2-core machine): stretched
    # by COURSE_TIME_SCALE like every limit in the tests.
    assert time.perf_counter() - start < patient(30)


def test_assert_close_f32_says_how_the_tensors_differ_after_its_message():
    with pytest.raises(AssertionError) as failure:
        assert_close_f32(E * 0.125, E, "attention differs from HF's", axes=AXES)
    text = str(failure.value)
    assert text.startswith("attention differs from HF's") and "times 0.125" in text, text


def test_an_offset_the_size_of_the_bounds_is_not_called_a_constant():
    # A float16 residual left every logit about 3e-5 off: rounding, not a bias added.
    text = explain_difference(E - 2e-4, E, AXES, atol=1e-4, rtol=0.0)
    assert text and "constant" not in text and "bias" not in text, text
    assert "plus the same 0.3" in explain_difference(E + 0.3, E, AXES, atol=1e-4, rtol=0.0)
