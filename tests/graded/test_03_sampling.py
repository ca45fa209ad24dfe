"""Chapter 3: sampling and beam search, graded against HF `transformers` (`generate`, its
logits processors) and exact probabilities.

Statistical tests draw many samples in one batched call and compare their frequencies with the
exact probabilities by a chi-square test (tests/graded/_stats.py); each states the probability
that a correct implementation fails it, and each runs under a fixed seed.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tests.graded._oracles import (
    BEAM_SCORE_ATOL,
    PROMPTS,
    hf_beam_search,
    hf_greedy,
    hf_kept,
    hf_window_greedy,
)
from tests.graded._stats import assert_samples_follow

CHAPTER = "03_sampling"

N_SAMPLES = 20_000  # per distribution: enough to expose a temperature off by 20%


def crafted_logits(seed: int = 0, d_vocab: int = 24) -> torch.Tensor:
    """A logit vector with a spread of probabilities, from near 0.3 to near 0."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d_vocab, generator=g) * 1.5


def draw(fn, logits: torch.Tensor, n: int = N_SAMPLES, seed: int = 0, **kwargs):
    """n samples from one logit vector, as one batch of n identical rows."""
    batch = logits.expand(n, -1).clone()
    out = fn(batch, generator=torch.Generator().manual_seed(seed), **kwargs)
    assert out.shape == (n,), f"expected one token per row, shape ({n},), got {tuple(out.shape)}"
    assert out.dtype == torch.int64, f"expected token ids as int64, got {out.dtype}"
    return out


def assert_draws_follow_what_hf_keeps(sampler, logits, warper, what: str, **kwargs) -> None:
    """N_SAMPLES from `sampler` follow softmax(logits) renormalised over the tokens that HF's
    `warper` keeps: the distribution top-k and top-p sampling draw from.

    False failure for a correct implementation: ALPHA (1e-5).
    """
    samples = draw(sampler, logits, **kwargs)
    kept = hf_kept(warper, logits[None])[0]
    assert_samples_follow(samples, logits.softmax(-1) * kept, what)


# --------------------------------------------------------------------------- greedy_search


@pytest.mark.greedy_search
def test_greedy_search_picks_the_argmax_of_each_row(impl):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[3, 7] = logits[3, 11] = logits[3].max() + 1.0  # a tie: the lower id wins
    got = impl.greedy_search(logits.clone())
    expected = [max(range(50), key=lambda t, row=row: (row[t].item(), -t)) for row in logits]
    assert got.shape == (6,), f"one token per row: expected shape (6,), got {tuple(got.shape)}"
    assert got.tolist() == expected, (
        f"expected {expected}, got {got.tolist()}. The most likely token is the argmax over "
        "the LAST dimension (the vocabulary), one per row."
    )


# --------------------------------------------------------------------------- apply_temperature


@pytest.mark.apply_temperature
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_apply_temperature_divides_the_logits(impl, temperature):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    got = impl.apply_temperature(logits.clone(), temperature)
    expected = logits / temperature
    assert torch.allclose(got, expected, atol=1e-6), (
        "logits at temperature T are the logits divided by T (multiplying by T makes low "
        "temperatures flatter, which is backwards)"
    )


@pytest.mark.apply_temperature
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampling_at_a_temperature_follows_softmax_of_scaled_logits(impl, temperature):
    # False failure for a correct implementation: ALPHA (1e-5).
    logits = crafted_logits(2)

    def sample(batch, generator):
        return impl.sample_next_token(
            torch.zeros(batch.shape[0], 1, dtype=torch.long),
            batch,
            temperature,
            generator=generator,
        )

    samples = draw(sample, logits)
    assert_samples_follow(
        samples, (logits / temperature).softmax(-1), f"sampling at temperature {temperature}"
    )


