"""Chapter 8, "Serving it": the OutputProcessor, graded against the tokenizer's own `decode` of
every token (HF's tokenizers, not the course's code) cut at the first stop string by Python's
`str.find`, on the engine's outputs for texts whose characters span tokens and whose stop
strings begin in one token and end in another."""

from __future__ import annotations

import random

import pytest

CHAPTER = "08_serving"

# Every character of the accented and curly-quoted words spans two tokens of the shipped
# tokenizer, the emoji four; "soft, what" spans three tokens, and so does "\n\nEnter".
TEXT = "ROMEO. But soft, what light through yonder window breaks?\n\nEnter JULIET above."
SPLIT = "Caf\u00e9 na\u00efve \u2014 \u201cso\u201d \U0001f642 \u2019tis done, and so farewell."


@pytest.fixture(scope="module")
def tokenizer(shipped):
    return shipped[1]


def decode(tokenizer, ids: list[int]) -> str:
    """The oracle: the tokenizer's own decoding of the tokens, end-of-text left out."""
    return tokenizer.decode(ids, skip_special_tokens=True)


def engine_outputs(impl, rid: str, ids: list[int], chunks: list[int], reason: str = "length",
                   error: str | None = None) -> list:  # fmt: skip
    """The engine's outputs for one request, as `LLMEngine.step` reports them: `chunks[k]` new
    tokens in step k (0: a step that read a prompt chunk and sampled nothing); finished in the
    last step, with `reason`."""
    assert sum(chunks) == len(ids)
    outputs, done = [], 0
    for k, n in enumerate(chunks):
        last = k == len(chunks) - 1
        outputs.append(impl.RequestOutput(
            request_id=rid, new_token_ids=ids[done : done + n], output_token_ids=ids[: done + n],
            finished=last, finish_reason=reason if last else None, error=error if last else None,
        ))  # fmt: skip
        done += n
    return outputs


def one_by_one(n: int) -> list[int]:
    return [0] + [1] * n  # a prefill step, then a token a step


def run(impl, tokenizer, steps: list[list], stops: dict[str, tuple[str, ...]]):
    """Feed the processor one list of outputs per step; return, per step, its deltas (request
    id -> (text, num_output_tokens, reason, error)), its to_abort list, and the ids it still
    knows."""
    processor = impl.OutputProcessor(tokenizer)
    for rid, stop in stops.items():
        processor.add_request(rid, stop)
    trace = []
    for outputs in steps:
        processed = processor.process_outputs(outputs)
        deltas = {rid: (d.text, d.num_output_tokens, d.finish_reason, d.error)
                  for rid, d in processed.deltas.items()}  # fmt: skip
        trace.append((deltas, list(processed.to_abort), set(processor.states)))
    return trace


def sent(trace, rid: str) -> list[str]:
    """The text the client has after each step."""
    out, text = [], ""
    for deltas, _, _ in trace:
        if rid in deltas:
            text += deltas[rid][0]
        out.append(text)
    return out


def reasons(trace, rid: str) -> list:
    return [d[rid][2] for d, _, _ in trace if rid in d]


def stepwise(outputs: list) -> list[list]:
    return [[o] for o in outputs]


# ------------------------------------------------------------------------- text, no stop


