"""Chapter 6: the Gumbel-max trick and the three couplings, graded against exact probabilities.

- `gumbel_sample`: frequencies against softmax(logits / T) by a chi-square test
  (tests/support.py, false failure ALPHA per comparison); T -> 0 and T = 0 against the
  argmax; the generator, masked tokens, a batch of one row.
- `coupling`: the three probabilities against the test's own simulation (shared Gumbel noise,
  independent draws, a rejection sampler written here with torch), against the Gumbel integral
  computed numerically, and against exact values at the edges (p = q, disjoint supports, zeros).

Every function gets the caller's own tensors, never a copy, and each test checks afterwards that
they are unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.graded._explain import explain_difference
from tests.graded._gumbel import assert_follows_the_tempered_softmax, greedy_rows, gumbel_logits
from tests.graded._oracles import IN_PLACE, assert_untouched, draw
from tests.support import ALPHA

CHAPTER = "06_speculative"

# --------------------------------------------------------------------------- gumbel_sample


@pytest.mark.gumbel_sample
def test_gumbel_sample_follows_the_softmax(impl):
    # False failure for a correct implementation: ALPHA (1e-5). The default temperature is 1.
    logits = gumbel_logits(40)
    try:
        samples = draw(impl.gumbel_sample, logits, seed=0, who="gumbel_sample")
    except AssertionError as err:
        if "shape" not in str(err):
            raise
        raise AssertionError(
            f"{err}: one sample per row, so the argmax runs over the vocabulary, the last "
            "dimension (argmax(dim=-1)), never over the rows of the batch"
        ) from None
    assert_follows_the_tempered_softmax(samples, logits, 1.0)


@pytest.mark.gumbel_sample
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_gumbel_sample_divides_the_logits_by_the_temperature_before_the_noise(impl, temperature):
    # False failure for a correct implementation: ALPHA (1e-5) per temperature. The classic bug,
    # argmax((logits + G) / T), samples at temperature 1: the message then names it.
    logits = gumbel_logits(41)
    samples = draw(impl.gumbel_sample, logits, seed=1, who="gumbel_sample", temperature=temperature)
    assert_follows_the_tempered_softmax(samples, logits, temperature)


GENERATOR_ROWS = 200


@pytest.mark.gumbel_sample
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gumbel_sample_uses_the_generator(impl, temperature):
    """Two batches of GENERATOR_ROWS identical rows from generators seeded 7 must be equal; one
    from a generator seeded 8 must differ. A correct sampler gives two seeds identical draws
    with probability at most (sum_i p_i^2)^GENERATOR_ROWS, asserted below to be under 1e-12.
    Before that, a batch of ONE row must give one token, of shape [1]."""
    logits = gumbel_logits(42)
    probs = (logits.double() / temperature).softmax(-1)
    bound = float(probs.square().sum()) ** GENERATOR_ROWS
    assert bound < 1e-12, f"test set-up: false-failure bound {bound:g} too large"
    kwargs = {} if temperature == 1.0 else {"temperature": temperature}

    row, before = logits[None], logits[None].clone()
    one = impl.gumbel_sample(row, generator=torch.Generator().manual_seed(7), **kwargs)
    assert_untouched(row, before, "gumbel_sample", IN_PLACE)
    assert one.shape == (1,), (
        f"a batch of one row must give one token, shape (1,), got shape {tuple(one.shape)}: "
        "take the argmax over the last dimension (dim=-1), and do not squeeze"
    )
    assert 0 <= int(one) < logits.numel() and int(one) != 3, f"not a possible token: {one}"

    batch = logits.expand(GENERATOR_ROWS, -1).clone()  # the test's own batch, checked after
    a = impl.gumbel_sample(batch, generator=torch.Generator().manual_seed(7), **kwargs)
    b = impl.gumbel_sample(batch, generator=torch.Generator().manual_seed(7), **kwargs)
    c = impl.gumbel_sample(batch, generator=torch.Generator().manual_seed(8), **kwargs)
    assert_untouched(batch, logits.expand(GENERATOR_ROWS, -1), "gumbel_sample", IN_PLACE)
    assert torch.equal(a, b), (
        "the same seeded generator must give the same tokens, but two generators seeded alike "
        "gave different ones: the noise does not come from the generator you are given. Pass "
        "it on to the call that draws the uniform numbers."
    )
    assert not torch.equal(a, c), (
        "generators seeded differently gave identical tokens: is `generator` passed on to "
        "torch.rand?"
    )


@pytest.mark.gumbel_sample
@pytest.mark.parametrize("temperature", [1e-3, 0.0])
def test_temperature_near_zero_is_greedy(impl, temperature):
    # Exact. At T = 1e-3 a lead of 0.1 is a lead of 100 after the division: more than any two
    # Gumbel values drawn from float32 or float64 uniforms can differ by (about 21 and 43).
    logits = greedy_rows()
    before = logits.clone()
    expected = before.argmax(dim=-1)
    assert all(int(t) > 2 for t in expected), "test set-up: the winner must not be token 0-2"
    for seed in (0, 1):
        got = impl.gumbel_sample(logits, temperature, torch.Generator().manual_seed(seed))
        assert_untouched(logits, before, "gumbel_sample", IN_PLACE)
        assert got.shape == (8,), f"one token per row: expected (8,), got {tuple(got.shape)}"
        if temperature == 0 and not torch.equal(got, expected):
            raise AssertionError(
                f"temperature 0 is greedy: expected the argmax of each row, {expected.tolist()}, "
                f"got {got.tolist()}. logits / 0 is +inf for every positive logit, -inf for "
                "every negative one and NaN for a logit of 0, so the argmax of logits / 0 + G "
                "is not the argmax of the logits. Treat temperature == 0 on its own: return each "
                "row's argmax over the vocabulary, with no noise at all."
            )
        assert torch.equal(got, expected), (
            f"at temperature {temperature} each row's best logit leads by 0.1, that is by 100 "
            f"after dividing by T: sampling must pick it. Expected {expected.tolist()}, got "
            f"{got.tolist()}. Is it argmax (not argmin), over the vocabulary (dim=-1), of "
            "logits / T + G?"
        )
    one = impl.gumbel_sample(logits[2:3], temperature, torch.Generator().manual_seed(2))
    assert_untouched(logits, before, "gumbel_sample", IN_PLACE)
    assert one.shape == (1,) and one.tolist() == expected[2:3].tolist(), (
        f"a batch of one row: expected tensor({expected[2:3].tolist()}) of shape (1,), got {one!r}"
    )


@pytest.mark.gumbel_sample
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_masked_tokens_are_never_sampled(impl, temperature):
    # Exact: a -inf logit plus any finite noise is still -inf, and can never be the argmax.
    n, d_vocab = 3000, 16
    g = torch.Generator().manual_seed(44)
    logits = torch.randn(n, d_vocab, generator=g) * 3
    allowed = torch.rand(n, d_vocab, generator=g) < 0.3
    allowed[torch.arange(n), torch.randint(d_vocab, (n,), generator=g)] = True  # one at least
    logits = logits.masked_fill(~allowed, float("-inf"))
    logits[0] = float("-inf")
    logits[0, 11] = -50.0  # the only possible token, however unlikely its logit looks
    before = logits.clone()
    got = impl.gumbel_sample(logits, temperature, torch.Generator().manual_seed(5))
    assert_untouched(logits, before, "gumbel_sample", IN_PLACE)
    assert got.shape == (n,), f"one token per row: expected ({n},), got {tuple(got.shape)}"
    assert int(got[0]) == 11, (
        f"row 0 has one finite logit (token 11, logit -50), every other is -inf: token 11 must "
        f"come out, got {int(got[0])}. A masked score must stay -inf after the noise (no "
        "nan_to_num, no clamp, no masked_fill of the scores): then it can never win"
    )
    picked = allowed.gather(-1, got[:, None].clamp(0, d_vocab - 1))[:, 0]
    picked &= (got >= 0) & (got < d_vocab)
    bad = int((~picked).sum())
    assert bad == 0, (
        f"{bad} of {n} rows sampled a token whose logit is -inf (masked). -inf / T + G is -inf: "
        "add the noise to the logits as they are (no masked_fill, no nan_to_num, no clamp of "
        "the logits), and take the argmax."
    )


@pytest.mark.gumbel_sample
def test_gumbel_sample_draws_its_noise_on_the_logits_device(impl):
    """On a GPU, noise drawn without `device=` sits on the CPU beside logits on the GPU, and the
    addition fails. PyTorch's meta device (shapes, no values) fails the same way on a CPU."""
    logits = torch.empty(3, 50, device="meta")
    try:
        got = impl.gumbel_sample(logits, 0.8)
    except RuntimeError as err:
        if "device" not in str(err):
            raise
        pytest.fail(
            "gumbel_sample made a tensor on the CPU while its logits were on another device "
            f"(here PyTorch's meta device; on a GPU, the GPU): {str(err).splitlines()[0]} Is "
            "the uniform noise drawn without device=? Draw it on the logits' device."
        )
    assert got.device.type == "meta" and got.shape == (3,), (
        f"logits on the meta device gave tokens on {got.device}, shape {tuple(got.shape)}"
    )