@pytest.mark.apply_temperature
def test_temperature_near_zero_becomes_greedy(impl):
    logits = crafted_logits(3)
    logits[5] = logits.max() + 0.1  # the argmax leads by 0.1: at T=1e-3 that is e^100 to 1
    for temperature in [1e-2, 1e-3]:
        scaled = impl.apply_temperature(logits[None].clone(), temperature)
        assert torch.isfinite(scaled).all(), f"temperature {temperature} gave non-finite logits"
        probs = scaled.softmax(-1)[0]
        assert probs[5] > 0.9999, (
            f"at temperature {temperature} the argmax should get nearly all the probability, got "
            f"{probs[5]:.4f}"
        )


# --------------------------------------------------------------------------- frequency penalty


@pytest.mark.apply_frequency_penalty
@pytest.mark.parametrize("penalty", [0.5, 2.0, -1.0])
def test_frequency_penalty_matches_the_closed_form(impl, penalty):
    # Row 0 repeats token 3 four times; row 1 never uses it: counts must not leak across rows.
    sequences = [[3, 1, 3, 3, 7, 3, 0], [5, 5, 9, 1, 0, 2, 2]]
    d_vocab = 12
    logits = torch.randn(2, d_vocab, generator=torch.Generator().manual_seed(4))
    original = logits.clone()
    got = impl.apply_frequency_penalty(torch.tensor(sequences), logits, penalty)
    assert torch.equal(logits, original), "apply_frequency_penalty must not modify its input"
    for row, seq in enumerate(sequences):
        counts = Counter(seq)
        for token in range(d_vocab):
            expected = original[row, token].item() - penalty * counts[token]
            assert math.isclose(got[row, token].item(), expected, abs_tol=1e-5), (
                f"row {row}, token {token} occurs {counts[token]} times: expected logit "
                f"{expected:.4f}, got {got[row, token].item():.4f}. The penalty is subtracted "
                "once per occurrence, per row (did you count over the whole batch?)"
            )


@pytest.mark.apply_frequency_penalty
def test_frequency_penalty_counts_only_where_the_mask_is_true(impl):
    # Left padding with id 6 (not 0: a hard-coded pad id must not pass); row 1 has no padding.
    sequences = torch.tensor([[6, 6, 6, 3, 6, 3], [6, 2, 2, 4, 1, 6]])
    mask = torch.tensor([[False, False, False, True, True, True], [True] * 6])
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(5))
    original = logits.clone()
    got = impl.apply_frequency_penalty(sequences, logits, 1.0, mask)
    assert torch.equal(logits, original), "apply_frequency_penalty must not modify its input"
    for row in range(2):
        counts = Counter(sequences[row][mask[row]].tolist())
        expected = torch.tensor([original[row, t].item() - counts[t] for t in range(8)])
        assert torch.allclose(got[row], expected, atol=1e-5), (
            f"row {row}: with a mask, count only the positions where it is True (padding is "
            f"not text): expected {expected.tolist()}, got {got[row].tolist()}"
        )


# --------------------------------------------------------------------------- sample_basic


@pytest.mark.sample_basic
@pytest.mark.parametrize("seed", [0, 1])
def test_sample_basic_follows_the_softmax(impl, seed):
    # False failure for a correct implementation: ALPHA (1e-5) per seed.
    logits = crafted_logits(10 + seed)
    logits[0] = float("-inf")  # a banned token must never come out
    samples = draw(impl.sample_basic, logits, seed=seed)
    assert_samples_follow(samples, logits.softmax(-1), "sample_basic")


@pytest.mark.sample_basic
def test_sample_basic_uses_the_generator(impl):
    logits = crafted_logits(5).expand(200, -1).clone()
    a = impl.sample_basic(logits, generator=torch.Generator().manual_seed(7))
    b = impl.sample_basic(logits, generator=torch.Generator().manual_seed(7))
    c = impl.sample_basic(logits, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b), "the same seeded generator must give the same samples"
    assert not torch.equal(a, c), (
        "different seeds gave identical samples: pass `generator=generator` to "
        "torch.multinomial (or whatever draws the random numbers)"
    )


