"""Chapter 6, lookahead decoding: graded against HF and exact probabilities.

Ground truth: each token of a lookahead pass must get the logits HF's model gives the text its
mask lets it read (one token per position, no gaps); at temperature 0 the text must be HF's
greedy `generate`; sampling, every emitted token must follow the model's distribution given the
tokens before it (chi-square, `assert_samples_follow`, false failure ALPHA = 1e-5 per
comparison; each test states its total).
"""

from __future__ import annotations

import pytest
import torch

from tests.graded._device import assert_made_on_the_inputs_device
from tests.graded._explain import explain_difference
from tests.graded._gumbel import TEMPERATURE_AFTER_NOISE
from tests.graded._oracles import BATCH_PROMPTS, first_difference, hf_greedy
from tests.support import assert_samples_follow, follows

CHAPTER = "06_speculative"

# (levels, window, candidates, ngram): a window still filling, a full one, no candidates, 2-grams.
LAYOUTS = [(1, 4, 2, 3), (2, 4, 3, 3), (3, 5, 2, 4), (2, 3, 0, 3), (1, 5, 4, 2)]


def describe(q: int, levels: int, window: int, ngram: int) -> str:
    """A row of the pass in words."""
    if q == 0:
        return "`last` (row 0)"
    if q <= levels * window:
        j, i = divmod(q - 1, window)
        return f"window level {j}, column {i} (row {q})"
    g, k = divmod(q - 1 - levels * window, ngram - 1)
    return f"candidate {g}, token {k} (row {q})"


def layout_of(impl, levels, window, candidates, ngram):
    offsets, allowed = impl.lookahead_layout(levels, window, candidates, ngram)
    n = 1 + levels * window + candidates * (ngram - 1)
    assert tuple(offsets.shape) == (n,) and tuple(allowed.shape) == (n, n), (
        f"{levels} levels of {window}, {candidates} candidates of {ngram - 1}: the pass has {n} "
        f"tokens; expected offsets ({n},) and allowed ({n}, {n}), got {tuple(offsets.shape)} and "
        f"{tuple(allowed.shape)}"
    )
    assert allowed.dtype == torch.bool, f"allowed must be a bool tensor, got {allowed.dtype}"
    return offsets.long(), allowed


@pytest.mark.lookahead_layout
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "L{}-W{}-G{}-N{}".format(*t))
def test_positions_follow_the_definition(impl, layout):
    levels, window, candidates, ngram = layout
    offsets, _ = layout_of(impl, *layout)
    for q in range(len(offsets)):
        if q == 0:
            expected = 0
        elif q <= levels * window:
            j, i = divmod(q - 1, window)
            expected = i + j + 1
        else:
            expected = (q - 1 - levels * window) % (ngram - 1) + 1
        got = int(offsets[q])
        if got == expected:
            continue
        hint = (
            "Level j, column i guesses position i + j + 1 (level 0 starts right after `last`, "
            "each level one further on); candidate token k is at k + 1."
        )
        if 0 < q <= levels * window:
            j, i = divmod(q - 1, window)
            if j > 0 and got == i + 1:
                hint = (
                    f"Level {j} sits where level 0 does: each level guesses one position further "
                    "on than the level before it. Level j, column i guesses position i + j + 1."
                )
            elif got == i + j:
                hint = (
                    "Off by one: `last` is at offset 0, and level 0, column 0 guesses the token "
                    "right after it, at 1. Level j, column i guesses position i + j + 1."
                )
        elif q > 0 and got == expected - 1:
            hint = (
                "Off by one: candidate token k sits at k + 1 (its first token right after "
                "`last`, which is at 0)."
            )
        pytest.fail(
            f"{describe(q, levels, window, ngram)} sits {expected} after `last`, got {got}. {hint}"
        )


