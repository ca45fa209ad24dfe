# %% [markdown]
# # Chapter 9 — Output that must parse
#
# Ask a model for JSON and it usually gives you JSON. A program that reads the answer needs
# *always*: one missing quote and the parser throws. **Constrained decoding** makes "always"
# true by construction: at every step, before a token is drawn, every token that would take the
# text outside what is allowed gets probability 0. The model still chooses; it only chooses
# among the tokens that keep the answer valid.
#
# Every serving system you are likely to use offers it:
#
# - vLLM's `structured_outputs` (`StructuredOutputsParams(json=..., regex=..., choice=...,
#   grammar=...)`, or the same fields in a request's `extra_body`), with xgrammar or guidance
#   (llguidance) as backends (vLLM documentation, "Structured Outputs", latest version; the
#   older `guided_json`, `guided_regex`, ... fields were removed in v0.12.0);
# - OpenAI's API: `response_format={"type": "json_schema", "json_schema": {...}}` (OpenAI API
#   documentation, "Structured Outputs" guide);
# - outlines (dottxt-ai/outlines), whose index is the idea you build here (Willard & Louf,
#   2023, *Efficient Guided Generation for Large Language Models*, arXiv:2307.09702), with its
#   core in Rust as `outlines-core`;
# - xgrammar (Dong et al., 2024, *XGrammar: Flexible and Efficient Structured Generation
#   Engine for Large Language Models*, arXiv:2411.15100), which handles grammars with nesting.
#
# The idea is small and has one trap. The constraint speaks of **characters** (a regex, a
# schema); the model speaks **tokens**, and a token is a run of bytes that may end in the middle
# of a character or hold several words' worth of characters. So the question "may this token
# come next?" is answered by walking the token's **bytes** through an automaton of the
# constraint, from where the text stands. Doing that for all 4,096 tokens at every step would
# be slow; doing it once per automaton state, ahead of time, makes each step a lookup.
#
# What you write:
#
# - `token_bytes`: every token id's exact bytes;
# - `walk` and `TokenIndex`: the allowed tokens of every state of a regex's automaton, and
#   where each leads (graded against outlines-core's `Index`);
# - `token_mask` and `mask_logits`: the allowed set applied to the logits;
# - `ConstrainedSampler.next_logits`: chapter 3's sampler, constrained;
# - `schema_to_regex`: a JSON schema as a regex (graded against outlines-core's
#   `build_regex_from_schema` and `jsonschema`);
# - `bitmask_of` and `apply_token_bitmask`: a batch's masks as bits, in xgrammar's layout
#   (graded against xgrammar), as chapter 8's engine and `course serve` apply them (with the
#   reference versions);
# - `forced_text`: the text a constraint forces, appended without the model (graded against
#   xgrammar's jump-forward string).
#
# **Time:** about 3 hours 45 minutes: section 1 takes 30 minutes, section 2
# (reading) 15, section 3 45, sections 4 and 5 30, section 6 30, section 7 25, sections 8 and
# 9 (reading) 25, section 10 25. **You need:** chapter 3's
# `TransformerSampler` and its sampling functions (imported from `solutions`), Python's
# `bytes`, and what a regular expression and a JSON schema are.
#
# ## How this notebook works
#
# As in the chapters before: fill in each **exercise cell** where it says
# `raise NotImplementedError()`, run it, then run the `check("...")` cell below it. From a
# terminal, `pytest -m token_index` (the name in a `check` cell, which is not always the
# function's: `-m json_schema` grades `schema_to_regex`) and `course grade 9` grade your saved
# notebook; `show_solution("TokenIndex")` prints the reference when you are truly stuck.

# %% tags=["setup"]
import json
import os
import re
import time
from collections import deque
from dataclasses import dataclass

import jsonschema
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from solutions.byte_dfa import (
    CONTINUATION,
    CharDFA,
    code_point_range,
    next_byte_range,
    utf8_length,
)
from solutions.json_schema import SCALARS, check_schema, literal
from solutions.sampling import TransformerSampler
from solutions.token_bitmask import BITS, bitmask_width
from utils.check import check
from utils.display import show_solution
from utils.models import load_model

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook with small sizes
print("quick run (CI):", QUICK)
model, tokenizer = load_model("shakespeare")

# %% [markdown]
# ## 1. Tokens as byte strings (30 minutes)
#
# The course's tokenizer is a byte-level BPE, like GPT-2's: every text is first turned into its
# UTF-8 bytes, and tokens are merges of bytes. Its vocabulary file does not store bytes,
# though: it stores strings in which each byte is written as one printable character (GPT-2's
# trick, so that the merge rules could be handled as ordinary strings). A space is written `Ġ`,
# a newline `Ċ`; the 188 printable Latin-1 bytes stand for themselves. `byte_level_alphabet`
# is that map, given:

# %% tags=["source"]
# solution: solutions.token_bytes.byte_level_alphabet

# %% [markdown]
# Look at what the tokenizer does with a text that has non-ASCII characters in it. **Predict,
# then run:** how many tokens does `é` take? What does `decode` make of one of them alone?

# %%
text = "Café 日本"
ids = tokenizer.encode(text)
print(ids)
print(tokenizer.convert_ids_to_tokens(ids))
print([tokenizer.decode([i]) for i in ids])
print("é is", list("é".encode()), "| 日 is", list("日".encode()))

# %% [markdown]
# `é` is two bytes, C3 A9, and this tokenizer spells it with two tokens; `日` is three bytes and
# three tokens. Decoding one of those tokens alone gives `�`, the replacement character: a part
# of a character is not a character. A constraint on text must therefore work on **bytes**: the
# first token of `é` is allowed wherever `é` is, although it is not a character on its own.
#
# ### Exercise: `token_bytes`
#
# `token_bytes(tokenizer)` returns a list with one entry per token id (`len(tokenizer)` of
# them): the bytes that token adds to the text, or `None` for a special token such as
# `<|endoftext|>`, which is not text (the index of section 3 allows it where the text may end,
# not because of its bytes).
#
# Common mistakes: `.encode()` of the token's string (the space marker taken for a character:
# `Ġthe` becomes the five bytes C4 A0 74 68 65 instead of the four of ` the`); `decode` of each
# token alone (a token that holds part of a character becomes U+FFFD, three bytes that were
# never in the text); the special token given its name's bytes, or the empty bytes, instead of
# `None`; the special token's id written as 0 rather than asked of the tokenizer (a tokenizer
# with chat tokens has more than one, at the end).
#
# The tests compare your list with the bytes read from the tokenizer's file through HF's own
# copy of GPT-2's byte map, rebuild texts with accents, em dashes, curly quotes, Japanese and
# emoji from their tokens (against `tokenizer.decode`), and try a tokenizer with a second
# special token.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The tokenizer can give you each id's string as the vocabulary stores it, and it knows which
# ids are special. Each character of such a string is one byte.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Ask for every id's string (`convert_ids_to_tokens` takes a list of ids) and for the special
# ids (`all_special_ids`). For an ordinary token, look up each character of its string in the
# inverted alphabet (`byte_of` in the cell) and make `bytes` of the results; a special token
# gets `None`.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("token_bytes")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="token_bytes"
# solution: solutions.token_bytes.token_bytes