# --------------------------------------------------------------------------- top-k


def top_k_cases():
    g = torch.Generator().manual_seed(20)
    cases = [(torch.randn(30, generator=g), k) for k in [1, 2, 5, 29, 30, 45]]
    tied = torch.tensor([3.0, 1.0, 2.0, 2.0, 2.0, 0.5, -1.0, 2.0])  # ties at the k-th value
    cases += [(tied, k) for k in [1, 2, 3, 5, 6]]
    dominant = torch.full((16,), -2.0)
    dominant[9] = 30.0
    cases += [(dominant, 1), (dominant, 4)]
    flat = torch.zeros(10)
    cases += [(flat, 3)]
    return cases


@pytest.mark.sample_top_k
def test_filter_top_k_keeps_what_hf_keeps(impl):
    for logits, k in top_k_cases():
        got = impl.filter_top_k(logits[None].clone(), k)[0]
        kept = torch.isfinite(got)
        expected = hf_kept(TopKLogitsWarper(top_k=k), logits[None])[0]
        assert torch.equal(kept, expected), (
            f"top-k with k={k} on logits {[round(x, 2) for x in logits.tolist()]}: HF keeps "
            f"{expected.nonzero().flatten().tolist()}, you keep {kept.nonzero().flatten().tolist()}"
            ". Every token whose logit is >= the k-th largest stays (ties included), and k "
            "larger than the vocabulary keeps everything."
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


@pytest.mark.sample_top_k
def test_filter_top_k_works_row_by_row(impl):
    logits = torch.randn(4, 25, generator=torch.Generator().manual_seed(21))
    got = torch.isfinite(impl.filter_top_k(logits.clone(), 3))
    expected = hf_kept(TopKLogitsWarper(top_k=3), logits)
    assert torch.equal(got, expected), "each row keeps its own top k (use dim=-1)"


@pytest.mark.sample_top_k
@pytest.mark.parametrize("k", [1, 4])
def test_sample_top_k_follows_the_renormalised_distribution(impl, k):
    # False failure for a correct implementation: ALPHA (1e-5).
    warper = TopKLogitsWarper(top_k=k)
    what = f"sample_top_k with k={k}"
    assert_draws_follow_what_hf_keeps(impl.sample_top_k, crafted_logits(22), warper, what, k=k)


# --------------------------------------------------------------------------- top-p


def top_p_cases():
    g = torch.Generator().manual_seed(30)
    cases = []
    for i in range(40):  # random logits of many spreads, random top_p and min_tokens_to_keep
        logits = torch.randn(40, generator=g) * (0.5 + 3 * torch.rand(1, generator=g).item())
        top_p = round(torch.rand(1, generator=g).item(), 3)
        cases.append((logits, top_p, 1 if i % 3 else 1 + i % 7))
    dominant = torch.full((12,), 0.0)
    dominant[4] = 12.0  # ~0.9999 of the mass on token 4
    cases += [(dominant, 0.5, 1), (dominant, 0.9, 1), (dominant, 0.9, 3)]
    flat = torch.zeros(10)  # every token 0.1: top_p 0.35 needs 4 tokens
    cases += [(flat, 0.35, 1), (flat, 0.95, 1)]
    cases += [(torch.randn(20, generator=g), top_p, 1) for top_p in [0.0, 1.0]]
    two = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    cases += [(two, 0.49, 1), (two, 0.81, 1), (two, 0.96, 1)]
    return cases


@pytest.mark.sample_top_p
def test_filter_top_p_keeps_what_hf_keeps(impl):
    for logits, top_p, min_keep in top_p_cases():
        got = impl.filter_top_p(logits[None].clone(), top_p, min_keep)[0]
        kept = torch.isfinite(got)
        warper = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=min_keep)
        expected = hf_kept(warper, logits[None])[0]
        # Tied logits can be kept in either order: compare the kept logit values.
        same = sorted(logits[kept].tolist()) == sorted(logits[expected].tolist())
        probs = [round(p, 3) for p in logits.softmax(-1).sort(descending=True).values.tolist()]
        assert same, (
            f"top_p={top_p}, min_tokens_to_keep={min_keep}, probabilities (sorted) "
            f"{probs[:12]}...: HF keeps {int(expected.sum())} tokens, you keep "
            f"{int(kept.sum())}. Keep the smallest set of most likely tokens whose total "
            "probability reaches top_p: a token is kept if the tokens more likely than it sum "
            "to LESS than top_p. Never fewer than min_tokens_to_keep."
        )
        assert torch.equal(got[kept], logits[kept]), "kept logits must be left unchanged"