@pytest.mark.lookahead_layout
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "L{}-W{}-G{}-N{}".format(*t))
def test_branches_never_read_each_other(impl, layout):
    levels, window, candidates, ngram = layout
    _, allowed = layout_of(impl, *layout)
    first = 1 + levels * window
    branch = torch.zeros(len(allowed), dtype=torch.long)  # 0: last, 1: window, 2 + g: candidate
    branch[1:first] = 1
    for g in range(candidates):
        branch[first + g * (ngram - 1) : first + (g + 1) * (ngram - 1)] = 2 + g
    for q in range(1, len(allowed)):
        for k in allowed[q].nonzero()[:, 0].tolist():
            if k != 0 and branch[k] != branch[q]:
                pytest.fail(
                    f"{describe(q, levels, window, ngram)} may read "
                    f"{describe(k, levels, window, ngram)}: the branches of a pass must not see "
                    "each other. A guess that reads a candidate (or a candidate that reads "
                    "another one or the window) is computed from a text nobody wrote."
                )


@pytest.mark.lookahead_layout
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "L{}-W{}-G{}-N{}".format(*t))
def test_every_token_reads_one_whole_text(impl, layout):
    levels, window, candidates, ngram = layout
    offsets, allowed = layout_of(impl, *layout)
    for q in range(len(allowed)):
        keys = allowed[q].nonzero()[:, 0]
        seen = sorted(offsets[keys].tolist())
        want = list(range(int(offsets[q]) + 1))
        assert bool(allowed[q, q]) and bool(allowed[q, 0]), (
            f"{describe(q, levels, window, ngram)} must read `last` and itself"
        )
        if 0 < q <= levels * window:
            j, i = divmod(q - 1, window)
            column = [1 + level * window + i for level in range(j + 1)]
            assert bool(allowed[q, column].all()), (
                f"{describe(q, levels, window, ngram)} must read its own column's earlier "
                "levels (its trajectory): that is what makes the column an n-gram the model wrote"
            )
            level0 = [1 + c for c in range(i)]
            own = [1 + j * window + c for c in range(i)]
            if j > 0 and i > 0 and not allowed[q, level0].all() and allowed[q, own].any():
                pytest.fail(
                    f"{describe(q, levels, window, ngram)} reads its own level's earlier columns "
                    f"(level {j}) instead of level 0's: the text before its column is level 0, "
                    f"columns 0..{i - 1} (the oldest guesses, one per position 1..{i}), then its "
                    "own column's trajectory"
                )
        assert seen == want, (
            f"{describe(q, levels, window, ngram)} at offset {int(offsets[q])} reads tokens at "
            f"offsets {seen}: it must read exactly one token at each of 0..{int(offsets[q])}, a "
            "text with no gap and no position twice"
        )


@pytest.mark.lookahead_layout
def test_a_pass_gives_each_token_the_logits_of_its_text(impl, shipped, hf):
    # The layout through the real model (the course's cached forward pass, explicit positions
    # and mask): each token's logits must be HF's on the text that token reads.
    model, tokenizer = shipped
    prompt = tokenizer.encode(BATCH_PROMPTS[0])
    levels, window, candidates, ngram = 2, 4, 2, 3
    offsets, allowed_new = layout_of(impl, levels, window, candidates, ngram)
    n = len(offsets)
    feed = torch.randint(5, 4000, (n,), generator=torch.Generator().manual_seed(1))
    feed[0] = prompt[-1]
    with torch.no_grad():
        _, cache = impl.forward_with_cache(model, torch.tensor([prompt[:-1]]))
        past = cache.length
        allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), allowed_new], dim=1)
        logits, _ = impl.forward_with_cache(
            model, feed[None], cache, positions=past + offsets, allowed=allowed
        )
    for q in range(n):
        keys = allowed_new[q].nonzero()[:, 0]
        keys = keys[offsets[keys].argsort()]
        text = prompt[:-1] + feed[keys].tolist()
        with torch.no_grad():
            expected = hf(torch.tensor([text])).logits[0, -1]
        assert torch.allclose(logits[0, q], expected, atol=1e-3), (
            f"{describe(q, levels, window, ngram)}: its logits are not HF's on the text its row of "
            "the mask lets it read. "
            + explain_difference(logits[0, q], expected, ("d_vocab",), atol=1e-3, rtol=0)
            + " Are `offsets` and `allowed` consistent (each key at its own position)?"
        )


