"""vLLM's rejection-sampler tests, rewritten for the course's `rejection_sample`: chapter 6's
PyTorch version (`solutions/speculative.py`) and chapter 10's Triton kernel
(`solutions/kernels/rejection.py`), each test run on both.

Sources (the cases and numbers are theirs; the code is this course's own):

- V0: vllm-project/vllm, tests/samplers/test_rejection_sampler.py at commit
  055265e02b63b136ebace98a5b009472760acfbb (the file was later deleted with the V0 engine).
- v1: vllm-project/vllm, tests/v1/sample/test_rejection_sampler.py at commit
  004fce2d0b6ad5146fa0f32b5e777dc8f5112d80.

They check the course's reference code (`solutions`), not a learner's notebook: no `impl`.

What changed on the way (tests/peers/README.md says more):

- Interface. V0 takes target probs [batch, k + 1, V], bonus token ids [batch, 1], draft probs
  [batch, k, V] and draft ids; v1 takes flattened, ragged rows [num_tokens, V] (draft probs may
  be None) and gets its bonus tokens from a separate sampler, which its tests mock. The course
  takes target_probs [batch, k + 1, V] and draws the bonus token itself from target_probs[:, k]:
  where vLLM's test fixes a bonus id, the port puts all of that position's mass on it. Rows are
  rectangular: vLLM's ragged cases run one call per row. k = 0 is refused (ValueError).
- Randomness. vLLM seeds requests one by one (a dict of per-request generators, the rest on the
  global RNG); the course takes one `torch.Generator` per call. Determinism is tested per call.
- Errors are ValueError (vLLM asserts: AssertionError). Inputs must be normalised (rows summing
  to 1 within 1e-3), where vLLM's tests pass torch.rand rows: the port normalises them, and
  tests that unnormalised rows and a draft token of draft probability 0 are refused.
- Greedy: vLLM's all_greedy sampling metadata is `greedy=True` (a draft is kept iff it is the
  target's argmax, and the added token is the target's argmax).
- Sizes. Chapter 10's kernel runs here through Triton's interpreter on the CPU, block operation
  by block operation: where a size is shrunk for it, the place says from what. The statistical
  test keeps vLLM's sample sizes and its threshold; it is deterministic under its seeds.
- No counterpart, not ported: V0's mixed seeded batch (per-request generators) and its FlashInfer
  backend comparison (skipped in vLLM itself); v1's frequency penalties, bad words and allowed
  token ids (logits processors inside vLLM's sampler: the course's sampler takes finished
  probabilities), FLy and synthetic verification, and its placeholder draft id -1 (a ragged-row
  artefact; the course refuses -1 like any id outside the vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import solutions  # noqa: F401  (first: it sets TRITON_INTERPRET=1 before Triton is imported)
from solutions.speculative import rejection_sample as pytorch_rejection_sample
from tests.support import ALPHA, assert_samples_follow

# ---------------------------------------------------------------------------------------------
# The two implementations


@dataclass(frozen=True)
class Sampler:
    """One implementation of the course's contract, called on CPU tensors: the inputs go to
    its device, the outputs come back to the CPU."""

    name: str
    fn: Callable
    device: str
    interpreted: bool  # Triton's interpreter: every block operation is a numpy call, keep it small
    tile: int  # the vocabulary block the implementation works in (the kernel's BLOCK_V cap)

    def __call__(self, target, draft, drafts, generator=None, greedy=False):
        tokens, accepted = self.fn(
            target.to(self.device),
            draft.to(self.device),
            drafts.to(self.device),
            generator=generator,
            greedy=greedy,
        )
        return tokens.cpu(), accepted.cpu()


@pytest.fixture(params=["pytorch", "triton"])
def sampler(request) -> Sampler:
    if request.param == "pytorch":
        return Sampler("chapter 6's rejection_sample", pytorch_rejection_sample, "cpu", False, 1024)
    pytest.importorskip("triton")  # Triton is a Linux-only dependency
    from solutions.kernels import rejection_sample
    from solutions.kernels.runtime import DEVICE, INTERPRET

    # rejection.py's block over the vocabulary: 1024 under the interpreter, 4096 compiled.
    tile = 1024 if INTERPRET else 4096
    return Sampler(
        "chapter 10's rejection_sample kernel", rejection_sample, DEVICE, INTERPRET, tile
    )


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def normalised(x: torch.Tensor) -> torch.Tensor:
    """Rows of positive numbers made into distributions (vLLM's tests pass torch.rand rows as
    they are; the course refuses rows that do not sum to 1)."""
    return x / x.sum(dim=-1, keepdim=True)


def random_inputs(batch: int, k: int, vocab: int, gen: torch.Generator):
    """vLLM's random case: target [batch, k + 1, V] and draft [batch, k, V] from torch.rand
    (normalised here), and draft ids uniform over the vocabulary."""
    target = normalised(torch.rand(batch, k + 1, vocab, generator=gen))
    draft = normalised(torch.rand(batch, k, vocab, generator=gen))
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    return target, draft, drafts


def assert_layout(tokens, accepted, drafts, vocab: int, who: str) -> None:
    """The course's output format: tokens int64 [batch, k + 1], accepted bool [batch, k] True
    up to the first rejection only; tokens = the accepted drafts, one token of the main model
    (a valid id), then -1."""
    batch, k = drafts.shape
    assert tokens.dtype == torch.int64 and tuple(tokens.shape) == (batch, k + 1), (
        f"{who}: tokens must be int64 [batch, k + 1] = {(batch, k + 1)}, got {tokens.dtype} "
        f"{tuple(tokens.shape)}."
    )
    assert accepted.dtype == torch.bool and tuple(accepted.shape) == (batch, k), (
        f"{who}: accepted must be bool [batch, k] = {(batch, k)}, got {accepted.dtype} "
        f"{tuple(accepted.shape)}."
    )
    n = accepted.sum(dim=1)
    cols = torch.arange(k + 1)[None, :]
    prefix = cols[:, :k] < n[:, None]
    bad = (accepted != prefix).any(dim=1)
    assert not bad.any(), (
        f"{who}: row {int(bad.nonzero()[0])} has accepted = "
        f"{accepted[int(bad.nonzero()[0])].int().tolist()}, which is not True up to the first "
        "rejection only: a draft after a rejected one can never count."
    )
    kept_ok = torch.where(prefix, tokens[:, :k] == drafts, True).all(dim=1)
    assert kept_ok.all(), (
        f"{who}: row {int((~kept_ok).nonzero()[0])} does not start with its accepted draft "
        "tokens: tokens[:, j] must be draft_tokens[:, j] for every accepted j."
    )
    added = tokens.gather(1, n[:, None])[:, 0]
    valid = (added >= 0) & (added < vocab)
    assert valid.all(), (
        f"{who}: row {int((~valid).nonzero()[0])} holds {int(added[~valid][0])} right after its "
        f"accepted drafts, where the main model's token (recovered or bonus, an id in "
        f"[0, {vocab})) belongs: every row gains exactly one token from the main model."
    )
    after = cols > n[:, None]
    assert (tokens[after] == -1).all(), (
        f"{who}: every position after the main model's token must be -1 (nothing was decided "
        "there)."
    )


# ---------------------------------------------------------------------------------------------
# V0: test_correct_output_format


def forced_inputs(last_accepted: torch.Tensor, k: int, vocab: int, gen: torch.Generator):
    """Inputs whose every outcome is certain, standing in for V0's mocked `accepted` matrix.

    Row b keeps drafts 0..last_accepted[b] (the target puts all its mass on each of them, so
    u * q < p for every u < 1), rejects the next one (the target gives it probability 0), and the
    recovered token is then the one token where max(0, p - q) > 0. Drafts after the rejection
    are again ones the target would keep on their own: V0's 'sprinkled' acceptances, which must
    not count. The bonus position puts all its mass on the bonus token."""
    batch = last_accepted.shape[0]
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    # A recovered token that differs from the draft it replaces.
    recovered = (drafts + torch.randint(1, vocab, (batch, k), generator=gen)) % vocab
    bonus = torch.randint(0, vocab, (batch,), generator=gen)
    draft = torch.softmax(torch.rand(batch, k, vocab, generator=gen), dim=-1)  # q > 0 everywhere
    wanted = drafts.clone()
    rejected_at = last_accepted + 1
    for b in range(batch):
        if rejected_at[b] < k:
            wanted[b, rejected_at[b]] = recovered[b, rejected_at[b]]
    target = torch.zeros(batch, k + 1, vocab)
    target[:, :k].scatter_(-1, wanted[..., None], 1.0)
    target[torch.arange(batch), k, bonus] = 1.0
    return target, draft, drafts, recovered, bonus


@pytest.mark.parametrize("seed", list(range(10)))
@pytest.mark.parametrize("which", ["all_tokens_accepted", "no_tokens_accepted", "some_accepted"])
def test_output_format_for_forced_outcomes(sampler, which, seed):
    """V0's test_correct_output_format: all accepted -> the k drafts then the bonus token; none
    accepted -> the recovered token then -1; some -> the first rejected position holds the
    recovered token (or the bonus token) and every later one -1."""
    # V0's sizes are batch 10, k 5, V 3000; the interpreted kernel gets V 300.
    batch, k = 10, 5
    vocab = 300 if sampler.interpreted else 3000
    gen = seeded(seed)
    if which == "all_tokens_accepted":
        last = torch.full((batch,), k - 1)
    elif which == "no_tokens_accepted":
        last = torch.full((batch,), -1)
    else:
        last = torch.randint(-1, k, (batch,), generator=gen)
    target, draft, drafts, recovered, bonus = forced_inputs(last, k, vocab, gen)

    tokens, accepted = sampler(target, draft, drafts, generator=gen)

    assert_layout(tokens, accepted, drafts, vocab, sampler.name)
    expected_accepted = torch.arange(k)[None, :] <= last[:, None]
    assert torch.equal(accepted, expected_accepted), (
        f"{sampler.name}: accepted {accepted.int().tolist()} where the inputs force "
        f"{expected_accepted.int().tolist()}: a draft the target gives all its mass must be "
        "kept, one it gives probability 0 must be rejected, and nothing after a rejection counts."
    )
    expected = torch.full((batch, k + 1), -1)
    for b in range(batch):
        n = int(last[b]) + 1
        expected[b, :n] = drafts[b, :n]
        expected[b, n] = bonus[b] if n == k else recovered[b, n]
    assert torch.equal(tokens, expected), (
        f"{sampler.name}: tokens {tokens.tolist()} where the inputs force {expected.tolist()}: "
        "the accepted drafts, then the recovered token (the only token where max(0, p - q) > 0) "
        "or, when all k were kept, the bonus token (all of target_probs[:, k]'s mass), then -1."
    )


# ---------------------------------------------------------------------------------------------
# V0: test_no_crash_with_varying_dims


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("vocab_size", [30_000, 50_000])
@pytest.mark.parametrize("batch_size", [1, 8, 31])
def test_any_shape_gives_the_layout(sampler, k, vocab_size, batch_size):
    """V0's test_no_crash_with_varying_dims (k 1..5, V 30000 and 50000, batch 1..31), with the
    output format checked too. Here k in {1, 3, 5} and batch in {1, 8, 31}; the interpreted
    kernel gets V / 10 + 1 (3001, 5001: still several vocabulary blocks, the last one partial).
    `--runslow` runs vLLM's sizes on both (test_any_shape_at_vllm_sizes)."""
    vocab = vocab_size // 10 + 1 if sampler.interpreted else vocab_size
    check_random_shape(sampler, k, vocab, batch_size)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("vocab_size", [30_000, 50_000])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 8, 13, 21, 31])