@pytest.mark.sample_top_p
def test_filter_top_p_works_row_by_row(impl):
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(31)) * 2
    got = torch.isfinite(impl.filter_top_p(logits.clone(), 0.7))
    expected = hf_kept(TopPLogitsWarper(top_p=0.7), logits)
    assert torch.equal(got, expected), (
        "each row keeps its own nucleus: sort along dim=-1, and map the mask back to each "
        "row's original order (scatter with the sort indices)"
    )


@pytest.mark.sample_top_p
@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_sample_top_p_follows_the_renormalised_distribution(impl, top_p):
    # False failure for a correct implementation: ALPHA (1e-5).
    warper = TopPLogitsWarper(top_p=top_p)
    what = f"sample_top_p with top_p={top_p}"
    assert_draws_follow_what_hf_keeps(
        impl.sample_top_p, crafted_logits(32), warper, what, top_p=top_p
    )


# --------------------------------------------------------------------------- sample (the loop)


@pytest.mark.sample
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_sampling_equals_hf_generate(impl, shipped, hf, prompt):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(prompt))
    expected = hf_greedy(hf, ids, 40)
    got = impl.TransformerSampler(model, tokenizer).sample(ids, 40, temperature=0.0)
    assert isinstance(got, torch.Tensor), "given token ids, sample must return token ids"
    assert got.tolist() == expected, (
        f"greedy continuation differs from GPT2LMHeadModel.generate(do_sample=False):\n"
        f"HF:   {tokenizer.decode(expected[len(ids) :])!r}\n"
        f"you:  {tokenizer.decode(got[len(ids) :])!r}\n"
        "Does each step feed the WHOLE sequence so far and read the logits at the LAST position?"
    )


@pytest.mark.sample
def test_sample_returns_text_for_text(impl, shipped):
    model, tokenizer = shipped
    prompt = PROMPTS[0]
    text = impl.TransformerSampler(model, tokenizer).sample(prompt, 12, temperature=0.0)
    assert isinstance(text, str) and text.startswith(prompt), (
        "given a string, sample returns the prompt followed by its continuation, as a string"
    )
    n_new = len(tokenizer.encode(text)) - len(tokenizer.encode(prompt))
    assert 10 <= n_new <= 14, f"asked for 12 new tokens, got about {n_new}"


@pytest.mark.sample
def test_seeded_sampling_is_reproducible(impl, shipped):
    model, tokenizer = shipped
    sampler = impl.TransformerSampler(model, tokenizer)
    ids = torch.tensor(tokenizer.encode(PROMPTS[1]))
    a = sampler.sample(ids, 25, seed=3, temperature=1.0)
    b = sampler.sample(ids, 25, seed=3, temperature=1.0)
    c = sampler.sample(ids, 25, seed=4, temperature=1.0)
    assert a.tolist() == b.tolist(), "the same seed must give the same text"
    assert a.tolist() != c.tolist(), "different seeds gave the same 25 tokens: is seed used?"