@pytest.mark.lookahead_harvest
def test_harvest_takes_each_columns_trajectory(impl):
    # levels[j, i] guesses position i + j + 1, new[i] position i + levels + 1: an n-gram is the
    # consecutive positions of ONE column, oldest guess first (the key), the new token last.
    levels = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    new = torch.tensor([41, 42, 43, 44])
    got = impl.harvest(levels, new)
    expected = [(10 + i, (20 + i, 30 + i, 40 + i)) for i in range(1, 5)]
    got = [(int(k), tuple(int(t) for t in c)) for k, c in got]
    mistakes = {
        "each n-gram is keyed on its LAST token (the new one): key it on its FIRST token, "
        "levels[0, i], the one the verification branch will find as `last`": [
            (40 + i, (10 + i, 20 + i, 30 + i)) for i in range(1, 5)
        ],
        "those are the rows of levels (and of new) read as n-grams: a row is one level, one "
        "Jacobi iterate of the whole window. An n-gram is a COLUMN, one position per level": [
            (10 * j + 1, (10 * j + 2, 10 * j + 3, 10 * j + 4)) for j in range(1, 5)
        ],
        "the oldest level, levels[0], is left out: an n-gram starts with the oldest guess of "
        "its column (its key), then the later levels, then new[i]": [
            (20 + i, (30 + i, 40 + i)) for i in range(1, 5)
        ],
    }
    for mistake, wrong in mistakes.items():
        if sorted(got) == wrong:
            pytest.fail(
                f"expected the 4-grams (key, continuation) {expected}, got {got}: {mistake}"
            )
    assert sorted(got) == expected, (
        f"expected the 4-grams (key, continuation) {expected}, got {got}. Column i's n-gram is "
        "levels[0, i], ..., levels[-1, i], new[i]; it is keyed on its FIRST token, the one the "
        "verification branch will find as `last`."
    )
    one = [(int(k), tuple(int(t) for t in c)) for k, c in impl.harvest(levels[:1], new)]
    assert sorted(one) == [(10 + i, (40 + i,)) for i in range(1, 5)], (
        "with one level (2-grams): (levels[0, i], (new[i],))"
    )


# --------------------------------------------------------------------------- verify

V = 8
LOGITS = torch.tensor([
    [2.0, 1.4, 0.3, -0.5, 0.8, -1.0, 0.0, 0.6],  # after `last`
    [0.1, 1.9, -0.4, 1.2, 0.0, 0.7, -1.5, 0.2],  # after token 1
    [-0.3, 0.4, 1.1, 0.9, 1.6, 0.0, 0.2, -0.8],  # after 1, 1
    [0.5, -0.2, 1.0, 0.3, -0.6, 1.3, 0.8, 0.0],  # after 1, 3
    [1.0, 0.2, -0.7, 0.4, 0.6, 0.1, 1.5, -0.3],  # after 0
])  # fmt: skip
CANDIDATES = torch.tensor([[1, 1], [1, 3], [0, 6], [4, 2]])
"""Four candidates after `last`: two start with token 1 (p = 0.22), one with the likeliest
token 0, one with 4. Their logits: what a model would give after each prefix."""


def candidate_logits() -> torch.Tensor:
    after = {(1,): 1, (1, 1): 2, (1, 3): 3, (0,): 4}
    rows = []
    for cand in CANDIDATES.tolist():
        rows.append([LOGITS[after.get(tuple(cand[:1]), 4)], LOGITS[after.get(tuple(cand), 4)]])
    return torch.stack([torch.stack(r) for r in rows])  # [4, 2, V]


