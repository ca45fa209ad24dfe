"""A chi-square goodness-of-fit test with a stated false-failure probability.

A correct sampler fails `assert_samples_follow` with probability about `alpha` (the chi-square
approximation, valid because cells expecting fewer than 5 samples are pooled). Tests that make
several comparisons add up their alphas (a union bound) and say so.
"""

from __future__ import annotations

import torch

ALPHA = 1e-5  # per comparison; no graded test makes more than 10 -> at most 1e-4 per test


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square with df degrees of freedom (regularised upper gamma)."""
    return torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)
    ).item()


def chi2_critical(df: int, alpha: float) -> float:
    """The x with P(X > x) = alpha, by bisection."""
    low, high = 0.0, float(df) + 100.0 + 40.0 * df**0.5
    while chi2_sf(high, df) > alpha:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if chi2_sf(mid, df) > alpha:
            low = mid
        else:
            high = mid
    return high


def assert_token_ids(samples: torch.Tensor, v: int, what: str) -> None:
    """Every sample is a token id of a v-token distribution (before anything counts them)."""
    outside = (samples < 0) | (samples >= v)
    if outside.any():
        raise AssertionError(
            f"{what}: {int(outside.sum())} of {samples.numel()} samples are not token ids of "
            f"this distribution (for example {int(samples[outside][0])}; ids run from 0 to "
            f"{v - 1}). A -1 means that no token was chosen for that row."
        )


def assert_samples_follow(
    samples: torch.Tensor, probs: torch.Tensor, what: str, alpha: float = ALPHA
) -> None:
    """Fail (with a readable message) if `samples` (token ids) do not look drawn from `probs`.

    Tokens of probability 0 must never be drawn: that is checked exactly, not statistically.
    """
    probs = probs.double().cpu()
    probs = probs / probs.sum()
    samples = samples.flatten().cpu()
    n = samples.numel()
    assert_token_ids(samples, probs.numel(), what)
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    impossible = (probs == 0) & (counts > 0)
    if impossible.any():
        token = int(impossible.nonzero()[0])
        raise AssertionError(
            f"{what}: token {token} was sampled {int(counts[token])} times but should have "
            f"probability 0 (it is outside the kept set, or its logit is -inf)"
        )
    expected = probs * n
    big = expected >= 5
    obs_cells = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp_cells = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp_cells > 0
    obs_cells, exp_cells = obs_cells[keep], exp_cells[keep]
    df = obs_cells.numel() - 1
    if df < 1:
        return  # a single possible outcome, and no impossible token was drawn
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    critical = chi2_critical(df, alpha)
    if stat > critical:
        worst = ((obs_cells - exp_cells).abs() / exp_cells.sqrt()).argmax()
        raise AssertionError(
            f"{what}: the sampled frequencies do not match the expected probabilities "
            f"(chi-square {stat:.1f} > {critical:.1f} with {df} degrees of freedom; a correct "
            f"sampler fails this check with probability {alpha:g}). Largest deviation: "
            f"{int(obs_cells[worst])} samples where {float(exp_cells[worst]):.1f} were expected."
        )


def follows(samples: torch.Tensor, probs: torch.Tensor, alpha: float = ALPHA) -> bool:
    """Whether `samples` pass `assert_samples_follow` against `probs`. Used only to word a
    failure message (to recognise a known mistake), never to decide whether a test fails."""
    try:
        assert_samples_follow(samples, probs, "", alpha)
    except AssertionError:
        return False
    return True


# Row distances at which two rows' random numbers could collide through a wrong offset: next
# rows (a row stride too small: `row + i` for `row * rounds + i`), and the distances around
# powers of two where programs of many rows meet (`program_id + arange` for
# `program_id * BLOCK + arange`).
PAIR_SHIFTS = (1, 2, 3, 4, 5, 7, 8, 9) + tuple(
    s for b in (16, 32, 64, 128, 256, 512, 1024) for s in (b - 1, b, b + 1)
)


def assert_rows_independent(
    samples: torch.Tensor, probs: torch.Tensor, what: str, alpha: float = ALPHA
) -> None:
    """Rows with the same input must draw independently: for each distance s of PAIR_SHIFTS,
    the tokens of rows i and i + s, as pairs, follow probs x probs (chi-square). The pairs of
    one distance are disjoint (row i is paired with i + s when i // s is even), so under
    independence they are independent samples; `alpha` is split over the distances (a union
    bound): a correct sampler fails with probability at most `alpha`."""
    probs = probs.double().cpu()
    probs = probs / probs.sum()
    samples = samples.flatten().cpu()
    v, n = probs.numel(), samples.numel()
    assert_token_ids(samples, v, what)
    shifts = [s for s in PAIR_SHIFTS if 4 * s <= n]
    joint = torch.outer(probs, probs).flatten()
    for s in shifts:
        i = torch.arange(n - s)
        i = i[(i // s) % 2 == 0]
        assert_samples_follow(
            samples[i] * v + samples[i + s],
            joint,
            f"{what}: the tokens of rows i and i + {s} (same input) are not independent, "
            "as pairs. Does each row get its own random numbers? (a row's offset into the "
            "random stream must not overlap another row's)",
            alpha=alpha / len(shifts),
        )