# --------------------------------------------------------------------------- coupling

FUNCTIONS = ("same_token_shared_gumbel", "same_token_independent", "same_token_rejection")

MISTAKES = {
    "same_token_shared_gumbel": (
        "With the same noise G, both argmaxes are token k when k beats every j under p AND "
        "under q: G_k - G_j >= log(p_j / p_k) and >= log(q_j / q_k). That is one Gumbel race "
        "with weights max(p_j / p_k, q_j / q_k), won with probability "
        "1 / sum_j max(p_j / p_k, q_j / q_k) (max, not min; the sum over j, dim=-1, inside; "
        "then the sum over k of the tokens possible under both)."
    ),
    "same_token_independent": (
        "Drawn independently, x and y are both k with probability p_k * q_k: the answer is "
        "sum_k p_k q_k, summed over the vocabulary (dim=-1)."
    ),
    "same_token_rejection": (
        "The rejection sampler proposes k with probability q_k and keeps it with probability "
        "min(1, p_k / q_k): sum_k q_k min(1, p_k / q_k) = sum_k min(p_k, q_k), summed over the "
        "vocabulary (dim=-1)."
    ),
}


def log_or_minus_inf(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def shared_gumbel_by_integration(p: list[float], q: list[float]) -> float:
    """P(argmax(log p + G) == argmax(log q + G)), by numerical integration over G_k.

    Both pick k when every other G_j <= G_k + c_j, c_j = min(log(p_k/p_j), log(q_k/q_j)). With
    the standard Gumbel density f(g) = exp(-g - e^-g) and CDF F(g) = exp(-e^-g), and the G_j
    independent: P(k) = integral of f(g) prod_{j != k} F(g + c_j) dg, here by the trapezoid rule
    on [-10, 45] in float64 (the integrand is below 1e-17 outside: error under 1e-9).
    """
    g = torch.linspace(-10.0, 45.0, 110_001, dtype=torch.float64)
    density = torch.exp(-g - torch.exp(-g))
    total = 0.0
    for k in range(len(p)):
        if p[k] == 0 or q[k] == 0:
            continue  # log 0 = -inf: k is never an argmax of log p + G (or of log q + G)
        integrand = density.clone()
        for j in range(len(p)):
            c = min(
                math.log(p[k]) - log_or_minus_inf(p[j]), math.log(q[k]) - log_or_minus_inf(q[j])
            )
            if j != k and c < math.inf:
                integrand = integrand * torch.exp(-torch.exp(-(g + c)))
        total += float(torch.trapezoid(integrand, g))
    return total


def independent_exactly(p: list[float], q: list[float]) -> float:
    return math.fsum(pk * qk for pk, qk in zip(p, q, strict=True))


def rejection_exactly(p: list[float], q: list[float]) -> float:
    # Draft k proposed with probability q_k, kept with probability min(1, p_k / q_k).
    return math.fsum(qk * min(1.0, pk / qk) for pk, qk in zip(p, q, strict=True) if qk > 0)


EXACT = {
    "same_token_shared_gumbel": shared_gumbel_by_integration,
    "same_token_independent": independent_exactly,
    "same_token_rejection": rejection_exactly,
}


def call(impl, name: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """impl.<name>(p, q) on the test's own tensors, checked unchanged afterwards."""
    p_before, q_before = p.clone(), q.clone()
    got = getattr(impl, name)(p, q)
    hint = "Compute new tensors (`torch.where`, `torch.minimum`), do not write into p or q."
    assert_untouched(p, p_before, name, hint)
    assert_untouched(q, q_before, name, hint)
    assert isinstance(got, torch.Tensor), f"{name} must return a tensor, got {type(got)}"
    assert not got.isnan().any(), (
        f"{name} returned NaN for p = {p.tolist()}, q = {q.tolist()}. A token with p_k = 0 or "
        "q_k = 0 gives 0 / 0 in p_j / p_k or q_j / q_k: leave those terms out (they contribute "
        "0: such a token is never the argmax of both): keep only the tokens possible under "
        "BOTH, both = (p > 0) & (q > 0), divide by a safe value (`torch.where(both, p, 1.0)`) "
        "and zero the term with torch.where."
    )
    return got


def _ratios(p, q, op, inverted=False):
    """The [..., k, j] ratio matrix of the shared-noise formula (op: max, or a wrong one)."""
    both = (p > 0) & (q > 0)
    p_k = torch.where(both, p, 1.0)[..., :, None]
    q_k = torch.where(both, q, 1.0)[..., :, None]
    p_j, q_j = p[..., None, :], q[..., None, :]
    return op(p_k / p_j, q_k / q_j) if inverted else op(p_j / p_k, q_j / q_k)


def _kept(p, q, terms):
    return torch.where((p > 0) & (q > 0), terms, 0.0).sum(dim=-1)


VARIANTS = {
    "same_token_shared_gumbel": (
        (
            lambda p, q: _kept(p, q, 1 / _ratios(p, q, torch.minimum).sum(dim=-1)),
            "You take min(p_j / p_k, q_j / q_k): k must beat j under p AND under q, so j's "
            "weight in the race is the larger of the two ratios.",
        ),
        (
            lambda p, q: _kept(p, q, 1 / _ratios(p, q, torch.maximum).sum(dim=-2)),
            "Your inner sum runs over k (dim=-2) of the [k, j] ratio matrix: for each k, the "
            "inner sum is over j (dim=-1).",
        ),
        (
            lambda p, q: _kept(p, q, 1 / _ratios(p, q, torch.maximum, inverted=True).sum(-1)),
            "Your ratios are upside down: p_k / p_j instead of p_j / p_k.",
        ),
        (
            lambda p, q: (1 / _ratios(p, q, torch.maximum).sum(dim=-1)).sum(dim=-1),
            "The terms of tokens with p_k = 0 or q_k = 0 are not dropped from the outer sum: "
            "such a token is never the argmax of both, its term is 0.",
        ),
    ),
    "same_token_independent": (
        (
            lambda p, q: torch.minimum(p, q).sum(dim=-1),
            "You return sum_k min(p_k, q_k), the rejection sampler's probability.",
        ),
    ),
    "same_token_rejection": (
        (
            lambda p, q: (p * q).sum(dim=-1),
            "You return sum_k p_k q_k, the probability for independent draws.",
        ),
        (
            lambda p, q: torch.maximum(p, q).sum(dim=-1),
            "You return sum_k max(p_k, q_k): min, not max (the draft is kept with probability "
            "min(1, p_k / q_k)).",
        ),
    ),
}


def assert_value(impl, name: str, p: torch.Tensor, q: torch.Tensor, expected, why: str = ""):
    """impl.<name>(p, q) equals `expected` (a tensor of the batch shape), to 1e-6."""
    got = call(impl, name, p, q)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert got.shape == expected.shape, (
        f"{name} on p and q of shape {tuple(p.shape)} must return shape "
        f"{tuple(expected.shape)} (one probability per distribution: the sum runs over the "
        f"vocabulary, the LAST dimension), got {tuple(got.shape)}"
    )
    if not torch.allclose(got.double(), expected, atol=1e-6, rtol=0):
        for variant, mistake in VARIANTS[name]:
            wrong = variant(p.double(), q.double())
            if torch.allclose(got.double(), wrong, atol=1e-6, rtol=0) and not torch.allclose(
                wrong, expected, atol=1e-6, rtol=0
            ):
                pytest.fail(
                    f"{name}(p, q) with p = {p.tolist()}, q = {q.tolist()}: expected "
                    f"{expected.tolist()}, got {got.tolist()}. {mistake} {why}{MISTAKES[name]}"
                )
    assert torch.allclose(got.double(), expected, atol=1e-6, rtol=0), (
        f"{name}(p, q) with p = {p.tolist()}, q = {q.tolist()}: expected "
        f"{expected.tolist()}, got {got.tolist()}. "
        f"{explain_difference(got.double(), expected, atol=1e-6, rtol=0)} {why}{MISTAKES[name]}"
    )


def exact_rows(name: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The test's exact value for every distribution of a [..., d_vocab] pair."""
    d_vocab = p.shape[-1]
    pairs = zip(p.reshape(-1, d_vocab).tolist(), q.reshape(-1, d_vocab).tolist(), strict=True)
    rows = [EXACT[name](a, b) for a, b in pairs]
    return torch.tensor(rows, dtype=torch.float64).reshape(p.shape[:-1])


def random_distributions(seed: int, shape: tuple[int, ...], zeros: float = 0.0) -> torch.Tensor:
    """Distributions of the given shape (the last dimension is the vocabulary), float64, with
    about a `zeros` fraction of exact zeros (never a whole row)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(shape, generator=g, dtype=torch.float64) ** 2 + 0.02
    weights[..., 0] += 0.5  # a likely token 0: never a row of zeros
    drop = torch.rand(shape, generator=g) < zeros
    drop[..., 0] = False
    weights = weights.masked_fill(drop, 0.0)
    return weights / weights.sum(-1, keepdim=True)


@pytest.mark.coupling
@pytest.mark.parametrize("name", FUNCTIONS)
def test_coupling_of_a_distribution_with_itself(impl, name):
    # Exact: the same noise gives the same argmax; the rejection sampler keeps every draft
    # (p/q = 1); independent draws agree with probability sum p^2.
    p = torch.tensor([0.5, 0.25, 0.0, 0.125, 0.125], dtype=torch.float64)
    q = p.clone()
    expected = float((p * p).sum()) if name == "same_token_independent" else 1.0
    assert_value(impl, name, p, q, expected, "Here q = p. ")


@pytest.mark.coupling
@pytest.mark.parametrize("name", FUNCTIONS)
def test_coupling_of_disjoint_supports_is_zero(impl, name):
    # Exact: no token is possible under both, so x == y never happens.
    p = torch.tensor([0.6, 0.4, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.0, 0.3, 0.7], dtype=torch.float64)
    assert_value(impl, name, p, q, 0.0, "No token has p_k > 0 and q_k > 0. ")
    assert_value(impl, name, q, p, 0.0, "No token has p_k > 0 and q_k > 0. ")


@pytest.mark.coupling
@pytest.mark.parametrize("name", FUNCTIONS)
def test_coupling_with_zeros_in_p_or_in_q(impl, name):
    # Exact values computed here: the shared-noise one by numerical integration (1e-9).
    pairs = [
        ([0.6, 0.4, 0.0], [0.0, 0.5, 0.5]),  # a zero in p where q is not, and vice versa
        ([0.5, 0.0, 0.3, 0.2], [0.1, 0.6, 0.3, 0.0]),
        ([0.7, 0.2, 0.1, 0.0], [0.7, 0.2, 0.1, 0.0]),  # equal, with a token impossible in both
        ([0.0, 0.9, 0.1], [0.8, 0.1, 0.1]),
    ]
    for p_list, q_list in pairs:
        p = torch.tensor(p_list, dtype=torch.float64)
        q = torch.tensor(q_list, dtype=torch.float64)
        why = "A token with probability 0 under p or q is never picked by both. "
        assert_value(impl, name, p, q, EXACT[name](p_list, q_list), why)
        assert_value(impl, name, q, p, EXACT[name](q_list, p_list), why)


@pytest.mark.coupling
def test_shared_gumbel_matches_the_gumbel_integral(impl):
    # Exact to 1e-6 (the integral is good to 1e-9), on a batch [3, 2, d_vocab] with zeros.
    p = random_distributions(50, (3, 2, 6), zeros=0.25)
    q = random_distributions(51, (3, 2, 6), zeros=0.25)
    name = "same_token_shared_gumbel"
    assert_value(impl, name, p, q, exact_rows(name, p, q))
    assert_value(impl, name, q, p, exact_rows(name, q, p))


@pytest.mark.coupling
@pytest.mark.parametrize("name", FUNCTIONS)
def test_coupling_works_on_batches_and_on_one_distribution(impl, name):
    # Exact. [2, 3, d_vocab] -> [2, 3]; [d_vocab] -> a 0-dimensional tensor.
    p = random_distributions(52, (2, 3, 5), zeros=0.2)
    q = random_distributions(53, (2, 3, 5), zeros=0.2)
    assert_value(impl, name, p[1, 2], q[1, 2], exact_rows(name, p[1, 2], q[1, 2]))
    assert_value(impl, name, p, q, exact_rows(name, p, q))
    assert_value(impl, name, p.float(), q.float(), exact_rows(name, p, q), "In float32. ")


N_PAIRS = 20_000  # simulated draws per distribution pair


def simulate_same_token(name: str, p: torch.Tensor, q: torch.Tensor, seed: int) -> float:
    """The frequency of x == y in N_PAIRS draws of the coupling `name`, done here with torch."""
    g = torch.Generator().manual_seed(seed)
    n, d_vocab = N_PAIRS, p.numel()
    if name == "same_token_shared_gumbel":
        gumbel = -torch.log(-torch.log(torch.rand(n, d_vocab, generator=g, dtype=torch.float64)))
        x = (p.log() + gumbel).argmax(-1)  # the SAME noise for both
        y = (q.log() + gumbel).argmax(-1)
    elif name == "same_token_independent":
        x = torch.multinomial(p, n, replacement=True, generator=g)
        y = torch.multinomial(q, n, replacement=True, generator=g)
    else:  # rejection sampling: draft y ~ q, keep it if u < p(y) / q(y), else x ~ (p - q)+
        y = torch.multinomial(q, n, replacement=True, generator=g)
        keep = torch.rand(n, generator=g, dtype=torch.float64) * q[y] < p[y]
        residual = (p - q).clamp(min=0)
        x = y.clone()
        if residual.sum() > 0:
            recovered = torch.multinomial(residual, n, replacement=True, generator=g)
            x = torch.where(keep, y, recovered)
    return float((x == y).double().mean())


@pytest.mark.coupling
@pytest.mark.parametrize("name", FUNCTIONS)
def test_coupling_matches_simulation(impl, name):
    """The probability of x == y against its frequency in N_PAIRS simulated draws, for each row
    of a [3, d_vocab] batch. By Hoeffding's inequality a frequency is further than
    t = sqrt(log(2 / ALPHA) / (2 N_PAIRS)) (0.0175) from its probability with probability at
    most ALPHA: false failure 3 ALPHA for the test (a union bound over the rows)."""
    p = torch.tensor(
        [[0.5, 0.3, 0.2, 0.0], [0.7, 0.2, 0.1, 0.0], [0.6, 0.4, 0.0, 0.0]], dtype=torch.float64
    )
    q = torch.tensor(
        [[0.2, 0.3, 0.5, 0.0], [0.1, 0.1, 0.3, 0.5], [0.0, 0.5, 0.5, 0.0]], dtype=torch.float64
    )
    t = math.sqrt(math.log(2 / ALPHA) / (2 * N_PAIRS))
    got = call(impl, name, p, q)
    assert got.shape == (3,), (
        f"{name} on p and q of shape (3, 4) must return one probability per row, shape (3,), got "
        f"{tuple(got.shape)}: sum over the vocabulary, dim=-1"
    )
    for row in range(3):
        freq = simulate_same_token(name, p[row], q[row], seed=60 + row)
        assert abs(float(got[row]) - freq) <= t, (
            f"{name}: for p = {p[row].tolist()} and q = {q[row].tolist()}, x == y in a fraction "
            f"{freq:.4f} of {N_PAIRS} simulated draws, but you give {float(got[row]):.4f} (a "
            f"correct answer is within {t:.4f} of the frequency but with probability {ALPHA:g}). "
            + MISTAKES[name]
        )