def draws(impl, n, temperature, seed=0):
    g = torch.Generator().manual_seed(seed)
    first, cands = LOGITS[0].clone(), candidate_logits()
    out = [impl.verify(first, cands, CANDIDATES, temperature, g) for _ in range(n)]
    assert torch.equal(first, LOGITS[0]) and torch.equal(cands, candidate_logits()), (
        "verify must not change the logits it is given"
    )
    return out


@pytest.mark.lookahead_verify
def test_greedy_verify_keeps_the_longest_argmax_run(impl):
    cands = candidate_logits()
    emitted, best, run = impl.verify(LOGITS[0], cands, CANDIDATES, 0.0, None)
    # argmax after `last` is 0, and after 0 it is 6: candidate 2 (0, 6) is kept whole, then the
    # argmax after it (row 4 of its logits: after (0, 6) the pass gives cands[2, 1]).
    bonus = int(cands[2, 1].argmax())
    picks = torch.cat([LOGITS[0].expand(len(CANDIDATES), 1, -1), cands], dim=1).argmax(-1)
    late = (picks[:, 1:] == CANDIDATES).int().cumprod(dim=1).sum(dim=1)  # a known mistake's runs
    if (int(best), int(run)) == (int(late.argmax()), int(late.max())) != (2, 2):
        pytest.fail(
            f"temperature 0: you kept candidate {int(best)} with a run of {int(run)}: that is "
            "what comes out when candidate token j is compared with the model's choice one "
            "position LATER (its choice after token j itself). Token 0 of a candidate must "
            "equal the model's choice after `last`, token j its choice after the candidate's "
            f"first j tokens. Expected ([0, 6, {bonus}], 2, 2), got ({emitted}, {best}, {run})"
        )
    if int(best) != 2 and int(run) < 2:
        pytest.fail(
            f"temperature 0: candidate 2 (0, 6) has the longest run, 2 (the argmax after `last` "
            f"is 0, after 0 it is 6), but you kept candidate {int(best)} (run {int(run)}): choose "
            f"the candidate with the longest run (the argmax of the runs). Expected "
            f"([0, 6, {bonus}], 2, 2), got ({emitted}, {best}, {run})"
        )
    assert (list(emitted), int(best), int(run)) == ([0, 6, bonus], 2, 2), (
        f"temperature 0: the argmax after `last` is 0 and after 0 it is 6, so candidate 2 (0, 6) "
        f"is kept whole and the model adds its argmax {bonus}: expected ([0, 6, {bonus}], 2, 2), "
        f"got ({emitted}, {best}, {run})"
    )
    lone, _, run = impl.verify(LOGITS[0], cands[:1], CANDIDATES[:1], 0.0, None)
    assert (list(lone), int(run)) == ([0], 0), (
        f"candidate 0 (1, 1) alone: its first token is not the argmax after `last` (0), so "
        "nothing of it is kept, though its second token is the argmax after 1. A run stops at "
        "the first mismatch: count the leading matches only (the cumulative product of the "
        f"matches, not their sum). Expected [0] with run 0, got {lone} with run {run}"
    )
    none, best, run = impl.verify(LOGITS[0], cands[1:2], CANDIDATES[1:2], 0.0, None)
    assert (list(none), int(run)) == ([0], 0), (
        f"a candidate whose first token is not the argmax keeps nothing: the model's own token "
        f"(0) alone. Got {none} with run {run}"
    )
    empty, _, run = impl.verify(LOGITS[0], cands[:0], CANDIDATES[:0], 0.0, None)
    assert (list(empty), int(run)) == ([0], 0), "no candidates: the model's own token alone"


