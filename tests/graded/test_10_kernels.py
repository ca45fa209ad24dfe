"""Chapter 10: the Triton kernels, graded against exact probabilities and PyTorch.

Without a GPU the kernels run through Triton's interpreter (solutions/kernels/runtime.py sets
TRITON_INTERPRET=1 before Triton is imported), so the shapes here are small and every
statistical test draws its thousands of samples as the rows of ONE call. With CUDA the same
tests run the compiled kernels; the tests marked `gpu` add the sizes of a real vocabulary.

Ground truth: torch.softmax for the softmax; exact probabilities (chi-square,
`assert_samples_follow`, false failure ALPHA = 1e-5 per comparison, each test states its total)
for every sampler; the exact top-k / top-p sets built here from their definitions (chapter 3's
tie rule); for the fused kernel, hidden states and weights built from chosen logits, so that
softmax(h W^T / T) is known before the kernel runs; chapter 6's rejection-sampling checks
(tests/graded/_rejection.py) for the speculative kernel. Rows are made long enough to span
several blocks, with a length that is no multiple of any block size, so a prefix sum that
restarts at each block, a running maximum that forgets the block's offset, or a last block read
without its mask all fail.

The interpreter runs Python that a GPU compiler refuses (a `break`, a global that is not a
constexpr). So each exercise's last test compiles the learner's kernel for an H100 (sm_90), as a
GPU launch compiles it, in a child process (utils/kernel_compile.py): no GPU needed. It comes
last: a kernel that computes the wrong thing is told so first, by the tests that say what is
wrong, and the mutant runner stops at the first test a mutant fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

if importlib.util.find_spec("triton") is None:  # Triton is a Linux-only dependency
    pytest.skip("chapter 10 needs Triton (Linux)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from solutions.kernels import gumbel_sample as reference_gumbel_sample  # noqa: E402
from solutions.kernels import runtime  # noqa: E402  (sets the mode first)
from solutions.kernels.runtime import DEVICE, INTERPRET  # noqa: E402
from solutions.kernels.top_k_top_p import MAX_ROUNDS  # noqa: E402  (given: the notebook's too)
from tests.graded import _rejection as rejection  # noqa: E402
from tests.graded._explain import explain_difference  # noqa: E402
from tests.graded._gumbel import (  # noqa: E402
    TEMPERATURE_AFTER_NOISE,
    TEMPERATURE_MULTIPLIED,
    assert_follows_the_tempered_softmax,
    follows,
    greedy_rows,
    gumbel_logits,
)
from tests.graded._oracles import (  # noqa: E402
    crafted_logits,
    hf_kept,
    rounded_top_p_cases_here,
)
from tests.support import (  # noqa: E402
    ALPHA,
    PAIR_SHIFTS,
    assert_rows_independent,
    assert_samples_follow,
)
from utils.kernel_compile import COMPILE_BUDGET_S, assert_compiles_for_a_gpu  # noqa: E402

CHAPTER = "10_kernels"

N_ROWS = 20_000  # samples per distribution, drawn as the rows of one call
LONG_V = 2_500  # longer than any block the interpreter uses, and no multiple of a power of 2
LONG_ROWS = 2_000  # samples per distribution over LONG_V columns (the interpreter's time)


def gpu(test):
    """A test of real vocabulary sizes: compiled kernels only (the interpreter would take
    minutes)."""
    skip = pytest.mark.skipif(INTERPRET, reason="GPU only: real vocabulary sizes")
    return pytest.mark.gpu(skip(test))


@pytest.fixture(autouse=True)
def several_blocks_on_a_gpu_too(request, monkeypatch):
    """On a GPU the given wrappers' blocks hold 4,096 to 16,384 columns, so a row of LONG_V
    would fit in one, and a kernel that mishandles the second block (a sum not rescaled, a
    block's start forgotten, a prefix sum that restarts) would pass there. The tests of this
    file cap a GPU's blocks at the interpreter's 1,024 columns, so that a GPU walks the same
    blocks as the interpreter; the `gpu` tests keep the wrappers' own blocks."""
    if not INTERPRET and request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(runtime, "GPU_BLOCK_CAP", 1024)


def rows_of(vector: torch.Tensor, n: int) -> torch.Tensor:
    """n copies of a row, as the test's own contiguous batch on the kernels' device."""
    return vector.float().expand(n, -1).contiguous().to(DEVICE)


def tokens_of(out, n: int, what: str) -> torch.Tensor:
    """A kernel's output as int64 token ids on the CPU, after checking its shape and dtype."""
    assert isinstance(out, torch.Tensor), f"{what} must return a tensor, got {type(out)}"
    assert tuple(out.shape) == (n,), f"{what}: one token per row, shape ({n},), got {out.shape}"
    assert out.dtype == torch.int64, f"{what}: token ids are int64, got {out.dtype}"
    return out.cpu()


def assert_unchanged(t: torch.Tensor, before: torch.Tensor, who: str) -> None:
    assert torch.equal(t, before), (
        f"{who} wrote into its input: a kernel may only store to its output pointer(s). Check "
        "the pointer passed to tl.store."
    )


def assert_refuses_empty_rows(sampler, what: str, **kwargs) -> None:
    """Exact. Rows 1 (all zeros) and 2 (NaN: the softmax of a row of -inf logits) hold no token
    to draw. The kernel must leave them at -1, which the given wrapper turns into a ValueError
    naming them; rows 0 and 3 are ordinary."""
    probs = torch.full((4, LONG_V), 1.0 / LONG_V)
    probs[1] = 0.0
    probs[2] = float("nan")
    try:
        out = sampler(probs.to(DEVICE), **kwargs)
    except ValueError as error:
        assert "row(s) 1, 2 " in str(error), f"{what}: the error must name rows 1 and 2: {error}"
        return
    pytest.fail(
        f"{what} on rows of zeros (row 1) and of NaN (row 2) returned tokens "
        f"{out.cpu().tolist()}: such a row has no token to give. Leave it at -1 (a candidate "
        "column starts at -1 and only a probability > 0 replaces it; NaN > 0 is false), and "
        "the given wrapper refuses it with a ValueError."
    )


def spread_probs(seed: int, v: int = LONG_V) -> torch.Tensor:
    """A distribution over v tokens whose mass sits in every block of the row: twelve tokens
    carry 80% of it (a few near the start, the middle and the very end), the rest share 20%,
    and every tenth token has probability exactly 0."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(v, generator=g, dtype=torch.float64) + 0.5
    p[::10] = 0.0
    p = 0.2 * p / p.sum()
    heavy = torch.tensor([1, 2, 300, 511, 1023, 1024, 1025, 1300, 2047, 2049, v - 2, v - 1])
    p[heavy] = 0.8 * torch.softmax(torch.randn(12, generator=g, dtype=torch.float64), 0)
    return p / p.sum()


def column_in_block(got: torch.Tensor, expected: torch.Tensor) -> int | None:
    """The block size b for which `got` is each expected column's index within its block of b
    columns (the block's start forgotten), or None."""
    for b in block_sizes(int(expected.max()) + 1):  # a block of one column says nothing
        if 1 < b <= int(expected.max()) and torch.equal(got, expected % b):
            return b
    return None


# --------------------------------------------------------------------------- softmax_kernel


def block_sizes(v: int) -> list[int]:
    """The blocks a wrapper may walk a row of v columns in, largest first: powers of 2 up to the
    next one at or above v (the wrapper takes that one, or a smaller cap)."""
    top = 1 if v <= 1 else 1 << (v - 1).bit_length()
    return [1 << k for k in range(top.bit_length() - 1, -1, -1)]


def blockwise_softmax(window: torch.Tensor, x: torch.Tensor, block: int, rescale="yes"):
    """exp(x - m) / s, with the max m and the sum s taken over `window` (float64) block by
    block, as a kernel's first pass takes them. `rescale` says what happens to the sum so far
    when a block raises the max from m to m_new: "yes", times exp(m - m_new); "no", nothing;
    "inverted", times exp(m_new - m)."""
    m = torch.full(window.shape[:1], float("-inf"), dtype=torch.float64)
    s = torch.zeros(window.shape[:1], dtype=torch.float64)
    for start in range(0, window.shape[1], block):
        part = window[:, start : start + block]
        m_new = torch.maximum(m, part.amax(dim=1))
        shift = torch.where(m_new == float("-inf"), 0.0, m_new)
        factor = {"yes": (m - shift).exp(), "no": 1.0, "inverted": (shift - m).exp()}[rescale]
        s = s * factor + (part - shift[:, None]).exp().sum(dim=1)
        m = m_new
    return (x - m[:, None]).exp() / s[:, None]


def softmax_mistake(x: torch.Tensor, got: torch.Tensor, row: int) -> str | None:
    """The known mistake that gives `got` for `x`, in a tutor's words (about `row` where it
    quotes one), or None. Each mistake is modelled here from the definition, in float64, for
    every block size a wrapper could use."""
    x, got = x.double().cpu(), got.double().cpu()
    n, v = x.shape

    def gives(model: torch.Tensor, rows=slice(None)) -> bool:
        return torch.allclose(got[rows], model[rows], atol=1e-6, rtol=1e-3, equal_nan=True)

    m = x.amax(dim=1, keepdim=True)
    low = m[:, 0] < -120  # exp(x) is 0 in float32 in these rows, and in their sum
    fine = torch.softmax(x, dim=-1)
    if (
        low.any()
        and bool((got[low].nan_to_num(0.0) == 0).all())
        and torch.allclose(got[~low], fine[~low], atol=1e-6, rtol=1e-3)
    ):
        r = int(low.nonzero()[0])
        return (
            f"row {r}, whose logits are all far below 0 (its largest is {float(m[r]):.1f}), "
            f"came out as {float(got[r, 0]):g} everywhere, while the other rows are right: the "
            "max subtracted there was 0, not the row's max. Is your running max still 0? A "
            "running max that starts at 0 is never raised by a negative logit, so it stays 0 and "
            "exp(x - 0) underflows to 0 in float32. It must start at -inf, below every logit."
        )
    if gives(torch.softmax(x, dim=-1) * m.exp()):
        return (
            "each value is the softmax times exp(the row's max): the pass that writes did not "
            "subtract the max. Write exp(x - m) / s, with the max m that the sum s was taken "
            "relative to (exp(x) alone also overflows on large logits)."
        )
    if gives(blockwise_softmax(x, x, v, rescale="inverted")):  # NaN in every row, at any block
        return (
            f"every row is NaN, even row {row}, whose logits are ordinary numbers: the first "
            "pass's sum turns NaN at the row's first block. There the running max is still -inf "
            "and the sum 0, and your factor that rescales the sum is inverted: exp(new max - old "
            "max) is exp(+inf) = inf there, and 0 x inf is NaN (on later blocks it would grow "
            "the sum instead of shrinking it). When the max rises from m to m_new, the terms "
            "summed so far are relative to the old max and must shrink: the factor is exp(old "
            "max - new max), at most 1, and 0 at the first block."
        )
    sums = got.sum(dim=1)
    for b in block_sizes(v):
        width = -(-v // b) * b  # the columns the blocks cover
        pad = width - v
        zeros = torch.cat([x, torch.zeros(n, pad, dtype=torch.float64)], dim=1)
        lanes, were = (f"{pad} masked lanes", "were") if pad > 1 else ("1 masked lane", "was")
        if pad and gives(blockwise_softmax(zeros, x, b)):
            where = (
                f"A row of {v} columns is shorter than its block of {b}: the {lanes} past its end"
                if v < b
                else f"A row of {v} columns ends in a partial block: the {lanes} past its end"
            )
            return (
                f"{where} {were} loaded as 0.0 (other=0.0), so 0 entered the max and "
                f"exp(0 - max) the sum: row {row} sums to {float(sums[row]):.4g}, not 1. Load the "
                "masked lanes with other=-inf: exp(-inf - max) = 0 adds nothing to the sum, and "
                "-inf never wins the max."
            )
        flat = x.flatten()
        inside = [r for r in range(n) if r * v + width <= n * v]  # the last row reads past x
        if pad and inside:
            reads = torch.stack([flat[r * v : r * v + width] for r in inside])
            if gives(blockwise_softmax(reads, x[inside], b), inside) and not gives(
                torch.softmax(x, dim=-1), inside
            ):
                return (
                    f"the max and the sum of a row of {v} columns include what lies past its "
                    f"end (in blocks of {b}: {pad} more columns), the start of the next row. A "
                    "load without the "
                    "column mask (cols < n_cols) reads past the row: every load of the row "
                    "needs it, with other=-inf for the masked lanes."
                )
        if width > b and gives(blockwise_softmax(x, x, b, rescale="no")):
            return (
                f"a row of {v} columns in blocks of {b}: your running sum was not rescaled when "
                "a later block raised the max, so each block's terms are relative to a "
                "different max. When the max grows from m to m_new, multiply the sum so far by "
                "exp(m - m_new) before adding the block's terms."
            )
        if v > b and gives(blockwise_softmax(x[:, :b], x, b)):
            return (
                f"your max and sum cover only the first block ({b} of the row's {v} columns): "
                "the first pass must loop over every block of the row, as the second does."
            )
    return None


@pytest.mark.softmax_kernel
@pytest.mark.parametrize("v", [1, 7, 1000, LONG_V])
def test_softmax_matches_torch(impl, v):
    g = torch.Generator().manual_seed(v)
    x = torch.randn(6, v, generator=g) * 3
    x[4] -= 200.0  # every logit far below 0: exp(x - 0) underflows to 0 in float32
    if v > 1:
        x[1, ::3] = float("-inf")  # masked tokens (never the whole row)
        x[2] += 1e4  # large logits: exp overflows unless the row's max is subtracted first
        x[3, -1] = 30.0  # the row's max in the last (partial) block
    x = x.to(DEVICE)
    before = x.clone()
    got = impl.softmax(x)
    assert_unchanged(x, before, "softmax")
    assert got.shape == x.shape and got.dtype == x.dtype, (
        f"softmax must return the input's shape {tuple(x.shape)} and dtype {x.dtype}, got "
        f"{tuple(got.shape)} and {got.dtype}"
    )
    expected = torch.softmax(x.double(), dim=-1).float()
    got = got.float()
    if got.isnan().any():
        row = int(got.isnan().any(dim=-1).nonzero()[0])
        pytest.fail(
            f"softmax returned NaN (row {row}, V = {v}): "
            + (
                softmax_mistake(x, got, row)
                or "for masked (-inf) logits, exp(-inf - max) is 0, but -inf - (-inf) is NaN. Is "
                "the running max still -inf when it is subtracted? Or did the row's maximum "
                "overflow exp (subtract the max before exponentiating)?"
            )
        )
    if torch.allclose(got, expected, atol=1e-6, rtol=1e-4):
        return
    errors = (got - expected).abs().amax(dim=-1)
    if float(torch.cat([errors[:4], errors[5:]]).max()) > 1e-4:
        errors[4] = 0.0  # quote a row with ordinary logits where one is wrong too
    worst = int(errors.argmax())
    error = float(errors[worst])
    mistake = softmax_mistake(x, got, worst)
    if mistake is None and v <= 1024:  # one block, on every device
        mistake = (
            f"a row of {v} columns fits in one block: load it with the column mask and "
            "other=-inf (the masked lanes past the row's end must add nothing to the max or the "
            "sum), subtract the row's max before exp, and divide by the sum."
        )
    elif mistake is None:
        mistake = (
            "a row longer than one block needs the max and the sum of EVERY block (a running "
            "max, and the sum rescaled when the max grows); the last block is partial: load it "
            "with the column mask and other=-inf."
        )
    pytest.fail(
        f"softmax differs from torch.softmax (row {worst}, V = {v}, largest error "
        f"{error:.3g}): {mistake}"
    )


@pytest.mark.softmax_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softmax_keeps_the_dtype_and_computes_in_float32(impl, dtype):
    x = (torch.randn(4, 1000, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    got = impl.softmax(x.to(DEVICE))
    assert got.dtype == dtype, f"softmax of {dtype} must return {dtype}, got {got.dtype}"
    expected = torch.softmax(x.float(), dim=-1)
    assert torch.allclose(got.float().cpu(), expected, atol=2e-3, rtol=1e-2), (
        f"softmax of a {dtype} row: largest error "
        f"{float((got.float().cpu() - expected).abs().max()):.3g}. "
        f"{explain_difference(got.float().cpu(), expected, ('row', 'column'), 2e-3, 1e-2)} "
        "Convert the loaded block to "
        "float32 (`.to(tl.float32)`) before exp and sum; store in the output's dtype."
    )


@pytest.mark.softmax_kernel
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_softmax_kernel_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.softmax_kernel, "softmax_kernel")


# --------------------------------------------------------------------------- gumbel_kernel


def gumbel_draw(impl, logits: torch.Tensor, n: int, temperature, seed: int) -> torch.Tensor:
    batch = rows_of(logits, n)
    before = batch.clone()
    out = impl.gumbel_sample(batch, temperature, seed)
    assert_unchanged(batch, before, "gumbel_sample")
    return tokens_of(out, n, "gumbel_sample")


@pytest.mark.gumbel_kernel
@pytest.mark.parametrize("temperature", [1e-3, 0.0])
def test_gumbel_kernel_near_zero_temperature_is_argmax(impl, temperature):
    # Exact: each row's best logit leads by 0.1, 100 after dividing by 1e-3.
    logits = greedy_rows()
    wide = torch.full((logits.shape[0], LONG_V), -50.0)
    wide[:, 1500 : 1500 + logits.shape[1]] = logits  # the winner in a later block of the row
    expected = wide.argmax(dim=-1)
    got = tokens_of(
        impl.gumbel_sample(wide.to(DEVICE), temperature, 5), wide.shape[0], "gumbel_sample"
    )
    if torch.equal(got, expected):
        return
    told = (
        f"at temperature {temperature} every row's best token must win: expected "
        f"{expected.tolist()}, got {got.tolist()}."
    )
    block = column_in_block(got, expected)
    if block:
        pytest.fail(
            f"{told} Your tokens are the winners' index within their block of {block} "
            "columns: the column of a block's best is the block's start plus its index in the "
            "block (tl.argmax gives the index in the block)."
        )
    if temperature == 0:
        pytest.fail(
            f"{told} Temperature 0 means no noise: take the plain argmax of the logits (a "
            "constexpr branch). Multiplying by inv_temperature = 0 instead leaves scores "
            "x * 0 + G, pure noise: a random token."
        )
    # The same noise replayed (the given gumbel_noise, through the reference kernel at T = 1):
    # the tokens of argmax(x * T + G), logits multiplied by T instead of divided.
    times = reference_gumbel_sample((wide * temperature).to(DEVICE), 1.0, 5).cpu()
    if torch.equal(got, times):
        pytest.fail(
            f"{told} Your tokens are argmax(x * T + G) with the kernel's own noise: the logits "
            "were multiplied by the temperature, not divided by it. inv_temperature is 1 / T "
            "already, so dividing by it multiplies by T, and at T = 0.001 the noise outweighs "
            "logits shrunk a thousandfold. Multiply the logits by inv_temperature, then add "
            "the noise."
        )
    pytest.fail(
        f"{told} Each row's best logit leads by 0.1, {0.1 / temperature:g} once divided by "
        "T: more than the noise can make up. Is the noise added before dividing, "
        "argmax((x + G) / T)? Dividing every score by the same T cannot change that argmax: it "
        "samples at T = 1. Scale the logits first, then add the noise to them."
    )


@pytest.mark.gumbel_kernel
def test_gumbel_kernel_ties_at_zero_temperature_go_to_the_first_column(impl):
    # Exact. Tied best logits in different blocks, in one block, and at both ends of the row:
    # torch.argmax's rule, the lowest column.
    x = torch.randn(4, LONG_V, generator=torch.Generator().manual_seed(64))
    ties = [[3, 1500], [1025, 1030, 2400], [0, LONG_V - 1], [700, 1800, 2450]]
    for row, cols in enumerate(ties):
        x[row, cols] = 10.0
    expected = x.argmax(dim=-1)
    got = tokens_of(impl.gumbel_sample(x.to(DEVICE), 0.0, 0), 4, "gumbel_sample")
    assert torch.equal(got, expected), (
        f"at temperature 0, tied best logits must go to the lowest column (torch.argmax's "
        f"rule): expected {expected.tolist()}, got {got.tolist()}. A later block may replace "
        "the best so far only when it is STRICTLY better (`>`, not `>=`)."
    )


@pytest.mark.gumbel_kernel
@pytest.mark.parametrize("temperature", [0.0, 1e-3])
def test_gumbel_kernel_on_rows_whose_scores_are_all_negative(impl, temperature):
    # Exact. Every logit lies in [-30, -1] except each row's best, -0.5 (ahead by 0.5 or more,
    # 500 once divided by 1e-3: more than the noise can make up), so every score is negative,
    # noisy or not; the best sits in the first, a middle and the last block.
    x = -1.0 - 29.0 * torch.rand(4, LONG_V, generator=torch.Generator().manual_seed(65))
    winners = [1100, 2100, 5, LONG_V - 1]
    x[torch.arange(4), torch.tensor(winners)] = -0.5
    got = tokens_of(impl.gumbel_sample(x.to(DEVICE), temperature, 3), 4, "gumbel_sample")
    if got.tolist() == winners:
        return
    told = (
        f"at temperature {temperature}, on rows whose every logit is negative, each row's best "
        f"token must win: expected {winners}, got {got.tolist()}."
    )
    if bool((got == 0).all()):
        pytest.fail(
            f"{told} Every row returned column 0, where the best column starts, and every score "
            "of these rows is below 0: is your running best still 0? A running best that starts "
            "at 0 is never beaten by a negative score, so no block ever replaces it. It must "
            "start at -inf, below every score a row can have."
        )
    block = column_in_block(got, torch.tensor(winners))
    assert block is None, (
        f"{told} Your tokens are the winners' index within their block of {block} columns: the "
        "column of a block's best is the block's start plus its index in the block."
    )
    pytest.fail(
        f"{told} The token is the column of the row's largest score: keep a running best and "
        "its column, and let a block replace them only where its own best is larger."
    )


@pytest.mark.gumbel_kernel
def test_gumbel_kernel_rows_are_independent_and_seeded(impl):
    # False failure: 2 * ALPHA (each row alone, then the pairs); (sum p^2)^200 < 1e-30 for two
    # seeds agreeing.
    logits = torch.tensor([0.0, 0.4, -0.3])
    probs = logits.double().softmax(-1)
    samples = gumbel_draw(impl, logits, N_ROWS, 1.0, seed=3)
    same = float((samples[0::2] == samples[1::2]).double().mean())
    assert same < 0.9, (  # independent rows agree with probability sum p^2 = 0.35
        f"gumbel_sample: neighbouring rows drew the same token {same:.0%} of the time: every row "
        "gets the same noise. Each row needs its own: gumbel_noise with the program's `rows`"
    )
    assert_samples_follow(
        samples,
        probs,
        "gumbel_sample: each row's token must follow softmax(logits). Is the noise ADDED to the "
        "logits (times inv_temperature): argmax(x / T + G)?",
    )
    pairs = samples[0::2] * 3 + samples[1::2]  # the tokens of rows 2i and 2i + 1, jointly
    assert_samples_follow(
        pairs,
        torch.outer(probs, probs).flatten(),
        "gumbel_sample: the tokens of neighbouring rows must be independent. Does each row get "
        "its own noise (gumbel_noise with the program's `rows`, not one row's for all)?",
    )
    again = gumbel_draw(impl, logits, 200, 1.0, seed=3)
    other = gumbel_draw(impl, logits, 200, 1.0, seed=4)
    assert torch.equal(again, samples[:200]), (
        "the same seed must give the same tokens: the noise must come from gumbel_noise(seed, ...)"
    )
    assert not torch.equal(again, other), "different seeds must give different tokens"


@pytest.mark.gumbel_kernel
@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_gumbel_kernel_follows_the_tempered_softmax(impl, temperature):
    # False failure: ALPHA per temperature. (logits + G) / T samples at T = 1: the message
    # names the bug.
    logits = gumbel_logits(60)
    samples = gumbel_draw(impl, logits, N_ROWS, temperature, seed=1)
    assert_follows_the_tempered_softmax(samples, logits, temperature)


@pytest.mark.gumbel_kernel
def test_gumbel_kernel_on_rows_of_many_blocks(impl):
    # False failure: ALPHA. The mass sits in every block: a maximum that forgets the block's
    # offset, or looks at the first block only, picks the wrong tokens.
    probs = spread_probs(61)
    logits = probs.log().float()  # -inf where the probability is 0
    samples = gumbel_draw(impl, logits, LONG_ROWS, 1.0, seed=2)
    assert_samples_follow(
        samples,
        probs,
        f"gumbel_sample over {LONG_V} tokens (several blocks): every column needs its own noise, "
        "so gumbel_noise takes the block's start (without it, columns c and c + BLOCK_V share "
        "their noise, and the less likely of the two is never drawn); and the argmax of the "
        "whole row is carried from block to block with the column of the block's best",
    )


@pytest.mark.gumbel_kernel
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_gumbel_kernel_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.gumbel_kernel, "gumbel_kernel")


# --------------------------------------------------------------------------- inverse_transform


def sample_probs(impl, probs: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    batch = rows_of(probs, n)
    before = batch.clone()
    out = impl.sample_from_probs(batch, seed)
    assert_unchanged(batch, before, "sample_from_probs")
    return tokens_of(out, n, "sample_from_probs")


def shared_uniform(samples: torch.Tensor, probs: torch.Tensor) -> str | None:
    """What the samples of identical rows show about their uniforms, in words, or None: every
    row the same token, or rows at one distance agreeing far more often than independent draws
    agree (sum p^2). Only words a failure: never decides one."""
    probs = probs.double() / probs.sum()
    samples = samples.flatten().cpu()
    if bool((samples == samples[0]).all()):
        token = int(samples[0])
        if token == int((probs > 0).nonzero().max()):
            return (
                f"every row returned token {token}, the last token of positive probability: "
                "the fallback for a u above every prefix sum, so no block was found to hold "
                "the crossing. A block holds it when the total of the blocks before it PLUS "
                "the block's own sum passes u; testing the total before the block alone finds "
                "it one block too late (and never in the row's last block)."
            )
        return (
            f"every row returned token {token}: all rows drew with the same uniform. "
            "tl.rand(seed, offsets) gives equal offsets equal numbers: each row's offset must "
            "be its own, its row index."
        )
    agree = float((probs**2).sum())  # how often two independent draws agree
    for shift in PAIR_SHIFTS:
        if 4 * shift > samples.numel():
            break
        rate = float((samples[:-shift] == samples[shift:]).double().mean())
        if rate > agree + 0.1:
            return (
                f"rows i and i + {shift} returned the same token {rate:.0%} of the time, where "
                f"independent draws agree {agree:.0%} of the time: they drew with the same "
                "uniform. tl.rand gives equal offsets equal numbers, so each row's offset must "
                "be its row index, which no other row of any program uses: offsets built from "
                "the program id without the rows per program overlap the next program's."
            )
    return None


def one_column_late(samples: torch.Tensor, probs: torch.Tensor) -> str | None:
    """Whether the samples follow the law of an exclusive prefix sum (the sum of the columns
    before c, without p_c): each possible column drawn with the probability of the possible
    column before it, the first never (the last also takes its own, through the fallback). In
    words, or None."""
    probs = probs.double().cpu() / probs.sum()
    possible = (probs > 0).nonzero().flatten()
    late = torch.zeros_like(probs)
    late[possible[1:]] = probs[possible[:-1]]
    late[possible[-1]] += probs[possible[-1]]
    if not follows(samples, late):
        return None
    return (
        f"your tokens come one possible column late: column {int(possible[0])} is never drawn, "
        f"and column {int(possible[1])} is drawn with the probability of column "
        f"{int(possible[0])}. Your prefix that decides column c is exclusive, the sum of the "
        "columns before c: it must include p_c itself (an inclusive prefix sum, which "
        "tl.cumsum gives), so that column c is chosen when u falls inside its own share."
    )


@contextlib.contextmanager
def shared_uniforms_named(samples: torch.Tensor, probs: torch.Tensor, what: str):
    """Re-raise a failed check with what `shared_uniform` or `one_column_late` sees in the
    samples, if anything."""
    try:
        yield
    except AssertionError as err:
        mistake = shared_uniform(samples, probs) or one_column_late(samples, probs)
        if mistake is None:
            raise
        raise AssertionError(f"{what}: {mistake}\n{err}") from None


@triton.jit
def _row_uniforms(out_ptr, n, seed, BLOCK: tl.constexpr):
    """out[r] = tl.rand(seed, r), the uniform the inverse-transform kernel's docstring gives row
    r: the tests build rows whose prefix sums reach it exactly, or cross it in a chosen block."""
    rows = tl.arange(0, BLOCK)
    tl.store(out_ptr + rows, tl.rand(seed, rows), mask=rows < n)


@pytest.mark.inverse_transform
def test_inverse_transform_finds_the_only_possible_token(impl):
    # Exact: one-hot rows, the token at block edges, the first and the last column.
    columns = [0, 1, 511, 512, 1023, 1024, 1025, 2047, 2048, LONG_V - 2, LONG_V - 1]
    probs = torch.zeros(len(columns), LONG_V)
    probs[torch.arange(len(columns)), torch.tensor(columns)] = 1.0
    got = tokens_of(impl.sample_from_probs(probs.to(DEVICE), 9), len(columns), "sample_from_probs")
    told = (
        f"rows with all their mass on one token must return it: expected {columns}, got "
        f"{got.tolist()}."
    )
    block = column_in_block(got, torch.tensor(columns))
    assert block is None, (
        f"{told} Your tokens are their index within their block of {block} columns: a "
        "column is the block's start plus its index in the block."
    )
    assert got.tolist() == columns, (
        f"{told} The token is the first column whose inclusive prefix sum exceeds u; its "
        "column is the block's start plus its index in the block."
    )


@pytest.mark.inverse_transform
def test_inverse_transform_follows_the_probabilities(impl):
    # False failure: ALPHA.
    probs = crafted_logits(70).double().softmax(-1)
    probs[[0, 5, 23]] = 0.0  # zeros at both ends and inside
    probs /= probs.sum()
    samples = sample_probs(impl, probs, N_ROWS, seed=1)
    with shared_uniforms_named(samples, probs, "sample_from_probs"):
        assert_samples_follow(samples, probs, "sample_from_probs")


@pytest.mark.inverse_transform
def test_inverse_transform_never_returns_an_impossible_token(impl):
    # Exact. The rows sum to 1 - 1e-3 (rounding, exaggerated): about 20 of the 20,000 uniforms
    # exceed every prefix sum. Then the last possible token (column 5) must come out, never a
    # column of probability 0 and never an index outside the row.
    probs = torch.zeros(64)
    probs[:6] = torch.tensor([0.3, 0.2, 0.2, 0.1, 0.1, 0.099])
    try:
        samples = sample_probs(impl, probs, N_ROWS, seed=3)
    except RuntimeError as error:
        pytest.fail(
            "sample_from_probs on rows that sum to 0.999 (rounding, exaggerated): about one "
            "uniform in a thousand lies above every prefix sum, so no column crosses it. Such a "
            "row has positive probabilities and must get a token, not -1: when rounding leaves "
            "u above every prefix sum, return the last token of positive probability. The "
            f"wrapper said: {error}"
        )
    outside = (samples < 0) | (samples >= 64)
    assert not outside.any(), (
        f"sample_from_probs returned {int(samples[outside][0])}, not a column of the row: when "
        "rounding leaves u above every prefix sum, return the last token of positive probability"
    )
    impossible = probs[samples] == 0
    assert not impossible.any(), (
        f"sample_from_probs returned token {int(samples[impossible][0])}, of probability 0. When "
        "rounding leaves u above every prefix sum (rows that sum to a little under 1), the answer "
        "is the last token of positive probability, not the last column."
    )


@pytest.mark.inverse_transform
def test_inverse_transform_refuses_rows_with_nothing_to_sample(impl):
    assert_refuses_empty_rows(impl.sample_from_probs, "sample_from_probs", seed=0)


@pytest.mark.inverse_transform
def test_inverse_transform_rows_are_independent(impl):
    # False failure: ALPHA. Every row is the same distribution: the tokens of any two rows must
    # be independent draws (each row its own uniform).
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    samples = sample_probs(impl, probs, N_ROWS, seed=4)
    with shared_uniforms_named(samples, probs, "sample_from_probs"):
        assert_rows_independent(samples, probs, "sample_from_probs")


@pytest.mark.inverse_transform
def test_inverse_transform_keeps_the_first_crossing(impl):
    # Exact. Every row holds 0.3 at column 1 (the first block), 0.3 at column 1500 (the second)
    # and 0.4 at column LONG_V - 2 (the last), and u_r = tl.rand(seed, r) is each row's own
    # uniform: the token is 1, 1500 or LONG_V - 2 as u_r lies below 0.3, 0.6 or 1. Once a row's
    # prefix has passed u it stays above it, so every later block "crosses" u too; the rows of
    # one program cross in different blocks, so those blocks are scanned.
    n, seed, heavy = 64, 6, [1, 1500, LONG_V - 2]
    u = torch.empty(n, device=DEVICE)
    _row_uniforms[(1,)](u, n, seed, BLOCK=n)
    probs = torch.zeros(LONG_V)
    probs[heavy] = torch.tensor([0.3, 0.3, 0.4])
    prefix = probs.cumsum(0)  # float32, added in the kernel's order: 0.3, 0.3 + 0.3, then + 0.4
    u = u.cpu()
    expected = ((prefix[None, :] > u[:, None]) & (probs > 0)).int().argmax(dim=1)
    got = sample_probs(impl, probs, n, seed)
    wrong = (got != expected).nonzero().flatten()
    if wrong.numel() == 0:
        return
    r = int(wrong[0])
    told = (
        f"rows holding 0.3 at column 1, 0.3 at column 1500 and 0.4 at column {LONG_V - 2} (three "
        f"blocks): row {r}, whose uniform is u = {float(u[r]):.4f}, must return column "
        f"{int(expected[r])}, the first whose prefix sum exceeds u; yours returned {int(got[r])}."
    )
    last = heavy[-1]  # the last column of positive probability
    for b in block_sizes(LONG_V)[1:]:  # blocks shorter than the row
        restarted = torch.cat([probs[i : i + b].cumsum(0) for i in range(0, LONG_V, b)])
        crossed = (restarted[None, :] > u[:, None]) & (probs > 0)
        model = torch.where(crossed.any(dim=1), crossed.int().argmax(dim=1), last)
        if torch.equal(got, model):
            pytest.fail(
                f"{told} Your tokens are what a prefix sum that restarts at each block of {b} "
                "columns gives: a block's prefix starts from 0 instead of the total of the "
                "blocks before it, so a later block crosses u too early (or not at all). Carry "
                "the total from block to block, and start each block's prefix from it."
            )
    if bool((got[wrong] == last).all()) and bool((expected[wrong] != last).all()):
        pytest.fail(
            f"{told} Every wrong token is column {last}, the last whose prefix exceeds u: a "
            "later block's crossing replaced the row's first crossing. Once the prefix has "
            "passed u it stays above it, so every block after the crossing has columns past u "
            "too. The first crossing must be kept: a later block may only give a token to a row "
            "that has none yet."
        )
    pytest.fail(
        f"{told} The token is the first column whose inclusive prefix sum (the total of the "
        "blocks before, plus the block's own running sum) exceeds u."
    )


@pytest.mark.inverse_transform
def test_inverse_transform_on_rows_of_many_blocks(impl):
    # False failure: ALPHA. A prefix sum that restarts at each block crosses u too early in
    # every block after the first.
    probs = spread_probs(71)
    samples = sample_probs(impl, probs, LONG_ROWS, seed=2)
    assert_samples_follow(
        samples,
        probs,
        f"sample_from_probs over {LONG_V} tokens (several blocks): the prefix sum must carry "
        "the total of the blocks before (a prefix that restarts at each block picks tokens "
        "too early)",
    )


@pytest.mark.inverse_transform
def test_inverse_transform_takes_the_first_prefix_that_exceeds_u(impl):
    # Exact. Row r is [u_r, 0, 1 - u_r, 0, ...] with u_r = tl.rand(seed, r), the row's own
    # uniform: its prefix sums are u_r, u_r, about 1. Only column 2's EXCEEDS u_r; column 0's
    # only reaches it, and column 1 has probability 0.
    n, seed = 64, 5
    u = torch.empty(n, device=DEVICE)
    _row_uniforms[(1,)](u, n, seed, BLOCK=n)
    probs = torch.zeros(n, 40, device=DEVICE)
    probs[:, 0], probs[:, 2] = u, 1.0 - u
    got = tokens_of(impl.sample_from_probs(probs, seed), n, "sample_from_probs")
    wrong = sorted(set(got[got != 2].tolist()))
    assert not wrong, (
        f"rows [u, 0, 1 - u, 0, ...], u each row's own uniform (tl.rand(seed, row)): the "
        f"prefix sums are u, u, 1, and only column 2's exceeds u; yours returned column(s) "
        f"{wrong}. A prefix that only reaches u (equal to it) does not cross it, and a column "
        "of probability 0 cannot be the first to cross."
    )


@pytest.mark.inverse_transform
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_inverse_transform_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.inverse_transform_kernel, "inverse_transform")


# --------------------------------------------------------------------------- one_pivot

PIVOT_LOGITS = torch.tensor([2.1, 0.3, 1.4, -0.8, 0.9, -1.6, 0.0, 1.7, -0.3, 0.5])
"""Ten distinct probabilities, none at a top-p boundary used below."""


def pivot_draws(impl, probs, top_p, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    before = probs.clone()
    out = [impl.top_p_one_pivot(probs, top_p, g) for _ in range(n)]
    assert torch.equal(probs, before), "top_p_one_pivot must not change probs"
    tokens = torch.tensor([int(t) for t, _ in out])
    rounds = torch.tensor([int(r) for _, r in out])
    return tokens, rounds


def exact_rounds(probs: torch.Tensor, top_p: float, most: int = 40) -> torch.Tensor:
    """P(rounds = r), r = 0..most, from the definition: draw j from p over {p > low}; keep j if
    the strictly more likely tokens hold less than top_p, else low = p_j and draw again."""
    p = probs.double()
    memo: dict[float, torch.Tensor] = {}

    def dist(low: float) -> torch.Tensor:
        if low not in memo:
            out = torch.zeros(most + 1, dtype=torch.float64)
            candidates = (p > low).nonzero()[:, 0].tolist()
            mass = float(p[p > low].sum())
            for j in candidates:
                w = float(p[j]) / mass
                if float(p[p > p[j]].sum()) < top_p:
                    out[1] += w
                else:
                    out[1:] += w * dist(float(p[j]))[:-1]
            memo[low] = out
        return memo[low]

    return dist(0.0)


@pytest.mark.one_pivot
@pytest.mark.parametrize("top_p", [0.6, 0.9])
def test_one_pivot_tokens_follow_the_top_p_set(impl, top_p):
    # False failure: 2 comparisons per case, at most 2 * ALPHA. The kept set is HF's.
    probs = PIVOT_LOGITS.softmax(-1)
    kept = hf_kept(TopPLogitsWarper(top_p=top_p), PIVOT_LOGITS[None])[0]
    tokens, rounds = pivot_draws(impl, probs, top_p, 4_000)
    assert int(rounds.min()) >= 1, (
        f"top_p={top_p}: a draw returned rounds = {int(rounds.min())}: every draw takes at "
        "least one round. Count each round as it starts, the one that returns included."
    )
    assert_samples_follow(
        tokens,
        probs * kept,
        f"top_p={top_p}: the token must follow p on the top-p set, renormalised. A draw is kept "
        "iff the tokens STRICTLY more likely hold LESS than top_p",
    )
    assert_samples_follow(
        rounds,
        exact_rounds(probs, top_p),
        f"top_p={top_p}: the number of rounds must follow its exact distribution. Does each "
        "round draw only among the tokens more likely than `low` (p > low), and does a "
        "rejected draw raise `low` to its own probability? Is `rounds` counted from 1?",
    )


@pytest.mark.one_pivot
def test_one_pivot_at_an_exact_boundary(impl):
    # False failure: ALPHA. 0.5 + 0.25 reach top_p 0.75 exactly (powers of two): token 2 (0.125)
    # has 0.75 above it and is out; only tokens 0 and 1 are kept.
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    tokens, _ = pivot_draws(impl, probs, 0.75, 2_000, seed=3)
    assert_samples_follow(
        tokens,
        torch.tensor([0.5, 0.25, 0.0, 0.0]),
        "top_p=0.75 on [0.5, 0.25, 0.125, 0.125]: the two most likely already hold 0.75, so "
        "token 2 is out (`<`, not `<=`)",
    )


@pytest.mark.one_pivot
def test_one_pivot_uses_the_generator(impl):
    probs = PIVOT_LOGITS.softmax(-1)
    runs = [pivot_draws(impl, probs, 0.6, 50, seed=s)[0] for s in (1, 1, 2)]
    torch.manual_seed(7)
    again = pivot_draws(impl, probs, 0.6, 50, seed=1)[0]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], again), (
        "the same generator must give the same tokens: draw with generator=generator"
    )
    assert not torch.equal(runs[0], runs[2]), "different seeds must give different tokens"


# --------------------------------------------------------------------------- top_k_top_p


def top_k_set(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Chapter 3's rule, from its definition: every token at least as likely as the k-th most
    likely (ties with it all kept)."""
    kth = probs.sort(descending=True).values[min(k, probs.numel()) - 1]
    return probs >= kth


def top_p_set(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Every token whose more likely tokens (strictly) hold less than top_p of the mass."""
    above = torch.tensor([float(probs[probs > x].sum()) for x in probs], dtype=torch.float64)
    margin = float((above - top_p).abs().min())
    assert margin > 1e-4, f"test set-up: a token's mass above is within {margin:g} of top_p"
    return above < top_p


def kept(probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = torch.where(mask, probs, torch.zeros_like(probs))
    return out / out.sum()


def filtered_draw(impl, probs, n, seed=0, **kwargs):
    batch = rows_of(probs, n)
    before = batch.clone()
    out = impl.top_k_top_p_sample(batch, seed=seed, **kwargs)
    assert_unchanged(batch, before, "top_k_top_p_sample")
    return tokens_of(out, n, "top_k_top_p_sample")


def crafted_probs(seed: int, v: int = 24) -> torch.Tensor:
    return crafted_logits(seed, v).double().softmax(-1)


@triton.jit
def _round_uniforms(
    out_ptr, n, seed, STRIDE: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr
):
    """out[r, i] = tl.rand(seed, r * STRIDE + i) for i < ROUNDS: the uniform of round i of row r
    in the top-k / top-p kernel's docstring (STRIDE = MAX_ROUNDS)."""
    rows = tl.arange(0, BLOCK)[:, None]
    rounds = tl.arange(0, ROUNDS)[None, :]
    u = tl.rand(seed, rows * STRIDE + rounds)
    tl.store(out_ptr + rows * ROUNDS + rounds, u, mask=(rows < n) & (rounds < ROUNDS))


def top_k_rounds(p: torch.Tensor, uniforms: torch.Tensor, k: int, swapped: bool) -> int:
    """The token dual-pivot top-k sampling returns for one row `p` (float32) with the uniforms
    of its rounds, replayed in float32 from the kernel's docstring; with `swapped`, the two
    pivots trade places (the midpoint decides whether the draw is kept). -1: no candidate."""
    low, high = torch.tensor(0.0), torch.tensor(1.0)
    mass = torch.tensor(1.0)  # the first round's candidates are the whole row
    j = -1
    for u in uniforms:
        q = torch.where(p > low, p, 0.0)
        crossed = ((q.cumsum(0) > u * mass) & (q > 0)).nonzero()
        candidates = (q > 0).nonzero()
        if candidates.numel() == 0:
            return -1
        j = int(crossed[0]) if crossed.numel() else int(candidates[-1])
        mid = (p[j] + high) * 0.5
        pivot0, pivot1 = (mid, p[j]) if swapped else (p[j], mid)
        if int((p > pivot0).sum()) < k:
            return j
        if int((p > pivot1).sum()) < k:
            low, high, mass = pivot0, pivot1, p[p > pivot0].sum()
        else:
            low, mass = pivot1, p[p > pivot1].sum()
    return j


@pytest.mark.top_k_top_p
def test_top_k_of_one_is_the_argmax(impl):
    # Exact, and cheap: a kernel that never accepts runs into its round cap on 16 rows only.
    g = torch.Generator().manual_seed(79)
    probs = torch.rand(16, 100, generator=g).pow(8)
    probs /= probs.sum(dim=-1, keepdim=True)
    try:
        out, rounds = impl.top_k_top_p_sample(probs.to(DEVICE), top_k=1, seed=0, return_rounds=True)
    except RuntimeError as error:
        pytest.fail(
            "top_k=1: a row with positive probabilities got no token (-1): its rounds removed "
            "every candidate, the most likely token too. Two ways to get there: the pivot "
            "counted among the tokens above it (count p > p_j, STRICTLY: with p >= p_j a "
            "token counts itself, so even the most likely one is rejected); or low raised past "
            "the kept set (low may rise to the second pivot only when the second pivot is "
            "rejected too: when it passes, the kept set lies above it). The wrapper said: "
            f"{error}"
        )
    got = tokens_of(out, 16, "top_k=1")
    expected = probs.argmax(dim=-1)
    wrong = got != expected
    if not wrong.any():
        return
    row = int(wrong.nonzero()[0])
    told = (
        f"top_k=1 keeps only each row's most likely token: expected {expected.tolist()}, got "
        f"{got.tolist()}."
    )
    n_rounds = 64
    uniforms = torch.empty(16, n_rounds, device=DEVICE)
    _round_uniforms[(1,)](uniforms, 16, 0, STRIDE=MAX_ROUNDS, ROUNDS=n_rounds, BLOCK=16)
    uniforms = uniforms.cpu()
    swapped = torch.tensor([top_k_rounds(probs[r], uniforms[r], 1, True) for r in range(16)])
    if int((swapped == got).sum()) >= 15:  # all but a rounding accident
        more = int((probs[row] > probs[row, got[row]]).sum())
        pytest.fail(
            f"{told} Your tokens are what the rounds give with the two pivots swapped: row "
            f"{row}'s token {int(got[row])}, with {more} tokens more likely, was kept because "
            "the midpoint between its probability and `high` passed the test. The draw j is "
            "kept or rejected by the first pivot, its own probability p_j; the second pivot, "
            "halfway from p_j to high, only decides how far the interval narrows when j is "
            "rejected (low up to the second pivot if it fails too, high down to it if it passes)."
        )
    bound = rounds_bound(probs[row].double(), top_k_set(probs[row].double(), 1))
    assert int(rounds[row]) <= bound, (
        f"{told} Row {row} took {int(rounds[row])} rounds, where dual-pivot sampling needs at "
        f"most {bound} here, and then returned a rejected token: rejected tokens came back. "
        "Each round must draw only among the candidates left (p > low), so that a rejection "
        "removes tokens for good."
    )
    pytest.fail(
        f"{told} A token is kept iff FEWER than k tokens are strictly more likely: count < k "
        "(not <= k, which keeps k + 1 tokens), counting p > p_j (not p >= p_j, which counts j "
        "itself)."
    )


@pytest.mark.top_k_top_p
@pytest.mark.parametrize("k", [10, 3, 1])  # the widest first: it kills most mutants
def test_top_k_follows_the_renormalised_top_k(impl, k):
    # False failure: ALPHA per k.
    probs = crafted_probs(80)
    samples = filtered_draw(impl, probs, N_ROWS, seed=k, top_k=k)
    assert_samples_follow(
        samples,
        kept(probs, top_k_set(probs, k)),
        f"top_k={k}: samples must follow p restricted to the {k} most likely tokens, "
        "renormalised. Each round draws among the candidates left (p > low) with its own "
        "uniform (a fresh one every round, at an offset no other round of any row uses), "
        "scaled by the candidates' mass, and that mass is updated when low rises",
    )


@pytest.mark.top_k_top_p
def test_top_k_keeps_every_token_tied_with_the_kth(impl):
    # False failure: ALPHA. Tokens 4, 9 and 17 tie for 3rd place: top_k=3 keeps all five.
    probs = torch.full((24,), 0.01, dtype=torch.float64)
    probs[[2, 11]] = torch.tensor([0.3, 0.2], dtype=torch.float64)
    probs[[4, 9, 17]] = 0.1
    probs /= probs.sum()
    samples = filtered_draw(impl, probs, N_ROWS, seed=1, top_k=3)
    assert_samples_follow(
        samples,
        kept(probs, top_k_set(probs, 3)),
        "top_k=3 with three tokens tied for third place: chapter 3 keeps every token tied with "
        "the k-th largest, so a token is kept iff fewer than k tokens are STRICTLY more likely",
    )


@pytest.mark.top_k_top_p
@pytest.mark.parametrize("top_p", [0.5, 0.85])
def test_top_p_follows_the_renormalised_nucleus(impl, top_p):
    # False failure: ALPHA per top_p. The token that crosses top_p carries real mass: a pivot
    # test that drops it (mass of tokens >= p_j instead of > p_j) never samples it.
    probs = crafted_probs(81)
    nucleus = top_p_set(probs, top_p)
    samples = filtered_draw(impl, probs, N_ROWS, seed=2, top_p=top_p)
    assert_samples_follow(
        samples,
        kept(probs, nucleus),
        f"top_p={top_p}: samples must follow p restricted to the smallest set of most likely "
        "tokens holding top_p of the mass, renormalised. The token that CROSSES top_p is in "
        "the set: token j is kept iff the tokens strictly more likely than j hold less than "
        "top_p.",
    )


@pytest.mark.top_k_top_p
@pytest.mark.parametrize(
    "case,kwargs",
    [("long-top-p", {"top_p": 0.7}), ("long-top-k", {"top_k": 7}), ("off", {})],
)
def test_top_k_top_p_on_rows_of_many_blocks(impl, case, kwargs):
    # False failure: ALPHA per case. "off" (neither filter) is plain sampling from p.
    probs = spread_probs(82)
    if "top_p" in kwargs:
        mask = top_p_set(probs, kwargs["top_p"])
    elif "top_k" in kwargs:
        mask = top_k_set(probs, kwargs["top_k"])
    else:
        mask = probs > 0
    samples = filtered_draw(impl, probs, LONG_ROWS, seed=3, **kwargs)
    assert_samples_follow(
        samples,
        kept(probs, mask),
        f"top_k_top_p_sample({kwargs}) over {LONG_V} tokens: the masses and counts above a "
        "pivot sum over every block of the row, the last one masked",
    )


@pytest.mark.top_k_top_p
@pytest.mark.parametrize("kwargs", [{"top_p": 0.9}, {"top_k": 3}])
def test_top_k_top_p_refuses_rows_with_nothing_to_sample(impl, kwargs):
    assert_refuses_empty_rows(impl.top_k_top_p_sample, f"top_k_top_p_sample({kwargs})", **kwargs)


@pytest.mark.top_k_top_p
@pytest.mark.parametrize("kwargs", [{"top_p": 0.75}, {"top_k": 3}])
def test_top_k_top_p_rows_are_independent(impl, kwargs):
    # False failure: ALPHA per case. Most rows need several rounds here (the likely tokens are
    # many and flat), so a row's later rounds must not reuse the uniforms of its neighbours'
    # first rounds: round i of row r draws with the offset r * MAX_ROUNDS + i, not r + i.
    probs = torch.tensor([0.2, 0.19, 0.18, 0.17, 0.16] + [0.1 / 20] * 20, dtype=torch.float64)
    probs /= probs.sum()
    mask = top_p_set(probs, kwargs["top_p"]) if "top_p" in kwargs else top_k_set(probs, 3)
    samples = filtered_draw(impl, probs, N_ROWS, seed=5, **kwargs)
    assert_rows_independent(
        samples,
        kept(probs, mask),
        f"top_k_top_p_sample({kwargs}): rows take several rounds here, and each round of each "
        "row needs a uniform of its own. With offset r + i, round i of row r is round i - 1 of "
        "row r + 1 (the offsets of rows overlap): give each row MAX_ROUNDS offsets of its own",
    )


@pytest.mark.top_k_top_p
def test_top_p_at_a_boundary_reached_exactly_or_through_rounding(impl):
    # False failure: ALPHA per case (11 cases, at most 1.1e-4). The kept set is HF's, checked
    # against exact float64 sums of the float32 probabilities: chapter 3's rule. The mass above
    # the first dropped token is exactly top_p (powers of two), or reaches it through rounding
    # (0.5 + 0.3 at 0.8: HF's own case). A kernel that keeps a token whose more likely tokens
    # hold exactly top_p (`<=` for `<`) samples that token.
    cases = rounded_top_p_cases_here() + [
        ([0.5, 0.25, 0.125, 0.125], 0.75),
        ([0.125, 0.5, 0.25, 0.0625, 0.0625], 0.875),
        ([0.5, 0.25, 0.25], 0.5),
    ]
    for probs, top_p in cases:
        logits = torch.tensor(probs).log()
        mask = hf_kept(TopPLogitsWarper(top_p=top_p), logits[None])[0]
        p = logits.softmax(-1)
        samples = filtered_draw(impl, p, 2_000, seed=7, top_p=top_p)
        assert_samples_follow(
            samples,
            kept(p.double(), mask),
            f"top_p={top_p} on probabilities {probs}: the {int(mask.sum())} most likely reach "
            f"top_p exactly, so only they are kept. A token is kept iff the tokens strictly "
            "more likely hold LESS than top_p (`<`, not `<=`), and the line counts as reached "
            "when the sum equals it",
        )


def rounds_bound(probs: torch.Tensor, mask: torch.Tensor) -> int:
    """Rounds after which dual-pivot sampling must have stopped: each round at least halves the
    interval (low, high] around the threshold, which starts inside (0, 1]; once it is shorter
    than the gap between the smallest kept probability and the largest dropped one, the next
    sample is kept."""
    dropped = probs[~mask & (probs > 0)]
    if dropped.numel() == 0:
        return 1
    gap = float(probs[mask].min() - dropped.max())
    return 2 + math.ceil(math.log2(1.0 / gap))


@pytest.mark.top_k_top_p
@pytest.mark.parametrize("shape", ["geometric", "flat", "crafted"])
def test_top_p_is_exact_in_a_bounded_number_of_rounds(impl, shape):
    # False failure: ALPHA per shape. Rounds: a bound from the halving argument, exact.
    if shape == "geometric":  # very skewed: p_i ~ 2^-i
        probs = 0.5 ** torch.arange(40, dtype=torch.float64)
        top_p = 0.995
    elif shape == "flat":  # every token tied: the nucleus is the whole row
        probs = torch.ones(1000, dtype=torch.float64)
        top_p = 0.5
    else:
        probs = crafted_probs(83, 200)
        top_p = 0.95
    probs /= probs.sum()
    mask = top_p_set(probs, top_p)
    batch = rows_of(probs, N_ROWS // 4)
    out, rounds = impl.top_k_top_p_sample(batch, top_p=top_p, seed=4, return_rounds=True)
    samples = tokens_of(out, batch.shape[0], "top_k_top_p_sample")
    assert_samples_follow(samples, kept(probs, mask), f"top_p={top_p} on a {shape} distribution")
    bound = rounds_bound(probs, mask)
    worst = int(rounds.max())
    assert int(rounds.min()) >= 1, (
        f"{shape} distribution: a row reports {int(rounds.min())} rounds, but every row draws "
        "at least once: a row whose first draw is kept took 1 round. Are your rounds counted "
        "from 0? Count them from 1: the round that keeps the token counts too."
    )
    assert worst <= bound, (
        f"{shape} distribution: rows took between {int(rounds.min())} and {worst} rounds; the "
        f"bound is {bound}. Each rejected round must move low up to the rejected pivot (or to "
        "the second pivot when it is rejected too) and high down to the second pivot when "
        "that one passes, so that high - low at least halves."
    )


@pytest.mark.top_k_top_p
def test_a_row_that_is_done_sits_out_the_later_rounds(impl):
    # Exact. top_k=1 on rows that alternate: a one-hot row, whose only token is kept in round
    # 1, and a row of 100 likely tokens, which takes several rounds. Rows share a program under
    # the interpreter (BLOCK_B > 1), so the program's loop runs on for the slow rows.
    g = torch.Generator().manual_seed(80)
    slow = torch.rand(100, generator=g).pow(8)
    rows = torch.stack([torch.eye(100)[7], slow / slow.sum()] * 8)
    out, rounds = impl.top_k_top_p_sample(rows.to(DEVICE), top_k=1, seed=0, return_rounds=True)
    got, rounds = tokens_of(out, 16, "top_k=1"), rounds.cpu()
    one_hot = torch.arange(16) % 2 == 0
    assert bool((got[one_hot] == 7).all()), (
        f"top_k=1 on one-hot rows (all their mass on token 7) returned {got[one_hot].tolist()}"
    )
    late = one_hot & (rounds != 1)
    assert not late.any(), (
        f"one-hot rows keep their token in round 1, but report {rounds[one_hot].tolist()} "
        "rounds: a row that is done went on drawing in the rounds that the program's other rows "
        "still needed. A row that is done sits out every later round (its token, its rounds and "
        "its interval stay as they are)."
    )


@pytest.mark.top_k_top_p
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_top_k_top_p_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.top_k_top_p_kernel, "top_k_top_p")


# --------------------------------------------------------------------------- fused_matmul


def hidden_and_weights(logits: torch.Tensor, d_model: int, seed: int):
    """h [n, D] and W [V, D] with h @ W.T = logits (n <= D): h is random, of full rank, and
    W = logits.T @ pinv(h.T), since pinv(h.T) @ h.T is the identity. Float64, then float32:
    the product then matches the chosen logits to about 1e-5."""
    n, _ = logits.shape
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d_model, generator=g, dtype=torch.float64)
    w = logits.double().T @ torch.linalg.pinv(h.T)
    assert torch.allclose(h @ w.T, logits.double(), atol=1e-8), "test set-up: h W^T != logits"
    return h.float(), w.float()


def fused_draw(impl, hidden, weights, temperature, seed):
    h, w = hidden.to(DEVICE), weights.to(DEVICE)
    before = (h.clone(), w.clone())
    out = impl.fused_matmul_sample(h, w, temperature, seed)
    assert_unchanged(h, before[0], "fused_matmul_sample")
    assert_unchanged(w, before[1], "fused_matmul_sample")
    return tokens_of(out, h.shape[0], "fused_matmul_sample")


def fused_argmax_mistake(h, w, got, rows) -> str | None:
    """Why the fused kernel picked `got` at temperature 0, in words, or None: the known mistakes
    are modelled here, each a different argmax (compared on `rows`, most of which must agree)."""
    logits = h.double() @ w.double().T
    expected = logits.argmax(dim=-1)

    def gives(model: torch.Tensor) -> bool:
        return float((got == model)[rows].double().mean()) >= 0.9

    for b in block_sizes(w.shape[0]):
        if b < w.shape[0] and gives(expected % b):
            return (
                f"Your picks are the winners' index within their vocabulary tile of {b} "
                "columns: the best of each tile is the tile's start plus its index in the tile."
            )
    d, v = h.shape[1], w.shape[0]
    for b in block_sizes(d):
        if b < d and gives((h[:, :b].double() @ w[:, :b].double().T).argmax(dim=-1)):
            return (
                f"Your picks are the argmax of the dot products over the first {b} dimensions "
                "only: accumulate each tile's dot products over all of D, block after block."
            )

    def strided(t: torch.Tensor, stride: int) -> torch.Tensor:
        """t's rows as a kernel reads them with a row stride of `stride` elements."""
        flat = t.double().flatten()
        return torch.stack([flat[r * stride : r * stride + d] for r in range(t.shape[0])])

    for b in block_sizes(d):
        if b < d and gives((strided(h, b) @ w.double().T).argmax(dim=-1)):
            return (
                f"Your picks are the argmax of the product with hidden read at a row stride of "
                f"{b} elements (BLOCK_D?), not d_model = {d}: row r of hidden then starts "
                f"inside row r - 1. Hidden is [batch, d_model], contiguous: each row starts "
                "d_model elements after the one before, whatever the block of D being read."
            )
        if b < d and gives((h.double() @ strided(w, b).T).argmax(dim=-1)):
            return (
                f"Your picks are the argmax of the product with W_U read at a row stride of "
                f"{b} elements (BLOCK_D?), not d_model = {d}: W_U is [d_vocab, d_model], "
                "contiguous, so the row of column c starts at c times d_model, whatever the "
                "block of D being read."
            )
    transposed = w.double().flatten().reshape(d, v).T  # W_U read as if [d_model, d_vocab]
    if gives((h.double() @ transposed.T).argmax(dim=-1)):
        return (
            "Your picks are the argmax of h times W_U read transposed, as if it were stored "
            f"[d_model, d_vocab] = [{d}, {v}]: the column of token c was read with a stride of "
            "d_vocab. W_U comes in HF's layout [d_vocab, d_model]: token c's d_model weights "
            "are one contiguous row, starting at c times d_model. Load a [BLOCK_V, BLOCK_D] "
            "block of those rows and transpose the block for the dot product."
        )
    return None


def fused_sampling_mistake(samples, logits: torch.Tensor, temperature: float) -> str | None:
    """Why the fused kernel's samples from one row of `logits` follow another law, in words, or
    None: the known mistakes are modelled here as the distributions they draw from."""
    logits = logits.double().cpu()
    v = logits.numel()
    for b in block_sizes(v)[1:]:  # vocabulary tiles narrower than the row
        tile_max = torch.stack([logits[i : i + b].max() for i in range(0, v, b)])
        tile = int(tile_max.argmax())  # the tile whose largest logit is largest (the first)
        inside = torch.zeros(v, dtype=torch.bool)
        inside[tile * b : (tile + 1) * b] = True
        probs = torch.where(inside, logits / temperature, float("-inf")).softmax(-1)
        if follows(samples, probs):
            return (
                f"every token came from columns {tile * b} to {min(v, (tile + 1) * b) - 1}, the "
                f"vocabulary tile (of {b} columns) that holds the largest logit, and inside it "
                "followed the softmax: each tile reported its largest raw logit, not its best "
                "noisy score. The reduction over the tiles picks the tile with the best score it "
                "is given, so each tile must store the score its own token won with (logit / T "
                "plus its noise): a tile without the largest logit still wins when its noise is "
                "larger."
            )
    return None


@pytest.mark.fused_matmul
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_zero_temperature_is_the_argmax_of_the_product(impl, dtype):
    # Exact on rows whose best logit leads the runner-up by at least 0.05 (bf16 products are
    # accumulated in float32; the margin keeps rounding from deciding).
    g = torch.Generator().manual_seed(92)
    h = torch.randn(40, 80, generator=g).to(dtype)  # d_model no multiple of a GPU's BLOCK_D
    w = (torch.randn(700, 80, generator=g) / 8).to(dtype)
    logits = h.double() @ w.double().T
    top2 = logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05
    assert clear.sum() >= 20, "test set-up: too few rows with a clear winner"
    got = fused_draw(impl, h, w, 0.0, seed=0)
    expected = logits.argmax(dim=-1)
    bad = clear & (got != expected)
    if bad.any():
        told = (
            f"temperature 0 ({dtype}): row {int(bad.nonzero()[0])} should pick "
            f"{int(expected[bad][0])}, the argmax of h W^T, and picked {int(got[bad][0])}."
        )
        mistake = fused_argmax_mistake(h, w, got, clear)
        if mistake is None and dtype != torch.float32:
            again = fused_draw(impl, h.float(), w.float(), 0.0, seed=0)
            if not (clear & (again != expected)).any():
                mistake = (
                    f"The same inputs in float32 give the argmax, so {dtype} is what goes "
                    "wrong: keep the accumulator and the scores in float32 up to the argmax, "
                    f"and do not cast them to {dtype} (rounded, close logits tie or swap; the "
                    "interpreter keeps bfloat16 values as raw 16-bit integers, so there an "
                    "argmax of bfloat16 scores compares bit patterns)."
                )
        pytest.fail(
            f"{told} "
            + (
                mistake
                or "Accumulate the tile's dot products over all of D in float32 and keep them "
                "in float32 up to the argmax; the best of each vocabulary tile must carry the "
                "tile's start."
            )
        )
    assert bool(((got >= 0) & (got < 700)).all()), (
        "a token outside the vocabulary: the last vocabulary tile must mask the rows of W_U "
        "beyond V (load them with other=0 and their scores with -inf)"
    )


@pytest.mark.fused_matmul
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_accumulates_in_float32(impl, dtype):
    # Exact. Logits 96 + d/256 for distinct d in [0, 256), every input exact in bfloat16 and
    # float16, every product and sum exact in float32: each row has one best token, ahead by
    # at least 1/256. Rounded to the input dtype before the argmax (near 96, float16 steps by
    # 1/16 and bfloat16 by 1/2), most rows tie and pick another token. (Under the interpreter,
    # bfloat16 tiles are upcast before tl.dot: a cast to the dtype of the loaded tile can hide
    # there, which is why float16 is tested too.)
    v, d_model, n = 200, 16, 32
    g = torch.Generator().manual_seed(97)
    w = torch.zeros(v, d_model)
    w[:, 0] = 96.0
    for j in range(1, d_model):
        w[:, j] = torch.randperm(256, generator=g)[:v].float() / 256
    h = torch.zeros(n, d_model)
    h[:, 0] = 1.0
    h[torch.arange(n), 1 + torch.arange(n) % (d_model - 1)] = 1.0
    expected = (h.double() @ w.double().T).argmax(dim=-1)
    got = fused_draw(impl, h.to(dtype), w.to(dtype), 0.0, seed=0)
    wrong = got != expected
    assert not wrong.any(), (
        f"{dtype} inputs at temperature 0: {int(wrong.sum())} of {n} rows picked the wrong "
        f"token (row {int(wrong.nonzero()[0])}: {int(got[wrong][0])} instead of "
        f"{int(expected[wrong][0])}, whose logit is larger by 1/256 or more). Keep the "
        "accumulator and the scores in float32 up to the argmax: cast back to the input dtype "
        "and near 96 every step is 1/16 (float16) or 1/2 (bfloat16)."
    )


@pytest.mark.fused_matmul
def test_fused_ties_at_zero_temperature_go_to_the_first_column(impl):
    # Exact: h is one-hot, so the logits are W's first column, tied at 2.0 in three tiles.
    v, d_model = 300, 16
    w = torch.zeros(v, d_model)
    w[:, 0] = torch.linspace(-1.0, 1.0, v)
    w[[10, 100, 250], 0] = 2.0
    h = torch.zeros(2, d_model)
    h[:, 0] = 1.0
    got = fused_draw(impl, h, w, 0.0, seed=0)
    assert got.tolist() == [10, 10], (
        f"tied best logits in three vocabulary tiles (columns 10, 100, 250) must go to the "
        f"lowest, as torch.argmax does: got {got.tolist()}"
    )


@pytest.mark.fused_matmul
def test_fused_is_seeded(impl):
    logits = torch.stack([crafted_logits(93, 300)] * 2)
    h, w = hidden_and_weights(logits, d_model=16, seed=94)
    h = h.repeat_interleave(100, dim=0)
    a = fused_draw(impl, h, w, 1.0, seed=7)
    b = fused_draw(impl, h, w, 1.0, seed=7)
    c = fused_draw(impl, h, w, 1.0, seed=8)
    assert torch.equal(a, b), "the same seed must give the same tokens"
    assert not torch.equal(a, c), "different seeds must give different tokens"


@pytest.mark.fused_matmul
def test_fused_rows_are_independent(impl):
    # False failure: ALPHA. 4,096 copies of one row over 200 tokens (four vocabulary tiles):
    # every (row, column) needs its own noise: the row and the tile's start reach gumbel_noise.
    logits = torch.full((200,), -8.0)
    logits[[3, 70, 71, 150]] = torch.tensor([0.5, 0.0, 0.3, -0.2])
    h, w = hidden_and_weights(logits[None], d_model=16, seed=96)
    samples = fused_draw(impl, h.expand(4_096, -1).contiguous(), w, 1.0, seed=6)
    probs = (h.double() @ w.double().T)[0].softmax(-1)
    outside = samples >= probs.numel()
    assert not outside.any(), (
        f"fused_matmul_sample returned token {int(samples[outside][0])} ({int(outside.sum())} "
        f"of {samples.numel()} rows), past the vocabulary of {probs.numel()}: the last "
        "vocabulary tile runs past V, and its columns there must score -inf (mask them), or "
        "their logit 0 plus noise wins."
    )
    try:
        assert_rows_independent(samples, probs, "fused_matmul_sample")
    except AssertionError as err:  # worded from what the samples show
        mistake = fused_sampling_mistake(samples, (h.double() @ w.double().T)[0], 1.0)
        if mistake is not None:
            raise AssertionError(f"fused_matmul_sample: {mistake}\n{err}") from None
        same = float((samples[1:] == samples[:-1]).double().mean())
        if same > 0.9:  # independent rows agree with probability sum p^2 < 0.3
            raise AssertionError(
                f"fused_matmul_sample: neighbouring rows drew the same token {same:.0%} of the "
                "time: the rows share the same noise. Each row needs its own: gumbel_noise "
                f"takes the program's rows.\n{err}"
            ) from None
        if follows(samples, probs):
            raise
        raise AssertionError(
            "fused_matmul_sample: the tokens do not follow softmax(h W^T) even one row at a "
            "time. The scores are h W^T / T + G: standard Gumbel noise G = -log(-log(U)) ADDED "
            f"to the scaled logits (subtracting it draws from another law).\n{err}"
        ) from None


@pytest.mark.fused_matmul
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_fused_samples_follow_the_softmax_of_the_product(impl, temperature):
    # False failure: ALPHA x 4 rows per temperature. Four chosen rows of logits over 300 tokens
    # (several vocabulary tiles, the last partial), each repeated 2,500 times.
    v = 300
    logits = torch.stack([crafted_logits(90 + i, v) for i in range(4)])
    logits[0, :50] = -30.0  # almost impossible tokens in the first tile
    h, w = hidden_and_weights(logits, d_model=32, seed=91)
    per = 2_500
    samples = fused_draw(impl, h.repeat_interleave(per, dim=0), w, temperature, seed=5)
    for i in range(4):
        rows = samples[i * per : (i + 1) * per]
        logits_i = h[i].double() @ w.double().T
        what = (
            f"fused_matmul_sample at temperature {temperature}, rows {i * per} to "
            f"{(i + 1) * per - 1} (one row of logits)"
        )
        try:
            assert_samples_follow(rows, (logits_i / temperature).softmax(-1), what)
        except AssertionError as err:  # worded from what the samples show (chapter 6's words)
            if temperature != 1 and follows(rows, logits_i.softmax(-1)):
                raise AssertionError(f"{what}: {TEMPERATURE_AFTER_NOISE}\n{err}") from None
            if temperature != 1 and follows(rows, (logits_i * temperature).softmax(-1)):
                raise AssertionError(f"{what}: {TEMPERATURE_MULTIPLIED}\n{err}") from None
            mistake = fused_sampling_mistake(rows, logits_i, temperature)
            if mistake is not None:
                raise AssertionError(f"{what}: {mistake}\n{err}") from None
            raise AssertionError(
                f"{what}: every (row, column) needs its own noise: gumbel_noise with the "
                "program's rows and the tile's start (without the tile's start, columns c and "
                "c + BLOCK_V share their noise, and the less likely of the two is never drawn). "
                "The scores are h W^T / T + G, G = -log(-log(U)) added: the argmax of those."
                f"\n{err}"
            ) from None


@pytest.mark.fused_matmul
def test_fused_draws_what_the_gumbel_kernel_draws_from_the_product(impl):
    # The section says so: both kernels add gumbel_noise's number at each (row, column), so on
    # the same product and seed they pick the same token; the reference Gumbel kernel (on the
    # given gumbel_noise) draws it here. 64 rows that differ, 300 columns (several tiles, the
    # last partial). On a GPU the product is summed in another order (and a kernel may round
    # it to TF32): a few near-ties may go the other way there, none under the interpreter.
    g = torch.Generator().manual_seed(11)
    h = torch.randn(64, 32, generator=g)
    w = torch.randn(300, 32, generator=g) / 2
    fused = fused_draw(impl, h, w, 1.0, seed=21)
    plain = tokens_of(reference_gumbel_sample((h @ w.T).to(DEVICE), 1.0, seed=21), 64, "gumbel")
    differ = (fused != plain).nonzero().flatten().tolist()
    assert len(differ) <= (0 if INTERPRET else 3), (
        f"fused_matmul_sample drew another token than the Gumbel kernel on the same product and "
        f"seed in rows {differ[:10]} of 64: both must add gumbel_noise's number at each (row, "
        "column). Does each row's noise start at its own place, its row times the vocabulary "
        "size (gumbel_noise's n_cols is d_vocab, not the tile's width)? With the tile's width, "
        "neighbouring rows share noise."
    )


@pytest.mark.fused_matmul
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_fused_matmul_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.fused_matmul_kernel, "fused_matmul")


# --------------------------------------------------------------------------- rejection_kernel
# Chapter 6's checks of `rejection_sample`, on the kernel (tests/graded/_rejection.py), after an
# exact check of its own: the decisions replayed from the generator name the classic mistakes.


@pytest.mark.rejection_kernel
def test_rejection_kernel_decides_draft_j_with_u_j(impl):
    # Exact. The given wrapper draws u = torch.rand(batch, k + 1) from the generator, and the
    # kernel's contract says u[r, j] decides draft j of row r: keep iff u[r, j] * q < p, while
    # every earlier draft of the row was kept. Replaying the generator gives every decision.
    k, n = 3, 512
    target, draft, tokens, _ = rejection.batch_for(k, seed=3)
    target, draft, tokens = target[:n], draft[:n], tokens[:n]
    _, accepted = rejection.call_batch(
        impl.rejection_sample, target, draft, tokens, 9, device=DEVICE
    )
    u = torch.rand(n, k + 1, generator=torch.Generator().manual_seed(9))
    p = target[:, :k].gather(-1, tokens[..., None])[..., 0]
    q = draft.gather(-1, tokens[..., None])[..., 0]
    # The target read with a row stride of k positions: draft j of row r sees position
    # r * k + j of the [n * (k + 1), V] target.
    strided = target.reshape(n * (k + 1), -1)[torch.arange(n)[:, None] * k + torch.arange(k)]
    p_strided = strided.gather(-1, tokens[..., None])[..., 0]
    expected = (u[:, :k] * q < p).long().cumprod(dim=1).bool()
    wrong = (accepted != expected).any(dim=1)
    if not wrong.any():
        return
    row = int(wrong.nonzero()[0])
    told = (
        f"row {row}: accepted {accepted[row].tolist()}, but its uniforms u[r, :k] = "
        f"{u[row, :k].tolist()} give {expected[row].tolist()}."
    )
    known = [
        (
            (u[:, :k] * p < q).long().cumprod(dim=1).bool(),
            "Your decisions are u * p < q: the acceptance ratio is upside down. Draft j is kept "
            "with probability min(1, p / q), p the target's probability of the draft and q the "
            "draft model's: keep it iff u < p / q, that is u * q < p.",
        ),
        (
            u[:, :k] * q < p,
            "Drafts after a rejection were kept: accepted is True up to the first rejection "
            "only. A draft after a rejected one was proposed after a token the main model did "
            "not take: it never counts, even if its own test passes.",
        ),
        (
            (u[:, :k] * q < p_strided).long().cumprod(dim=1).bool(),
            "Your decisions compare with the target's probabilities at the wrong positions: "
            "draft j of row r read the target at position r * k + j of the flattened "
            "[batch * (k + 1), d_vocab] tensor, a row stride of k positions. The target holds "
            "k + 1 positions per row (one per draft, then the bonus token's), so from row 1 on "
            "each row read its neighbour's positions. Its row stride is k + 1 positions of "
            "d_vocab probabilities each.",
        ),
        (
            (u[:, :1] * q < p).long().cumprod(dim=1).bool(),
            "Every draft of a row was decided with the row's first uniform, u[r, 0]: each draft "
            "needs its own uniform, u[r, j] for draft j.",
        ),
    ]
    for decisions, mistake in known:
        if torch.equal(accepted, decisions):
            pytest.fail(f"{told} {mistake}")
    pytest.fail(
        f"{told} Draft j of row r is decided by u[r, j], at u_ptr + r * (k + 1) + j: a row "
        "holds k + 1 uniforms (the last draws the main model's token), so rows must not overlap."
    )


@pytest.mark.rejection_kernel
def test_rejection_kernel_forced_outcomes_give_the_layout(impl):
    rejection.forced_outcomes_give_the_layout(impl.rejection_sample, DEVICE)


@pytest.mark.rejection_kernel
def test_rejection_kernel_a_residual_of_zero_mass_draws_from_the_target(impl):
    rejection.zero_residual_draws_from_the_target(impl.rejection_sample, DEVICE)


@pytest.mark.rejection_kernel
def test_rejection_kernel_greedy_keeps_the_argmax_run(impl):
    rejection.greedy_keeps_the_argmax_run(impl.rejection_sample, DEVICE)


@pytest.mark.rejection_kernel
def test_rejection_kernel_uses_the_generator(impl):
    rejection.batched_sampler_uses_the_generator(impl.rejection_sample, DEVICE)


@pytest.mark.rejection_kernel
@pytest.mark.parametrize("k", [2, 4])
def test_rejection_kernel_acceptance_and_recovered_tokens(impl, k):
    # Before the joint checks below: a recovered token drawn from the wrong distribution is
    # named here (max(0, p - q) renormalised), where the joint checks see only dependence.
    rejection.acceptance_and_recovered_tokens(impl.rejection_sample, k, DEVICE)


@pytest.mark.rejection_kernel
@pytest.mark.parametrize("k", [1, 3])
def test_rejection_kernel_every_position_follows_the_target(impl, k):
    rejection.every_position_follows_the_target(impl.rejection_sample, k, DEVICE)


@pytest.mark.rejection_kernel
def test_rejection_kernel_rows_and_positions_draw_independently(impl):
    rejection.draws_are_independent(impl.rejection_sample, DEVICE)


@pytest.mark.rejection_kernel
@pytest.mark.budget(COMPILE_BUDGET_S)
def test_rejection_kernel_compiles_for_a_gpu(impl):
    assert_compiles_for_a_gpu(impl.rejection_kernel, "rejection_kernel")


# --------------------------------------------------------------------------- GPU sizes


@gpu
@pytest.mark.top_k_top_p
def test_gpu_top_p_on_a_real_vocabulary(impl):
    # False failure: ALPHA. V = 128256 with the mass spread across the whole row.
    v = 128_256
    g = torch.Generator().manual_seed(95)
    logits = torch.randn(v, generator=g, dtype=torch.float64) * 2.5
    probs = logits.softmax(-1)
    samples = filtered_draw(impl, probs, 4_096, seed=6, top_p=0.9)
    order = probs.sort(descending=True)
    before = order.values.cumsum(0) - order.values
    mask = torch.zeros(v, dtype=torch.bool)
    mask[order.indices[before < 0.9]] = True
    assert_samples_follow(samples, kept(probs, mask), "top_p=0.9 over 128256 tokens", ALPHA)


@gpu
@pytest.mark.inverse_transform
def test_gpu_one_hot_rows_of_a_real_vocabulary(impl):
    v = 128_256
    columns = [0, 4095, 4096, 65_535, v - 1]
    probs = torch.zeros(len(columns), v)
    probs[torch.arange(len(columns)), torch.tensor(columns)] = 1.0
    got = tokens_of(impl.sample_from_probs(probs.to(DEVICE), 0), len(columns), "sample")
    assert got.tolist() == columns
