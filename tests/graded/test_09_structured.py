"""Chapter 9: output that must parse. Tokens as bytes (graded against HF's byte map and
`tokenizer.decode`), the token index (against outlines-core's `Index`, walked in lockstep), the
mask and the constrained sampler (against exact probabilities by a chi-square test, and
`re.fullmatch` on every answer).

outlines-core numbers its states its own way: the two indexes are compared by walking both
from their initial states together, over every token both allow, so that each pair of states
reached stands for the same text; their allowed sets must be equal at every pair.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections import deque

import jsonschema
import pytest
import torch
from interegular import parse_pattern

from tests.graded._device import made_without_a_device
from tests.graded._oracles import (
    IN_PLACE,
    RFC_STRING_CHAR,
    OutlinesIndex,
    assert_untouched,
    crafted_logits,
    draw,
    outlines_schema_regex,
    regex_difference,
    vocabulary_bytes,
)
from tests.support import assert_samples_follow

CHAPTER = "09_structured"

VOCAB, EOS = vocabulary_bytes()

# Regexes with what each exercises: a choice with many tokenizations (and one choice a prefix of
# another), classes with bounded repetition, a starred group, a number whose integer part is
# already a complete match, words separated by spaces (the space marker), non-ASCII characters
# (two, three and four bytes, split across tokens), a range of non-ASCII characters, a JSON
# string (a negated class: every character but a few), `.`, and a schema's regex.
TWO_FIELD_REGEX = (  # outlines-core's build_regex_from_schema, whitespace_pattern=""
    r'\{"name":"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*","age":(-)?(0|[1-9][0-9]*)\}'
)
BATTERY = [
    "(Romeo|Juliet)",
    "(Rom|Romeo)",
    "(Romeo|Juliet|Romeo and Juliet)",
    "[A-Z][a-z]{2,5}",
    "[0-9]{3}-[0-9]{4}",
    "(ab|cd)*e",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    "[a-z]+( [a-z]+)*",
    "(é|日本|😀)+",
    "[à-ü]+",
    '"[^"\\\\\\x00-\\x1f]*"',
    ".{1,3}!",
    TWO_FIELD_REGEX,
]


def show(data: bytes | None) -> str:
    return "None" if data is None else repr(data)


@pytest.fixture(scope="module")
def tokenizer():
    from utils.models import load_model

    return load_model("shakespeare")[1]


# --------------------------------------------------------------------------- token_bytes


def diagnose_token_bytes(got, tokenizer, i: int) -> str:
    """What a wrong entry `got[i]` points to."""
    expected = VOCAB[i]
    string = tokenizer.convert_ids_to_tokens(i)
    head = f"token {i} ({string!r}): expected {show(expected)}, got {show(got[i])}. "
    if expected is None:
        return head + (
            f"{string} is a special token: it is not text and adds no bytes to it. Give it "
            "None, so that no constraint ever walks it as text (end-of-text is allowed by the "
            "index where the text may end, not because of its bytes)."
        )
    if got[i] is None:
        return head + "Only special tokens are None; this one is ordinary text."
    if got[i] in VOCAB:
        j = VOCAB.index(got[i])
        return head + (
            f"That is the bytes of another token, id {j}: are the entries in id order (entry i "
            "for token id i)? A dictionary's keys (`get_vocab()`) do not come in id order."
        )
    if got[i] == string.encode("utf-8"):
        return head + (
            "That is the UTF-8 encoding of the token's string as the vocabulary stores it: "
            "each character of that string stands for ONE byte (the space marker `Ġ` is the "
            "byte 0x20, `Ċ` a newline), so map every character back through the byte-level "
            "alphabet instead of encoding the string."
        )
    if got[i] == tokenizer.decode([i]).encode("utf-8"):
        return head + (
            "That is `decode` of the token alone. A token may hold part of a character (`é` "
            "is two tokens here), and decoding a part alone gives the replacement character "
            "U+FFFD, whose bytes were never in the text. Read the token's bytes from its "
            "string in the vocabulary instead."
        )
    return head + "Map each character of the token's string back to the byte it stands for."


@pytest.mark.token_bytes
def test_token_bytes_equal_the_vocabularys_bytes(impl, tokenizer):
    got = impl.token_bytes(tokenizer)
    assert isinstance(got, list | tuple) and len(got) == len(VOCAB), (
        f"expected a list with one entry per token id ({len(VOCAB)}), got "
        f"{type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}"
    )
    wrong = [i for i in range(len(VOCAB)) if got[i] != VOCAB[i]]
    if wrong:
        # The special token first: it is the one a learner's rule most often misses.
        first = EOS if EOS in wrong else wrong[0]
        raise AssertionError(
            f"{len(wrong)} of {len(VOCAB)} token ids have the wrong bytes. "
            + diagnose_token_bytes(got, tokenizer, first)
        )


TEXTS = [
    "Café, naïve façade",
    "ROMEO.\n Wherefore art thou — Romeo?\n\tJuliet’s “Verona” …",
    "日本語 and 😀🎭 with Ω ж ß",
    " leading  spaces\n\nand tabs\t\tend ",
]


@pytest.mark.token_bytes
def test_token_bytes_rebuild_texts_with_non_ascii_characters(impl, tokenizer):
    """The bytes of a text's tokens, joined, are its UTF-8 encoding, which decodes to what
    `tokenizer.decode` gives (the texts split characters across tokens)."""
    got = impl.token_bytes(tokenizer)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        joined = b"".join(b"" if got[i] is None else got[i] for i in ids)
        if joined != text.encode("utf-8"):
            at = next(
                (k for k, i in enumerate(ids) if got[i] != VOCAB[i]),
                None,
            )
            where = "" if at is None else " " + diagnose_token_bytes(got, tokenizer, ids[at])
            raise AssertionError(
                f"the bytes of the tokens of {text!r} joined give {joined!r}, not the text's "
                f"UTF-8 encoding {text.encode('utf-8')!r}.{where}"
            )
        assert joined.decode("utf-8") == tokenizer.decode(ids)


@pytest.mark.token_bytes
def test_token_bytes_of_a_tokenizer_with_a_second_special_token(impl):
    """Another caller: a tokenizer with one more special token, at the end of the vocabulary
    (as real models add chat tokens). Every special token is None, wherever its id."""
    from transformers import AutoTokenizer

    from utils.models import model_dir

    tok = AutoTokenizer.from_pretrained(model_dir("shakespeare"), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["[SEP]"]})
    new = tok.convert_tokens_to_ids("[SEP]")
    got = impl.token_bytes(tok)
    assert len(got) == len(VOCAB) + 1, (
        f"a tokenizer of {len(tok)} tokens (one special token added at id {new}) must give "
        f"{len(tok)} entries, got {len(got)}: count the tokenizer's tokens (`len(tokenizer)`), "
        "not a number written in the code, nor `tokenizer.vocab_size`, which leaves out the "
        "tokens added after training"
    )
    assert got[new] is None and got[EOS] is None, (
        f"[SEP] (id {new}) and <|endoftext|> (id {EOS}) are both special tokens, not "
        f"text: both must be None, got {show(got[new])} and {show(got[EOS])}. Ask the "
        "tokenizer which ids are special (`all_special_ids`) rather than naming one or "
        "guessing from the shape of its name."
    )
    assert list(got[:new]) == list(VOCAB), "the other tokens' bytes must not change"


# --------------------------------------------------------------------------- token_index


def first_disagreement(index, oracle: OutlinesIndex, vocab, eos: int, regex: str):
    """Walk the learner's index and the oracle together over every token both allow, breadth
    first; return None, or (text so far, learner's set, oracle's set, oracle final) at the
    first pair of states whose allowed sets differ."""
    start = (index.initial, oracle.initial)
    seen, todo = {start}, deque([(start, b"")])
    while todo:
        (mine, theirs), text = todo.popleft()
        got, expected = set(index.allowed(mine)), oracle.allowed(theirs)
        if got != expected:
            return text, got, expected, oracle.is_final(theirs)
        if oracle.is_final(theirs):
            after = index.advance(mine, eos)
            assert after == mine, (
                f"regex {regex!r}, after {text!r} (a complete match): end-of-text must leave "
                f"the state as it is (state {mine}), got state {after}"
            )
        for token in sorted(got - {eos}):
            pair = (index.advance(mine, token), oracle.next_state(theirs, token))
            if pair not in seen:
                seen.add(pair)
                todo.append((pair, text + vocab[token]))
    return None


def sample_of(ids, vocab, most: int = 6) -> str:
    shown = sorted(ids, key=lambda t: (vocab[t] is None, vocab[t] or b""))[:most]
    more = f" and {len(ids) - most} more" if len(ids) > most else ""
    return ", ".join("<end-of-text>" if vocab[t] is None else repr(vocab[t]) for t in shown) + more


def walk_by_hand(dfa, state: int | None, data: bytes) -> int | None:
    """The given DFA's state after `data` from `state`, or None where the walk dies: the
    tests' own walk, beside the learner's."""
    for byte in data:
        if state is None:
            return None
        state = dfa.step(state, byte)
    return state


def bytes_walked(dfa, state: int, data: bytes) -> int:
    """How many of `data`'s bytes walk from `state` before one has no transition."""
    for n, byte in enumerate(data):
        state = dfa.step(state, byte)
        if state is None:
            return n
    return len(data)