# %%
check("token_bytes")

# %%
vocab = token_bytes(tokenizer)
eos_id = tokenizer.eos_token_id
not_text = [i for i, data in enumerate(vocab) if data is None]
partial = [i for i, data in enumerate(vocab) if data is not None and not data.isascii()]
longest = max((data for data in vocab if data is not None), key=len)
print(f"{len(vocab)} token ids; special (no bytes): {not_text} (end-of-text is {eos_id})")
print(
    f"tokens with non-ASCII bytes: {len(partial)}, each one byte long: "
    f"{all(len(vocab[i]) == 1 for i in partial)}"
)
print(f"longest token: {len(longest)} bytes, {longest!r}")
print(b"".join(vocab[i] for i in ids), "->", b"".join(vocab[i] for i in ids).decode())

# %% tags=["claim"]
assert len(vocab) == 4096 and not_text == [0] and eos_id == 0
assert len(partial) == 128 and all(len(vocab[i]) == 1 for i in partial)
assert len(longest) == 29

# %% [markdown]
# The vocabulary has 4,096 ids; only id 0, `<|endoftext|>`, is not text. The 128 tokens with
# a non-ASCII byte are the single bytes 80 to FF: this tokenizer, trained on English plays,
# learned **no token that holds a whole non-ASCII character**. Every `é` it ever writes is two
# tokens, and a constraint that only allowed tokens that are whole characters could never
# produce one.
#
# ## 2. A regex as an automaton over bytes (15 minutes, reading)
#
# A regular expression is a finite automaton: a set of states, a start, some final states, and
# for each state the characters that may come next and the state each leads to. The text so far
# is a match when it ends in a final state; it can still become one as long as it is in a state
# from which a final state can be reached (a **live** state). Any other state is dead: nothing
# that follows can fix the text.
#
# The course uses `interegular` (a small pure-Python library) to turn the regex into an
# automaton over characters, and the given code below turns that into one over **bytes**: each
# character becomes its 1 to 4 UTF-8 bytes, and a byte state remembers what is pending of the
# character being read. `ByteDFA.transitions[state]` maps each byte that may come next to the
# next state; only live states are kept, so **a byte that has no entry leads to the dead
# state**. The whole text must match, as with `re.fullmatch`.
#
# The regex subset is interegular's: literal characters (any Unicode), escapes, character
# classes with ranges and negation (`[^"]`), `.` (any character but a newline), `\d`, `\w`,
# `\s` (ASCII only: `\d` is `[0-9]`), groups, alternation, and repetition `*`, `+`, `?`,
# `{m}`, `{m,n}`. Anchors `^` and `$`, back-references and Unicode properties (`\p{L}`) are
# refused with an error. (Engines differ on the details: outlines-core's `\d` also matches
# Arabic-Indic digits, and xgrammar's `.` matches a newline. Write `[0-9]` and explicit classes
# when you want the same language everywhere.)

# %% tags=["source"]
# solution: solutions.byte_dfa.ByteDFA
# solution: solutions.byte_dfa.regex_to_byte_dfa

# %% [markdown]
# One detail matters for speed. A class such as `[^"]` (every character but a quote, the inside
# of a JSON string) allows almost every Unicode character alike. Remembering every incomplete
# UTF-8 prefix as its own state would give a JSON string's automaton thousands of states that
# all behave the same; when no character the regex names individually can still come out of a
# prefix, the code keeps only *how many bytes are still to come and the range of the next one*.
# Predict, then run: how many states does the byte automaton of a two-field JSON object have?
# (The regex is the one outlines-core's `build_regex_from_schema` writes for the schema
# `{"name": string, "age": integer}` with no whitespace; a later part of this chapter writes
# such regexes itself.)

# %%
TWO_FIELD = r'\{"name":"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*","age":(-)?(0|[1-9][0-9]*)\}'
two_field_dfa = regex_to_byte_dfa(TWO_FIELD)
romeo_dfa = regex_to_byte_dfa("(Romeo|Juliet)")
print("two-field object:", len(two_field_dfa.transitions), "byte states")
print(
    "(Romeo|Juliet):",
    len(romeo_dfa.transitions),
    "byte states; from the start:",
    [chr(b) for b in romeo_dfa.transitions[romeo_dfa.initial]],
)
for answer in ['{"name":"Juliet","age":13}', '{"name":"Jüliet","age":13}', '{"name":"Juliet"}']:
    print(
        f"{answer!r:32} accepted: {two_field_dfa.accepts(answer.encode())}, "
        f"re.fullmatch: {bool(re.fullmatch(TWO_FIELD, answer))}"
    )

# %% tags=["claim"]
assert len(two_field_dfa.transitions) == 31 and len(romeo_dfa.transitions) == 11