@pytest.mark.lookahead_verify
def test_verify_uses_the_generator(impl):
    runs = [[e for e, _, _ in draws(impl, 40, 1.0, seed=s)] for s in (4, 4, 5)]
    torch.manual_seed(99)
    again = [e for e, _, _ in draws(impl, 40, 1.0, seed=4)]
    assert runs[0] == runs[1] == again, (
        "the same generator must give the same tokens: draw the noise with generator=generator"
    )
    assert runs[0] != runs[2], "different seeds must give different tokens"


N_VERIFY = 6_000


@pytest.mark.lookahead_verify
def test_verified_tokens_follow_the_model(impl):
    # False failure: 3 comparisons, at most 3 * ALPHA. Exact verification: the first emitted
    # token follows p(. | last) whatever the candidates are; the second, given the first,
    # follows the model after it (token 1: two candidates share it).
    temperature = 0.8
    out = draws(impl, N_VERIFY, temperature)
    first = torch.tensor([e[0] for e, _, _ in out])
    try:
        assert_samples_follow(
            first,
            (LOGITS[0] / temperature).softmax(-1),
            "the first emitted token must follow softmax(logits / T) after `last`: candidates "
            "may only decide how many tokens one pass emits, never which. Fresh noise for each "
            "candidate gives the likely first tokens of several candidates several chances",
        )
    except AssertionError as err:
        if follows(first, LOGITS[0].double().softmax(-1)):
            raise AssertionError(
                f"the first emitted token, at temperature {temperature}: "
                f"{TEMPERATURE_AFTER_NOISE}\n{err}"
            ) from None
        if follows(first, (LOGITS[0].double().softmax(-1) / temperature).softmax(-1)):
            raise AssertionError(
                f"the first emitted token, at temperature {temperature}, follows a softmax of "
                "the PROBABILITIES divided by T (a nearly flat distribution), not of the logits: "
                "is the Gumbel noise added to the probabilities? argmax(scores + G) draws from "
                "softmax(scores): the scores are the logits divided by T, with no softmax "
                f"first.\n{err}"
            ) from None
        raise
    for token, row in ((1, 1), (0, 4)):
        second = torch.tensor([e[1] for e, _, _ in out if e[0] == token])
        assert_samples_follow(
            second,
            (LOGITS[row] / temperature).softmax(-1),
            f"after a first token {token}, the second emitted token must follow the model's "
            f"distribution after {token}, whichever candidate it came from",
        )
    lengths = torch.tensor([len(e) for e, _, _ in out])
    run = torch.tensor([int(r) for _, _, r in out])
    assert torch.equal(lengths, run + 1), "emitted = the kept run, then one token of the model"


# --------------------------------------------------------------------------- lookahead_round

LOOKAHEAD_PROMPTS = [BATCH_PROMPTS[1], BATCH_PROMPTS[0], BATCH_PROMPTS[2] + " once more"]
"""Prompts of 6, 18 and 20 tokens."""


@pytest.fixture(scope="module")
def hf_greedy_ids(hf, shipped):
    tokenizer = shipped[1]
    return [hf_greedy(hf, tokenizer.encode(p), 50) for p in LOOKAHEAD_PROMPTS]


ROUND_PROMPT = "HAMLET.\nMy lord, my lord, my liege, my"
"""Its last token, " my", starts two of its own 3-grams: (" liege", ","), the most recent, then
(" lord", ","). Greedy decoding continues " lord", ",": with `pool_from_prompt=True` the first
pass checks candidate 0, which matches greedy at position 1 but not at position 0, and
candidate 1, kept whole."""


def hf_last_logits(hf, ids: list[int], positions: list[int] | None = None) -> torch.Tensor:
    """HF's logits after `ids`, with explicit position ids if given."""
    extra = {} if positions is None else {"position_ids": torch.tensor([positions])}
    with torch.no_grad():
        return hf(torch.tensor([ids]), **extra).logits[0, -1]