def explain_index_difference(regex, dfa, text, got, expected, final, vocab, eos) -> str:
    missing, extra = expected - got, got - expected
    head = f"regex {regex!r}, after the text {text!r}: "
    if eos in extra:
        return head + (
            "end-of-text is allowed, but the text is not a complete match yet. End-of-text "
            "belongs only to final states."
        )
    if eos in missing and eos != 0 and 0 in got:
        return head + (
            f"end-of-text is missing and token 0 ({vocab[0]!r}) is allowed: in this vocabulary "
            f"end-of-text is id {eos}, not 0. Use the `eos_id` TokenIndex is given."
        )
    if eos in missing:
        return head + (
            "the text is a complete match (a final state), so end-of-text must be allowed "
            "there; your index does not allow it."
        )
    for shift in (1, -1):
        if missing and {t + shift for t in expected - {eos}} == got - {eos}:
            return head + (
                f"every allowed id is {shift:+d} from the right one (your index allows "
                f"{sample_of(sorted(got - expected)[:2], vocab)} where "
                f"{sample_of(sorted(missing)[:2], vocab)} is allowed): is the token id the "
                "position in `token_bytes`, counted from 0?"
            )
    partial = {t for t in missing if not is_whole_text(vocab[t])}
    if partial:
        return head + (
            f"{len(missing)} tokens are missing, among them {sample_of(partial, vocab)}: bytes "
            "that are not a whole character on their own. A multi-byte character is split "
            "across tokens here; a token that begins a character the regex allows must be "
            "allowed, and the next token finishes it. Walk bytes, not characters."
        )
    if missing and any(len(vocab[t]) < max(len(vocab[u]) for u in got | missing) for t in missing):
        return head + (
            f"{len(missing)} tokens are missing, among them {sample_of(missing, vocab)}. "
            f"Every tokenization of an allowed text must be allowed, not only the tokenizer's "
            "own: a word may come as one token or as several shorter ones. Is every token of "
            "the vocabulary walked from every state?"
        )
    here = walk_by_hand(dfa, dfa.initial, text)  # the given DFA's, not the learner's walk
    if extra and here is not None:
        text_ids = [t for t, data in enumerate(vocab) if data is not None]
        walked = {t: bytes_walked(dfa, here, vocab[t]) for t in text_ids}
        if got - {eos} == {t for t in text_ids if walked[t] >= min(1, len(vocab[t]))}:
            return head + (
                f"{len(extra)} tokens are allowed that cannot lead to a match, among them "
                f"{sample_of(extra, vocab)}: your index allows exactly the tokens whose FIRST "
                "byte may come next, though a later byte has no transition. Is only each "
                "token's first byte walked? A token is allowed only when every one of its bytes "
                "walks from the state."
            )
        if got - {eos} == {t for t in text_ids if walked[t] >= len(vocab[t]) - 1}:
            return head + (
                f"{len(extra)} tokens are allowed that cannot lead to a match, among them "
                f"{sample_of(extra, vocab)}: your index allows exactly the tokens that walk "
                "from here up to their LAST byte, whether that byte has a transition or not. Is "
                "the last byte of each token left out of its walk?"
            )
    if extra:
        return head + (
            f"{len(extra)} tokens are allowed that cannot lead to a match, among them "
            f"{sample_of(extra, vocab)}. A token whose walk reaches a byte with no transition "
            "is dead there: is the walk stopped, and the token left out, as soon as a step "
            "fails?"
        )
    return head + f"{len(missing)} tokens are missing, among them {sample_of(missing, vocab)}."


def is_whole_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def assert_index_equals_outlines(impl, regex: str, vocab, eos: int) -> None:
    dfa = impl.regex_to_byte_dfa(regex)
    index = impl.TokenIndex(dfa, list(vocab), eos)
    oracle = OutlinesIndex(regex, vocab, eos)
    found = first_disagreement(index, oracle, vocab, eos, regex)
    if found is not None:
        text, got, expected, final = found
        at_start = set(index.allowed(index.initial)) - {eos}
        if text and got - {eos} == at_start and expected - {eos} != at_start:
            raise AssertionError(
                f"regex {regex!r}, after the text {text!r}: your index allows here exactly the "
                "tokens it allows at the start. Is each token walked from `dfa.initial` instead "
                "of from the state whose row is being built?"
            )
        raise AssertionError(
            explain_index_difference(regex, dfa, text, got, expected, final, vocab, eos)
        )


@pytest.mark.token_index
def test_walk_follows_the_dfa_byte_by_byte(impl):
    dfa = impl.regex_to_byte_dfa("(é|日本|Romeo)+")

    def by_hand(data: bytes):
        return walk_by_hand(dfa, dfa.initial, data)

    try:  # a `return` inside the loop: None over no bytes, the first byte's state over more
        returns_in_the_loop = impl.walk(dfa, dfa.initial, b"") is None and impl.walk(
            dfa, dfa.initial, b"Rome"
        ) == dfa.step(dfa.initial, ord("R"))
    except Exception:  # noqa: BLE001 - a probe: the loop below says what went wrong
        returns_in_the_loop = False
    for data in [b"", b"R", b"Rome", b"Romeo", b"Rx", b"\xc3", "é".encode(), "日本Romeo".encode(),
                 "日".encode()[:2], b"\xc3\xa8", b"Romeoo", b"Rxo", b"\xc3xR"]:  # fmt: skip
        try:
            got = impl.walk(dfa, dfa.initial, data)
        except (TypeError, KeyError, IndexError, AttributeError) as error:
            raise AssertionError(
                f"walk from the initial state over {data!r} crashed ({type(error).__name__}: "
                f"{error}). The walk dies at {data!r}'s first byte with no transition, and the "
                "next step was taken from None: once a step gives None, return None at once."
            ) from None
        expected = by_hand(data)
        in_the_loop = (
            " Over no bytes your walk returns None, and over b'Rome' the state after its first "
            "byte: is the `return` inside the loop (indented one level too far)? The walk "
            "returns after its last byte, and over no bytes it stays where it started."
            if returns_in_the_loop
            else ""
        )
        assert got == expected, (
            f"walk from the initial state over {data!r}: expected "
            f"{'None (the walk dies)' if expected is None else f'state {expected}'}, got "
            f"{got!r}. "
            + (
                "Once a step has no transition the walk is dead: return None at once."
                if expected is None
                else "Step the DFA on every byte, in order, each from the state the last "
                "one reached."
            )
            + in_the_loop
        )
    mid = impl.walk(dfa, dfa.initial, b"Rom")
    assert impl.walk(dfa, mid, b"eo") == by_hand(b"Romeo"), (
        "a walk must start from the state it is given, not from the initial state"
    )