# %% [markdown]
# 31 states for the two-field object, and 11 for `(Romeo|Juliet)`: one per letter read, plus
# the start, minus the final state the two names share. From the start only `R` and `J` may
# come.
#
# ## 3. The token index (45 minutes)
#
# A token is allowed in a state when its bytes, read one by one from that state, never fall
# into the dead state; it then leads to the state where the last byte ends. Nothing about the
# token's being "whole" matters: the first byte of `é` is allowed wherever `é` may come, and
# leads to a state that waits for the second.
#
# Every tokenization of an allowed text must be allowed, not only the one the tokenizer would
# choose. The tokenizer writes `Romeo` as one token, but `Rome` + `o` and five single letters
# spell it too, and at some step the model may prefer them. An index that allowed only the
# tokenizer's own spelling would refuse what the model wants for no reason, and distort its
# choice between `Romeo` and `Juliet` (Willard & Louf's index allows every token whose bytes
# fit; so does outlines-core's).
#
# The end-of-text token adds no bytes. It is allowed exactly in **final** states (the text so
# far is a complete match), and it leaves the state where it is: the request stops there.
#
# Walking all 4,096 tokens from the current state at every step would cost milliseconds per
# token generated. But the states are few (31 for the JSON object above), so the index walks
# every token from every state **once**, ahead of time, and keeps, for each state, a dictionary
# from allowed token to next state. At generation time, "which tokens may come next?" and "where
# am I after this token?" are two lookups. That is outlines' index.
#
# ### Exercise: `walk` and `TokenIndex`
#
# - `walk(dfa, state, data)` reads the bytes `data` from `state` and returns the state reached,
#   or `None` as soon as a byte has no transition.
# - `TokenIndex(dfa, token_bytes, eos_id)` fills `self.transitions`: one dictionary per DFA
#   state (states are `0 .. len(dfa.transitions) - 1`), mapping each allowed token id to its
#   next state, with end-of-text mapped to the state itself in final states (`dfa.finals`).
#   Special tokens (`None` bytes) are never walked.
# - `allowed(state)` gives the allowed ids; `advance(state, token)` the next state (the given
#   line after your code raises for a token that is not allowed).
#
# Common mistakes: allowing only tokens that decode to whole characters (a multi-byte character
# refused because its first token is not a whole character); walking only the first byte of
# each token; keeping on after a byte with no transition (a dead state never detected: tokens
# such as `Rx` allowed); allowing end-of-text outside final states, or not in them; walking a
# special token's `None`; starting every walk from `dfa.initial` instead of the state given;
# assuming end-of-text is id 0.
#
# The tests build your index and outlines-core's `Index` for the same regex and vocabulary, and
# walk both from their start together over every token both allow: their state numbers differ,
# but at every pair of states reached the allowed sets must be equal. The regexes: choices with
# several tokenizations (`(Romeo|Juliet)`, `(Rom|Romeo)`, `(Romeo|Juliet|Romeo and Juliet)`),
# classes with repetition, a number, words with spaces, non-ASCII characters (`(é|日本|😀)+`,
# `[à-ü]+`), a JSON string, `.`, and the two-field object; and a vocabulary with the same
# tokens under other ids, end-of-text last. (outlines-core 0.2.14 refuses a token that crosses
# a point where the text is already a complete match, such as `.` after `1` in the number's
# regex; the tests read its index through a sentinel character that removes the difference, so
# that the oracle has `re.fullmatch`'s meaning, as yours does.)
#
# <details><summary>Hint 1: a nudge</summary>
#
# `walk` is a loop over the bytes with `dfa.step`. The index is two loops, over states and
# over tokens, each calling `walk`; then one more entry for end-of-text in final states.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# In `walk`, step from the given state byte by byte and return `None` the moment a step gives
# `None`. In `__init__`, for each state build a dictionary: for each token id whose bytes are
# not `None`, walk them from that state and keep the id with the end state when the walk
# survives; if the state is in `dfa.finals`, add end-of-text mapped to the state itself; append
# the dictionary to `self.transitions`. `allowed` lists a state's dictionary's keys; `advance`
# looks the token up in it (`dict.get`, so that a refused token gives `None` for the given
# check).
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("TokenIndex")` and `show_solution("walk")` print the
# reference implementation.
#
# </details>

# %% tags=["exercise"] exercise="token_index"
# solution: solutions.token_index.walk
# solution: solutions.token_index.TokenIndex

# %%
check("token_index")

# %% [markdown]
# A request's place in its constraint is one state number. `Guide` holds it: the index is
# shared by every request with the same constraint, and each request has its own guide.

# %% tags=["source"]
# solution: solutions.token_index.Guide

# %% [markdown]
# **Predict, then run.** Which tokens may start an answer to `(Romeo|Juliet)`? Which may follow
# `Rome`? And how long does the index of the two-field object take to build?

# %%
romeo_index = TokenIndex(romeo_dfa, vocab, eos_id)
start = romeo_index.allowed(romeo_index.initial)
print("allowed at the start:", sorted(vocab[t] for t in start))
after_rome = romeo_index.advance(romeo_index.initial, vocab.index(b"Rome"))
print("after 'Rome':", [vocab[t] for t in romeo_index.allowed(after_rome)])
done = romeo_index.advance(after_rome, vocab.index(b"o"))
print("after 'Romeo':", romeo_index.allowed(done), "(end-of-text is", eos_id, ")")
began = time.perf_counter()
two_field_index = TokenIndex(two_field_dfa, vocab, eos_id)
seconds = time.perf_counter() - began
n_transitions = sum(len(row) for row in two_field_index.transitions)
print(
    f"two-field index: {len(two_field_index.transitions)} states, {n_transitions:,} "
    f"transitions, built in {seconds * 1000:.0f} ms"
)

# %% tags=["claim"]
assert sorted(vocab[t] for t in start) == [b"J", b"Juliet", b"R", b"Rome", b"Romeo"]
assert romeo_index.allowed(done) == [0]
assert (len(two_field_index.transitions), n_transitions) == (31, 4548)

# %% [markdown]
# Five tokens may start an answer: `J`, `Juliet`, `R`, `Rome` and `Romeo`. After `Romeo` only
# end-of-text remains. The two-field object's index has 31 states and 4,548 transitions, the
# same counts as outlines-core's `Index` of the same regex on this vocabulary (the tests compare
# the two, set by set).
#
# ## 4. The mask (15 minutes)
#
# The allowed set becomes a mask on the logits: every other token's logit becomes $-\infty$,
# so that softmax gives it probability 0. The allowed tokens keep their logits, so they share
# all the probability in the proportions the model gave them: the model's distribution
# **renormalised** over the allowed set.
#
# The mask comes **before** chapter 3's temperature, top-k and top-p. Top-k before the mask may
# keep $k$ tokens that are all forbidden, and the mask then leaves nothing to draw; top-p before
# it measures its nucleus on probability that the mask throws away, and keeps too few or too
# many allowed tokens. After the mask, they choose among the tokens that can be drawn.
#
# ### Exercise: `token_mask` and `mask_logits`
#
# - `token_mask(allowed, d_vocab, device)`: a boolean tensor `[d_vocab]`, True exactly at the
#   ids in `allowed`, made on `device`.
# - `mask_logits(logits, mask)`: `logits` `[batch, d_vocab]` with $-\infty$ where `mask`
#   `[batch, d_vocab]` is False, as a new tensor; the caller's logits unchanged, the dtype kept.
#
# Common mistakes: a large negative number instead of $-\infty$ (after a temperature, or next
# to logits that low, it keeps some probability); the mask read the wrong way round; an edit
# in place (`masked_fill_`), which changes the caller's logits; the mask made on the CPU when
# the logits are on a GPU.
#
# <details><summary>Hint 1: a nudge</summary>
#
# A tensor of False, then True at a list of positions; and one function of chapter 3 that
# writes a value where a boolean tensor says so.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `torch.zeros` with `dtype=torch.bool` and `device=device`, then index it with a tensor of the
# allowed ids (also on `device`) and assign True. For the logits, `Tensor.masked_fill` (without
# the underscore: a new tensor) where the mask is NOT set.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("mask_logits")` and `show_solution("token_mask")`.
#
# </details>

# %% tags=["exercise"] exercise="mask_logits"
# solution: solutions.token_mask.token_mask
# solution: solutions.token_mask.mask_logits

# %%
check("mask_logits")

