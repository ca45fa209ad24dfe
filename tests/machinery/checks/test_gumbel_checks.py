"""Chapter 6's Gumbel-max and coupling code and graded tests, checked from the outside.

- Every bad argument raises a ValueError that names it (the checks are given code).
- The graded tests' oracles are right: the Gumbel integral against the closed form and against
  a simulation, the test's rejection sampler against p.
- The graded tests catch the classic mistakes, each with the message written for it.
- The statistical tests pass on the solutions for 50 seeds (slow: `--runslow`).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

import solutions.gumbel as gumbel_mod
from tests.graded import test_06_gumbel as graded
from tests.support import ALPHA, N_SAMPLES, assert_samples_follow

# --------------------------------------------------------------------------- bad arguments

LOGITS = torch.zeros(2, 5)
P = torch.tensor([0.5, 0.5, 0.0])


@pytest.mark.parametrize("temperature", [-0.1, float("nan"), "hot", True, None])
def test_gumbel_sample_rejects_a_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        gumbel_mod.gumbel_sample(LOGITS, temperature)


@pytest.mark.parametrize(
    "logits", [torch.zeros(5), torch.zeros(2, 3, 5), torch.zeros(2, 5, dtype=torch.long), [0.0]]
)
def test_gumbel_sample_rejects_logits_that_are_not_a_batch_of_rows(logits):
    with pytest.raises(ValueError, match="logits"):
        gumbel_mod.gumbel_sample(logits)


@pytest.mark.parametrize("fn", graded.FUNCTIONS)
@pytest.mark.parametrize(
    ("p", "q", "name"),
    [
        (torch.tensor([2.0, 1.0, 0.0]), P, "p"),  # logits, not probabilities
        (P, torch.tensor([1.5, -0.5, 0.0]), "q"),  # a negative "probability"
        (P, torch.tensor([0.5, 0.5, float("nan")]), "q"),
        (torch.tensor([1, 0, 0]), P, "p"),  # integers
        (P, torch.tensor([0.25, 0.25, 0.25, 0.25]), "same shape"),
        (P[None].expand(2, 3), P, "same shape"),  # no broadcasting
    ],
)
def test_coupling_functions_reject_bad_distributions(fn, p, q, name):
    with pytest.raises(ValueError, match=name):
        getattr(gumbel_mod, fn)(p, q)


def test_coupling_on_a_large_vocabulary_in_float32():
    p = torch.rand(4096, generator=torch.Generator().manual_seed(0))
    q = torch.rand(4096, generator=torch.Generator().manual_seed(1))
    p, q = p / p.sum(), q / q.sum()
    independent = float(gumbel_mod.same_token_independent(p, q))
    shared = float(gumbel_mod.same_token_shared_gumbel(p, q))
    rejection = float(gumbel_mod.same_token_rejection(p, q))
    assert independent < shared < rejection <= 1


# --------------------------------------------------------------------------- the oracles


@pytest.mark.parametrize("seed", range(5))
def test_the_gumbel_integral_agrees_with_the_closed_form(seed):
    p = graded.random_distributions(200 + seed, (7,), zeros=0.3)
    q = graded.random_distributions(300 + seed, (7,), zeros=0.3)
    p_list, q_list = p.tolist(), q.tolist()
    closed = math.fsum(
        1 / math.fsum(max(p_list[j] / p_list[k], q_list[j] / q_list[k]) for j in range(7))
        for k in range(7)
        if p_list[k] > 0 and q_list[k] > 0
    )
    assert math.isclose(graded.shared_gumbel_by_integration(p_list, q_list), closed, abs_tol=1e-9)


def test_the_gumbel_integral_agrees_with_a_long_simulation():
    p, q = [0.5, 0.3, 0.2, 0.0], [0.1, 0.3, 0.4, 0.2]
    n = 400_000
    g = torch.Generator().manual_seed(0)
    noise = -torch.log(-torch.log(torch.rand(n, 4, generator=g, dtype=torch.float64)))
    both = (torch.tensor(p).log() + noise).argmax(-1) == (torch.tensor(q).log() + noise).argmax(-1)
    t = math.sqrt(math.log(2 / ALPHA) / (2 * n))  # Hoeffding: false failure ALPHA
    assert abs(float(both.double().mean()) - graded.shared_gumbel_by_integration(p, q)) < t


def test_the_tests_rejection_sampler_samples_from_p():
    """The simulated rejection sampler of the graded test is a correct one: its tokens follow p."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.3, 0.5], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    n = N_SAMPLES
    y = torch.multinomial(q, n, replacement=True, generator=g)
    keep = torch.rand(n, generator=g, dtype=torch.float64) * q[y] < p[y]
    recovered = torch.multinomial((p - q).clamp(min=0), n, replacement=True, generator=g)
    assert_samples_follow(torch.where(keep, y, recovered), p, "rejection sampler")
    freq = graded.simulate_same_token("same_token_rejection", p, q, seed=1)
    t = math.sqrt(math.log(2 / ALPHA) / (2 * graded.N_PAIRS))
    assert abs(freq - float(torch.minimum(p, q).sum())) < t