@pytest.mark.token_index
@pytest.mark.parametrize("regex", BATTERY, ids=range(len(BATTERY)))
def test_token_index_equals_outlines_cores(impl, regex):
    assert_index_equals_outlines(impl, regex, VOCAB, EOS)


def reshuffled_vocabulary(seed: int = 0):
    """The course's tokens under other ids, end-of-text last and a second special token (no
    bytes) among them: an index may not assume where either lies."""
    g = torch.Generator().manual_seed(seed)
    texts = [b for b in VOCAB if b is not None]
    order = torch.randperm(len(texts), generator=g).tolist()
    vocab = [texts[k] for k in order]
    vocab.insert(1000, None)  # another special token: never text
    vocab.append(None)  # end-of-text
    return tuple(vocab), len(vocab) - 1


@pytest.mark.token_index
def test_token_index_on_a_vocabulary_with_other_ids(impl):
    vocab, eos = reshuffled_vocabulary()
    for regex in ["(Romeo|Juliet)", "(é|日本)+"]:
        assert_index_equals_outlines(impl, regex, vocab, eos)


@pytest.mark.token_index
def test_advance_refuses_a_token_that_is_not_allowed(impl):
    index = impl.TokenIndex(impl.regex_to_byte_dfa("(Romeo|Juliet)"), list(VOCAB), EOS)
    x = VOCAB.index(b"x")
    with pytest.raises((ValueError, KeyError, IndexError)):
        after = index.advance(index.initial, x)
        raise AssertionError(
            f"advance(initial, {x}) for b'x', which (Romeo|Juliet) never allows, returned "
            f"{after!r}: a refused token has no next state, and advance must say so (raise) "
            "rather than hand back a state"
        )
    with pytest.raises((ValueError, KeyError, IndexError)):
        after = index.advance(index.initial, EOS)
        raise AssertionError(
            f"advance(initial, end-of-text) returned {after!r}: the empty text is not a "
            "match of (Romeo|Juliet), so end-of-text is not allowed there"
        )


# --------------------------------------------------------------------------- mask_logits


@pytest.mark.mask_logits
def test_token_mask_is_true_exactly_at_the_allowed_ids(impl):
    allowed = [3, 0, 4095, 17, 3]
    got = impl.token_mask(allowed, 4096)
    expected = torch.zeros(4096, dtype=torch.bool)
    expected[[0, 3, 17, 4095]] = True
    assert got.dtype == torch.bool and got.shape == (4096,), (
        f"expected a boolean tensor of shape (4096,), got {got.dtype} of shape {tuple(got.shape)}"
    )
    assert torch.equal(got, expected), (
        f"True must be exactly at {sorted(set(allowed))}; got True at "
        f"{got.nonzero().flatten().tolist()[:8]}"
    )


@pytest.mark.mask_logits
def test_token_mask_makes_its_tensors_on_the_given_device(impl):
    made = made_without_a_device(impl.token_mask)
    assert not made, (
        f"token_mask makes {', '.join(made)} without `device=`: on a GPU it would land on "
        "the CPU and meet the GPU's logits in the next step. Make each tensor on `device`."
    )
    got = impl.token_mask([1, 2], 8, device="meta")
    assert got.device.type == "meta", f"asked for the meta device, got {got.device}"


@pytest.mark.mask_logits
def test_mask_logits_puts_minus_infinity_outside_the_mask(impl):
    logits = torch.stack([crafted_logits(seed, 24) for seed in range(3)])
    mask = torch.zeros(3, 24, dtype=torch.bool)
    mask[0, [1, 5, 6]] = True
    mask[1, [0, 23]] = True
    mask[2, :] = True
    before, mask_before = logits.clone(), mask.clone()
    got = impl.mask_logits(logits, mask)
    assert_untouched(logits, before, "mask_logits", IN_PLACE)
    assert torch.equal(mask, mask_before), "mask_logits changed the mask it was given"
    assert got.shape == logits.shape and got.dtype == logits.dtype, (
        f"expected {tuple(logits.shape)} {logits.dtype}, got {tuple(got.shape)} {got.dtype}"
    )
    assert not bool((got[mask] == float("-inf")).all() and (got[~mask] == logits[~mask]).all()), (
        "-inf went to the allowed tokens and the refused ones kept their logits: is the mask "
        "read the right way round (True means allowed)?"
    )
    assert torch.equal(got[mask], logits[mask]), (
        "the logits of allowed tokens must be unchanged: the mask only removes tokens, the "
        "model's preferences among the others stay as they are"
    )
    outside = got[~mask]
    assert bool((outside == float("-inf")).all()), (
        f"every refused token's logit must be -inf, got values such as "
        f"{outside[outside != float('-inf')][:3].tolist()}. A large negative number is not "
        "enough: after a temperature, or beside logits as low as it, it keeps some probability."
        if bool((outside != float("-inf")).any()) and bool((outside < -100).all())
        else f"every refused token's logit must be -inf, got {outside[:4].tolist()}: is the "
        "mask read the right way round (True means allowed)?"
    )
    for dtype in (torch.bfloat16, torch.float16):
        low = impl.mask_logits(logits.to(dtype), mask)
        assert low.dtype == dtype, f"{dtype} logits must stay {dtype}, got {low.dtype}"


@pytest.mark.mask_logits
def test_masked_sampling_follows_the_renormalised_distribution(impl):
    """chapter 3's sample_basic on masked logits draws from softmax(logits) renormalised over
    the allowed tokens. False failure for a correct implementation: ALPHA (1e-5)."""
    from solutions.sampling import sample_basic

    logits = crafted_logits(4, 24)
    mask = torch.zeros(24, dtype=torch.bool)
    mask[[0, 2, 3, 7, 11, 19]] = True

    def masked_draw(batch, generator):
        return sample_basic(impl.mask_logits(batch, mask[None].expand_as(batch)), generator)

    samples = draw(masked_draw, logits, who="mask_logits")
    assert_samples_follow(
        samples, logits.softmax(-1) * mask, "sample_basic(mask_logits(logits, mask))"
    )


# --------------------------------------------------------------------------- constrained_sampler


class LastTokenTable(torch.nn.Module):
    """A model whose logits depend only on the last token (its id mod 8), with the given
    model's config: fast, and its distributions are known exactly."""

    def __init__(self, cfg, seed: int = 0, favour: list[int] | None = None):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.table = torch.randn(8, cfg.d_vocab, generator=g) * 2
        if favour:  # tokens far ahead of every other in every row
            self.table[:, favour] += 20.0
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter: the sampler's device

    def forward(self, tokens):
        return self.table[tokens % 8]


def exact_answer_probabilities(model, oracle, prompt_last: int, top_k: int | None = None):
    """Every token path the constraint allows, up to end-of-text, with its exact probability
    under the model's distribution renormalised over the allowed tokens at each step (and cut
    to the top_k most likely allowed ones, if given)."""
    paths: dict[tuple[int, ...], float] = {}

    def visit(state, last, path, p):
        allowed = sorted(oracle.allowed(state))
        logits = model.table[last % 8].double()[allowed]
        if top_k is not None:
            kth = logits.topk(min(top_k, len(allowed))).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(-1)
        for token, q in zip(allowed, probs.tolist(), strict=True):
            if q == 0:
                continue
            if token == oracle.eos_id:
                paths[(*path, token)] = p * q
            else:
                visit(oracle.next_state(state, token), token, (*path, token), p * q)

    visit(oracle.initial, prompt_last, (), 1.0)
    return paths


def constrained(impl, model, tokenizer, regex: str):
    """The learner's sampler for `regex`, with the learner's index of it."""
    index = impl.TokenIndex(impl.regex_to_byte_dfa(regex), list(VOCAB), EOS)
    return impl.ConstrainedSampler(model, tokenizer, index)


def draw_answers(sampler, prompt_ids, n: int, **kwargs) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        got = sampler.sample(prompt_ids, 30, seed=seed, **kwargs)
        out.append(tuple(got[len(prompt_ids) :].tolist()))
    return out