# %% [markdown]
# ## 5. A constrained sampler (15 minutes)
#
# Chapter 3's `TransformerSampler.sample` asks `next_logits` for the model's logits at each
# step and hands them to `sample_next_token` (penalty, temperature, top-k or top-p, the draw).
# `ConstrainedSampler` is a chapter-9 **subclass** that changes only `next_logits`: the logits
# come back masked, so the loop and every filter of chapter 3 run unchanged, after the mask.
# (A logits processor handed to the sampler would work too; the subclass needs no change to
# chapter 3's code at all.) Its `sample` starts a fresh `Guide` for each request: the index is
# built once per constraint, the state belongs to the request.
#
# ### Exercise: `ConstrainedSampler.next_logits`
#
# Before the mask, the guide must read the tokens accepted since the last call: the token the
# loop sampled and appended after the previous call (none at the first call). The prompt is
# not part of the constrained text: the guide starts at the constraint's beginning with the
# first generated token. `self.n_seen` (set to `None` by `sample`) is yours to keep count of
# how much of `input_ids` the guide has read.
#
# Common mistakes: walking the prompt's tokens through the constraint (the wrong part of the
# text: `ROMEO.\n` is no start of `Romeo`); reading the same token twice, or the last token
# only at the first call; advancing before the token is accepted (there is no token yet: the
# guide reads what `input_ids` holds); a guide kept in a local variable, so that each step starts
# over; the mask made on the CPU for a model on a GPU.
#
# The tests draw 2,000 seeded answers to `(Romeo|Juliet)` from a model whose logits depend only
# on the last token, so that each answer's probability (a product of renormalised
# probabilities, one per step) is known exactly, and compare by a chi-square test (a correct
# sampler fails it with probability $10^{-5}$); repeat that with `top_k=2` on a model whose two
# favourites are never allowed; check that every one of 100 seeded answers per regex, for six
# regexes, ends with end-of-text and `re.fullmatch`es its regex; give it a prompt that is
# itself the start of an answer (`Rom`); and call it once after two tokens were appended at
# once, as a caller that forces text does.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The tokens the guide has not read yet are `input_ids[self.n_seen:]`, once `n_seen` is set.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# If `self.n_seen` is not `None`, advance the guide over each of those tokens, in order. Then
# set `self.n_seen` to the length of `input_ids`. Make the mask of the guide's allowed tokens
# with your `token_mask` (on the logits' device, as wide as the logits) and return
# `mask_logits` of the logits and the mask, with a batch dimension added to the mask.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("ConstrainedSampler")`.
#
# </details>

# %% tags=["exercise"] exercise="constrained_sampler"
# solution: solutions.constrained_sampling.ConstrainedSampler

# %%
check("constrained_sampler")

# %% [markdown]
# **Predict, then run.** The shipped model, asked after `ROMEO.\n` for one of two names, or for
# a three-digit number: what does it answer, and does every answer fit?

# %%
prompt = tokenizer.encode("ROMEO.\n")
n_answers = 3 if QUICK else 10
fits = []
for regex in ["(Romeo|Juliet)", "[0-9]{3}", "(Romeo|Juliet)( and (Romeo|Juliet))?, [a-z]{2,8}!"]:
    sampler = ConstrainedSampler(
        model, tokenizer, TokenIndex(regex_to_byte_dfa(regex), vocab, eos_id)
    )
    answers = []
    for seed in range(n_answers):
        out = sampler.sample(prompt, 40, seed=seed, temperature=1.0)[len(prompt) :].tolist()
        answers.append(b"".join(vocab[t] for t in out if t != eos_id).decode())
    fit = sum(bool(re.fullmatch(regex, a)) for a in answers)
    fits.append(fit == len(answers))
    print(f"{regex}: {fit} of {len(answers)} fit; {answers[:5]}")

# %% tags=["claim"]
assert all(fits)

# %% [markdown]
# Every answer fits: the mask never lets a token through that would break the regex, and
# end-of-text only where the text is complete. Whether the answers are *good* is still the
# model's business: the constraint decides what is possible, the model what is likely.

# %% [markdown]
# ## 6. A JSON schema as a regex (30 minutes)
#
# "Answer with JSON that fits this schema" is what most programs ask of a model. A schema
# names a set of documents; for many schemas, the texts of those documents form a regular
# language, and everything above applies: turn the schema into a regex, the regex into a DFA,
# the DFA into an index.
#
# A document has many texts: `{"a": 1}`, `{"a":1}` and `{ "a" : 1 }` are the same object. The
# regex picks one spelling, so that each step's allowed set is small and a model cannot spend
# its tokens on layout. The rule here is **compact JSON**, no whitespace between tokens (what
# `json.dumps(value, separators=(",", ":"))` writes), with an object's keys in the schema's
# order; strings keep every spelling JSON allows inside them (escapes included). The engines
# offer the same choice: outlines-core's `build_regex_from_schema` takes a
# `whitespace_pattern` (`""` here; its default in version 0.2.14 is `[ ]?`, one optional
# space), xgrammar's `compile_json_schema` takes `any_whitespace` and `separators`, and vLLM's
# `StructuredOutputsConfig` has `disable_any_whitespace`, which its documentation says makes
# the JSON compact.
#
# The supported schemas (`check_schema`, given, refuses everything else by name, so that no
# schema is ever served by a regex that quietly means something else):
#
# - `type` `string`, `integer`, `number`, `boolean`, `null`: each has its regex below, taken
#   from JSON's grammar (RFC 8259);
# - `enum` (a list of JSON values) and `const` (one value): exactly those values, written as
#   compact JSON writes them;
# - `type` `array` with `items` (one schema for every item), and `minItems` / `maxItems`;
# - `type` `object` with `properties`, every one `required`, no other keys.
#
# Arrays and objects nest: an item or a property is itself a schema. The regex is built by
# recursion, each part's regex placed inside its parent's.

# %%
for name, piece in SCALARS.items():
    print(f"{name:8} {piece}")

# %% [markdown]
# ### Exercise: `schema_to_regex`
#
# `schema_to_regex(schema)` returns the regex that fullmatches exactly the compact JSON texts of
# the documents `schema` allows. The schema has passed `check_schema`.
#
# - An `enum` or `const`: the alternatives, each one value's text as a regex, in a group.
#   `literal(value)` (given) writes a value as compact JSON and escapes it: `"St. Peter's"`
#   must not match `"St: Peter's"`.
# - A scalar type: its regex from `SCALARS`, in a group.
# - An array: `[`, then either nothing or an item followed by `,item` repeated, then `]`; with
#   `minItems` and `maxItems`, the repeat's bounds are one less than the items' (the first item
#   has no comma), the empty array allowed only when `minItems` is 0, and only `[]` when
#   `maxItems` is 0.
# - An object: `{`, each property's key (a JSON string: `literal(key)`), `:`, its value's regex,
#   separated by `,`, in the order of `properties`, then `}`.
#
# Common mistakes: a key or value put into the regex unescaped (its `.` then matches anything);
# `json.dumps` without `ensure_ascii=False` (`é` becomes `\u00e9`, which the model would have to
# spell out) or Python's `str` (`True`, `None`); `json.dumps`'s default separators (a space after
# each comma and colon); an enum's alternatives not grouped (`"a"|"b"` inside an object splits
# the whole regex in two); the empty array forgotten; `minItems` and `maxItems` applied to the
# `,item` part unchanged (one item too many); keys sorted.
#
# The tests build your regex for fourteen schemas, from each scalar type alone to a nested object
# whose keys need escaping, and compare it with outlines-core's `build_regex_from_schema`
# (`whitespace_pattern=""`) by their automata: the two must match exactly the same texts
# (outlines-core 0.2.14 refuses `\uXXXX` escapes and U+007F–U+009F in strings and requires a
# sign in an exponent; the tests put JSON's rules into its regex first). A difference is shown
# as a shortest text one regex takes and the other refuses. They also check that 200 random
# documents per schema, which `jsonschema` validates, fullmatch your regex as compact JSON, and
# that answers sampled through your index parse and validate.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Four cases, in the order of the list above; two of them call `schema_to_regex` on a smaller
# schema (the items', each property's).
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# An enum's values go through `literal` and are joined by `|` inside parentheses; a scalar's
# piece goes inside parentheses too. For an array, build the items' regex once; the commas
# belong to every item but the first, so the repeated part is a comma and an item, with bounds
# one below `minItems` (never below 0) and `maxItems` (none if absent), and the whole run is
# optional when `minItems` is 0. For an object, one part per property, key then colon then the
# value's regex, joined by commas between escaped braces.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("schema_to_regex")`.
#
# </details>