class EosAfter(torch.nn.Module):
    """Wraps a model: once the sequence is `stop_len` long, the end-of-text token wins."""

    def __init__(self, model, stop_len: int, eos: int):
        super().__init__()
        self.model, self.cfg, self.stop_len, self.eos = model, model.cfg, stop_len, eos

    def forward(self, tokens):
        logits = self.model(tokens).clone()
        if tokens.shape[1] >= self.stop_len:
            logits[:, -1, self.eos] = 1e4
        return logits


@pytest.mark.sample
def test_sampling_stops_at_end_of_text(impl, shipped):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[0]))
    eos = tokenizer.eos_token_id
    fake = EosAfter(model, len(ids) + 5, eos)
    got = impl.TransformerSampler(fake, tokenizer).sample(ids, 30, temperature=1.0, seed=0)
    assert len(got) == len(ids) + 6 and got[-1].item() == eos, (
        f"the end-of-text token (id {eos}) comes 6th: generation should stop right after it, "
        f"with it as the last token; got {len(got) - len(ids)} new tokens"
    )


@pytest.mark.sample
def test_sampling_past_the_context_window_reads_the_last_n_ctx_tokens(impl, shipped, hf):
    model, tokenizer = shipped
    n_ctx = model.cfg.n_ctx
    text = (PROMPTS[0] + " ") * 40
    ids = torch.tensor(tokenizer.encode(text))[: n_ctx - 3]
    got = impl.TransformerSampler(model, tokenizer).sample(ids, 8, temperature=0.0)
    # Ground truth: HF's logits on the most recent n_ctx tokens, step by step.
    expected = hf_window_greedy(hf, ids.tolist(), 8, lambda t, length: max(0, length - n_ctx))
    assert got.tolist() == expected, (
        f"past {n_ctx} tokens the model can only read the most recent n_ctx of them: crop the "
        "input to input_ids[-n_ctx:] at each step (the output keeps every token)"
    )


@pytest.mark.sample
def test_frequency_penalty_reaches_the_loop(impl, shipped, hf):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(PROMPTS[2]))
    penalty = 1.5
    got = impl.TransformerSampler(model, tokenizer).sample(
        ids, 12, temperature=0.0, frequency_penalty=penalty
    )
    expected = ids.clone()
    with torch.no_grad():
        for _ in range(12):
            logits = hf(expected[None]).logits[0, -1]
            counts = torch.bincount(expected, minlength=logits.shape[-1])
            expected = torch.cat([expected, (logits - penalty * counts).argmax()[None]])
    assert got.tolist() == expected.tolist(), (
        "with frequency_penalty, each token's logit falls by the penalty times its count in "
        "the whole sequence so far (prompt included): pass the kwargs on to sample_next_token "
        "with input_ids as a [1, seq] batch"
    )


# --------------------------------------------------------------------------- no-repeat n-grams


@pytest.mark.no_repeat_ngram
@pytest.mark.parametrize("ngram_size", [1, 2, 3, 4])
def test_banned_ngram_tokens_match_hf(impl, ngram_size):
    g = torch.Generator().manual_seed(40 + ngram_size)
    d_vocab = 6  # a small vocabulary, so that n-grams repeat
    for seq_len in [1, 2, 3, 5, 9, 17]:
        tokens = torch.randint(0, d_vocab, (4, seq_len), generator=g)
        got = impl.banned_ngram_tokens(tokens.clone(), ngram_size, d_vocab)
        hf = NoRepeatNGramLogitsProcessor(ngram_size)(tokens, torch.zeros(4, d_vocab))
        expected = torch.isinf(hf)
        assert got.dtype == torch.bool and got.shape == (4, d_vocab)
        for row in range(4):
            assert torch.equal(got[row], expected[row]), (
                f"ngram_size={ngram_size}, sequence {tokens[row].tolist()}: HF bans "
                f"{expected[row].nonzero().flatten().tolist()}, you ban "
                f"{got[row].nonzero().flatten().tolist()}. A token is banned if the last "
                f"{ngram_size - 1} tokens followed by it already occur in the sequence."
            )