def assert_answers_follow(answers, paths, what: str) -> None:
    order = sorted(paths, key=paths.get, reverse=True)
    number = {path: k for k, path in enumerate(order)}
    outside = [a for a in answers if a not in number]
    if outside:
        a = outside[0]
        text = b"".join(VOCAB[t] or b"<end-of-text>" for t in a)
        raise AssertionError(
            f"{what}: {len(outside)} of {len(answers)} answers are not texts the constraint "
            f"allows, ending with end-of-text, for example {text!r} (tokens {list(a)})"
        )
    samples = torch.tensor([number[a] for a in answers])
    assert_samples_follow(samples, torch.tensor([paths[p] for p in order]), what)


class RecordingIndex:
    """The learner's index, each `advance(state, token)` the guide asks of it recorded."""

    def __init__(self, index):
        self.index, self.reads = index, []

    def __getattr__(self, name):
        return getattr(self.index, name)

    def advance(self, state, token):
        self.reads.append((state, token))
        return self.index.advance(state, token)


def explain_refused_read(impl, model, tokenizer, regex: str, prompt) -> str:
    """Why the learner's sampler asked its guide to read a refused token, from what it read:
    a tensor for an int, the prompt's tokens, a token read twice, or a guide started over."""
    sampler = constrained(impl, model, tokenizer, regex)
    index = sampler.index = RecordingIndex(sampler.index)
    try:
        draw_answers(sampler, prompt, 20)
    except ValueError:
        pass
    reads, initial = index.reads, index.initial
    tokens = [token for _, token in reads]
    odd = next((t for t in tokens if not isinstance(t, int) or isinstance(t, bool)), None)
    if odd is not None:
        return (
            f"The guide was handed {odd!r} (a {type(odd).__name__}), not a Python int: a row of "
            "the index is a dict keyed by ints, and a tensor is never found among them, even "
            "when its token is allowed. Iterating over a tensor gives 0-d tensors: turn the "
            "token ids into Python ints before the guide reads them."
        )
    ids = prompt.tolist()
    if tokens and tokens[: len(ids)] == ids[: len(tokens)]:
        return (
            f"It read the prompt's tokens {ids[: len(tokens)]}: the constraint is on the "
            "generated text only, so the prompt is never read, and the first call reads nothing."
        )
    for (state, token), (_, before) in zip(reads[1:], reads[:-1], strict=True):
        if token == before and state != initial:
            return (
                f"It read token {token} twice in a row: is a generated token read again at the "
                "next call? The guide reads each generated token once: each call reads only the "
                "tokens appended since the last one (`self.n_seen` on), then sets `self.n_seen` "
                "to the length read."
            )
    if len(reads) > 1 and reads[-1][0] == initial:
        return (
            "Its last read started again from the constraint's beginning (the initial state) "
            "after other tokens were read: is the guide made anew at each call, in a local "
            "variable? The guide is the sampler's own (`self.guide`), made once per request, "
            "and it keeps its state from one call to the next."
        )
    return (
        "Is it walking the prompt's tokens, reading a generated token more than once, or made "
        "anew at each call? The constraint is on the generated text only: the guide reads "
        "each token sampled after the prompt once, after it is accepted."
    )


@pytest.mark.constrained_sampler
def test_the_prompt_is_not_part_of_the_constrained_text(impl, tokenizer):
    """A prompt that is itself the start of an answer ("Rom"): the answer after it must still
    be a whole match; the constraint reads only the generated tokens."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    regex = "(Romeo|Juliet)"
    model = HashNoise(cfg)
    sampler = constrained(impl, model, tokenizer, regex)
    for prompt_text in ["Rom", "ROMEO.\n"]:
        prompt = torch.tensor(tokenizer.encode(prompt_text))
        try:
            answers = draw_answers(sampler, prompt, 20)
        except ValueError as error:
            why = explain_refused_read(impl, model, tokenizer, regex, prompt)
            raise AssertionError(
                f"with the prompt {prompt_text!r}: {error}. The guide was asked to read a token "
                f"the constraint refuses. {why}"
            ) from None
        start = set(OutlinesIndex(regex, VOCAB, EOS).allowed(
            OutlinesIndex(regex, VOCAB, EOS).initial))  # fmt: skip
        for answer in answers:
            text = answer_text(tuple(t for t in answer if t != EOS))
            if not re.fullmatch(regex, text) and len(answer) > 2 and set(answer) <= start:
                raise AssertionError(
                    f"with the prompt {prompt_text!r} the generated text is {text!r}: every "
                    "token was drawn from the tokens allowed at the constraint's START. The "
                    "guide never moved on: is `self.n_seen` set to the length of `input_ids` "
                    "after each call, so that the next call reads the new token?"
                )
            assert re.fullmatch(regex, text), (
                f"with the prompt {prompt_text!r} the generated text is {text!r}, not a whole "
                f"match of {regex!r}: the guide must start at the constraint's beginning for "
                "the first generated token and read each generated token once"
            )


N_ANSWERS = 2000  # each answer one seed; about 2 s on a 2-core machine


@pytest.mark.constrained_sampler
def test_constrained_answers_follow_the_renormalised_distribution(impl, tokenizer):
    """The probability of each whole answer (a token path to end-of-text) is the product of the
    model's probabilities renormalised over the allowed tokens at each step. Chi-square over the
    answers; false failure for a correct implementation: ALPHA (1e-5)."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    regex = "(Romeo|Juliet)"
    model = LastTokenTable(cfg, seed=1)
    sampler = constrained(impl, model, tokenizer, regex)
    prompt = torch.tensor(tokenizer.encode("ROMEO.\n"))
    oracle = OutlinesIndex(regex, VOCAB, EOS)
    paths = exact_answer_probabilities(model, oracle, int(prompt[-1]))
    answers = draw_answers(sampler, prompt, N_ANSWERS, temperature=1.0)
    try:
        assert_answers_follow(answers, paths, f"ConstrainedSampler on {regex!r}")
    except AssertionError as error:
        # A known mistake: probabilities (a softmax) handed on where logits are expected, so
        # that the sampler's own softmax flattens them. Do the answers follow that instead?
        flat = LastTokenTable(cfg, seed=1)
        flat.table = model.table.softmax(-1)
        try:
            flat_paths = exact_answer_probabilities(flat, oracle, int(prompt[-1]))
            assert_answers_follow(answers, flat_paths, "")
        except AssertionError:
            raise error from None
        raise AssertionError(
            f"{error} The answers follow the distribution of a softmax taken twice: "
            "next_logits returned probabilities (a softmax of the logits, masked) where "
            "logits are expected, and the sampler's own softmax flattened them. Return the "
            "masked logits"
        ) from None


@pytest.mark.constrained_sampler
def test_top_k_chooses_among_the_allowed_tokens(impl, tokenizer):
    """top_k=2 with a model whose two favourites are always refused: top-k must act after the
    mask, on the allowed tokens. False failure for a correct implementation: ALPHA (1e-5)."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    regex = "(Romeo|Juliet)"
    favour = [VOCAB.index(b"x"), VOCAB.index(b" the")]
    model = LastTokenTable(cfg, seed=2, favour=favour)
    sampler = constrained(impl, model, tokenizer, regex)
    prompt = torch.tensor(tokenizer.encode("ROMEO.\n"))
    oracle = OutlinesIndex(regex, VOCAB, EOS)
    paths = exact_answer_probabilities(model, oracle, int(prompt[-1]), top_k=2)
    try:
        answers = draw_answers(sampler, prompt, N_ANSWERS // 2, top_k=2)
    except RuntimeError as error:
        raise AssertionError(
            f"sampling with top_k=2 failed ({str(error).splitlines()[0]}): the model's two "
            "favourites are never allowed here, so top-k before the mask leaves nothing to "
            "draw from. The mask must come first, then top-k among the allowed tokens."
        ) from None
    assert_answers_follow(answers, paths, f"ConstrainedSampler on {regex!r} with top_k=2")


class HashNoise(torch.nn.Module):
    """Logits drawn afresh for every text (seeded by the tokens themselves): a model with no
    preferences a constraint could hide behind, deterministic for a given text."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        seed = hash(tuple(tokens[0].tolist())) % (2**31)
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*tokens.shape, self.cfg.d_vocab, generator=g) * 3