# %% tags=["exercise"] exercise="json_schema"
# solution: solutions.json_schema.schema_to_regex

# %%
check("json_schema")

# %% [markdown]
# **Predict, then run.** The two-field object of section 2 as a schema, and the shipped model
# asked for ten answers of at most 60 tokens: how many finish?


# %%
def answers_to(schema: dict, n: int, max_tokens: int = 60) -> list[str | None]:
    """n seeded answers from the shipped model; None for one that did not finish in time."""
    check_schema(schema)
    index = TokenIndex(regex_to_byte_dfa(schema_to_regex(schema)), vocab, eos_id)
    sampler = ConstrainedSampler(model, tokenizer, index)
    texts = []
    for seed in range(n):
        out = sampler.sample(prompt, max_tokens, seed=seed, temperature=1.0)[len(prompt) :]
        out = out.tolist()
        finished = out[-1] == eos_id
        texts.append(b"".join(vocab[t] for t in out[:-1]).decode() if finished else None)
    return texts


person = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
print(schema_to_regex(person))
n_answers = 3 if QUICK else 10
person_texts = answers_to(person, n_answers)
print(f"finished within 60 tokens: {sum(t is not None for t in person_texts)} of {n_answers}")

# %% tags=["claim"]
assert all(t is None for t in person_texts)

# %% [markdown]
# None of them finishes: the model writes a name of tens of characters, then an age of tens of
# digits, and is cut off at 60 tokens. Nothing in the
# mask is wrong: every token it allowed keeps the answer valid, and a quote or a closing brace
# was allowed at every step. The model never gave them much probability, because it has never
# seen JSON. The constraint decides what is possible, the model what is likely; a real model
# trained on JSON closes its strings. A schema can also bound the answer itself: here, choices.

# %%
scene = {
    "type": "object",
    "properties": {
        "speaker": {"enum": ["ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE"]},
        "act": {"enum": [1, 2, 3, 4, 5]},
        "alive": {"type": "boolean"},
    },
    "required": ["speaker", "act", "alive"],
}
scene_texts = answers_to(scene, n_answers)
for text in scene_texts[:5]:
    print(text)
valid = [t is not None and jsonschema.Draft202012Validator(scene).is_valid(json.loads(t))
         for t in scene_texts]  # fmt: skip
print(f"{sum(valid)} of {n_answers} finished, parse and fit the schema")

# %% tags=["claim"]
assert all(valid)

# %% [markdown]
# Every answer finishes, parses and fits the schema (`jsonschema` checks it). The regex of
# `person` differs from section 2's only inside strings: this one allows `\uXXXX` escapes and
# the characters U+007F–U+009F, as JSON does.
#
# Not every schema has a regex. `{"type": "object"}` with no properties allows any object,
# nested as deeply as you like; a schema whose items refer back to the schema itself (`"$ref":
# "#"`) nests without end too. Both need their brackets balanced at every depth, and an
# automaton with finitely many states cannot count unboundedly many open brackets (the
# language of balanced brackets is not regular: the pumping lemma). A fixed nesting, as in the
# tests' scene schema, is regular, only larger; an unbounded one needs a stack, a pushdown
# automaton, which is what xgrammar builds from a grammar. `check_schema` refuses such schemas
# here, by name.

# %% [markdown]
# ## 7. Many requests at once: the bitmask (25 minutes)
#
# A serving engine runs many requests in one step (chapter 8), some constrained, each in its
# own state of its own constraint, most not constrained at all. Their masks are applied to the
# batch's logits together, as one tensor of **bits**: one row per request, one bit per token, 32
# tokens to an `int32` word. Bit $k$ of word $w$ stands for token $32w + k$, counted from the
# least significant bit. That is xgrammar's layout (`allocate_token_bitmask`,
# `apply_token_bitmask_inplace`); vLLM's `StructuredOutputManager` keeps one such bitmask for
# the batch, whichever backend fills its rows (`vllm/v1/structured_output/__init__.py`). A row
# costs `d_vocab / 8` bytes (512 here, 16,032 for a vocabulary of 128,256 tokens, Llama 3's)
# instead of a boolean per token, so it is cheap to fill on the CPU and to copy to a GPU; a row
# of all ones (every word -1) leaves an unconstrained request as it is.
#
# The engine's part (`solutions/structured_outputs.py`, given, after vLLM's
# `StructuredOutputManager`): each request with a constraint holds a **matcher**, its place in
# the compiled constraint; at each step, every matcher fills its request's row of one bitmask,
# the bitmask is applied to the logits of the whole batch in one operation, before chapter 3's
# sampling rules, and each matcher then reads the token its request drew. The index's rows are
# packed once per state, when the constraint is compiled, so that filling a row is a copy.
#
# ### Exercise: `bitmask_of` and `apply_token_bitmask`
#
# - `bitmask_of(allowed, d_vocab)`: one row on the CPU (where the engine fills its rows),
#   `bitmask_width(d_vocab)` words of `torch.int32`, bit $k$ of word $w$ set exactly when token
#   $32w + k$ is in `allowed` (a list of distinct ids, perhaps empty). A word whose bit 31 is
#   set is negative as an `int32`: build the words in a wider type, then wrap them into
#   `int32`'s range (subtract $2^{32}$ from those at $2^{31}$ or more). On this machine
#   `.to(torch.int32)` of a word past that range keeps its low 32 bits, the same wrap; the
#   subtraction says it in the code rather than leaving it to how a cast out of range behaves.
# - `apply_token_bitmask(logits, bitmask)`: `logits` `[batch, d_vocab]` with $-\infty$ at every
#   token whose bit is 0 in its row, as a new tensor, in one operation for the whole batch (no
#   loop over rows). The last word may hold bits past `d_vocab`: ignore them.
#
# Common mistakes: the bits of a word in reverse order (bit 0 is $2^0$, not the top bit); the
# top bit lost or clamped when going to `int32`; one word too few when `d_vocab` is not a
# multiple of 32; reading a bit with `>>` alone (without `& 1`, the bits above it come along);
# a test such as `word > 0` for "some token allowed" (a word with its top bit set is negative,
# and a row of -1 allows everything); the logits changed in place; a loop over the rows.
#
# The tests read your rows back with numpy (`np.unpackbits(..., bitorder="little")`) for
# allowed sets of every kind and three vocabulary sizes, compare them word for word with the
# rows xgrammar's matcher fills at every step of a JSON answer, and compare your masked logits
# with xgrammar's `apply_token_bitmask_inplace` on random words, a row of all ones and one with a
# single token, in float32 and bfloat16; they also run it on another device (`meta`) and count
# its PyTorch calls for a batch of 1 and of 64 rows, which must be the same.
#
# <details><summary>Hint 1: a nudge</summary>
#
# A row of 0/1 as long as the words times 32, viewed as `[words, 32]`: each word is the sum of
# its bits times $2^k$. Going back, `(word >> k) & 1` is bit $k$, for every $k$ at once with
# broadcasting.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# `bitmask_of`: mark the allowed ids in a flat tensor of 0/1 long enough for every word; give
# each bit its weight by position within its word and add the weights up per word, in a type
# wide enough for $2^{32} - 1$; wrap into `int32` last. `apply_token_bitmask`: expand each word
# into its 32 bits with one broadcast shift (the shifts on the bitmask's device) and a mask of
# the lowest bit, lay the bits out one per token, drop the columns past `d_vocab`, and write
# $-\infty$ where a bit is 0, without changing the logits given.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("bitmask_of")` and `show_solution("apply_token_bitmask")`.
#
# </details>