def test_any_shape_at_vllm_sizes(sampler, k, vocab_size, batch_size):
    """Slow (--runslow): V0's test_no_crash_with_varying_dims at its own vocabularies, on both
    implementations, k 1..5 and batch sizes from 1 to 31."""
    check_random_shape(sampler, k, vocab_size, batch_size)


def check_random_shape(sampler: Sampler, k: int, vocab: int, batch_size: int) -> None:
    gen = seeded(1000 * k + batch_size)
    target, draft, drafts = random_inputs(batch_size, k, vocab, gen)
    tokens, accepted = sampler(target, draft, drafts, generator=gen)
    assert_layout(tokens, accepted, drafts, vocab, sampler.name)


# ---------------------------------------------------------------------------------------------
# V0 and v1: test_deterministic_when_seeded


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_deterministic_when_seeded(sampler, k, batch_size):
    """V0 and v1: a seeded request gives the same tokens on every repetition (V0: 100
    repetitions at V 30000 / 50000; v1: 20 at V 1000). The course takes one generator per call:
    the same seed must give the same tokens and acceptances whatever the global RNG does, and
    the generator must matter (different seeds do not all agree). Here V 1000, 10 repetitions."""
    vocab, n_rep = 1000, 10
    target, draft, drafts = random_inputs(batch_size, k, vocab, seeded(7))
    runs = []
    for rep in range(n_rep):
        torch.manual_seed(rep)  # the global RNG changes; only the generator may decide
        runs.append(sampler(target, draft, drafts, generator=seeded(1234)))
    for rep, (tokens, accepted) in enumerate(runs[1:], start=1):
        assert torch.equal(tokens, runs[0][0]) and torch.equal(accepted, runs[0][1]), (
            f"{sampler.name}: repetition {rep} with the same generator seed gave other tokens "
            f"({tokens.tolist()} vs {runs[0][0].tolist()}). Every random number must come from "
            "`generator`, none from the global RNG."
        )
    others = {
        tuple(sampler(target, draft, drafts, generator=seeded(s))[0].flatten().tolist())
        for s in range(20)
    }
    assert len(others) > 1, (
        f"{sampler.name} gave the same tokens for 20 different generator seeds: the draws must "
        "depend on the generator."
    )