@pytest.mark.lookahead_round
def test_one_round_emits_greedys_tokens_and_caches_the_kept_run(impl, shipped, hf):
    # Exact, greedy, one pass. Ground truth: HF's generate for the tokens; for the cache, HF's
    # logits on the text it must hold, read through the next token.
    model, tokenizer = shipped
    ids = tokenizer.encode(ROUND_PROMPT)
    window, ngram, guesses = 4, 3, 4
    state = impl.start_lookahead(model, ids, window, ngram, guesses, pool_from_prompt=True)
    past = state.cache.length
    candidates = [list(c) for c in state.pool.candidates(ids[-1])[:guesses]]
    level0 = state.levels[0].tolist()
    n_pass = 1 + state.levels.numel() + len(candidates) * (ngram - 1)
    greedy = hf_greedy(hf, ids, 3)[len(ids) :]
    assert (
        past == len(ids) - 1
        and len(candidates) == 2
        and candidates[0][0] != greedy[0]
        and candidates[0][1] == greedy[1]
        and candidates[1] == greedy[:2]
    ), "the test's prompt no longer fits the test"
    with torch.no_grad():
        emitted, _ = impl.lookahead_round(model, state, ngram, guesses, 0.0, None)
    emitted = list(emitted)
    if emitted != greedy:
        from_zero = all(
            int(hf_last_logits(hf, ids + emitted[:i], [*range(past), *range(i + 1)]).argmax())
            == emitted[i]
            for i in range(len(emitted))
        )
        if from_zero:
            pytest.fail(
                f"one greedy pass emitted {emitted}, expected {greedy} (HF's generate): those "
                "are the argmaxes of a pass whose positions start at 0 again, after a cache of "
                f"{past} tokens. The pass's positions are past + offsets: `last` sits right "
                "after the cache, at position past (the cache's length)"
            )
        alone = int(hf_last_logits(hf, ids[-1:], [past]).argmax())
        if emitted and emitted[0] == alone != greedy[0]:
            pytest.fail(
                f"one greedy pass emitted {emitted}, expected {greedy} (HF's generate): its "
                "first token is the model's argmax after `last` alone, so the pass does not "
                "read the cache. Every token of the pass reads the whole cache: `allowed` "
                "starts with past columns of True"
            )
        pytest.fail(
            f"one greedy pass emitted {emitted}, expected {greedy} (HF's generate): candidate "
            f"1 {candidates[1]} agrees with greedy decoding, so its whole run is kept, then the "
            "model's argmax after it"
        )
    held = state.cache.tokens[0, : state.cache.length].tolist()
    want = ids + emitted[:-1]  # `last`, then the kept run: the text but the newest token
    run = len(emitted) - 1
    if len(held) == past + n_pass:
        pytest.fail(
            f"after the pass the cache holds {len(held)} tokens, expected {len(want)}: it kept "
            "every token of the pass, the window and every candidate. Keep only `last` and the "
            "chosen candidate's kept run (keep_only): the rest were guesses"
        )
    if held == ids[:-1] + emitted[:-1]:
        pytest.fail(
            f"after the pass the cache lost `last` ({ids[-1]}): it holds {len(held)} tokens, "
            f"expected {len(want)}. Keep the first past + 1 columns: the cache, then `last`"
        )
    if held == ids + level0[:run] != want:
        pytest.fail(
            f"after the pass the cache keeps the window's guesses (level 0, columns 0.."
            f"{run - 1}) instead of the chosen candidate's run {emitted[:-1]}. The run's keys "
            "sit at past + first + best * (ngram - 1), where `first` is the pass's index of "
            "candidate 0"
        )
    if held == ids + candidates[0][:run] != want:
        pytest.fail(
            f"after the pass the cache keeps candidate 0's first {run} tokens, but the chosen "
            f"candidate is candidate 1 {candidates[1]}: its run's keys start at past + first + "
            "best * (ngram - 1)"
        )
    assert held == want, (
        f"after the pass the cache holds the tokens {held[past:]} after the prompt's first "
        f"{past}, expected {want[past:]}: `last`, then the chosen candidate's kept run"
    )
    with torch.no_grad():
        logits, _ = impl.forward_with_cache(model, torch.tensor([[state.last]]), state.cache)
    expected = hf_last_logits(hf, ids + emitted)
    if not torch.allclose(logits[0, -1], expected, atol=1e-3):
        shifted = [*range(past), *range(len(emitted)), past + len(emitted)]
        if torch.allclose(logits[0, -1], hf_last_logits(hf, ids + emitted, shifted), atol=1e-3):
            pytest.fail(
                "the cache holds the right tokens, but their keys were computed at positions "
                f"that start at 0 again after a cache of {past} tokens: the pass's positions are "
                "past + offsets (`last` at position past, the cache's length)"
            )
        pytest.fail(
            "the cache holds the right tokens, but reading the next token through it does not "
            "give HF's logits on that text: were the kept keys computed with the pass's "
            "positions past + offsets, and did the pass read the cache?"
        )


