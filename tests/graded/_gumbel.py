"""Gumbel-max sampling, graded against exact probabilities: the checks that chapter 6's
`gumbel_sample` and chapter 10's kernels (Gumbel-max from logits, fused with the matmul) share.
The failure messages name the classic temperature and noise bugs when the samples reveal one."""

from __future__ import annotations

import torch

from tests.graded._oracles import crafted_logits
from tests.support import assert_samples_follow
from tests.support import follows as _follows

TEMPERATURE_AFTER_NOISE = (
    "Your samples follow softmax(logits), the distribution at temperature 1, whatever the "
    "temperature: is the noise added before dividing, argmax((logits + G) / T)? Dividing every "
    "score by the same T > 0 never changes the argmax, so T has no effect. Divide the logits "
    "first, then add the noise: argmax(logits / T + G)."
)
TEMPERATURE_MULTIPLIED = (
    "Your samples follow softmax(logits * T): are the logits multiplied by the temperature, "
    "argmax(logits * T + G)? Or is the noise divided by it, argmax(logits + G / T)? That is the "
    "same argmax (multiply every score by T > 0). Divide the logits, not the noise: "
    "argmax(logits / T + G), so that a low temperature sharpens the distribution and a high one "
    "flattens it."
)
EXPONENTIAL_NOISE = (
    "Your samples follow argmax(logits / T + E) with E = -log(U), exponential noise, not "
    "softmax(logits / T). Gumbel noise takes the log twice: G = -log(-log(U))."
)
NOISE_SIGN = (
    "Your samples follow argmax(logits / T - G): the sign of the Gumbel noise is flipped "
    "(log(-log U), or the noise subtracted). argmax(x - G) is not a softmax sample: add "
    "G = -log(-log(U))."
)
SAME_NOISE = (
    "Every row sampled token {token}, though no token has probability above {top:.2f}: do the "
    "rows share the same noise? Draw one independent value per logit of EVERY row: "
    "torch.rand(logits.shape), not one vector broadcast over the batch."
)
ARGMIN = (
    "Every row sampled token {token}, the LOWEST score (its logit is the smallest): argmin "
    "instead of argmax? The sample is the argmax of logits / T + G."
)
MASKED_SAMPLED = (
    "Token {token}, whose logit is -inf, was sampled: -inf + G is -inf and can never win, unless "
    "a score is NaN (argmax takes NaN as the largest value). Is U uniform in (0, 1), drawn with "
    "torch.rand? torch.randn gives values below 0 and above 1, where -log(-log U) is NaN."
)

NOISE_ON_PROBABILITIES = (
    "Your samples follow softmax(p), where p = softmax(logits / T) are the PROBABILITIES: a "
    "nearly flat distribution, in which even a token whose logit is -inf (p = 0) comes out. "
    "Is the Gumbel noise added to the probabilities instead of the logits? argmax(scores + G) "
    "draws from softmax(scores), so the scores must be the logits divided by T, with no "
    "softmax taken first."
)


def gumbel_logits(seed: int) -> torch.Tensor:
    """chapter 3's crafted logits (probabilities from ~0.3 to ~0), with token 3 masked out."""
    logits = crafted_logits(seed)
    logits[3] = float("-inf")
    return logits


def follows(samples: torch.Tensor, probs: torch.Tensor) -> bool:
    """Whether `samples` pass the chi-square test against `probs` (used only to word a
    failure message, never to decide whether a test fails)."""
    return _follows(samples, probs)