class OnMeta(torch.nn.Module):
    """A model whose logits are on PyTorch's `meta` device (shapes, no values): a stand-in for
    a model on a GPU, whose logits a mask made on the CPU cannot be applied to."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.cfg.d_vocab, device="meta")


@pytest.mark.constrained_sampler
def test_the_mask_is_made_on_the_logits_device(impl, tokenizer):
    """On a GPU the logits are on the GPU: the mask must be made beside them. The test's model
    gives its logits on the meta device; `sample` (given) would set the guide and the count as
    here before the first call."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    sampler = constrained(impl, OnMeta(cfg), tokenizer, "(Romeo|Juliet)")
    sampler.guide, sampler.n_seen = impl.Guide(sampler.index), None
    try:
        got = sampler.next_logits(torch.tensor(tokenizer.encode("ROMEO.\n")))
    except (RuntimeError, NotImplementedError) as error:
        if "device" not in str(error) and "meta" not in str(error):
            raise
        raise AssertionError(
            f"with the model's logits on another device than the CPU (meta here, a GPU in "
            f"use), next_logits fails: {str(error).splitlines()[0]}. Is the mask made on the "
            "CPU, token_mask called without the logits' device (logits.device)?"
        ) from None
    assert got.device.type == "meta", (
        f"the logits came from the model on the meta device, and next_logits returned them on "
        f"{got.device}: they stay on the model's device."
    )


SAMPLED = [
    "(Romeo|Juliet|Romeo and Juliet)",
    "[A-Z][a-z]{2,5}",
    "[0-9]{3}-[0-9]{4}",
    "(é|日本|😀){1,3}x",
    '"[^"\\\\\\x00-\\x1f]{0,6}"',
    r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?",
]
N_PER_REGEX = 100


def answer_text(tokens: tuple[int, ...]) -> str:
    return b"".join(VOCAB[t] for t in tokens).decode("utf-8")


@pytest.mark.constrained_sampler
def test_every_answer_fullmatches_its_regex(impl, tokenizer, shipped):
    """N_PER_REGEX seeded answers per regex from a noise model, and a few from the shipped model,
    each ends with end-of-text and its text fullmatches the regex."""
    model = shipped[0]
    for regex in SAMPLED:
        index = impl.TokenIndex(impl.regex_to_byte_dfa(regex), list(VOCAB), EOS)
        noise = HashNoise(model.cfg)
        runs = [("a noise model", noise, N_PER_REGEX), ("the shipped model", model, 3)]
        for who, m, n in runs:
            sampler = impl.ConstrainedSampler(m, tokenizer, index)
            prompt = torch.tensor(tokenizer.encode("ROMEO.\n"))
            for answer in draw_answers(sampler, prompt, n, temperature=1.0):
                assert answer and answer[-1] == EOS, (
                    f"{regex!r} with {who}: an answer of {len(answer)} tokens did not end with "
                    f"end-of-text ({answer_text(tuple(t for t in answer if t != EOS))!r})"
                )
                text = answer_text(answer[:-1])
                assert re.fullmatch(regex, text), (
                    f"{regex!r} with {who}: the answer {text!r} does not match"
                )


# --------------------------------------------------------------------------- schema_to_regex

# Schemas with what each exercises: every scalar type; an enum whose strings need escaping (a
# dot, a quote, a backslash, a non-ASCII letter) beside a number, null and true; a const; arrays
# empty or not, bounded, of enums and of arrays; objects with keys that need escaping, nested.
SCHEMAS = [
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"enum": ["St. Peter's", 'say "no"', "back\\slash", "Tybalt", "été", 3, 2.5, None, True]},
    {"type": "string", "const": "Verona"},
    {"enum": [[1, 2], {"a": None}, "x"]},
    {"type": "array", "items": {"const": [1, "a"]}, "maxItems": 2},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "items": {"enum": ["Romeo", "Juliet"]}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2},
    {"type": "array", "items": {"type": "number"}, "maxItems": 0},
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "title": "a scene",
        "type": "object",
        "properties": {
            "act.scene": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
            "où": {"enum": ["Vérone", "Mantoue"]},
            "cast": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"who": {"type": "string"}, "lines": {"type": "number"}},
                    "required": ["who", "lines"],
                },
            },
            "done": {"type": "boolean"},
        },
        "required": ["act.scene", "où", "cast", "done"],
    },
]
SCHEMA_IDS = [" ".join(json.dumps(s, ensure_ascii=False).split())[:40] for s in SCHEMAS]


def random_document(schema: dict, rng: random.Random):
    """A document `schema` allows, drawn at random (strings with escapes and non-ASCII)."""
    if "enum" in schema or "const" in schema:
        return rng.choice(schema.get("enum", [schema.get("const")]))
    kind = schema["type"]
    if kind == "string":
        return "".join(rng.choice('ab "\\/\n\té😀日') for _ in range(rng.randrange(6)))
    if kind == "integer":
        return rng.choice([0, 7, -3, 120, 10**12])
    if kind == "number":
        return rng.choice([0, -1, 2.5, 1e-7, 6.02e23, 13])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        low, high = schema.get("minItems", 0), schema.get("maxItems", 4)
        return [random_document(schema["items"], rng) for _ in range(rng.randint(low, high))]
    return {key: random_document(sub, rng) for key, sub in schema["properties"].items()}


def learner_regex(impl, schema: dict) -> str:
    given = copy.deepcopy(schema)
    regex = impl.schema_to_regex(given)
    shown = json.dumps(schema, ensure_ascii=False)
    assert given == schema, (
        f"schema_to_regex({shown}) changed the schema it was given, to "
        f"{json.dumps(given, ensure_ascii=False)}: does it `pop` from it or assign into it? The "
        "caller's schema is still needed (the server validates answers with it, and a second "
        "call must give the same regex): read it, never change it"
    )
    assert isinstance(regex, str), (
        f"schema_to_regex({shown}) returned {type(regex).__name__}, not a str"
    )
    negative = re.search(r"\{-\d+,|,-\d+\}", regex)
    assert negative is None, (
        f"schema_to_regex({shown}) gave {regex!r}, with the repeat {negative.group()}...: a "
        "negative bound (Python's `re` quietly reads it as literal text). Can `minItems - 1` "
        "or `maxItems - 1` go below 0?"
    )
    try:
        re.compile(regex)
        parse_pattern(regex)
    except Exception as error:
        raise AssertionError(
            f"schema_to_regex({shown}) gave {regex!r}, which is no regex "
            f"({type(error).__name__}: {error})"
        ) from None
    return regex


def slip_regex(schema: dict, slip: str) -> str:
    """The regex a known mistake makes of `schema` itself, its parts' regexes (items,
    properties) right (outlines-core's), to name the mistake when the learner's regex of this
    part matches the same texts."""
    comma = ", " if slip in ("spaces", "comma_space") else ","
    colon = ": " if slip == "spaces" else ":"

    def lit(value) -> str:
        if slip == "str":
            text = str(value)
        else:
            text = json.dumps(value, ensure_ascii=slip == "ascii", separators=(comma, colon))
        return text if slip == "unescaped" else re.escape(text)

    def part(sub: dict) -> str:  # an item's or a property's regex: right, unless ungrouped
        if slip == "ungrouped" and ("enum" in sub or "const" in sub):
            return "|".join(lit(v) for v in sub.get("enum", [sub.get("const")]))
        return outlines_schema_regex(sub)

    scalars = {"string": f'"{RFC_STRING_CHAR}*"', "integer": r"-?(0|[1-9][0-9]*)",
               "number": r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
               "boolean": "(true|false)", "null": "null"}  # fmt: skip
    if slip == "type_first" and schema.get("type") in scalars:
        return f"({scalars[schema['type']]})"
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        if slip == "const_as_list":
            if "const" not in schema or not isinstance(schema["const"], (str, list)):
                raise ValueError("no such slip here")
            values = list(schema["const"])
        alternatives = "|".join(lit(v) for v in values)
        return alternatives if slip == "ungrouped" else f"({alternatives})"
    kind = schema["type"]
    if kind == "array":
        item = part(schema["items"])
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if slip == "bounds":
            low, high = 0, None
        if high == 0:
            return r"\[\]"
        low_shift = 0 if slip in ("bounds_off_by_one", "min_off_by_one") else 1
        high_shift = 0 if slip in ("bounds_off_by_one", "max_off_by_one") else 1
        top = "" if high is None else high - high_shift
        more = f"({re.escape(comma)}{item}){{{max(low - low_shift, 0)},{top}}}"
        optional = "?" if low == 0 and slip != "no_empty_array" else ""
        return rf"\[({item}{more}){optional}\]"
    if kind == "object":
        items = list(schema["properties"].items())
        if slip == "sorted_keys":
            items.sort()
        fields = [f"{lit(k)}{re.escape(colon)}{part(v)}" for k, v in items]
        return r"\{" + re.escape(comma).join(fields) + r"\}"
    raise ValueError("no slip for a scalar")