# ---------------------------------------------------------------------------------------------
# V0: test_raises_when_vocab_oob, and the course's own input checks


@pytest.mark.parametrize("where", ["above", "below"])
def test_out_of_range_draft_token_raises(sampler, where):
    """V0's test_raises_when_vocab_oob: a draft id of V + 1 or -1 is refused (vLLM in strict
    mode: AssertionError; the course: ValueError). V0's bonus-id case has no counterpart: the
    course draws the bonus token itself. V0's V 30000; here 300 (only the check runs)."""
    k, batch, vocab = 3, 5, 300
    target, draft, drafts = random_inputs(batch, k, vocab, seeded(0))
    drafts[0, 0] = vocab + 1 if where == "above" else -1
    with pytest.raises(ValueError):
        sampler(target, draft, drafts, generator=seeded(0))


@pytest.mark.parametrize("which", ["target", "draft"])
def test_unnormalised_probabilities_raise(sampler, which):
    """vLLM's tests pass torch.rand rows as probabilities; the course's contract wants rows that
    sum to 1 (within 1e-3) and refuses others with a ValueError instead of sampling a
    distribution nobody meant."""
    target, draft, drafts = random_inputs(5, 3, 300, seeded(0))
    if which == "target":
        target = torch.rand(target.shape, generator=seeded(1))
    else:
        draft = torch.rand(draft.shape, generator=seeded(1))
    with pytest.raises(ValueError):
        sampler(target, draft, drafts, generator=seeded(0))