# --------------------------------------------------------------------------- Beams


class FakeTokenizer:
    eos_token_id = 0

    def decode(self, tokens):
        return " ".join(str(int(t)) for t in tokens)


def make_beams(impl, shipped, scores, last_tokens):
    model, _ = shipped
    tokens = torch.tensor([[5, 6, t] for t in last_tokens])
    return impl.Beams(model, FakeTokenizer(), torch.tensor(scores), tokens)


@pytest.mark.beams
@pytest.mark.parametrize("ngram_size", [None, 2])
def test_generate_extends_each_beam_with_its_best_tokens(impl, shipped, hf, ngram_size):
    model, tokenizer = shipped
    rows = [tokenizer.encode(p)[:10] for p in PROMPTS]
    tokens = torch.tensor(rows)
    sums = torch.tensor([-1.0, -2.5, -0.5])
    beams = impl.Beams(model, tokenizer, sums.clone(), tokens.clone())
    k = 4
    new = beams.generate(k, no_repeat_ngram_size=ngram_size)
    assert len(new.tokens) == 3 * k, f"3 beams x {k} continuations = 12 beams, got {len(new)}"
    with torch.no_grad():
        logprobs = hf(tokens).logits[:, -1].log_softmax(-1)
    if ngram_size:
        banned = torch.isinf(
            NoRepeatNGramLogitsProcessor(ngram_size)(tokens, torch.zeros_like(logprobs))
        )
        logprobs = logprobs.masked_fill(banned, float("-inf"))
    top = logprobs.topk(k)
    for b in range(3):
        for j in range(k):
            i = b * k + j
            assert new.tokens[i, :-1].tolist() == rows[b], (
                "new beams must come in order: beam 0's continuations first, then beam 1's..."
            )
            assert new.tokens[i, -1].item() == top.indices[b, j].item(), (
                f"beam {b}, continuation {j}: expected token {top.indices[b, j].item()}, got "
                f"{new.tokens[i, -1].item()} (the k most likely, best first"
                + (", after banning repeated n-grams)" if ngram_size else ")")
            )
            expected = (sums[b] + top.values[b, j]).item()
            assert math.isclose(new.logprob_sums[i].item(), expected, abs_tol=1e-3), (
                "a new beam's score is its parent's logprob sum plus the LOG-probability "
                "(log_softmax, not the raw logit) of the new token"
            )


@pytest.mark.beams
def test_filter_keeps_the_best_continuing_and_the_finished(impl, shipped):
    scores = [-3.0, -1.0, -2.0, -0.5, -4.0, -2.5, -0.75]
    last = [7, 0, 8, 9, 0, 0, 11]  # 0 is the end-of-text token
    beams = make_beams(impl, shipped, scores, last)
    continuing, finished = beams.filter(3)
    # By hand: ranking -0.5(9) -0.75(11) -1.0(EOS) -2.0(8) -2.5(EOS) -3.0(7) -4.0(EOS)
    assert continuing.tokens[:, -1].tolist() == [9, 11, 8], (
        "continuing: the 3 best beams that do NOT end in EOS, best first. Beams ending in EOS "
        "are set aside, so the next best running beams take their places"
    )
    assert continuing.logprob_sums.tolist() == [-0.5, -0.75, -2.0]
    assert finished.tokens[:, -1].tolist() == [0] and finished.logprob_sums.tolist() == [-1.0], (
        "finished: only the EOS beams ranked among the best 3 overall (-1.0); the EOS beams at "
        "-2.5 and -4.0 were not good enough"
    )


# --------------------------------------------------------------------------- beam_search