@pytest.mark.output_processor
@pytest.mark.parametrize("text", [TEXT, SPLIT], ids=["ascii", "split-characters"])
def test_with_no_stop_strings_each_step_sends_all_the_whole_characters_so_far(impl, tokenizer,
                                                                              text):  # fmt: skip
    ids = tokenizer.encode(text)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    got = sent(trace, "a")
    assert got[-1] == decode(tokenizer, ids), (
        f"the text sent, all deltas joined, should be the tokenizer's decoding of every token: "
        f"expected {decode(tokenizer, ids)!r}, got {got[-1]!r}."
        + (" A piece of a character (U+FFFD) was sent: while the text ends inside a character, "
           "the detokenizer must wait for its next token (last=True only once the engine has "
           "finished the request)." if "\ufffd" in got[-1] else "")
        + (" Text was sent more than once: a delta carries only the text not sent before "
           "(from state.sent on), and `detokenizer.add` takes the step's new tokens "
           "(output.new_token_ids), not every token so far." if len(got[-1]) > len(text)
           else "")
    )  # fmt: skip
    for k in range(1, len(ids) + 1):
        whole = decode(tokenizer, ids[:k])
        if whole.endswith("\ufffd"):  # the last character is not whole yet
            assert "\ufffd" not in got[k], (
                f"after {k} tokens the client got {got[k]!r}: a piece of a character (U+FFFD) "
                "was sent. A character split over tokens waits for its last token: that is "
                "what the detokenizer's empty answer means; send nothing then."
            )
        else:
            assert got[k] == whole, (
                f"with no stop strings, nothing needs holding back: after {k} tokens the client "
                f"should have {whole!r}, got {got[k]!r}."
                + (" Text was held back although no stop string could begin in it (with no stop "
                   "strings, hold back 0 characters)." if whole.startswith(got[k]) else "")
            )  # fmt: skip
    assert reasons(trace, "a") == [None] * (len(reasons(trace, "a")) - 1) + ["length"], (
        f"only the last delta says why the request finished (the engine's reason, 'length' "
        f"here); the deltas' reasons were {reasons(trace, 'a')}."
    )


@pytest.mark.output_processor
def test_a_step_with_nothing_to_send_makes_no_delta(impl, tokenizer):
    ids = tokenizer.encode(SPLIT)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    empty = [k for k, (deltas, _, _) in enumerate(trace) if "a" in deltas
             and deltas["a"][0] == "" and deltas["a"][2] is None]  # fmt: skip
    assert not empty, (
        f"steps {empty} made a delta with no text and no reason (a prefill step, or a token that "
        f"ended inside a character): a request with nothing to send gets no delta in that step."
    )


@pytest.mark.output_processor
def test_a_delta_counts_every_token_written_so_far(impl, tokenizer):
    ids = tokenizer.encode(TEXT)
    chunks = [0, 3, 1, 4, 2] + [1] * (len(ids) - 10)
    trace = run(impl, tokenizer, stepwise(engine_outputs(impl, "a", ids, chunks)), {"a": ()})
    written = [sum(chunks[: k + 1]) for k in range(len(chunks))]
    for k, (deltas, _, _) in enumerate(trace):
        if "a" in deltas:
            assert deltas["a"][1] == written[k], (
                f"after step {k} the request had written {written[k]} tokens, but its delta "
                f"says {deltas['a'][1]}: num_output_tokens counts every token so far "
                f"(len(output.output_token_ids)), not this step's."
            )


@pytest.mark.output_processor
def test_requests_in_one_step_each_get_their_own_text(impl, tokenizer):
    a, b = tokenizer.encode(TEXT), tokenizer.encode(SPLIT)
    rng, ca = random.Random(0), [0]
    while sum(ca) < len(a):  # a few tokens a step, as after a speculative step
        ca.append(min(rng.randint(1, 3), len(a) - sum(ca)))
    cb = [1] * len(b)
    oa, ob = engine_outputs(impl, "a", a, ca), engine_outputs(impl, "b", b, cb)
    steps = [[*oa[k : k + 1], *ob[k : k + 1]] for k in range(max(len(oa), len(ob)))]
    trace = run(impl, tokenizer, steps, {"a": (), "b": ()})
    for rid, ids in (("a", a), ("b", b)):
        assert sent(trace, rid)[-1] == decode(tokenizer, ids), (
            f"two requests advanced in the same steps; request {rid!r} got "
            f"{sent(trace, rid)[-1]!r}, expected {decode(tokenizer, ids)!r}: each request's "
            "text is its own (its own state, its own detokenizer)."
        )


# -------------------------------------------------------------------------- stop strings


def stop_case(tokenizer, stop: tuple[str, ...], text: str = TEXT):
    ids = tokenizer.encode(text)
    hits = [text.find(s) for s in stop if s in text]
    want = text[: min(hits)] if hits else text
    return ids, want


@pytest.mark.output_processor
@pytest.mark.parametrize("stop", [("soft, what",), ("\n\nEnter",), ("yonder", "light")],
                         ids=["spans-three-tokens", "newlines", "earliest-of-two"])  # fmt: skip