SLIPS = {
    "unescaped": "a key or an enum value put into the regex unescaped: its `.`, `\\` or quote "
    "are regex syntax there (escape each literal with re.escape)",
    "ascii": "`json.dumps` escaped the non-ASCII characters (`\\u00e9` for `é`): give it "
    "`ensure_ascii=False`, so that the text is the characters themselves",
    "str": "a value written with Python's `str` (`True`, `None`, no quotes around a string) "
    'instead of as JSON writes it (`json.dumps`: `true`, `null`, `"Tybalt"`)',
    "spaces": "spaces after the commas and colons (`json.dumps`'s default separators): the "
    "rule is compact JSON, no whitespace at all",
    "comma_space": "a space after each comma: the rule is compact JSON, no whitespace at all",
    "ungrouped": 'an enum\'s alternatives not in a group: `"a"|"b"` placed inside an object '
    "or array splits the whole regex in two (put them in parentheses)",
    "bounds": "minItems and maxItems ignored",
    "min_off_by_one": "minItems applied to the repeated `,item` part as it is: that part comes "
    "once fewer than the items (minItems 1 asks for no `,item` at all)",
    "max_off_by_one": "maxItems applied to the repeated `,item` part as it is: that part comes "
    "once fewer than the items (maxItems 3 allows two `,item`)",
    "bounds_off_by_one": "minItems and maxItems applied to the repeated `,item` part, which "
    "comes once fewer than the items",
    "const_as_list": "`const` read as a list of values, as `enum` is: a const is ONE value, so "
    "each character of a string const (or each element of an array const) became an "
    "alternative of its own",
    "no_empty_array": "the empty array `[]` refused: without minItems an array may be empty",
    "sorted_keys": "the keys in sorted order: they must come in the schema's order (the order "
    "of `properties`)",
    "type_first": "the type read before enum or const: with both given, the values decide "
    '(any string is not `"Verona"`); look for enum and const first',
}


def made_by_slip(regex: str, schema: dict, slip: str) -> bool:
    """Whether `regex` matches exactly the texts the known mistake `slip` makes of `schema`."""
    try:
        return same_texts(regex, slip_regex(schema, slip))
    except Exception:  # noqa: BLE001 - a slip that does not apply to this schema
        return False


def ungrouped_part(impl, schema: dict) -> dict | None:
    """A part of `schema` (its items, a property's schema) whose regex by the learner is right
    alone but not a group: inside its parent's regex, its `|` splits the parent's in two."""
    kind = schema.get("type") if "enum" not in schema and "const" not in schema else None
    parts = [schema["items"]] if kind == "array" else []
    parts += list(schema.get("properties", {}).values()) if kind == "object" else []
    for part in parts:
        regex = learner_regex(impl, part)
        if not same_texts(f"<{regex}>", f"<({regex})>"):
            return part
    return None


def same_texts(a: str, b: str) -> bool:
    return regex_difference(a, b) is None and regex_difference(b, a) is None


def first_wrong_part(impl, schema: dict) -> dict:
    """The innermost part of `schema` (itself, its items, a property's schema) whose regex by
    the learner differs from outlines-core's while its own parts' regexes do not."""
    parts = []
    if schema.get("type") == "array" and "enum" not in schema and "const" not in schema:
        parts = [schema["items"]]
    elif schema.get("type") == "object" and "enum" not in schema and "const" not in schema:
        parts = list(schema["properties"].values())
    for part in parts:
        try:
            wrong = not same_texts(learner_regex(impl, part), outlines_schema_regex(part))
        except AssertionError:
            wrong = True
        if wrong:
            return first_wrong_part(impl, part)
    return schema


def explain_schema_regex(impl, schema: dict, found: str = "") -> str:
    """What the learner's regex gets wrong: in the innermost part that is wrong, a shortest
    text the learner's regex wrongly takes or refuses, and the mistake whose regex matches
    exactly the same texts, if one does."""
    part = first_wrong_part(impl, schema)
    regex, oracle = learner_regex(impl, part), outlines_schema_regex(part)
    shown = json.dumps(part, ensure_ascii=False)
    where = "" if part is schema else " (the first part of the schema whose regex is wrong)"
    evidence = [f"schema_to_regex({shown}) = {regex!r}{where}."]
    missing, extra = regex_difference(oracle, regex), regex_difference(regex, oracle)
    if missing is not None:
        evidence.append(
            f"It refuses {missing!r}, the compact JSON of a document the schema allows."
        )
    if extra is not None:
        evidence.append(f"It accepts {extra!r}, which is not the compact JSON of any document "
                        "the schema allows.")  # fmt: skip
    # The diagnosis first, the evidence after it: a schema and its regex can run to a
    # thousand characters, and the sentence that names the mistake must not come last.
    why = None
    loose = ungrouped_part(impl, part)
    if loose is not None:
        why = (
            f"The regex of the part {json.dumps(loose, ensure_ascii=False)} is "
            f"{learner_regex(impl, loose)!r}, right alone but not in a group: placed inside "
            "its parent's regex, its `|` splits the parent's regex in two. Put each part's "
            "alternatives in parentheses."
        )
    if why is None:
        why = next((f"This looks like {sentence}." for slip, sentence in SLIPS.items()
                    if made_by_slip(regex, part, slip)), None)  # fmt: skip
    return " ".join(([why] if why else []) + ([found] if found else []) + evidence)


@pytest.mark.json_schema
@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_schema_regex_matches_every_document_the_schema_allows(impl, schema):
    """Random documents the schema allows (jsonschema says so), written as compact JSON, each
    fullmatches the learner's regex."""
    regex = learner_regex(impl, schema)
    rng = random.Random(0)
    for _ in range(200):
        document = random_document(schema, rng)
        jsonschema.validate(document, schema)
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        if not re.fullmatch(regex, text):
            found = (
                f"The document {text} fits the schema (jsonschema) but does not fullmatch "
                "your regex."
            )
            raise AssertionError(explain_schema_regex(impl, schema, found))


@pytest.mark.json_schema
@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_schema_regex_matches_the_same_texts_as_outlines_cores(impl, schema):
    """The learner's regex and outlines-core's `build_regex_from_schema` (no whitespace; its
    string character and exponent made JSON's) match exactly the same texts: their automata
    are compared, and a shortest text one matches and the other does not is shown."""
    if not same_texts(learner_regex(impl, schema), outlines_schema_regex(schema)):
        raise AssertionError(explain_schema_regex(impl, schema))