def assert_same_beams(got, expected, tokenizer, context: str) -> None:
    """`got` (the learner's beam_search) equals `expected` (hf_beam_search), best first."""
    assert len(got) == len(expected), f"{context}: expected {len(expected)} sequences"
    for rank, ((score, tokens), (hf_score, hf_tokens)) in enumerate(
        zip(got, expected, strict=True)
    ):
        assert tokens.tolist() == hf_tokens.tolist(), (
            f"{context}, sequence {rank}:\nHF:  {tokenizer.decode(hf_tokens)!r}\n"
            f"you: {tokenizer.decode(tokens)!r}"
        )
        assert math.isclose(score, hf_score, abs_tol=BEAM_SCORE_ATOL), (
            f"{context}, sequence {rank}: score {score:.4f}, HF {hf_score:.4f} (the sum "
            "of the generated tokens' log-probabilities)"
        )


@pytest.mark.beam_search
@pytest.mark.parametrize(
    ("prompt", "num_beams", "n_return", "ngram"),
    [
        (PROMPTS[0], 3, 2, None),
        (PROMPTS[1], 4, 4, None),
        (PROMPTS[2], 3, 3, 2),
        (PROMPTS[0], 5, 3, 3),
    ],
)
def test_beam_search_equals_hf_generate(impl, shipped, hf, prompt, num_beams, n_return, ngram):
    model, tokenizer = shipped
    ids = torch.tensor(tokenizer.encode(prompt))
    n_new = 12
    expected = hf_beam_search(hf, ids, n_return, num_beams, n_new, no_repeat_ngram_size=ngram)
    got = impl.beam_search(
        model, tokenizer, prompt, n_return, num_beams, n_new, no_repeat_ngram_size=ngram
    )
    assert_same_beams(got, expected, tokenizer, f"{num_beams} beams, ngram={ngram}")


class BigramTable(torch.nn.Module):
    """Crafted logits that depend only on the last token (mod 8), for both sides of a test.

    Each row has one strong favourite that leads to the next row, so some paths cost almost
    nothing to extend, and an end-of-text logit that competes with that favourite: far ahead
    in some rows, behind in others. Beams finish at different steps, which is where beam search
    implementations (and the two stopping rules) differ.
    """

    def __init__(self, cfg, eos: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.table = torch.randn(8, cfg.d_vocab, generator=g) * 2
        for row in range(8):
            favourite = 8 * (17 + row) + (row + 1) % 8  # a token whose row is the next one
            self.table[row, favourite] += 4.0 + 4.0 * torch.rand(1, generator=g).item()
        offsets = torch.randn(8, generator=g) * 2.5 - 1.0
        self.table[:, eos] = self.table.max(dim=-1).values + offsets
        self.weight = torch.nn.Parameter(torch.zeros(1))  # for next(model.parameters())

    def forward(self, tokens):
        return self.table[tokens % 8]


class TableProcessor(LogitsProcessor):
    """Replaces HF's log-probabilities with those of the table, so HF searches the same tree."""

    def __init__(self, table: BigramTable):
        self.table = table

    def __call__(self, input_ids, scores):
        return self.table(input_ids[:, -1:])[:, -1].log_softmax(-1)


@pytest.mark.beam_search
@pytest.mark.parametrize("early_stopping", [True, False])
@pytest.mark.parametrize("seed", [1, 3, 12, 14])  # tables where beams finish at different steps
def test_beam_search_end_of_text_and_stopping_rules(impl, shipped, hf, early_stopping, seed):
    model, tokenizer = shipped
    table = BigramTable(model.cfg, tokenizer.eos_token_id, seed)
    prompt = PROMPTS[seed % 3]
    ids = torch.tensor(tokenizer.encode(prompt))
    expected = hf_beam_search(
        hf,
        ids,
        3,
        3,
        10,
        early_stopping=early_stopping,
        logits_processor=LogitsProcessorList([TableProcessor(table)]),
    )
    got = impl.beam_search(table, tokenizer, prompt, 3, 3, 10, early_stopping=early_stopping)
    assert_same_beams(got, expected, tokenizer, f"crafted logits, early_stopping={early_stopping}")