# %% tags=["exercise"] exercise="token_bitmask"
# solution: solutions.token_bitmask.bitmask_of
# solution: solutions.token_bitmask.apply_token_bitmask

# %%
check("token_bitmask")

# %% [markdown]
# **Predict, then run.** Chapter 8's engine, with twelve requests in one batch: three kinds of
# constraint (vLLM's `StructuredOutputsParams`: a regex, a choice, the scene schema) and three
# requests with none. Do the unconstrained ones draw the same tokens as when they run alone?
# (The engine's manager uses the reference versions of the two functions you just wrote.)

# %%
from solutions.engine import LLMEngine, generate
from solutions.sampling_params import SamplingParams, StructuredOutputsParams

kinds = {
    "regex": StructuredOutputsParams(regex="[0-9]{3}-(yes|no)"),
    "choice": StructuredOutputsParams(choice=["Romeo", "Juliet", "Romeo and Juliet"]),
    "json": StructuredOutputsParams(json=scene),
}
names = [name for name in kinds for _ in range(3)]
batch = [SamplingParams(max_tokens=48, seed=i, structured_outputs=kinds[name])
         for i, name in enumerate(names)]  # fmt: skip
free = [SamplingParams(max_tokens=20, seed=100 + i) for i in range(3)]
engine = LLMEngine(model, tokenizer, num_blocks=128)
outputs = generate(engine, ["ROMEO.\n"] * 9 + ["JULIET.\n"] * 3, batch + free)
for name, output in zip(names, outputs, strict=False):
    print(f"{name:7} {output.finish_reason:7}",
          repr(tokenizer.decode(output.output_token_ids, skip_special_tokens=True)))  # fmt: skip
alone = generate(LLMEngine(model, tokenizer), ["JULIET.\n"] * 3, free)
same = [a.output_token_ids == b.output_token_ids for a, b in zip(outputs[9:], alone, strict=True)]
print("unconstrained requests draw what they draw alone:", all(same))


def keeps(name: str, text: str) -> bool:
    if name == "json":
        return jsonschema.Draft202012Validator(scene).is_valid(json.loads(text))
    if name == "choice":
        return text in kinds["choice"].choice
    return re.fullmatch(kinds["regex"].regex, text) is not None


kept = [keeps(name, tokenizer.decode(o.output_token_ids, skip_special_tokens=True))
        for name, o in zip(names, outputs, strict=False) if o.finish_reason == "stop"]  # fmt: skip
print(f"{len(kept)} of 9 constrained requests finished; all keep their constraint:", all(kept))

# %% tags=["claim"]
assert all(same) and kept and all(kept)

# %% [markdown]
# Every constrained answer that finished keeps its constraint, and the unconstrained requests
# draw exactly the tokens they draw alone: each row's mask touches only its row, and each
# request draws from its own seeded generator (chapter 8, section 6).
#
# **The server.** `course serve` takes the same constraints, under vLLM's name
# `structured_outputs` (an extra field of the request: `extra_body` in the `openai` client) and
# under OpenAI's `response_format` (`{"type": "json_schema", "json_schema": {"name": ...,
# "schema": {...}}}`, or `{"type": "json_object"}`), which vLLM also takes on completions. The
# handler compiles the constraint in a worker thread before the request reaches the engine's
# loop (the engine's own call then finds it in the cache), and a constraint no backend keeps is
# a 400 that names it, never an answer left unconstrained.

# %%
import openai

from solutions.async_engine import AsyncEngine
from utils.server import running_server

async_engine = AsyncEngine(LLMEngine(model, tokenizer, num_blocks=128))
with running_server(async_engine, "shakespeare") as server:
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    answer = client.completions.create(
        model="shakespeare", prompt="ROMEO.\n", max_tokens=40, seed=3,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "scene", "schema": scene}}},
    )  # fmt: skip
    try:
        client.completions.create(
            model="shakespeare", prompt="ROMEO.\n", max_tokens=5,
            extra_body={"structured_outputs": {"regex": "(Romeo"}},
        )  # fmt: skip
        refused = None
    except openai.BadRequestError as error:
        refused = error.body
print(answer.choices[0].finish_reason, answer.choices[0].text)
print("an unbalanced regex:", refused)

# %% tags=["claim"]
assert answer.choices[0].finish_reason == "stop"
assert jsonschema.Draft202012Validator(scene).is_valid(json.loads(answer.choices[0].text))
assert refused is not None and refused["param"] == "structured_outputs"
assert "missing )" in refused["message"]  # the reason, not only the field

# %% [markdown]
# ## 8. What no regex can say (reading, 10 minutes)
#
# Section 6 ended on schemas no regex can say: a document nested as deeply as it likes.
# xgrammar (Dong et al., 2024) compiles a **context-free grammar** (written in EBNF) into a
# pushdown automaton: the automaton of a regex plus a stack, which remembers the brackets still
# open. Its index is of the same kind as yours: for each state, the tokens are sorted ahead of
# time into those whose acceptance does not depend on the stack (most of them, and the mask for
# those is precomputed) and the few that do, checked at each step against the stack. The engine
# sends a constraint to xgrammar when the index cannot keep it (`backend="auto"`, as vLLM's):
# a `grammar`, `json_object` (any object), and JSON schemas beyond `check_schema`'s subset
# (`$ref`, optional properties, `anyOf`, bounds on numbers and strings; any other keyword is a
# 400). The whitespace rule stays: `any_whitespace=False` with separators `(",", ":")`.
#
# **Predict, then run.** Balanced parentheses around an `x` (a grammar), and a tree of nodes
# whose children are nodes (a schema that refers to itself).

