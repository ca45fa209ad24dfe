"""solutions/constraint_distortion.py against an outside computation: HF's GPT2LMHeadModel for
the model's probabilities, and a choice constraint's allowed tokens read from the choices
themselves (a token is allowed when the text with its bytes is still the start of a choice;
end-of-text when the text is a choice). Every answer path, its log p and its log q, and both
distributions summing to 1."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from solutions.byte_dfa import regex_to_byte_dfa
from solutions.constraint_distortion import (
    answer_probabilities,
    conditioned_and_masked,
    kl_divergence,
)
from solutions.token_index import TokenIndex
from utils.models import load_hf, load_model

CHOICES = ["Romeo", "Juliet", "yes"]


@pytest.fixture(scope="module")
def shipped():
    return load_model("shakespeare")


def hf_answers(hf, tokenizer, prompt: list[int], choices: list[str]) -> dict:
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    eos = tokenizer.eos_token_id
    vocab = [None if i == eos else bytes(byte_of[c] for c in s) for i, s in enumerate(names)]
    targets = [c.encode() for c in choices]
    answers = {}

    def visit(text: bytes, path: tuple, log_p: float, log_q: float):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + list(path)])).logits[0, -1].double()
        log_probs = logits.log_softmax(-1)
        allowed = [t for t, b in enumerate(vocab)
                   if b and any(c.startswith(text + b) for c in targets)]  # fmt: skip
        if text in targets:
            allowed.append(eos)
        log_mass = torch.logsumexp(log_probs[allowed], 0).item()
        for t in allowed:
            lp = log_probs[t].item()
            if t == eos:
                answers[(*path, t)] = (log_p + lp, log_q + lp - log_mass)
            else:
                visit(text + vocab[t], (*path, t), log_p + lp, log_q + lp - log_mass)

    visit(b"", (), 0.0, 0.0)
    return answers


def test_every_answer_and_both_probabilities_are_hfs(shipped):
    model, tokenizer = shipped
    hf = load_hf("shakespeare")[0].eval()
    prompt = tokenizer.encode("ROMEO.\n")
    from solutions.token_bytes import token_bytes

    regex = "(" + "|".join(CHOICES) + ")"
    index = TokenIndex(regex_to_byte_dfa(regex), token_bytes(tokenizer), tokenizer.eos_token_id)
    ours = answer_probabilities(model, prompt, index)
    theirs = hf_answers(hf, tokenizer, prompt, CHOICES)
    assert set(ours) == set(theirs) and len(ours) > len(CHOICES)  # several tokenizations each
    for path, (lp, lq) in theirs.items():
        assert ours[path][0] == pytest.approx(lp, abs=1e-4)
        assert ours[path][1] == pytest.approx(lq, abs=1e-4)
    exact, masked, z = conditioned_and_masked(ours)
    assert sum(exact.values()) == pytest.approx(1) and sum(masked.values()) == pytest.approx(1)
    assert z == pytest.approx(sum(math.exp(lp) for lp, _ in theirs.values()), rel=1e-3)
    assert kl_divergence(exact, exact) == 0 and kl_divergence(exact, masked) > 0


def test_an_endless_constraint_is_refused(shipped):
    model, tokenizer = shipped
    from solutions.token_bytes import token_bytes

    index = TokenIndex(regex_to_byte_dfa("a+"), token_bytes(tokenizer), tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="max_tokens"):
        answer_probabilities(model, tokenizer.encode("A"), index, max_tokens=4)
