"""Chapter 6: speculative sampling, graded against exact probabilities.

Ground truth is the definition, not the course's code: the output at every position must be
distributed as the target p, whatever the draft q; the draft is kept with probability
sum_x min(p(x), q(x)); after a rejection the token follows max(0, p - q) renormalised; and the
layout (accepted prefix, one main-model token, then -1) is checked exactly on inputs where every
outcome is forced. Statistical checks use `assert_samples_follow` (chi-square, false failure
ALPHA = 1e-5 per comparison; each test states its total).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import TopPLogitsWarper

from tests.graded import _rejection as rejection
from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._oracles import BATCH_PROMPTS, first_difference, hf_greedy, hf_kept
from tests.graded._rejection import (
    OVERLAP,
    PAIRS,
    assert_all_untouched,
    assert_rate,
    min_mass,
    residual_of,
    tensors,
)
from tests.support import assert_samples_follow

CHAPTER = "06_speculative"

# --------------------------------------------------------------------------- rejection_sample_one

N_ONE = 8_000  # calls per pair: one token each


def run_one(impl, pair, n=N_ONE, seed=0):
    p, q = tensors(pair)
    before = (p.clone(), q.clone())
    g = torch.Generator().manual_seed(seed)
    tokens, kept = [], []
    for _ in range(n):
        token, accepted = impl.rejection_sample_one(p, q, g)
        tokens.append(int(token))
        kept.append(bool(accepted))
    assert_all_untouched((p, q), before, "rejection_sample_one")
    return p, q, torch.tensor(tokens), torch.tensor(kept)


@pytest.mark.rejection_sample_one
def test_one_uses_the_generator(impl):
    runs = [run_one(impl, OVERLAP, n=60, seed=s)[2:] for s in (5, 5, 6)]
    torch.manual_seed(123)  # the global generator must not matter
    again = run_one(impl, OVERLAP, n=60, seed=5)[2:]
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True)), (
        "the same generator seed must give the same tokens: draw every random number "
        "(the draft, u, the resample) with generator=generator"
    )
    assert all(torch.equal(a, b) for a, b in zip(runs[0], again, strict=True)), (
        "the global random state changed your tokens: pass generator=generator to every draw"
    )
    assert not torch.equal(runs[0][0], runs[2][0]), "different seeds must give different tokens"


@pytest.mark.rejection_sample_one
def test_acceptance_rate_is_the_overlap(impl):
    ps = torch.tensor([pair[0] for pair in PAIRS.values()])  # [4, V]
    qs = torch.tensor([pair[1] for pair in PAIRS.values()])
    before = (ps.clone(), qs.clone())
    got = impl.acceptance_rate(ps, qs)
    assert_all_untouched((ps, qs), before, "acceptance_rate")
    expected = torch.tensor([min_mass(p, q) for p, q in zip(ps, qs, strict=True)])
    assert tuple(got.shape) == (4,), (
        f"one rate per row: expected shape (4,), got {tuple(got.shape)}. Sum over the vocabulary "
        "only, the last dimension (dim=-1), not over the whole batch"
    )
    independent = (ps * qs).sum(dim=-1)
    if torch.allclose(got.float(), independent, atol=1e-6):
        pytest.fail(
            f"expected sum_x min(p(x), q(x)) = {expected.tolist()}, got sum_x p(x) q(x) = "
            f"{got.tolist()}: the chance that two INDEPENDENT draws agree. The draft x ~ q is "
            "kept with probability min(1, p(x) / q(x)): weighted by q(x), that is sum min(p, q)."
        )
    assert torch.allclose(got.float(), expected, atol=1e-6), (
        f"expected sum_x min(p(x), q(x)) = {expected.tolist()}, got {got.tolist()}. "
        f"{explain_difference(got.float(), expected, ('row',), atol=1e-6, rtol=0)} The draft "
        "x ~ q is kept with probability min(1, p(x) / q(x)); sum that over x, weighted by q(x)."
    )
    single = impl.acceptance_rate(ps[0], qs[0])
    assert single.shape == () and abs(float(single) - float(expected[0])) < 1e-6, (
        "a single pair of [d_vocab] distributions gives one number (sum over the last dim)"
    )


@pytest.mark.rejection_sample_one
@pytest.mark.parametrize("name", list(PAIRS))
def test_one_token_follows_the_target(impl, name):
    # False failure for a correct implementation: 4 comparisons, at most 4 * ALPHA.
    # The parts first (the kept rate, the kept tokens, the residual): each names its own
    # mistake. The whole, the token following p, comes last.
    p, q, tokens, kept = run_one(impl, PAIRS[name])
    a = min_mass(p, q)
    try:
        assert_rate(
            kept, a, f"{name}: the draft must be kept with probability sum min(p, q) = {a:.2f}"
        )
        if 0 < a:
            assert_samples_follow(
                tokens[kept],
                torch.minimum(p, q),
                f"{name}: the tokens you report as kept must be draft tokens that passed the "
                "test u < p(x) / q(x), which follow min(p, q)",
            )
        if a < 1:
            assert_samples_follow(
                tokens[~kept],
                residual_of(p, q),
                f"{name}: after a rejection the token must follow max(0, p - q), renormalised "
                "(not p itself: p would count the tokens the draft already covers twice; not "
                "|p - q|: that brings back the tokens q proposes more often than p wants)",
            )
        assert_samples_follow(
            tokens, p, f"{name}: the token must follow p whatever q is (is the draft drawn from q?)"
        )
    except AssertionError as err:
        diagnosis = rejection.diagnose_position(tokens, kept, p, q)
        raise rejection.diagnosed(diagnosis, err, f"rejection_sample_one, {name}") from None


@pytest.mark.rejection_sample_one
def test_rejection_sample_one_makes_its_tensors_on_the_inputs_device(impl):
    """On a GPU, a uniform drawn without `device=` sits on the CPU beside probabilities on the
    GPU (and a CPU generator cannot draw on the GPU); the source is read
    (tests/graded/_device.py)."""
    assert_made_on_the_inputs_device(
        impl.rejection_sample_one, "rejection_sample_one", "the probabilities"
    )


# --------------------------------------------------------------------------- rejection_sample

# The checks live in tests/graded/_rejection.py: chapter 10's kernel is graded by the same ones.


@pytest.mark.rejection_sample
def test_forced_outcomes_give_the_layout(impl):
    rejection.forced_outcomes_give_the_layout(impl.rejection_sample)


@pytest.mark.rejection_sample
def test_a_residual_of_zero_mass_draws_from_the_target(impl):
    rejection.zero_residual_draws_from_the_target(impl.rejection_sample)


@pytest.mark.rejection_sample
def test_rows_and_positions_draw_independently(impl):
    rejection.draws_are_independent(impl.rejection_sample)


@pytest.mark.rejection_sample
def test_greedy_keeps_the_argmax_run(impl):
    rejection.greedy_keeps_the_argmax_run(impl.rejection_sample)


@pytest.mark.rejection_sample
def test_batched_sampler_uses_the_generator(impl):
    rejection.batched_sampler_uses_the_generator(impl.rejection_sample)


@pytest.mark.rejection_sample
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_position_follows_the_target(impl, k):
    rejection.every_position_follows_the_target(impl.rejection_sample, k)


@pytest.mark.rejection_sample
@pytest.mark.parametrize("k", [2, 4])
def test_acceptance_and_recovered_tokens(impl, k):
    rejection.acceptance_and_recovered_tokens(impl.rejection_sample, k)


@pytest.mark.rejection_sample
def test_rejection_sample_makes_its_tensors_on_the_inputs_device(impl):
    """On a GPU, row numbers or an output table made without `device=` sit on the CPU beside
    probabilities on the GPU; the sampler reads values (multinomial), so it cannot run on the
    meta device, and its source is read instead (tests/graded/_device.py)."""
    assert_made_on_the_inputs_device(impl.rejection_sample, "rejection_sample", "the probabilities")


# --------------------------------------------------------------------------- ngram_propose


def ngram_by_definition(text: list[int], k: int, n: int) -> list[int]:
    """The definition, spelled out: every start s < len - n whose n tokens equal the last n;
    the latest such s wins; what follows it, up to k tokens."""
    starts = [s for s in range(len(text) - n) if text[s : s + n] == text[len(text) - n :]]
    return text[max(starts) + n : max(starts) + n + k] if starts and len(text) > n else []


@pytest.mark.ngram_propose
@pytest.mark.parametrize(
    ("text", "k", "n", "expected", "what"),
    [
        ([1, 2, 3, 4, 1, 2, 5, 6, 1, 2], 3, 2, [5, 6, 1], "the MOST RECENT earlier match wins"),
        ([7, 8, 9, 7, 8], 5, 2, [9, 7, 8], "fewer than k tokens follow the match: all of them"),
        ([1, 2, 3, 4, 5], 3, 2, [], "no earlier match: propose nothing"),
        ([5, 5, 5, 5], 2, 2, [5], "a match that overlaps the end counts, the end itself not"),
        ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], 4, 1, [3, 5], "n = 1: the latest earlier 5"),
        ([1, 2, 3, 9, 1, 2, 3, 8, 2, 3], 2, 3, [], "n = 3: only two of the three tokens match"),
        ([4, 2], 3, 2, [], "a text no longer than n"),
    ],
)
def test_ngram_cases(impl, text, k, n, expected, what):
    before = list(text)
    got = list(impl.ngram_propose(text, k, n))
    assert text == before, "ngram_propose must not change the text it reads"
    call = f"ngram_propose({before}, k={k}, n={n}) should be {expected}, got {got}"
    starts = [s for s in range(len(text) - n) if text[s : s + n] == text[len(text) - n :]]
    if expected and not got and starts == [0]:
        pytest.fail(
            f"{call}: nothing proposed, but the last {n} tokens occur earlier, at start 0, the "
            "very beginning of the text (and nowhere else). Does the search reach start 0? "
            "A backwards range stops one short of its stop value: the stop must lie below 0"
        )
    if starts and len(text) > n and got != expected:
        early = text[max(starts) + n - 1 : max(starts) + n - 1 + k]
        if got == early:
            pytest.fail(
                f"{call}: the proposal starts one token early, with the last token of the "
                f"match itself (the match starts at {max(starts)} and covers {n} tokens). The "
                "continuation is what comes right AFTER the n matched tokens"
            )
    if expected and not got:
        pytest.fail(
            f"{call}: nothing proposed, but the last {n} tokens occur earlier. Does the search "
            f"start at the end itself? At start = len(text) - n the last {n} tokens match "
            "themselves, and nothing follows them: the search starts one place earlier"
        )
    if len(starts) > 1 and got == text[min(starts) + n : min(starts) + n + k] != expected:
        pytest.fail(
            f"{call}: that follows the OLDEST earlier match. The most recent one wins: search "
            "backwards, from the latest earlier start down to 0, and stop at the first match"
        )
    shorter = ngram_by_definition(text, k, n - 1)
    if shorter != expected and got == shorter:
        pytest.fail(
            f"{call}: that follows the latest earlier occurrence of the last {n - 1} token(s), "
            f"so the search matched only the last n - 1 tokens. All n = {n} must match: compare "
            "the n tokens from each start with the text's last n"
        )
    if len(expected) == k and got == expected[:-1]:
        pytest.fail(
            f"{call}: one token fewer than k. Propose the k tokens after the match, "
            "text[start + n : start + n + k] (fewer only where the text ends first)"
        )
    assert got == expected, f"{what}: {call}"


@pytest.mark.ngram_propose
def test_ngram_matches_the_definition_on_random_texts(impl):
    g = torch.Generator().manual_seed(5)
    for trial in range(300):
        length = int(torch.randint(1, 30, (), generator=g))
        text = torch.randint(0, 4, (length,), generator=g).tolist()
        k, n = trial % 5 + 1, trial % 3 + 1
        expected = ngram_by_definition(text, k, n)
        got = list(impl.ngram_propose(list(text), k, n))
        assert got == expected, (
            f"ngram_propose({text}, k={k}, n={n}) should be {expected}, got {got}: the k tokens "
            "after the latest earlier start of the last n tokens"
        )


# --------------------------------------------------------------------------- ModelDrafter.accept


def hf_next_probs(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0, -1].softmax(-1)


def drafter_mistake(hf_draft, q, prev: list[int], d: list[int], n: int, token: int) -> str:
    """The known mistake whose text the drafter's distribution `q` is HF's on, if any: the round
    started from `prev`, proposed drafts `d`, kept the first n and the main model gave `token`."""
    k = len(d)
    # The round fed `pending`, then drafts 0 .. k-2; the last draft was proposed, never fed.
    last = [d[-1]] if n == k else []
    flags = [j < n for j in range(k)]
    texts = [
        (
            prev + d[: k - 1] + last + [token],
            "it still reads the drafts the main model rejected. Trim its cache to the drafts "
            "kept (keep_only): this round fed `pending` and drafts 0 .. k-2",
        ),
        (
            prev + d[:n] + [d[-1]] + [token],
            "the last draft is queued in `pending` although it was rejected. It goes before the "
            "main model's token only when all k drafts were kept",
        ),
        (
            prev + [d[j] for j in range(k - 1) if flags[j + 1]] + last + [token],
            "the fed drafts are matched with the wrong acceptance flags (off by one). This round "
            "fed `pending`, then drafts 0 .. k-2: draft j's flag is the j-th, not the one after",
        ),
        (
            prev + d[:n] + [d[-1]],
            "the main model's token is never fed to it: queue next_token in `pending` (after "
            "the last draft when all k were kept)",
        ),
    ]
    for text, mistake in texts:
        if text != prev + d[:n] + [token] and torch.allclose(
            q, hf_next_probs(hf_draft, text), atol=1e-4
        ):
            return mistake
    return ""


@pytest.mark.model_drafter
@pytest.mark.parametrize("rows", [[0, 1, 2], [1]], ids=["batch-of-three", "one-row"])
def test_drafter_forgets_the_rejected_drafts(impl, drafter_model, hf_draft, shipped, rows):
    tokenizer = shipped[1]
    prompts = [tokenizer.encode(BATCH_PROMPTS[r]) for r in rows]
    # Per row: two drafts kept / all four kept / none kept, in two rounds.
    decisions = torch.tensor([[True, True, False, False], [True, True, True, True], [False] * 4])[
        rows
    ]
    width = max(map(len, prompts))
    tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    drafter = impl.ModelDrafter(drafter_model)
    drafter.start(tokens, mask)
    texts = [list(p) for p in prompts]
    done = torch.zeros(len(rows), dtype=torch.bool)
    for round_ in (1, 2):
        with torch.no_grad():
            drafts, _ = drafter.propose(4, temperature=0.0, top_k=None, top_p=None, generator=None)
        n = decisions.sum(dim=1)
        # The main model's token: one the drafter did not propose (any id will do).
        next_token = torch.tensor([(int(drafts[i, min(int(n[i]), 3)]) + 17) % 4096 for i in
                                   range(len(rows))])  # fmt: skip
        drafter.accept(accepted=decisions, drafts=drafts, next_token=next_token, done=done)
        before = [list(t) for t in texts]
        for i in range(len(rows)):
            texts[i] += drafts[i, : int(n[i])].tolist() + [int(next_token[i])]
        probe = copy.copy(drafter)  # proposing changes the drafter: probe a copy
        with torch.no_grad():
            _, q = probe.propose(1, temperature=1.0, top_k=None, top_p=None, generator=None)
        for i in range(len(rows)):
            expected = hf_next_probs(hf_draft, texts[i])
            if not torch.allclose(q[i, 0], expected, atol=1e-4):
                mistake = drafter_mistake(
                    hf_draft, q[i, 0], before[i], drafts[i].tolist(), int(n[i]), int(next_token[i])
                )
                if mistake:
                    pytest.fail(
                        f"round {round_}, row {i}, {int(n[i])} of 4 drafts kept: the drafter's "
                        f"next distribution is the draft model's on another text: {mistake}"
                    )
                pytest.fail(
                    f"round {round_}, row {i}, {int(n[i])} of 4 drafts kept: the drafter's next "
                    "distribution is not the draft model's on the accepted text (HF on the "
                    "prompt + the kept drafts + the main model's token). Are rejected drafts "
                    "still in its cache? Is the main model's token queued in `pending` (and, when "
                    "all k were kept, the last draft too: it was proposed, never fed)?"
                )


# --------------------------------------------------------------------------- speculative_round

SPEC_PROMPTS = BATCH_PROMPTS + ["VIOLA.\nWhat country, friends, is this?\n\nCAPTAIN.\n"]
"""Four prompts of 18, 6, 18 and 21 tokens: a left-padded batch whose rows accept different
numbers of drafts."""


@pytest.fixture(scope="module")
def hf_greedy_texts(hf, shipped):
    tokenizer = shipped[1]
    return [tokenizer.decode(hf_greedy(hf, tokenizer.encode(p), 40)) for p in SPEC_PROMPTS]


class FixedDrafter:
    """A drafter whose drafts the test chooses: a sure guess (q one-hot at each draft)."""

    def __init__(self, drafts: torch.Tensor):
        self.drafts = drafts

    def propose(self, k, **_sampling):
        return self.drafts[:, :k].clone(), None

    def accept(self, **_outcome):
        pass


ROUND_PROMPTS = [SPEC_PROMPTS[0], SPEC_PROMPTS[1], SPEC_PROMPTS[3]]
ROUND_KEPT = [2, 4, 0]
"""One greedy round of k = 4 drafts on prompts of 18, 6 and 21 tokens (a left-padded batch):
row r's first ROUND_KEPT[r] drafts are greedy's next tokens, the next one is not."""


@pytest.mark.speculative_round
def test_one_round_keeps_the_accepted_drafts_in_the_cache(impl, shipped, hf):
    # Exact. Ground truth: HF's greedy generate for the tokens, HF's logits on the accepted
    # text for the cache (read through the next pass).
    model, tokenizer = shipped
    k = 4
    texts = [tokenizer.encode(p) for p in ROUND_PROMPTS]
    greedy = [hf_greedy(hf, t, k + 1)[len(t) :] for t in texts]
    assert all(len(g) == k + 1 for g in greedy), "test set-up: greedy must not stop early"
    rows = []
    for g, kept in zip(greedy, ROUND_KEPT, strict=True):
        rows.append(g[:kept] + [(t + 1) % model.cfg.d_vocab for t in g[kept:k]])
    drafts = torch.tensor(rows)
    cache, _, last = impl.start_speculation(
        model, None, [list(t) for t in texts], tokenizer.eos_token_id, drafter="ngram"
    )
    sampling = {"temperature": 0.0, "top_k": None, "top_p": None}
    done = torch.zeros(len(texts), dtype=torch.bool)
    try:
        with torch.no_grad():
            tokens, n_new, cache = impl.speculative_round(
                model, cache, last, FixedDrafter(drafts), k, sampling, None, done
            )
    except ValueError as err:
        if "target_probs" not in str(err):
            raise
        pytest.fail(
            "the main model's probabilities do not cover k + 1 positions: is the main model fed "
            "[last, drafts] (the newest token, then the k drafts)? Its logits at `last` score "
            "draft 0, at draft i they score draft i + 1, and at the last draft they give the "
            f"bonus token. rejection_sample said: {err}"
        )
    expected = [
        g[: kept + 1] + [-1] * (k - kept) for g, kept in zip(greedy, ROUND_KEPT, strict=True)
    ]
    assert tokens.tolist() == expected and n_new.tolist() == [n + 1 for n in ROUND_KEPT], (
        f"greedy, drafts {rows}: expected tokens {expected} and n_new "
        f"{[n + 1 for n in ROUND_KEPT]} (the accepted drafts, then the main model's own "
        f"token), got {tokens.tolist()} and {n_new.tolist()}"
    )
    for r, (text, kept) in enumerate(zip(texts, ROUND_KEPT, strict=True)):
        held = cache.tokens[r][cache.mask[r]].tolist()
        want = text + greedy[r][:kept]  # the cache: the text but the main model's new token
        if len(held) > len(want) and held[: len(text)] == text:
            pytest.fail(
                f"row {r} kept {kept} of {k} drafts, but the main model's cache still holds the "
                f"rejected drafts: {len(held)} real tokens, expected {len(want)} (its prompt, "
                "`last` and the accepted drafts). Rejected drafts never happened: drop them "
                "from the cache (keep_only with a mask of the kept columns)"
            )
        if held != want:
            pytest.fail(
                f"row {r} kept {kept} of {k} drafts: the main model's cache keeps the wrong "
                f"columns of the pass (its last {k + 1} real tokens are {held[-(k + 1) :]}, "
                f"expected {want[-(k + 1) :]}). Column 0 of the pass is `last`, always kept; "
                "column i + 1 is draft i, kept iff accepted[:, i]"
            )
    with torch.no_grad():
        logits, _ = impl.forward_with_cache(model, tokens.gather(1, (n_new - 1)[:, None]), cache)
        for r, (text, kept) in enumerate(zip(texts, ROUND_KEPT, strict=True)):
            expected_logits = hf(torch.tensor([text + greedy[r][: kept + 1]])).logits[0, -1]
            assert torch.allclose(logits[r, -1], expected_logits, atol=1e-3), (
                f"row {r}: the next pass through the returned cache does not give HF's logits "
                "on the accepted text. Does the cache keep the keys of `last` and of the "
                "accepted drafts as the pass computed them?"
            )


@pytest.mark.speculative_round
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_speculation_equals_greedy_generate(
    impl, shipped, drafter_model, hf_greedy_texts, drafter, k
):
    model, tokenizer = shipped
    for rows in ([0], [0, 1, 2, 3]):
        got = impl.speculative_generate(
            model, drafter_model, tokenizer, [SPEC_PROMPTS[r] for r in rows], k=k,
            max_tokens_generated=40, temperature=0.0, drafter=drafter,
        )  # fmt: skip
        for r, text in zip(rows, got, strict=True):
            expected = hf_greedy_texts[r]
            if text != expected:
                common = first_difference(text, expected)
                pytest.fail(
                    f"{drafter} drafter, k={k}, batch of {len(rows)}, prompt {r}: at temperature "
                    "0 speculation must give greedy generate's text exactly. Is the main model "
                    "fed [last, drafts] and its cache trimmed to the accepted drafts "
                    "(keep_only)? Does each row take its own number of new tokens? It differs "
                    f"after {expected[:common]!r}:\n  expected "
                    f"...{expected[common : common + 40]!r}\n  got      "
                    f"...{text[common : common + 40]!r}"
                )


N_COPIES = 1_500


def first_tokens(impl, shipped, drafter_model, drafter, n=N_COPIES, k=3, **sampling):
    """n continuations of one prompt, 2 tokens each, in one batch: their new token ids."""
    model, tokenizer = shipped
    prompt = "ROMEO.\nBut soft, what"
    rows = impl.speculative_generate(
        model, drafter_model, tokenizer, [prompt] * n, k=k, max_tokens_generated=2,
        seed=0, stop_at_eos=False, drafter=drafter, return_ids=True, **sampling,
    )  # fmt: skip
    ids = tokenizer.encode(prompt)
    out = [list(r)[len(ids) :] for r in rows]
    assert all(len(o) == 2 for o in out), "each text must hold exactly 2 new tokens"
    return ids, torch.tensor(out)


@pytest.mark.speculative_round
def test_speculation_uses_the_seed(impl, shipped, drafter_model):
    model, tokenizer = shipped
    runs = [
        impl.speculative_generate(
            model,
            drafter_model,
            tokenizer,
            SPEC_PROMPTS[:2],
            k=3,
            max_tokens_generated=20,
            seed=seed,
            temperature=1.0,
        )  # fmt: skip
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1], (
        "the same seed must give the same texts: is the generator passed on to every draw "
        "(rejection_sample(..., generator=generator), as the drafter gets it)?"
    )
    assert runs[0] != runs[2], "different seeds must give different texts"


@pytest.mark.speculative_round
def test_top_p_applies_to_both_models(impl, shipped, drafter_model, hf):
    # False failure: ALPHA. Top-p and temperature shape the main model's distribution, and the
    # draft's the same way; what comes out follows the main model's shaped distribution.
    ids, out = first_tokens(
        impl, shipped, drafter_model, "model", n=800, k=2, temperature=0.7, top_p=0.8
    )
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1:] / 0.7
    kept = hf_kept(TopPLogitsWarper(0.8), logits)[0]
    assert_samples_follow(
        out[:, 0],
        logits[0].softmax(-1) * kept,
        "temperature 0.7 and top_p 0.8: the first token must follow the main model's "
        "distribution after both (HF's TopPLogitsWarper). Are the main model's probabilities "
        "shaped by the same temperature, top_k and top_p as the drafter's?",
    )


@pytest.mark.speculative_round
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_speculative_tokens_follow_the_main_model(impl, shipped, drafter_model, hf, drafter):
    # False failure: 2 comparisons, at most 2 * ALPHA.
    ids, out = first_tokens(impl, shipped, drafter_model, drafter, temperature=1.0)
    with torch.no_grad():
        p0 = hf(torch.tensor([ids])).logits[0, -1].softmax(-1)
    assert_samples_follow(
        out[:, 0], p0, f"{drafter} drafter: the first new token must follow the main model"
    )
    top = int(out[:, 0].mode().values)
    with torch.no_grad():
        p1 = hf(torch.tensor([ids + [top]])).logits[0, -1].softmax(-1)
    assert_samples_follow(
        out[out[:, 0] == top, 1],
        p1,
        f"{drafter} drafter: the second token (drafted and checked in the same round) must "
        "follow the main model given the first",
    )