def argmax_probs(scores: torch.Tensor, noise: str) -> torch.Tensor:
    """P(argmax(scores + N) = k) for iid noise N: "exponential" (-log U) or "negated" (-G, G
    standard Gumbel), by the trapezoid rule in float64. With m = s_k + N_k, the winner's score:
    P(k) = integral of f(m - s_k) prod_{j != k} F(m - s_j) dm, f and F the noise's density and
    CDF. The product over every j, G(m), is computed once on one grid of m, and each token's
    integrand is f(m - s_k) G(m) / F(m - s_k): about 2 x V x 60,000 terms, not V^2 x 60,000 (a
    row of 300 tokens takes under a second). Only used to word a failure."""
    s = scores.double().cpu()
    finite = torch.isfinite(s)
    sf = s[finite]
    top = float(sf.max())
    exponential = noise == "exponential"
    if exponential:
        # Below the best score no token can win (the exponential noise is >= 0); 60 nats on.
        m = torch.linspace(top, top + 60.0, 60_001, dtype=torch.float64)

        def log_f(t):
            return torch.where(t >= 0, -t, -torch.inf)

        def log_cdf(t):
            return torch.where(t > 0, torch.log(-torch.expm1(-t.clamp(min=1e-300))), -torch.inf)
    else:
        # The negated Gumbel's density is below e^-45 outside [-45, 10] around the best score.
        m = torch.linspace(top - 45.0, top + 10.0, 55_001, dtype=torch.float64)

        def log_f(t):
            return t - torch.exp(t)

        def log_cdf(t):
            return torch.log(-torch.expm1(-torch.exp(t.clamp(max=700))))

    log_g = torch.zeros_like(m)  # log of G(m), the product over every token
    for chunk in sf.split(64):
        log_g += log_cdf(m[None, :] - chunk[:, None]).sum(0)
    if exponential:
        # The best token's integrand jumps from 0 to prod_{j != k} F(s_k - s_j) at m = s_k,
        # which may fall between grid points (it is the first point for the best token): the
        # trapezoid's segment across the jump is replaced by the area from s_k on.
        pairs = log_cdf(sf[:, None] - sf[None, :])
        pairs.fill_diagonal_(0.0)
        at_jump = pairs.sum(1).exp()
    parts = []
    for rows in torch.arange(len(sf)).split(64):
        t = m[None, :] - sf[rows][:, None]
        lf = log_cdf(t)
        integrand = torch.where(lf > -torch.inf, torch.exp(log_f(t) + log_g - lf), 0.0)
        p = torch.trapezoid(integrand, m, dim=-1)
        if exponential:
            after = torch.searchsorted(m, sf[rows], right=True).clamp(max=len(m) - 1)
            w = integrand.gather(1, after[:, None])[:, 0]
            step = float(m[1] - m[0])
            p = p + (at_jump[rows] + w) / 2 * (m[after] - sf[rows]) - w / 2 * step
        parts.append(p)
    probs = torch.zeros_like(s)
    probs[finite] = torch.cat(parts)
    return probs / probs.sum()


def noise_mistake(samples: torch.Tensor, logits: torch.Tensor, temperature: float) -> str | None:
    """The known noise or argmax mistake the samples of `logits / temperature` show, if any."""
    samples = samples.flatten().cpu()
    scores = logits.double().cpu() / temperature
    probs = scores.softmax(-1)
    tokens = samples.unique()
    if len(tokens) == 1 and samples.numel() > 100 and float(probs.max()) < 0.9:
        token = int(tokens[0])
        if 0 <= token < len(scores) and scores[token] == scores.min():
            return ARGMIN.format(token=token)
        return SAME_NOISE.format(token=token, top=float(probs.max()))
    if follows(samples, probs.softmax(-1)):
        return NOISE_ON_PROBABILITIES
    if follows(samples, argmax_probs(scores, "exponential")):
        return EXPONENTIAL_NOISE
    if follows(samples, argmax_probs(scores, "negated")):
        return NOISE_SIGN
    inside = (samples >= 0) & (samples < len(scores))
    masked = samples[inside][probs[samples[inside]] == 0]
    if masked.numel():
        return MASKED_SAMPLED.format(token=int(masked[0]))
    return None


def assert_follows_the_tempered_softmax(samples, logits, temperature) -> None:
    """`samples` follow softmax(logits / T). False failure: ALPHA."""
    what = f"gumbel_sample at temperature {temperature}"
    try:
        assert_samples_follow(samples, (logits.double() / temperature).softmax(-1), what)
    except AssertionError as err:
        if temperature != 1 and follows(samples, logits.double().softmax(-1)):
            raise AssertionError(f"{what}: {TEMPERATURE_AFTER_NOISE}\n{err}") from None
        if temperature != 1 and follows(samples, (logits.double() * temperature).softmax(-1)):
            raise AssertionError(f"{what}: {TEMPERATURE_MULTIPLIED}\n{err}") from None
        mistake = noise_mistake(samples, logits, temperature)
        if mistake:
            raise AssertionError(f"{what}: {mistake}\n{err}") from None
        raise AssertionError(
            f"{err}\nIs G standard Gumbel noise, -log(-log(U)) with U uniform in (0, 1) "
            "(torch.rand, not torch.randn; -log(U) alone is exponential noise, not Gumbel), "
            "one independent value per logit of every row, and the ARGMAX taken over the "
            "vocabulary (dim=-1)?"
        ) from None


def greedy_rows() -> torch.Tensor:
    """8 rows whose best token leads the runner-up by 0.1. In each row, token 0 is masked
    (-inf), token 1 is positive (a positive logit that is not the best comes first) and token 2
    is exactly 0: logits / 0 would give +inf, +inf and NaN there."""
    logits = torch.randn(8, 24, generator=torch.Generator().manual_seed(43)) * 2
    logits[:, 0] = float("-inf")
    logits[:, 1] = logits[:, 1].abs() + 0.1
    logits[:, 2] = 0.0
    for row in range(8):
        winner = 5 + 2 * row
        others = torch.cat([logits[row, :winner], logits[row, winner + 1 :]])
        logits[row, winner] = others.max() + 0.1
    return logits