@pytest.mark.lookahead_round
def test_lookahead_round_makes_its_tensors_on_the_models_device(impl):
    """On a GPU, a mask made without `device=` sits on the CPU beside the cache on the GPU;
    the round reads values (the pool, the verifier), so its source is read instead of running
    it on the meta device (tests/graded/_device.py)."""
    assert_made_on_the_inputs_device(impl.lookahead_round, "lookahead_round", "the window's tokens")


@pytest.mark.lookahead_round
@pytest.mark.parametrize("pool_from_prompt", [False, True], ids=["window-pool", "text-pool"])
@pytest.mark.parametrize("config", [(5, 3, 5), (3, 2, 3), (6, 4, 4), (2, 3, 1)],
                         ids=lambda c: "W{}-N{}-G{}".format(*c))  # fmt: skip
def test_greedy_lookahead_equals_greedy_generate(
    impl, shipped, hf_greedy_ids, config, pool_from_prompt
):
    model, tokenizer = shipped
    window, ngram, guesses = config
    stats = impl.SpeculativeStats()
    got = impl.lookahead_generate(
        model, tokenizer, LOOKAHEAD_PROMPTS, max_tokens_generated=50, window=window,
        ngram=ngram, guesses=guesses, temperature=0.0, stop_at_eos=False, return_ids=True,
        stats=stats, pool_from_prompt=pool_from_prompt,
    )  # fmt: skip
    for r, (ids, expected) in enumerate(zip(got, hf_greedy_ids, strict=True)):
        ids = list(ids)
        if ids != expected:
            common = first_difference(ids, expected)
            pytest.fail(
                f"W={window}, N={ngram}, G={guesses}, pool_from_prompt={pool_from_prompt}, "
                f"prompt {r}: at temperature 0 lookahead "
                f"decoding must give greedy generate's tokens exactly. They differ at token "
                f"{common}: expected {tokenizer.decode(expected[common : common + 8])!r}, got "
                f"{tokenizer.decode(ids[common : common + 8])!r}. Does the cache keep `last` "
                "and the kept run of the chosen candidate only (no window, no rejected guess)? "
                "Does the pass read the cache (allowed has the cached columns too)? Are its "
                "positions past + offsets?"
            )
    assert stats.main_passes < stats.tokens, (
        f"{stats.main_passes} passes for {stats.tokens} tokens: lookahead decoding must keep "
        "some candidates (one pass per token means nothing was ever accepted)"
    )


N_COPIES = 400
SAMPLE_PROMPT = "CLOWN.\nWhat is the matter? What is the news? What is the reason? What is"
"""Its last token, " is", starts three of its own 3-grams (" is the matter", " is the news",
" is the reason"): with `pool_from_prompt=True` the first pass checks three candidates that
share their first token, which the model gives about 0.18 (fresh noise per candidate would emit
it about 0.45 of the time). With N_COPIES = 400 that bias gives a chi-square of 185 against a
critical value of 48.7 (measured with `verifier=verify_naive`), so 400 copies are plenty."""