def test_draft_token_of_probability_zero_raises(sampler):
    """The course's contract: a drafter cannot propose a token its own distribution gives
    probability 0 (q(x) = 0 would make the test u * q < p meaningless), so it is a ValueError."""
    target, draft, drafts = random_inputs(5, 3, 300, seeded(0))
    draft[2, 1, drafts[2, 1]] = 0.0
    draft = normalised(draft)
    with pytest.raises(ValueError):
        sampler(target, draft, drafts, generator=seeded(0))


# ---------------------------------------------------------------------------------------------
# v1: the greedy cases (vocabulary 100, logits +100 at the target's token and -100 elsewhere)

GREEDY_CASES = {
    # name: (draft tokens per request, the target's tokens incl. bonus, vLLM's expected output)
    "perfect_match": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "early_mismatch": ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
    "multiple_sequences": ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),
    "single_token_sequence": ([[1]], [[1, 2]], [[1, 2]]),
    "multiple_mismatches": (
        [[1, 2, 3], [4, 5, 6]],
        [[1, 2, 7, 6], [4, 8, 6, 9]],
        [[1, 2, 7, -1], [4, 8, -1, -1]],
    ),
    "parametrized_perfect_match_with_bonus": ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    "parametrized_first_mismatch": ([[1]], [[2, 3]], [[2, -1]]),
    "parametrized_mixed_matches": (
        [[1, 2], [3, 4]],
        [[1, 5, 6], [3, 4, 7]],
        [[1, 5, -1], [3, 4, 7]],
    ),
}