# --------------------------------------------------------------------------- sabotage


def impl_with(**overrides):
    """The solutions as an `impl`, with some objects replaced by broken versions."""
    return types.SimpleNamespace(**{**vars(gumbel_mod), **overrides})


def noise(logits, generator):
    u = torch.rand(logits.shape, generator=generator).clamp(min=1e-38)
    return -torch.log(-torch.log(u))


def test_temperature_after_the_noise_fails_with_its_name():
    def after(logits, temperature=1.0, generator=None):
        if temperature == 0:
            return logits.argmax(-1)
        return ((logits + noise(logits, generator)) / temperature).argmax(-1)

    for temperature in (0.5, 2.0):
        with pytest.raises(AssertionError, match=r"argmax\(\(logits \+ G\) / T\)"):
            graded.test_gumbel_sample_divides_the_logits_by_the_temperature_before_the_noise(
                impl_with(gumbel_sample=after), temperature
            )


def test_temperature_multiplied_fails_with_its_name():
    def times(logits, temperature=1.0, generator=None):
        return (logits * temperature + noise(logits, generator)).argmax(-1)

    with pytest.raises(AssertionError, match="multiplied"):
        graded.test_gumbel_sample_divides_the_logits_by_the_temperature_before_the_noise(
            impl_with(gumbel_sample=times), 0.5
        )


def test_ignoring_the_generator_fails():
    def global_rng(logits, temperature=1.0, generator=None):
        return gumbel_mod.gumbel_sample(logits, temperature, None)

    with pytest.raises(AssertionError, match="same seeded generator"):
        graded.test_gumbel_sample_uses_the_generator(impl_with(gumbel_sample=global_rng), 0.7)


def test_dividing_by_a_zero_temperature_fails():
    def no_greedy(logits, temperature=1.0, generator=None):
        return (logits / temperature + noise(logits, generator)).argmax(-1)

    with pytest.raises(AssertionError, match="temperature 0 is greedy"):
        graded.test_temperature_near_zero_is_greedy(impl_with(gumbel_sample=no_greedy), 0.0)


def test_shared_gumbel_with_nan_for_zeros_fails():
    def naive(p, q):
        ratios = torch.maximum(p[..., None, :] / p[..., :, None], q[..., None, :] / q[..., :, None])
        return (1 / ratios.sum(-1)).sum(-1)

    with pytest.raises(AssertionError, match="NaN"):
        graded.test_coupling_with_zeros_in_p_or_in_q(
            impl_with(same_token_shared_gumbel=naive), "same_token_shared_gumbel"
        )


def test_shared_gumbel_given_the_rejection_value_fails():
    impl = impl_with(same_token_shared_gumbel=gumbel_mod.same_token_rejection)
    with pytest.raises(AssertionError, match="max, not min"):
        graded.test_coupling_matches_simulation(impl, "same_token_shared_gumbel")
    with pytest.raises(AssertionError):
        graded.test_shared_gumbel_matches_the_gumbel_integral(impl)


# --------------------------------------------------------------------------- many seeds


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(50))
def test_statistical_tests_pass_on_solutions_for_many_seeds(seed):
    """The graded statistical checks, with fresh random draws for each seed."""
    logits = graded.gumbel_logits(100 + seed)
    batch = logits.expand(N_SAMPLES, -1).clone()
    for temperature in (1.0, 0.5, 2.0):
        g = torch.Generator().manual_seed(seed)
        samples = gumbel_mod.gumbel_sample(batch, temperature, g)
        graded.assert_follows_the_tempered_softmax(samples, logits, temperature)
    p = graded.random_distributions(400 + seed, (4,), zeros=0.2)
    q = graded.random_distributions(500 + seed, (4,), zeros=0.2)
    t = math.sqrt(math.log(2 / ALPHA) / (2 * graded.N_PAIRS))
    for name in graded.FUNCTIONS:
        freq = graded.simulate_same_token(name, p, q, seed=seed)
        assert abs(float(getattr(gumbel_mod, name)(p, q)) - freq) <= t, name