def test_nothing_is_sent_past_a_stop_string_and_the_request_is_aborted(impl, tokenizer, stop):
    ids, want = stop_case(tokenizer, stop)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    got = sent(trace, "a")
    # Step k has read k tokens (step 0 a prompt chunk); the stop string is whole at step `k`.
    k = next(k for k in range(len(ids)) if any(s in decode(tokenizer, ids[:k]) for s in stop))
    for j, text in enumerate(got[: k + 1]):
        assert want.startswith(text), (
            f"after {j} tokens the client had {text!r}, which is not a beginning of the answer "
            f"{want!r} (the text up to the first stop string of {stop})."
            + past_stop(text, want, stop)
        )
    last = trace[k][0].get("a")
    assert last is not None and last[2] == "stop", (
        f"the stop string is complete after {k} tokens: that step's delta ends the request with "
        f"reason 'stop' (the engine has not finished it); its delta was {last}."
    )
    assert "a" not in trace[k][2], (
        "after its last delta a request must be forgotten (removed from self.states): the "
        "engine's next step reports its abort, which must make no second last delta."
    )
    assert got[-1] == want, (
        f"the request's text should end just before its first stop string: expected {want!r}, "
        f"got {got[-1]!r}." + (" With several stop strings, the text ends at the one that "
        "occurs first in the text, not the first in the list." if len(stop) > 1 else "")
    )  # fmt: skip
    aborts = [j for j, (_, to_abort, _) in enumerate(trace) if "a" in to_abort]
    assert aborts == [k], (
        f"the stop string was complete at step {k}, while the engine was still running the "
        f"request: that step's to_abort must name it (once), so that the loop ends it in the "
        f"engine; it was named at steps {aborts}."
    )


def past_stop(text: str, want: str, stop: tuple[str, ...]) -> str:
    if any(s in text for s in stop):
        return (" The stop string itself was sent: the text ends before it (OpenAI's API leaves "
                "the stop string out).")  # fmt: skip
    if len(text) > len(want):
        return (" Text past the stop string's beginning was sent before the stop string was "
                "complete: a stop string can begin in one token and end in a later one, so the "
                "last len(longest stop string) - 1 characters wait until it is known that none "
                "begins there.")  # fmt: skip
    return (" Text already sent was sent again, or out of order: the end of what a delta sends "
            "is never below state.sent (nor negative, while the text is shorter than the "
            "hold).")  # fmt: skip


@pytest.mark.output_processor
@pytest.mark.parametrize("stop", [("soft",), ("light", "soft")], ids=["one", "earliest-of-two"])
def test_the_stop_string_is_found_anywhere_in_a_steps_new_text(impl, tokenizer, stop):
    """A step may bring several tokens (after a prefill, or a speculative step): the stop string
    may be whole inside them, with text after it, and another stop string after that."""
    ids, want = stop_case(tokenizer, stop)
    outputs = engine_outputs(impl, "a", ids, [0, 10, len(ids) - 10])  # to " light"
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    assert sent(trace, "a")[1] == want and reasons(trace, "a") == ["stop"], (
        f"the step's ten new tokens hold the stop strings {stop} and text after them: that "
        f"step's delta should be {want!r} with reason 'stop', got {trace[1][0].get('a')}."
        + (" The text ends at the stop string that occurs first in the text, not the first "
           "of the list." if len(stop) > 1 else "")
    )  # fmt: skip
    assert trace[1][1] == ["a"], (
        f"the engine was still running the request: to_abort should be ['a'], got {trace[1][1]}."
    )


@pytest.mark.output_processor
def test_text_is_held_back_exactly_as_long_as_a_stop_string_could_begin_in_it(impl, tokenizer):
    stop = ("zzz", "qqqqq")  # never in the text: hold back 4 characters, the longest less one
    ids = tokenizer.encode(TEXT)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    got = sent(trace, "a")
    for k in range(1, len(ids)):
        whole = decode(tokenizer, ids[:k])
        want = whole[: max(0, len(whole) - 4)]
        assert got[k] == want, (
            f"stop strings {stop}: after {k} tokens the text is {whole!r}, and a stop string "
            f"could begin in its last 4 characters (5 - 1) only, so the client should have "
            f"{want!r}, got {got[k]!r}."
            + (
                " That holds back too much."
                if want.startswith(got[k])
                else " That is too little held back."
                if got[k].startswith(want)
                else ""
            )
        )
    assert got[-1] == decode(tokenizer, ids) and reasons(trace, "a")[-1] == "length", (
        f"when the request finishes, the held-back characters are sent with its last delta: "
        f"expected {decode(tokenizer, ids)!r} and reason 'length', got {got[-1]!r} and "
        f"{reasons(trace, 'a')[-1]!r}."
    )
    assert not any(trace[k][1] for k in range(len(trace))), (
        "no stop string occurs in the text, yet to_abort named the request."
    )