def greedy_target(target_tokens: list[int], vocab: int = 100) -> torch.Tensor:
    """v1's create_logits_tensor (100 at the wanted token, -100 elsewhere), softmaxed: a target
    whose argmax at position j is target_tokens[j]; the last position holds the bonus token,
    which vLLM's test gives its mocked sampler instead."""
    logits = torch.full((len(target_tokens), vocab), -100.0)
    logits[torch.arange(len(target_tokens)), torch.tensor(target_tokens)] = 100.0
    return logits.softmax(dim=-1)


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_cases(sampler, case):
    """v1's greedy tests (test_perfect_match, test_early_mismatch, test_multiple_sequences,
    test_single_token_sequence, test_multiple_mismatches, test_parametrized_cases): keep the
    drafts that equal the target's argmax up to the first that does not, then add the target's
    argmax there (or the bonus), then -1. Requests of one batch with equal k share one call;
    a request with another k (vLLM's ragged rows) gets its own, padded with -1 to compare."""
    spec, target_tokens, expected = GREEDY_CASES[case]
    vocab = 100
    width = max(len(s) for s in spec) + 1
    got = [None] * len(spec)
    for k in sorted({len(s) for s in spec}):
        rows = [i for i, s in enumerate(spec) if len(s) == k]
        target = torch.stack([greedy_target(target_tokens[i], vocab) for i in rows])
        draft = torch.full((len(rows), k, vocab), 1.0 / vocab)  # vLLM: draft_probs=None
        drafts = torch.tensor([spec[i] for i in rows])
        tokens, accepted = sampler(target, draft, drafts, generator=seeded(0), greedy=True)
        assert_layout(tokens, accepted, drafts, vocab, f"{sampler.name} (greedy)")
        for row, i in enumerate(rows):
            got[i] = tokens[row].tolist() + [-1] * (width - k - 1)
    assert got == expected, (
        f"{sampler.name} (greedy), vLLM's {case}: drafts {spec} against target argmaxes "
        f"{target_tokens} gave {got}, vLLM expects {expected}. Keep a draft iff it is the "
        "target's argmax, stop at the first that is not (its place gets the argmax), and add "
        "the argmax of the position after the last draft when all are kept."
    )


def test_greedy_empty_sequence_is_refused(sampler):
    """v1's test_empty_sequence: with no draft tokens vLLM returns the bonus token alone. The
    course's sampler needs k >= 1 draft positions (with none there is nothing to verify: that
    is plain sampling) and refuses k = 0 with a ValueError."""
    target = greedy_target([5])[None]
    with pytest.raises(ValueError):
        sampler(
            target,
            torch.empty(1, 0, 100),
            torch.empty(1, 0, dtype=torch.long),
            generator=seeded(0),
            greedy=True,
        )


# ---------------------------------------------------------------------------------------------
# V0 and v1: test_rejection_sampling_approximates_target_distribution

SAMPLE_SIZES = [10, 100, 1_000, 10_000, 100_000]  # vLLM's
IMPROVEMENT = 20  # vLLM's expected_improvement_multiplier, unchanged
N_REFERENCE = 100  # vLLM's number of random reference distributions
# The chi-square checks below: one per sample size >= 100 and per position counted (2 for
# k = 2), each failing a correct sampler with probability ALPHA = 1e-5 -> at most 8e-5 per case
# (a union bound).
#
# vLLM's own criterion (the distance to the target shrinks IMPROVEMENT times more than the
# distance to random references) is a fixed threshold with no stated error rate. Simulated for a
# correct sampler (exact multinomial counts, 10**6 runs per k, p, q and references drawn as
# here), it fails with probability about 3.3e-3 for k = 1 and 2.5e-4 for k = 2: almost always
# because 10 samples happened to land close to the target. Kept as vLLM has it (not loosened);
# it is deterministic under the seeds below, and every one of them, the slow ones included,
# passes with the course's solutions.
APPROX_CASES = [
    # (k, seed, draft equals target): V0 uses k = 1, seeds 0-4, equal and different; v1 k = 2.
    *[(1, seed, equal) for seed in range(5) for equal in (False, True)],
    (2, 0, False),
]
# More seeds, run with --runslow (each case takes about a second on the interpreted kernel).
SLOW_APPROX_CASES = [
    *[(1, seed, equal) for seed in range(5, 25) for equal in (False, True)],
    *[(2, seed, False) for seed in range(1, 10)],
]