@pytest.mark.json_schema
def test_sampled_answers_to_a_schema_are_valid_json_documents(impl, tokenizer):
    """Answers drawn from a noise model through the learner's regex, index and sampler: each
    ends with end-of-text, parses with `json.loads` and validates with `jsonschema`."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    schema = SCHEMAS[-1]["properties"]["cast"]["items"]
    sampler = constrained(impl, HashNoise(cfg), tokenizer, learner_regex(impl, schema))
    prompt = torch.tensor(tokenizer.encode("ROMEO.\n"))
    for seed in range(40):
        answer = tuple(sampler.sample(prompt, 60, seed=seed)[len(prompt) :].tolist())
        if answer[-1] != EOS:
            continue  # 60 tokens were not enough (a long string): no complete answer to check
        text = answer_text(answer[:-1])
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as error:
            raise AssertionError(
                f"the answer {text!r} to {json.dumps(schema)} is not a valid document: "
                f"{str(error).splitlines()[0]}"
            ) from None


# --------------------------------------------------------------------------- token_bitmask


def unpacked(row: torch.Tensor, d_vocab: int) -> list[int]:
    """The token ids whose bit is set in a bitmask row, read by numpy in xgrammar's layout (bit
    k of int32 word w is token 32w + k, least significant bit first)."""
    import numpy as np

    bits = np.unpackbits(row.contiguous().numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:d_vocab]).tolist()


def explain_bitmask_row(allowed: list[int], d_vocab: int, row) -> str:
    """What a wrong row points to."""
    head = f"bitmask_of({len(allowed)} ids, d_vocab={d_vocab}): "
    width = (d_vocab + 31) // 32
    if not isinstance(row, torch.Tensor):
        return head + f"returned {type(row).__name__}, not a tensor"
    if row.dtype != torch.int32:
        hint = ""
        if row.dtype == torch.int64:
            hint = (
                " A word whose bit 31 is set is 2**31 or more as an int64; as int32 it is "
                "that minus 2**32 (negative): convert with the wrap, not by clamping."
            )
        return head + f"dtype {row.dtype}, expected torch.int32 (xgrammar's words).{hint}"
    if tuple(row.shape) != (width,):
        return head + (
            f"shape {tuple(row.shape)}, expected ({width},): one int32 word per 32 tokens, "
            f"rounded up ({d_vocab} tokens)"
        )
    got = unpacked(row, d_vocab)
    if got == sorted(allowed):
        return ""
    flipped = sorted(32 * (t // 32) + 31 - t % 32 for t in allowed)
    if got == flipped:
        return head + (
            "each word's bits are in the reverse order: token 32w + k is bit k of word w, "
            "counted from the least significant bit (1 << k), not from the top"
        )
    lost = sorted(set(allowed) - set(got))
    extra = sorted(set(got) - set(allowed))
    if lost and all(t % 32 == 31 for t in lost):
        return head + (
            f"tokens {lost[:5]} (bit 31 of their word) are missing: the top bit makes an int32 "
            "negative; keep it (wrap the word into int32's range) rather than drop or clamp it"
        )
    return head + f"bits missing for tokens {lost[:5]}, set for tokens {extra[:5]}"


@pytest.mark.token_bitmask
@pytest.mark.parametrize("d_vocab", [4096, 50, 4100])
def test_bitmask_rows_are_xgrammars_layout(impl, d_vocab):
    """Rows for allowed sets of every kind (a top bit, the last word, empty, half the
    vocabulary at random), read back by numpy in xgrammar's layout; the width is xgrammar's
    (`allocate_token_bitmask`)."""
    xgr = pytest.importorskip("xgrammar")
    generator = torch.Generator().manual_seed(0)
    cases = [[0], [31], [0, 31, 32, 63], [d_vocab - 1], [], list(range(0, d_vocab, 3)),
             torch.randperm(d_vocab, generator=generator)[: d_vocab // 2].tolist()]  # fmt: skip
    for allowed in ([t for t in case if t < d_vocab] for case in cases):
        row = impl.bitmask_of(list(allowed), d_vocab)
        why = explain_bitmask_row(allowed, d_vocab, row)
        assert not why, why
        assert tuple(xgr.allocate_token_bitmask(1, d_vocab).shape) == (1, len(row))


@pytest.mark.token_bitmask
def test_bitmask_rows_equal_xgrammars_along_a_json_path(impl):
    """xgrammar's matcher fills a row at every step of a JSON answer; the learner's row made
    from the same allowed ids is the same int32 words."""
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo([b or b"" for b in VOCAB], xgr.VocabType.RAW, vocab_size=len(VOCAB),
                             stop_token_ids=[EOS])  # fmt: skip
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    schema = {"type": "object", "properties": {"name": {"type": "string"},
              "age": {"type": "integer"}}, "required": ["name", "age"]}  # fmt: skip
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(
        schema, any_whitespace=False, separators=(",", ":")))  # fmt: skip
    theirs = xgr.allocate_token_bitmask(1, len(VOCAB))
    text = b'{"name":"Juliet","age":13}'
    for piece in [text[i : i + 1] for i in range(len(text))]:
        matcher.fill_next_token_bitmask(theirs)
        allowed = unpacked(theirs[0], len(VOCAB))
        ours = impl.bitmask_of(allowed, len(VOCAB))
        why = explain_bitmask_row(allowed, len(VOCAB), ours)
        assert not why, why
        assert torch.equal(ours, theirs[0]), f"after {text[: text.index(piece)]!r}"
        assert matcher.accept_token(VOCAB.index(piece))


@pytest.mark.token_bitmask
@pytest.mark.parametrize("d_vocab", [4096, 4100])
def test_apply_token_bitmask_equals_xgrammars(impl, d_vocab):
    """Random words (negative ones too), a row of all ones (an unconstrained request), float32
    and bfloat16: the learner's logits equal xgrammar's `apply_token_bitmask_inplace`; the
    caller's logits are unchanged."""
    xgr = pytest.importorskip("xgrammar")
    generator = torch.Generator().manual_seed(1)
    width = (d_vocab + 31) // 32
    rows = torch.randint(-(2**31), 2**31 - 1, (4, width), dtype=torch.int32, generator=generator)
    rows[0] = -1
    rows[1] = 0
    rows[1, 0] = 1 << 5  # one token allowed: id 5
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(4, d_vocab, generator=generator).to(dtype)
        before = logits.clone()
        theirs = logits.clone()
        xgr.apply_token_bitmask_inplace(theirs, rows)
        try:
            ours = impl.apply_token_bitmask(logits, rows)
        except RuntimeError as error:
            bits = rows.shape[1] * 32
            if bits != d_vocab and str(bits) in str(error) and str(d_vocab) in str(error):
                raise AssertionError(
                    f"with {d_vocab} logits a row has {rows.shape[1]} words, {bits} bits, and "
                    f"apply_token_bitmask failed ({error}): the last word's bits past d_vocab "
                    f"belong to no token (the prose's spare bits). Keep the first {d_vocab} "
                    "columns of the unpacked bits and drop the rest before masking."
                ) from None
            raise
        assert torch.equal(logits, before), (
            "apply_token_bitmask changed the caller's logits: return a new tensor "
            "(masked_fill, without the underscore)"
        )
        assert isinstance(ours, torch.Tensor) and ours.shape == logits.shape, (
            f"expected a tensor of shape {tuple(logits.shape)}, got "
            f"{getattr(ours, 'shape', type(ours).__name__)}"
        )
        assert ours.dtype == dtype, f"the logits came back as {ours.dtype}, not {dtype}"
        wrong = (ours != theirs).any(dim=1)
        if wrong.any():
            r = int(wrong.nonzero()[0])
            kept = torch.isfinite(ours[r]).nonzero().flatten().tolist()
            want = torch.isfinite(theirs[r]).nonzero().flatten().tolist()
            what = {0: "a row of all ones (-1: every token allowed)", 1: "a row with only "
                    "token 5 allowed"}.get(r, f"row {r} (random words)")  # fmt: skip
            hint = ""
            shifted = (rows[r][:, None] >> torch.arange(32)).flatten()[:d_vocab] != 0
            if kept == shifted.nonzero().flatten().tolist():
                hint = (
                    " That is what `word >> k` gives without `& 1`: the bits above bit k come "
                    "along, and any of them set keeps the token."
                )
            width = rows.shape[1]
            transposed = sorted((t % 32) * width + t // 32 for t in want)
            pad = width * 32 - d_vocab
            front = sorted(t - pad for t in want if t >= pad)
            if kept == [t for t in transposed if t < d_vocab] and kept != want:
                hint = (
                    f" Token 5 would be at {5 % 32 * width + 5 // 32} = 5 x {width} (the "
                    "number of words): the bits are laid out bit by bit across the words. "
                    "Flatten `[batch, words, 32]` word by word, each word's 32 bits together"
                )
            elif pad and kept == front:
                hint = (
                    f" Every kept token is {pad} places early ({width * 32} bits for {d_vocab} "
                    "tokens): the spare bits are at the END of the last word; drop the last "
                    "columns, not the first"
                )
            if r == 0 and not kept:
                hint = (" A word of -1 has all 32 bits set: read bit k with an arithmetic "
                        "shift and `& 1`, which works on negative words too.")  # fmt: skip
            raise AssertionError(
                f"on {what}, {dtype}: {len(kept)} tokens kept, xgrammar keeps {len(want)} "
                f"(first differences: kept {sorted(set(kept) - set(want))[:5]}, dropped "
                f"{sorted(set(want) - set(kept))[:5]}). Token 32w + k is kept when bit k of "
                f"word w is 1; every other logit becomes -inf.{hint}"
            )


# --------------------------------------------------------------------------- jump_forward

# Regexes with forced text of each kind: a fixed run, an optional end that must not be forced,
# a shared start of two choices, digits with a forced dash, non-ASCII characters (a token may
# end inside one), a repeated group, and a compact JSON object.
FORCED_BATTERY = [
    "abc(d)?",
    "(Romeo and Juliet|Romeo and Rosaline)",
    "[0-9]{3}-[0-9]{2}",
    "(é|日本)x+",
    "x(yz)*w",
    r'\{"speaker":("ROMEO"|"JULIET"),"act":-?(0|[1-9][0-9]*),"où":("Vérone"|"Mantoue")\}',
]


def explain_forced(dfa, state, got, want, text_so_far: bytes) -> str:
    head = (
        f"after the text {text_so_far!r}: forced_text gave {got!r}, xgrammar's "
        f"find_jump_forward_string gives {want!r}. "
    )
    if not isinstance(got, str):
        return head + f"It must return a str, got {type(got).__name__}."
    if want and got.startswith(want) or (not want and got and state in dfa.finals):
        return head + (
            "It went on too far: stop at a final state (the text may end there, so nothing "
            "after it is forced) and wherever two or more bytes may come next."
        )
    if got and want.startswith(got):
        return head + "It stopped too early: go on while exactly one byte may come next."
    if want == "" and got and len(dfa.transitions[state]) > 1:
        return head + (
            f"Nothing is forced here: {len(dfa.transitions[state])} different bytes may come "
            "next. Count the bytes that may come next, not the states they lead to (several "
            "bytes may lead to one state)."
        )
    if want == "" and got:
        return head + (
            "Nothing is forced here. If the text ends inside a character (a token ended in the "
            "middle of one), the forced bytes begin with the rest of that character and are no "
            'text of their own: whole_characters gives "" for them (decoding with '
            "errors='ignore' drops those bytes and gives text that does not start here)."
        )
    return head + "Walk from the state given, one byte at a time, while it is the only one."


@pytest.mark.jump_forward
@pytest.mark.parametrize("regex", FORCED_BATTERY, ids=range(len(FORCED_BATTERY)))
def test_forced_text_equals_xgrammars_jump_forward_string(impl, regex):
    """At every step of 15 random answers (tokens drawn among those xgrammar allows), the
    learner's forced text from the DFA's state equals xgrammar's `find_jump_forward_string`
    on the same regex (`compile_regex`)."""
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo([b or b"" for b in VOCAB], xgr.VocabType.RAW, vocab_size=len(VOCAB),
                             stop_token_ids=[EOS])  # fmt: skip
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_regex(regex)
    dfa = impl.regex_to_byte_dfa(regex)
    rng = random.Random(0)
    bitmask = xgr.allocate_token_bitmask(1, len(VOCAB))
    for _ in range(15):
        matcher, state, text = xgr.GrammarMatcher(compiled), dfa.initial, b""
        for _ in range(40):
            want = matcher.find_jump_forward_string()
            try:
                got = impl.forced_text(dfa, state)
            except UnicodeDecodeError as error:
                raise AssertionError(
                    f"after the text {text!r}: forced_text raised UnicodeDecodeError ({error}). "
                    "The forced bytes begin inside a character (the last token ended in the "
                    "middle of one) or end inside one: that is what whole_characters is for "
                    '(it keeps the whole characters, and gives "" for bytes that begin inside '
                    "one)"
                ) from None
            assert got == want, explain_forced(dfa, state, got, want, text)
            matcher.fill_next_token_bitmask(bitmask)
            allowed = [t for t in unpacked(bitmask[0], len(VOCAB)) if t != EOS]
            if not allowed:
                break
            token = rng.choice(allowed)
            assert matcher.accept_token(token)
            for byte in VOCAB[token]:
                state = dfa.step(state, byte)
            text += VOCAB[token]


@pytest.mark.token_bitmask
def test_apply_token_bitmask_works_where_the_logits_are(impl):
    """Logits and bitmask on another device (PyTorch's `meta` device stands for a GPU: shapes
    and dtypes, no data): every tensor the function makes must be made there too."""
    logits = torch.empty(4, 4096, device="meta")
    bitmask = torch.empty(4, 128, dtype=torch.int32, device="meta")
    try:
        out = impl.apply_token_bitmask(logits, bitmask)
    except (RuntimeError, NotImplementedError) as error:
        if isinstance(error, NotImplementedError) and not str(error):
            raise
        raise AssertionError(
            f"with the logits and the bitmask on another device (a GPU; here `meta`): "
            f"{type(error).__name__}: {str(error).splitlines()[0]}. A tensor made inside "
            "apply_token_bitmask (the shifts, `torch.arange`, a filler) is on the CPU: make "
            "each on the bitmask's device"
        ) from None
    assert out.device.type == "meta", f"the result is on {out.device}, not the logits' device"


@pytest.mark.token_bitmask
def test_apply_token_bitmask_is_one_operation_for_the_whole_batch(impl):
    """The same number of PyTorch operations for a batch of 1 and of 64 rows: no loop over the
    rows (each row's mask applied in a Python loop costs a kernel launch per row on a GPU)."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for batch in (1, 64):
        logits = torch.randn(batch, 4096)
        bitmask = torch.full((batch, 128), -1, dtype=torch.int32)
        with Count() as count:
            impl.apply_token_bitmask(logits, bitmask)
        counts.append(count.calls)
    assert counts[0] == counts[1], (
        f"apply_token_bitmask made {counts[0]} PyTorch calls for 1 row and {counts[1]} for 64: "
        "it does work per row (a Python loop over the batch?). Mask every row in one "
        "operation: broadcast the shifts over all rows at once"
    )


@pytest.mark.constrained_sampler
def test_the_guide_reads_every_token_appended_since_the_last_call(impl, tokenizer):
    """Another caller: one that appends two tokens between two calls (as jump-forward or a
    speculative step does), `Rome` then `o`. The guide must read both, in order."""
    from utils.models import load_model

    cfg = load_model("shakespeare")[0].cfg
    regex = "(Romeo|Juliet)"
    sampler = constrained(impl, HashNoise(cfg), tokenizer, regex)
    sampler.guide, sampler.n_seen = impl.Guide(sampler.index), None  # what `sample` sets
    prompt = tokenizer.encode("ROMEO.\n")
    rome, o = VOCAB.index(b"Rome"), VOCAB.index(b"o")
    sampler.next_logits(torch.tensor(prompt))
    try:
        logits = sampler.next_logits(torch.tensor([*prompt, rome, o]))
    except ValueError as error:
        raise AssertionError(
            f"two tokens ('Rome', 'o') were appended since the last call, and the guide "
            f"refused one ({error}): does it read only the last token? Read every token from "
            "`self.n_seen` on"
        ) from None
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [EOS], (
        "after 'Rome' and 'o' (two tokens appended since the last call) only end-of-text is "
        f"allowed, but the mask allows {sample_of(allowed, VOCAB)}: the guide did not read "
        "both tokens. Read every token of `input_ids` from `self.n_seen` on, in order"
    )