# %%
parens = StructuredOutputsParams(grammar='root ::= "(" root ")" | "x"')
tree = {
    "$defs": {"node": {
        "type": "object",
        "properties": {"name": {"enum": ["a", "b"]},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                "maxItems": 2}},
        "required": ["name", "kids"],
    }},
    "$ref": "#/$defs/node",
}  # fmt: skip
nested = generate(
    LLMEngine(model, tokenizer, num_blocks=128), ["ROMEO.\n"] * 6,
    [SamplingParams(max_tokens=60, seed=s, structured_outputs=c) for s, c in
     enumerate([parens] * 3 + [StructuredOutputsParams(json=tree)] * 3)],
)  # fmt: skip
texts = [tokenizer.decode(o.output_token_ids, skip_special_tokens=True) for o in nested]
for text in texts:
    print(repr(text))
balanced = [t == "(" * (len(t) // 2) + "x" + ")" * (len(t) // 2) for t in texts[:3]]
trees = [jsonschema.Draft202012Validator(tree).is_valid(json.loads(t)) for t in texts[3:]]
print("balanced:", balanced, "valid trees:", trees)

# %% tags=["claim"]
assert all(o.finish_reason == "stop" for o in nested) and all(balanced) and all(trees)

# %% [markdown]
# ## 9. What the mask does to the distribution (reading, 15 minutes)
#
# What should a constrained answer's probability be? The natural answer is the model's own,
# **conditioned** on the answer keeping the constraint: $p(y \mid y \text{ allowed}) = p(y) / Z$,
# where $Z$ is the model's probability of all allowed answers together. Masking each step
# samples from something else (Park et al., 2024, *Grammar-Aligned Decoding*,
# arXiv:2405.21047). At each step the allowed tokens share **all** the probability, whatever
# becomes of them later:
#
# $$q(y) = \prod_t \frac{p(y_t \mid y_{<t})}{p(\text{allowed at step } t \mid y_{<t})}.$$
#
# A prefix the model likes for a reason the constraint forbids keeps its whole probability, and
# the answer must then be finished in a way the model did not want. The two agree only when the
# allowed mass is the same at every step of every answer.
#
# For a constraint with few answers both distributions can be computed exactly: every answer is
# a path of tokens through the index ending in end-of-text, and each step of a path is one
# forward pass (`solutions/constraint_distortion.py`, given, walks them all; the tests check it
# against HF's model). **Predict, then run:** after `ROMEO.\n`, the shipped model must answer one
# of four names. Which one does the model, conditioned, prefer, and which does masking prefer?

# %%
from solutions.constraint_distortion import (
    answer_probabilities,
    conditioned_and_masked,
    kl_divergence,
)


def by_text(probabilities: dict) -> dict[str, float]:
    """Each answer text's probability: the sum over its tokenizations."""
    texts: dict[str, float] = {}
    for path, p in probabilities.items():
        text = b"".join(vocab[t] for t in path[:-1]).decode()
        texts[text] = texts.get(text, 0.0) + p
    return texts


names_regex = "(Romeo|Juliet|Tybalt|Mercutio)"
names_index = TokenIndex(regex_to_byte_dfa(names_regex), vocab, eos_id)
answers = answer_probabilities(model, tokenizer.encode("ROMEO.\n"), names_index)
exact, masked, z = conditioned_and_masked(answers)
exact_text, masked_text = by_text(exact), by_text(masked)
print(f"{len(answers)} answers (token paths); the model's probability of them all, Z = {z:.2g}")
for text in exact_text:
    print(f"{text:9} conditioned {exact_text[text]:.3f}   masked each step {masked_text[text]:.3f}")
print(f"KL(conditioned || masked) over the texts: {kl_divergence(exact_text, masked_text):.2f} "
      f"nats; over the token paths: {kl_divergence(exact, masked):.1f} nats")  # fmt: skip

# %% tags=["claim"]
assert max(exact_text, key=exact_text.get) == "Romeo"
assert max(masked_text, key=masked_text.get) == "Mercutio"
assert round(exact_text["Romeo"], 2) == 0.79 and round(masked_text["Romeo"], 2) == 0.17
assert round(exact_text["Tybalt"], 3) == 0.005 and round(masked_text["Tybalt"], 2) == 0.26
assert z < 1e-6

# %% [markdown]
# The model, conditioned on naming one of the four, says `Romeo` with probability 0.79 and
# `Tybalt` with 0.005; masking each step says `Romeo` with 0.17 and `Tybalt` with 0.26, and
# prefers `Mercutio`. Where it comes from: right after `ROMEO.\n` the model expects a line of
# verse, and its first tokens are spread over many prefixes; the prefixes that begin a name
# the constraint allows share all of that step's probability in the model's proportions, and
# each is then carried to the end of a name whether or not the model would have finished it so.
# $Z$, the model's probability of answering with a bare name and stopping, is tiny: the
# constraint is far from what the model would write, and that is when the two distributions part
# most. When the model already writes what the constraint allows (a model trained to answer in
# the format, or a prompt that shows it), the allowed mass is close to 1 at every step and
# masking changes little.
#
# Whether it matters depends on the use. A constraint that only guarantees the answer parses
# (JSON a program will read) does not care that the answer is not the model's most likely valid
# one. A constraint used to *measure* the model (which of these four names does it believe?)
# does: read $p(y)/Z$ from the model's probabilities, as this cell did, instead of sampling
# with a mask. Park et al. sample from the conditioned distribution in the limit by learning,
# over repeated samples, how much allowed probability lies beyond each prefix (their ASAp
# algorithm).

# %% [markdown]
# ## 10. Forced text in one pass (25 minutes)
#
# Much of a JSON answer is not the model's choice. After `{`, the scene schema allows only
# `"speaker":"`; after `MERC`, only `UTIO","act":`. Where the automaton has exactly one way on,
# byte after byte, that text is **forced**: the engine can append it without asking the model,
# and compute all its tokens in one forward pass with the next step's token, as chapter 8's
# engine computes a prompt chunk. That is SGLang's **jump-forward** decoding (Zheng et al.,
# 2024, *SGLang*, arXiv:2312.07104; the LMSYS blog post "Fast JSON Decoding for Local LLMs with
# Compressed Finite State Machine", February 2024). It comes in two forms, the engine's
# `jump_forward` option:
#
# - `"exact"`: append a token only where it is the **one token allowed**. Token-by-token
#   decoding would have drawn it with probability 1, so the answers' distribution is unchanged
#   (and a greedy answer is the same text); only the model calls are saved.
# - `"text"`: append the forced **text**, tokenized as the tokenizer writes it. It saves more
#   calls, since a forced text usually has several tokenizations and so, token by token, more
#   than one allowed token. But it picks one tokenization where the model might have drawn
#   another, and the tokens after it follow from that choice: the answers are still valid,
#   their distribution is not the same.
#
# The forced text of a state comes from the byte DFA: read bytes while the state is not final
# (the text may stop there, so nothing after it is forced) and has exactly one byte's
# transition. A state reached by a token that ended inside a character forces the rest of that
# character first; those bytes are no text of their own, so the forced text is kept up to the
# last whole character (`whole_characters`, given), and is empty if it begins inside one.
#
# ### Exercise: `forced_text`
#
# `forced_text(dfa, state)` returns the forced text from `state`, as a `str`.
#
# Common mistakes: going on through a final state (`abc(d)?` forces `abc`, never the optional
# `d`); stopping at the first byte with one transition instead of going on; starting from
# `dfa.initial` instead of the state given; decoding with `errors="ignore"`, which drops the
# rest of a character and returns text that does not start where the answer stands.
#
# The tests draw 15 random answers per regex (tokens among those xgrammar allows) and compare
# your forced text at every step with xgrammar's `find_jump_forward_string` on the same regex:
# a fixed run, an optional end, two choices with a common start, digits with a dash, non-ASCII
# characters split across tokens, a repeated group, and a compact JSON object.
#
# <details><summary>Hint 1: a nudge</summary>
#
# A loop over the DFA's transitions: `dfa.transitions[state]` is a dictionary from each byte
# that may come next to the state it leads to.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Collect bytes while two things hold: the text may not stop at the current state, and only
# one byte may come next. Each byte you collect moves the state on. What you return is text,
# and only the whole characters of it.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# `show_solution("forced_text")`.
#
# </details>

# %% tags=["source"]
# solution: solutions.jump_forward.whole_characters

# %% tags=["exercise"] exercise="jump_forward"
# solution: solutions.jump_forward.forced_text

# %%
check("jump_forward")

# %% [markdown]
# **Predict, then run.** The scene schema, greedy, decoded token by token and with each form:
# how many model calls (engine steps) does each answer take, in how many tokens, and is the
# text the same? (The engine forces text after each sampled token, not before the first.)

# %%
calls, answers_by_form, tokens_by_form = {}, {}, {}
for form in (None, "exact", "text"):
    engine = LLMEngine(model, tokenizer, jump_forward=form)
    [output] = generate(
        engine,
        ["ROMEO.\n"],
        SamplingParams(
            temperature=0.0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=scene)
        ),
    )
    calls[form] = engine.stats.steps
    tokens_by_form[form] = len(output.output_token_ids)
    answers_by_form[form] = tokenizer.decode(output.output_token_ids, skip_special_tokens=True)
    print(f"{str(form):5} {calls[form]:2} model calls, {len(output.output_token_ids)} tokens: "
          f"{answers_by_form[form]}")  # fmt: skip

# %% tags=["claim"]
assert answers_by_form["exact"] == answers_by_form[None] == answers_by_form["text"]
assert (calls[None], calls["exact"], calls["text"]) == (39, 22, 5)
assert (tokens_by_form[None], tokens_by_form["exact"], tokens_by_form["text"]) == (39, 39, 30)
assert all(jsonschema.Draft202012Validator(scene).is_valid(json.loads(t))
           for t in answers_by_form.values())  # fmt: skip

# %% [markdown]
# Token by token, the answer takes 39 model calls, one per token: this model spells most of the
# JSON a character or two at a time (`sp`, `e`, `a`, `k`, `er`). The exact form writes the same
# 39 tokens in 22 calls: every token that was the only one allowed came without a call. The
# text form takes 5 calls and 30 tokens: the forced text is spelled the tokenizer's way
# (`peak`, `alse`). Here its answer is the same text; in general it need not be, because the
# model reads a spelling it did not choose. `benchmarks/structured.py` measures the forms on 400
# sampled answers each, with how far their values move (`benchmarks/results/structured.json`).

# %% [markdown]
# ## Check your understanding
#
# - Why must the index allow `R`, `Rome` and `Romeo` at the start of `(Romeo|Juliet)`, and not
#   only the tokenizer's `Romeo`?
#
# <details><summary>Answer</summary>
#
# The model was trained on text the tokenizer spelled its own way, but at a given step it may
# give `Rome` more probability than `Romeo`; refusing it moves that probability to the other
# answers for no reason, and any text the constraint allows must stay reachable whatever the
# model prefers.
#
# </details>
#
# - The index is built before generation. What would it cost to compute the allowed set at each
#   step instead?
#
# <details><summary>Answer</summary>
#
# A walk of every token's bytes at every step, per token generated: one per token of the
# vocabulary, and today's vocabularies are far larger than this one's. Built ahead, each step is
# a lookup of the state's row; the cost moves to building, once per constraint.
#
# </details>
#
# - Why does end-of-text leave a final state unchanged rather than lead to a new state?
#
# <details><summary>Answer</summary>
#
# It adds no bytes: the text is the same before and after it. The request stops there, so no
# state after it is ever read.
#
# </details>
#
# - A server gets 32 requests for the same schema at once. What is compiled once, and what
#   does each request keep of its own?
#
# <details><summary>Answer</summary>
#
# The constraint is compiled once (the regex, its DFA, the index and its bitmask rows), cached
# by the schema; each request keeps only a matcher, its place in the constraint (one state
# number for the index). A step fills one bitmask row per request from its state and applies
# them all at once.
#
# </details>
#
# - Why is `"exact"` jump-forward free of any change to the answers, and `"text"` not?
#
# <details><summary>Answer</summary>
#
# Where only one token is allowed, token-by-token decoding draws it with probability 1:
# appending it without the model changes no probability. A forced text usually has several
# tokenizations; `"text"` chooses the tokenizer's, where the model might have drawn another,
# and every later token is conditioned on that choice.
#
# </details>
#
# - Section 9's model, conditioned, names Romeo; masked, Mercutio. Which would you report as
#   "the model's answer", and how would you get it without sampling?
#
# <details><summary>Answer</summary>
#
# The conditioned one: it is the model's own distribution restricted to the allowed answers.
# With few answers, score each (its probability p(y), every tokenization summed) and
# normalise, as section 9's cell did; masking each step answers a different question.
#
# </details>
#
# ## Further reading
#
# - Willard & Louf, *Efficient Guided Generation for Large Language Models*, 2023
#   (arXiv:2307.09702): the index over a regex's automaton.
# - Dong et al., *XGrammar: Flexible and Efficient Structured Generation Engine for Large
#   Language Models*, 2024 (arXiv:2411.15100): grammars with nesting, and masks computed fast.
# - Park et al., *Grammar-Aligned Decoding*, 2024 (arXiv:2405.21047): what per-step masking does
#   to the distribution, and ASAp, which corrects it.
# - Zheng et al., *SGLang: Efficient Execution of Structured Language Model Programs*, 2024
#   (arXiv:2312.07104), and the LMSYS blog post "Fast JSON Decoding for Local LLMs with
#   Compressed Finite State Machine" (February 2024): jump-forward decoding.
# - vLLM documentation, "Structured Outputs"; OpenAI API documentation, "Structured Outputs".
#
# ## What's next
#
# Every step of the engine ends in a row of logits per request, masked, then sampled by the
# request's own rules. Chapter 10, the last, writes that sampling as GPU kernels in Triton.