@pytest.mark.lookahead_round
def test_pool_from_prompt_puts_the_prompts_ngrams_in_the_first_pass(impl, shipped, hf):
    # Greedy, one pass. Without the option the pool starts empty: the first pass checks no
    # candidate and emits the model's own token alone. With it, the pool holds the prompt's
    # 3-grams, and the first pass keeps the longest run of one that starts with the prompt's
    # last token and agrees with greedy decoding (HF's generate), then adds the argmax.
    model, tokenizer = shipped
    ids = tokenizer.encode(SAMPLE_PROMPT)
    greedy = hf_greedy(hf, ids, 3)[len(ids) :]
    grams = [tuple(ids[i + 1 : i + 3]) for i in range(len(ids) - 2) if ids[i] == ids[-1]]
    runs = [next((k for k in range(2) if g[k] != greedy[k]), 2) for g in grams]
    assert len(set(grams)) == 3 and max(runs) >= 1, "the test's prompt no longer fits the test"
    for pool_from_prompt, expected in ((False, 1), (True, max(runs) + 1)):
        stats = impl.SpeculativeStats()
        out = impl.lookahead_generate(
            model, tokenizer, [SAMPLE_PROMPT], max_tokens_generated=1, window=4, ngram=3,
            guesses=4, temperature=0.0, stop_at_eos=False, return_ids=True, stats=stats,
            pool_from_prompt=pool_from_prompt,
        )  # fmt: skip
        assert list(out[0]) == ids + greedy[:1], "the first new token must be greedy's"
        assert stats.main_passes == 1 and stats.per_round == [expected], (
            f"pool_from_prompt={pool_from_prompt}: the first pass must emit {expected} "
            f"token(s), it emitted {stats.per_round}. "
            + (
                "With an empty pool there is nothing to check: the model's own token only."
                if not pool_from_prompt
                else f"The prompt's 3-grams after its last token are candidates; greedy "
                f"decoding continues {tokenizer.decode(greedy)!r}, so the best keeps "
                f"{max(runs)} token(s), then the argmax after them. Is the chosen "
                "candidate's whole kept run emitted?"
            )
        )


@pytest.mark.lookahead_round
def test_lookahead_samples_follow_the_model(impl, shipped, hf):
    # False failure: 2 comparisons, at most 2 * ALPHA.
    model, tokenizer = shipped
    rows = impl.lookahead_generate(
        model, tokenizer, [SAMPLE_PROMPT] * N_COPIES, max_tokens_generated=2, window=4, ngram=3,
        guesses=4, temperature=1.0, seed=0, stop_at_eos=False, return_ids=True,
        pool_from_prompt=True,
    )  # fmt: skip
    ids = tokenizer.encode(SAMPLE_PROMPT)
    out = torch.tensor([list(r)[len(ids) : len(ids) + 2] for r in rows])
    with torch.no_grad():
        p0 = hf(torch.tensor([ids])).logits[0, -1].softmax(-1)
    assert_samples_follow(out[:, 0], p0, "the first new token must follow the main model")
    top = int(out[:, 0].mode().values)
    with torch.no_grad():
        p1 = hf(torch.tensor([ids + [top]])).logits[0, -1].softmax(-1)
    assert_samples_follow(
        out[out[:, 0] == top, 1],
        p1,
        "the second new token (checked in the same pass as the first) must follow the main "
        "model given the first",
    )


@pytest.mark.lookahead_round
def test_lookahead_uses_the_seed(impl, shipped):
    model, tokenizer = shipped
    runs = [
        impl.lookahead_generate(
            model,
            tokenizer,
            LOOKAHEAD_PROMPTS[:2],
            max_tokens_generated=20,
            temperature=1.0,
            seed=seed,
        )  # fmt: skip
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1], "the same seed must give the same texts"
    assert runs[0] != runs[2], "different seeds must give different texts"