@pytest.mark.output_processor
def test_a_stop_string_in_the_last_step_finishes_with_stop_and_aborts_nothing(impl, tokenizer):
    stop = ("yonder",)
    ids, want = stop_case(tokenizer, stop)
    cut = next(k for k in range(len(ids)) if "yonder" in decode(tokenizer, ids[:k]))
    outputs = engine_outputs(impl, "a", ids[:cut], one_by_one(cut), reason="length")
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    assert sent(trace, "a")[-1] == want and reasons(trace, "a")[-1] == "stop", (
        f"the engine finished the request ('length') in the step that completed a stop string: "
        f"the text still ends before it, with reason 'stop'; got {sent(trace, 'a')[-1]!r} and "
        f"{reasons(trace, 'a')[-1]!r}."
    )
    assert not any(to_abort for _, to_abort, _ in trace), (
        "the engine had already finished this request when its stop string came: there is "
        "nothing to abort (to_abort is for requests the engine still runs)."
    )


# ---------------------------------------------------------------------- the engine's ends


@pytest.mark.output_processor
def test_a_last_token_inside_a_character_is_still_sent(impl, tokenizer):
    """max_tokens can end a request in the middle of a character: its last delta has all that
    the tokenizer decodes, the replacement character included."""
    ids = tokenizer.encode(SPLIT)
    k = next(k for k in range(1, len(ids)) if decode(tokenizer, ids[:k]).endswith("\ufffd"))
    outputs = engine_outputs(impl, "a", ids[:k], one_by_one(k), reason="length")
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    assert sent(trace, "a")[-1] == decode(tokenizer, ids[:k]), (
        f"the request ended after {k} tokens, in the middle of a character: its last delta must "
        f"send what is left ({decode(tokenizer, ids[:k])!r} in all), got "
        f"{sent(trace, 'a')[-1]!r}. The detokenizer gives the unfinished piece only when told "
        f"it is the last call (last=True once the engine has finished the request)."
    )


@pytest.mark.output_processor
@pytest.mark.parametrize("reason, error", [("abort", None), ("error", "the pool is too small")])
def test_the_engines_own_end_is_passed_on_with_what_was_held(impl, tokenizer, reason, error):
    stop = ("qqq",)
    ids = tokenizer.encode(TEXT)[:12]
    outputs = engine_outputs(impl, "a", ids, one_by_one(12) + [0], reason=reason, error=error)
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    last = trace[-1][0].get("a")
    assert last is not None and last[2:] == (reason, error), (
        f"the engine ended the request with {reason!r} ({error!r}) and no new token: the last "
        f"delta passes on its reason and error, got {last}."
    )
    assert sent(trace, "a")[-1] == decode(tokenizer, ids), (
        f"the characters held back for a possible stop string go with the last delta: expected "
        f"{decode(tokenizer, ids)!r} in all, got {sent(trace, 'a')[-1]!r}."
    )
    assert "a" not in trace[-1][2], "after its last delta, the request must be forgotten."
    assert not any(to_abort for _, to_abort, _ in trace), (
        "the engine ended this request itself: nothing to abort."
    )


@pytest.mark.output_processor
def test_outputs_of_unknown_requests_are_ignored(impl, tokenizer):
    ids = tokenizer.encode(TEXT)[:5]
    step = engine_outputs(impl, "ghost", ids, [5]) + engine_outputs(impl, "a", ids, [5])
    trace = run(impl, tokenizer, [step], {"a": ()})
    assert set(trace[0][0]) == {"a"} and trace[0][1] == [], (
        f"an output for a request the processor does not know (one already ended at a stop "
        f"string) makes no delta and no abort; the known one gets its delta. Got deltas for "
        f"{sorted(trace[0][0])} and to_abort {trace[0][1]}."
    )