def empirical(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Frequencies of the token ids (vLLM: a density histogram over [0, V), which leaves -1
    out)."""
    tokens = tokens[tokens >= 0]
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


@pytest.mark.parametrize(
    "k, seed, equal",
    [
        pytest.param(
            *case,
            id=f"k{case[0]}-seed{case[1]}-{'equal' if case[2] else 'different'}",
            marks=[pytest.mark.slow] if slow else [],
        )
        for slow, cases in ((False, APPROX_CASES), (True, SLOW_APPROX_CASES))
        for case in cases
    ],
)
def test_output_approaches_the_target_distribution(sampler, k, seed, equal, pytestconfig):
    """V0 and v1: draws from random draft and target distributions over 10 tokens; as the
    number of samples grows from 10 to 100,000, the distance (L2) between the emitted tokens'
    frequencies and the target must shrink more than 20 times as much as their mean distance
    to 100 random distributions. V0 also runs draft == target exactly ('no NaNs or
    exceptions'); then every draft must be kept (min(1, p / q) = 1).

    Added, so that 'approaches' is measured against what sampling the target directly would
    give: at each size from 100 on, a chi-square test of the emitted tokens against the target
    (first position over all rows, second over the rows that kept their first draft: each
    exactly a sample of the target). Deterministic under its seed."""
    if sampler.interpreted and seed > 0 and not pytestconfig.getoption("--runslow"):
        pytest.skip("interpreted kernel: seed 0 here, every seed with --runslow (about 3 s each)")
    vocab = 10
    gen = seeded(seed)
    draft_p = torch.softmax(torch.rand(vocab, generator=gen), dim=-1)
    target_p = torch.softmax(torch.rand(vocab, generator=gen), dim=-1)
    reference = torch.softmax(torch.rand(N_REFERENCE, vocab, generator=gen), dim=-1).double()
    if equal:
        target_p = draft_p.clone()

    to_target, to_reference = [], []
    for n in SAMPLE_SIZES:
        drafts = torch.multinomial(draft_p, n * k, replacement=True, generator=gen).view(n, k)
        tokens, accepted = sampler(
            target_p.expand(n, k + 1, vocab),
            draft_p.expand(n, k, vocab),
            drafts,
            generator=gen,
        )
        assert_layout(tokens, accepted, drafts, vocab, sampler.name)
        if equal:
            assert accepted.all(), (
                f"{sampler.name} rejected a draft with draft probabilities equal to the "
                "target's: it must be kept with probability min(1, p / q) = 1."
            )
        freq = empirical(tokens[:, :k].flatten(), vocab)  # vLLM leaves the bonus column out
        to_target.append(torch.dist(target_p.double(), freq).item())
        to_reference.append(torch.dist(reference, freq).item() / N_REFERENCE)
        if n >= 100:
            assert_samples_follow(
                tokens[:, 0],
                target_p,
                f"{sampler.name}, {n} rows: the first token of each row",
            )
            if k >= 2:
                assert_samples_follow(
                    tokens[accepted[:, 0], 1],
                    target_p,
                    f"{sampler.name}, {n} rows: the second token of the rows that kept the first",
                )

    target_gain = to_target[0] / to_target[-1]
    reference_gain = to_reference[0] / to_reference[-1]
    assert target_gain > IMPROVEMENT * reference_gain, (
        f"{sampler.name}: from 10 to 100,000 samples the distance to the target went "
        f"{to_target[0]:.4f} -> {to_target[-1]:.4f} ({target_gain:.1f}x closer) and to random "
        f"distributions {to_reference[0]:.4f} -> {to_reference[-1]:.4f} ({reference_gain:.2f}x): "
        f"vLLM requires the first to improve more than {IMPROVEMENT}x as much. The emitted "
        "tokens do not converge to the target distribution."
    )
    assert ALPHA <= 1e-5  # the false-failure figure above assumes it


# ---------------------------------------------------------------------------------------------
# v1: test_top_k and test_top_p (a filtered target: nothing outside its support comes out)


def top_k_support(n_rows: int, vocab: int, top_k: int, gen: torch.Generator):
    """v1's test_top_k: equal logits, raised by 0.1 on top_k random tokens per row."""
    kept = torch.stack([torch.randperm(vocab, generator=gen)[:top_k] for _ in range(n_rows)])
    logits = torch.zeros(n_rows, vocab)
    logits.scatter_(1, kept, 0.1)
    mask = torch.zeros(n_rows, vocab, dtype=torch.bool).scatter_(1, kept, True)
    return logits, mask


def top_p_support(n_rows: int, vocab: int, top_p: float, gen: torch.Generator):
    """v1's test_top_p: normal logits; sorted ascending, the tokens whose cumulative
    probability is <= 1 - top_p are removed, the most likely one always kept."""
    logits = torch.randn(n_rows, vocab, generator=gen)
    sorted_logits, order = logits.sort(dim=-1)
    removed_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    removed_sorted[:, -1] = False
    removed = removed_sorted.scatter(1, order, removed_sorted)
    return logits, ~removed


@pytest.mark.parametrize(
    "kind, value",
    [("top_k", 1), ("top_k", 5), ("top_k", 99), ("top_p", 0.5), ("top_p", 0.9), ("top_p", 0.99)],
)
def test_tokens_stay_in_the_filtered_target(sampler, kind, value):
    """v1's test_top_k / test_top_p: vLLM filters the target inside its sampler; the course's
    sampler takes the filtered probabilities (softmax of the logits with the filtered ones at
    -inf). Drafts come from an unfiltered draft distribution, so many lie outside the target's
    support: none of them, and no recovered or bonus token, may come out. vLLM's sizes: V 100,
    batch 100, 3 drafts."""
    vocab, batch, k = 100, 100, 3
    gen = seeded(0)
    make = top_k_support if kind == "top_k" else top_p_support
    logits, support = make(batch * (k + 1), vocab, value, gen)
    target = logits.masked_fill(~support, float("-inf")).softmax(dim=-1).view(batch, k + 1, vocab)
    support = support.view(batch, k + 1, vocab)
    draft = torch.softmax(torch.rand(batch, k, vocab, generator=gen), dim=-1)
    drafts = torch.multinomial(draft.view(-1, vocab), 1, generator=gen).view(batch, k)

    tokens, accepted = sampler(target, draft, drafts, generator=gen)

    assert_layout(tokens, accepted, drafts, vocab, sampler.name)
    emitted = tokens >= 0
    rows, cols = emitted.nonzero(as_tuple=True)
    inside = support[rows, cols, tokens[rows, cols]]
    assert inside.all(), (
        f"{sampler.name}, {kind} = {value}: row {int(rows[~inside][0])} emitted token "
        f"{int(tokens[rows, cols][~inside][0])} at position {int(cols[~inside][0])}, which the "
        "target gives probability 0 there. A draft with p(x) = 0 must be rejected, and the "
        "recovered token comes from max(0, p - q), which is 0 wherever p is."
    )
    assert (~accepted).any(), (
        f"{sampler.name} kept every draft, although many lie outside the target's support "
        "(probability 0 there) and must be rejected."
    )


# ---------------------------------------------------------------------------------------------
# v1: test_sample_recovered_tokens and its vocabulary-boundary regression test


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("no_draft_probs", [False, True])
def test_recovered_token_follows_the_residual(sampler, k, no_draft_probs):
    """v1's test_sample_recovered_tokens compares vLLM's recovered tokens with a reference that
    draws from max(0, p - q) (with no draft probs: p with the draft token's entry set to 0),
    using the same random numbers. The course draws its own random numbers, so the port tests
    the distribution: at each row's first rejection, the token must follow max(0, p - q)
    renormalised (chi-square, false failure ALPHA = 1e-5). vLLM's 'no draft probs' is an
    n-gram drafter's q: all of its mass on the drafted token.

    vLLM's sizes: V 100 to 10000, batch 1 or 100, 1 or 3 drafts, one draw each. A distribution
    test needs many rejections of one (p, q): here V 100, 5,000 rows with the same p and q at
    every position."""
    vocab, batch = 100, 5000
    gen = seeded(k + 10 * no_draft_probs)
    p = torch.softmax(2 * torch.randn(vocab, generator=gen), dim=-1)
    if no_draft_probs:
        x = int(p.argmax())  # the drafted token: rejected with probability 1 - p(x)
        q = torch.zeros(vocab)
        q[x] = 1.0
        drafts = torch.full((batch, k), x)
    else:
        q = torch.softmax(2 * torch.randn(vocab, generator=gen), dim=-1)
        drafts = torch.multinomial(q, batch * k, replacement=True, generator=gen).view(batch, k)
    residual = (p.double() - q.double()).clamp(min=0)
    if no_draft_probs:
        expected = p.double().clone()
        expected[x] = 0.0
        torch.testing.assert_close(
            residual / residual.sum(),
            expected / expected.sum(),
            msg="the test's own setup is wrong: with q one-hot at x, max(0, p - q) should be p "
            "with token x set to 0 (vLLM's formula without draft probs)",
        )

    tokens, accepted = sampler(
        p.expand(batch, k + 1, vocab), q.expand(batch, k, vocab), drafts, generator=gen
    )

    assert_layout(tokens, accepted, drafts, vocab, sampler.name)
    n = accepted.sum(dim=1)
    rejected = n < k
    recovered = tokens[rejected, n[rejected]]
    assert recovered.numel() > 500, f"too few rejections ({recovered.numel()}) to test"
    assert_samples_follow(
        recovered,
        residual,
        f"{sampler.name}: the token drawn at the first rejection (should follow max(0, p - q) "
        "renormalised)",
    )


@pytest.mark.parametrize("no_draft_probs", [False, True])
@pytest.mark.parametrize("vocab_case", ["below_tile", "tile_plus_1", "unaligned"])
def test_recovered_token_is_in_the_vocabulary_when_the_last_tile_is_empty(
    sampler, vocab_case, no_draft_probs
):
    """v1's regression test for GHSA-8wr5-jm2h-8r4f: with a vocabulary that is not a multiple of
    the kernel's block and a target with no mass in the last, partial block, a kernel can pick a
    padding column past the vocabulary. Every emitted token must be an id of the vocabulary
    that the target gives positive probability at its position.

    vLLM's vocabularies (its block is 8192): 100 (one partial block), 8193 (block + 1),
    10000, 151936. Here the course's own block (1024 under Triton's interpreter, 4096 compiled):
    100, block + 1, and block * 1.25. For V below a block vLLM puts all of the target's mass
    on token 0 and forces draft 0 with no draft probs; the course would keep that draft (p = q),
    so here the drafts are random and every rejection must recover token 0."""
    tile = sampler.tile
    vocab = {"below_tile": 100, "tile_plus_1": tile + 1, "unaligned": tile + tile // 4}[vocab_case]
    batch, k = 64, 3  # vLLM: batch 2, 3 drafts
    gen = seeded(42)
    if vocab < tile:
        target = torch.zeros(batch, k + 1, vocab)
        target[..., 0] = 1.0
    else:
        target = torch.rand(batch, k + 1, vocab, generator=gen)
        target[..., (vocab // tile) * tile :] = 0.0  # no mass in the last, partial block
        target = normalised(target)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    if no_draft_probs:
        draft = torch.zeros(batch, k, vocab).scatter_(-1, drafts[..., None], 1.0)
    else:
        draft = torch.softmax(torch.rand(batch, k, vocab, generator=gen), dim=-1)

    tokens, accepted = sampler(target, draft, drafts, generator=gen)

    assert_layout(tokens, accepted, drafts, vocab, sampler.name)
    rows, cols = (tokens >= 0).nonzero(as_tuple=True)
    emitted = tokens[rows, cols]
    positive = target[rows, cols, emitted] > 0
    assert positive.all(), (
        f"{sampler.name}, V = {vocab}: row {int(rows[~positive][0])} emitted token "
        f"{int(emitted[~positive][0])}, which the target gives probability 0 at its position. "
        "Past the last token with mass, no column may be chosen (look at how the last, partial "
        "block of the vocabulary is masked)."
    )


# ---------------------------------------------------------------------------------------------
# A residual with no mass (the course's contract; vLLM's 'draft == target: no NaNs or
# exceptions' and its all-zero-residual regression case, taken to their end)


def test_zero_residual_draws_from_the_target(sampler):
    """When a draft is rejected although p <= q everywhere (p and q equal up to rounding: both
    sum to 1 within 1e-3), max(0, p - q) has no mass. The token must then come from p itself:
    never an error, never -1, never a NaN-driven pick.

    Built so that it happens often: p and q agree on tokens 0..6; on token 7, the only one
    drafted, p = 0.0003 and q = 0.0012, so 3 of 4 drafts are rejected (p sums to 0.9998, q to
    1.0007). The recovered tokens must follow p renormalised (chi-square, false failure 1e-5)."""
    rest = [0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.0595]
    p = torch.tensor([*rest, 0.0003])
    q = torch.tensor([*rest, 0.0012])
    assert bool(((p - q) <= 0).all()), "the test's p must lie under q everywhere"
    batch, vocab = 4000, 8
    gen = seeded(5)
    drafts = torch.full((batch, 1), 7)
    bonus = torch.softmax(torch.rand(vocab, generator=gen), dim=-1)
    target = torch.stack([p, bonus]).expand(batch, 2, vocab)

    tokens, accepted = sampler(target, q.expand(batch, 1, vocab), drafts, generator=gen)

    assert_layout(tokens, accepted, drafts, vocab, sampler.name)
    recovered = tokens[~accepted[:, 0], 0]
    assert recovered.numel() > 2000, (
        f"{sampler.name} rejected only {recovered.numel()} of {batch} drafts kept with "
        "probability p / q = 0.25: is the test u * q < p?"
    )
    assert_samples_follow(
        recovered,
        p,
        f"{sampler.name}: the token drawn after a rejection whose residual max(0, p - q) is "
        "all zero (it should come from p)",
    )
