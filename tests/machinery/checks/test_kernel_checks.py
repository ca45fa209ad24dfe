"""Chapter 10's given wrappers refuse bad arguments with a ValueError that names them, before
any kernel runs (the kernels are graded in tests/graded/test_10_kernels.py)."""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("chapter 10 needs Triton (Linux)", allow_module_level=True)

from solutions.kernels.fused_matmul import fused_matmul_sample  # noqa: E402
from solutions.kernels.gumbel import gumbel_sample  # noqa: E402
from solutions.kernels.inverse_transform import sample_from_probs  # noqa: E402
from solutions.kernels.rejection import rejection_sample  # noqa: E402
from solutions.kernels.row_softmax import softmax  # noqa: E402
from solutions.kernels.runtime import DEVICE  # noqa: E402
from solutions.kernels.top_k_top_p import top_k_top_p_sample  # noqa: E402

PROBS = torch.full((2, 8), 1 / 8, device=DEVICE)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: top_k_top_p_sample(PROBS, top_k=2, top_p=0.5), "top_k and top_p"),
        (lambda: top_k_top_p_sample(PROBS, top_k=-1), "top_k"),
        (lambda: top_k_top_p_sample(PROBS, top_p=1.5), "top_p"),
        (lambda: top_k_top_p_sample(PROBS, seed=-1), "seed"),
        (lambda: top_k_top_p_sample(PROBS[0]), "probs"),
        (lambda: sample_from_probs(PROBS, seed=2**31), "seed"),
        (lambda: sample_from_probs(PROBS.long()), "floating"),
        (lambda: gumbel_sample(PROBS, temperature=-1.0), "temperature"),
        (lambda: gumbel_sample(PROBS[:, :0]), "empty"),
        (lambda: softmax(PROBS[None]), "x"),
        (lambda: fused_matmul_sample(PROBS, PROBS.T.contiguous()), "W_U"),
        (lambda: fused_matmul_sample(PROBS, PROBS.double()), "dtype"),
        (
            lambda: rejection_sample(PROBS[:, None].expand(2, 2, 8), PROBS[:, None], PROBS[:, :1]),
            "draft_tokens",
        ),
    ],
)
def test_bad_arguments_fail_at_the_door(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("top_k,top_p", [(None, 0.9), (3, None), (None, None)])
def test_rows_with_nothing_to_sample_stop_before_their_first_round(top_k, top_p):
    # The wrapper refuses such rows (graded in test_10_kernels.py); here the kernel itself: a
    # row of zeros or NaN must not spin up to MAX_ROUNDS looking for a token that is not there.
    from solutions.kernels.top_k_top_p import MAX_ROUNDS, top_k_top_p_kernel

    probs = torch.full((4, 100), 0.01, device=DEVICE)
    probs[1] = 0.0
    probs[2] = float("nan")
    out = torch.empty(4, dtype=torch.int64, device=DEVICE)
    rounds = torch.empty(4, dtype=torch.int32, device=DEVICE)
    mode = 1 if top_k else 2 if top_p else 0
    top_k_top_p_kernel[(1,)](
        probs, out, rounds, 4, 100, top_k or 100, top_p or 1.0, 0,
        MODE=mode, MAX_ROUNDS=MAX_ROUNDS, BLOCK_B=4, BLOCK_V=128,
    )  # fmt: skip
    assert out[[1, 2]].tolist() == [-1, -1], "a row with nothing to sample keeps token -1"
    assert rounds[[1, 2]].tolist() == [0, 0], f"rounds {rounds.tolist()}: bad rows must not spin"
    assert bool((out[[0, 3]] >= 0).all()) and bool((rounds[[0, 3]] >= 1).all())


@pytest.mark.parametrize("temperature", [0.8, 1.0])
def test_the_fused_kernel_draws_what_the_gumbel_kernel_draws_from_the_product(temperature):
    # Chapter 10 says so: both add gumbel_noise's numbers at the same (row, column), so from the
    # same logits and seed they pick the same token (300 columns: three fused tiles under the
    # interpreter, the last partial; rows of one call, so rows differ in their noise too).
    g = torch.Generator().manual_seed(11)
    h = torch.randn(64, 32, generator=g)
    w = torch.randn(300, 32, generator=g) / 2
    fused = fused_matmul_sample(h.to(DEVICE), w.to(DEVICE), temperature, seed=21)
    plain = gumbel_sample((h @ w.T).to(DEVICE), temperature, seed=21)
    assert torch.equal(fused.cpu(), plain.cpu()), (fused != plain).nonzero()
    other = gumbel_sample((h @ w.T).to(DEVICE), temperature, seed=22)
    assert not torch.equal(fused.cpu(), other.cpu())  # the agreement is the noise's, not chance


@pytest.mark.parametrize("top_k", [1, 3, 10])
def test_the_graded_replay_of_dual_pivot_rounds_gives_the_kernels_tokens(top_k):
    # test_top_k_of_one_is_the_argmax names the swapped pivots by replaying the rounds in
    # PyTorch from the kernel's docstring (each round's uniform from tl.rand). Unswapped, the
    # replay must give the reference kernel's tokens, or its diagnosis would be a guess.
    from solutions.kernels.top_k_top_p import MAX_ROUNDS
    from tests.graded.test_10_kernels import _round_uniforms, top_k_rounds

    g = torch.Generator().manual_seed(79)
    probs = torch.rand(16, 100, generator=g).pow(8)
    probs /= probs.sum(dim=-1, keepdim=True)
    uniforms = torch.empty(16, 64, device=DEVICE)
    _round_uniforms[(1,)](uniforms, 16, 0, STRIDE=MAX_ROUNDS, ROUNDS=64, BLOCK=16)
    tokens = top_k_top_p_sample(probs.to(DEVICE), top_k=top_k, seed=0).cpu()
    replay = [top_k_rounds(probs[r], uniforms[r].cpu(), top_k, False) for r in range(16)]
    assert replay == tokens.tolist()
